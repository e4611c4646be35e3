-- Properties of the attention modules of attn.nn that hold whatever the
-- weights: causality (bitwise), batch independence, the wrapper is the
-- concatenation of its heads, train/eval and dropout semantics (torch's:
-- dropout only in training, p = 0 and eval draw nothing, p = 1 drops every
-- weight), state_dict round trips. Expected values are the module's own
-- outputs under a transformation whose effect is known, or hand-computed.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")

local assert_same_bits = C.same_bits
local function bits(t) return table.concat(C.bits(t), " ") end

-- the first `k` tokens of [b, n, d] (or [n, d])
local function first_tokens(t, k) return t:narrow(t:dim() - 1, 1, k) end

-- builders of causal modules: {name, constructor, input shape}
local CAUSAL = {
  {"CausalAttention", function() return nn.CausalAttention(5, 4, 8, 0.3, {qkv_bias = true}) end, {2, 7, 5}},
  {"MultiHeadAttentionWrapper", function() return nn.MultiHeadAttentionWrapper(5, 3, 8, 0.3, 3) end, {2, 7, 5}},
  {"MultiHeadAttention", function() return nn.MultiHeadAttention(5, 8, 8, 0.3, 4, {qkv_bias = true}) end, {2, 7, 5}},
  {"MultiHeadAttention (custom scale)", function() return nn.MultiHeadAttention(5, 6, 8, 0.0, 2, {scale = 0.7}) end,
   {3, 8, 5}},
}

describe("attn.nn causal modules: causality and batch independence", function()
  for _, spec in ipairs(CAUSAL) do
    local name, make, shape = spec[1], spec[2], spec[3]

    it(name .. ": output at position i is unchanged (bitwise) when later tokens change", function()
      attn.manual_seed(11)
      local m = make():eval()
      local x = attn.rand(shape)
      local out = m(x)
      local n = shape[2]
      for i = 1, n - 1 do
        local x2 = x:clone()
        x2:narrow(2, i + 1, n - i):copy_(attn.rand(shape[1], n - i, shape[3]) * 10 - 5)
        local out2 = m(x2)
        assert_same_bits(first_tokens(out, i), first_tokens(out2, i), name .. ": first " .. i .. " tokens")
        -- and the changed tokens do change the output after them
        assert.are_not.equal(bits(out:narrow(2, i + 1, 1)), bits(out2:narrow(2, i + 1, 1)))
      end
    end)

    it(name .. ": batch items are independent", function()
      attn.manual_seed(12)
      local m = make():eval()
      local x = attn.rand(shape)
      local out = m(x)
      local b = shape[1]
      for j = 1, b do
        local alone = m(x:narrow(1, j, 1):contiguous())
        C.close(alone, {shape = alone:size(), data = C.flat(out:narrow(1, j, 1))}, 0, 1e-6, name .. " item " .. j)
      end
      -- changing the first batch entry leaves every other entry's output bitwise unchanged
      local x2 = x:clone()
      x2:narrow(1, 1, 1):copy_(attn.rand(1, shape[2], shape[3]))
      local out2 = m(x2)
      assert_same_bits(out:narrow(1, 2, b - 1), out2:narrow(1, 2, b - 1), name .. " other items")
      assert.are_not.equal(bits(out:narrow(1, 1, 1)), bits(out2:narrow(1, 1, 1)))
    end)
  end

  it("MultiHeadAttentionWrapper: the output is the concatenation of its heads' outputs (bitwise)", function()
    attn.manual_seed(13)
    local w = nn.MultiHeadAttentionWrapper(4, 3, 6, 0.0, 3, {qkv_bias = true})
    local x = attn.rand(2, 5, 4)
    local out = w(x)
    assert.are.same({2, 5, 9}, out:size())
    assert_same_bits(attn.cat({w.heads[1](x), w.heads[2](x), w.heads[3](x)}, -1), out, "cat of heads")
  end)

  it("SelfAttentionV1/V2 and CausalAttention: a batch [b, n, d] is b separate [n, d] calls", function()
    attn.manual_seed(14)
    for _, m in ipairs({nn.SelfAttentionV1(5, 4), nn.SelfAttentionV2(5, 4, {qkv_bias = true}),
                        nn.CausalAttention(5, 4, 6, 0.0)}) do
      local x = attn.rand(3, 6, 5)
      local out = m(x)
      assert.are.same({3, 6, 4}, out:size())
      for j = 1, 3 do
        local alone = m(x:select(1, j))
        C.close(alone, {shape = {6, 4}, data = C.flat(out:select(1, j))}, 0, 1e-6, tostring(m):match("^%w+"))
      end
    end
  end)

  it("Attention: permuting the queries permutes the outputs; an all-zero mask is no mask", function()
    attn.manual_seed(15)
    local a = nn.Attention(3)
    local q, kv = attn.rand(4, 3), attn.rand(5, 3)
    local out = a(q, kv, kv)
    local perm = {3, 1, 4, 2}
    local rows = {}
    for i, p in ipairs(perm) do rows[i] = q:select(1, p) end
    local outp = a(attn.stack(rows, 1), kv, kv)
    for i, p in ipairs(perm) do
      C.close(outp:select(1, i), {shape = {3}, data = C.flat(out:select(1, p))}, 0, 1e-6, "permuted row " .. i)
    end
    assert_same_bits(a(q, kv, kv, attn.zeros(4, 5)), out, "zero mask")
  end)
end)

describe("attn.nn attention modules: train / eval and dropout", function()
  local function draws_nothing(fn)
    attn.manual_seed(99)
    local want = bits(attn.rand(3))
    attn.manual_seed(99)
    fn()
    return bits(attn.rand(3)) == want
  end

  it("modules start in training mode, children included; eval() and train() switch every descendant", function()
    local w = nn.MultiHeadAttentionWrapper(3, 2, 4, 0.5, 2)
    local m = nn.MultiHeadAttention(3, 4, 4, 0.5, 2)
    for _, mod in ipairs({w, m, nn.CausalAttention(3, 2, 4, 0.5), nn.SelfAttentionV1(3, 2),
                          nn.SelfAttentionV2(3, 2), nn.Attention(2)}) do
      for _, nm in ipairs(mod:named_modules()) do assert.is_true(nm[2].training, nm[1]) end
      assert.are.equal(mod, mod:eval())
      for _, nm in ipairs(mod:named_modules()) do assert.is_false(nm[2].training, nm[1]) end
      assert.are.equal(mod, mod:train())
      for _, nm in ipairs(mod:named_modules()) do assert.is_true(nm[2].training, nm[1]) end
    end
    assert.is_true(w.heads[2].dropout.training)
    w:eval()
    assert.is_false(w.heads[2].dropout.training)
  end)

  for _, spec in ipairs(CAUSAL) do
    local name, make, shape = spec[1], spec[2], spec[3]
    it(name .. ": eval is deterministic and draws nothing; training with p > 0 drops, p = 0 does not", function()
      attn.manual_seed(21)
      local m = make()
      local x = attn.rand(shape)
      m:eval()
      local out
      assert.is_true(draws_nothing(function() out = m(x) end))
      assert_same_bits(out, m(x), "eval twice")
      m:train()
      local p = (m.dropout or m.heads[1].dropout).p
      if p > 0 then
        assert.is_false(draws_nothing(function() m(x) end))
        local a, b = m(x), m(x)
        assert.are_not.equal(bits(a), bits(b))
        assert.are_not.equal(bits(a), bits(out))
      else
        local t
        assert.is_true(draws_nothing(function() t = m(x) end))
        assert_same_bits(t, out, "training with p = 0")
      end
    end)
  end

  it("dropout = 1 in training drops every weight, as torch: CausalAttention gives zeros, MHA out_proj's bias; no draws", function()
    attn.manual_seed(22)
    local ca = nn.CausalAttention(3, 2, 4, 1.0)
    local x = attn.rand(2, 4, 3)
    local out
    assert.is_true(draws_nothing(function() out = ca(x) end))
    C.is(out, {2, 4, 2}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
    local mha = nn.MultiHeadAttention(3, 4, 4, 1.0, 2)
    assert.is_true(draws_nothing(function() out = mha(x) end))
    local bias = C.flat(mha.out_proj.bias)
    local want = {}
    for i = 1, 2 * 4 do for j = 1, 4 do want[#want + 1] = bias[j] end end
    C.is(out, {2, 4, 4}, want)
    -- in eval mode dropout = 1 is plain attention: the same as a p = 0 module with the same weights
    attn.manual_seed(23)
    local m1 = nn.MultiHeadAttention(3, 4, 4, 1.0, 2):eval()
    attn.manual_seed(23)
    local m0 = nn.MultiHeadAttention(3, 4, 4, 0.0, 2)
    assert_same_bits(m1(x), m0(x), "eval p = 1 vs p = 0")
  end)
end)

describe("attn.nn attention modules: state_dict round trip", function()
  local MAKERS = {
    function() return nn.SelfAttentionV1(4, 3) end,
    function() return nn.SelfAttentionV2(4, 3, {qkv_bias = true}) end,
    function() return nn.CausalAttention(4, 3, 5, 0.0, {qkv_bias = true}) end,
    function() return nn.MultiHeadAttentionWrapper(4, 3, 5, 0.0, 2) end,
    function() return nn.MultiHeadAttention(4, 6, 5, 0.0, 3, {qkv_bias = true}) end,
    function() return nn.Attention(4) end,
  }
  for i, make in ipairs(MAKERS) do
    it("copy of another instance's state dict gives its outputs bitwise, without sharing storage (#" .. i .. ")", function()
      attn.manual_seed(31)
      local m1 = make()
      attn.manual_seed(32)
      local m2 = make()
      local cls = tostring(m1):match("^%w+")
      local x = attn.rand(2, 5, 4)
      local function run(m)
        -- Attention's default row_dim/col_dim (1, 2) are those of [n, d] inputs
        if cls == "Attention" then return m(x[1], x[2], x[2]) end
        return m(x)
      end
      local want = run(m1)
      assert.are_not.equal(bits(want), bits(run(m2)))
      m2:load_state_dict(m1:state_dict())
      assert_same_bits(run(m2), want, cls .. " after load_state_dict")
      -- (parameters require grad: in-place edits go inside no_grad, as in torch)
      attn.no_grad(function() for _, np in ipairs(m1:named_parameters()) do np[2]:fill_(0) end end)
      assert_same_bits(run(m2), want, cls .. " after zeroing the source")
      assert.are.same(m1:state_dict_keys(), m2:state_dict_keys())
    end)
  end
end)
