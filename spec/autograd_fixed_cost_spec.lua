-- The semantics the lean paths of the autograd engine must keep
-- (lua/attn/autograd/init.lua, src/binding/lua_autograd.c): a recorded call
-- runs its forward without a pcall (grad mode restored by a to-be-closed
-- variable, also when the forward raises), a name function that raises on
-- the arguments leaves the forward's own error first, a node is the history
-- entry of its first output, output shapes are kept as keys, a one-input
-- node's results go without a table, backward's one root without lists.
-- No timing here (scripts/bench.lua's tiny_train case measures the speed).
local attn = require "attn"
local autograd = require "attn.autograd"

local function leaf(...)
  attn.manual_seed(11)
  return attn.rand(...):requires_grad_()
end

describe("autograd's recorded call", function()
  it("restores grad mode when the forward raises, and records again after", function()
    local boom = autograd.Function{
      name = "BoomBackward0",
      forward = function() error("forward failed", 0) end,
      backward = function(_, g) return g end,
    }
    local x = leaf(2, 3)
    local ok, err = pcall(boom, x)
    assert.is_false(ok)
    assert.equals("forward failed", err)
    assert.is_true(attn.is_grad_enabled())
    local y = (x * 2):sum()
    assert.equals("SumBackward0", y.grad_fn:name())
    y:backward()
    assert.same({ { 2, 2, 2 }, { 2, 2, 2 } }, x.grad:totable())
  end)

  it("gives the forward's error first when the name function would raise on the arguments", function()
    local calls = 0
    local f = autograd.Function{
      name = function(a) return a:dim() == 2 and "TwoBackward0" or "OtherBackward0" end,
      forward = function(_, a, b)
        calls = calls + 1
        if type(a) ~= "userdata" then error("f: bad argument #1 'a' (expected attn.Tensor)", 0) end
        return a * b
      end,
      backward = function(_, g) return g, g end,
    }
    local b = leaf(2)
    local ok, err = pcall(f, 5, b)
    assert.is_false(ok)
    assert.equals("f: bad argument #1 'a' (expected attn.Tensor)", err)
    assert.equals(1, calls)
    assert.is_true(attn.is_grad_enabled())
    -- and with good arguments the name is the name function's
    local y = f(leaf(2, 2), attn.ones(2, 2))
    assert.equals("TwoBackward0", y.grad_fn:name())
  end)

  it("makes a node the history of its first output and a separate entry for the others", function()
    local x = leaf(4, 3)
    local a, b = x:chunk(2, 1)
    assert.equals(a.grad_fn, b.grad_fn)
    local fns = (a + b):sum().grad_fn:next_functions()
    -- SumBackward0 -> AddBackward0, whose edges are the chunk's outputs 0 and 1 (torch numbers from 0)
    local add = fns[1][1]
    assert.equals("AddBackward0", add:name())
    local edges = add:next_functions()
    assert.equals(a.grad_fn, edges[1][1])
    assert.equals(0, edges[1][2])
    assert.equals(a.grad_fn, edges[2][1])
    assert.equals(1, edges[2][2])
  end)

  it("gives zeros of the output's shape to a slot no gradient reached", function()
    local x = leaf(4, 3)
    local a = x:chunk(2, 1)
    a:sum():backward()
    assert.same({ { 1, 1, 1 }, { 1, 1, 1 }, { 0, 0, 0 }, { 0, 0, 0 } }, x.grad:totable())
  end)
end)

describe("autograd's backward walk", function()
  it("refuses a backward's gradient of the wrong shape for an input made by a node, naming both shapes", function()
    local bad = autograd.Function{
      name = "BadBackward0",
      forward = function(_, a) return a * 1 end,
      backward = function() return attn.zeros(5) end,
    }
    local x = leaf(2, 3)
    local y = bad(x * 2)
    local ok, err = pcall(function() y:sum():backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("BadBackward0's backward returned a gradient of shape [5] for input 1 of shape [2, 3]",
      1, true), err)
  end)

  -- a chain (each node one output, one edge to a node) and a graph with a
  -- shared input take different walks: both check every gradient
  it("refuses a backward's gradient that is no tensor or of the wrong shape, on a chain and on a general graph", function()
    local function bad_fn(result)
      return autograd.Function{
        name = "BadBackward0",
        forward = function(_, a) return a * 1 end,
        backward = function() return result end,
      }
    end
    local cases = {
      { "oops", "BadBackward0's backward returned a string for input 1 (expected a gradient tensor)" },
      { attn.zeros(5), "BadBackward0's backward returned a gradient of shape [5] for input 1 of shape [2, 3]" },
    }
    for _, c in ipairs(cases) do
      local bad = bad_fn(c[1])
      for _, graph in ipairs { "leaf chain", "node chain", "shared" } do
        local x = leaf(2, 3)
        local y
        if graph == "leaf chain" then y = bad(x):sum()
        elseif graph == "node chain" then y = bad(x * 2):sum()
        else local h = x * 2; y = (bad(h) + h):sum() end
        local ok, err = pcall(function() y:backward() end)
        assert.is_false(ok, graph)
        assert.truthy(tostring(err):find(c[2], 1, true), graph .. ": " .. tostring(err))
      end
    end
  end)

  it("takes a one-input backward's gradient given as a one-element list", function()
    local listy = autograd.Function{
      name = "ListBackward0",
      forward = function(_, a) return a * 3 end,
      backward = function(_, g) return { g * 3 } end,
    }
    local x = leaf(3)
    listy(x):sum():backward()
    assert.same({ 3, 3, 3 }, x.grad:totable())
  end)

  it("walks again through nodes that saved nothing (a second backward), and refuses it through one that saved", function()
    local x = leaf(3)
    local y = (x + 1):sum()
    y:backward()
    y:backward()
    assert.same({ 2, 2, 2 }, x.grad:totable())
    local z = (x * x):sum()
    z:backward()
    local ok, err = pcall(function() z:backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("second time", 1, true), err)
  end)

  it("gives autograd.grad of several outputs sharing nodes the sum of their gradients", function()
    local x = leaf(3)
    local h = x * 2
    local y1, y2 = (h * h):sum(), (h + x):sum()
    local g = autograd.grad({ y1, y2, y1 }, { x, h })
    -- d/dx: 2 * (8x) + (2 + 1); d/dh: 2 * (2h) + 1
    local xs = x:totable()
    for i = 1, 3 do
      assert.near(16 * xs[i] + 3, g[1]:totable()[i], 1e-5)
      assert.near(8 * xs[i] + 1, g[2]:totable()[i], 1e-5)
    end
  end)

  it("accumulates a repeated backward into .grad and runs the post-backward hooks once per backward", function()
    local x = leaf(2)
    local runs = 0
    local h = autograd.register_post_backward(function() runs = runs + 1 end)
    for _ = 1, 3 do (x * 5):sum():backward() end
    h:remove()
    assert.equals(3, runs)
    assert.same({ 15, 15 }, x.grad:totable())
  end)
end)
