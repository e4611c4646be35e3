-- The semantics the per-call bookkeeping of autograd must keep now that it
-- is lean (one table per recorded call, the input scan, output slots and saved
-- versions in C: lua/attn/autograd/init.lua, src/binding/lua_tensor.c) and
-- that the fused modules decide recording from x and their Linear parameters
-- (Module.linears_recording) instead of walking every parameter: when a
-- forward records, the edges of a graph, in-place and double-backward
-- errors through the fused node, dirty ops and list inputs, and the shape
-- check of a backward's results. No timing here (scripts/bench.lua's tiny and
-- tiny_train cases measure the speed).
local attn = require "attn"
local autograd = require "attn.autograd"

local function tiny_module(class)
  attn.manual_seed(123)
  if class == "MultiHeadAttention" then return attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2) end
  return attn.nn.CausalAttention(3, 2, 6, 0.0)
end

local function batch()
  attn.manual_seed(7)
  return attn.rand(2, 6, 3)
end

-- |a - b| <= 1e-5 (1 + |b|) everywhere
local function assert_near(a, b, what)
  assert.same(b:size(), a:size(), what .. ": shape")
  local worst = ((a - b):abs() - (b:abs() + 1) * 1e-5):max():item()
  assert(worst <= 0, what .. ": differs by more than 1e-5 (1 + |b|)")
end

local function weights(m)
  local out = {}
  for _, np in ipairs(m:named_parameters()) do out[#out + 1] = np end
  return out
end

for _, class in ipairs({ "CausalAttention", "MultiHeadAttention" }) do
  describe(class .. ": when the fused forward records", function()
    it("records with the parameters requiring grad: every parameter gets a gradient, x none", function()
      local m, x = tiny_module(class), batch()
      local y = m(x)
      assert.is_true(y.requires_grad)
      assert.equal(class == "CausalAttention" and "UnsafeViewBackward0" or "ViewBackward0", y.grad_fn:name())
      y:sum():backward()
      for _, np in ipairs(weights(m)) do assert.is_not_nil(np[2].grad, np[1]) end
      assert.is_nil(x.grad)
    end)

    it("records nothing when neither x nor any parameter requires grad (frozen parameters stay frozen)", function()
      local m, x = tiny_module(class), batch()
      for _, np in ipairs(weights(m)) do np[2].requires_grad = false end
      local y = m(x)
      assert.is_false(y.requires_grad)
      assert.is_nil(y.grad_fn)
      m:parameters() -- as an optimizer's constructor does
      for _, np in ipairs(weights(m)) do assert.is_false(np[2].requires_grad, np[1]) end
      assert.is_nil(m(x).grad_fn)
    end)

    it("records for x alone when only x requires grad: x's gradient is the module path's", function()
      local m, x = tiny_module(class), batch()
      for _, np in ipairs(weights(m)) do np[2].requires_grad = false end
      x:requires_grad_()
      m(x):sum():backward()
      for _, np in ipairs(weights(m)) do assert.is_nil(np[2].grad, np[1]) end
      local fused = x.grad
      x.grad = nil
      m:forward_modules(x):sum():backward()
      assert_near(fused, x.grad, "dx")
    end)

    it("records nothing under no_grad, even with x requiring grad", function()
      local m, x = tiny_module(class), batch()
      x:requires_grad_()
      local y = attn.no_grad(m, x)
      assert.is_nil(y.grad_fn)
    end)

    it("a tensor assigned over a parameter becomes one on the next forward and gets its gradient", function()
      local m, x = tiny_module(class), batch()
      attn.manual_seed(9)
      local w = attn.rand(2, 3)
      m.W_query.weight = w
      assert.is_false(w.requires_grad)
      m(x):sum():backward()
      assert.is_true(w.requires_grad)
      assert.is_true(autograd.is_parameter(w))
      local fused = w.grad
      assert.is_not_nil(fused)
      w.grad = nil
      m:forward_modules(x):sum():backward()
      assert_near(fused, w.grad, "dW_query")
    end)

    it("an in-place change of a saved parameter before backward is an error naming the node", function()
      local m, x = tiny_module(class), batch()
      local y = m(x):sum()
      attn.no_grad(function() m.W_key.weight:add_(1) end)
      local ok, err = pcall(y.backward, y)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("modified in place", 1, true), err)
      assert.truthy(tostring(err):find(m(x).grad_fn:name(), 1, true), err)
    end)

    it("a child replaced after a forward is checked anew: another class runs module by module", function()
      local m, x = tiny_module(class), batch()
      local fused = attn.no_grad(m, x)
      local Doubled = attn.nn.Linear:extend("DoubledLinear")
      function Doubled:forward(y) return attn.nn.Linear.forward(self, y) * 2 end
      local d = Doubled(3, 2, { bias = false })
      attn.no_grad(function() d.weight:copy_(m.W_query.weight) end)
      m.W_query = d
      local out = attn.no_grad(m, x)
      assert.is_false(out:equal(fused))
      assert.is_true(out:equal(attn.no_grad(m.forward_modules, m, x)))
    end)

    it("a second backward needs retain_graph; with it the gradients add up", function()
      local m, x = tiny_module(class), batch()
      local y = m(x):sum()
      y:backward(nil, { retain_graph = true })
      local once = m.W_value.weight.grad:clone()
      y:backward()
      assert_near(m.W_value.weight.grad, once * 2, "twice")
      local ok, err = pcall(y.backward, y)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("second time", 1, true), err)
    end)
  end)
end

describe("the recorded graph", function()
  it("next_functions: a node's slot, AccumulateGrad for a leaf, nil for an input without grad", function()
    local a = attn.ones(2, 3):requires_grad_()
    local b = attn.full({ 2, 3 }, 2)
    local y = a * b
    local z = y:sum()
    local nf = z.grad_fn:next_functions()
    assert.equal(y.grad_fn, nf[1][1])
    assert.equal(0, nf[1][2])
    local ny = y.grad_fn:next_functions()
    assert.same({ "AccumulateGrad", 0 }, ny[1])
    assert.is_nil(ny[2][1])
  end)

  it("a two-output op: the indices have no gradient, the values route it to the selected elements", function()
    local x = attn.tensor({ { 1, 5, 2 }, { 7, 3, 4 } }):requires_grad_()
    local v, idx = x:max(2)
    assert.is_nil(idx.grad_fn)
    assert.equal("MaxBackward0", v.grad_fn:name())
    v:sum():backward()
    assert.same({ { 0, 1, 0 }, { 1, 0, 0 } }, x.grad:totable())
  end)

  it("an in-place op given its own tensor twice (y:add_(y)) records once: d(2y)/dx", function()
    local x = attn.tensor({ 1, 2, 3 }):requires_grad_()
    local y = x * 1
    y:add_(y)
    assert.equal("AddBackward0", y.grad_fn:name())
    y:sum():backward()
    assert.same({ 2, 2, 2 }, x.grad:totable())
  end)

  it("a list input (cat) sends gradient to the tensors of the list that require it", function()
    local a = attn.ones(2):requires_grad_()
    local b = attn.ones(3)
    local y = attn.cat({ a, b }, 1)
    assert.equal("CatBackward0", y.grad_fn:name())
    local weighted = y * attn.tensor({ 1, 2, 3, 4, 5 })
    weighted:sum():backward()
    assert.same({ 1, 2 }, a.grad:totable())
    assert.is_nil(b.grad)
  end)

  it("a backward returning a gradient of the wrong shape is an error naming both shapes", function()
    local bad = autograd.Function {
      name = "BadBackward0",
      forward = function(_, x) return x * 2 end,
      backward = function() return attn.ones(5) end,
    }
    local leaf = attn.ones(2, 3):requires_grad_()
    for _, input in ipairs({ leaf, leaf * 1 }) do -- a leaf edge and a node's edge
      local ok, err = pcall(function() bad(input):sum():backward() end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("shape [5] for input 1 of shape [2, 3]", 1, true), err)
    end
  end)
end)

describe("the backward walk's shortcuts keep the bits", function()
  it("a whole sum's backward gives every element the gradient's value, bit for bit (-0, inf, NaN)", function()
    for _, v in ipairs({ 2.5, -0.0, math.huge, 0 / 0 }) do
      local x = attn.rand(2, 3, { requires_grad = true })
      x:sum():backward(attn.tensor(v))
      local g = x.grad
      assert.same({ 2, 3 }, g:size())
      assert.is_true(g:is_contiguous())
      for _, row in ipairs(g:totable()) do
        for _, e in ipairs(row) do assert.equal(string.format("%a", v), string.format("%a", e)) end
      end
    end
  end)

  it("a second backward adds into .grad, and a .grad of another leaf is not touched", function()
    local x = attn.tensor({ 1, 2, 3 }, { requires_grad = true })
    local w = attn.tensor({ 0.5, 0.25, 4 }, { requires_grad = true })
    for _ = 1, 2 do (x * w):sum():backward() end
    assert.same({ 1, 0.5, 8 }, x.grad:totable()) -- 2 w
    assert.same({ 2, 4, 6 }, w.grad:totable()) -- 2 x
    local before = x.grad
    x:sum():backward()
    assert.equal(before, x.grad) -- accumulated in place, as torch
    assert.same({ 2, 1.5, 9 }, x.grad:totable())
  end)
end)
