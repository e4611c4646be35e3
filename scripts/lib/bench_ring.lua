-- The ring attention cases of scripts/bench_dist.lua: dist.ring_attention on
-- bench.lua's B_causal shape (b 1, h 8, n 4096, E 64, causal), each rank its
-- chunk, against the whole sequence's scaled_dot_product_attention in one
-- process. `ms` is the best of reps of the slowest rank (barrier to barrier),
-- `gflops` counts the dense-equivalent 4*b*h*n*n*e (bench.lua's convention),
-- with backward 14*b*h*n*n*e (bench.lua's *_bwd cases).
local attn = require "attn"

local M = {}

M.shape = { b = 1, h = 8, n = 4096, e = 64, causal = true }

local function inputs(requires_grad)
  local s = M.shape
  attn.manual_seed(1)
  local q, k, v = attn.randn(s.b, s.h, s.n, s.e), attn.randn(s.b, s.h, s.n, s.e), attn.randn(s.b, s.h, s.n, s.e)
  if requires_grad then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
  return q, k, v
end

local function best_ms(reps, fn, sync)
  fn() -- warm-up
  local best = math.huge
  for _ = 1, reps do
    collectgarbage()
    if sync then sync() end
    local t0 = attn.clock()
    fn()
    if sync then sync() end
    best = math.min(best, (attn.clock() - t0) * 1000)
  end
  return best
end

local function flops(backward)
  local s = M.shape
  return (backward and 14 or 4) * s.b * s.h * s.n * s.n * s.e
end

--- The fields of one line: the ring on this job's ranks (every rank calls it).
-- @param dist attn.dist, initialized
-- @param layout "contiguous" or "zigzag"
-- @param reps timed repetitions
-- @param backward time forward + backward
function M.ring(dist, layout, reps, backward)
  local s, P, r = M.shape, dist.world_size(), dist.rank()
  local Q, K, V = inputs(false)
  local function part(x)
    if layout == "zigzag" then return dist.zigzag_split(x, -2) end
    local c = s.n // P
    return x:narrow(-2, (r - 1) * c + 1, c):contiguous()
  end
  local q, k, v = part(Q), part(K), part(V)
  Q, K, V = nil, nil, nil
  if backward then q:requires_grad_(); k:requires_grad_(); v:requires_grad_() end
  local opts = { is_causal = s.causal, layout = layout }
  local ms = best_ms(reps, function()
    local out = dist.ring_attention(q, k, v, opts)
    if backward then
      out:sum():backward()
      q.grad, k.grad, v.grad = nil, nil, nil
    end
  end, dist.barrier)
  return { kernel = "ring_" .. layout, b = s.b, h = s.h, lq = s.n, lk = s.n, e = s.e, causal = s.causal, ms = ms,
           gflops = flops(backward) / ms / 1e6 }
end

--- The same attention on the whole sequence in this process (the baseline).
function M.whole(reps, backward)
  local s = M.shape
  local q, k, v = inputs(backward)
  local opts = { is_causal = s.causal }
  local ms = best_ms(reps, function()
    local out = attn.scaled_dot_product_attention(q, k, v, opts)
    if backward then
      out:sum():backward()
      q.grad, k.grad, v.grad = nil, nil, nil
    end
  end)
  return { kernel = "whole", b = s.b, h = s.h, lq = s.n, lk = s.n, e = s.e, causal = s.causal, ms = ms,
           gflops = flops(backward) / ms / 1e6 }
end

return M
