-- Grad mode belongs to the running coroutine: no_grad, enable_grad and
-- set_grad_enabled inside a coroutine that yields leave the code outside it
-- as it was, a coroutine abandoned inside no_grad leaves nothing switched
-- off, and the recording-off of an autograd.Function's forward and of a
-- backward stays inside the coroutine that runs them. A coroutine that never
-- sets the mode follows the main thread's.
local attn = require "attn"
local autograd = require "attn.autograd"

local function records()
  local x = attn.ones(2, { requires_grad = true })
  return (x * 2).grad_fn ~= nil
end

describe("grad mode per coroutine", function()
  it("no_grad inside a coroutine that yields: the outside records meanwhile; the coroutine does not", function()
    local inside = {}
    local co = coroutine.create(function()
      attn.no_grad(function()
        inside[1] = records()
        coroutine.yield()
        inside[2] = records()
        inside[3] = attn.is_grad_enabled()
      end)
      inside[4] = records()
    end)
    assert(coroutine.resume(co))
    assert.is_true(attn.is_grad_enabled())
    assert.is_true(records())
    assert(coroutine.resume(co))
    assert.equal("dead", coroutine.status(co))
    assert.same({ false, false, false, true }, inside)
    assert.is_true(records())
  end)

  it("a coroutine abandoned inside no_grad leaves recording on outside", function()
    local co = coroutine.wrap(function()
      attn.no_grad(function() coroutine.yield() end)
    end)
    co()
    co = nil -- never resumed again
    collectgarbage()
    assert.is_true(attn.is_grad_enabled())
    assert.is_true(records())
  end)

  it("set_grad_enabled(false) inside a coroutine is that coroutine's; the main mode stays", function()
    local co = coroutine.wrap(function()
      local prev = attn.set_grad_enabled(false)
      coroutine.yield(prev, records())
      return attn.is_grad_enabled(), records()
    end)
    local prev, rec = co()
    assert.is_true(prev)
    assert.is_false(rec)
    assert.is_true(records())
    local on, rec2 = co()
    assert.is_false(on)
    assert.is_false(rec2)
    assert.is_true(attn.is_grad_enabled())
  end)

  it("enable_grad inside a coroutine, with the main thread in no_grad, records only inside", function()
    local co = coroutine.wrap(function()
      return attn.enable_grad(function()
        coroutine.yield(records())
        return records()
      end)
    end)
    attn.no_grad(function()
      assert.is_true(co())
      assert.is_false(records())
      assert.is_true(co())
      assert.is_false(attn.is_grad_enabled())
    end)
    assert.is_true(records())
  end)

  it("a coroutine that never sets the mode follows the main thread's", function()
    local co = coroutine.wrap(function()
      while true do coroutine.yield(records()) end
    end)
    assert.is_true(co())
    attn.no_grad(function() assert.is_false(co()) end)
    assert.is_true(co())
  end)

  it("an autograd.Function whose forward yields: recording stays on outside while it is suspended", function()
    local Twice = autograd.Function {
      name = "TwiceBackward",
      forward = function(_, x)
        local inner = (x * 1).grad_fn -- the forward itself records nothing
        coroutine.yield(inner)
        return x * 2
      end,
      backward = function(_, g) return g * 2 end,
    }
    local x = attn.ones(2, { requires_grad = true })
    local co = coroutine.wrap(function() return Twice(x) end)
    local inner = co()
    assert.is_nil(inner)
    assert.is_true(attn.is_grad_enabled())
    assert.is_true(records())
    local y = co()
    assert.equal("TwiceBackward", y.grad_fn:name())
    y:sum():backward()
    assert.same({ 2, 2 }, x.grad:totable())
    assert.is_true(records())
  end)

  it("a backward that yields: recording stays on outside while it is suspended", function()
    local seen
    local Pause = autograd.Function {
      name = "PauseBackward",
      forward = function(_, x) return x * 3 end,
      backward = function(_, g)
        seen = (g * 1).grad_fn -- a backward records nothing
        coroutine.yield()
        return g * 3
      end,
    }
    local x = attn.ones(2, { requires_grad = true })
    local y = Pause(x):sum()
    local co = coroutine.wrap(function() y:backward() return "done" end)
    co()
    assert.is_nil(seen)
    assert.is_true(attn.is_grad_enabled())
    assert.is_true(records())
    assert.equal("done", co())
    assert.same({ 3, 3 }, x.grad:totable())
  end)

  it("an error inside no_grad in a coroutine restores that coroutine's mode", function()
    local co = coroutine.wrap(function()
      local ok = pcall(attn.no_grad, function() error("boom") end)
      return ok, records()
    end)
    local ok, rec = co()
    assert.is_false(ok)
    assert.is_true(rec)
  end)
end)
