-- require "attn.assert": assert.tensor_near / assert.tensor_equal for busted.
-- Expected messages are written by hand from the inputs.
local attn = require "attn"
local checks = require "attn.assert"

local function failure(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "the assertion passed")
  return tostring(err)
end

local function has(msg, piece)
  assert.is_truthy(string.find(msg, piece, 1, true), "expected '" .. piece .. "' in: " .. msg)
end

describe("assert.tensor_near", function()
  local a = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })

  it("passes within the tolerance (default 1e-5, absolute)", function()
    assert.tensor_near(a, attn.tensor({ { 1, 2, 3 }, { 4, 5, 6.000004 } }))
    assert.tensor_near(a, { { 1.05, 2, 3 }, { 4, 4.95, 6 } }, 0.1)
    assert.tensor_near(attn.tensor({ 0 / 0, math.huge, -math.huge }), { 0 / 0, math.huge, -math.huge })
    assert.tensor_near(attn.tensor(2.5), 2.5)
    assert.tensor_near(attn.zeros(0, 3), attn.zeros(0, 3))
    assert.is_not.tensor_near(a, a + 1, 0.5)
  end)

  it("fails past the tolerance naming the shapes, the worst element (1-based), its values and the difference", function()
    local msg = failure(function()
      assert.tensor_near(a, { { 1, 2, 3.01 }, { 4.5, 5, 6 } }, 0.1)
    end)
    has(msg, "tensors are not near (tolerance 0.1): shapes [2, 3] and [2, 3]")
    has(msg, "worst element at [2, 1]: 4 vs 4.5 (difference -0.5)")
  end)

  it("fails on the default tolerance just above 1e-5", function()
    local msg = failure(function() assert.tensor_near(attn.tensor({ 0, 0, 1 }), { 0, 0, 1.0001 }) end)
    has(msg, "tolerance 1e-05")
    has(msg, "worst element at [3]")
  end)

  it("fails on different shapes, NaN against a number, and infinities of opposite signs", function()
    has(failure(function() assert.tensor_near(a, attn.zeros(3, 2)) end),
      "tensors are not near (tolerance 1e-05): shapes [2, 3] and [3, 2] differ")
    has(failure(function() assert.tensor_near(attn.tensor({ 1, 0 / 0 }), { 1, 2 }) end),
      "worst element at [2]: nan vs 2 (difference nan)")
    has(failure(function() assert.tensor_near(attn.tensor({ math.huge }), { -math.huge }) end),
      "worst element at [1]: inf vs -inf (difference inf)")
  end)

  it("fails when negated and near, and puts a user message first", function()
    has(failure(function() assert.is_not.tensor_near(a, a) end), "tensors are near (tolerance 1e-05), expected them not to be")
    has(failure(function() assert.tensor_near(a, a * 2, 0.1, "layer 3") end), "layer 3: tensors are not near")
  end)

  it("refuses bad arguments with a clear error", function()
    assert.has_error(function() assert.tensor_near(nil, a) end)
    has(failure(function() assert.tensor_near(nil, a) end),
      "assert.tensor_near: bad argument #1 (expected an attn.Tensor, got nil)")
    has(failure(function() assert.tensor_near(a, "x") end),
      "assert.tensor_near: bad argument #2 (expected an attn.Tensor, got string)")
    has(failure(function() assert.tensor_near(a, a, -1) end),
      "assert.tensor_near: bad argument #3 'tol' (expected a non-negative number, got -1)")
  end)
end)

describe("assert.tensor_equal", function()
  local a = attn.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } })

  it("passes on equal values (views, tables, -0 == 0, NaN == NaN)", function()
    assert.tensor_equal(a, a:clone())
    assert.tensor_equal(a:t(), { { 1, 3, 5 }, { 2, 4, 6 } })
    assert.tensor_equal(attn.tensor({ -0.0, 0 / 0 }), { 0, 0 / 0 })
    assert.is_not.tensor_equal(a, a + 1e-6)
  end)

  it("fails on any difference, naming the worst element", function()
    local b = a:clone()
    b[3][2] = 6.5
    b[1][1] = 1.25
    local msg = failure(function() assert.tensor_equal(a, b) end)
    has(msg, "tensors are not equal: shapes [3, 2] and [3, 2]")
    has(msg, "worst element at [3, 2]: 6 vs 6.5 (difference -0.5)")
    has(failure(function() assert.tensor_equal(a, a:view(2, 3)) end),
      "tensors are not equal: shapes [3, 2] and [2, 3] differ")
    has(failure(function() assert.is_not.tensor_equal(a, a) end), "tensors are equal, expected them not to be")
  end)

  it("refuses bad arguments with a clear error", function()
    assert.has_error(function() assert.tensor_equal({ 1 }, a) end)
    has(failure(function() assert.tensor_equal({ 1 }, a) end),
      "assert.tensor_equal: bad argument #1 (expected an attn.Tensor, got table)")
    has(failure(function() assert.tensor_equal(a, { { 1, 2 }, { 3 } }) end),
      "assert.tensor_equal: bad argument #2 (expected an attn.Tensor or a table attn.tensor accepts")
  end)

  it("exposes the checks as functions returning ok, message", function()
    local ok, msg = checks.equal(a, a + 1)
    assert.is_false(ok)
    has(msg, "worst element at [1, 1]: 1 vs 2 (difference -1)")
    assert.is_true((checks.near(a, a + 1e-7)))
  end)
end)
