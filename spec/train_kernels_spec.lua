-- The raw training kernels of attn.core.train (src/core/layernorm.c, gelu.c,
-- cross_entropy.c, embedding.c, optim.c) against PyTorch 1.13 (fixtures:
-- spec/fixtures/train_cases.lua, written by scripts/fixtures/make_train_fixtures.py):
-- forward and backward of LayerNorm, GELU, cross entropy and embedding within
-- a few float32 ulps, the optimizers' parameters after each of 5 steps bit for
-- bit, clip_grad_norm_'s total norm and clipped gradients; bad input raises
-- worded errors; results do not depend on the thread count.
local attn = require "attn"
local T = require("attn.core").train
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/train_cases.lua")

-- |got - want| <= rtol * (|want| + max |want|): relative, with the scale of the
-- whole tensor for elements that cancel to near zero
local function near(got, want, rtol, what)
  local m = 0
  for _, v in ipairs(want.data) do
    if v == v and math.abs(v) ~= math.huge then m = math.max(m, math.abs(v)) end
  end
  return C.close(got, want, rtol, rtol * m, what)
end

local function opt_T(fix) return fix and C.T(fix) or nil end

describe("attn.core.train.layer_norm", function()
  for i, c in ipairs(F.layer_norm) do
    it(("case %d: forward and backward as torch (shape [%s], affine %s)"):format(i,
        table.concat(c.x.shape, ", "), tostring(c.weight ~= nil)), function()
      local x, w, b = C.T(c.x), opt_T(c.weight), opt_T(c.bias)
      local y, mean, rstd = T.layer_norm(x, w, b, c.eps)
      near(y, c.y, 2e-6, "y")
      local dx, dw, db = T.layer_norm_backward(C.T(c.dy), x, mean, rstd, w, true, w ~= nil, b ~= nil)
      near(dx, c.dx, 1e-5, "dx")
      if w then near(dw, c.dweight, 1e-5, "dweight") else assert.is_nil(dw) end
      if b then near(db, c.dbias, 1e-5, "dbias") else assert.is_nil(db) end
    end)
  end

  it("gives only the gradients asked for", function()
    local c = F.layer_norm[1]
    local x, w, b = C.T(c.x), C.T(c.weight), C.T(c.bias)
    local _, mean, rstd = T.layer_norm(x, w, b, c.eps)
    local dx, dw, db = T.layer_norm_backward(C.T(c.dy), x, mean, rstd, w, false, true, false)
    assert.is_nil(dx)
    assert.is_nil(db)
    near(dw, c.dweight, 1e-5, "dweight")
  end)

  it("takes strided inputs", function()
    local c = F.layer_norm[2]
    local x = C.T(c.x)                                   -- [130, 20]
    local xt = x:t():contiguous():t()                    -- same values, transposed strides
    local y = T.layer_norm(xt, C.T(c.weight), C.T(c.bias), c.eps)
    near(y, c.y, 2e-6, "y")
  end)

  it("raises worded errors", function()
    local x = attn.ones(2, 3)
    C.fails(function() T.layer_norm(x, attn.ones(4), nil, 1e-5) end, "attn.core.train.layer_norm",
      "'weight' of shape [4] does not fit input [2, 3] (expected [3])")
    C.fails(function() T.layer_norm(x, nil, attn.ones(2, 3), 1e-5) end, "'bias' of shape [2, 3]")
    C.fails(function() T.layer_norm(attn.tensor(1), nil, nil, 1e-5) end, "at least 1 dim")
    C.fails(function() T.layer_norm(x, nil, nil, -1) end, "bad option 'eps'")
    C.fails(function() T.layer_norm("x", nil, nil, 1e-5) end, "bad argument #1 'input' (expected attn.Tensor, got string)")
    C.fails(function() T.layer_norm(x, attn.ones(4), nil, 1e-5, "attn.nn.functional.layer_norm") end,
      "attn.nn.functional.layer_norm: 'weight'")
  end)
end)

describe("attn.core.train.gelu", function()
  for _, c in ipairs(F.gelu) do
    it(("approximate %q: forward and backward as torch"):format(c.approximate), function()
      local x = C.T(c.x)
      near(T.gelu(x, c.approximate), c.y, 2e-6, "y")
      near(T.gelu_backward(C.T(c.dy), x, c.approximate), c.dx, 2e-6, "dx")
    end)
  end

  it("vector lanes and scalar tails give the same bits (the input shifted by 1 to 7 elements)", function()
    local x = C.lcg_tensor(11, 9, 1037)
    for _, a in ipairs({"none", "tanh"}) do
      local y, dx = T.gelu(x, a), T.gelu_backward(x, x, a)
      for shift = 1, 7 do
        local xs = x:narrow(1, shift + 1, 1037 - shift):contiguous()
        C.same_bits(T.gelu(xs, a), y:narrow(1, shift + 1, 1037 - shift), a .. " y, shift " .. shift)
        C.same_bits(T.gelu_backward(xs, xs, a), dx:narrow(1, shift + 1, 1037 - shift), a .. " dx, shift " .. shift)
      end
    end
  end)

  it("raises worded errors", function()
    C.fails(function() T.gelu(attn.ones(2), "fast") end, "bad option 'approximate' (expected \"none\" or \"tanh\", got fast)")
    C.fails(function() T.gelu_backward(attn.ones(3), attn.ones(2), "none") end, "'grad' of shape [3] does not match x [2]")
  end)
end)

describe("attn.core.train.cross_entropy", function()
  for i, c in ipairs(F.cross_entropy) do
    it(("case %d: reduction %s, label_smoothing %g, ignore_index %d as torch"):format(i, c.reduction,
        c.label_smoothing, c.ignore_index), function()
      local logits, target = C.T(c.logits), C.T(c.target)
      local loss, lse, counted = T.cross_entropy(logits, target, c.ignore_index, c.reduction, c.label_smoothing)
      near(loss, c.loss, 2e-6, "loss")
      local expect_counted = 0
      for _, t in ipairs(c.target.data) do if t ~= c.ignore_index then expect_counted = expect_counted + 1 end end
      assert.are.equal(expect_counted, counted)
      local dl = T.cross_entropy_backward(C.T(c.grad), logits, target, lse, c.ignore_index, c.reduction,
        c.label_smoothing)
      near(dl, c.dlogits, 2e-6, "dlogits")
    end)
  end

  it("rows longer than one vector chunk (C = 600): loss and gradient equal a double-precision computation", function()
    local n, c = 3, 600
    local logits = C.lcg_tensor(21, 20, n, c)
    local target = attn.tensor {1, 600, 257}
    local loss, lse = T.cross_entropy(logits, target, -100, "sum", 0.1)
    local dl = T.cross_entropy_backward(attn.tensor(1), logits, target, lse, -100, "sum", 0.1)
    local x, d = C.flat(logits), C.flat(dl)
    local total = 0
    for i = 0, n - 1 do
      local m, s, sx = -math.huge, 0, 0
      for j = 1, c do m = math.max(m, x[i * c + j]) end
      for j = 1, c do s = s + math.exp(x[i * c + j] - m); sx = sx + x[i * c + j] end
      local l = m + math.log(s)
      local t = target[i + 1]
      total = total + 0.9 * (l - x[i * c + t]) + 0.1 / c * (c * l - sx)
      for j = 1, c do
        local want = math.exp(x[i * c + j] - l) - 0.1 / c - (j == t and 0.9 or 0)
        assert(math.abs(d[i * c + j] - want) <= 1e-6, ("dlogits[%d][%d] = %.9g, expected %.9g"):format(i + 1, j, d[i * c + j], want))
      end
    end
    assert(math.abs(loss:item() - total) <= 1e-6 * total, ("loss %.9g, expected %.9g"):format(loss:item(), total))
  end)

  it("takes logits [..., C] with target [...]", function()
    local c = F.cross_entropy[5] -- reduction none, no smoothing, [6, 5]
    local logits, target = C.T(c.logits):view(2, 3, 5), C.T(c.target):view(2, 3)
    local loss = T.cross_entropy(logits, target, c.ignore_index, "none", c.label_smoothing)
    near(loss:view(6), c.loss, 2e-6, "loss")
  end)

  it("raises worded errors for bad targets and options", function()
    local logits = attn.zeros(3, 4)
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 2, 5}, -100, "mean", 0) end,
      "attn.core.train.cross_entropy: target[3] = 5 is out of range (class ids are 1 to 4)")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 0, 2}, -100, "mean", 0) end,
      "target[2] = 0 is out of range")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 1.5, 2}, -100, "mean", 0) end,
      "target[2] = 1.5 is not an integer class id")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 0 / 0, 2}, -100, "mean", 0) end, "target[2]")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 2}, -100, "mean", 0) end,
      "'target' of shape [2] does not fit input [3, 4] (expected [3]: one class id per row)")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 2, 3}, -100, "avg", 0) end,
      "bad option 'reduction' (expected \"mean\", \"sum\" or \"none\", got avg)")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 2, 3}, -100, "mean", 1.5) end,
      "bad option 'label_smoothing' (expected a number in [0, 1]")
    C.fails(function() T.cross_entropy(logits, attn.tensor{1, 2, 9}, -100, "mean", 0, "my.loss") end, "my.loss: target[3]")
  end)
end)

describe("attn.core.train.embedding", function()
  local c = F.embedding[1]
  it("gathers rows and scatter-adds their gradients as torch (repeated ids)", function()
    local w, ids = C.T(c.weight), C.T(c.ids)
    C.exact(T.embedding(w, ids), c.out, "out")
    C.exact(T.embedding_backward(C.T(c.dy), ids, w:size(1)), c.dweight, "dweight")
  end)

  it("raises worded errors for bad ids", function()
    local w = attn.zeros(5, 2)
    C.fails(function() T.embedding(w, attn.tensor{1, 6}) end,
      "attn.core.train.embedding: ids[2] = 6 is out of range (ids are 1 to 5)")
    C.fails(function() T.embedding(w, attn.tensor{{1, 2}, {0, 1}}) end, "ids[3] = 0 is out of range")
    C.fails(function() T.embedding(w, attn.tensor{2.5}) end, "ids[1] = 2.5 is not an integer token id")
    C.fails(function() T.embedding(w, attn.tensor{math.huge}) end, "ids[1] = inf is out of range")
    C.fails(function() T.embedding(attn.zeros(5), attn.tensor{1}) end, "'weight' must be 2-D")
    C.fails(function() T.embedding_backward(attn.zeros(2, 3), attn.tensor{1, 2, 3}, 4) end,
      "'grad' of shape [2, 3] does not fit ids [3]")
  end)
end)

describe("attn.core.train optimizer steps", function()
  -- the Lua-side driver of one optimizer, written from torch's algorithm (the
  -- state and step counting; the arithmetic is the kernel's)
  local function run(c)
    local o = c.opts
    local params = {C.T(c.params[1]), C.T(c.params[2])}
    local state = {}
    for step = 1, 5 do
      for k, p in ipairs(params) do
        local grad = C.T(c.grads[step][k])
        if c.name == "SGD" then
          local momentum = o.momentum or 0
          local buf = state[k]
          local first = buf == nil and momentum ~= 0
          if first then buf = attn.zeros_like(p); state[k] = buf end
          T.sgd_step(p, grad, momentum ~= 0 and buf or nil, first, o.lr, momentum, o.dampening or 0,
            o.weight_decay or 0, o.nesterov or false)
        else
          local s = state[k] or {m = attn.zeros_like(p), v = attn.zeros_like(p), step = 0}
          state[k] = s
          s.step = s.step + 1
          local betas = o.betas or {0.9, 0.999}
          local wd = o.weight_decay or (c.name == "AdamW" and 1e-2 or 0)
          T.adam_step(p, grad, s.m, s.v, s.step, o.lr, betas[1], betas[2], o.eps or 1e-8, wd, c.name == "AdamW")
        end
        C.exact(p, c.after[step][k], ("%s step %d param %d"):format(c.name, step, k))
      end
    end
  end
  for i, c in ipairs(F.optim) do
    local desc = {}
    for k, v in pairs(c.opts) do desc[#desc + 1] = k .. "=" .. (type(v) == "table" and table.concat(v, "/") or tostring(v)) end
    table.sort(desc)
    it(("case %d: %s{%s}: parameters after each of 5 steps are torch's bits"):format(i, c.name,
        table.concat(desc, ", ")), function() run(c) end)
  end

  it("raise worded errors", function()
    local p = attn.zeros(4)
    C.fails(function() T.adam_step(p, attn.zeros(5), attn.zeros(4), attn.zeros(4), 1, 1e-3, 0.9, 0.999, 1e-8, 0, false) end,
      "'grad' of shape [5] does not match the parameter [4]")
    C.fails(function() T.adam_step(p, attn.zeros(4), attn.zeros(4), attn.zeros(4), 0, 1e-3, 0.9, 0.999, 1e-8, 0, false) end,
      "step must be >= 1, got 0")
    C.fails(function() T.sgd_step(attn.zeros(2, 2):t(), attn.zeros(2, 2), nil, false, 0.1, 0, 0, 0, false) end,
      "'param' must be a contiguous tensor")
    C.fails(function() T.sgd_step(p, attn.zeros(4), nil, false, 0.1, 0.9, 0, 0, false) end,
      "a momentum buffer is needed")
  end)
end)

describe("attn.core.train.clip_grad_norm_coef", function()
  for i, c in ipairs(F.clip) do
    it(("case %d: max_norm %g: total norm and clipped gradients as torch"):format(i, c.max_norm), function()
      local grads = {C.T(c.grads[1]), C.T(c.grads[2])}
      local total, coef = T.clip_grad_norm_coef(grads, c.max_norm)
      assert(math.abs(total - c.total_norm) <= 1e-6 * c.total_norm, ("total %.9g, torch %.9g"):format(total, c.total_norm))
      for k, gr in ipairs(grads) do near(gr:mul(coef), c.clipped[k], 1e-6, "clipped grad " .. k) end
    end)
  end
  it("raises worded errors", function()
    C.fails(function() T.clip_grad_norm_coef({attn.zeros(2), "g"}, 1) end, "gradient #2 is not an attn.Tensor (got string)")
    C.fails(function() T.clip_grad_norm_coef(attn.zeros(2), 1) end, "bad argument #1 'grads'")
  end)
end)

describe("attn.core.train thread counts", function()
  it("OMP_NUM_THREADS=1 and 2 give the same bits for every kernel at sizes that run in parallel", function()
    local script = [[
      local attn = require "attn"
      local T = require("attn.core").train
      local C = dofile("spec/fixtures/tensor_check.lua")
      local x = C.lcg_tensor(1, 3, 300, 130)
      local w, b = C.lcg_tensor(2, 1, 130), C.lcg_tensor(3, 1, 130)
      local dy = C.lcg_tensor(4, 1, 300, 130)
      local y, m, r = T.layer_norm(x, w, b, 1e-5)
      local dx, dw, db = T.layer_norm_backward(dy, x, m, r, w, true, true, true)
      local g1, g2 = T.gelu(x, "none"), T.gelu_backward(dy, x, "tanh")
      local list = {}
      for i, v in ipairs(C.lcg(5, 300)) do list[i] = math.floor((v + 1) * 64) + 1 end
      local ids = attn.tensor(list)
      local tgt = ids
      local loss, lse = T.cross_entropy(x, tgt, -100, "mean", 0.1)
      local dl = T.cross_entropy_backward(attn.tensor(1), x, tgt, lse, -100, "mean", 0.1)
      local e = T.embedding(x, ids)
      local de = T.embedding_backward(dy, ids, 300)
      local p, ma, va = x:clone(), attn.zeros(300, 130), attn.zeros(300, 130)
      for s = 1, 3 do T.adam_step(p, dy, ma, va, s, 1e-3, 0.9, 0.999, 1e-8, 0.01, true) end
      local sum = 0
      for _, t in ipairs({y, dx, dw, db, g1, g2, loss, dl, e, de, p, ma, va}) do
        for i, h in ipairs(C.bits(t:reshape(-1))) do sum = (sum * 31 + tonumber(h, 16) + i) % 4294967291 end
      end
      print(sum)
      print("END")
    ]]
    script = script:gsub("\n%s*", " ")
    assert.are.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)
