-- CausalAttention and MultiHeadAttention forward(x, {need_weights = true}):
-- the weights against softmax(mask(q k^T * scale)) composed from tensor ops here.
local attn = require "attn"
local nn = attn.nn
require "attn.assert"

local function causal_softmax(q, k, scale)
  local n = q:size(-2)
  local scores = q:matmul(k:transpose(-2, -1)) * scale
  return scores:masked_fill(attn.triu(attn.ones(n, n), 1):bool(), -math.huge):softmax(-1)
end

describe("need_weights on the attention modules", function()
  it("MultiHeadAttention returns the output and [b, heads, n, n] weights", function()
    attn.manual_seed(5)
    local m = nn.MultiHeadAttention(4, 6, 8, 0.0, 3):eval()
    local x = attn.randn(2, 5, 4)
    local out, w = m(x, { need_weights = true })
    assert.tensor_near(m(x), out, 1e-6)
    assert.are.same({ 2, 3, 5, 5 }, w:size())
    local q = m.W_query(x):view(2, 5, 3, 2):transpose(2, 3)
    local k = m.W_key(x):view(2, 5, 3, 2):transpose(2, 3)
    assert.tensor_near(causal_softmax(q, k, 1 / math.sqrt(2)), w, 1e-6)
    assert.tensor_near(attn.ones(2, 3, 5), w:sum(-1), 1e-6)
    -- above the diagonal: exactly zero
    assert.are.equal(0, w[1][2][1][2])
    -- the grid of heads draws it
    local svg = attn.viz.heads(w)
    assert.truthy(svg:find("<svg", 1, true))
  end)

  it("CausalAttention returns the output and [..., n, n] weights", function()
    attn.manual_seed(6)
    local m = nn.CausalAttention(3, 2, 6, 0.0)
    local x = attn.randn(2, 6, 3)
    local out, w = m(x, { need_weights = true })
    assert.tensor_near(m(x), out, 1e-6)
    assert.are.same({ 2, 6, 6 }, w:size())
    assert.tensor_near(causal_softmax(m.W_query(x), m.W_key(x), 1 / math.sqrt(2)), w, 1e-6)
  end)

  it("dropout = 1 in training gives zero weights; false asks for none", function()
    local m = nn.MultiHeadAttention(4, 4, 4, 1.0, 2)
    local out, w = m(attn.randn(1, 3, 4), { need_weights = true })
    assert.are.same({ 1, 2, 3, 3 }, w:size())
    assert.are.equal(0, w:abs():sum():item())
    assert.are.same({ 1, 3, 4 }, out:size())
    local _, none = m:eval()(attn.randn(1, 3, 4), { need_weights = false })
    assert.is_nil(none)
  end)

  it("bad options are errors naming the class", function()
    local m = nn.MultiHeadAttention(4, 4, 4, 0.0, 2)
    local ok, e = pcall(m, attn.randn(1, 3, 4), { need_weight = true })
    assert.is_false(ok)
    assert.truthy(e:find("attn.nn.MultiHeadAttention: unknown option 'need_weight'", 1, true), e)
    ok, e = pcall(m, attn.randn(1, 3, 4), "weights")
    assert.is_false(ok)
    assert.truthy(e:find("attn.nn.MultiHeadAttention", 1, true), e)
  end)
end)
