-- The project's own GEMM (src/core/sgemm.h), which attn.matmul and the
-- Linear layers run where the AVX2 or AVX-512 kernel set is chosen: every
-- output element is one sum in increasing k, from 0, one fused multiply-add
-- per product, so the result is the same bits whatever the operands'
-- layout (transposed or not), the tiles, the thread count or the vector
-- set (AVX2 = AVX-512); the scalar set (OpenBLAS) agrees within rounding.
-- Each ATTN_CPU value runs in a child process (the choice is made once, at
-- require time).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local info = attn.cpu_info()

-- The child: products of Lua-LCG inputs, each saved as DIR/NAME.npy.
local CHILD = [[
local attn = require "attn"
local dir = arg[1]
local function lcg(seed, ...)
  local shape, n = {...}, 1
  for _, s in ipairs(shape) do n = n * s end
  local state, data = seed, {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    data[i] = state / 1073741824 - 1
  end
  return attn.tensor(data):view(shape)
end
-- stored transposed: the same values, strides (1, rows)
local function tstored(x) return x:t():contiguous():t() end
-- 19 rows (6-row micro-tiles: an edge of 1), 70 columns (edges of 6 / 22),
-- k = 300 (blocks of 128: 128 + 128 + 44)
local a, b = lcg(1, 19, 300), lcg(2, 300, 70)
attn.save(a, dir .. "/a.npy")
attn.save(b, dir .. "/b.npy")
attn.save(attn.matmul(a, b), dir .. "/plain.npy")
attn.save(attn.matmul(tstored(a), b), dir .. "/a_t.npy")
attn.save(attn.matmul(a, tstored(b)), dir .. "/b_t.npy")
attn.save(attn.matmul(tstored(a), tstored(b)), dir .. "/both_t.npy")
-- a Linear layer's products: forward x W^T, input gradient g W, weight gradient g^T x
local x, w, g = lcg(3, 2, 100, 48), lcg(4, 40, 48), lcg(5, 2, 100, 40)
attn.save(attn.nn.functional.linear(x, w), dir .. "/linear.npy")
attn.save(attn.matmul(g, w), dir .. "/grad_x.npy")
attn.save(attn.matmul(g:reshape(200, 40):t(), x:reshape(200, 48)), dir .. "/grad_w.npy")
-- batched, and one large enough to be cut into tiles over the threads
attn.save(attn.matmul(lcg(6, 3, 20, 33), lcg(7, 33, 17)), dir .. "/batched.npy")
attn.save(attn.matmul(lcg(8, 600, 160), lcg(9, 160, 130)), dir .. "/tiled.npy")
print(attn.cpu_info().kernel)
print("END")
]]
local NAMES = {"plain", "a_t", "b_t", "both_t", "linear", "grad_x", "grad_w", "batched", "tiled"}

-- each (ATTN_CPU, thread count) runs the child once, in its own process
local sets = require("support.kernel_sets").new(CHILD)
local run_child, read_bytes = sets.run, sets.read_bytes

local function first_difference(p, q, what)
  local x, y = C.flat(attn.load(p)), C.flat(attn.load(q))
  for i = 1, #x do
    if x[i] ~= y[i] then error(("%s: first difference at element %d: %.9g vs %.9g"):format(what, i, x[i], y[i]), 2) end
  end
  error(what .. ": the files differ", 2)
end

local function same_bits(p, q, what)
  if read_bytes(p) ~= read_bytes(q) then first_difference(p, q, what) end
end

local vector_sets = {}
for _, name in ipairs(info.available) do
  if name == "avx2" or name == "avx512" then vector_sets[#vector_sets + 1] = name end
end

describe("the own GEMM (ATTN_CPU=avx2 and avx512)", function()
  it("each element is the sum in increasing k of fused multiply-adds, from 0", function()
    for _, choice in ipairs(vector_sets) do
      local dir = run_child(choice, 1)
      local a, b = attn.load(dir .. "/a.npy"):totable(), attn.load(dir .. "/b.npy"):totable()
      local got = attn.load(dir .. "/plain.npy"):totable()
      for i = 1, #a do
        for j = 1, #b[1] do
          -- a float product is exact in a double; one rounding of product + acc to float is the fused step
          -- (a double rounding first could differ only on a tie, which these inputs do not meet)
          local acc = 0
          for k = 1, #b do acc = C.f32(a[i][k] * b[k][j] + acc) end
          if got[i][j] ~= acc then
            error(("%s: element [%d][%d] = %.9g, the fused sum in increasing k is %.9g"):format(choice, i, j,
              got[i][j], acc))
          end
        end
      end
    end
  end)

  it("a transposed operand gives the same bits as a contiguous one", function()
    for _, choice in ipairs(vector_sets) do
      local dir = run_child(choice, 1)
      for _, name in ipairs({"a_t", "b_t", "both_t"}) do
        same_bits(dir .. "/" .. name .. ".npy", dir .. "/plain.npy", ("ATTN_CPU=%s: %s against plain"):format(choice, name))
      end
    end
  end)

  it("1 and 2 threads give the same bits", function()
    for _, choice in ipairs(vector_sets) do
      local d1, d2 = run_child(choice, 1), run_child(choice, 2)
      for _, name in ipairs(NAMES) do
        same_bits(d1 .. "/" .. name .. ".npy", d2 .. "/" .. name .. ".npy",
          ("ATTN_CPU=%s: %s, 1 against 2 threads"):format(choice, name))
      end
    end
  end)

  it("AVX2 and AVX-512 give the same bits", function()
    if #vector_sets < 2 then return end
    local d2, d512 = run_child("avx2", 1), run_child("avx512", 1)
    for _, name in ipairs(NAMES) do
      same_bits(d2 .. "/" .. name .. ".npy", d512 .. "/" .. name .. ".npy", name .. ": avx2 against avx512")
    end
  end)

  it("the scalar set (OpenBLAS) agrees within 1e-6 of the largest |value|", function()
    local ds = run_child("scalar", 1)
    for _, choice in ipairs(vector_sets) do
      local dir = run_child(choice, 1)
      for _, name in ipairs(NAMES) do
        local x, y = C.flat(attn.load(dir .. "/" .. name .. ".npy")), C.flat(attn.load(ds .. "/" .. name .. ".npy"))
        assert.are.equal(#y, #x, name)
        local scale = 0
        for i = 1, #y do scale = math.max(scale, math.abs(y[i])) end
        for i = 1, #y do
          assert(math.abs(x[i] - y[i]) <= 1e-6 * scale,
            ("%s against scalar, %s: element %d: %.9g vs %.9g"):format(choice, name, i, x[i], y[i]))
        end
      end
    end
  end)
end)

teardown(sets.cleanup)
