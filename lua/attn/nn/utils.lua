--- attn.nn.utils: clip_grad_norm_ (PyTorch's torch.nn.utils).
-- (Not a class: a table of functions.)
-- @module attn.nn.utils
local attn = require "attn"
local caller = require "attn.caller"
local T = require("attn.core").train

local utils = {}

--- Scales the gradients of `params` (a tensor or a list of tensors; those
-- whose `.grad` is nil are skipped) in place so that their total 2-norm is at
-- most max_norm, with torch.nn.utils.clip_grad_norm_'s float32 arithmetic:
-- every gradient is multiplied by min(1, max_norm / (total_norm + 1e-6)).
-- Returns the total norm before clipping, a 0-dim tensor.
-- @param params tensor or list of tensors
-- @param max_norm number
-- @param[opt=2] norm_type only 2
function utils.clip_grad_norm_(params, max_norm, norm_type)
  local fname = "attn.nn.utils.clip_grad_norm_"
  if attn.is_tensor(params) then params = {params} end
  if type(params) ~= "table" then
    caller.error(("%s: bad argument #1 'parameters' (expected a tensor or a list of tensors, got %s)"):format(fname,
      type(params)))
  end
  if type(max_norm) ~= "number" or max_norm ~= max_norm then
    caller.error(("%s: bad argument #2 'max_norm' (expected a number, got %s)"):format(fname, tostring(max_norm)))
  end
  if norm_type ~= nil and norm_type ~= 2 then
    caller.error(("%s: bad argument #3 'norm_type' (only the 2-norm is supported, got %s)"):format(fname,
      tostring(norm_type)))
  end
  local grads = {}
  for i, p in ipairs(params) do
    if not attn.is_tensor(p) then
      caller.error(("%s: bad argument #1 'parameters' (element %d is not an attn.Tensor, got %s)"):format(fname, i, type(p)))
    end
    if p.grad ~= nil then grads[#grads + 1] = p.grad end
  end
  if #grads == 0 then return attn.tensor(0) end
  local total, coef = T.clip_grad_norm_coef(grads, max_norm, fname)
  for _, g in ipairs(grads) do g:mul_(coef) end
  return attn.tensor(total)
end

return utils
