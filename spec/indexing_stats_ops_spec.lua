-- The ops of src/binding/lua_ops.c and erf, sin, cos (clamp, var/std, where, cumsum,
-- index_select, gather, scatter_add_, chunk, split, repeat_interleave, topk,
-- sort, argsort) against PyTorch 1.13 (spec/fixtures/indexing_stats_ops_cases.lua, written
-- by scripts/fixtures/make_indexing_stats_ops_fixtures.py), with broadcast and
-- non-contiguous inputs, edge cases and bad input.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/indexing_stats_ops_cases.lua")
local T = C.T

-- the input of a case, transposed when the case says so (a non-contiguous view)
local function input(fix, how)
  local x = T(fix)
  if how == "t" then
    x = x:t()
    assert.is_false(x:is_contiguous())
  end
  return x
end

local function shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

describe("erf, sin, cos", function()
  -- glibc's erff/sinf/cosf against PyTorch's SLEEF kernels (1 ulp each)
  for i, c in ipairs(F.unary) do
    it("match PyTorch on special and ordinary values, case " .. i .. (c.view ~= "" and " (transposed)" or ""), function()
      local x = input(c.x, c.view)
      C.close(x:erf(), c.erf, 3e-7, 1e-37, "erf")
      C.close(attn.sin(x), c.sin, 3e-7, 1e-37, "sin")
      C.close(x:cos(), c.cos, 3e-7, 1e-37, "cos")
    end)
  end
end)

describe("clamp", function()
  for i, c in ipairs(F.clamp) do
    it("case " .. i .. ": min " .. tostring(c.min or (c.min_t and "tensor")) .. ", max " ..
      tostring(c.max or (c.max_t and "tensor")) .. (c.view ~= "" and ", transposed" or ""), function()
      local x = input(c.x, c.view)
      local lo = c.min_t and T(c.min_t) or c.min
      local hi = c.max_t and T(c.max_t) or c.max
      C.exact(x:clamp(lo, hi), c.out, "clamp")
      C.exact(attn.clamp(x, lo, hi), c.out, "attn.clamp")
      local y = x:clone()
      assert.are.equal(y, y:clamp_(lo, hi))
      C.exact(y, c.out, "clamp_")
    end)
  end
  it("broadcasts tensor bounds to a larger result, as torch.clamp", function()
    local r = attn.clamp(attn.tensor { 0.5 }, attn.tensor { { 1 }, { 0 } }, attn.tensor { 2, 0.25, 3 })
    C.is(r, { 2, 3 }, { 1, 0.25, 1, 0.5, 0.25, 0.5 })
  end)
  it("needs a bound, numbers or tensors, and bounds that fit self for clamp_", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:clamp() end, "attn.clamp", "at least one of 'min'")
    C.fails(function() return x:clamp(nil, nil) end, "attn.clamp", "at least one of 'min'")
    C.fails(function() return x:clamp("a") end, "attn.clamp", "#2 'min'", "got string")
    C.fails(function() return x:clamp(0, {}) end, "attn.clamp", "#3 'max'", "got table")
    C.fails(function() return x:clamp(attn.ones(4)) end, "attn.clamp", "[2, 3]", "[4]")
    C.fails(function() return x:clamp_(attn.ones(3, 3)) end, "Tensor:clamp_", "min of shape [3, 3]", "[2, 3]")
    C.fails(function() return attn.ones(3):expand(2, 3):clamp_(0, 1) end, "Tensor:clamp_", "single memory location")
    C.fails(function() return x:clamp(0, 1, 2) end, "attn.clamp", "no more than 3")
  end)
end)

describe("var and std", function()
  local RT = 2.4e-7 -- double accumulation both sides: the last float bit at most
  for _, c in ipairs(F.moments) do
    local name = shape_str(c.x.shape) .. (c.view ~= "" and " transposed" or "")
    it("of every element of " .. name .. ", unbiased and not", function()
      local x = input(c.x, c.view)
      C.close(x:var(), c.all[1], RT, 0, "var")
      C.close(attn.std(x), c.all[2], RT, 0, "std")
      C.close(x:var { unbiased = false }, c.all[3], RT, 0, "var biased")
      C.close(x:std { unbiased = false }, c.all[4], RT, 0, "std biased")
      C.close(x:var { unbiased = true }, c.all[1], RT, 0, "var unbiased = true")
    end)
    it("along each dim of " .. name .. ", with keepdim and unbiased", function()
      local x = input(c.x, c.view)
      for _, e in ipairs(c.dims) do
        local what = ("dim %d keepdim %s unbiased %s"):format(e.dim, e.keepdim, e.unbiased)
        local opts = { unbiased = e.unbiased }
        C.close(x:var(e.dim, e.keepdim, opts), e.var, RT, 0, "var " .. what)
        C.close(x:std(e.dim, e.keepdim, opts), e.std, RT, 0, "std " .. what)
        if not e.keepdim and e.unbiased then C.close(x:var(e.dim), e.var, RT, 0, "var " .. what) end
        if not e.keepdim then C.close(x:std(e.dim, opts), e.std, RT, 0, "std (dim, opts) " .. what) end
      end
    end)
  end
  it("gives NaN where n - correction <= 0 (one element unbiased, empty), as PyTorch", function()
    local E = F.moments_edge
    C.exact(attn.tensor { 2.5 }:var(), E.one_var, "one element")
    C.exact(attn.tensor { 2.5 }:var { unbiased = false }, E.one_var_biased, "one element, biased")
    C.exact(attn.zeros(2, 0):var(2), E.empty_dim2, "empty dim")
    C.exact(attn.zeros(2, 0):var(), E.empty_all, "empty")
    C.is(attn.tensor(3):var(1, true, { unbiased = false }), {}, { 0 }, "0-dim along its dim")
  end)
  it("is exact for a constant expanded line (two passes, no cancellation)", function()
    C.is(attn.full({ 1 }, 1e4 + 0.5):expand(5, 1000):std(2), { 5 }, { 0, 0, 0, 0, 0 })
  end)
  it("refuses bad dims, options and extra arguments", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:var(3) end, "attn.var", "bad argument #2 'dim'", "got 3")
    C.fails(function() return x:std(1.5) end, "attn.std", "'dim'", "1.5")
    C.fails(function() return x:var(true) end, "attn.var", "#2 'dim'", "expected a dim or an options table")
    C.fails(function() return x:var(1, 1) end, "attn.var", "'keepdim'", "expected a boolean")
    C.fails(function() return x:var { unbiassed = true } end, "attn.var", "unknown option 'unbiassed'")
    C.fails(function() return x:std { unbiased = 1 } end, "attn.std", "unbiased must be a boolean")
    C.fails(function() return x:var(nil, true) end, "attn.var", "keepdim needs a dim")
    C.fails(function() return x:var(1, true, {}, 4) end, "attn.var", "no more than 4")
  end)
end)

describe("attn.where", function()
  for i, c in ipairs(F.where) do
    it("case " .. i .. ": broadcast condition and operands, numbers, non-contiguous", function()
      local cond = input(c.cond, c.cond_view)
      local a = c.a and T(c.a) or c.a_num
      local b = c.b and T(c.b) or c.b_num
      C.exact(attn.where(cond, a, b), c.out, "where")
      if c.a then C.exact(T(c.a):where(cond, b), c.out, "t:where(cond, other)") end
    end)
  end
  it("treats every nonzero condition (NaN included) as true", function()
    C.is(attn.where(attn.tensor { 0, 2, -1, 0 / 0 }, 1, 0), { 4 }, { 0, 1, 1, 1 })
  end)
  it("refuses shapes that do not broadcast and bad operands", function()
    C.fails(function() return attn.where(attn.ones(2, 3), attn.ones(4), 0) end, "attn.where", "cannot be broadcast")
    C.fails(function() return attn.where(1, 2, 3) end, "attn.where", "#1 'condition'", "expected attn.Tensor")
    C.fails(function() return attn.where(attn.ones(2), "x", 3) end, "attn.where", "#2 'input'", "got string")
    C.fails(function() return attn.where(attn.ones(2), 1) end, "attn.where", "#3 'other'", "got no value")
  end)
end)

describe("cumsum", function()
  for i, c in ipairs(F.cumsum) do
    it("case " .. i .. ": dim " .. c.dim .. (c.view ~= "" and ", transposed" or "") .. ", bit for bit", function()
      local x = input(c.x, c.view)
      C.exact(x:cumsum(c.dim), c.out, "cumsum")
      C.exact(attn.cumsum(x, c.dim), c.out, "attn.cumsum")
    end)
  end
  it("handles empty and 0-dim tensors and needs a dim", function()
    C.is(attn.zeros(0, 3):cumsum(1), { 0, 3 }, {})
    C.is(attn.tensor(2.5):cumsum(1), {}, { 2.5 })
    C.fails(function() return attn.ones(2):cumsum() end, "attn.cumsum", "a dim is required")
    C.fails(function() return attn.ones(2):cumsum(2) end, "attn.cumsum", "'dim'", "[-1, 1]")
  end)
end)

describe("index_select", function()
  for i, c in ipairs(F.index_select) do
    it("case " .. i .. ": dim " .. c.dim .. ", " .. #c.index.data .. " indices" .. (c.view ~= "" and ", transposed" or ""), function()
      local x = input(c.x, c.view)
      C.exact(x:index_select(c.dim, T(c.index)), c.out, "tensor index")
      C.exact(attn.index_select(x, c.dim, c.index.data), c.out, "table index")
    end)
  end
  it("takes a strided index tensor", function()
    local idx = attn.tensor { { 3, 9 }, { 1, 9 } }:t()[1] -- {3, 1}, stride 2
    C.is(attn.tensor { 10, 20, 30 }:index_select(1, idx), { 2 }, { 30, 10 })
  end)
  it("names the bad index, its position and the valid range", function()
    local x = attn.ones(2, 4)
    C.fails(function() return x:index_select(2, { 1, 5 }) end,
      "attn.index_select: bad argument #3 'index'", "index 5 at [2] is out of range", "[1, 4]", "dim 2 has size 4")
    C.fails(function() return x:index_select(1, { 0 }) end, "'index'", "index 0 at [1]", "[1, 2]")
    C.fails(function() return x:index_select(1, { -1 }) end, "'index'", "index -1", "[1, 2]")
    C.fails(function() return x:index_select(2, attn.tensor { 1.5 }) end, "'index'", "1.5", "not an integer")
    C.fails(function() return x:index_select(2, { 0 / 0 }) end, "'index'", "nan", "not an integer")
    C.fails(function() return x:index_select(2, { "a" }) end, "attn.index_select: bad argument #3 'index'", "string")
    C.fails(function() return x:index_select(2, attn.ones(1, 1)) end, "'index'", "1-D", "[1, 1]")
    C.fails(function() return x:index_select(2, "1") end, "'index'", "expected attn.Tensor or a table")
    C.fails(function() return x:index_select(3, { 1 }) end, "attn.index_select", "'dim'")
    C.fails(function() return attn.tensor(1):index_select(1, { 1 }) end, "attn.index_select", "0-dim")
  end)
end)

describe("gather", function()
  for i, c in ipairs(F.gather) do
    it("case " .. i .. ": dim " .. c.dim .. ", index " .. shape_str(c.index.shape) .. (c.view ~= "" and ", transposed" or ""), function()
      local x = input(c.x, c.view)
      C.exact(x:gather(c.dim, T(c.index)), c.out, "gather")
      C.exact(attn.gather(x, c.dim, T(c.index):totable()), c.out, "table index")
    end)
  end
  it("refuses out-of-range and non-integer indices and index shapes that do not fit", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:gather(1, { { 1, 3, 1 } }) end,
      "attn.gather: bad argument #3 'index'", "index 3 at [1, 2] is out of range", "[1, 2]")
    C.fails(function() return x:gather(2, { { 2.5 } }) end, "'index'", "2.5", "not an integer")
    C.fails(function() return x:gather(2, { 1, 2 }) end, "attn.gather", "as many dims")
    C.fails(function() return x:gather(2, { { 1 }, { 1 }, { 1 } }) end, "attn.gather", "larger than self", "dim 1")
    C.fails(function() return x:gather(2, { { 1 }, { 1, 2 } }) end, "attn.gather: bad argument #3 'index'", "ragged")
  end)
end)

describe("scatter_add_", function()
  for i, c in ipairs(F.scatter_add) do
    it("case " .. i .. ": dim " .. c.dim .. ", repeated indices, larger src" .. (c.view ~= "" and ", transposed self" or ""), function()
      local self = input(c.self, c.view)
      local r = self:scatter_add_(c.dim, T(c.index), T(c.src))
      assert.are.equal(self, r)
      C.exact(self, c.out, "scatter_add_")
      local fresh = input(c.self, c.view)
      C.exact(attn.scatter_add(fresh, c.dim, T(c.index):totable(), T(c.src)), c.out, "attn.scatter_add")
      C.exact(fresh, { shape = input(c.self, c.view):size(), data = C.flat(input(c.self, c.view)) }, "unchanged")
    end)
  end
  it("refuses bad indices before writing anything, and overlapping or expanded tensors", function()
    local x = attn.zeros(2, 3)
    C.fails(function() return x:scatter_add_(2, { { 1, 4 } }, attn.ones(1, 2)) end,
      "Tensor:scatter_add_: bad argument #3 'index'", "index 4 at [1, 2]", "[1, 3]")
    C.is(x, { 2, 3 }, { 0, 0, 0, 0, 0, 0 })
    C.fails(function() return x:scatter_add_(2, { { 1, 2 } }, attn.ones(1, 1)) end, "larger than src")
    C.fails(function() return x:scatter_add_(2, { { 1, 2 } }, 1) end, "#4 'src'", "expected attn.Tensor")
    C.fails(function() return x:scatter_add_(2, { { 1 } }, x) end, "Tensor:scatter_add_", "overlaps")
    C.fails(function() return attn.zeros(3):expand(2, 3):scatter_add_(2, { { 1 } }, attn.ones(1, 1)) end,
      "Tensor:scatter_add_", "single memory location")
  end)
end)

describe("chunk and split", function()
  for i, c in ipairs(F.pieces) do
    local arg = c.arg or ("{" .. table.concat(c.arg_list, ", ") .. "}")
    it(("case %d: %s(%s, %d) of %s%s"):format(i, c.op, arg, c.dim, shape_str(c.x.shape), c.view ~= "" and " transposed" or ""), function()
      local x = input(c.x, c.view)
      local parts = { x[c.op](x, c.arg or c.arg_list, c.dim) }
      assert.are.equal(#c.parts, #parts)
      for k, p in ipairs(parts) do C.exact(p, c.parts[k], c.op .. " part " .. k) end
      local again = { attn[c.op](x, c.arg or c.arg_list, c.dim) }
      assert.are.equal(#c.parts, #again)
    end)
  end
  it("returns views that share the input's memory, dim 1 by default", function()
    local x = attn.zeros(4, 2)
    local a, b = x:chunk(2)
    a:fill_(1)
    b[1][2] = 7
    C.is(x, { 4, 2 }, { 1, 1, 1, 1, 0, 7, 0, 0 })
    local p, q = x:split({ 3, 1 })
    assert.are.same({ 3, 2 }, p:size())
    assert.are.same({ 1, 2 }, q:size())
  end)
  it("refuses bad chunk counts, sizes and dims", function()
    local x = attn.ones(2, 5)
    C.fails(function() return x:chunk(0) end, "attn.chunk", "'chunks'", ">= 1", "got 0")
    C.fails(function() return x:chunk(1.5) end, "attn.chunk", "'chunks'", "1.5")
    C.fails(function() return x:split(0, 2) end, "attn.split", "split_size can only be 0", "it has 5")
    C.fails(function() return x:split(-1) end, "attn.split", "'split_size'", "got -1")
    C.fails(function() return x:split({ 2, 2 }, 2) end, "attn.split", "'split_sizes'", "5", "sum to 4")
    C.fails(function() return x:split({ 2, 9 }, 2) end, "attn.split", "'split_sizes'", "more than 5")
    C.fails(function() return x:split({ 2, -1, 4 }, 2) end, "attn.split", "size 2 must be a non-negative integer", "-1")
    C.fails(function() return x:split({ 2, "a" }, 2) end, "attn.split", "size 2", "string")
    C.fails(function() return x:chunk(2, 3) end, "attn.chunk", "'dim'")
    C.fails(function() return attn.tensor(1):chunk(1) end, "attn.chunk", "0-dim")
  end)
end)

describe("repeat_interleave", function()
  for i, c in ipairs(F.repeat_interleave) do
    it("case " .. i .. ": repeats " .. (c.repeats or "tensor") .. ", dim " .. tostring(c.dim), function()
      local x = input(c.x, c.view)
      local r = c.repeats or T(c.repeats_t)
      C.exact(x:repeat_interleave(r, c.dim), c.out, "repeat_interleave")
      if c.repeats_t then C.exact(attn.repeat_interleave(x, c.repeats_t.data, c.dim), c.out, "table repeats") end
    end)
  end
  it("refuses negative, non-integer and mis-sized repeats", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:repeat_interleave(-1) end, "attn.repeat_interleave", "'repeats'", "non-negative", "-1")
    C.fails(function() return x:repeat_interleave(1.5) end, "attn.repeat_interleave", "'repeats'", "1.5")
    C.fails(function() return x:repeat_interleave({ 1, 2 }, 2) end, "'repeats'", "[3] or [1]", "[2]")
    C.fails(function() return x:repeat_interleave({ 1, -2, 1 }, 2) end, "'repeats'", "count -2 at [2]")
    C.fails(function() return x:repeat_interleave({ 1, 0.5, 1 }, 2) end, "'repeats'", "count 0.5 at [2]")
    C.fails(function() return x:repeat_interleave("2") end, "'repeats'", "expected attn.Tensor or a table")
    C.fails(function() return x:repeat_interleave(2, 3) end, "attn.repeat_interleave", "'dim'")
  end)
end)

describe("sort and argsort", function()
  for i, c in ipairs(F.sort) do
    it(("case %d: %s dim %d%s%s: values and PyTorch's indices for ties"):format(i, c.name, c.dim,
      c.descending and " descending" or "", c.view ~= "" and " transposed" or ""), function()
      local x = input(F.lines[c.name], c.view)
      local v, idx = x:sort(c.dim, c.descending)
      C.exact(v, c.values, "values")
      C.exact(idx, c.indices, "indices")
      C.exact(attn.argsort(x, c.dim, c.descending), c.indices, "argsort")
    end)
  end
  it("sorts along the last dim by default, ascending, and 0-dim and empty tensors", function()
    local v, i = attn.tensor { { 3, 1, 2 } }:sort()
    C.is(v, { 1, 3 }, { 1, 2, 3 })
    C.is(i, { 1, 3 }, { 2, 3, 1 })
    v, i = attn.tensor(5):sort()
    C.is(v, {}, { 5 })
    C.is(i, {}, { 1 })
    v, i = attn.zeros(2, 0):sort(2)
    assert.are.same({ 2, 0 }, v:size())
    assert.are.same({ 2, 0 }, i:size())
  end)
  it("refuses bad dims and flags", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:sort(3) end, "attn.sort", "'dim'")
    C.fails(function() return x:sort(1, "yes") end, "attn.sort", "'descending'", "expected a boolean")
    C.fails(function() return x:argsort(1, false, 3) end, "attn.argsort", "no more than 3")
  end)
end)

describe("topk", function()
  for i, c in ipairs(F.topk) do
    it(("case %d: %s k = %d dim %d largest %s sorted %s%s"):format(i, c.name, c.k, c.dim, c.largest, c.sorted,
      c.view ~= "" and " transposed" or ""), function()
      local x = input(F.lines[c.name], c.view)
      local v, idx = x:topk(c.k, c.dim, c.largest, c.sorted)
      C.exact(v, c.values, "values")
      C.exact(idx, c.indices, "indices")
    end)
  end
  it("takes the last dim, largest and sorted by default", function()
    local v, i = attn.topk(attn.tensor { { 1, 5, 3, 4 } }, 2)
    C.is(v, { 1, 2 }, { 5, 4 })
    C.is(i, { 1, 2 }, { 2, 4 })
  end)
  it("refuses k out of range (k > n names n), bad dims and flags", function()
    local x = attn.ones(2, 3)
    C.fails(function() return x:topk(4) end, "attn.topk: bad argument #2 'k'", "k = 4 is out of range", "[0, 3]")
    C.fails(function() return x:topk(3, 1) end, "'k'", "k = 3", "[0, 2]")
    C.fails(function() return x:topk(-1) end, "'k'", "k = -1")
    C.fails(function() return x:topk(1.5) end, "'k'", "1.5")
    C.fails(function() return x:topk(1, 3) end, "attn.topk", "'dim'")
    C.fails(function() return x:topk(1, 1, 1) end, "attn.topk", "'largest'", "expected a boolean")
    C.fails(function() return x:topk(1, 1, true, "no") end, "attn.topk", "'sorted'")
    C.fails(function() return x:topk() end, "attn.topk", "'k'")
  end)
end)

describe("indices are 1-based floats in and out, as argmax's", function()
  it("round-trips: x:gather(d, x:argsort(d)) is x:sort(d)", function()
    local x = attn.tensor { { 0.25, -1, 2, 0.25 }, { 5, 4, 4, 1 } }
    local v, i = x:sort(2)
    C.exact(x:gather(2, i), { shape = v:size(), data = C.flat(v) }, "gather of argsort")
    C.exact(x:index_select(2, { 4, 1 }), { shape = { 2, 2 }, data = { 0.25, 0.25, 1, 5 } }, "index_select")
  end)
end)
