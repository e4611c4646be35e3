--- The recorded scaled_dot_product_attention and linear.
--
-- scaled_dot_product_attention runs the C kernel forward (the same bits as
-- without autograd). Its backward recomputes the attention from q, k, v (and
-- bias) as recorded tensor ops, under the generator state the forward started
-- from, so dropout draws the same mask, and differentiates that; this gives
-- exact gradients for every option of the kernel (mask, bias, is_causal,
-- scale, dropout_p) at the cost of one [.., Lq, Lk] score tensor in the
-- backward.
-- @module attn.autograd.attention
local core = require "attn.core"
local autograd = require "attn.autograd"
local derivatives = require "attn.autograd.derivatives"
local raw = derivatives.raw
local Tensor_mt = core.Tensor_mt

local M = {}

local function is_tensor(x) return getmetatable(x) == Tensor_mt end

-- k or v [..., Hkv, Lk, E] with each head repeated g times in place
-- (repeat_interleave on dim -3, as enable_gqa reads them): expand + reshape,
-- so the gradient sums the g query heads' back into each kv head.
local function repeat_heads(x, hq)
  local size = x:size()
  local n = #size
  local g = hq // size[n - 2]
  if g == 1 then return x end
  local wide = {}
  for d = 1, n - 3 do wide[#wide + 1] = size[d] end
  wide[#wide + 1] = size[n - 2]
  wide[#wide + 1] = g
  wide[#wide + 1] = size[n - 1]
  wide[#wide + 1] = size[n]
  local out = {}
  for d = 1, n - 3 do out[#out + 1] = size[d] end
  out[#out + 1] = hq
  out[#out + 1] = size[n - 1]
  out[#out + 1] = size[n]
  return x:unsqueeze(n - 1):expand(wide):reshape(out)
end

-- j - i - d for every (query i, key j) [lq, lk], d = lk - lq (no grad)
local function diagonal_offsets(lq, lk)
  local i = raw.view(raw.arange(0, lq), lq, 1)
  local j = raw.view(raw.arange(0, lk), 1, lk)
  return raw.sub(raw.sub(j, i), lk - lq)
end

-- The attention as tensor ops (every op recorded when grad mode is on):
-- q, k, v with the kv heads repeated (enable_gqa); scores = q k^T * scale,
-- softcap c tanh(s / c), + bias, + ALiBi -slope |i + d - j|; hidden (mask
-- nonzero, above the diagonal when causal, outside the window) -> -inf, a row
-- with every key hidden -> zeros. The variants' meaning is src/core/sdpa.h's.
function M.composed(q, k, v, bias, opts)
  local attn = require "attn"
  local E, lq, lk = q:size(-1), q:size(-2), k:size(-2)
  local scale = opts.scale or 1 / math.sqrt(E)
  if opts.enable_gqa then
    k, v = repeat_heads(k, q:size(-3)), repeat_heads(v, q:size(-3))
  end
  local s = attn.matmul(q, k:transpose(-1, -2)) * scale
  if opts.softcap then s = (s / opts.softcap):tanh() * opts.softcap end
  if bias then s = s + bias end
  if opts.alibi_slopes then
    local slopes = opts.alibi_slopes
    local shape = slopes:size()
    shape[#shape + 1], shape[#shape + 2] = 1, 1
    s = s + raw.mul(raw.neg(raw.view(slopes, shape)), raw.abs(diagonal_offsets(lq, lk)))
  end
  local hidden
  if opts.mask ~= nil then hidden = raw.bool(opts.mask) end
  if opts.is_causal then
    local causal = raw.triu(raw.ones(lq, lk), 1)
    hidden = hidden and raw.bool(hidden + causal) or causal
  end
  if opts.window then
    local left, right = opts.window[1], opts.window[2]
    local off = diagonal_offsets(lq, lk)
    local outside = raw.zeros(lq, lk)
    if left >= 0 then outside = raw.add(outside, raw.lt(off, -left)) end
    if right >= 0 then outside = raw.add(outside, raw.gt(off, right)) end
    outside = raw.bool(outside)
    hidden = hidden and raw.bool(hidden + outside) or outside
  end
  local empty_rows
  if hidden then
    hidden = raw.expand(hidden, s:size())
    -- rows with no visible key: softmax over zeros, then zeroed
    empty_rows = raw.min(hidden, -1, true)
    s = s:masked_fill(raw.mul(hidden, raw.sub(1, empty_rows)), -math.huge)
  end
  local p = s:softmax(-1)
  if empty_rows then p = p * raw.sub(1, empty_rows) end
  local dp = opts.dropout_p or 0
  if dp > 0 then p = attn.dropout(p, dp) end
  return attn.matmul(p, v), p
end

local function out_name(q) return q:dim() == 2 and "MmBackward0" or "UnsafeViewBackward0" end

local recorded = autograd.Function{
  name = function(q) return out_name(q) end,
  fname = "attn.scaled_dot_product_attention",
  forward = function(ctx, q, k, v, bias, opts)
    local dp = type(opts) == "table" and opts.dropout_p
    local rng = type(dp) == "number" and dp > 0 and raw.get_rng_state() or nil -- (bad options: the C call's error)
    local r = table.pack(raw.scaled_dot_product_attention(q, k, v, opts))
    ctx.rng, ctx.opts = rng, opts or {}
    ctx:save_for_backward(q, k, v, bias or nil)
    -- out (and the weights) are differentiable; the lse, when asked for, is not
    if opts and opts.return_lse then ctx:mark_non_differentiable(r[r.n]) end
    ctx.need_weights = opts and opts.need_weights
    return table.unpack(r, 1, r.n)
  end,
  backward = function(ctx, g_out, g_w)
    local q, k, v, bias = ctx:saved()
    local leaves, inputs = {}, {}
    local function leaf(x, i)
      if x == nil then return nil end
      local d = x:detach()
      if ctx.needs_input_grad[i] then
        autograd.requires_grad_(d, true)
        leaves[#leaves + 1] = d
        inputs[#inputs + 1] = i
      end
      return d
    end
    local qd, kd, vd, bd = leaf(q, 1), leaf(k, 2), leaf(v, 3), leaf(bias, 4)
    local result = {}
    if #leaves == 0 then return end
    local now
    if ctx.rng then
      now = raw.get_rng_state()
      raw.set_rng_state(ctx.rng)
    end
    local ok, err = pcall(autograd.enable_grad, function()
      local out, p = M.composed(qd, kd, vd, bd, ctx.opts)
      local outs, gs = { out }, { g_out }
      if ctx.need_weights and g_w then
        outs[2], gs[2] = p, g_w
      end
      local grads = autograd.grad(outs, leaves, gs)
      for j, i in ipairs(inputs) do result[i] = grads[j] end
    end)
    if now then raw.set_rng_state(now) end
    if not ok then error(err, 0) end
    return result[1], result[2], result[3], result[4]
  end,
}

--- attn.scaled_dot_product_attention, recorded when q, k, v or opts.bias require grad.
function M.scaled_dot_product_attention(...)
  local q, k, v, opts = ...
  if autograd.is_grad_enabled() and select("#", ...) <= 4 and is_tensor(q) and is_tensor(k) and is_tensor(v)
      and (opts == nil or type(opts) == "table") then
    local bias = opts and is_tensor(opts.bias) and opts.bias or nil
    local h = autograd._history
    if h[q] or h[k] or h[v] or (bias and h[bias]) then
      return recorded(q, k, v, bias or false, opts)
    end
  end
  return raw.scaled_dot_product_attention(...)
end

-- F.linear: y = x W^T (+ b), named as torch 1.13 names the node for x's rank
local function linear_name(x, _, b)
  local d = x:dim()
  if d == 1 then return b and "AddBackward0" or "SqueezeBackward3" end
  if d == 2 then return b and "AddmmBackward0" or "MmBackward0" end
  if d == 3 and b then return "ViewBackward0" end
  return b and "AddBackward0" or "UnsafeViewBackward0"
end

M.linear_recorded = autograd.Function{
  name = linear_name, fname = "attn.nn.functional.linear",
  forward = function(ctx, x, w, b)
    local y = raw.matmul(x, raw.t(w))
    if b then raw.add_(y, b) end -- in place: y is this call's own (the bits of y + b, one activation less)
    b = b or nil
    ctx:save_for_backward(x, w)
    ctx.has_bias = b and true or false
    return y
  end,
  backward = function(ctx, g)
    local x, w = ctx:saved()
    local gx, gw, gb
    if ctx.needs_input_grad[1] then gx = raw.matmul(g, w) end
    local g2 = g:dim() == 1 and g:unsqueeze(1) or g:reshape(-1, g:size(-1))
    if ctx.needs_input_grad[2] then
      local x2 = x:dim() == 1 and x:unsqueeze(1) or x:reshape(-1, x:size(-1))
      gw = raw.matmul(raw.t(g2), x2)
    end
    if ctx.has_bias and ctx.needs_input_grad[3] then gb = g2:sum(1) end
    return gx, gw, gb
  end,
}

--- y = x W^T (+ b): the linear layer's computation, recorded.
function M.linear(x, w, b)
  return M.linear_recorded(x, w, b or false)
end

return M
