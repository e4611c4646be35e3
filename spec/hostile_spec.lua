-- Hostile calls, one per entry, across every public function and class: each
-- either works (and its result is checked by hand) or raises a message that
-- names the function and the argument at fault. Never a crash, never a raw
-- Lua error ("attempt to index a nil value") leaking out of the layer.
local attn = require "attn"
local nn = attn.nn

local function T() return attn.tensor { { 1, 2, 3 }, { 4, 5, 6 } } end -- [2, 3]
local HUGE = math.tointeger(2 ^ 62)

-- a view whose base tensor is gone: only the view keeps the storage alive
local function orphan_view()
  local v = attn.arange(12):view(3, 4):t():narrow(1, 2, 2)
  collectgarbage()
  collectgarbage()
  return v
end

-- {what, function, words the error must contain} or {what, function, check = f(result...)}
local CASES = {
  -- creation
  { "zeros(-1)", function() return attn.zeros(-1) end, { "attn.zeros", "size #1", "-1" } },
  { "zeros(2.5)", function() return attn.zeros(2.5) end, { "attn.zeros", "size #1", "2.5" } },
  { "zeros('x')", function() return attn.zeros("x") end, { "attn.zeros", "size #1", "string" } },
  { "zeros(2^62, 2^62): numel overflows", function() return attn.zeros(HUGE, HUGE) end, { "attn.zeros", "too many elements" } },
  { "zeros(2^62): bytes overflow size_t", function() return attn.zeros(HUGE) end, { "attn.zeros" } },
  { "ones(2^40): refused allocation", function() return attn.ones(2 ^ 40) end, { "attn.ones", "allocate" } },
  { "empty of 9 dims", function() return attn.empty(1, 1, 1, 1, 1, 1, 1, 1, 1) end, { "attn.empty", "8 dims" } },
  { "rand({nil})", function() return attn.rand({ 2, {} }) end, { "attn.rand", "size #2", "table" } },
  { "randn(math.huge)", function() return attn.randn(math.huge) end, { "attn.randn", "size #1", "inf" } },
  { "full with a string value", function() return attn.full({ 2 }, "x") end, { "attn.full", "value" } },
  { "full(nan) works", function() return attn.full({ 2 }, 0 / 0) end,
    check = function(t) local v = t:totable(); assert.is_true(v[1] ~= v[1] and v[2] ~= v[2]) end },
  { "eye(-2)", function() return attn.eye(-2) end, { "attn.eye", "non-negative" } },
  { "eye('3')", function() return attn.eye("3") end, { "attn.eye", "'n'", "string" } },
  { "arange(0, 1, 0)", function() return attn.arange(0, 1, 0) end, { "attn.arange", "step" } },
  { "arange(0, nan)", function() return attn.arange(0, 0 / 0) end, { "attn.arange", "finite" } },
  { "arange(0, 1e300, 1e-300): too many", function() return attn.arange(0, 1e300, 1e-300) end, { "attn.arange", "too many" } },
  { "tensor(ragged)", function() return attn.tensor { { 1, 2 }, { 3 } } end, { "attn.tensor", "ragged" } },
  { "tensor(string element)", function() return attn.tensor { 1, "x" } end, { "attn.tensor", "element [2]", "string" } },
  { "tensor(function)", function() return attn.tensor(print) end, { "attn.tensor", "'data'", "function" } },
  { "tensor{} is empty [0]", function() return attn.tensor {} end, check = function(t) assert.are.same({ 0 }, t:size()) end },
  { "tensor(NaN, inf, denormal) keeps them", function() return attn.tensor { 0 / 0, -math.huge, 1e-45 } end,
    check = function(t) local v = t:totable(); assert.is_true(v[1] ~= v[1]); assert.are.equal(-math.huge, v[2]); assert.is_true(v[3] > 0) end },
  { "zeros_like(nil)", function() return attn.zeros_like(nil) end, { "attn.zeros_like", "'t'", "nil" } },
  { "ones_like('x')", function() return attn.ones_like("x") end, { "attn.ones_like", "'t'", "string" } },
  { "ones_like(io.stdout)", function() return attn.ones_like(io.stdout) end, { "attn.ones_like", "'t'", "FILE*" } },
  -- inspection and indexing
  { "size(0)", function() return T():size(0) end, { "Tensor:size", "dim", "0" } },
  { "size of a 0-dim tensor", function() return attn.tensor(1):size(1) end, { "Tensor:size", "0-dim" } },
  { "stride(3)", function() return T():stride(3) end, { "Tensor:stride", "dim" } },
  { "item of [2, 3]", function() return T():item() end, { "Tensor:item", "6 elements" } },
  { "0-dim item works", function() return attn.tensor(2.5):item() end, check = function(v) assert.are.equal(2.5, v) end },
  { "t[0]", function() return T()[0] end, { "index", "0", "out of range" } },
  { "t[1.5]", function() return T()[1.5] end, { "index", "1.5" } },
  { "0-dim t[1]", function() return attn.tensor(1)[1] end, { "index", "0-dim" } },
  { "t[1] = 'x'", function() local t = T(); t[1] = "x" end, { "index assignment", "string" } },
  { "#(0-dim)", function() return #attn.tensor(1) end, { "length", "0-dim" } },
  { "select(1, 3)", function() return T():select(1, 3) end, { "Tensor:select", "index 3", "out of range" } },
  { "narrow(2, 3, 2)", function() return T():narrow(2, 3, 2) end, { "Tensor:narrow", "exceeds" } },
  { "narrow(2, 1, -1)", function() return T():narrow(2, 1, -1) end, { "Tensor:narrow", "length" } },
  { "totable of a huge expanded view", function() return attn.ones(1):expand(2 ^ 40):totable() end,
    { "Tensor:totable", "too large", "[1099511627776]" } },
  { "totable of [2^40, 0] (no numbers, 2^40 tables)", function() return attn.zeros(1, 0):expand(2 ^ 40, 0):totable() end,
    { "Tensor:totable", "too large" } },
  -- views
  { "view(4)", function() return T():view(4) end, { "Tensor:view", "[4]", "size 6" } },
  { "view(-1, -1)", function() return T():view(-1, -1) end, { "Tensor:view", "only one size may be -1" } },
  { "view of a transposed tensor", function() return T():t():view(6) end, { "Tensor:view", "reshape" } },
  { "reshape(0, -1) of [2, 3]", function() return T():reshape(0, -1) end, { "Tensor:reshape", "invalid" } },
  { "reshape(2^62, 2^62)", function() return T():reshape(HUGE, HUGE) end, { "Tensor:reshape", "invalid" } },
  { "transpose(1, 3)", function() return T():transpose(1, 3) end, { "Tensor:transpose", "dim" } },
  { "t() of 3-D", function() return attn.zeros(1, 2, 3):t() end, { "Tensor:t", "<= 2 dims" } },
  { "permute(1, 1)", function() return T():permute(1, 1) end, { "Tensor:permute", "repeated" } },
  { "permute(1)", function() return T():permute(1) end, { "Tensor:permute", "expected 2 dims" } },
  { "unsqueeze(4) of 2-D", function() return T():unsqueeze(4) end, { "Tensor:unsqueeze", "dim" } },
  { "unsqueeze past 8 dims", function() return attn.zeros(1, 1, 1, 1, 1, 1, 1, 1):unsqueeze(1) end, { "Tensor:unsqueeze", "8 dims" } },
  { "squeeze(5)", function() return T():squeeze(5) end, { "Tensor:squeeze", "dim" } },
  { "expand([2, 3] to [4, 3])", function() return T():expand(4, 3) end, { "Tensor:expand", "[2, 3]", "[4, 3]" } },
  { "expand to 2^62 x 2^62", function() return attn.ones(1, 1):expand(HUGE, HUGE) end, { "Tensor:expand", "too many elements" } },
  { "expand_as(nil)", function() return T():expand_as(nil) end, { "Tensor:expand_as", "'other'", "nil" } },
  { "expand_as of a mismatched shape", function() return T():expand_as(attn.zeros(3, 2)) end, { "Tensor:expand_as", "[3, 2]" } },
  { "view_as('x')", function() return T():view_as("x") end, { "Tensor:view_as", "'other'", "string" } },
  { "view_as of another numel", function() return T():view_as(attn.zeros(5)) end, { "Tensor:view_as", "[5]" } },
  { "a view used after its base was collected", orphan_view,
    check = function(v) assert.are.same({ { 1, 5, 9 }, { 2, 6, 10 } }, v:contiguous():totable()) end },
  { "writing a view after its base was collected", function() local v = orphan_view(); v:fill_(-1); return v:sum() end,
    check = function(s) assert.are.equal(-6, s:item()) end },
  { "fill_ of a huge expanded view writes its one float", function() local b = attn.zeros(1); b:expand(2 ^ 40):fill_(3); return b end,
    check = function(b) assert.are.same({ 3 }, b:totable()) end },
  -- join
  { "cat({})", function() return attn.cat({}, 1) end, { "attn.cat", "non-empty" } },
  { "cat of a string", function() return attn.cat("x", 1) end, { "attn.cat", "'tensors'", "string" } },
  { "cat with a nil hole", function() return attn.cat({ T(), 3 }, 1) end, { "attn.cat", "element 2", "number" } },
  { "cat [2, 3] with [2, 2] along dim 1", function() return attn.cat({ T(), attn.zeros(2, 2) }, 1) end, { "attn.cat", "[2, 2]", "dim 1" } },
  { "cat along dim 3 of 2-D", function() return attn.cat({ T(), T() }, 3) end, { "attn.cat", "dim" } },
  { "cat of 0-dim tensors", function() return attn.cat({ attn.tensor(1), attn.tensor(2) }) end, { "attn.cat", "0-dim" } },
  { "stack of different shapes", function() return attn.stack({ T(), attn.zeros(3, 2) }) end, { "attn.stack", "[3, 2]" } },
  { "stack of empty tensors works", function() return attn.stack({ attn.zeros(0, 3), attn.zeros(0, 3) }, 2) end,
    check = function(t) assert.are.same({ 0, 2, 3 }, t:size()) end },
  -- math
  { "T() + 'x'", function() return T() + "x" end, { "attn.add", "'other'", "string" } },
  { "{} * T()", function() return {} * T() end, { "attn.mul", "'self'", "table" } },
  { "[2, 3] - [3, 2]", function() return T() - attn.zeros(3, 2) end, { "attn.sub", "[2, 3]", "[3, 2]" } },
  { "pow with nil", function() return T():pow(nil) end, { "attn.pow", "'other'", "nil" } },
  { "add_ that would grow self", function() return attn.zeros(3):add_(attn.zeros(2, 3)) end, { "Tensor:add_", "broadcast" } },
  { "div by zero gives inf, nan", function() return attn.tensor { 1, 0 } / 0 end,
    check = function(t) local v = t:totable(); assert.are.equal(math.huge, v[1]); assert.is_true(v[2] ~= v[2]) end },
  { "log of negative gives nan", function() return attn.tensor { -1 }:log() end,
    check = function(t) local v = t:item(); assert.is_true(v ~= v) end },
  { "exp of an empty tensor", function() return attn.zeros(0, 3):exp() end, check = function(t) assert.are.same({ 0, 3 }, t:size()) end },
  { "copy_ from a coroutine", function() return T():copy_(coroutine.create(print)) end, { "Tensor:copy_", "'src'", "thread" } },
  { "fill_('x')", function() return T():fill_("x") end, { "Tensor:fill_", "'value'", "string" } },
  { "uniform_(1, 0)", function() return T():uniform_(1, 0) end, { "Tensor:uniform_", "from" } },
  { "normal_(0, -1)", function() return T():normal_(0, -1) end, { "Tensor:normal_", "'std'" } },
  { "matmul [2, 3] x [2, 3]", function() return T():matmul(T()) end, { "attn.matmul", "[2, 3]", "cannot be multiplied" } },
  { "matmul with a 0-dim tensor", function() return attn.matmul(attn.tensor(1), T()) end, { "attn.matmul" } },
  { "matmul of empty inner dims gives zeros", function() return attn.matmul(attn.zeros(2, 0), attn.zeros(0, 3)) end,
    check = function(t) assert.are.same({ { 0, 0, 0 }, { 0, 0, 0 } }, t:totable()) end },
  { "dot of different sizes", function() return attn.dot(attn.zeros(2), attn.zeros(3)) end, { "attn.dot", "[2]", "[3]" } },
  { "allclose with a string rtol", function() return attn.allclose(T(), T(), "x") end, { "attn.allclose", "'rtol'" } },
  { "allclose of unbroadcastable shapes", function() return attn.allclose(T(), attn.zeros(3, 2)) end, { "attn.allclose", "broadcast" } },
  -- reductions and nn maths
  { "sum(3) of 2-D", function() return T():sum(3) end, { "attn.sum", "dim" } },
  { "max of an empty tensor", function() return attn.zeros(0):max() end, { "attn.max" } },
  { "argmax of a 0-dim tensor along dim", function() return attn.tensor(1):argmax(1) end, { "attn.argmax", "0-dim" } },
  { "mean of an empty dim gives nan", function() return attn.zeros(2, 0):mean(2) end,
    check = function(t) local v = t:totable(); assert.is_true(v[1] ~= v[1]) end },
  { "softmax without a dim", function() return T():softmax() end, { "attn.softmax", "'dim'" } },
  { "log_softmax(0)", function() return T():log_softmax(0) end, { "attn.log_softmax", "dim" } },
  { "softmax of a row of -inf gives nan as PyTorch", function() return attn.full({ 2 }, -math.huge):softmax(1) end,
    check = function(t) local v = t:totable(); assert.is_true(v[1] ~= v[1]) end },
  { "masked_fill with an unbroadcastable mask", function() return T():masked_fill(attn.zeros(2), 0) end, { "attn.masked_fill", "mask", "[2]" } },
  { "masked_fill with a nil value", function() return T():masked_fill(attn.zeros(3), nil) end, { "attn.masked_fill", "'value'", "nil" } },
  { "masked_fill_ with a mask that would grow self", function() return attn.zeros(3):masked_fill_(attn.zeros(2, 3), 1) end,
    { "Tensor:masked_fill_", "mask", "[2, 3]" } },
  { "triu of 1-D", function() return attn.triu(attn.zeros(3)) end, { "attn.triu", "2 dims" } },
  { "tril with a string diagonal", function() return attn.tril(T(), "1") end, { "attn.tril", "'diagonal'" } },
  { "dropout(p = 2)", function() return attn.dropout(T(), 2) end, { "attn.dropout", "between 0 and 1" } },
  { "dropout with a string training flag", function() return attn.dropout(T(), 0.5, "yes") end, { "attn.dropout", "'training'" } },
  -- random numbers
  { "manual_seed('x')", function() return attn.manual_seed("x") end, { "attn.manual_seed", "'seed'", "string" } },
  { "manual_seed(0.5)", function() return attn.manual_seed(0.5) end, { "attn.manual_seed", "'seed'", "0.5" } },
  { "set_rng_state of a short string", function() return attn.set_rng_state("abc") end, { "attn.set_rng_state" } },
  { "set_rng_state(nil)", function() return attn.set_rng_state(nil) end, { "attn.set_rng_state", "'state'", "nil" } },
  { "get_rng_state/set_rng_state round trip", function()
      local s = attn.get_rng_state(); local a = attn.rand(3); attn.set_rng_state(s); return a, attn.rand(3)
    end, check = function(a, b) assert.is_true(a:equal(b)) end },
  -- attention
  { "sdpa(nil, k, v)", function() return attn.scaled_dot_product_attention(nil, T(), T()) end,
    { "scaled_dot_product_attention", "'q'", "nil" } },
  { "sdpa with E mismatch", function() return attn.scaled_dot_product_attention(T(), attn.zeros(2, 4), attn.zeros(2, 3)) end,
    { "scaled_dot_product_attention" } },
  { "sdpa with a [3, 2] mask for [2, 2] scores", function()
      return attn.scaled_dot_product_attention(T(), T(), T(), { mask = attn.zeros(3, 2) })
    end, { "scaled_dot_product_attention", "mask" } },
  { "sdpa with an unknown option", function() return attn.scaled_dot_product_attention(T(), T(), T(), { causal = true }) end,
    { "scaled_dot_product_attention", "unknown option 'causal'" } },
  { "sdpa with dropout_p = 1.5", function() return attn.scaled_dot_product_attention(T(), T(), T(), { dropout_p = 1.5 }) end,
    { "scaled_dot_product_attention", "'dropout_p'" } },
  { "sdpa with scale = inf", function() return attn.scaled_dot_product_attention(T(), T(), T(), { scale = math.huge }) end,
    { "scaled_dot_product_attention", "'scale'" } },
  { "sdpa flash with need_weights", function()
      return attn.scaled_dot_product_attention(T(), T(), T(), { kernel = "flash", need_weights = true })
    end, { "scaled_dot_product_attention", "need_weights" } },
  { "sdpa with kernel = 'fast'", function() return attn.scaled_dot_product_attention(T(), T(), T(), { kernel = "fast" }) end,
    { "scaled_dot_product_attention", "kernel", "fast" } },
  { "sdpa with is_causal = 1", function() return attn.scaled_dot_product_attention(T(), T(), T(), { is_causal = 1 }) end,
    { "scaled_dot_product_attention", "'is_causal'", "number" } },
  { "sdpa of a fully hidden row gives zeros (flash)", function()
      return attn.scaled_dot_product_attention(T(), T(), T(), { mask = attn.ones(2, 2), kernel = "flash" })
    end, check = function(o) assert.are.same({ { 0, 0, 0 }, { 0, 0, 0 } }, o:totable()) end },
  { "sdpa with Lq = 0 and Lk = 0", function()
      return attn.scaled_dot_product_attention(attn.zeros(0, 3), attn.zeros(0, 3), attn.zeros(0, 2), { need_weights = true })
    end, check = function(o, w) assert.are.same({ 0, 2 }, o:size()); assert.are.same({ 0, 0 }, w:size()) end },
  { "simple_attention of 1-D", function() return attn.simple_attention(attn.zeros(3)) end, { "attn.simple_attention", "'x'" } },
  -- io, printing, viz
  { "save to a missing directory", function() return attn.save(T(), "/nonexistent/dir/x.npy") end, { "attn.save", "/nonexistent/dir/x.npy" } },
  { "save(t, 1)", function() return attn.save(T(), 1) end, { "attn.save", "'path'", "number" } },
  { "load of a missing file", function() return attn.load("/nonexistent/x.npy") end, { "attn.load", "/nonexistent/x.npy" } },
  { "load of a directory", function() return attn.load("/") end, { "attn.load" } },
  { "format(nil)", function() return attn.format(nil) end, { "attn.format", "'t'", "nil" } },
  { "format with a bad option", function() return attn.format(T(), { precision = "x" }) end, { "attn.format", "precision" } },
  { "tostring of a huge expanded view summarises", function() return tostring(attn.ones(1):expand(2 ^ 40)) end,
    check = function(s) assert.are.equal("tensor([1., 1., 1.,  ..., 1., 1., 1.])", s) end },
  { "viz.heatmap of 3-D", function() return attn.viz.heatmap(attn.zeros(1, 2, 2)) end, { "attn.viz.heatmap", "'weights'", "[1, 2, 2]" } },
  { "viz.heatmap with vmin = -inf", function() return attn.viz.heatmap(T(), { vmin = -math.huge }) end, { "attn.viz.heatmap", "vmin" } },
  { "viz.heads with a numeric title", function() return attn.viz.heads(attn.zeros(2, 2, 2), { title = 3 }) end, { "attn.viz.heads", "title" } },
  { "viz.show with rows of the wrong count", function() return attn.viz.show(T(), { rows = { "a" }, print = false }) end,
    { "attn.viz.show", "rows" } },
  { "viz.show of NaN and a range doubles cannot split", function()
      return attn.viz.show(attn.tensor { { 0 / 0, 1 } }, { vmin = 1e308, print = false, color = false })
    end, check = function(s) assert.truthy(s:find("??", 1, true)) end },
  -- nn classes
  { "Linear(0, 2)", function() return nn.Linear(0, 2) end, { "attn.nn.Linear", "'in_features'" } },
  { "Linear(2^62, 2): refused allocation", function() return nn.Linear(HUGE, 2) end, { "attn.nn.Linear" } },
  { "Linear forward of a string", function() return nn.Linear(2, 3):forward("x") end, { "Linear:forward", "'input'", "string" } },
  { "Linear forward of the wrong width", function() return nn.Linear(2, 3)(attn.zeros(4, 5)) end, { "Linear:forward", "in_features" } },
  { "Linear forward of an empty batch", function() return nn.Linear(2, 3)(attn.zeros(0, 2)) end,
    check = function(y) assert.are.same({ 0, 3 }, y:size()) end },
  { "Dropout(-0.1)", function() return nn.Dropout(-0.1) end, { "attn.nn.Dropout" } },
  { "SelfAttentionV1('2', 2)", function() return nn.SelfAttentionV1("2", 2) end, { "attn.nn.SelfAttentionV1", "d_in" } },
  { "SelfAttentionV2(2, 2, {qkv_bias = 1})", function() return nn.SelfAttentionV2(2, 2, { qkv_bias = 1 }) end,
    { "attn.nn.SelfAttentionV2", "qkv_bias" } },
  { "SelfAttentionV2(2^62, 2): refused allocation", function() return nn.SelfAttentionV2(HUGE, 2) end,
    { "attn.nn.SelfAttentionV2" } },
  { "CausalAttention forward past context_length", function() return nn.CausalAttention(3, 2, 2, 0)(attn.zeros(1, 3, 3)) end,
    { "CausalAttention:forward", "context_length" } },
  { "MultiHeadAttention(4, 5, 4, 0, 2): d_out % heads", function() return nn.MultiHeadAttention(4, 5, 4, 0, 2) end,
    { "attn.nn.MultiHeadAttention", "num_heads" } },
  { "MultiHeadAttentionWrapper with 0 heads", function() return nn.MultiHeadAttentionWrapper(2, 2, 2, 0, 0) end,
    { "attn.nn.MultiHeadAttentionWrapper", "num_heads" } },
  { "Attention forward with a mismatched k", function()
      return nn.Attention(3)(T(), attn.zeros(2, 4), T())
    end, { "Attention:forward" } },
  { "load_state_dict of a string", function() return nn.Linear(2, 2):load_state_dict("x") end, { "Linear:load_state_dict" } },
  { "load_state_dict with a transposed weight", function()
      local m = nn.Linear(2, 3)
      return m:load_state_dict({ weight = m.weight:t(), bias = m.bias })
    end, { "Linear:load_state_dict", "weight" } },
  { "train('yes')", function() return nn.Linear(2, 2):train("yes") end, { "Linear:train", "'mode'", "string" } },
}

describe("hostile calls", function()
  it("cover at least 60 calls", function() assert.is_true(#CASES >= 60, #CASES .. " cases") end)
  for _, case in ipairs(CASES) do
    local what, fn, words = case[1], case[2], case[3]
    it(what, function()
      local res = table.pack(pcall(fn))
      if case.check then
        assert(res[1], "expected it to work, got: " .. tostring(res[2]))
        case.check(table.unpack(res, 2, res.n))
        return
      end
      assert.is_false(res[1], "expected an error, got a result")
      local msg = res[2]
      assert.are.equal("string", type(msg))
      assert.is_nil(msg:find("attempt to ", 1, true), "a raw Lua error: " .. msg)
      for _, w in ipairs(words) do
        assert(msg:find(w, 1, true), ("the message lacks %q: %s"):format(w, msg))
      end
    end)
  end
end)
