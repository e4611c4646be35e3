-- Gradients of clamp, var/std, where, cumsum, indexing, splitting and sorting
-- ops and erf/sin/cos (lua/attn/autograd/indexing_stats_ops.lua) against
-- torch autograd (spec/fixtures/indexing_stats_ops_grad_cases.lua, written by
-- scripts/fixtures/make_indexing_stats_ops_fixtures.py): x.grad after y:backward(g), and the
-- grad_fn name PyTorch 1.13 prints.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local G = dofile("spec/fixtures/indexing_stats_ops_grad_cases.lua")
local T = C.T

-- fixture values as a leaf that requires grad
local function leaf(fix) return T(fix):requires_grad_() end

-- How each case calls its op (the fixture's names: x, a, b, lo, hi, src).
local CALLS = {
  erf = function(i) return i.x:erf() end,
  sin = function(i) return attn.sin(i.x) end,
  cos = function(i) return i.x:cos() end,
  clamp = function(i, c) return i.x:clamp(c.min, c.max) end,
  clamp_min = function(i, c) return attn.clamp(i.x, c.min) end,
  clamp_tensors = function(i) return i.x:clamp(i.lo, i.hi) end,
  var_all = function(i) return i.x:var() end,
  std_all_biased = function(i) return i.x:std { unbiased = false } end,
  var_dim = function(i, c) return i.x:var(c.dim) end,
  std_dim_keepdim = function(i, c) return attn.std(i.x, c.dim, true) end,
  where = function(i, c) return attn.where(T(c.cond), i.a, i.b) end,
  cumsum = function(i, c) return i.x:cumsum(c.dim) end,
  index_select = function(i, c) return i.x:index_select(c.dim, T(c.index)) end,
  gather = function(i, c) return i.x:gather(c.dim, T(c.index):totable()) end,
  scatter_add = function(i, c) return (i.x * 1):scatter_add_(c.dim, T(c.index), i.src) end,
  chunk = function(i, c) return i.x:chunk(c.chunks, c.dim) end,
  split_sizes = function(i, c) return i.x:split(c.sizes, c.dim) end,
  split = function(i, c) return attn.split(i.x, c.size, c.dim) end,
  repeat_interleave = function(i, c) return i.x:repeat_interleave(T(c.repeats), c.dim) end,
  repeat_interleave_flat = function(i, c) return i.x:repeat_interleave(c.repeats) end,
  topk = function(i, c) return (i.x:topk(c.k, c.dim)) end,
  topk_smallest = function(i, c) return (i.x:topk(c.k, c.dim, false)) end,
  sort = function(i, c) return (i.x:sort(c.dim, c.descending)) end,
}

-- one gradient formula per side, in float: a few ulps of the largest term
local RTOL, ATOL = 2e-6, 1e-6

describe("gradients of clamp, var/std, where, cumsum, the indexing, splitting and sorting ops and erf/sin/cos against torch autograd", function()
  local names = {}
  for _, c in ipairs(G) do
    names[c.name] = true
    it(c.name .. " (" .. c.grad_fn .. ")", function()
      local call = assert(CALLS[c.name], "no call for " .. c.name)
      local inputs = {}
      for name, fix in pairs(c.inputs) do inputs[name] = leaf(fix) end
      local outs = { call(inputs, c) }
      assert.are.equal(#c.g, #outs)
      assert.are.equal(c.grad_fn, outs[1].grad_fn:name())
      local grads = {}
      for k, g in ipairs(c.g) do grads[k] = T(g) end
      local got = attn.autograd.grad(outs, (function()
        local list = {}
        for name in pairs(c.inputs) do list[#list + 1] = inputs[name] end
        return list
      end)(), grads, { retain_graph = true })
      local k = 0
      for name in pairs(c.inputs) do
        k = k + 1
        C.close(got[k], c.grads[name], RTOL, ATOL, c.name .. ": grad of " .. name)
      end
      -- and through .grad, for the first output
      if #outs == 1 then
        outs[1]:backward(grads[1])
        for name in pairs(c.inputs) do C.close(inputs[name].grad, c.grads[name], RTOL, ATOL, name .. ".grad") end
      end
    end)
  end

  it("covers every differentiable op of the issue", function()
    for _, n in ipairs { "erf", "sin", "cos", "clamp", "clamp_tensors", "var_all", "std_all_biased", "where",
      "cumsum", "index_select", "gather", "scatter_add", "chunk", "split", "split_sizes", "repeat_interleave",
      "topk", "sort" } do
      assert.is_true(names[n] == true, n)
    end
  end)
end)

describe("clamp, var/std, where, cumsum, indexing and sorting ops under autograd", function()
  it("mark indices as not differentiable and leave argsort unrecorded", function()
    local x = attn.tensor({ 3, 1, 2 }, { requires_grad = true })
    local v, i = x:sort()
    assert.is_true(v.requires_grad)
    assert.is_false(i.requires_grad)
    assert.is_false(x:argsort().requires_grad)
    local tv, ti = x:topk(2)
    assert.is_true(tv.requires_grad)
    assert.is_false(ti.requires_grad)
  end)

  it("record nothing when no input requires grad, and give the same values", function()
    local x = attn.tensor { 0.5, -2, 1 }
    local y = x:clamp(-1, 1)
    assert.is_false(y.requires_grad)
    C.is(y, { 3 }, { 0.5, -1, 1 })
    local r = attn.tensor({ 0.5, -2, 1 }, { requires_grad = true }):clamp(-1, 1)
    assert.are.equal("ClampBackward1", r.grad_fn:name())
    C.is(r:detach(), { 3 }, { 0.5, -1, 1 })
  end)

  it("scatter_add_ in place on a tensor that requires grad is the engine's error, naming scatter_add_", function()
    local x = attn.zeros(2, 3, { requires_grad = true })
    C.fails(function() return x:scatter_add_(2, { { 1 } }, attn.ones(1, 1)) end, "scatter_add_")
  end)

  it("clamp_ on a non-leaf records ClampBackward1 with clamp's gradient, and is refused on a leaf", function()
    local c
    for _, e in ipairs(G) do if e.name == "clamp" then c = e end end
    local x = leaf(c.inputs.x)
    local y = x * 1
    assert.are.equal(y, y:clamp_(c.min, c.max))
    assert.are.equal("ClampBackward1", y.grad_fn:name())
    y:backward(T(c.g[1]))
    C.close(x.grad, c.grads.x, RTOL, ATOL, "clamp_")
    C.fails(function() return x:clamp_(0, 1) end, "Tensor:clamp_", "leaf")
  end)

  it("clamp_ and scatter_add_ bump the version: a saved tensor they change is an error at backward", function()
    local x = attn.tensor({ 0.5, 2, -1 }, { requires_grad = true })
    local y = x * 1
    local z = y:sin()
    y:clamp_(0, 1)
    C.fails(function() z:sum():backward() end, "modified in place by Tensor:clamp_")
    local w = x * 1
    local v = w:cos()
    w:scatter_add_(1, { 1 }, attn.ones(1))
    C.fails(function() v:sum():backward() end, "modified in place by Tensor:scatter_add_")
  end)

  it("the split pieces' gradients land in their part of x, zeros for pieces not used", function()
    local x = attn.zeros(2, 4, { requires_grad = true })
    local _, b = x:split(1, 1)
    local loss = (b * 3):sum()
    loss:backward()
    C.is(x.grad, { 2, 4 }, { 0, 0, 0, 0, 3, 3, 3, 3 })
  end)
end)
