-- Reliability of tensor ops: in-place ops on overlapping operands,
-- writability of expanded views, x[{i, j}] indexing, reductions over huge
-- expanded views, argument checks and their messages.
-- Expected values are computed here by hand or in plain Lua, never by attn.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local PARTIAL = "some elements of the input tensor and the written%-to tensor refer to a single memory location"
local SHARED = "more than one element of the written%-to tensor"

local function fails_matching(fn, fname, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  assert.truthy(err:find(fname, 1, true), "the error does not name " .. fname .. ": " .. err)
  assert.truthy(err:find(pattern), "the error does not match " .. pattern .. ": " .. err)
end

local function seq(n) return attn.arange(1, n + 1) end

describe("in-place ops with partially overlapping operands", function()
  for _, op in ipairs { "add_", "sub_", "mul_", "div_" } do
    it(op .. " of a view by a shifted view of the same storage is refused, self unchanged (as PyTorch)", function()
      local a = seq(6)
      fails_matching(function() a:narrow(1, 2, 5)[op](a:narrow(1, 2, 5), a:narrow(1, 1, 5)) end, "Tensor:" .. op,
        PARTIAL)
      C.is(a, { 6 }, { 1, 2, 3, 4, 5, 6 })
      fails_matching(function() a:narrow(1, 1, 5)[op](a:narrow(1, 1, 5), a:narrow(1, 2, 5)) end, "Tensor:" .. op,
        PARTIAL)
      C.is(a, { 6 }, { 1, 2, 3, 4, 5, 6 })
    end)
  end
  it("add_ on shifted rows, a transposed self and a broadcast row of self are refused", function()
    local a = seq(9):view(3, 3)
    fails_matching(function() a:narrow(1, 2, 2):add_(a:narrow(1, 1, 2)) end, "Tensor:add_", PARTIAL)
    fails_matching(function() a:add_(a:t()) end, "Tensor:add_", PARTIAL)
    fails_matching(function() a:add_(a[1]) end, "Tensor:add_", PARTIAL)
    C.is(a, { 3, 3 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9 })
  end)
  it("exact full overlap (a:add_(a)) and disjoint views of one storage still work", function()
    local a = seq(6)
    a:add_(a)
    C.is(a, { 6 }, { 2, 4, 6, 8, 10, 12 })
    a:mul_(a:view(2, 3):view(6))
    C.is(a, { 6 }, { 4, 16, 36, 64, 100, 144 })
    local b = seq(6)
    b:narrow(1, 4, 3):add_(b:narrow(1, 1, 3)) -- no element in common
    C.is(b, { 6 }, { 1, 2, 3, 5, 7, 9 })
    -- interleaved columns: the address ranges meet, the elements do not
    local c = seq(12):view(3, 2, 2)
    c:select(3, 1):add_(c:select(3, 2))
    C.is(c:view(-1), { 12 }, { 3, 2, 7, 4, 11, 6, 15, 8, 19, 10, 23, 12 })
    -- one element of self broadcast into the others
    local d = seq(4)
    d:narrow(1, 2, 3):add_(d:narrow(1, 1, 1))
    C.is(d, { 4 }, { 1, 3, 4, 5 })
  end)
  it("masked_fill_ with a mask that is a shifted view of self is refused; mask == self works", function()
    local a = attn.tensor { 0, 1, 0, 1, 1, 0 }
    fails_matching(function() a:narrow(1, 2, 5):masked_fill_(a:narrow(1, 1, 5), 9) end, "Tensor:masked_fill_", PARTIAL)
    C.is(a, { 6 }, { 0, 1, 0, 1, 1, 0 })
    a:masked_fill_(a, 7)
    C.is(a, { 6 }, { 0, 7, 0, 7, 7, 0 })
  end)
  it("copy_ and t[i] = view compute as if the source were copied first", function()
    local a = seq(6)
    a:narrow(1, 2, 5):copy_(a:narrow(1, 1, 5)) -- different data pointers, overlapping
    C.is(a, { 6 }, { 1, 1, 2, 3, 4, 5 })
    local b = seq(6)
    b:narrow(1, 1, 5):copy_(b:narrow(1, 2, 5))
    C.is(b, { 6 }, { 2, 3, 4, 5, 6, 6 })
    local g = seq(9):view(3, 3)
    g[2] = g:view(-1):narrow(1, 2, 3) -- row 2 := elements 2..4 (4 is row 2's first)
    C.is(g, { 3, 3 }, { 1, 2, 3, 2, 3, 4, 7, 8, 9 })
    local cols = seq(9):view(3, 3) -- strided rows: an element-by-element copy would read its own writes
    cols:narrow(2, 2, 2):copy_(cols:narrow(2, 1, 2))
    C.is(cols, { 3, 3 }, { 1, 1, 2, 4, 4, 5, 7, 7, 8 })
    local rows = seq(9):view(3, 3)
    rows:narrow(2, 2, 2)[{ 1 }] = rows:narrow(2, 1, 2)[1]
    C.is(rows, { 3, 3 }, { 1, 1, 2, 4, 5, 6, 7, 8, 9 })
    local s = seq(4):view(2, 2)
    s:copy_(s) -- onto itself
    C.is(s, { 2, 2 }, { 1, 2, 3, 4 })
  end)
end)

describe("in-place ops on an expanded (self-overlapping) view", function()
  local function column() return attn.ones(3):view(3, 1):expand(3, 3) end
  local refused = {
    { "triu_", function(e) return e:triu_(1) end },
    { "tril_", function(e) return e:tril_() end },
    { "masked_fill_", function(e) return e:masked_fill_(attn.eye(3), 0) end },
    { "add_", function(e) return e:add_(1) end },
    { "mul_", function(e) return e:mul_(attn.ones(3, 3)) end },
    { "copy_", function(e) return e:copy_(attn.zeros(3, 3)) end },
    { "uniform_", function(e) return e:uniform_() end },
    { "normal_", function(e) return e:normal_() end },
  }
  for _, case in ipairs(refused) do
    it(case[1] .. " is refused with the one wording, and leaves the storage alone", function()
      local base = attn.ones(3)
      local e = base:view(3, 1):expand(3, 3)
      fails_matching(function() case[2](e) end, "Tensor:" .. case[1], SHARED)
      fails_matching(function() case[2](e) end, "Tensor:" .. case[1], "Please clone%(%) the tensor")
      C.is(base, { 3 }, { 1, 1, 1 })
    end)
  end
  it("t[i] = tensor into an expanded row is refused with the same wording", function()
    fails_matching(function() local e = column(); e[1] = attn.zeros(3) end, "attn.Tensor index assignment", SHARED)
  end)
  it("fills write one value everywhere and stay allowed, as in PyTorch: fill_, zero_, t[i] = number", function()
    local base = attn.ones(3)
    base:view(3, 1):expand(3, 3):fill_(2)
    C.is(base, { 3 }, { 2, 2, 2 })
    base:view(3, 1):expand(3, 3):zero_()
    C.is(base, { 3 }, { 0, 0, 0 })
    local e = base:view(3, 1):expand(3, 3)
    e[2] = 5
    C.is(base, { 3 }, { 0, 5, 0 })
  end)

end)

-- Runs a Lua snippet in a child with a wall-clock limit: a reduction that
-- walks 2^40 elements would otherwise hang the suite instead of failing it.
local function child_prints(script, seconds)
  local f = assert(io.popen("timeout " .. seconds .. " scripts/attn-lua -e '" .. script .. "' 2>&1; echo \"rc=$?\""))
  local text = f:read("a")
  f:close()
  return text
end

describe("reductions over huge expanded views", function()
  it("sum, mean, max, min, argmax, argmin of ones(1):expand(2^40) in a moment, and equal too", function()
    local out = child_prints([[
      local attn = require "attn"
      local e = attn.ones(1):expand(2 ^ 40)
      print(("%.17g %.17g %.17g %.17g %.17g %.17g %s"):format(e:sum():item(), e:mean():item(), e:max():item(),
        e:min():item(), e:argmax():item(), e:argmin():item(), tostring(e:equal(attn.ones(1):expand(2 ^ 40)))))
      print(tostring(e:equal(attn.zeros(1):expand(2 ^ 40))))
    ]], 20)
    assert.are.equal("1099511627776 1 1 1 1 1 true\nfalse\nrc=0\n", out)
  end)
  it("along an expanded dim and across one: [3, 2^40] from a column", function()
    local out = child_prints([[
      local attn = require "attn"
      local x = attn.tensor { 1.5, -2, 3 }:view(3, 1):expand(3, 2 ^ 40)
      local s, m = x:sum(2), x:mean(2)
      local mx, at = x:max(2)
      print(("%.17g %.17g %.17g | %.17g %.17g %.17g | %g %g %g | %g %g %g"):format(s[1], s[2], s[3], m[1], m[2], m[3],
        mx[1], mx[2], mx[3], at[1], at[2], at[3]))
      print(("%.17g %.17g %.17g"):format(x:sum():item(), x:mean():item(), x:argmin():item()))
    ]], 20)
    local n = 2 ^ 40
    -- independent: value x count in double, rounded to float32
    local want1 = ("%.17g %.17g %.17g | %.17g %.17g %.17g | %g %g %g | %g %g %g"):format(C.f32(1.5 * n), C.f32(-2 * n),
      C.f32(3 * n), 1.5, -2, 3, 1.5, -2, 3, 1, 1, 1)
    -- argmin: the first -2 is element (2, 1), flat index 2^40 + 1 (1-based), as a float32
    local want2 = ("%.17g %.17g %.17g"):format(C.f32(2.5 * n), C.f32(2.5 / 3), C.f32(n + 1))
    assert.are.equal(want1 .. "\n" .. want2 .. "\nrc=0\n", out)
  end)
  it("reducing across an expanded dim gives the same bits as a materialised copy", function()
    local base = attn.tensor { { 0.1, 0.7, -0.3 }, { 2.5, 1e-3, 7 } }
    local e = base:view(2, 1, 3):expand(2, 50, 3)
    local copy = e:contiguous()
    for _, dim in ipairs { 1, 2, 3 } do
      assert.is_true(e:sum(dim):equal(copy:sum(dim)), "sum " .. dim)
      assert.is_true(e:mean(dim):equal(copy:mean(dim)), "mean " .. dim)
      local v1, i1 = e:max(dim)
      local v2, i2 = copy:max(dim)
      assert.is_true(v1:equal(v2) and i1:equal(i2), "max " .. dim)
      assert.is_true(e:argmin(dim):equal(copy:argmin(dim)), "argmin " .. dim)
    end
    assert.is_true(e:sum():equal(copy:sum()))
    assert.is_true(e:argmax():equal(copy:argmax()))
    -- the expanded dim's sum by hand: 50 copies of each value
    local s = e:sum(2)
    for i = 1, 2 do
      for j = 1, 3 do assert.are.equal(C.f32(50 * C.f32(base[i][j])), s[i][j]) end
    end
  end)
  it("equal compares without a temporary: NaN unequal, shapes must match", function()
    local a = attn.tensor { 1, 0 / 0, 3 }
    assert.is_false(a:equal(a))
    assert.is_true(attn.tensor { 1, 2 }:equal(attn.tensor { 1, 2 }))
    assert.is_false(attn.tensor { 1, 2 }:equal(attn.tensor { 1, 2, 3 }))
    assert.is_true(attn.zeros(0, 3):equal(attn.zeros(0, 3)))
    assert.is_false(attn.tensor { 1, 2 }:view(2, 1):expand(2, 4):equal(attn.tensor { 1, 1 }:view(2, 1):expand(2, 4)))
  end)
end)

describe("x[{i, j}] indexing", function()
  local function grid() return attn.arange(1, 13):view(3, 4) end
  it("a table of 1-based indices selects dims in order, as PyTorch's x[i-1, j-1]", function()
    local x = grid()
    assert.are.equal(7, x[{ 2, 3 }])            -- every dim: a number
    assert.are.equal(x[2][3], x[{ 2, 3 }])
    assert.are.equal(12, x[{ -1, -1 }])
    C.is(x[{ 2 }], { 4 }, { 5, 6, 7, 8 })      -- fewer: a view
    C.is(x[{}], { 3, 4 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 })
    x[{ 2 }][1] = -5                              -- views share memory
    assert.are.equal(-5, x[{ 2, 1 }])
  end)
  it("assignment through a table of indices: numbers fill, tensors copy", function()
    local x = grid()
    x[{ 1, 2 }] = 100
    x[{ 3 }] = attn.tensor { 0, 0, 0, 0 }
    x[{ 2, -1 }] = attn.tensor(-8)
    C.is(x, { 3, 4 }, { 1, 100, 3, 4, 5, 6, 7, -8, 0, 0, 0, 0 })
  end)
  it("anything else is a clear error, never a silent nil", function()
    local x = grid()
    fails_matching(function() return x[{ 1, 2, 3 }] end, "attn.Tensor index", "too many indices for a tensor of 2 dims")
    fails_matching(function() return x[{ 1.5 }] end, "attn.Tensor index", "index 1 of the table must be an integer, got 1.5")
    fails_matching(function() return x[{ 1, "a" }] end, "attn.Tensor index", "index 2 of the table must be an integer, got string")
    fails_matching(function() return x[{ 1, 5 }] end, "attn.Tensor index", "index 5 is out of range for dim 2 of size 4")
    fails_matching(function() return x[1.5] end, "attn.Tensor index", "expected an integer, got 1.5")
    fails_matching(function() return x[true] end, "attn.Tensor index", "got boolean")
    fails_matching(function() return x[x:gt(2)] end, "attn.Tensor index", "got attn.Tensor")
    fails_matching(function() x[{ 1, 2, 3 }] = 1 end, "attn.Tensor index assignment", "too many indices")
    fails_matching(function() x[{ 1, 2 }] = "s" end, "attn.Tensor index assignment", "expected a number or an attn.Tensor")
    assert.is_nil(x.no_such_method) -- string keys stay method lookups
  end)
end)

describe("argument checks and messages", function()
  it("extra arguments are refused, naming the function and the count", function()
    local t = attn.ones(2, 3)
    fails_matching(function() return t:max(1, true, 3) end, "attn.max", "bad argument #4 %(no more than 3 arguments expected, got 4%)")
    fails_matching(function() return attn.softmax(t, 2, 3) end, "attn.softmax", "bad argument #3 %(no more than 2 arguments expected, got 3%)")
    fails_matching(function() return t:add(1, 2) end, "attn.add", "no more than 2 arguments expected, got 3")
    fails_matching(function() return t:add_(1, 2) end, "Tensor:add_", "no more than 2 arguments expected, got 3")
    fails_matching(function() return t:exp(1) end, "attn.exp", "no more than 1 argument expected, got 2")
    fails_matching(function() return t:narrow(1, 1, 1, 1) end, "Tensor:narrow", "no more than 4 arguments expected")
    fails_matching(function() return attn.matmul(t, t:t(), t) end, "attn.matmul", "no more than 2 arguments expected")
    fails_matching(function() return attn.cat({ t }, 1, 2) end, "attn.cat", "no more than 2 arguments expected")
    fails_matching(function() return t:masked_fill(t, 0, 1) end, "attn.masked_fill", "no more than 3 arguments expected")
    fails_matching(function() return t:triu(1, 2) end, "attn.triu", "no more than 2 arguments expected")
    fails_matching(function() return t:uniform_(0, 1, 2) end, "Tensor:uniform_", "no more than 3 arguments expected")
    fails_matching(function() return attn.dropout(t, 0.5, true, 1) end, "attn.dropout", "no more than 3 arguments expected")
    fails_matching(function() return attn.scaled_dot_product_attention(t, t, t, {}, 1) end,
      "attn.scaled_dot_product_attention", "no more than 4 arguments expected")
    fails_matching(function() return attn.allclose(t, t, 1e-5, 1e-8, true) end, "attn.allclose",
      "bad argument #5 %(no more than 4 arguments expected, got 5%)")
    fails_matching(function() return attn.zeros_like(t, 2) end, "attn.zeros_like", "no more than 1 argument expected")
  end)
  it("keepdim must be a boolean, and needs a dim", function()
    local t = attn.ones(2, 3)
    fails_matching(function() return t:sum(1, "yes") end, "attn.sum", "bad argument #3 'keepdim' %(expected a boolean, got string%)")
    fails_matching(function() return t:argmax(1, 1) end, "attn.argmax", "'keepdim' %(expected a boolean, got 1%)")
    fails_matching(function() return t:sum(nil, true) end, "attn.sum", "keepdim needs a dim")
    C.is(t:sum(1, true), { 1, 3 }, { 2, 2, 2 })
    C.is(t:sum(2, false), { 2 }, { 3, 3 })
    C.is(t:sum(2, nil), { 2 }, { 3, 3 })
  end)
  it("attn.dot errors name dot, not matmul", function()
    local ok, err = pcall(attn.dot, attn.ones(2), attn.ones(3))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("attn.dot", 1, true))
    local big = attn.ones(1):expand(2 ^ 40) -- the core refuses the length (BLAS integer range)
    ok, err = pcall(attn.dot, big, big)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("attn.dot", 1, true), tostring(err))
    assert.is_nil(tostring(err):find("matmul", 1, true))
  end)
  it("a look-alike claiming __name = 'attn.Tensor' is named for what it is", function()
    local fake = setmetatable({}, { __name = "attn.Tensor" })
    fails_matching(function() return attn.softmax(fake, 1) end, "attn.softmax", "got table %(not an attn.Tensor%)")
    fails_matching(function() return attn.zeros_like(fake) end, "attn.zeros_like", "got table %(not an attn.Tensor%)")
    fails_matching(function() return attn.ones(2):add_(fake) end, "Tensor:add_", "got table")
    fails_matching(function() return attn.ones(2):equal(fake) end, "Tensor:equal", "got table %(not an attn.Tensor%)")
  end)
  it("allclose reports the real cause of a failure, not always a broadcast error", function()
    fails_matching(function() return attn.allclose(attn.ones(2), attn.ones(3)) end, "attn.allclose",
      "shapes %[2%] and %[3%] cannot be broadcast")
    -- the subtraction of two huge expanded views cannot be allocated: that, not a broadcast error
    local big = attn.ones(1):expand(2 ^ 40)
    local ok, err = pcall(attn.allclose, big, big)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("attn.allclose", 1, true), err)
    assert.truthy(err:find("cannot allocate", 1, true), err)
    assert.is_nil(err:find("broadcast", 1, true))
  end)
  it("attn.progress takes counts up to 2^53, and says so for 1e308 or inf", function()
    fails_matching(function() return attn.progress(1e308) end, "attn.progress", "non%-negative integer up to 2%^53, got 1e%+308")
    local p = attn.progress(10, nil, { tty = false })
    fails_matching(function() p:step(1e308) end, "Progress:step", "up to 2%^53, got 1e%+308")
    fails_matching(function() p:step(math.huge) end, "Progress:step", "up to 2%^53, got inf")
    fails_matching(function() p:step(0 / 0) end, "Progress:step", "expected a non%-negative integer")
    assert.are.equal(10, p:step(10).count)
  end)
  it("viz refuses to draw more than 512 rows or columns, with a hint to narrow", function()
    local huge = attn.ones(1, 1):expand(3000, 3000)
    fails_matching(function() return attn.viz.heatmap(huge) end, "attn.viz.heatmap", "too large to draw.*narrow it first")
    fails_matching(function() return attn.viz.show(huge, { print = false }) end, "attn.viz.show", "too large to draw")
    fails_matching(function() return attn.viz.heads(attn.ones(1, 1, 1):expand(8, 400, 400)) end, "attn.viz.heads",
      "400 x 400 in 8 panels")
    assert.truthy(attn.viz.heatmap(attn.ones(1, 1):expand(512, 2)):find("</svg>", 1, true)) -- the largest side drawn
  end)
end)
