-- The row-wise split-K decoding path (src/core/flash_decode.c run_chunk_rows,
-- the kernels of src/core/kernel_decode.h): every row count it takes (1 to 8
-- query rows per kv head: Lq x the GQA group), head sizes with and without
-- vector tails (E 64 holds the queries in registers), against the math
-- kernel; strided K and V (packed per block) give their contiguous copies'
-- bits. (All instruction sets: spec/cpu_dispatch_spec.lua's decode cases.)
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention

describe("flash decoding, row by row", function()
  for _, c in ipairs {
    { lq = 1, g = 1, e = 64, ev = 64 }, { lq = 1, g = 2, e = 64, ev = 80 }, { lq = 1, g = 3, e = 20, ev = 7 },
    { lq = 1, g = 4, e = 64, ev = 64 }, { lq = 1, g = 5, e = 64, ev = 33 }, { lq = 2, g = 3, e = 3, ev = 64 },
    { lq = 7, g = 1, e = 64, ev = 16 }, { lq = 2, g = 4, e = 128, ev = 128 }, { lq = 1, g = 8, e = 1, ev = 1 },
  } do
    local rows = c.lq * c.g
    it(("%d row(s): Lq %d, %d query heads per kv head, E %d, Ev %d"):format(rows, c.lq, c.g, c.e, c.ev), function()
      attn.manual_seed(rows * 100 + c.e)
      local q = attn.randn(2, 2 * c.g, c.lq, c.e)
      local k, v = attn.randn(2, 2, 2600, c.e), attn.randn(2, 2, 2600, c.ev)
      local o = { enable_gqa = c.g > 1, window = { 2000, 0 }, return_lse = true }
      o.kernel = "math"
      local om, lm = sdpa(q, k, v, o)
      o.kernel = "flash"
      local of, lf = sdpa(q, k, v, o)
      assert.is_true(attn.allclose(of, om, 1e-5, 2e-6), "out")
      assert.is_true(attn.allclose(lf, lm, 1e-6, 1e-5), "lse")
    end)
  end

  it("strided K and V give their contiguous copies' bits (E 64, 3 rows)", function()
    attn.manual_seed(9)
    local q = attn.randn(1, 6, 1, 64)
    local k, v = attn.randn(1, 2, 64, 3000):transpose(3, 4), attn.randn(1, 2, 40, 3000):transpose(3, 4)
    local o = { kernel = "flash", enable_gqa = true }
    C.same_bits(sdpa(q, k, v, o), sdpa(q, k:contiguous(), v:contiguous(), o))
  end)
end)
