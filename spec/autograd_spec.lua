-- Autograd against PyTorch 1.13 (fixtures: spec/fixtures/autograd_cases.lua,
-- written by scripts/fixtures/make_autograd_fixtures.py, which holds each
-- computation in torch and in Lua side by side): the output, its grad_fn name
-- and the gradient of every input that requires grad, for every
-- differentiable op (broadcast and non-contiguous inputs included),
-- attention with each option, dropout with a seed, and every notebook
-- module's parameter gradients by name. Then the engine's semantics:
-- accumulation, retain_graph, autograd.grad, no_grad, detach, the version
-- counter and the errors of bad calls.
local attn = require "attn"
require "attn.assert"
local F = dofile("spec/fixtures/autograd_cases.lua")

local function T(rec) return attn.tensor(rec.data):view(rec.shape) end

-- |got - want| <= atol + rtol * |want| everywhere
local function near(got, want, what)
  assert.is_true(attn.is_tensor(got), what .. ": no tensor")
  assert.are.same(want:size(), got:size(), what .. ": shape")
  local err = (got - want):abs()
  local bound = want:abs() * 1e-4 + 2e-5
  local bad = err:gt(bound):sum():item()
  if bad > 0 then
    error(("%s: %d elements differ beyond 2e-5 + 1e-4 |want| (max |diff| %g)"):format(what, bad, err:max():item()), 2)
  end
end

local function input(rec)
  local t = T(rec.data)
  if rec.transposed then t = t:transpose(-1, -2):contiguous():transpose(-1, -2) end
  if rec.requires_grad then t:requires_grad_() end
  return t
end

describe("autograd against torch 1.13", function()
  for _, c in ipairs(F.cases) do
    it(c.name .. ": output, grad_fn and input gradients", function()
      local fn = assert(load("return " .. c.src))()
      local xs = {}
      for i, rec in ipairs(c.inputs) do xs[i] = input(rec) end
      if c.inputs[1].transposed then assert.is_false(xs[1]:is_contiguous()) end
      if c.seeded then attn.manual_seed(7) end
      local out = fn(attn, table.unpack(xs))
      near(out, T(c.out), "output")
      assert.are.equal(c.grad_fn, out.grad_fn:name())
      out:backward(T(c.g))
      for i, rec in ipairs(c.inputs) do
        if rec.requires_grad then
          near(xs[i].grad, T(c.grads[i]), "gradient of input " .. i)
        else
          assert.is_nil(xs[i].grad)
        end
      end
    end)
  end

  for _, m in ipairs(F.modules) do
    it(m.name .. ": every parameter's gradient by name, and the input's", function()
      attn.manual_seed(m.seed)
      local mod = assert(load("local a = ...; return " .. m.ctor))(attn)
      mod:train(m.train)
      -- torch drew x after construction: the same draw here keeps the streams aligned (and checks the bits)
      local x = attn.rand(m.x.shape)
      assert.tensor_equal(x, T(m.x))
      x:requires_grad_()
      local out = mod(x)
      near(out, T(m.out), "output")
      assert.are.equal(m.grad_fn, out.grad_fn:name())
      out:backward(T(m.g))
      near(x.grad, T(m.x_grad), "x.grad")
      local params = mod:named_parameters()
      assert.are.equal(#m.param_grads, #params)
      for i, np in ipairs(params) do
        assert.are.equal(m.param_grads[i][1], np[1])
        near(np[2].grad, T(m.param_grads[i][2]), np[1] .. ".grad")
      end
    end)
  end
end)

describe("autograd semantics", function()
  it("accumulates over two backwards and resets with grad = nil", function()
    local x = attn.tensor({1, 2, 3}, {requires_grad = true})
    ;(x * x):sum():backward()
    ;(x * 3):sum():backward()
    assert.are.same({5, 7, 9}, x.grad:totable())
    x.grad = nil
    assert.is_nil(x.grad)
    ;(x * 2):sum():backward()
    assert.are.same({2, 2, 2}, x.grad:totable())
  end)

  it("frees the graph after backward unless retain_graph", function()
    local x = attn.tensor({1, 2}, {requires_grad = true})
    local y = x:exp():sum()
    y:backward(nil, {retain_graph = true})
    y:backward()
    local e = math.exp(1)
    assert.tensor_near(x.grad, attn.tensor({2 * e, 2 * e * e}), 1e-5)
    local ok, err = pcall(y.backward, y)
    assert.is_false(ok)
    assert.matches("second time", err)
    -- the engine stays usable
    local z = (x * 2):sum()
    x.grad = nil
    z:backward()
    assert.are.same({2, 2}, x.grad:totable())
  end)

  it("autograd.grad returns gradients without touching .grad, for leaves and intermediate tensors", function()
    local x = attn.tensor({1, 2, 3}, {requires_grad = true})
    local h = x * x
    local y = (h * 2):sum()
    local g = attn.autograd.grad(y, {x, h})
    assert.are.same({4, 8, 12}, g[1]:totable())
    assert.are.same({2, 2, 2}, g[2]:totable())
    assert.is_nil(x.grad)
    local ok, err = pcall(attn.autograd.grad, (x * 1):sum(), {attn.ones(3)})
    assert.is_false(ok)
    assert.matches("does not require grad", err)
    local w = attn.ones(3, {requires_grad = true})
    ok, err = pcall(attn.autograd.grad, (x * 1):sum(), {w})
    assert.is_false(ok)
    assert.matches("appears to not have been used in the graph", err)
  end)

  it("no_grad records nothing, restores recording after an error, and allows in-place updates of leaves", function()
    local x = attn.ones(2, {requires_grad = true})
    local y = attn.no_grad(function() return x * 2 end)
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
    local ok = pcall(attn.no_grad, function() error("boom") end)
    assert.is_false(ok)
    assert.is_true(attn.is_grad_enabled())
    attn.no_grad(function() x:add_(1) end)
    assert.are.same({2, 2}, x:totable())
    assert.is_true(x.requires_grad)
    local prev = attn.set_grad_enabled(false)
    assert.is_true(prev)
    assert.is_nil((x * 2).grad_fn)
    attn.set_grad_enabled(true)
    assert.are.equal("MulBackward0", (x * 2).grad_fn:name())
  end)

  it("detach shares storage and has no history; requires_grad_ only on leaves", function()
    local x = attn.ones(2, {requires_grad = true})
    local y = x * 2
    local d = y:detach()
    assert.is_false(d.requires_grad)
    assert.is_true(d.is_leaf)
    d:fill_(7)
    assert.are.same({7, 7}, y:totable())
    local ok, err = pcall(y.requires_grad_, y, false)
    assert.is_false(ok)
    assert.matches("leaf", err)
    local t = attn.zeros(2)
    assert.are.equal(t, t:requires_grad_())
    assert.is_true(t.requires_grad and t.is_leaf)
    assert.is_false(y.is_leaf)
  end)

  it("an in-place change of a saved tensor is an error at backward naming the saving op and the writer", function()
    local x = attn.tensor({1, 2}, {requires_grad = true})
    local y = x:exp()
    local z = y:sum()
    y:mul_(2)
    local ok, err = pcall(z.backward, z)
    assert.is_false(ok)
    assert.matches("ExpBackward0", err)
    assert.matches("Tensor:mul_", err)
  end)

  it("in-place ops on a leaf that requires grad are refused; on a non-leaf they record", function()
    local x = attn.ones(2, 3, {requires_grad = true})
    for _, call in ipairs{
      function() x:add_(1) end, function() x:fill_(0) end, function() x:zero_() end,
      function() x:copy_(attn.zeros(2, 3)) end, function() x:masked_fill_(attn.ones(2, 3), 0) end,
      function() x:uniform_() end, function() x:normal_() end, function() x:mul_(2) end,
      function() x[1] = 3 end,
    } do
      local ok, err = pcall(call)
      assert.is_false(ok)
      assert.matches("requires grad", err)
    end
    local y = x * 1
    y:masked_fill_(attn.tensor{{1, 0, 0}, {0, 0, 1}}, 0)
    assert.are.equal("MaskedFillBackward0", y.grad_fn:name())
    y:sum():backward()
    assert.are.same({{0, 1, 1}, {1, 1, 0}}, x.grad:totable())
  end)

  it("bad backward calls are clear errors", function()
    local x = attn.ones(2, {requires_grad = true})
    local y = x * 2
    local ok, err = pcall(y.backward, y)
    assert.is_false(ok)
    assert.matches("one%-element", err)
    ok, err = pcall(y.backward, y, attn.ones(3))
    assert.is_false(ok)
    assert.matches("expected shape %[2%]", err)
    ok, err = pcall(attn.ones(2).backward, attn.ones(2))
    assert.is_false(ok)
    assert.matches("does not require grad", err)
    ok, err = pcall(y.backward, y, attn.ones(2), {retain = true})
    assert.is_false(ok)
    assert.matches("unknown option 'retain'", err)
    y:backward(attn.ones(2))
    assert.are.same({2, 2}, x.grad:totable())
  end)

  it("no_grad, set_grad_enabled, requires_grad_, detach and the grad field refuse bad arguments clearly", function()
    local cases = {
      { function() attn.no_grad(5) end, "attn.no_grad: bad argument #1 'fn' %(expected a function, got number%)" },
      { function() attn.set_grad_enabled("yes") end, "attn.set_grad_enabled: bad argument #1 'on' %(expected a boolean" },
      { function() attn.ones(2):requires_grad_(1) end, "Tensor:requires_grad_: bad argument #2 'requires_grad'" },
      { function() attn.ones(2):detach(1) end, "Tensor:detach: bad argument #2" },
      { function() attn.ones(2).grad = attn.ones(3) end, "the gradient's shape %[3%] differs from the tensor's %[2%]" },
      { function() attn.ones(2).grad = 7 end, "expected an attn.Tensor or nil, got number" },
      { function() attn.autograd.grad(attn.ones(1), 3) end, "bad argument #2 'inputs'" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.matches(c[2], err)
    end
    assert.is_true(attn.is_grad_enabled())
  end)

  it("creation functions take {requires_grad = true}", function()
    for _, t in ipairs{ attn.zeros(2, 3, {requires_grad = true}), attn.ones({2}, {requires_grad = true}),
      attn.empty(2, {requires_grad = true}), attn.full({2}, 3, {requires_grad = true}),
      attn.eye(2, {requires_grad = true}), attn.arange(3, {requires_grad = true}),
      attn.rand(2, {requires_grad = true}), attn.randn(2, {requires_grad = true}),
      attn.tensor({1, 2}, {requires_grad = true}) } do
      assert.is_true(t.requires_grad)
      assert.is_true(t.is_leaf)
    end
    assert.are.same({2, 3}, attn.zeros({2, 3}, {requires_grad = false}):size())
    local ok, err = pcall(attn.zeros, 2, {requires = true})
    assert.is_false(ok)
    assert.matches("unknown option 'requires'", err)
  end)

  it("prints requires_grad=True, grad_fn=<...> and Parameter containing: as torch", function()
    assert.are.equal("tensor([1., 2.], requires_grad=True)", tostring(attn.tensor({1, 2}, {requires_grad = true})))
    local x = attn.tensor({1, 2}, {requires_grad = true})
    assert.are.equal("tensor(3., grad_fn=<SumBackward0>)", tostring(x:sum()))
    assert.are.equal("tensor([], requires_grad=True)", tostring(attn.zeros(0, {requires_grad = true})))
    local p = attn.nn.Linear(2, 1).bias
    assert.matches("^Parameter containing:\ntensor%(%[[-0-9.]+%], requires_grad=True%)$", tostring(p))
    -- past the line width the suffix goes on its own line, indented as torch does
    local w = attn.ones(3, 6, {requires_grad = true}) * 0.5
    assert.are.equal("tensor([[0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000],\n"
      .. "        [0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000],\n"
      .. "        [0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000]],\n"
      .. "       grad_fn=<MulBackward0>)", tostring(w))
  end)

  it("module parameters require grad; zero_grad drops the gradients", function()
    local m = attn.nn.Linear(3, 2)
    for _, p in ipairs(m:parameters()) do assert.is_true(p.requires_grad) end
    m(attn.ones(4, 3)):sum():backward()
    assert.are.same({2, 3}, m.weight.grad:size())
    assert.are.same({4, 4}, m.bias.grad:totable())
    m:zero_grad()
    assert.is_nil(m.weight.grad)
    -- loading weights copies into the parameters without recording
    m:load_state_dict(m:state_dict())
    assert.is_true(m.weight.is_leaf)
  end)

  it("a deep chain of 20000 ops backpropagates without recursion limits", function()
    local x = attn.ones(1, {requires_grad = true})
    local y = x
    for _ = 1, 20000 do y = y * 1 end
    y:sum():backward()
    assert.are.same({1}, x.grad:totable())
  end)
end)
