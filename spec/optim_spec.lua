-- attn.optim (SGD, Adam, AdamW) and nn.utils.clip_grad_norm_ through their Lua
-- API against torch 1.13 (fixtures: spec/fixtures/train_cases.lua,
-- scripts/fixtures/make_train_fixtures.py): the parameters after each of 5
-- steps are torch's bits, a run stopped after 3 steps and resumed from
-- state_dict() gives the bits of the uninterrupted run, zero_grad() sets the
-- gradients to nil, bad options raise worded errors.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FX = dofile("spec/fixtures/train_cases.lua")

-- p.grad = g exactly: the gradient of sum(p * g) with respect to p
local function set_grad(p, g)
  (p * g):sum():backward()
end

local function make(c)
  local params = {C.T(c.params[1]):requires_grad_(), C.T(c.params[2]):requires_grad_()}
  return params, attn.optim[c.name](params, c.opts)
end

local function run_steps(c, params, opt, from, to)
  for step = from, to do
    opt:zero_grad()
    for k, p in ipairs(params) do set_grad(p, C.T(c.grads[step][k])) end
    opt:step()
  end
end

describe("attn.optim against torch", function()
  for i, c in ipairs(FX.optim) do
    local desc = {}
    for k, v in pairs(c.opts) do desc[#desc + 1] = k .. "=" .. (type(v) == "table" and table.concat(v, "/") or tostring(v)) end
    table.sort(desc)
    local what = ("%s{%s}"):format(c.name, table.concat(desc, ", "))

    it(("case %d: %s: the parameters after each of 5 steps are torch's bits"):format(i, what), function()
      local params, opt = make(c)
      for step = 1, 5 do
        run_steps(c, params, opt, step, step)
        for k, p in ipairs(params) do C.exact(p, c.after[step][k], ("step %d param %d"):format(step, k)) end
      end
    end)

    it(("case %d: %s: stopped after 3 steps and resumed from state_dict, the same bits"):format(i, what), function()
      local params, opt = make(c)
      run_steps(c, params, opt, 1, 3)
      local saved = opt:state_dict()
      local saved_params = {params[1]:detach():clone(), params[2]:detach():clone()}
      -- a new optimizer over copies of the parameters, as after loading a checkpoint
      local params2 = {saved_params[1]:requires_grad_(), saved_params[2]:requires_grad_()}
      local opt2 = attn.optim[c.name](params2, c.opts)
      opt2:load_state_dict(saved)
      run_steps(c, params, opt, 4, 5)
      run_steps(c, params2, opt2, 4, 5)
      for k = 1, 2 do
        C.same_bits(params2[k], params[k], "param " .. k)
        C.exact(params2[k], c.after[5][k], "param " .. k)
      end
    end)
  end

  it("zero_grad sets every gradient to nil; step skips parameters without one", function()
    local p, q = attn.ones(3):requires_grad_(), attn.ones(2):requires_grad_()
    local opt = attn.optim.SGD({p, q}, {lr = 0.5})
    set_grad(p, attn.tensor {1, 2, 3})
    opt:step()
    C.is(p, {3}, {0.5, 0, -0.5})
    C.is(q, {2}, {1, 1})
    opt:zero_grad()
    assert.is_nil(p.grad)
    assert.is_nil(q.grad)
  end)

  it("a step is an in-place write: a graph that saved the parameter refuses its backward afterwards", function()
    local w = attn.ones(3):requires_grad_()
    local opt = attn.optim.AdamW({w})
    local y = (w * w):sum()                -- saves w
    set_grad(w, attn.ones(3))
    opt:step()
    C.fails(function() y:backward() end, "attn.optim.AdamW:step")
  end)

  it("param groups take their own options; lr can be changed between steps", function()
    local p, q = attn.ones(2):requires_grad_(), attn.ones(2):requires_grad_()
    local opt = attn.optim.SGD({{params = {p}}, {params = {q}, lr = 0.25}}, {lr = 0.5})
    assert.are.equal(0.5, opt.param_groups[1].lr)
    assert.are.equal(0.25, opt.param_groups[2].lr)
    set_grad(p, attn.ones(2)); set_grad(q, attn.ones(2))
    opt:step()
    C.is(p, {2}, {0.5, 0.5})
    C.is(q, {2}, {0.75, 0.75})
    opt.param_groups[1].lr = 0.125
    opt:step()
    C.is(p, {2}, {0.375, 0.375})
  end)

  it("a state dict from a different model is refused, naming the difference", function()
    local c = FX.optim[5]
    local params, opt = make(c)
    run_steps(c, params, opt, 1, 1)
    local sd = opt:state_dict()
    local other = attn.optim.Adam({attn.zeros(37):requires_grad_(), attn.zeros(5, 16):requires_grad_()})
    C.fails(function() other:load_state_dict(sd) end,
      "attn.optim.Adam:load_state_dict: state 'exp_avg' of parameter 2 has shape [4, 20], the parameter [5, 16]")
    local one = attn.optim.Adam({attn.zeros(37):requires_grad_()})
    C.fails(function() one:load_state_dict(sd) end, "param group 1 of the state dict has 2 parameter(s), the optimizer's 1")
    C.fails(function() one:load_state_dict("x") end, "bad argument #1 'state_dict'")
  end)

  it("bad options raise worded errors", function()
    local p = {attn.zeros(2):requires_grad_()}
    C.fails(function() attn.optim.SGD(p, {lr = -1}) end, "attn.optim.SGD: bad option 'lr' (expected a number >= 0, got -1)")
    C.fails(function() attn.optim.SGD(p) end, "attn.optim.SGD: option 'lr' is required")
    C.fails(function() attn.optim.SGD(p, {lr = 0.1, nesterov = true}) end,
      "attn.optim.SGD: nesterov momentum requires a momentum > 0 and zero dampening")
    C.fails(function() attn.optim.Adam(p, {betas = {0.9, 1}}) end, "attn.optim.Adam: bad option 'betas'")
    C.fails(function() attn.optim.AdamW(p, {eps = -1}) end, "attn.optim.AdamW: bad option 'eps'")
    C.fails(function() attn.optim.AdamW(p, {amsgrad = true}) end, "attn.optim.AdamW: bad option 'amsgrad' (expected false (not supported)")
    C.fails(function() attn.optim.AdamW(p, {momentum = 0.9}) end, "attn.optim.AdamW: unknown option 'momentum'")
    C.fails(function() attn.optim.AdamW({}) end, "attn.optim.AdamW: bad argument #1 'params' (got an empty parameter list)")
    C.fails(function() attn.optim.AdamW(attn.zeros(2)) end, "attn.optim.AdamW: bad argument #1 'params' (expected a list of tensors")
    C.fails(function() attn.optim.AdamW({p[1], 3}) end, "bad argument #1 'params' (element 2 is not an attn.Tensor, got 3)")
    C.fails(function() attn.optim.AdamW({p[1], p[1]}) end, "a parameter appears more than once")
  end)
end)

describe("nn.utils.clip_grad_norm_ against torch", function()
  for i, c in ipairs(FX.clip) do
    it(("case %d: max_norm %g: the total norm and the clipped gradients"):format(i, c.max_norm), function()
      local params = {attn.zeros(37):requires_grad_(), attn.zeros(4, 20):requires_grad_()}
      for k, p in ipairs(params) do set_grad(p, C.T(c.grads[k])) end
      local total = attn.nn.utils.clip_grad_norm_(params, c.max_norm)
      assert(math.abs(total:item() - c.total_norm) <= 1e-6 * c.total_norm)
      for k, p in ipairs(params) do
        local m = 0
        for _, v in ipairs(c.clipped[k].data) do m = math.max(m, math.abs(v)) end
        C.close(p.grad, c.clipped[k], 1e-6, 1e-6 * m, "grad " .. k)
      end
    end)
  end

  it("skips parameters without a gradient and refuses bad arguments", function()
    local p = attn.zeros(2):requires_grad_()
    assert.are.equal(0, attn.nn.utils.clip_grad_norm_({p}, 1):item())
    C.fails(function() attn.nn.utils.clip_grad_norm_({p}, "1") end, "attn.nn.utils.clip_grad_norm_: bad argument #2 'max_norm'")
    C.fails(function() attn.nn.utils.clip_grad_norm_({p}, 1, 1) end, "bad argument #3 'norm_type' (only the 2-norm")
    C.fails(function() attn.nn.utils.clip_grad_norm_({p, 3}, 1) end, "element 2 is not an attn.Tensor")
  end)
end)
