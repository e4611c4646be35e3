-- attn.autograd.register_post_backward: hooks run at the end of every
-- Tensor:backward, once the leaves' .grad are written, in registration order;
-- handle:remove() unregisters; autograd.grad (which writes no .grad) runs none.
local attn = require "attn"
local autograd = require "attn.autograd"

describe("attn.autograd.register_post_backward", function()
  it("runs each hook once per backward, after the .grad are written, in registration order", function()
    local x = attn.tensor({1, 2, 3}):requires_grad_()
    local log = {}
    local h1 = autograd.register_post_backward(function()
      log[#log + 1] = "first:" .. (x.grad and tostring(x.grad:sum():item()) or "nil")
    end)
    local h2 = autograd.register_post_backward(function() log[#log + 1] = "second" end)
    local y = x * 2
    y:sum():backward()
    assert.are.same({"first:6.0", "second"}, log)
    y = x * 3
    y:sum():backward()
    assert.are.same({"first:6.0", "second", "first:15.0", "second"}, log)
    h1.remove()
    h2.remove()
    y = x * 3
    y:sum():backward()
    assert.are.equal(4, #log)
  end)

  it("a hook removed while the hooks run does not disturb the others; remove twice is harmless", function()
    local x = attn.tensor({1.0}):requires_grad_()
    local log = {}
    local h1
    h1 = autograd.register_post_backward(function() log[#log + 1] = "a"; h1.remove() end)
    local h2 = autograd.register_post_backward(function() log[#log + 1] = "b" end)
    x:sum():backward()
    x:sum():backward()
    assert.are.same({"a", "b", "b"}, log)
    h2.remove()
    h2.remove()
    h1.remove()
  end)

  it("autograd.grad runs no hook", function()
    local x = attn.tensor({1.0}):requires_grad_()
    local n = 0
    local h = autograd.register_post_backward(function() n = n + 1 end)
    autograd.grad((x * 2):sum(), x)
    h.remove()
    assert.are.equal(0, n)
  end)

  it("a hook's error reaches the backward's caller", function()
    local x = attn.tensor({1.0}):requires_grad_()
    local h = autograd.register_post_backward(function() error("hook failed", 0) end)
    local ok, err = pcall(function() x:sum():backward() end)
    h.remove()
    assert.is_false(ok)
    assert.are.equal("hook failed", err)
  end)

  it("refuses a non-function, naming the function and the argument", function()
    assert.has_error(function() autograd.register_post_backward(42) end,
      "attn.autograd.register_post_backward: bad argument #1 'fn' (expected a function, got number)")
  end)
end)
