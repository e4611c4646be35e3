-- The notebook-size training step's short paths: a tiny CausalAttention /
-- MultiHeadAttention call recorded by one C call (attention_record), its
-- node's backward in one C call (attention_node_backward) that adds the
-- parameters' gradients into their existing .grad, and the backward walk of
-- a graph that is a chain. What they must keep of the general paths: the
-- node (name, edges), the saved-tensor checks, the bits of every gradient,
-- what autograd.grad and a parameter that no longer requires grad see. No
-- timing here (scripts/bench.lua's tiny_train case measures the speed).
local attn = require "attn"
local autograd = require "attn.autograd"
local core = require "attn.core"
local modules = core.modules

-- a + b rounded to float32 once, as a float32 add gives it
local function f32_add(a, b) return (string.unpack("f", string.pack("f", a + b))) end

local function flat(t) return t:reshape({ t:numel() }):totable() end

local function notebook_modules()
  attn.manual_seed(123)
  return {
    { "CausalAttention", attn.nn.CausalAttention(3, 2, 6, 0.0) },
    { "MultiHeadAttention", attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2) },
  }
end

local function batch()
  attn.manual_seed(7)
  return attn.stack({ attn.rand(6, 3), attn.rand(6, 3) }, 1)
end

describe("a tiny fused module call's recording", function()
  it("is a node of the generic recording's name and edges, whose backward is the C one", function()
    local x = batch()
    for _, case in ipairs(notebook_modules()) do
      local name, m = case[1], case[2]
      local y = m(x)
      local node = y.grad_fn
      assert.equals(name == "CausalAttention" and "UnsafeViewBackward0" or "ViewBackward0", node:name())
      assert.equals(modules.attention_node_backward, node._def.backward)
      -- x (no grad), the weights (leaves), then the mask buffer (no grad)
      local nf = node:next_functions()
      local nparams = #m:parameters()
      assert.equals(nparams + 2, #nf, name)
      assert.same({ nil, 0 }, nf[1])
      for i = 2, nparams + 1 do assert.same({ "AccumulateGrad", 0 }, nf[i]) end
      assert.same({ nil, 0 }, nf[nparams + 2])
      -- the edges: false for x, each weight itself (a leaf)
      local params = m:parameters()
      assert.is_false(node._edges[1])
      for i = 1, nparams do assert.is_true(rawequal(params[i], node._edges[i + 1]), name .. " edge " .. i) end
    end
  end)

  it("is MmBackward0 for a 2-D x, as the generic recording names it", function()
    attn.manual_seed(1)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    assert.equals("MmBackward0", m(attn.rand(6, 3)).grad_fn:name())
  end)

  it("draws dropout once per call, as the unrecorded call", function()
    attn.manual_seed(2)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.5)
    local x = batch()
    attn.manual_seed(9)
    local plain = attn.no_grad(function() return m(x) end)
    local after_plain = attn.rand(3)
    attn.manual_seed(9)
    local y = m(x)
    assert.equals(modules.attention_node_backward, y.grad_fn._def.backward)
    assert.same(flat(plain), flat(y))
    assert.same(flat(after_plain), flat(attn.rand(3)))
  end)
end)

describe("a tiny fused module call's backward", function()
  it("adds into the parameters' existing .grad in place: the same tensors, one Tensor:add_ write, old + new bits",
    function()
      local x = batch()
      for _, case in ipairs(notebook_modules()) do
        local name, m = case[1], case[2]
        local params = m:parameters()
        m(x):sum():backward()
        local before, objs, versions = {}, {}, {}
        for i, p in ipairs(params) do
          objs[i], before[i], versions[i] = p.grad, flat(p.grad), core._version(p.grad)
        end
        -- this step's gradients alone: autograd.grad writes no .grad
        local fresh = autograd.grad(m(x):sum(), params)
        for i, p in ipairs(params) do
          assert.is_true(rawequal(objs[i], p.grad), name .. " param " .. i)
          assert.same(before[i], flat(p.grad), name .. " param " .. i)
        end
        m(x):sum():backward()
        for i, p in ipairs(params) do
          assert.is_true(rawequal(objs[i], p.grad), name .. " param " .. i)
          local v, writer = core._version(p.grad)
          assert.equals(versions[i] + 1, v)
          assert.equals("Tensor:add_", writer)
          local got, g = flat(p.grad), flat(fresh[i])
          for e = 1, #got do assert.equals(f32_add(before[i][e], g[e]), got[e], name .. " param " .. i) end
        end
      end
    end)

  it("leaves the .grad of a parameter that no longer requires grad as it was", function()
    local x = batch()
    attn.manual_seed(4)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    m(x):sum():backward()
    local frozen = flat(m.W_key.weight.grad)
    local q = flat(m.W_query.weight.grad)
    m.W_key.weight:requires_grad_(false)
    m(x):sum():backward()
    assert.same(frozen, flat(m.W_key.weight.grad))
    local q2 = flat(m.W_query.weight.grad)
    for e = 1, #q do assert.equals(f32_add(q[e], q[e]), q2[e]) end
  end)

  it("adds into a .grad that is not contiguous through the walk, with the same sums", function()
    local x = batch()
    attn.manual_seed(4)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    local g = autograd.grad(m(x):sum(), { m.W_value.weight })[1]
    local start = attn.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } })
    local s = flat(start:t():contiguous())
    m.W_value.weight.grad = start:t() -- [2, 3], transposed
    m(x):sum():backward()
    local got, want = flat(m.W_value.weight.grad), flat(g)
    for e = 1, #got do assert.equals(f32_add(s[e], want[e]), got[e]) end
  end)

  it("gives x that requires grad its gradient and the parameters theirs, as module by module", function()
    local x = batch():requires_grad_()
    attn.manual_seed(4)
    local m = attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2)
    for _ = 1, 2 do m(x):sum():backward() end -- the second adds into every .grad
    local fused = { x.grad:clone() }
    for i, p in ipairs(m:parameters()) do fused[i + 1] = p.grad:clone() end
    x.grad = nil
    m:zero_grad()
    for _ = 1, 2 do m:forward(x, { need_weights = true }):sum():backward() end
    local ref = { x.grad }
    for i, p in ipairs(m:parameters()) do ref[i + 1] = p.grad end
    for i = 1, #ref do
      assert.is_true((fused[i] - ref[i]):abs():max():item() <= 2e-6, "gradient " .. i)
    end
  end)

  it("refuses a weight written in place after the forward, naming the node and the writer", function()
    local x = batch()
    attn.manual_seed(4)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    local y = m(x):sum()
    attn.no_grad(function() m.W_query.weight:add_(1) end)
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(err:find("attn.autograd: a tensor of shape [2, 3] saved by UnsafeViewBackward0 for its backward "
      .. "was modified in place by Tensor:add_", 1, true), err)
  end)

  it("refuses a second backward without retain_graph; with it, the second adds the same gradients", function()
    local x = batch()
    attn.manual_seed(4)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    local y = m(x):sum()
    y:backward(nil, { retain_graph = true })
    local once = flat(m.W_key.weight.grad)
    y:backward()
    local twice = flat(m.W_key.weight.grad)
    for e = 1, #once do assert.equals(f32_add(once[e], once[e]), twice[e]) end
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(err:find("trying to backward through the graph a second time", 1, true), err)
  end)
end)

describe("attn.core.modules.attention_backward with the node's edges and the .grad table", function()
  it("adds the gradient of each parameter whose edge is itself into its .grad and returns false for it", function()
    attn.manual_seed(6)
    local x = batch()
    local w = { attn.randn(2, 3), attn.randn(2, 3), attn.randn(2, 3) }
    local args = { x, 3, 6, 0, 1, 0.5, 0, w[1], nil, w[2], nil, w[3], nil, nil, nil, nil }
    local dout = attn.randn(2, 6, 2)
    local function call(...)
      local a = {}
      for i = 1, 16 do a[i] = args[i] end
      local extra = table.pack(...)
      for i = 1, extra.n do a[16 + i] = extra[i] end
      return table.pack(modules.attention_backward(table.unpack(a, 1, 16 + extra.n)))
    end
    local plain = call(dout, 0)
    local into = setmetatable({}, { __mode = "k" })
    local start = { attn.randn(2, 3), attn.randn(2, 3) }
    into[w[1]], into[w[3]] = start[1]:clone(), start[2]:clone()
    -- edges: x without grad, w[1] and w[3] leaves, w[2] not one (no .grad either)
    local edges = { false, w[1], false, w[3] }
    local r = call(dout, 0, nil, nil, nil, nil, nil, false, edges, into)
    assert.equals(9, r.n)
    assert.is_nil(r[1])
    assert.is_false(r[2])
    assert.same(flat(plain[4]), flat(r[4])) -- w[2]: its own tensor
    assert.is_false(r[6])
    for k, i in pairs({ [1] = 2, [2] = 6 }) do
      local got, s, g = flat(into[w[k == 1 and 1 or 3]]), flat(start[k]), flat(plain[i])
      for e = 1, #got do assert.equals(f32_add(s[e], g[e]), got[e]) end
    end
  end)
end)

describe("attention_record and attention_node_backward given what they do not take", function()
  it("name the function, the argument, what was expected and what came", function()
    local ok, err = pcall(modules.attention_record, {}, 5, {})
    assert.is_false(ok)
    assert.truthy(err:find("attn.core.modules.attention_record: bad argument #2 'Node' (expected a table, got number)",
      1, true), err)
    ok, err = pcall(modules.attention_node_backward, "node", attn.ones(1))
    assert.is_false(ok)
    assert.truthy(err:find("attn.core.modules.attention_node_backward: bad argument #1 'node' (expected a table, got "
      .. "string)", 1, true), err)
    ok, err = pcall(modules.attention_node_backward, {}, attn.ones(1))
    assert.is_false(ok)
    assert.truthy(err:find("attn.core.modules.attention_node_backward: bad argument #1 'node' (expected a node "
      .. "attention_record made)", 1, true), err)
  end)
end)

describe("the backward walk of a chain", function()
  local Function = autograd.Function

  it("gives the general walk's gradients, bit for bit", function()
    attn.manual_seed(8)
    local x = attn.randn(4, 5):requires_grad_()
    local function f() return ((x * 1.5):sin() * x:detach()):tanh():sum() end
    local want = autograd.grad(f(), { x })[1] -- autograd.grad walks the general way
    f():backward()
    assert.same(flat(want), flat(x.grad))
  end)

  it("runs the backward functions with grad mode off and restores it, also when one raises", function()
    local seen
    local probe = Function{
      name = "ProbeBackward", forward = function(_, a) return a * 2 end,
      backward = function(_, g)
        seen = attn.is_grad_enabled()
        return g * 2
      end,
    }
    local failing = Function{
      name = "FailingBackward", forward = function(_, a) return a * 1 end,
      backward = function() error("no gradient here") end,
    }
    local x = attn.ones(3):requires_grad_()
    probe(x):sum():backward()
    assert.is_false(seen)
    assert.is_true(attn.is_grad_enabled())
    assert.same({ 2, 2, 2 }, x.grad:totable())
    local ok, err = pcall(function() failing(x):sum():backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("Tensor:backward: .*no gradient here"), err)
    assert.is_true(attn.is_grad_enabled())
  end)

  it("gives zeros of its output's shape to a node that got no gradient", function()
    local got
    local inner = Function{
      name = "InnerBackward", forward = function(_, a) return a * 1 end,
      backward = function(_, g)
        got = g:totable()
        return g
      end,
    }
    local cut = Function{
      name = "CutBackward", forward = function(_, a) return a:sum() end,
      backward = function() return nil end,
    }
    local x = attn.ones(2):requires_grad_()
    cut(inner(x)):backward()
    assert.same({ 0, 0 }, got)
    assert.same({ 0, 0 }, x.grad:totable())
  end)

  it("leaves a graph with a node that feeds two others to the general walk, which sums both", function()
    local x = attn.tensor({ 1, 2 }):requires_grad_()
    local h = x * 3
    ((h * 2) + (h * 5)):sum():backward()
    assert.same({ 21, 21 }, x.grad:totable())
  end)
end)
