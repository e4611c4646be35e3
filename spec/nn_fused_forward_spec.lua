-- The fused forward of CausalAttention and MultiHeadAttention
-- (attn.core.modules.attention_forward) against the same modules run module
-- by module (m:forward_modules: Linear, scaled_dot_product_attention, Linear,
-- whose numbers the torch-fixture specs check): the same bits on the direct
-- loops (tiny), the BLAS + math path and the BLAS + flash path, the same RNG
-- stream with dropout, parameters changed in place seen at once, and every
-- call it cannot take left to the module path.
local attn = require "attn"
local nn = attn.nn
local core = require "attn.core"
local C = dofile("spec/fixtures/tensor_check.lua")

local fused = core.modules.attention_forward

local assert_same_bits = C.same_bits
local function bits(t) return table.concat(C.bits(t), " ") end

-- the fused call of a module built by the constructors (nil when it declines)
local function fused_call(m, x)
  local q, k, v, o = m.W_query, m.W_key, m.W_value, m.out_proj
  local p = m.dropout.training and m.dropout.p or 0
  if o then
    return fused(x, m.d_in, m.context_length, 3, m.num_heads, m.scale, p, q.weight, q.bias, k.weight, k.bias,
      v.weight, v.bias, o.weight, o.bias)
  end
  return fused(x, m.d_in, m.context_length, 0, 1, 1 / math.sqrt(m.d_out), p, q.weight, q.bias, k.weight, k.bias,
    v.weight, v.bias)
end

-- {name, constructor, input shape}: tiny (direct loops), mid (BLAS + math kernel), long (BLAS + flash kernel)
local CASES = {
  {"CausalAttention tiny", function() return nn.CausalAttention(3, 2, 6, 0.0) end, {2, 6, 3}},
  {"CausalAttention tiny [n, d]", function() return nn.CausalAttention(3, 2, 6, 0.0) end, {6, 3}},
  {"CausalAttention tiny rank 4, bias", function() return nn.CausalAttention(3, 4, 6, 0.0, {qkv_bias = true}) end,
   {2, 2, 5, 3}},
  {"MultiHeadAttention tiny", function() return nn.MultiHeadAttention(3, 2, 6, 0.0, 2) end, {2, 6, 3}},
  {"MultiHeadAttention tiny, bias, scale", function()
     return nn.MultiHeadAttention(5, 6, 8, 0.0, 3, {qkv_bias = true, scale = 0.7}) end, {3, 8, 5}},
  {"CausalAttention mid", function() return nn.CausalAttention(48, 32, 100, 0.0, {qkv_bias = true}) end, {2, 90, 48}},
  {"MultiHeadAttention mid", function() return nn.MultiHeadAttention(48, 64, 100, 0.0, 4, {qkv_bias = true}) end,
   {2, 90, 48}},
  {"CausalAttention long (flash)", function() return nn.CausalAttention(16, 32, 300, 0.0) end, {1, 300, 16}},
  {"MultiHeadAttention long (flash)", function() return nn.MultiHeadAttention(16, 32, 300, 0.0, 2) end, {2, 300, 16}},
}

describe("attn.nn fused forward", function()
  for _, spec in ipairs(CASES) do
    local name, make, shape = spec[1], spec[2], spec[3]
    it(name .. ": takes the call and gives the bits of the module path", function()
      attn.manual_seed(5)
      local m = make():eval()
      local x = attn.randn(shape)
      assert.is_not_nil(fused_call(m, x))
      assert_same_bits(m(x), m:forward_modules(x), name)
    end)

    it(name .. ": dropout in training draws what the module path draws", function()
      attn.manual_seed(6)
      local m = make()
      m.dropout.p = 0.4
      local x = attn.randn(shape)
      attn.manual_seed(99)
      local a = m(x)
      local after_a = attn.rand(4)
      attn.manual_seed(99)
      local b = m:forward_modules(x)
      local after_b = attn.rand(4)
      assert_same_bits(a, b, name)
      assert_same_bits(after_a, after_b, name .. " (the generator afterwards)")
      assert.is_true((a - m:eval()(x)):abs():max():item() > 0, "dropout changed nothing")
    end)
  end

  it("the causal tiny path: NaN, inf and huge inputs give the bits of the module path", function()
    -- the lean loop of the notebooks' calls (no mask, no dropout) spreads a NaN or inf of a key it
    -- does not weigh as the math kernel does, and gives a row that sees no finite score its zeros
    local makes = {
      function() return nn.CausalAttention(3, 2, 6, 0.0) end,
      function() return nn.MultiHeadAttention(3, 2, 6, 0.0, 2) end,
      function() return nn.MultiHeadAttention(5, 6, 8, 0.0, 3, {qkv_bias = true}) end,
      function() return nn.CausalAttention(5, 4, 8, 0.0, {qkv_bias = true}) end,
    }
    for i, make in ipairs(makes) do
      attn.manual_seed(30 + i)
      local m = make():eval()
      for variant = 1, 3 do
        local x = attn.randn(2, 6, m.d_in) * 3
        if variant == 1 then x[{1, 2, 1}] = 0 / 0 end
        if variant == 2 then x[{2, 4, 1}], x[{1, 1, 2}] = math.huge, -math.huge end
        if variant == 3 then x = x * 1e6 end
        assert_same_bits(m(x), m:forward_modules(x), ("module %d, input %d"):format(i, variant))
      end
    end
  end)

  it("a non-contiguous input gives the bits of its contiguous copy", function()
    attn.manual_seed(7)
    local m = nn.MultiHeadAttention(4, 4, 8, 0.0, 2)
    local xt = attn.randn(2, 4, 7):transpose(2, 3) -- [2, 7, 4], strided
    assert_same_bits(m(xt), m(xt:contiguous()))
    assert_same_bits(m(xt), m:forward_modules(xt:contiguous()))
  end)

  it("parameters changed in place (uniform_, copy_, load_state_dict) are used by the next call", function()
    -- under no_grad: the fused path runs (a recording forward goes module by module), and in-place
    -- edits of parameters are allowed (as in torch)
    attn.no_grad(function()
      attn.manual_seed(8)
      local m = nn.MultiHeadAttention(3, 4, 6, 0.0, 2, {qkv_bias = true})
      local x = attn.randn(2, 6, 3)
      local before = m(x)
      m.W_key.weight:uniform_(-1, 1)
      local after = m(x)
      assert.are_not.equal(bits(before), bits(after))
      assert_same_bits(after, m:forward_modules(x))
      m.out_proj.bias:copy_(attn.ones(4))
      assert_same_bits(m(x), m:forward_modules(x))
      attn.manual_seed(9)
      local other = nn.MultiHeadAttention(3, 4, 6, 0.0, 2, {qkv_bias = true})
      m:load_state_dict(other:state_dict())
      assert_same_bits(m(x), other(x))
    end)
  end)

  it("replaced parameters and children are followed (or left to the module path)", function()
    attn.manual_seed(10)
    local m = nn.CausalAttention(3, 2, 6, 0.0)
    local x = attn.randn(2, 6, 3)
    m.W_query.weight = attn.randn(3, 2):t() -- a transposed view: still [d_out, d_in]
    assert.is_not_nil(fused_call(m, x))
    assert_same_bits(m(x), m:forward_modules(x))
    m.W_value.bias = attn.randn(2)
    assert_same_bits(m(x), m:forward_modules(x))
    m.W_key.weight = attn.randn(2, 4) -- wrong width: the module path raises its error
    assert.is_nil(fused_call(m, x))
    assert.has_error(function() m(x) end)
  end)

  it("declines what the module path must answer: bad x, too many tokens, p = 1", function()
    local m = nn.MultiHeadAttention(3, 2, 6, 0.0, 2)
    assert.is_nil(fused_call(m, nil))
    assert.is_nil(fused_call(m, attn.rand(6, 3)))      -- MultiHeadAttention takes [b, n, d_in] only
    assert.is_nil(fused_call(m, attn.rand(1, 7, 3)))   -- more than context_length tokens
    assert.is_nil(fused_call(m, attn.rand(1, 6, 4)))   -- not d_in wide
    local ca = nn.CausalAttention(3, 2, 6, 1.0)
    assert.is_nil(fused(attn.rand(6, 3), 3, 6, 0, 1, 1.0, 1.0, ca.W_query.weight, nil, ca.W_key.weight, nil,
      ca.W_value.weight, nil))
    assert.are.same({6, 2}, ca(attn.rand(6, 3)):size()) -- p = 1: zeros, from the module path
  end)
  -- m(x) of CausalAttention and MultiHeadAttention runs the fused call
  -- without Module.__call's protected call: what that shortcut must keep
  for _, make in ipairs({
    function() return nn.CausalAttention(3, 2, 6, 0.0), attn.randn(2, 6, 3) end,
    function() return nn.MultiHeadAttention(3, 2, 6, 0.0, 2), attn.randn(2, 6, 3) end,
  }) do
    local m0 = make()
    local cls = getmetatable(m0).__name
    it(cls .. " m(x): a forward replaced on the instance or in a subclass is the one called", function()
      local m, x = make()
      m.forward = function(_, input) return input:size() end
      assert.are.same(x:size(), m(x))
      local Sub = nn[cls]:extend("Sub" .. cls)
      function Sub:forward(input) return nn[cls].forward(self, input) * 2 end
      attn.manual_seed(3)
      local s = Sub(3, 2, 6, 0.0, cls == "MultiHeadAttention" and 2 or nil)
      attn.manual_seed(3)
      local plain = make()
      assert_same_bits(s(x), plain(x) * 2)
      local Same = nn[cls]:extend("Same" .. cls) -- forward inherited: the shortcut applies, same bits
      attn.manual_seed(3)
      assert_same_bits(Same(3, 2, 6, 0.0, cls == "MultiHeadAttention" and 2 or nil)(x), plain(x))
    end)

    it(cls .. " m(x): bad input still raises the error naming " .. cls .. ":forward", function()
      local m = make()
      local ok, err = pcall(function() return m(attn.randn(2, 6, 4)) end)
      assert.is_false(ok)
      assert.are.equal(cls .. ":forward: 'x' of shape [2, 6, 4] must end in d_in = 3", err)
      ok, err = pcall(function() return m(attn.randn(2, 6, 3), {bogus = true}) end)
      assert.is_false(ok)
      assert.matches(cls .. ":forward", err)
    end)
  end
end)
