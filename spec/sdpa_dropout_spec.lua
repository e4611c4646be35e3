-- Dropout inside attention: the fused and math kernels draw the same single
-- number and apply the same MKL-style mask to the weights.
local attn = require "attn"

describe("scaled_dot_product_attention dropout", function()
  for _, case in ipairs {
    { lq = 100, lk = 120, e = 16, ev = 8, causal = true },
    -- key blocks past the first (256 keys) that cross the diagonal, and a last query block of 20 rows
    { lq = 340, lk = 360, e = 8, ev = 8, causal = true },
    { lq = 65, lk = 7, e = 3, ev = 5, causal = false },
    { lq = 1, lk = 300, e = 64, ev = 64, causal = false },
  } do
    it(("flash equals math with dropout_p = 0.3 (Lq %d, Lk %d, causal %s)"):format(case.lq, case.lk,
      tostring(case.causal)), function()
      attn.manual_seed(1)
      local q = attn.randn(2, 3, case.lq, case.e)
      local k = attn.randn(2, 3, case.lk, case.e)
      local v = attn.randn(2, 3, case.lk, case.ev)
      local opts = { dropout_p = 0.3, is_causal = case.causal }
      attn.manual_seed(5)
      opts.kernel = "math"
      local a = attn.scaled_dot_product_attention(q, k, v, opts)
      local after_math = attn.rand(1):item()
      attn.manual_seed(5)
      opts.kernel = "flash"
      local b = attn.scaled_dot_product_attention(q, k, v, opts)
      local after_flash = attn.rand(1):item()
      assert.is_true(attn.allclose(b, a, 5e-6, 1e-5))
      assert.equal(after_math, after_flash) -- one draw each
      -- and dropout changed something
      attn.manual_seed(5)
      assert.is_false(attn.allclose(attn.scaled_dot_product_attention(q, k, v, { is_causal = case.causal }), a))
    end)
  end
end)
