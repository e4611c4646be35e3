-- matmul (torch.matmul rules) and dot against PyTorch (spec/fixtures/tensor_matmul.lua).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/tensor_matmul.lua")
local T = C.T

-- sgemm vs PyTorch's MKL/OpenBLAS: summation order differs
local RTOL, ATOL = 1e-5, 1e-5

describe("attn.matmul", function()
  for _, c in ipairs(F.cases) do
    it(c.name .. " matches torch.matmul", function()
      local va, vb = assert(load("return " .. c.view_a))(), assert(load("return " .. c.view_b))()
      local a, b = va(T(c.a)), vb(T(c.b))
      C.close(attn.matmul(a, b), c.out, RTOL, ATOL, "attn.matmul")
      C.close(a:matmul(b), c.out, RTOL, ATOL, "Tensor:matmul")
    end)
  end
  it("a result is contiguous and independent of its inputs", function()
    local a = attn.tensor{{1, 2}, {3, 4}}
    local r = a:matmul(attn.eye(2))
    assert.is_true(r:is_contiguous())
    r[1][1] = 100
    assert.equal(1, a[1][1])
    C.is(a:matmul(a:t()), {2, 2}, {5, 11, 11, 25})
  end)
  -- long-k products of few outputs (a Linear's weight gradient) are cut into
  -- tiles of 64 rows or columns, a ragged last one included: every element,
  -- tile edges and all, against sums in double over the same float inputs
  it("long-k products of few outputs (cut into small tiles) match sums in double", function()
    attn.manual_seed(21)
    local cases = {
      {attn.randn(2048, 130):t(), attn.randn(2048, 200)},            -- a^T b: [130, 200] over k 2048
      {attn.randn(70, 1500), attn.randn(300, 1500):t()},             -- a b^T: [70, 300]
      {attn.randn(3, 96, 1200), attn.randn(3, 1200, 100)},           -- batched [3, 96, 100]
    }
    for ci, c in ipairs(cases) do
      local a, b = c[1], c[2]
      local r = attn.matmul(a, b)
      local A, B, R = a:contiguous():totable(), b:contiguous():totable(), r:totable()
      if a:dim() == 2 then A, B, R = {A}, {B}, {R} end
      local k = a:size(-1)
      local worst = 0
      for bi = 1, #R do
        local Ab, Bb, Rb = A[bi], B[bi], R[bi]
        for i = 1, #Rb, 3 do          -- every third row and column: every tile and its edges
          for j = 1, #Rb[1], 3 do
            local sum, mag = 0.0, 0.0
            for t = 1, k do
              local p = Ab[i][t] * Bb[t][j]
              sum, mag = sum + p, mag + math.abs(p)
            end
            local err = math.abs(Rb[i][j] - sum) / (mag + 1e-30)
            if err > worst then worst = err end
          end
        end
      end
      assert(worst < 1e-6, ("case %d: worst error %.3g of the sum of |products|"):format(ci, worst))
    end
  end)
  it("inputs with inf/NaN propagate as IEEE says", function()
    local r = attn.tensor{{1, 0 / 0}}:matmul(attn.tensor{{1}, {1}}):item()
    assert.is_true(r ~= r)
    assert.equal(math.huge, attn.tensor{{math.huge, 1}}:matmul(attn.tensor{{1}, {1}}):item())
  end)
  it("rejects inner-size mismatches naming both shapes", function()
    C.fails(function() attn.matmul(attn.zeros(2, 3), attn.zeros(4, 5)) end,
      "attn.matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 ~= 4)")
    C.fails(function() attn.zeros(3):matmul(attn.zeros(4)) end, "attn.matmul", "[3] and [4]")
    C.fails(function() attn.zeros(2, 3):matmul(attn.zeros(2)) end, "attn.matmul", "(3 ~= 2)")
    C.fails(function() attn.zeros(3):matmul(attn.zeros(2, 5)) end, "attn.matmul", "(3 ~= 2)")
  end)
  it("rejects batch dims that do not broadcast", function()
    C.fails(function() attn.matmul(attn.zeros(2, 3, 4), attn.zeros(3, 4, 5)) end,
      "attn.matmul", "[2, 3, 4] and [3, 4, 5]", "batch dims")
  end)
  it("rejects 0-dim and non-tensor operands", function()
    C.fails(function() attn.matmul(attn.tensor(2), attn.zeros(2)) end, "attn.matmul", "at least 1 dim")
    C.fails(function() attn.matmul(attn.zeros(2), 2) end, "attn.matmul", "bad argument #2 'other'", "got number")
    C.fails(function() attn.matmul(nil, attn.zeros(2)) end, "attn.matmul", "bad argument #1", "got nil")
    C.fails(function() attn.zeros(2, 2):matmul({{1}}) end, "attn.matmul", "got table")
  end)
end)

describe("dot", function()
  for i, c in ipairs(F.dots) do
    it("case " .. i .. " matches torch.dot", function()
      local a, b = T(c.a), T(c.b)
      if c.strided then
        local v = a:view(5, 2)
        a, b = v:select(2, 1), v:select(2, 2)
      end
      local r = a:dot(b)
      assert.equal(0, r:dim())
      C.close(r, c.out, RTOL, ATOL)
      C.close(attn.dot(a, b), c.out, RTOL, ATOL)
    end)
  end
  it("of empty vectors is 0", function()
    assert.equal(0, attn.zeros(0):dot(attn.zeros(0)):item())
  end)
  it("rejects other ranks and sizes", function()
    C.fails(function() attn.zeros(3):dot(attn.zeros(4)) end, "attn.dot", "[3] and [4]")
    C.fails(function() attn.zeros(2, 2):dot(attn.zeros(4)) end, "attn.dot", "1-D", "[2, 2]")
    C.fails(function() attn.zeros(2):dot("x") end, "attn.dot", "'other'", "got string")
  end)
end)
