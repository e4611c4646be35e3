--- attn.rope, differentiable: the C forward (src/core/rope.c) recorded with
-- its C backward, the rotation by -theta (attn._rope_backward).
-- @module attn.autograd.rope
local core = require "attn.core"
local autograd = require "attn.autograd"

local M = {}

local is_tensor = require("attn.argcheck").is_tensor

--- attn.rope(x[, opts]), recorded when x requires grad.
M.rope = autograd.Function{
  name = "RopeBackward0", fname = "attn.rope", raw = core.rope,
  forward = function(ctx, ...)
    local out = core.rope(...)
    -- the options as they were: a positions tensor changed in place later must not change the backward
    local _, opts = ...
    if type(opts) == "table" then
      local kept = {}
      for key, val in pairs(opts) do kept[key] = is_tensor(val) and val:clone() or val end
      opts = kept
    end
    ctx.opts = opts
    return out
  end,
  backward = function(ctx, g)
    if ctx.needs_input_grad[1] then return core._rope_backward(g, ctx.opts) end
  end,
}

return M
