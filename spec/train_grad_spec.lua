-- Gradients of the training layers through attn's autograd against torch 1.13
-- autograd (fixtures: spec/fixtures/train_cases.lua, scripts/fixtures/make_train_fixtures.py):
-- layer_norm, gelu, cross_entropy and embedding record torch's grad_fn names
-- and give torch's input gradients; the fixture's model gives torch's
-- parameter gradients, and 5 AdamW steps follow torch's losses.
local attn = require "attn"
local nn = attn.nn
local F = nn.functional
local C = dofile("spec/fixtures/tensor_check.lua")
local FX = dofile("spec/fixtures/train_cases.lua")

local function near(got, want, rtol, what)
  assert(got ~= nil, (what or "value") .. " is nil")
  local m = 0
  for _, v in ipairs(want.data) do if v == v then m = math.max(m, math.abs(v)) end end
  return C.close(got, want, rtol, rtol * m, what)
end

local function leaf(fix) return C.T(fix):requires_grad_() end

describe("gradients of nn.functional against torch autograd", function()
  it("layer_norm: NativeLayerNormBackward0, dx, dweight, dbias", function()
    for i, c in ipairs(FX.layer_norm) do
      local x = leaf(c.x)
      local w, b = c.weight and leaf(c.weight), c.bias and leaf(c.bias)
      local y = F.layer_norm(x, c.x.shape[#c.x.shape], w, b, c.eps)
      assert.are.equal("NativeLayerNormBackward0", y.grad_fn:name())
      y:backward(C.T(c.dy))
      near(x.grad, c.dx, 1e-5, "dx " .. i)
      if w then
        near(w.grad, c.dweight, 1e-5, "dweight " .. i)
        near(b.grad, c.dbias, 1e-5, "dbias " .. i)
      end
    end
  end)

  it("layer_norm: only the weight requiring grad gets one", function()
    local c = FX.layer_norm[1]
    local x, w, b = C.T(c.x), leaf(c.weight), C.T(c.bias)
    F.layer_norm(x, 7, w, b, c.eps):backward(C.T(c.dy))
    near(w.grad, c.dweight, 1e-5, "dweight")
    assert.is_nil(x.grad)
    assert.is_nil(b.grad)
  end)

  it("gelu: GeluBackward0, both approximations", function()
    for _, c in ipairs(FX.gelu) do
      local x = leaf(c.x)
      local y = F.gelu(x, {approximate = c.approximate})
      assert.are.equal("GeluBackward0", y.grad_fn:name())
      y:backward(C.T(c.dy))
      near(x.grad, c.dx, 2e-6, c.approximate)
    end
  end)

  it("cross_entropy: torch's grad_fn (NllLossBackward0, AddBackward0 with smoothing) and d(loss)/d(logits)", function()
    for i, c in ipairs(FX.cross_entropy) do
      local x = leaf(c.logits)
      local loss = F.cross_entropy(x, C.T(c.target),
        {reduction = c.reduction, label_smoothing = c.label_smoothing, ignore_index = c.ignore_index})
      assert.are.equal(c.grad_fn, loss.grad_fn:name(), "case " .. i)
      loss:backward(C.T(c.grad))
      near(x.grad, c.dlogits, 2e-6, "case " .. i)
    end
  end)

  it("embedding: EmbeddingBackward0, repeated ids add up", function()
    local c = FX.embedding[1]
    local w = leaf(c.weight)
    local out = F.embedding(C.T(c.ids), w)
    assert.are.equal(c.grad_fn, out.grad_fn:name())
    out:backward(C.T(c.dy))
    C.exact(w.grad, c.dweight)
  end)

  it("records nothing when no input requires grad", function()
    local c = FX.gelu[1]
    local y = F.gelu(C.T(c.x))
    assert.is_false(y.requires_grad)
    assert.is_nil(y.grad_fn)
  end)
end)

describe("the fixture's model under autograd", function()
  local M = FX.model
  local function build()
    attn.manual_seed(M.seed)
    return nn.Sequential(nn.Embedding(11, 6), nn.LayerNorm(6), nn.Linear(6, 12), nn.GELU {approximate = "tanh"},
      nn.Linear(12, 11))
  end
  local function loss_of(m)
    return F.cross_entropy(m(C.T(M.ids)):reshape(-1, 11), C.T(M.target):reshape(-1))
  end

  it("every parameter's gradient is torch's (within 1e-5)", function()
    local m = build()
    for _, p in ipairs(m:parameters()) do assert.is_true(p.requires_grad) end
    local loss = loss_of(m)
    assert.are.equal("NllLossBackward0", loss.grad_fn:name())
    loss:backward()
    for i, p in ipairs(m:parameters()) do near(p.grad, M.grads[i], 1e-5, M.names[i]) end
  end)

  it("5 AdamW steps follow torch's losses (within 1e-5) and parameters (within 1e-5)", function()
    local m = build()
    local opt = attn.optim.AdamW(m:parameters(), {lr = 1e-2, weight_decay = 0.1})
    for step = 1, 5 do
      opt:zero_grad()
      local loss = loss_of(m)
      assert(math.abs(loss:item() - M.losses[step]) <= 1e-5 * M.losses[step],
        ("step %d: loss %.9g, torch %.9g"):format(step, loss:item(), M.losses[step]))
      loss:backward()
      opt:step()
    end
    for i, p in ipairs(m:parameters()) do near(p, M.final[i], 1e-5, M.names[i]) end
  end)
end)
