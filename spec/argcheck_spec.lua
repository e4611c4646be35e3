-- attn.argcheck, the Lua layer's argument checks: what each check says, and
-- that it raises at the caller's line (this file), not inside the library.
-- Expected messages are written out here by hand.
local attn = require "attn"
local argcheck = require "attn.argcheck"

-- the error of fn(), which must fail
local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok)
  return err
end

describe("attn.argcheck", function()
  it("is_tensor and shape", function()
    assert.is_true(argcheck.is_tensor(attn.zeros({2, 3})))
    assert.is_false(argcheck.is_tensor({}))
    assert.is_false(argcheck.is_tensor(nil))
    assert.are.equal("[2, 3]", argcheck.shape(attn.zeros({2, 3})))
    assert.are.equal(argcheck.is_tensor, attn.is_tensor)
  end)

  it("describe: numbers by value, tensors by name, the rest by type; how adds detail", function()
    local t = attn.zeros({2, 3})
    assert.are.equal("5", argcheck.describe(5))
    assert.are.equal("0.5", argcheck.describe(0.5))
    assert.are.equal("attn.Tensor", argcheck.describe(t))
    assert.are.equal("string", argcheck.describe("a"))
    assert.are.equal("boolean", argcheck.describe(true))
    assert.are.equal("nil", argcheck.describe(nil))
    assert.are.equal('"a\\"b"', argcheck.describe('a"b', {strings = true}))
    assert.are.equal("boolean", argcheck.describe(false, {strings = true}))
    assert.are.equal("false", argcheck.describe(false, {booleans = true}))
    assert.are.equal("attn.Tensor of shape [2, 3]", argcheck.describe(t, {shape = " of shape "}))
    assert.are.equal("attn.Tensor [2, 3]", argcheck.describer{shape = " "}(t))
  end)

  it("typename: a metatable's __name, and a look-alike named attn.Tensor is said not to be one", function()
    assert.are.equal("attn.Tensor", argcheck.typename(attn.zeros({1})))
    assert.are.equal("table", argcheck.typename({}))
    assert.are.equal("number", argcheck.typename(1))
    assert.are.equal("Thing", argcheck.typename(setmetatable({}, {__name = "Thing"})))
    assert.are.equal("table (not an attn.Tensor)", argcheck.typename(setmetatable({}, {__name = "attn.Tensor"})))
  end)

  it("fail and arg_error raise at the caller's line", function()
    local err = err_of(function() argcheck.fail("attn.f", "n must be even, got %d", 3) end)
    assert.is_truthy(err:find("argcheck_spec.lua:%d+: attn.f: n must be even, got 3$"), err)
    err = err_of(function() argcheck.arg_error("attn.f", 2, "x", "a number", "nil") end)
    assert.is_truthy(err:find("argcheck_spec.lua:%d+: attn.f: bad argument #2 'x' %(expected a number, got nil%)$"), err)
  end)

  it("check_nargs refuses extra arguments", function()
    argcheck.check_nargs("attn.f", 2, 2)
    local err = err_of(function() argcheck.check_nargs("attn.f", 1, 3) end)
    assert.is_truthy(err:find("attn.f: bad argument #2 (no more than 1 argument expected, got 3)", 1, true), err)
    err = err_of(function() argcheck.check_nargs("attn.f", 2, 3) end)
    assert.is_truthy(err:find("attn.f: bad argument #3 (no more than 2 arguments expected, got 3)", 1, true), err)
  end)

  it("check_tensor returns the tensor, else names what came (typename, or the given wording)", function()
    local t = attn.zeros({1})
    assert.are.equal(t, argcheck.check_tensor("attn.f", t, 1, "x"))
    local err = err_of(function() argcheck.check_tensor("attn.f", {}, 1, "x") end)
    assert.is_truthy(err:find("argcheck_spec.lua:%d+: attn.f: bad argument #1 'x' %(expected attn.Tensor, got table%)$"), err)
    err = err_of(function() argcheck.check_tensor("attn.f", "s", 3, "y", argcheck.describer{strings = true}) end)
    assert.is_truthy(err:find([[attn.f: bad argument #3 'y' (expected attn.Tensor, got "s")]], 1, true), err)
  end)

  it("check_options: nil is {}, unknown keys list the known ones sorted, values of the wrong type", function()
    local known = {zeta = "number", alpha = "string"}
    assert.are.same({}, argcheck.check_options("attn.f", nil, 2, known))
    local opts = {alpha = "x"}
    assert.are.equal(opts, argcheck.check_options("attn.f", opts, 2, known))
    local err = err_of(function() argcheck.check_options("attn.f", 5, 2, known) end)
    assert.is_truthy(err:find("argcheck_spec.lua:%d+: attn.f: bad argument #2 'opts' %(expected a table of options, got 5%)$"), err)
    err = err_of(function() argcheck.check_options("attn.f", {beta = 1}, 2, known) end)
    assert.is_truthy(err:find("attn.f: unknown option 'beta' (known: alpha, zeta)", 1, true), err)
    err = err_of(function() argcheck.check_options("attn.f", {zeta = "1"}, 2, known) end)
    assert.is_truthy(err:find("attn.f: bad option 'zeta' (expected number, got string)", 1, true), err)
  end)
end)
