-- attn.remainder (a % b, torch.remainder) and attn.floor: forward on the
-- signs and edge cases PyTorch 1.13 documents, and their gradients against
-- the formulas computed here in double (d/da = 1, d/db = -floor(a / b);
-- floor's gradient is zero), with torch 1.13's node names.
local attn = require "attn"

-- torch.remainder(a, b) of these pairs, as torch 1.13 printed them
local A = { 5.5, -5.5, 5.5, -5.5, 0, 3, -0.0, 7 }
local B = { 2, 2, -2, -2, 3, 0, 3, 2.5 }
local WANT = { 1.5, 0.5, -0.5, -1.5, 0, 0 / 0, -0.0, 2 }

local function same(got, want, what)
  if want ~= want then assert(got ~= got, what .. ": want NaN") return end
  assert.are.equal(want, got, what)
  assert.are.equal(1 / want, 1 / got, what .. ": the sign of zero")
end

describe("attn.remainder", function()
  it("takes the divisor's sign, keeps -0, gives NaN for x % 0", function()
    local a, b = attn.tensor(A), attn.tensor(B)
    for _, r in ipairs { attn.remainder(a, b), a % b, a:remainder(b), a:clone():remainder_(b) } do
      local got = r:totable()
      for i = 1, #A do same(got[i], WANT[i], ("%g %% %g"):format(A[i], B[i])) end
    end
  end)

  it("broadcasts and takes numbers on either side", function()
    local a = attn.tensor { { -7, 7 }, { 1.25, -1.25 } }
    assert.are.same({ { 2, 1 }, { 1.25, 1.75 } }, (a % 3):totable())
    assert.are.same({ { -4, 3 }, { 0.5, -0.75 } }, (3 % a):totable())
    assert.are.same({ { 1, -1 }, { 1.25, -1.25 } }, (a % attn.tensor { 2, -2 }):totable())
  end)

  it("gradients: 1 for a, -floor(a / b) for b, summed over broadcast dims", function()
    local a = attn.tensor({ { 5.5, -5.5, 7 }, { 0.5, -3, 9 } }, { requires_grad = true })
    local b = attn.tensor({ 2, -2.5, 4 }, { requires_grad = true })
    local r = a % b
    assert.are.equal("RemainderBackward1", r.grad_fn:name())
    r:sum():backward()
    assert.are.same({ { 1, 1, 1 }, { 1, 1, 1 } }, a.grad:totable())
    local av, bv, want = a:detach():totable(), b:detach():totable(), {}
    for j = 1, 3 do want[j] = -(math.floor(av[1][j] / bv[j]) + math.floor(av[2][j] / bv[j])) end
    assert.are.same(want, b.grad:totable())
    local s = a % 2
    assert.are.equal("RemainderBackward0", s.grad_fn:name())
  end)

  it("in place on a tensor with history records RemainderBackward1", function()
    local a = attn.tensor({ 5.5, -5.5 }, { requires_grad = true })
    local b = attn.tensor({ 2, 2 }, { requires_grad = true })
    local c = a * 1
    c:remainder_(b)
    assert.are.equal("RemainderBackward1", c.grad_fn:name())
    c:sum():backward()
    assert.are.same({ 1, 1 }, a.grad:totable())
    assert.are.same({ -2, 3 }, b.grad:totable())
  end)

  it("bad arguments name the function", function()
    local ok, err = pcall(attn.remainder, attn.ones(2), "x")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("remainder", 1, true), tostring(err))
  end)
end)

describe("attn.floor", function()
  it("rounds toward -inf, keeps NaN and infinities, has a zero gradient (FloorBackward0)", function()
    local t = attn.tensor({ -1.5, 1.5, -0.25, 2, 1 / 0, -1 / 0, 0 / 0 }, { requires_grad = true })
    local f = t:floor()
    local got = f:totable()
    local want = { -2, 1, -1, 2, 1 / 0, -1 / 0 }
    for i = 1, 6 do assert.are.equal(want[i], got[i]) end
    assert.is_true(got[7] ~= got[7])
    assert.are.equal("FloorBackward0", f.grad_fn:name())
    f:sum():backward()
    assert.are.same({ 0, 0, 0, 0, 0, 0, 0 }, t.grad:totable())
  end)
end)

describe("attn.floor_divide", function()
  it("is Python's // as torch 1.13 prints it: toward -inf, signed zeros, x // 0 = x / 0", function()
    local a, b = attn.tensor { 5.5, -5.5, 7, 0, -0.0, 1 }, attn.tensor { 2, 2, -2, -3, 3, 0 }
    local want = { 2, -3, -4, -0.0, -0.0, 1 / 0 }
    for _, r in ipairs { a // b, attn.floor_divide(a, b), a:floor_divide(b) } do
      local got = r:totable()
      for i = 1, #want do same(got[i], want[i], ("%g // %g"):format(a[i], b[i])) end
    end
    assert.are.same({ 1, -2 }, (3 // attn.tensor { 2, -2 }):totable())
  end)

  it("from the exact remainder: a // b * b + a % b gives a back", function()
    attn.manual_seed(3)
    local a, b = attn.randn(1000) * 100, attn.randn(1000)
    local back = (a // b) * b + a % b
    assert.is_true(((back - a):abs() - a:abs() * 1e-5):max():item() <= 1e-4)
  end)

  it("is not differentiable: its result does not require grad", function()
    local a = attn.tensor({ 5.5 }, { requires_grad = true })
    assert.is_false((a // 2).requires_grad)
  end)
end)
