-- What a recorded op saves for its backward, and how what it saved is guarded
-- (PyTorch 1.13's derivatives.yaml and SavedVariable): an op saves a tensor
-- only when the formula of an input that needs a gradient reads it, so an
-- in-place change of anything else is allowed; an index or a mask a formula
-- keeps is a saved tensor, so changing it in place is an error at backward;
-- a second backward through nodes that saved nothing runs; autograd.grad
-- with the same input twice, unused inputs and allow_unused. Expected values
-- are PyTorch 1.13's (noted where they are not plain arithmetic).
local attn = require "attn"
local autograd = require "attn.autograd"

local function fails(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  for i = 1, select("#", ...) do
    local want = select(i, ...)
    assert.truthy(err:find(want, 1, true), ("error %q lacks %q"):format(err, want))
  end
  return err
end

local function x3() return attn.tensor({ 1, 2, 3 }, { requires_grad = true }) end

describe("in-place ops after an op that saved nothing for them, as PyTorch 1.13", function()
  it("y = x * 2; y:add_(1); y:add_(1): add_ saves nothing", function()
    local x = x3()
    local y = x * 2
    y:add_(1)
    y:add_(1)
    y:sum():backward()
    assert.same({ 2, 2, 2 }, x.grad:totable())
  end)

  it("y:mul_(3); y:mul_(3): mul_ by a number saves only the number", function()
    local x = x3()
    local y = x * 2
    y:mul_(3)
    y:mul_(3)
    y:sum():backward()
    assert.same({ 18, 18, 18 }, x.grad:totable())
  end)

  it("s:div_(2); s:masked_fill_(m, -inf): div_ by a number saves only the number", function()
    local x = x3()
    local s = x * 2
    s:div_(2)
    s:masked_fill_(attn.tensor({ 1, 0, 1 }):bool(), -math.huge)
    s:sum():backward()
    assert.same({ 0, 1, 0 }, x.grad:totable())
  end)

  it("y:add_(z); z:zero_(): add_ does not save its other operand", function()
    local x = x3()
    local z = attn.ones(3, { requires_grad = true }) * 1
    local y = x * 2
    y:add_(z)
    z:zero_()
    y:sum():backward()
    assert.same({ 2, 2, 2 }, x.grad:totable())
  end)

  it("y:div_(z) then y:add_(1): div_ keeps its own copy of y for z's gradient", function()
    local x = x3()
    local z = attn.tensor({ 2, 4, 5 }, { requires_grad = true })
    local y = x * 2
    y:div_(z)
    y:add_(1)
    y:sum():backward()
    -- torch 1.13: x.grad [1, 0.5, 0.4], z.grad [-0.5, -0.25, -0.24]
    local want_x, want_z = { 1, 0.5, 0.4 }, { -0.5, -0.25, -0.24 }
    for i, v in ipairs(x.grad:totable()) do assert.near(want_x[i], v, 1e-7) end
    for i, v in ipairs(z.grad:totable()) do assert.near(want_z[i], v, 1e-7) end
  end)

  it("y:mul_(x) runs: mul_ keeps a copy of y only when its other operand needs a gradient", function()
    local x = x3()
    local y = x * 1
    y:mul_(x)
    y:sum():backward()
    assert.same({ 2, 4, 6 }, x.grad:totable())
  end)

  it("exp saves its result: y = x:exp(); y:add_(1) is an error at backward", function()
    local x = x3()
    local y = x:exp()
    y:add_(1)
    fails(function() y:sum():backward() end, "saved by ExpBackward0", "modified in place by Tensor:add_")
  end)
end)

describe("an operand is saved only for the other operand's gradient, as PyTorch 1.13", function()
  it("x * a with a not requiring grad: changing x in place is allowed, changing a is an error", function()
    local x = x3()
    local a = attn.tensor({ 1, 2, 3 })
    local y = x * a
    x:detach():add_(1)
    y:sum():backward()
    assert.same({ 1, 2, 3 }, x.grad:totable())
    x.grad = nil
    local y2 = x * a
    a:add_(1)
    fails(function() y2:sum():backward() end, "saved by MulBackward0", "modified in place")
  end)

  it("a * x (the tensor on the right) likewise", function()
    local x = x3()
    local a = attn.tensor({ 1, 2, 3 })
    local y = a * x
    x:detach():add_(1)
    y:sum():backward()
    assert.same({ 1, 2, 3 }, x.grad:totable())
  end)

  it("a @ x with a not requiring grad: changing x in place is allowed", function()
    local x = x3()
    local a = attn.tensor({ { 1, 2, 3 } })
    local y = attn.matmul(a, x)
    x:detach():add_(1)
    y:sum():backward()
    assert.same({ 1, 2, 3 }, x.grad:totable())
  end)

  it("x / a: x is not saved (a is); a / x saves x", function()
    local x = x3()
    local a = attn.tensor({ 1, 2, 4 })
    local y = x / a
    x:detach():add_(1)
    y:sum():backward()
    assert.same({ 1, 0.5, 0.25 }, x.grad:totable())
    local y2 = a / x
    x:detach():add_(1)
    fails(function() y2:sum():backward() end, "modified in place")
  end)

  it("dot(a, x) with a not requiring grad: changing x in place is allowed", function()
    local x = x3()
    local a = attn.tensor({ 1, 2, 3 })
    local y = attn.dot(a, x)
    x:detach():add_(1)
    y:backward()
    assert.same({ 1, 2, 3 }, x.grad:totable())
  end)

  it("nn.Linear on x that does not require grad: an in-place change of the weight after the forward is "
    .. "allowed (torch 1.13: weight.grad 4 per element for ones [4, 3], 8 for ones [2, 4, 3])", function()
    for _, shape in ipairs({ { 4, 3 }, { 2, 4, 3 } }) do
      attn.manual_seed(1)
      local lin = attn.nn.Linear(3, 2)
      local y = lin(attn.ones(shape))
      attn.no_grad(function() lin.weight:add_(1) end)
      y:sum():backward()
      local want = #shape == 2 and 4 or 8
      for _, row in ipairs(lin.weight.grad:totable()) do assert.same({ want, want, want }, row) end
    end
  end)

  it("nn.Linear on x that requires grad: the weight is saved, its in-place change is an error", function()
    attn.manual_seed(1)
    local lin = attn.nn.Linear(3, 2)
    local y = lin(attn.ones(4, 3, { requires_grad = true }))
    attn.no_grad(function() lin.weight:add_(1) end)
    fails(function() y:sum():backward() end, "modified in place", "AddmmBackward0")
  end)

  it("functional.linear on x that does not require grad: the weight may change in place", function()
    attn.manual_seed(1)
    local w = attn.randn(2, 3, { requires_grad = true })
    local y = attn.nn.functional.linear(attn.ones(4, 3), w)
    attn.no_grad(function() w:add_(1) end)
    y:sum():backward()
    for _, row in ipairs(w.grad:totable()) do assert.same({ 4, 4, 4 }, row) end
  end)
end)

describe("the fused attention modules save what their backward reads", function()
  -- large enough that the forward keeps its state (no recomputation from the weights)
  local function setup(class)
    attn.manual_seed(3)
    local m = class == "MultiHeadAttention" and attn.nn.MultiHeadAttention(16, 16, 32, 0.0, 2)
      or attn.nn.CausalAttention(16, 16, 32, 0.0)
    attn.manual_seed(4)
    return m, attn.rand(4, 32, 16)
  end

  for _, class in ipairs({ "CausalAttention", "MultiHeadAttention" }) do
    it(class .. ": x not requiring grad, W_query and W_key changed in place after the forward: the gradients "
      .. "are those of the forward's values", function()
      local m, x = setup(class)
      m(x):sum():backward()
      local want = {}
      for _, np in ipairs(m:named_parameters()) do want[np[1]] = np[2].grad:clone() end
      m:zero_grad()
      local y = m(x)
      attn.no_grad(function()
        m.W_query.weight:mul_(2)
        m.W_key.weight:add_(1)
      end)
      y:sum():backward()
      for _, np in ipairs(m:named_parameters()) do
        assert.is_true(np[2].grad:equal(want[np[1]]), np[1])
      end
    end)

    it(class .. ": x requiring grad: W_query is saved (x's gradient reads it)", function()
      local m, x = setup(class)
      x:requires_grad_()
      local y = m(x)
      attn.no_grad(function() m.W_query.weight:mul_(2) end)
      fails(function() y:sum():backward() end, "modified in place")
    end)
  end

  it("MultiHeadAttention: out_proj's weight is always saved", function()
    local m, x = setup("MultiHeadAttention")
    local y = m(x)
    attn.no_grad(function() m.out_proj.weight:mul_(2) end)
    fails(function() y:sum():backward() end, "modified in place")
  end)
end)

describe("a second backward, as PyTorch 1.13", function()
  it("(x + x):sum() twice: nothing was saved, so it runs and the gradients add up", function()
    local x = x3()
    local y = (x + x):sum()
    y:backward()
    y:backward()
    assert.same({ 4, 4, 4 }, x.grad:totable())
  end)

  it("views, sums, cat and in-place adds save nothing either", function()
    local x = x3()
    local y = attn.cat({ x:view(3, 1), (x + 1):view(3, 1) }, 2)
    y:add_(1)
    local s = y:mean()
    s:backward()
    s:backward()
    for _, v in ipairs(x.grad:totable()) do assert.near(2 / 3, v, 1e-7) end
  end)

  it("(x * 2):sum() twice: the number was saved, so the second backward asks for retain_graph", function()
    local x = x3()
    local y = (x * 2):sum()
    y:backward()
    fails(function() y:backward() end, "second time", "retain_graph = true")
  end)
end)

describe("indices and masks are saved tensors, as PyTorch 1.13", function()
  it("masked_fill's mask changed in place", function()
    local x = x3()
    local m = attn.tensor({ 1, 0, 1 }):bool()
    local y = (x * 1):masked_fill(m, 0)
    m:zero_()
    fails(function() y:sum():backward() end, "saved by MaskedFillBackward0", "modified in place")
  end)

  it("masked_fill_'s mask changed in place", function()
    local x = x3()
    local m = attn.tensor({ 1, 0, 1 }):bool()
    local y = x * 1
    y:masked_fill_(m, 0)
    m:zero_()
    fails(function() y:sum():backward() end, "saved by MaskedFillBackward0", "modified in place")
  end)

  it("index_select's index changed in place (a table index is the op's own)", function()
    local x = x3()
    local i = attn.tensor({ 1, 3 })
    local y = x:index_select(1, i)
    i:fill_(2)
    fails(function() y:sum():backward() end, "saved by IndexSelectBackward0", "modified in place")
    local y2 = x:index_select(1, { 1, 3 })
    y2:sum():backward()
    assert.same({ 1, 0, 1 }, x.grad:totable())
  end)

  it("gather's index changed in place", function()
    local x = x3()
    local i = attn.tensor({ 1, 3 })
    local y = x:gather(1, i)
    i:fill_(2)
    fails(function() y:sum():backward() end, "saved by GatherBackward0", "modified in place")
  end)

  it("scatter_add_'s index changed in place when src needs a gradient; not saved when it does not", function()
    local src = attn.ones(1, 2, { requires_grad = true })
    local i = attn.tensor({ { 1, 3 } })
    local y = attn.zeros(1, 3):scatter_add_(2, i, src)
    i:fill_(2)
    fails(function() y:sum():backward() end, "saved by ScatterAddBackward0", "modified in place")
    local x = attn.tensor({ { 1, 2, 3 } }, { requires_grad = true })
    local i2 = attn.tensor({ { 1, 3 } })
    local y2 = (x * 1):scatter_add_(2, i2, attn.ones(1, 2))
    i2:fill_(2)
    y2:sum():backward()
    assert.same({ { 1, 1, 1 } }, x.grad:totable())
  end)

  it("sort's and topk's returned indices changed in place", function()
    local x = attn.tensor({ 3, 1, 2 }, { requires_grad = true })
    local v, i = x:sort()
    i:zero_()
    fails(function() v:sum():backward() end, "saved by SortBackward0", "modified in place")
    local v2, i2 = x:topk(2)
    i2:zero_()
    fails(function() v2:sum():backward() end, "saved by TopkBackward0", "modified in place")
  end)

  it("max and min along a dim: the returned indices changed in place", function()
    local x = attn.tensor({ { 3, 1, 2 } }, { requires_grad = true })
    local v, i = x:max(2)
    i:zero_()
    fails(function() v:sum():backward() end, "saved by MaxBackward0", "modified in place")
    local v2, i2 = x:min(2)
    i2:zero_()
    fails(function() v2:sum():backward() end, "saved by MinBackward0", "modified in place")
  end)

  it("embedding's ids changed in place", function()
    attn.manual_seed(1)
    local emb = attn.nn.Embedding(5, 3)
    local ids = attn.tensor({ 2, 3 })
    local y = emb(ids)
    ids:fill_(1)
    fails(function() y:sum():backward() end, "saved by EmbeddingBackward0", "modified in place")
  end)

  it("cross_entropy's target changed in place", function()
    attn.manual_seed(1)
    local logits = attn.randn(2, 3, { requires_grad = true })
    local target = attn.tensor({ 1, 3 })
    local loss = attn.nn.functional.cross_entropy(logits, target)
    target:fill_(2)
    fails(function() loss:backward() end, "saved by NllLossBackward0", "modified in place")
  end)

  it("clamp's tensor bound changed in place", function()
    local x = x3()
    local lo = attn.tensor({ 1.5, 1.5, 1.5 })
    local y = x:clamp(lo)
    lo:add_(5)
    fails(function() y:sum():backward() end, "saved by ClampBackward0", "modified in place")
  end)

  it("where's condition changed in place", function()
    local x = x3()
    local c = attn.tensor({ 1, 0, 1 }):bool()
    local y = attn.where(c, x, 0)
    c:zero_()
    fails(function() y:sum():backward() end, "saved by WhereBackward0", "modified in place")
  end)
end)

describe("autograd.grad's inputs, as PyTorch 1.13", function()
  it("the same leaf twice gets its gradient twice", function()
    local x = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local g = autograd.grad((x * x):sum(), { x, x })
    assert.same({ 2, 4, 6, 8 }, g[1]:totable())
    assert.same({ 2, 4, 6, 8 }, g[2]:totable())
  end)

  it("the same intermediate tensor twice, and a leaf after it", function()
    local x = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local w = x * 3
    local g = autograd.grad((w * w):sum(), { w, w, x })
    assert.same({ 6, 12, 18, 24 }, g[1]:totable())
    assert.same({ 6, 12, 18, 24 }, g[2]:totable())
    assert.same({ 18, 36, 54, 72 }, g[3]:totable())
  end)

  local UNUSED = "One of the differentiated Tensors appears to not have been used in the graph. "
    .. "Set allow_unused=True if this is the desired behavior"

  it("a leaf the outputs do not depend on is an error; with allow_unused its gradient is nil", function()
    local x = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local z = attn.ones(2, { requires_grad = true })
    local y = (x * x):sum()
    fails(function() autograd.grad(y, { z }, nil, { retain_graph = true }) end, "attn.autograd.grad", UNUSED)
    local g = autograd.grad(y, { z, x }, nil, { allow_unused = true })
    assert.is_nil(g[1])
    assert.same({ 2, 4, 6, 8 }, g[2]:totable())
  end)

  it("a chunk that got no gradient (its sibling did) is unused too", function()
    local x = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local p, q = (x * 1):chunk(2)
    local y = p:sum()
    fails(function() autograd.grad(y, { q }, nil, { retain_graph = true }) end, UNUSED)
    local g = autograd.grad(y, { q, x }, nil, { allow_unused = true })
    assert.is_nil(g[1])
    assert.same({ 1, 1, 0, 0 }, g[2]:totable())
  end)

  it("allow_unused takes a boolean; other options are still refused", function()
    local x = attn.tensor({ 1, 2 }, { requires_grad = true })
    local y = (x * x):sum()
    fails(function() autograd.grad(y, { x }, nil, { allow_unused = 1 }) end, "attn.autograd.grad", "allow_unused",
      "boolean")
    fails(function() autograd.grad(y, { x }, nil, { allow_unsed = true }) end, "unknown option 'allow_unsed'")
  end)
end)

-- A tensor made before an in-place write that gave memory it shares new
-- history (a view and its base): PyTorch 1.13 regenerates a view's grad_fn
-- from its base's new history; attn rebuilds it the same way, or refuses where
-- it cannot (never a gradient from the stale history). Expected gradients are
-- torch 1.13's for the same code.
describe("a view taken before its base is written in place", function()
  it("gets its history rebuilt from the base's, as PyTorch 1.13 regenerates its grad_fn", function()
    local a = x3()
    local b = a * 1
    local w = b:narrow(1, 1, 2)
    b:mul_(2)
    w:sum():backward()
    assert.same({ 2, 2, 0 }, a.grad:totable()) -- torch 1.13: [2, 2, 0]
  end)

  it("a view of a view is rebuilt through both, as PyTorch 1.13", function()
    local a = attn.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { requires_grad = true })
    local b = a * 1
    local w = b:transpose(1, 2)[2]
    b:mul_(a)
    w:sum():backward()
    assert.same({ { 0, 4, 0 }, { 0, 10, 0 } }, a.grad:totable()) -- torch 1.13: [[0, 4, 0], [0, 10, 0]]
  end)

  it("as the root of backward, of autograd.grad, and indexed", function()
    local a = x3()
    local b = a * 1
    local w = b:narrow(1, 1, 2)
    b:mul_(2)
    w:backward(attn.tensor({ 1, 10 }))
    assert.same({ 2, 20, 0 }, a.grad:totable()) -- torch 1.13: [2, 20, 0]
    a = x3()
    b = a * 1
    w = b:narrow(1, 1, 2)
    b:mul_(2)
    assert.same({ 2, 2, 0 }, autograd.grad(w:sum(), { a })[1]:totable()) -- torch 1.13: [2, 2, 0]
    a = x3()
    b = a * 1
    w = b:narrow(1, 1, 2)
    b:mul_(a)
    assert.same({ 0, 4, 0 }, autograd.grad(w:select(1, 2), { a })[1]:totable()) -- torch 1.13 (w[1]): [0, 4, 0]
  end)

  it("keeps its history when the base was written inside no_grad, as PyTorch 1.13", function()
    local a = x3()
    local b = a * 1
    local w = b:narrow(1, 1, 2)
    attn.no_grad(function() b:mul_(2) end)
    w:sum():backward()
    assert.same({ 1, 1, 0 }, a.grad:totable()) -- torch 1.13: [1, 1, 0]
  end)

  it("an output of chunk is refused at use, as PyTorch 1.13", function()
    local a = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local b = a * 1
    local _, q = b:chunk(2)
    local qq = q:narrow(1, 1, 1)
    b:mul_(3)
    fails(function() return q * q end, "attn.mul", "Output 1 of SplitBackward0 is a view and its base",
      "as PyTorch 1.13")
    fails(function() return qq:sum() end, "attn.sum", "Output 1 of SplitBackward0")
  end)

  -- torch 1.13 computes these (c's history through CopySlices; w's regenerated
  -- from c's new one); attn refuses them rather than use c or w without history
  it("writing a tensor that requires grad into a view of a tensor without history: the base is refused at use",
    function()
    local x = x3()
    local c = attn.zeros(4)
    c:narrow(1, 1, 3):add_(x)
    -- torch 1.13: (c * c).sum().backward() gives x.grad [2, 4, 6]
    fails(function() (c * c):sum():backward() end, "attn.mul", "shares memory with a tensor that Tensor:add_ wrote",
      "take views after the in-place operation", "clone()")
    fails(function() c:backward(attn.ones(4)) end, "Tensor:backward", "shares memory")
    fails(function() return c:narrow(1, 2, 1) end, "Tensor:narrow", "shares memory")
  end)

  it("a view taken without history before its base got history is refused at use", function()
    local x = x3()
    local c = attn.zeros(4)
    local w = c:narrow(1, 1, 2)
    c:add_(x:sum())
    -- torch 1.13: (w.sum() + c.sum()).backward() gives x.grad [6, 6, 6]
    fails(function() return w:sum() + c:sum() end, "attn.sum", "a tensor of shape [2] shares memory",
      "Tensor:add_")
    assert.same({ 4, 4, 4 }, autograd.grad(c:sum(), { x })[1]:totable()) -- the written base itself is current
  end)

  it("plain code, no_grad writes, optimizer steps and detached aliases are unaffected", function()
    local x = x3()
    local c = attn.zeros(4)
    c:narrow(1, 1, 3):add_(attn.ones(3)) -- nothing requires grad: no history to lose
    attn.no_grad(function() c:narrow(1, 2, 3):add_(x) end)
    assert.same({ 1, 2, 3, 3 }, c:totable())
    autograd.grad((c:narrow(1, 1, 3) * x):sum(), { x })
    local p = attn.tensor({ 1, 2, 3 }, { requires_grad = true })
    local v = p:narrow(1, 2, 2)
    local opt = attn.optim.SGD({ p }, { lr = 0.5 })
    v:sum():backward()
    opt:step()
    opt:zero_grad()
    v:sum():backward()
    assert.same({ 0, 1, 1 }, p.grad:totable())
    -- torch 1.13: d = zeros(3); e = d.detach(); e.add_(x); (d * x).sum().backward() gives x.grad [1, 2, 3]
    local d = attn.zeros(3)
    local e = d:detach()
    e:add_(x)
    assert.same({ 1, 2, 3 }, autograd.grad((d * x):sum(), { x })[1]:totable())
  end)
end)

describe("what mean saves, as PyTorch 1.13", function()
  it("mean along a dim saves its input: writing it in place is an error at backward (torch 1.13 raises)", function()
    local x = attn.ones(2, 2, { requires_grad = true })
    local y = x * 1
    local z = y:mean(2)
    y:mul_(2)
    fails(function() z:sum():backward() end, "saved by MeanBackward1", "modified in place by Tensor:mul_")
  end)

  it("mean of all elements saves nothing (torch 1.13 computes)", function()
    local x = attn.ones(2, 2, { requires_grad = true })
    local y = x * 1
    local z = y:mean()
    y:mul_(2)
    z:backward()
    assert.same({ { 0.25, 0.25 }, { 0.25, 0.25 } }, x.grad:totable())
  end)
end)

describe("a detached alias is a base of its own, as PyTorch 1.13's detach()", function()
  it("writing a tensor that requires grad into a view of it: the alias is refused at use", function()
    local a = attn.tensor({ 1, 2, 3, 4 }, { requires_grad = true })
    local d = a:detach()
    local v = d:narrow(1, 2, 1)
    local y = attn.tensor({ 5 }, { requires_grad = true })
    v:add_(y)
    -- torch 1.13: d.mean() then has history (CopySlices): y.grad 0.25
    fails(function() return d:mean() end, "attn.mean", "shares memory with a tensor that Tensor:add_ wrote")
    -- a itself shares the memory but not the history: a leaf still, as in torch 1.13
    autograd.grad((a * 2):sum(), { a })
  end)
end)
