-- tostring(t) / attn.format(t) against PyTorch 1.13's str(t): the cases and
-- their expected text come from scripts/fixtures/make_print_fixtures.py.
local attn = require "attn"

local cases = dofile("spec/fixtures/print_cases.lua")

-- The fixture's tensor, rebuilt exactly (see the generator's doc for `gen`).
local function build(c)
  local shape = c.shape
  local numel = 1
  for _, s in ipairs(shape) do numel = numel * s end
  local t
  if #shape == 0 then
    t = attn.tensor(c.values[1])
  elseif numel == 0 then
    t = attn.zeros(shape)
  elseif c.gen and c.gen[1] == "arange" then
    t = ((attn.arange(numel) + c.gen[2]) * c.gen[3]):view(shape)
  elseif c.gen then
    local _, m, p, k, s = table.unpack(c.gen)
    local v = {}
    for i = 0, numel - 1 do v[i + 1] = ((i * m) % p + k) * s end
    for _, set in ipairs(c.gen.set or {}) do v[set[1]] = set[2] end
    t = attn.tensor(v):view(shape)
  else
    t = attn.tensor(c.values):view(shape)
  end
  local op = c.op
  if op then
    if op[1] == "t" then t = t:t()
    elseif op[1] == "narrow" then t = t:narrow(op[2], op[3], op[4])
    elseif op[1] == "expand" then t = t:expand(table.unpack(op, 2))
    elseif op[1] == "select" then t = t:select(op[2], op[3])
    else error("unknown op " .. op[1]) end
  end
  return t
end

local function check(name, expected, got)
  if got ~= expected then
    error(("%s: printed text differs from PyTorch's\n--- expected (PyTorch)\n%s\n--- got\n%s\n"):format(
      name, expected, got), 2)
  end
end

describe("tostring(t) matches PyTorch's str(t)", function()
  assert.is_true(#cases >= 60)
  for _, c in ipairs(cases) do
    if not c.opts then
      it(c.name, function()
        local t = build(c)
        check(c.name, c.expected, tostring(t))
        check(c.name .. " (attn.format)", c.expected, attn.format(t))
      end)
    end
  end
end)

describe("attn.format(t, opts) matches PyTorch under set_printoptions", function()
  for _, c in ipairs(cases) do
    if c.opts then
      it(c.name, function()
        check(c.name, c.expected, attn.format(build(c), c.opts))
      end)
    end
  end
end)

describe("attn.set_printoptions changes what tostring prints, as torch.set_printoptions", function()
  local saved
  before_each(function() saved = attn.get_printoptions() end)
  after_each(function() attn.set_printoptions(saved) end)
  for _, c in ipairs(cases) do
    if c.opts then
      it(c.name, function()
        attn.set_printoptions(c.opts)
        check(c.name, c.expected, tostring(build(c)))
      end)
    end
  end

  it("get_printoptions returns a copy; leaving sci_mode out resets it", function()
    attn.set_printoptions { sci_mode = true, precision = 2 }
    local o = attn.get_printoptions()
    assert.are.same({ precision = 2, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = true }, o)
    o.precision = 9
    assert.are.equal(2, attn.get_printoptions().precision)
    attn.set_printoptions { precision = 3 }
    assert.is_nil(attn.get_printoptions().sci_mode)
  end)

  it("bad options are errors naming the function and leave the options alone", function()
    local before = attn.get_printoptions()
    local ok, e = pcall(attn.set_printoptions, { profile = "long" })
    assert.is_false(ok)
    assert.truthy(e:find("attn.set_printoptions: bad option 'profile' (expected 'default', 'short' or 'full', got long)", 1, true), e)
    ok, e = pcall(attn.set_printoptions, { precisoin = 2 })
    assert.truthy(e:find("attn.set_printoptions: bad argument #1 'opts' (unknown option 'precisoin'", 1, true), e)
    ok, e = pcall(attn.set_printoptions, "short")
    assert.truthy(e:find("attn.set_printoptions: bad argument #1 'opts' (expected a table, got string)", 1, true), e)
    ok, e = pcall(attn.set_printoptions)
    assert.truthy(e:find("attn.set_printoptions: bad argument #1 'opts' (expected a table, got no value)", 1, true), e)
    assert.are.same(before, attn.get_printoptions())
  end)
end)

describe("printing, hand-checked", function()
  it("integer-valued tensors get a trailing point", function()
    assert.are.equal("tensor([1., 2., 3.])", tostring(attn.tensor{1, 2, 3}))
    assert.are.equal("tensor(-0.)", tostring(attn.tensor(-0.0)))
  end)

  it("four decimals, padded to a common width", function()
    assert.are.equal("tensor([[ 0.5000, -1.2500],\n        [10.0000,  0.0000]])",
      tostring(attn.tensor{{0.5, -1.25}, {10, 0}}))
  end)

  it("print() uses the same text", function()
    local t = attn.tensor{{0.25, 1}}
    local out = {}
    local saved = _G.print
    _G.print = function(...) out[#out + 1] = tostring((...)) end
    local ok, err = pcall(print, t)
    _G.print = saved
    assert.is_true(ok, err)
    assert.are.equal("tensor([[0.2500, 1.0000]])", out[1])
  end)

  it("NaN prints as nan whatever its sign bit", function()
    local t = attn.tensor{0 / 0, -(0 / 0), 1}
    assert.are.equal("tensor([nan, nan, 1.])", tostring(t))
  end)

  it("does not change the tensor or the default options", function()
    local t = attn.arange(6):view(2, 3)
    attn.format(t, {precision = 1, linewidth = 10, sci_mode = true})
    assert.are.equal("tensor([[0., 1., 2.],\n        [3., 4., 5.]])", tostring(t))
    assert.are.same({0, 1, 2}, t[1]:totable())
  end)

  it("a 1000x1000 tensor prints in well under a second", function()
    local t = attn.arange(1000000):view(1000, 1000)
    local t0 = os.clock()
    local s = tostring(t)
    local dt = os.clock() - t0
    assert.is_true(dt < 0.25, ("took %.3f s"):format(dt))
    -- " ...," in each of the 6 rows shown, and the "...," line between them
    assert.are.equal(7, select(2, s:gsub("%.%.%.,", "")))
    -- a non-contiguous (transposed) view too
    t0 = os.clock()
    s = tostring(t:t())
    dt = os.clock() - t0
    assert.is_true(dt < 0.25, ("took %.3f s"):format(dt))
    -- integers, but max/min = 999999 > 1000: scientific notation
    local want = "tensor([[0.0000e+00, 1.0000e+03, 2.0000e+03,  ..., 9.9700e+05, 9.9800e+05,\n"
      .. "         9.9900e+05],\n        [1.0000e+00, 1.0010e+03,"
    assert.are.equal(want, s:sub(1, #want))
  end)

  it("1000 elements (the threshold) print in full, quickly", function()
    local t = attn.arange(1000) / 7
    local t0 = os.clock()
    local s = tostring(t)
    assert.is_true(os.clock() - t0 < 0.1)
    assert.is_nil(s:find("...", 1, true))
    assert.truthy(s:find("142.7143])", 1, true))
  end)
end)

describe("attn.format, bad input", function()
  local function err_of(fn, ...)
    local ok, e = pcall(fn, ...)
    assert.is_false(ok)
    return tostring(e)
  end

  it("refuses a non-tensor", function()
    assert.has_error(function() attn.format(3) end)
    local e = err_of(attn.format, 3)
    assert.truthy(e:find("attn.format: bad argument #1 't' (expected attn.Tensor, got number)", 1, true), e)
    e = err_of(attn.format, nil)
    assert.truthy(e:find("attn.format: bad argument #1 't' (expected attn.Tensor, got nil)", 1, true), e)
    e = err_of(attn.format, {1, 2})
    assert.truthy(e:find("got table", 1, true), e)
  end)

  it("refuses bad options", function()
    local t = attn.tensor{1.5}
    assert.has_error(function() attn.format(t, "x") end)
    local e = err_of(attn.format, t, "x")
    assert.truthy(e:find("attn.format: bad argument #2 'opts' (expected a table, got string)", 1, true), e)
    e = err_of(attn.format, t, {precison = 2})
    assert.truthy(e:find("unknown option 'precison'", 1, true), e)
    e = err_of(attn.format, t, {precision = 2.5})
    assert.truthy(e:find("attn.format: bad option 'precision' (expected an integer, got 2.5)", 1, true), e)
    e = err_of(attn.format, t, {precision = -1})
    assert.truthy(e:find("bad option 'precision' (expected >= 0, got -1)", 1, true), e)
    e = err_of(attn.format, t, {precision = 1000})
    assert.truthy(e:find("bad option 'precision' (expected <= 50, got 1000)", 1, true), e)
    e = err_of(attn.format, t, {linewidth = 0})
    assert.truthy(e:find("bad option 'linewidth' (expected >= 1, got 0)", 1, true), e)
    e = err_of(attn.format, t, {edgeitems = 0})
    assert.truthy(e:find("bad option 'edgeitems' (expected >= 1, got 0)", 1, true), e)
    e = err_of(attn.format, t, {threshold = 0 / 0})
    assert.truthy(e:find("bad option 'threshold' (expected a number", 1, true), e)
    e = err_of(attn.format, t, {sci_mode = "yes"})
    assert.truthy(e:find("bad option 'sci_mode' (expected a boolean, got yes)", 1, true), e)
  end)
end)
