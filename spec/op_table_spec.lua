-- The one op table (src/core/op_table.h, as attn.ops_table()): every entry is a
-- working, documented Lua function and method of the kind it claims, every
-- elementwise/reduction name of the API contract is in it, and each forward
-- agrees with an independent double-precision computation written here.
local attn = require "attn"
local help = require "attn.tools.help"

local OPS = attn.ops_table()
local KINDS = { unary = 1, binary = 2, comparison = 2, reduction = 1 } -- kind -> arity

-- The contract's rows (design/api.md "math", "reduce", "compare"), typed here
-- independently of the table: the elementwise and reduction names it promises.
local API_NAMES = {
  math = { "add", "sub", "mul", "div", "pow", "exp", "log", "sqrt", "tanh", "abs", "neg" },
  reduce = { "sum", "mean", "max", "min", "argmax" },
  compare = { "eq", "ne", "gt", "lt", "ge", "le", "bool" },
}
-- and its operators: `+ - * /`, `^` (pow) and unary `-`
local API_OPERATORS = { __add = "add", __sub = "sub", __mul = "mul", __div = "div", __pow = "pow", __unm = "neg" }

local function by_name()
  local t = {}
  for _, e in ipairs(OPS) do t[e.name] = e end
  return t
end

describe("attn.ops_table()", function()
  it("lists each op once, with a kind, its arity and a backward formula exactly when differentiable", function()
    assert.is_true(#OPS >= 29)
    local seen = {}
    for _, e in ipairs(OPS) do
      assert.are.equal("string", type(e.name))
      assert.is_nil(seen[e.name], "listed twice: " .. e.name)
      seen[e.name] = true
      assert.is_not_nil(KINDS[e.kind], e.name .. ": kind " .. tostring(e.kind))
      assert.are.equal(KINDS[e.kind], e.arity, e.name .. ": arity")
      assert.are.equal("boolean", type(e.differentiable), e.name)
      if e.differentiable then
        assert.are.equal("string", type(e.backward), e.name .. ": backward")
        assert.is_truthy(e.backward:match("grad"), e.name .. ": " .. e.backward)
        if e.arity == 2 then -- one formula per input
          assert.is_truthy(e.backward:match("^self: .+; other: .+"), e.name .. ": " .. e.backward)
        else
          assert.is_truthy(e.backward:match("^self: "), e.name .. ": " .. e.backward)
        end
      else
        assert.is_nil(e.backward, e.name)
      end
      if not e.indices_of then assert.are.equal("string", type(e.forward), e.name .. ": forward") end
    end
  end)

  it("marks comparisons, bool and the index reductions as not differentiable, the maths as differentiable", function()
    local t = by_name()
    for _, n in ipairs { "eq", "ne", "gt", "lt", "ge", "le", "bool", "logical_and", "logical_or", "logical_xor",
                         "logical_not", "argmax", "argmin" } do
      assert.is_false(t[n].differentiable, n)
    end
    for _, n in ipairs { "add", "sub", "mul", "div", "pow", "exp", "log", "tanh", "sigmoid", "sum", "mean", "max" } do
      assert.is_true(t[n].differentiable, n)
    end
    assert.are.equal("self: grad * result", t.exp.backward)
    assert.are.equal("self: grad / self", t.log.backward)
    assert.are.equal("self: grad * (1 - result * result)", t.tanh.backward)
    assert.are.equal("self: grad; other: -grad", t.sub.backward)
    assert.are.equal("comparison", t.gt.kind)
    assert.are.equal("max", t.argmax.indices_of)
    assert.are.equal("argmax", t.max.index_name)
  end)

  it("is a fresh copy on every call: changing one does not change the next", function()
    local a = attn.ops_table()
    a[1].name = "changed"
    a[2] = nil
    local b = attn.ops_table()
    assert.are.equal(OPS[1].name, b[1].name)
    assert.are.equal(#OPS, #b)
  end)

  it("takes no arguments", function()
    local ok, err = pcall(attn.ops_table, 1)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("attn.ops_table"))
  end)
end)

describe("every table entry", function()
  local mt = getmetatable(attn.ones(1))
  for _, e in ipairs(OPS) do
    it(e.name .. " is attn." .. e.name .. " and t:" .. e.name .. ", documented", function()
      assert.are.equal("function", type(attn[e.name]), "attn." .. e.name)
      assert.are.equal("function", type(attn.Tensor[e.name]), "Tensor." .. e.name)
      assert.is_truthy(help.text(e.name):match("attn%." .. e.name), "doc of " .. e.name)
      local t = attn.tensor { { 1, 2 }, { 3, 4 } }
      local args = e.arity == 2 and { t, t } or { t }
      local ok, err = pcall(attn[e.name], table.unpack(args))
      assert.is_true(ok, tostring(err))
      -- wrong input: an error that names the function
      local bad_ok, bad = pcall(attn[e.name], "x", t)
      assert.is_false(bad_ok)
      assert.is_truthy(tostring(bad):match(e.name), tostring(bad))
      if e.inplace then
        assert.are.equal(e.name .. "_", e.inplace)
        assert.are.equal("function", type(attn.Tensor[e.inplace]), "Tensor." .. e.inplace)
        assert.is_truthy(help.text("Tensor." .. e.inplace):match(e.inplace), "doc of " .. e.inplace)
      end
      if e.operator then
        assert.are.equal("function", type(mt[e.operator]), e.operator)
      end
    end)
  end

  it("covers every elementwise and reduction name of the API contract", function()
    local t = by_name()
    local missing = {}
    for row, names in pairs(API_NAMES) do
      for _, n in ipairs(names) do
        if not t[n] then missing[#missing + 1] = row .. ": " .. n end
      end
    end
    for operator, n in pairs(API_OPERATORS) do
      if not (t[n] and t[n].operator == operator) then missing[#missing + 1] = operator .. " (" .. n .. ")" end
    end
    table.sort(missing)
    assert.are.equal("", table.concat(missing, ", "))
  end)
end)

-- ---- forward against double precision ------------------------------------

local nan = 0 / 0
local function exp(x) return math.exp(x) end
-- (reference formulas, in double, from the inputs' float values)
local REF = {
  add = function(x, y) return x + y end,
  sub = function(x, y) return x - y end,
  mul = function(x, y) return x * y end,
  div = function(x, y) return x / y end,
  pow = function(x, y) return x ^ y end,
  eq = function(x, y) return x == y and 1 or 0 end,
  ne = function(x, y) return x ~= y and 1 or 0 end,
  gt = function(x, y) return x > y and 1 or 0 end,
  lt = function(x, y) return x < y and 1 or 0 end,
  ge = function(x, y) return x >= y and 1 or 0 end,
  le = function(x, y) return x <= y and 1 or 0 end,
  -- Lua's float % is floored, as Python's: fmod, then + y where the signs differ
  remainder = function(x, y) return math.fmod(x, y) == 0 and math.fmod(x, y) or x % y end,
  floor_divide = function(x, y) if y == 0 then return x / y end return x // y end,
  floor = function(x) if x ~= x then return x end return math.floor(x) + 0.0 end,
  maximum = function(x, y) if x ~= x or y ~= y then return nan end return x > y and x or y end,
  minimum = function(x, y) if x ~= x or y ~= y then return nan end return x < y and x or y end,
  neg = function(x) return -x end,
  exp = exp,
  log = function(x) return math.log(x) end,
  sqrt = function(x) return math.sqrt(x) end,
  tanh = function(x) return 1 - 2 / (exp(2 * x) + 1) end,
  abs = function(x) return math.abs(x) end,
  bool = function(x) return x ~= 0 and 1 or 0 end,
  logical_not = function(x) return x == 0 and 1 or 0 end,
  logical_and = function(x, y) return (x ~= 0 and y ~= 0) and 1 or 0 end,
  logical_or = function(x, y) return (x ~= 0 or y ~= 0) and 1 or 0 end,
  logical_xor = function(x, y) return ((x ~= 0) ~= (y ~= 0)) and 1 or 0 end,
  sigmoid = function(x) return 1 / (1 + exp(-x)) end,
  relu = function(x) if x ~= x then return x end return x > 0 and x or 0 end,
  reciprocal = function(x) return 1 / x end,
  -- erf by its Maclaurin series (double; |x| < 4 loses at most e^16 * 1e-16 ~ 1e-9),
  -- and +-1 beyond, where 1 - erf(4) = 1.5e-8 is below half a float ulp of 1
  erf = function(x)
    if x ~= x then return x end
    if math.abs(x) >= 4 then return x > 0 and 1 or -1 end
    local term, sum, n = x, x, 0
    repeat
      n = n + 1
      term = -term * x * x / n
      local add = term / (2 * n + 1)
      sum = sum + add
    until math.abs(add) <= 1e-17 * math.abs(sum)
    return sum * 2 / math.sqrt(math.pi)
  end,
  sin = function(x) return math.sin(x) end,
  cos = function(x) return math.cos(x) end,
}
-- reductions of a list of values: the value, and the 1-based index for max/min
-- (the first extreme; a NaN wins)
local function extreme(better)
  return function(v)
    local best, at = v[1], 1
    for i = 2, #v do
      if best ~= best then break end
      if v[i] ~= v[i] or better(v[i], best) then best, at = v[i], i end
    end
    return best, at
  end
end
local REDUCE_REF = {
  sum = function(v) local s = 0 for i = 1, #v do s = s + v[i] end return s end,
  mean = function(v) local s = 0 for i = 1, #v do s = s + v[i] end return s / #v end,
  max = extreme(function(a, b) return a > b end),
  min = extreme(function(a, b) return a < b end),
}

-- float32 result against a double reference: within 2 float ulps (relative),
-- NaN for NaN, infinities equal
local function near(got, want, what)
  if want ~= want then
    assert(got ~= got, ("%s: %.9g, want NaN"):format(what, got))
  elseif want == math.huge or want == -math.huge then
    assert(got == want, ("%s: %.9g, want %s"):format(what, got, want))
  else
    local tol = 2.4e-7 * math.max(math.abs(want), 1e-30)
    assert(math.abs(got - want) <= tol, ("%s: %.9g, want %.9g"):format(what, got, want))
  end
end

-- [3, 4] non-contiguous (a transposed [4, 3]) values, with signs, zero, equal pairs and NaN
local A_T = { { 0.5, -1.25, 3 }, { 2, 0, -0.75 }, { 1.5, 2, nan }, { -3.5, 0.1, 7 } }
local function inputs()
  local a = attn.tensor(A_T):t() -- [3, 4], strides (1, 3)
  assert.is_false(a:is_contiguous())
  local row = attn.tensor { 2, -0.5, 1.5, 0 } -- [4]: broadcast along dim 1
  local col = attn.tensor({ { 1.5 }, { -2 }, { 0.25 } }):expand(3, 4) -- stride 0 along dim 2
  return a, row, col
end

describe("each table entry's forward against double precision", function()
  local a, row, col = inputs()
  local av = a:totable()

  for _, e in ipairs(OPS) do
    if e.arity == 2 then
      it(e.name .. " with a broadcast row, an expanded column and a number", function()
        local f = assert(REF[e.name], "no reference for the new op " .. e.name .. ": add one to this spec")
        local rv, cv = row:totable(), col:totable()
        for _, case in ipairs {
          { attn[e.name](a, row), function(i, j) return f(av[i][j], rv[j]) end, "a, row" },
          { attn[e.name](row, a), function(i, j) return f(rv[j], av[i][j]) end, "row, a" },
          { attn.Tensor[e.name](a, col), function(i, j) return f(av[i][j], cv[i][j]) end, "a, col" },
          { attn[e.name](a, 2), function(i, j) return f(av[i][j], 2) end, "a, 2" },
          { attn[e.name](-1.5, a), function(i, j) return f(-1.5, av[i][j]) end, "-1.5, a" },
        } do
          local got, want, what = case[1], case[2], case[3]
          assert.are.same({ 3, 4 }, got:size())
          local g = got:totable()
          for i = 1, 3 do
            for j = 1, 4 do near(g[i][j], want(i, j), ("%s(%s)[%d][%d]"):format(e.name, what, i, j)) end
          end
        end
      end)
      if e.inplace then
        it(e.inplace .. " writes what " .. e.name .. " returns", function()
          local x = a:clone()
          assert.are.equal(x, x[e.inplace](x, row))
          local want, got = attn[e.name](a, row):totable(), x:totable()
          for i = 1, 3 do for j = 1, 4 do near(got[i][j], want[i][j], e.inplace) end end
        end)
      end
      if e.operator then
        it(e.operator .. " is " .. e.name, function()
          local got = getmetatable(a)[e.operator](a, row):totable()
          local want = attn[e.name](a, row):totable()
          for i = 1, 3 do for j = 1, 4 do near(got[i][j], want[i][j], e.operator) end end
        end)
      end
    elseif e.kind == "unary" then
      it(e.name .. " of a non-contiguous and an expanded tensor", function()
        local f = assert(REF[e.name], "no reference for the new op " .. e.name .. ": add one to this spec")
        local cv = col:totable()
        local g, gc = attn[e.name](a):totable(), attn.Tensor[e.name](col):totable()
        for i = 1, 3 do
          for j = 1, 4 do
            near(g[i][j], f(av[i][j]), ("%s(a)[%d][%d]"):format(e.name, i, j))
            near(gc[i][j], f(cv[i][j]), ("%s(col)[%d][%d]"):format(e.name, i, j))
          end
        end
        if e.operator == "__unm" then
          local m = (-a):totable()
          for i = 1, 3 do for j = 1, 4 do near(m[i][j], f(av[i][j]), "-a") end end
        end
      end)
    else -- reductions
      it(e.name .. " over all elements and along each dim of a non-contiguous tensor", function()
        local base = e.indices_of or e.name
        local f = assert(REDUCE_REF[base], "no reference for the new reduction " .. base .. ": add one to this spec")
        -- argmax/argmin give the reference's index, the others its value
        local function expect(got, v, at, what)
          if e.indices_of then assert.are.equal(at, got, what) else near(got, v, what) end
        end
        local finite = a:masked_fill(a:ne(a), 4.5) -- a NaN-free copy; the NaN case is below
        local fv = finite:totable()
        local flat = {}
        for i = 1, 3 do for j = 1, 4 do flat[#flat + 1] = fv[i][j] end end
        local v, at = f(flat)
        local all = attn[e.name](finite)
        assert.are.equal(0, all:dim())
        expect(all:item(), v, at, e.name .. "()")
        for d = 1, 2 do
          local got, idx = attn[e.name](finite, d)
          local keep = attn[e.name](finite, d, true)
          assert.are.same(d == 1 and { 4 } or { 3 }, got:size())
          assert.are.same(d == 1 and { 1, 4 } or { 3, 1 }, keep:size())
          local g = got:totable()
          for k = 1, (d == 1 and 4 or 3) do
            local line = {}
            for m = 1, (d == 1 and 3 or 4) do line[m] = d == 1 and fv[m][k] or fv[k][m] end
            local lv, lat = f(line)
            expect(g[k], lv, lat, ("%s(t, %d)[%d]"):format(e.name, d, k))
            if e.index_name then assert.are.equal(lat, idx:totable()[k], e.name .. " indices") end
          end
        end
        -- with the NaN: sums and means are NaN, a NaN is the extreme (its index for argmax/argmin)
        local with_nan = attn[e.name](a, 1):totable()
        local nan_v, nan_at = f({ av[1][3], av[2][3], av[3][3] })
        expect(with_nan[3], nan_v, nan_at, e.name .. " NaN")
        -- ties: the first extreme's index (not the last)
        local ties = attn.tensor { { 3, -1, 3, -1, 2 }, { 0, 0, 0, 0, 0 } }
        local tv = ties:totable()
        local tie_values, tie_indices = attn[e.name](ties, 2)
        for k = 1, 2 do
          local lv, lat = f(tv[k])
          expect(tie_values:totable()[k], lv, lat, e.name .. " ties")
          if e.index_name then assert.are.equal(lat, tie_indices:totable()[k], e.name .. " ties") end
        end
        local tval, tat = f({ 3, -1, 3, -1, 2, 0, 0, 0, 0, 0 })
        expect(attn[e.name](ties):item(), tval, tat, e.name .. " ties, all")
        -- an expanded input (stride 0 along dim 2)
        local cv = col:totable()
        local ge = attn[e.name](col, 2):totable()
        for k = 1, 3 do
          local lv, lat = f(cv[k])
          expect(ge[k], lv, lat, e.name .. " expanded")
        end
      end)
    end
  end
end)

describe("scripts/fuzz.lua", function()
  it("fuzzes an op added to the table with no change of its own", function()
    -- a probe op appended to what attn.ops_table() returns, as a new line of
    -- src/core/op_table.h would be, then the fuzzer loaded afresh
    local real_table, saved_fuzz = attn.ops_table, package.loaded.fuzz
    local calls = 0
    local function probe(t, ...)
      calls = calls + 1
      -- an op from the table names itself in its errors: the probe renames neg's
      local ok, r = pcall(attn.Tensor.neg, t, ...)
      if not ok then error((tostring(r):gsub("attn%.neg", "attn.zz_probe")), 0) end
      return r
    end
    attn.ops_table = function()
      local t = real_table()
      t[#t + 1] = { name = "zz_probe", kind = "unary", arity = 1, differentiable = false, forward = "-x" }
      return t
    end
    attn.zz_probe, attn.Tensor.zz_probe = probe, probe
    finally(function()
      attn.ops_table, attn.zz_probe, attn.Tensor.zz_probe = real_table, nil, nil
      package.loaded.fuzz = saved_fuzz
    end)
    package.loaded.fuzz = nil
    local fuzz = require "fuzz"
    -- (about 10 calls of the probe in 3000: never none by chance)
    local s = fuzz.run { iterations = 3000, seed = 7, kinds = "calls" }
    assert.is_nil(s.failure, s.failure)
    assert.is_true(calls > 0, "the fuzzer never called the new op")
  end)
end)
