-- One sliding-window convention: a window of width w holds w keys, the
-- query's own included (Mistral's). attn.block_mask.sliding_window(w) and
-- scaled_dot_product_attention's window = {w - 1, 0} see the same keys, those
-- of a dense mask built here from q - k <= w - 1 (and k <= q); FlexAttention's
-- blog example q_idx - kv_idx <= W is sliding_window(W + 1). The help texts
-- and the README's porting notes say so.
local attn = require "attn"
local help = require "attn.tools.help"
require "attn.assert"

local bm_fns = attn.block_mask

-- [L, L] of 0/1, 1 = visible: query q (1-based) sees key k iff k <= q and q - k <= w - 1
local function dense_window(L, w)
  local rows = {}
  for q = 1, L do
    local row = {}
    for k = 1, L do row[k] = (k <= q and q - k <= w - 1) and 1 or 0 end
    rows[q] = row
  end
  return attn.tensor(rows)
end

describe("sliding_window(w) is a window of width w", function()
  for _, c in ipairs({ { L = 9, w = 1 }, { L = 9, w = 3 }, { L = 9, w = 9 }, { L = 40, w = 7, block = 16 },
                       { L = 33, w = 12, block = 8 } }) do
    it(("sliding_window(%d) over %d tokens: the keys of q - k <= %d, k <= q"):format(c.w, c.L, c.w - 1), function()
      local bm = attn.block_mask(bm_fns.sliding_window(c.w), 1, 1, c.L, c.L, c.block and { block = c.block } or nil)
      assert.tensor_equal(bm:to_dense():view(c.L, c.L), dense_window(c.L, c.w))
    end)
  end

  it("attends as window = {w - 1, 0} and as the dense mask, in both kernels", function()
    attn.manual_seed(7)
    local L, E, w = 24, 8, 5
    local q, k, v = attn.randn(1, 2, L, E), attn.randn(1, 2, L, E), attn.randn(1, 2, L, E)
    local hidden = 1 - dense_window(L, w) -- attn's mask: nonzero = hidden
    for _, kernel in ipairs({ "math", "flash" }) do
      local by_dense = attn.scaled_dot_product_attention(q, k, v, { mask = hidden, kernel = kernel })
      local by_window = attn.scaled_dot_product_attention(q, k, v, { window = { w - 1, 0 }, kernel = kernel })
      local bm = attn.block_mask(bm_fns.sliding_window(w), 1, 1, L, L, { block = 8 })
      local by_block = attn.scaled_dot_product_attention(q, k, v, { block_mask = bm, kernel = kernel })
      assert.tensor_near(by_window, by_dense, 1e-5)
      assert.tensor_near(by_block, by_dense, 1e-5)
    end
  end)

  it("FlexAttention's blog example q_idx - kv_idx <= W (causal) is sliding_window(W + 1)", function()
    local L, W = 20, 4
    local function flex_example(_, _, qi, ki) return qi:ge(ki) * (qi - ki):le(W) end
    local flex = attn.block_mask(flex_example, 1, 1, L, L, { block = 8 }):to_dense()
    local ours = attn.block_mask(bm_fns.sliding_window(W + 1), 1, 1, L, L, { block = 8 }):to_dense()
    assert.tensor_equal(ours, flex)
    assert.tensor_equal(flex:view(L, L), dense_window(L, W + 1))
  end)
end)

describe("the window convention is said where people look", function()
  it("attn.help of sliding_window gives the width, the window option and the FlexAttention example", function()
    local text = assert(help.text(bm_fns.sliding_window))
    assert.truthy(text:find("the query's own", 1, true), text)
    assert.truthy(text:find("window = {w - 1, 0}", 1, true), text)
    assert.truthy(text:find("q_idx - kv_idx <= W", 1, true), text)
    assert.truthy(text:find("sliding_window(W + 1)", 1, true), text)
  end)

  it("attn.help of scaled_dot_product_attention says what window = {w - 1, 0} is, with the same example", function()
    local text = assert(help.text(attn.scaled_dot_product_attention))
    assert.truthy(text:find("{w - 1, 0}` is causal sliding-window attention of width w", 1, true), text)
    assert.truthy(text:find("q_idx - kv_idx <= W` is `{W, 0}`", 1, true), text)
  end)

  it("the README's porting notes say it, with the FlexAttention example", function()
    local f = assert(io.open("README.md"))
    local readme = f:read("a")
    f:close()
    local notes = assert(readme:match("\n## Porting notes from PyTorch\n(.-)\n## "), "no porting notes section")
    assert.truthy(notes:find("`q_idx - kv_idx <= W` sees W + 1 keys: port it as `sliding_window(W + 1)`", 1, true))
    assert.truthy(notes:find("`window = {w - 1, 0}`", 1, true))
  end)
end)
