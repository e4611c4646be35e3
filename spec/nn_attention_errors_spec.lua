-- Bad input to the constructors and forward methods of the attention modules
-- of attn.nn: every error names the class, the argument and what was wrong,
-- and points at the caller (not at Module.lua).
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/nn_attention_cases.lua")

local fails = C.fails

-- a constructor error is reported at the line that called the class
local function ctor_fails(fn, ...)
  local msg = fails(fn, ...)
  assert.is_nil(msg:find("Module.lua", 1, true), msg)
  assert.is_truthy(msg:find("nn_attention_errors_spec.lua", 1, true), msg)
  return msg
end

describe("attn.nn attention constructors reject bad arguments", function()
  it("SelfAttentionV1", function()
    local K = "attn.nn.SelfAttentionV1"
    ctor_fails(function() nn.SelfAttentionV1() end, K, "#1 'd_in'", "positive integer", "got nil")
    ctor_fails(function() nn.SelfAttentionV1("3", 2) end, K, "#1 'd_in'", "got string")
    ctor_fails(function() nn.SelfAttentionV1(3, 0) end, K, "#2 'd_out'", "got 0")
    ctor_fails(function() nn.SelfAttentionV1(3, 1.5) end, K, "#2 'd_out'", "got 1.5")
    ctor_fails(function() nn.SelfAttentionV1(-2, 2) end, K, "#1 'd_in'", "got -2")
    ctor_fails(function() nn.SelfAttentionV1(3, 2, {qkv_bias = true}) end, K, "unexpected argument #3")
  end)

  it("SelfAttentionV2", function()
    local K = "attn.nn.SelfAttentionV2"
    ctor_fails(function() nn.SelfAttentionV2(3) end, K, "#2 'd_out'", "got nil")
    ctor_fails(function() nn.SelfAttentionV2(3, 2, {bias = true}) end, K, "unknown option 'bias'", "qkv_bias")
    ctor_fails(function() nn.SelfAttentionV2(3, 2, {qkv_bias = 1}) end, K, "bad option 'qkv_bias'", "boolean")
    ctor_fails(function() nn.SelfAttentionV2(3, 2, true) end, K, "#3 'opts'", "table of options")
  end)

  it("CausalAttention", function()
    local K = "attn.nn.CausalAttention"
    ctor_fails(function() nn.CausalAttention(3, 2, 0, 0.1) end, K, "#3 'context_length'", "got 0")
    ctor_fails(function() nn.CausalAttention(3, 2, 4) end, K, "#4 'dropout'", "probability in [0, 1]", "got nil")
    ctor_fails(function() nn.CausalAttention(3, 2, 4, 1.5) end, K, "#4 'dropout'", "got 1.5")
    ctor_fails(function() nn.CausalAttention(3, 2, 4, -0.1) end, K, "#4 'dropout'")
    ctor_fails(function() nn.CausalAttention(3, 2, 4, 0 / 0) end, K, "#4 'dropout'")
    ctor_fails(function() nn.CausalAttention(3, 2, 4, "0.1") end, K, "#4 'dropout'", "got string")
    ctor_fails(function() nn.CausalAttention(3, 2, 4, 0.1, {num_heads = 2}) end, K, "unknown option 'num_heads'")
  end)

  it("MultiHeadAttentionWrapper", function()
    local K = "attn.nn.MultiHeadAttentionWrapper"
    ctor_fails(function() nn.MultiHeadAttentionWrapper({}, 2, 4, 0, 2) end, K, "#1 'd_in'", "got table")
    ctor_fails(function() nn.MultiHeadAttentionWrapper(3, 2, 4, 0, 0) end, K, "#5 'num_heads'", "got 0")
    ctor_fails(function() nn.MultiHeadAttentionWrapper(3, 2, 4, 0) end, K, "#5 'num_heads'", "got nil")
    ctor_fails(function() nn.MultiHeadAttentionWrapper(3, 2, 4, 2, 2) end, K, "#4 'dropout'")
    ctor_fails(function() nn.MultiHeadAttentionWrapper(3, 2, 4, 0, 2, {scale = 1}) end, K, "unknown option 'scale'")
  end)

  it("MultiHeadAttention", function()
    local K = "attn.nn.MultiHeadAttention"
    ctor_fails(function() nn.MultiHeadAttention(3, 5, 4, 0, 2) end, K, "d_out (5) must be divisible by num_heads (2)")
    ctor_fails(function() nn.MultiHeadAttention(768, 768, 1024, 0.1, 10) end, K, "divisible", "(10)")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 4, 0, 2, {foo = 1}) end, K, "unknown option 'foo'",
      "qkv_bias, scale")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 4, 0, 2, {scale = "x"}) end, K, "bad option 'scale'", "number")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 4, 0, 2, {scale = 0 / 0}) end, K, "bad option 'scale'", "finite")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 4, 0, 2, {scale = math.huge}) end, K, "'scale'", "finite")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 4, 0) end, K, "#5 'num_heads'")
    ctor_fails(function() nn.MultiHeadAttention(3, 4, 2.5, 0, 2) end, K, "#3 'context_length'", "got 2.5")
  end)

  it("Attention", function()
    local K = "attn.nn.Attention"
    ctor_fails(function() nn.Attention("2") end, K, "#1 'd_model'", "got string")
    ctor_fails(function() nn.Attention(0) end, K, "#1 'd_model'", "got 0")
    ctor_fails(function() nn.Attention(2, {row = 1}) end, K, "unknown option 'row'", "col_dim, row_dim")
    ctor_fails(function() nn.Attention(2, {row_dim = 0}) end, K, "bad option 'row_dim'", "nonzero integer")
    ctor_fails(function() nn.Attention(2, {col_dim = 1.5}) end, K, "bad option 'col_dim'", "got 1.5")
    ctor_fails(function() nn.Attention(2, {col_dim = "2"}) end, K, "bad option 'col_dim'", "got string")
  end)
end)

describe("attn.nn attention forward rejects bad input", function()
  it("SelfAttentionV1 / SelfAttentionV2", function()
    for _, K in ipairs({"SelfAttentionV1", "SelfAttentionV2"}) do
      local m = nn[K](3, 2)
      fails(function() m() end, K .. ":forward", "'x'", "expected attn.Tensor, got nil")
      fails(function() m(3) end, K .. ":forward", "'x'", "got 3")
      fails(function() m({}) end, K .. ":forward", "got table")
      fails(function() m(attn.rand(3)) end, K .. ":forward", "2 to 8 dims", "[3]")
      fails(function() m(attn.rand(4, 5)) end, K .. ":forward", "[4, 5]", "d_in = 3")
    end
  end)

  it("CausalAttention: ranks, widths, longer than context_length", function()
    local K = "CausalAttention:forward"
    local m = nn.CausalAttention(3, 2, 4, 0.1)
    fails(function() m(attn.rand(2, 5, 3)) end, K, "5 tokens", "[2, 5, 3]", "context_length = 4")
    fails(function() m(attn.rand(2, 4, 4)) end, K, "[2, 4, 4]", "d_in = 3")
    fails(function() m(attn.rand(3)) end, K, "2 to 8 dims")
    fails(function() m("x") end, K, "expected attn.Tensor, got string")
  end)

  it("MultiHeadAttentionWrapper: errors name the wrapper, not its heads", function()
    local K = "MultiHeadAttentionWrapper:forward"
    local m = nn.MultiHeadAttentionWrapper(3, 2, 4, 0.1, 2)
    fails(function() m(attn.rand(2, 5, 3)) end, K, "5 tokens", "context_length = 4")
    fails(function() m(attn.rand(2, 4, 4)) end, K, "d_in = 3")
    fails(function() m() end, K, "expected attn.Tensor, got nil")
    fails(function() m(attn.rand(3)) end, K, "2 to 8 dims")
  end)

  it("MultiHeadAttention: [b, n, d_in] only, n <= context_length", function()
    local K = "MultiHeadAttention:forward"
    local m = nn.MultiHeadAttention(3, 4, 4, 0.1, 2)
    fails(function() m(attn.rand(2, 5, 3)) end, K, "5 tokens", "[2, 5, 3]", "context_length = 4")
    fails(function() m(attn.rand(4, 3)) end, K, "3 dims", "[4, 3]")
    fails(function() m(attn.rand(1, 2, 4, 3)) end, K, "3 dims", "[1, 2, 4, 3]")
    fails(function() m(attn.rand(2, 4, 5)) end, K, "[2, 4, 5]", "d_in = 3")
    fails(function() m("x") end, K, "expected attn.Tensor, got string")
    fails(function() m(true) end, K, "got boolean")
  end)

  it("Attention: widths, ranks, mismatched sequences, masks that do not broadcast", function()
    local K = "Attention:forward"
    local a = nn.Attention(3)
    local q, kv = attn.rand(4, 3), attn.rand(5, 3)
    fails(function() a(nil, kv, kv) end, K, "'encodings_for_q'", "expected attn.Tensor, got nil")
    fails(function() a(q, 1, kv) end, K, "'encodings_for_k'", "got 1")
    fails(function() a(q, kv, attn.rand(5, 2)) end, K, "'encodings_for_v'", "[5, 2]", "d_model = 3")
    fails(function() a(q, kv, attn.rand(6, 3)) end, K, "values of shape [6, 3]", "weights of shape [4, 5]")
    fails(function() a(q, kv, kv, attn.ones(3, 5)) end, K, "mask of shape [3, 5]", "scores of shape [4, 5]")
    fails(function() a(q, kv, kv, attn.ones(4, 5, 2)) end, K, "mask of shape [4, 5, 2]")
    fails(function() a(q, kv, kv, "m") end, K, "'mask'", "got string")
    fails(function() a(attn.rand(3), attn.rand(3), attn.rand(3)) end, K, "col_dim = 2 is out of range", "[3]")
    local a2 = nn.Attention(3, {row_dim = 2, col_dim = 3})
    fails(function() a2(attn.rand(2, 4, 3), attn.rand(3, 5, 3), attn.rand(3, 5, 3)) end, K,
      "queries of shape [2, 4, 3]", "keys of shape [3, 5, 3]")
    fails(function() a2(q, kv, kv) end, K, "col_dim = 3 is out of range")
  end)
end)

describe("attn.nn attention load_state_dict rejects a mismatched state dict", function()
  it("a torch state dict of other sizes: size mismatch naming the class and key", function()
    local c = F.cases.MultiHeadAttention[2]   -- 5 -> 8, 4 heads, context 8, qkv_bias
    local d = {}
    for _, e in ipairs(c.state) do d[e[1]] = C.T(e[2]) end
    local m = nn.MultiHeadAttention(5, 8, 6, 0.0, 4, {qkv_bias = true})
    local before = C.flat(m.W_query.weight)
    fails(function() m:load_state_dict(d) end, "MultiHeadAttention:load_state_dict",
      "size mismatch for \"mask\"", "[8, 8]", "[6, 6]")
    assert.are.same(before, C.flat(m.W_query.weight))  -- nothing copied
    local m2 = nn.MultiHeadAttention(5, 8, 8, 0.0, 4)     -- no qkv biases
    fails(function() m2:load_state_dict(d) end, "MultiHeadAttention", "unexpected key(s)", "W_query.bias")
    local ca = nn.CausalAttention(3, 4, 4, 0.1)
    local sd = ca:state_dict()
    sd.mask = nil
    fails(function() ca:load_state_dict(sd) end, "CausalAttention", "missing key(s)", "\"mask\"")
    local w = nn.MultiHeadAttentionWrapper(3, 2, 4, 0, 2)
    local wd = w:state_dict()
    wd["heads.1.W_key.weight"] = attn.zeros(3, 2)
    fails(function() w:load_state_dict(wd) end, "MultiHeadAttentionWrapper", "heads.1.W_key.weight", "[3, 2]", "[2, 3]")
  end)
end)
