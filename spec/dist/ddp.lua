-- DistributedDataParallel against one process on the whole batch: the same
-- parameters after construction, the same gradients and losses (within
-- float rounding: the ranks' means are averaged), the same bits on every
-- rank, no_sync accumulation, and parameters unused on some ranks or all.
package.path = arg[0]:match("^(.*/)") .. "?.lua;" .. package.path
local attn = require "attn"
local dist = require "attn.dist"
local check = require "check"
local Module = require "attn.nn.Module"

local r, P = check.start()
local nn = attn.nn
local close = check.close

-- a model whose `extra` layer runs only when asked and `never` never runs
local Net = Module:extend("DDPSpecNet")
function Net:init()
  self:add_module("body", nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3)))
  self:add_module("extra", nn.Linear(3, 3))
  self:add_module("never", nn.Linear(3, 3))
end
function Net:forward(x, use_extra)
  local y = self.body(x)
  if use_extra then y = self.extra(y) end
  return y
end

local function fresh(seed)
  attn.manual_seed(seed)
  return Net()
end

local B = 6 -- global batch, divisible by 2 and 3
local share = B // P
local function batch(step)
  return check.data_of(step, 7, B, 4), check.data_of(step, 8, B, 3)
end
local function mine(x) return x:narrow(1, (r - 1) * share + 1, share) end
local function mse(a, b) return (a - b):pow(2):mean() end

-- construction: rank 1's parameters everywhere
local model = fresh(100 + r)
local ddp = dist.DistributedDataParallel(model, {bucket_mb = 0.0001}) -- several buckets
local ref = fresh(101)
for i, p in ipairs(model:parameters()) do
  close("construction broadcasts rank 1's parameter " .. i, p, ref:parameters()[i], 0)
end
check.report("ddp.module is the model", ddp.module == model)
check.report("fields pass through", ddp.body == model.body)
check.report("methods pass through", ddp:num_parameters() == model:num_parameters())

-- training steps: SGD on the shares against SGD on the whole batch
local opt = attn.optim.SGD(ddp:parameters(), {lr = 0.1, momentum = 0.9})
local ropt = attn.optim.SGD(ref:parameters(), {lr = 0.1, momentum = 0.9})
for step = 1, 4 do
  local x, y = batch(step)
  opt:zero_grad()
  local loss = mse(ddp(mine(x), step % 2 == 0), mine(y))
  loss:backward()
  ropt:zero_grad()
  local rloss = mse(ref(x, step % 2 == 0), y)
  rloss:backward()
  local global = dist.all_reduce(attn.tensor({loss:item()}), "avg")
  close(("step %d: the ranks' mean loss is the whole batch's"):format(step), global, attn.tensor({rloss:item()}), 1e-6)
  for i, p in ipairs(model:parameters()) do
    local rg = ref:parameters()[i].grad
    if rg == nil then
      check.report(("step %d: parameter %d unused on every rank keeps a nil grad"):format(step, i), p.grad == nil)
    else
      close(("step %d: gradient %d is the whole batch's"):format(step, i), p.grad, rg, 1e-5)
      local all = dist.all_gather(p.grad)
      for q = 2, P do close(("step %d: gradient %d has rank 1's bits on rank %d"):format(step, i, q), all[q], all[1], 0) end
    end
  end
  opt:step()
  ropt:step()
end
for i, p in ipairs(model:parameters()) do
  close("after 4 steps, parameter " .. i .. " is the single process's", p, ref:parameters()[i], 1e-5)
end

-- a parameter used on rank 1 only: the others count zeros (the average is
-- rank 1's gradient / P), as PyTorch's DDP
do
  local m = fresh(5)
  local d = dist.DistributedDataParallel(m)
  local x, y = batch(9)
  d(mine(x), r == 1):sum():backward()
  -- rank 1's gradient of extra.weight, computed here on every rank
  local solo = fresh(5)
  local x1 = x:narrow(1, 1, share)
  solo(x1, true):sum():backward()
  close("a parameter used on rank 1 only: its gradient averaged with zeros", m.extra.weight.grad,
    solo.extra.weight.grad / P, 1e-6)
end

-- no_sync: the first micro-batch accumulates locally, the second's backward
-- averages the sum
do
  local m = fresh(6)
  local d = dist.DistributedDataParallel(m)
  local solo = fresh(6)
  local x1, y1 = batch(11)
  local x2, y2 = batch(12)
  d:no_sync(function()
    mse(d(mine(x1)), mine(y1)):backward()
  end)
  local w = m.body[1].weight
  -- within no_sync the gradient is this rank's own
  local own = fresh(6)
  mse(own(mine(x1)), mine(y1)):backward()
  close("no_sync: the gradient stays local", w.grad, own.body[1].weight.grad, 0)
  mse(d(mine(x2)), mine(y2)):backward()
  mse(solo(x1), y1):backward()
  mse(solo(x2), y2):backward()
  close("no_sync then a synced backward: the average of the accumulated gradients", w.grad,
    solo.body[1].weight.grad, 1e-5)
end

-- a backward of a forward that did not go through the wrapper averages nothing
do
  local m = fresh(7)
  local _ = dist.DistributedDataParallel(m)
  local x = batch(13)
  m(mine(x)):sum():backward()
  local own = fresh(7)
  own(mine(x)):sum():backward()
  close("a forward around the wrapper: no averaging", m.body[1].weight.grad, own.body[1].weight.grad, 0)
end
