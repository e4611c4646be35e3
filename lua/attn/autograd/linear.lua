--- The recorded linear layer (F.linear), for nn.Linear and
-- nn.MultiheadAttention. (scaled_dot_product_attention records through the C
-- forward and backward: lua/attn/autograd/sdpa.lua.)
-- @module attn.autograd.linear
local autograd = require "attn.autograd"
local derivatives = require "attn.autograd.derivatives"
local raw = derivatives.raw
local linear_bias = require("attn.core").train.linear

local M = {}

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
    -- with a bias: the bits of matmul then + b, the bias added in the product's stores (no pass of its own)
    local y = b and linear_bias(x, w, b) or raw.matmul(x, raw.t(w))
    b = b or nil
    -- x only for W's gradient, W only for x's (addmm's formulas): W may change
    -- in place after a forward on an x that needs no gradient
    local need = ctx.needs_input_grad
    if need[1] or need[2] then ctx:save_for_backward(need[2] and x or nil, need[1] and w or nil) end
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
