-- Gradients at PyTorch 1.13's edges: pow with a zero exponent, a number base
-- or a zero base; remainder's divisor gradient where floor(a / b) rounds to
-- the next integer; max/min with NaN and ties; dropout = 1 in every module
-- and in scaled_dot_product_attention. Expected values come from torch
-- (spec/fixtures/autograd_edges_cases.lua, written by
-- scripts/fixtures/make_autograd_edges_fixtures.py) or are stated with the
-- torch expression that printed them.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local CASES = dofile("spec/fixtures/autograd_edges_cases.lua")
local T = C.T

local function f32bits(x) return (string.unpack("<I4", string.pack("<f", x))) end

-- t against a fixture tensor: the same shape and the same float32 bits
-- (the sign of zero included), any NaN matching any NaN; with rtol, finite
-- nonzero values within rtol (zeros, infinities and NaN still exact)
local function same_values(t, fix, what, rtol)
  assert.are.same(fix.shape, t:size(), what .. ": shape")
  local got = C.flat(t)
  for i, want in ipairs(fix.data) do
    local v = got[i]
    if want ~= want then
      assert(v ~= v, ("%s: element %d is %.9g, torch gives NaN"):format(what, i, v))
    elseif rtol and want ~= 0 and math.abs(want) ~= math.huge then
      assert(math.abs(v - want) <= rtol * math.abs(want),
        ("%s: element %d is %.9g, torch gives %.9g (rtol %g)"):format(what, i, v, want, rtol))
    else
      assert(v == v and f32bits(v) == f32bits(want),
        ("%s: element %d is %.9g (bits %08x), torch gives %.9g (bits %08x)"):format(what, i, v, f32bits(v), want,
          f32bits(want)))
    end
  end
end

-- the attn call of each fixture case: the leaves in the fixture's input order
local CALLS = {
  pow_number_exponent = function(i, c) return i.x:pow(c.exponent) end,
  pow_tensors = function(i) return attn.pow(i.a, i.b) end,
  pow_number_base = function(i, c) return attn.pow(c.base, i.x) end,
  pow_operator_number_base = function(i, c) return c.base ^ i.x end,
  remainder = function(i) return i.a % i.b end,
  remainder_ = function(i) return (i.a * 1):remainder_(i.b) end,
  max = function(i) return i.x:max() end,
  min = function(i) return i.x:min() end,
  max_dim = function(i, c) return i.x:max(c.dim, c.keepdim) end,
  min_dim = function(i, c) return i.x:min(c.dim, c.keepdim) end,
}
local INPUT_ORDER = { x = 1, a = 1, b = 2 }

-- one fixture case: forward values (and indices), node name, every input's
-- gradient; bit for bit, or within rtol where torch's vectorised pow and log
-- (SLEEF, not correctly rounded) may differ from the C library's in the last bits
local function check_case(c, rtol)
  local leaves, names = {}, {}
  for name, fix in pairs(c.inputs) do
    leaves[name] = T(fix):requires_grad_()
    names[INPUT_ORDER[name]] = name
  end
  local out, idx = CALLS[c.call](leaves, c)
  same_values(out, c.out, c.name .. " forward", rtol)
  if c.indices then same_values(idx, c.indices, c.name .. " indices") end
  assert.are.equal(c.grad_fn, out.grad_fn:name(), c.name .. " node")
  out:backward(T(c.g))
  for k, name in ipairs(names) do
    assert(leaves[name].grad ~= nil, c.name .. ": no gradient for " .. name)
    same_values(leaves[name].grad, c.grads[k], c.name .. " d/d" .. name, rtol)
  end
end

local function cases_of(calls)
  local out = {}
  for _, c in ipairs(CASES) do if calls[c.call] then out[#out + 1] = c end end
  assert(#out > 0, "no fixture cases")
  return out
end

local GENERIC_POW = { ["x:pow(2.5)"] = true, ["x:pow(-1.5)"] = true, ["x:pow(-2)"] = true,
                      ["pow(a, b) broadcast"] = true }

describe("pow's gradients as PyTorch 1.13", function()
  for _, c in ipairs(cases_of { pow_number_exponent = true, pow_tensors = true, pow_number_base = true,
                                pow_operator_number_base = true }) do
    -- where the formula takes x^y for a y without a special case in torch's kernel (x^1.5, x^-3, x^(b - 1)),
    -- torch's SLEEF powf and the C library's differ in the last bit or two
    local rtol = GENERIC_POW[c.name] and 4e-7 or nil
    it(c.name .. ": " .. c.grad_fn .. (rtol and ", torch's values within 4e-7" or ", the same bits as torch"),
      function() check_case(c, rtol) end)
  end

  it("x:pow(0) has a zero gradient at x = 0, as PyTorch 1.13 (not 0 * 0^-1 = NaN)", function()
    local x = attn.tensor({ 0, 0, 3 }, { requires_grad = true })
    x:pow(0):sum():backward()
    C.is(x.grad, { 3 }, { 0, 0, 0 })
  end)

  it("a number base records: attn.pow(n, x) as PowBackward2, n ^ x as PowBackward1 (torch's __rpow__)", function()
    local x = attn.tensor({ 1, 2 }, { requires_grad = true })
    assert.are.equal("PowBackward2", attn.pow(2, x).grad_fn:name())
    assert.are.equal("PowBackward1", (2 ^ x).grad_fn:name())
    assert.are.equal("PowBackward1", attn.pow(x, x).grad_fn:name())
    assert.are.equal("PowBackward0", (x ^ 2).grad_fn:name())
    -- d/dx 2^x = 2^x ln 2 at x = 1, 2: torch.pow(2, x) backward gives [1.3863, 2.7726]
    local y = attn.pow(2, x)
    y:sum():backward()
    C.close(x.grad, { shape = { 2 }, data = { 2 * math.log(2), 4 * math.log(2) } }, 1e-6, 0, "d/dx 2^x")
  end)
end)

describe("remainder and floor_divide as PyTorch 1.13", function()
  for _, c in ipairs(cases_of { remainder = true, remainder_ = true }) do
    it(c.name .. ": forward, and d/db = -floor_divide(a, b), the same bits as torch", function()
      check_case(c)
      if c.floor_divide then
        local a, b = T(c.inputs.a), T(c.inputs.b)
        same_values(a // b, c.floor_divide, c.name .. " a // b")
        same_values(attn.floor_divide(a, b), c.floor_divide, c.name .. " floor_divide")
      end
    end)
  end

  it("1 % 0.1 in float32: remainder 0.099999987, a // b = 9, so d/db = -9 (torch 1.13), not -10", function()
    local a = attn.tensor({ 1 }, { requires_grad = true })
    local b = attn.tensor({ 0.1 }, { requires_grad = true })
    local r = a % b
    -- torch.remainder(torch.tensor([1.]), torch.tensor([0.1])) prints 0.09999998659 (%.10g)
    assert.are.equal(f32bits(0.09999998659), f32bits(r:item()))
    assert.are.equal(9, (a // b):item())
    r:backward(attn.ones(1))
    C.is(a.grad, { 1 }, { 1 })
    C.is(b.grad, { 1 }, { -9 })
  end)
end)

describe("max/min with NaN and ties as PyTorch 1.13", function()
  for _, c in ipairs(cases_of { max = true, min = true, max_dim = true, min_dim = true }) do
    it(c.name .. ": " .. c.grad_fn .. ", the same values, indices and gradient as torch", function() check_case(c) end)
  end

  it("x:max() with a NaN: the gradient goes to the NaN (torch 1.13's evenly_distribute_backward)", function()
    local x = attn.tensor({ 1, 0 / 0, 3, 3 }, { requires_grad = true })
    x:max():backward()
    C.is(x.grad, { 4 }, { 0, 1, 0, 0 })
    local y = attn.tensor({ 0 / 0, 2, 0 / 0 }, { requires_grad = true })
    y:min():backward()
    C.is(y.grad, { 3 }, { 0.5, 0, 0.5 })
  end)
end)

-- every parameter of m with its gradient; none may be nil
local function grads_of(m)
  local out = {}
  for _, np in ipairs(m:named_parameters()) do
    assert(np[2].grad ~= nil, np[1] .. ": no gradient (nil), torch 1.13 gives zeros")
    out[np[1]] = C.flat(np[2].grad)
  end
  return out
end

-- every gradient is zeros, but for those named in `nonzero`
local function assert_zero_grads(grads, nonzero)
  for name, g in pairs(grads) do
    if not (nonzero and nonzero[name]) then
      for i, v in ipairs(g) do assert(v == 0, ("%s: element %d is %g, want 0"):format(name, i, v)) end
    end
  end
end

local function draws_nothing(fn)
  attn.manual_seed(99)
  local want = C.flat(attn.rand(4))
  attn.manual_seed(99)
  local r = table.pack(fn())
  assert.are.same(want, C.flat(attn.rand(4)), "dropout = 1 draws nothing (as torch)")
  return table.unpack(r, 1, r.n)
end

describe("dropout = 1 in training keeps the graph, as PyTorch 1.13", function()
  local x
  before_each(function()
    attn.manual_seed(7)
    x = attn.rand(2, 4, 6)
  end)

  -- the module's output [2, 4, *] in training: in the graph, zeros but for `bias_of`
  local function check_module(m, nonzero, ...)
    m:train()
    local args = select("#", ...) > 0 and table.pack(...) or table.pack(x)
    local out = draws_nothing(function() return m(table.unpack(args, 1, args.n)) end)
    assert.is_true(out.requires_grad)
    assert.is_not_nil(out.grad_fn)
    out:sum():backward()
    local grads = grads_of(m)
    assert_zero_grads(grads, nonzero)
    return out, grads
  end

  it("CausalAttention: zeros out, every W gets a zero gradient (torch: UnsafeViewBackward0)", function()
    local out = check_module(nn.CausalAttention(6, 6, 4, 1.0))
    assert.are.equal("UnsafeViewBackward0", out.grad_fn:name())
    assert.are.equal(0, out:abs():sum():item())
  end)

  it("MultiHeadAttentionWrapper: each head's W gets a zero gradient", function()
    check_module(nn.MultiHeadAttentionWrapper(6, 3, 4, 1.0, 2))
  end)

  it("MultiHeadAttention: zero gradients but out_proj.bias's (8 = rows, as torch), weights in the graph", function()
    local m = nn.MultiHeadAttention(6, 6, 4, 1.0, 2)
    local _, grads = check_module(m, { ["out_proj.bias"] = true })
    assert.are.same({ 8, 8, 8, 8, 8, 8 }, grads["out_proj.bias"])
    local _, w = m(x, { need_weights = true })
    assert.is_not_nil(w.grad_fn)
    assert.are.equal(0, w:abs():sum():item())
  end)

  it("GroupedQueryAttention: every parameter gets a zero gradient", function()
    check_module(nn.GroupedQueryAttention(8, 8, 4, 2, 1, { dropout = 1 }), nil, attn.rand(2, 4, 8))
  end)

  it("MultiheadAttention (torch's): in_proj zero gradients, out_proj.bias 8 (torch 1.13 nn.MultiheadAttention)", function()
    local m = nn.MultiheadAttention(6, 2, { dropout = 1 })
    local _, grads = check_module(m, { ["out_proj.bias"] = true }, x, x, x)
    assert.are.same({ 8, 8, 8, 8, 8, 8 }, grads["out_proj.bias"])
  end)

  it("GPTModel with drop_rate = 1: every parameter has a gradient, zeros but final_norm.shift's", function()
    local m = nn.GPTModel { vocab_size = 10, context_length = 4, emb_dim = 8, n_heads = 2, n_layers = 1,
                            drop_rate = 1, qkv_bias = false }
    check_module(m, { ["final_norm.shift"] = true }, attn.tensor { { 1, 2, 3 } })
  end)

  it("AdamW then decays a parameter whose gradient is zero (torch skips only grad = None)", function()
    local m = nn.CausalAttention(6, 6, 4, 1.0)
    local opt = attn.optim.AdamW(m:parameters(), { lr = 0.1, weight_decay = 0.5 })
    local before = C.flat(m.W_query.weight)
    m(x):sum():backward()
    opt:step()
    -- zero gradient: the Adam update is 0, only p * (1 - lr * wd) = p * 0.95 remains
    local after = C.flat(m.W_query.weight)
    for i = 1, #before do
      assert(math.abs(after[i] - before[i] * 0.95) <= 1e-6 * math.abs(before[i]),
        ("element %d: %.9g, want %.9g"):format(i, after[i], before[i] * 0.95))
    end
  end)

  it("nn.Dropout(1) and functional.dropout(x, 1): MulBackward0, zero gradient, nothing drawn", function()
    local t = attn.tensor({ 1, -2, 3 }, { requires_grad = true })
    local y = draws_nothing(function() return nn.Dropout(1)(t) end)
    assert.are.equal("MulBackward0", y.grad_fn:name())
    y:sum():backward()
    C.is(t.grad, { 3 }, { 0, 0, 0 })
    local z = draws_nothing(function() return nn.functional.dropout(t, 1) end)
    assert.are.equal("MulBackward0", z.grad_fn:name())
  end)

  it("scaled_dot_product_attention with dropout_p = 1: weights * 0 @ v (torch's math path), zero gradients", function()
    local q = attn.randn(2, 3, 4):requires_grad_()
    local k = attn.randn(2, 5, 4):requires_grad_()
    local v = attn.randn(2, 5, 6):requires_grad_()
    local bias = attn.randn(3, 5):requires_grad_()
    local out, w = draws_nothing(function()
      return attn.scaled_dot_product_attention(q, k, v, { dropout_p = 1, bias = bias, need_weights = true })
    end)
    assert.are.same({ 2, 3, 6 }, out:size())
    assert.are.same({ 2, 3, 5 }, w:size())
    assert.are.equal("UnsafeViewBackward0", out.grad_fn:name())
    assert.are.equal("MulBackward0", w.grad_fn:name())
    assert.are.equal(0, out:abs():sum():item())
    local s = out:sum() + w:sum()
    s:backward()
    for name, t in pairs { q = q, k = k, v = v, bias = bias } do
      assert(t.grad ~= nil, name .. ": no gradient")
      assert.are.equal(0, t.grad:abs():sum():item(), name)
    end
  end)

  it("scaled_dot_product_attention with dropout_p = 1 and enable_gqa, window, return_lse, kernel = 'flash'", function()
    local q = attn.randn(1, 4, 3, 4):requires_grad_()
    local k = attn.randn(1, 2, 5, 4):requires_grad_()
    local v = attn.randn(1, 2, 5, 6):requires_grad_()
    local out = attn.scaled_dot_product_attention(q, k, v, { dropout_p = 1, enable_gqa = true, is_causal = true })
    assert.are.same({ 1, 4, 3, 6 }, out:size())
    out:sum():backward()
    assert.are.equal(0, v.grad:abs():sum():item())
    local o, lse = attn.scaled_dot_product_attention(q, k, v,
      { dropout_p = 1, enable_gqa = true, window = { 1, 0 }, return_lse = true, kernel = "flash" })
    local _, lse0 = attn.scaled_dot_product_attention(q, k, v, { enable_gqa = true, window = { 1, 0 }, return_lse = true })
    assert.are.same({ 1, 4, 3, 6 }, o:size())
    C.close(lse, { shape = lse0:size(), data = C.flat(lse0) }, 1e-6, 1e-6, "lse: dropout does not change it")
  end)

  it("scaled_dot_product_attention: dropout_p outside [0, 1] is an error naming the option and the range", function()
    local q = attn.randn(2, 4)
    C.fails(function() attn.scaled_dot_product_attention(q, q, q, { dropout_p = 1.5 }) end,
      "attn.scaled_dot_product_attention", "bad option 'dropout_p'", "[0, 1]", "got 1.5")
    C.fails(function() attn.scaled_dot_product_attention(q, q, q, { dropout_p = 0 / 0 }) end,
      "attn.scaled_dot_product_attention", "bad option 'dropout_p'", "got nan")
  end)
end)
