-- attn.nn.MultiheadAttention against PyTorch 1.13's torch.nn.MultiheadAttention
-- (fixtures: spec/fixtures/torch_mha_cases.lua and
-- spec/fixtures/safetensors/torch_mha_state.safetensors, written by
-- scripts/fixtures/make_torch_mha_fixtures.py): after attn.manual_seed(s) the
-- parameters are torch's bits and inputs drawn after construction too; out and
-- weights agree within 2e-6 + 1e-5 relative for every layout, projection path, mask kind,
-- add_bias_kv / add_zero_attn and dropout (the forward consumes torch's random
-- numbers); names, state_dict keys and repr are torch's; a torch state dict
-- loads unchanged; the forward records, and the gradients of parameters and
-- inputs are torch autograd's (dropout included). Then attn's own choices (zeros for a fully hidden row,
-- float masks added, is_causal) and bad input.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/torch_mha_cases.lua")

local RTOL, ATOL = 1e-5, 2e-6

local function build(c)
  local o = c.ctor
  return nn.MultiheadAttention(c.embed_dim, c.num_heads, {
    dropout = o.dropout, bias = o.bias, add_bias_kv = o.add_bias_kv, add_zero_attn = o.add_zero_attn,
    kdim = o.kdim, vdim = o.vdim, batch_first = o.batch_first })
end

-- the inputs as torch drew them (checked against the stored bits when stored)
local function inputs(c)
  local q = attn.rand(c.shapes[1])
  local k, v
  if c.same == "qkv" then k, v = q, q
  elseif c.same == "kv" then k = attn.rand(c.shapes[2]); v = k
  else k, v = attn.rand(c.shapes[2]), attn.rand(c.shapes[3]) end
  if c.q then
    C.exact(q, c.q, "query")
    C.exact(k, c.k, "key")
    C.exact(v, c.v, "value")
  end
  return q, k, v
end

local function forward_opts(c)
  local fwd = c.fwd or {}
  local o = { need_weights = fwd.need_weights, average_attn_weights = fwd.average_attn_weights }
  if c.is_causal then o.is_causal = true end
  if c.attn_mask then
    o.attn_mask = C.T(c.attn_mask.t)
    o.attn_mask_type = c.attn_mask.kind
  end
  if c.key_padding_mask then
    o.key_padding_mask = C.T(c.key_padding_mask.t)
    o.key_padding_mask_type = c.key_padding_mask.kind
  end
  return o
end

describe("attn.nn.MultiheadAttention against PyTorch 1.13", function()
  for _, c in ipairs(F.cases) do
    it(c.name .. " (seed " .. c.seed .. ")", function()
      attn.manual_seed(c.seed)
      local m = build(c)
      assert.is_true(m.training)
      if not c.train then m:eval() end
      -- parameters: torch's names, order and bits
      local names = {}
      for i, np in ipairs(m:named_parameters()) do
        names[i] = np[1]
        C.exact(np[2], c.params[i], "parameter " .. np[1])
      end
      assert.are.same(c.param_names, names)
      assert.are.same(c.state_keys, m:state_dict_keys())
      assert.are.equal(c.repr, tostring(m))
      local q, k, v = inputs(c)
      attn.set_dropout_stream(c.dropout_stream)
      local ok, out, w = pcall(m, q, k, v, forward_opts(c))
      attn.set_dropout_stream("mkl")
      assert(ok, out)
      C.close(out, c.out, RTOL, ATOL, "output")
      if c.weights then
        C.close(w, c.weights, RTOL, ATOL, "weights")
      else
        assert.is_nil(w)
      end
      C.exact(attn.rand(4), c.after, "attn.rand(4) after forward")
    end)
  end

  it("a torch state dict (export_torch.py's safetensors) loads unchanged and gives torch's output", function()
    local S = F.state
    attn.manual_seed(4242)
    local m = nn.MultiheadAttention(8, 2, { add_bias_kv = true, kdim = 6, vdim = 4, batch_first = true })
    assert.are.same(S.keys, m:state_dict_keys())
    local res = m:load("spec/fixtures/safetensors/torch_mha_state.safetensors")
    assert.are.same({ missing_keys = {}, unexpected_keys = {} }, res)
    m:eval()
    assert.are.equal("bool", S.key_padding_mask.kind)
    local kpm = C.T(S.key_padding_mask.t):bool() -- a bool tensor: true = not allowed, as torch's
    local out, w = m(C.T(S.q), C.T(S.k), C.T(S.v), { key_padding_mask = kpm })
    C.close(out, S.out, RTOL, ATOL, "output")
    C.close(w, S.weights, RTOL, ATOL, "weights")
    -- and through load_state_dict of a plain table
    local d = attn.load_safetensors("spec/fixtures/safetensors/torch_mha_state.safetensors")
    attn.manual_seed(1)
    local m2 = nn.MultiheadAttention(8, 2, { add_bias_kv = true, kdim = 6, vdim = 4, batch_first = true }):eval()
    m2:load_state_dict(d)
    C.same_bits(m2(C.T(S.q), C.T(S.k), C.T(S.v), { key_padding_mask = kpm }), out)
  end)
end)

describe("attn.nn.MultiheadAttention: gradients against torch autograd", function()
  for _, c in ipairs(F.grads) do
    it(c.name .. " (seed " .. c.seed .. ")", function()
      attn.manual_seed(c.seed)
      local m = build(c)
      if not c.train then m:eval() end
      local q = attn.rand(c.shapes[1]):requires_grad_()
      local k, v
      if c.same == "qkv" then k, v = q, q
      elseif c.same == "kv" then k = attn.rand(c.shapes[2]):requires_grad_(); v = k
      else k, v = attn.rand(c.shapes[2]):requires_grad_(), attn.rand(c.shapes[3]):requires_grad_() end
      local out = m(q, k, v, forward_opts(c))
      C.close(out, c.out, RTOL, ATOL, "output")
      assert.is_false(out.is_leaf)
      assert.are.equal(c.grad_fn, out.grad_fn:name())
      out:backward(C.T(c.grad_out))
      for i, np in ipairs(m:named_parameters()) do
        assert.are.equal(c.param_names[i], np[1])
        C.close(np[2].grad, c.param_grads[i], 1e-4, 1e-5, "grad of " .. np[1])
      end
      C.close(q.grad, c.q_grad, 1e-4, 1e-5, "grad of query")
      if c.k_grad then C.close(k.grad, c.k_grad, 1e-4, 1e-5, "grad of key") end
      if c.v_grad then C.close(v.grad, c.v_grad, 1e-4, 1e-5, "grad of value") end
    end)
  end
end)

describe("attn.nn.MultiheadAttention: attn's choices", function()
  local E, H = 8, 2

  it("a query row whose keys are all hidden gives zero weights and out_proj's bias (torch: NaN)", function()
    attn.manual_seed(3)
    local m = nn.MultiheadAttention(E, H, { batch_first = true }):eval()
    attn.no_grad(function() m.out_proj.bias:copy_(attn.arange(1, E + 1)) end)
    local x = attn.rand(2, 4, E)
    local mask = attn.zeros(4, 4):bool()
    mask[2]:fill_(1)
    local out, w = m(x, x, x, { attn_mask = mask, average_attn_weights = false })
    for b = 1, 2 do
      C.is(out[b][2], { E }, { 1, 2, 3, 4, 5, 6, 7, 8 }, "hidden row")
      for h = 1, H do C.is(w[b][h][2], { 4 }, { 0, 0, 0, 0 }, "hidden row weights") end
      assert.is_true(w[b][1][1]:sum():item() > 0.999)
    end
  end)

  it("two float masks are added (torch 1.13 raises; 2.x adds)", function()
    attn.manual_seed(5)
    local m = nn.MultiheadAttention(E, H):eval()
    local x = attn.rand(5, 2, E)
    local am = attn.tensor(C.lcg(11, 25)):view(5, 5)
    local kpm = attn.tensor(C.lcg(12, 10)):view(2, 5)
    local got, gw = m(x, x, x, { attn_mask = am, attn_mask_type = "float", key_padding_mask = kpm,
      key_padding_mask_type = "float", average_attn_weights = false })
    -- the same sum as one 3-D float attn_mask [N * H, L, S] (a path the torch fixtures check)
    local sum = (am:view(1, 1, 5, 5) + kpm:view(2, 1, 1, 5)):expand(2, H, 5, 5):reshape(2 * H, 5, 5)
    local want, ww = m(x, x, x, { attn_mask = sum, attn_mask_type = "float", average_attn_weights = false })
    assert.is_true(attn.allclose(got, want, 1e-6, 1e-7))
    assert.is_true(attn.allclose(gw, ww, 1e-6, 1e-7))
  end)

  it("a float mask of 0 and -inf equals the bool mask of its -inf places", function()
    attn.manual_seed(6)
    local m = nn.MultiheadAttention(E, H, { batch_first = true }):eval()
    local x = attn.rand(2, 5, E)
    local hide = attn.triu(attn.ones(5, 5), 1):bool()
    local fmask = attn.zeros(5, 5):masked_fill(hide, -math.huge)
    local a = m(x, x, x, { attn_mask = hide })
    local b = m(x, x, x, { attn_mask = fmask })
    local c = m(x, x, x, { is_causal = true })
    assert.is_true(attn.allclose(a, b, 1e-6, 1e-7))
    assert.is_true(attn.allclose(a, c, 1e-6, 1e-7))
  end)

  it("need_weights = false gives the same output through the fused kernel, and nil weights", function()
    attn.manual_seed(7)
    local m = nn.MultiheadAttention(16, 4, { batch_first = true }):eval()
    local x = attn.rand(2, 80, 16)
    local a, w = m(x, x, x)
    local b, none = m(x, x, x, { need_weights = false })
    assert.is_not_nil(w)
    assert.is_nil(none)
    assert.is_true(attn.allclose(a, b, 1e-5, 1e-6))
  end)
end)

describe("attn.nn.MultiheadAttention: the same bits for 1 and 2 threads", function()
  it("training with dropout, masks, add_bias_kv, weights per head, across the flash tiles", function()
    -- the child prints the float32 bits of out and weights as hex, then END
    local script = table.concat({
      "local attn = require(\"attn\")",
      "attn.manual_seed(9)",
      "local m = attn.nn.MultiheadAttention(16, 4, {dropout = 0.2, add_bias_kv = true, batch_first = true})",
      "local x = attn.rand(2, 70, 16)",
      "local kv = attn.rand(2, 300, 16)",
      "local kpm = attn.rand(2, 300):gt(0.7)",
      "local o1, w = m(x, kv, kv, {key_padding_mask = kpm, average_attn_weights = false})",
      "local o2 = m(x, x, x, {is_causal = true, need_weights = false})",
      "local parts = {}",
      "for _, t in ipairs({o1, w, o2}) do",
      "  for _, v in ipairs(t:reshape(-1):totable()) do parts[#parts + 1] = string.format(\"%08x\", string.unpack(\"<I4\", string.pack(\"<f\", v))) end",
      "end",
      "print(table.concat(parts))",
      "print(\"END\")",
    }, "\n")
    local one = C.run_with_threads(1, script)
    local two = C.run_with_threads(2, script)
    assert.is_true(#one > 1000)
    assert.is_true(one == two, "the bits differ between 1 and 2 threads")
  end)
end)

describe("attn.nn.MultiheadAttention: bad input", function()
  local CTOR = "attn.nn.MultiheadAttention"
  local FWD = "MultiheadAttention:forward"

  it("constructor arguments", function()
    C.fails(function() nn.MultiheadAttention(8, 3) end, CTOR, "embed_dim (8) must be divisible by num_heads (3)")
    C.fails(function() nn.MultiheadAttention(0, 1) end, CTOR, "bad argument #1 'embed_dim'", "got 0")
    C.fails(function() nn.MultiheadAttention(8, "2") end, CTOR, "bad argument #2 'num_heads'", "got string")
    C.fails(function() nn.MultiheadAttention(8, 2, { dropout = 1.5 }) end, CTOR, "bad option 'dropout'", "[0, 1]",
      "got 1.5")
    C.fails(function() nn.MultiheadAttention(8, 2, { kdim = 0 }) end, CTOR, "bad option 'kdim'", "got 0")
    C.fails(function() nn.MultiheadAttention(8, 2, { vdim = 2.5 }) end, CTOR, "bad option 'vdim'", "got 2.5")
    C.fails(function() nn.MultiheadAttention(8, 2, { batchfirst = true }) end, CTOR, "unknown option 'batchfirst'")
    C.fails(function() nn.MultiheadAttention(8, 2, { bias = 1 }) end, CTOR, "bad option 'bias'", "expected boolean")
    C.fails(function() nn.MultiheadAttention(8, 2, 0.1) end, CTOR, "bad argument #3 'opts'")
  end)

  local m = nn.MultiheadAttention(8, 2)
  local x = attn.rand(5, 2, 8)

  it("inputs of the wrong kind, rank or width", function()
    C.fails(function() m(x, x, "v") end, FWD, "bad argument #3 'value' (expected attn.Tensor, got string)")
    C.fails(function() m(attn.rand(1, 5, 2, 8), x, x) end, FWD, "'query' must be 2-D", "got shape [1, 5, 2, 8]")
    C.fails(function() m(x, attn.rand(5, 8), x) end, FWD, "for a 3-D query, 'key' and 'value' must be 3-D too",
      "[5, 8] and [5, 2, 8]")
    C.fails(function() m(attn.rand(5, 2, 6), x, x) end, FWD, "'query' of shape [5, 2, 6] must end in embed_dim = 8")
    C.fails(function() m(x, attn.rand(5, 2, 6), attn.rand(5, 2, 6)) end, FWD, "'key' of shape [5, 2, 6]",
      "kdim = 8")
    C.fails(function() m(x, attn.rand(5, 3, 8), attn.rand(5, 3, 8)) end, FWD, "same batch size",
      "[5, 2, 8], [5, 3, 8] and [5, 3, 8]", "[L, N, E]")
    C.fails(function() m(x, attn.rand(6, 2, 8), attn.rand(5, 2, 8)) end, FWD, "key and value the same length")
  end)

  it("masks of the wrong shape, kind or values", function()
    C.fails(function() m(x, x, x, { attn_mask = attn.zeros(5, 6) }) end, FWD,
      "bad option 'attn_mask' (expected shape [5, 5] or [4, 5, 5] (N * num_heads, L, S), got [5, 6])")
    C.fails(function() m(x, x, x, { attn_mask = attn.zeros(2, 5, 5) }) end, FWD, "bad option 'attn_mask'", "got [2, 5, 5]")
    C.fails(function() m(x, x, x, { attn_mask = attn.zeros(5) }) end, FWD, "bad option 'attn_mask'", "got [5]")
    C.fails(function() m(x, x, x, { key_padding_mask = attn.zeros(5, 2) }) end, FWD,
      "bad option 'key_padding_mask' (expected shape [2, 5], got [5, 2])")
    C.fails(function() m(x[1], x[1], x[1], { key_padding_mask = attn.zeros(1, 2) }) end, FWD,
      "bad option 'key_padding_mask' (expected shape [2], got [1, 2])")
    C.fails(function() m(x[1], x[1], x[1], { attn_mask = attn.zeros(4, 2, 2) }) end, FWD,
      "(expected shape [2, 2] or [2, 2, 2] (num_heads, L, S), got [4, 2, 2])")
    C.fails(function() m(x, x, x, { attn_mask = true }) end, FWD, "bad option 'attn_mask' (expected attn.Tensor, got boolean)")
    C.fails(function() m(x, x, x, { attn_mask_type = "byte" }) end, FWD,
      "bad option 'attn_mask_type' (expected \"bool\" or \"float\", got \"byte\")")
    C.fails(function() m(x, x, x, { need_weights = 1 }) end, FWD, "bad option 'need_weights' (expected boolean, got 1)")
    C.fails(function() m(x, x, x, { key_padding = attn.zeros(2, 5) }) end, FWD, "unknown option 'key_padding'")
    C.fails(function() m(x, x, x, 5) end, FWD, "bad argument #4 'opts'")
    local fm = attn.zeros(5, 5)
    fm[{ 2, 3 }] = -math.huge
    C.fails(function() m(x, x, x, { attn_mask = fm, attn_mask_type = "bool" }) end, FWD,
      "bad option 'attn_mask' (a bool mask holds 0 and 1, 1 = not allowed; got -inf at [2, 3]",
      "attn_mask_type out")
    local km = attn.zeros(2, 5)
    km[{ 2, 4 }] = 0 / 0
    C.fails(function() m(x, x, x, { key_padding_mask = km, key_padding_mask_type = "bool" }) end, FWD,
      "got nan at [2, 4]", "key_padding_mask_type")
    -- a bool tensor is a bool mask: the float type contradicts it
    C.fails(function() m(x, x, x, { attn_mask = attn.zeros(5, 5):bool(), attn_mask_type = "float" }) end, FWD,
      "bad option 'attn_mask_type' (\"float\" is for a float tensor, and attn_mask is a bool tensor")
  end)
end)
