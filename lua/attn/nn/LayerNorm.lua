--- attn.nn.LayerNorm(normalized_shape[, {eps = 1e-5, elementwise_affine = true}]):
-- normalises over the trailing dims normalized_shape (a number: the last dim),
-- biased variance, as torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias.
-- Parameters (with elementwise_affine): `weight` (ones), `bias` (zeros) of shape normalized_shape.
-- @classmod attn.nn.LayerNorm
local attn = require "attn"
local caller = require "attn.caller"
local Module = require "attn.nn.Module"
local checks = require "attn.nn.checks"
local F = require "attn.nn.functional"

local LayerNorm = Module:extend("LayerNorm")

function LayerNorm:init(normalized_shape, opts)
  local dims = type(normalized_shape) == "table" and not attn.is_tensor(normalized_shape) and normalized_shape
    or {normalized_shape}
  if #dims == 0 then checks.positive_integer("LayerNorm", nil, 1, "normalized_shape") end
  local shape = {}
  for i, d in ipairs(dims) do shape[i] = checks.positive_integer("LayerNorm", d, 1, "normalized_shape") end
  opts = checks.options("LayerNorm", opts, 2, {eps = "number", elementwise_affine = "boolean"})
  local eps = opts.eps or 1e-5
  if not (eps >= 0) then
    caller.error(("attn.nn.LayerNorm: bad option 'eps' (expected a number >= 0, got %s)"):format(tostring(eps)))
  end
  self.normalized_shape, self.eps = shape, eps
  self.elementwise_affine = opts.elementwise_affine ~= false
  if self.elementwise_affine then
    self:add_parameter("weight", attn.ones(shape))
    self:add_parameter("bias", attn.zeros(shape))
  end
end

function LayerNorm:forward(x)
  local ok, y = pcall(F.layer_norm, x, self.normalized_shape, self.weight, self.bias, self.eps)
  if not ok then checks.forward_error("LayerNorm", "attn.nn.functional.layer_norm", y) end
  return y
end

function LayerNorm:extra_repr()
  local shape = #self.normalized_shape == 1 and (self.normalized_shape[1] .. ",")
    or table.concat(self.normalized_shape, ", ")
  return ("(%s), eps=%s, elementwise_affine=%s"):format(shape, Module.pyfloat(self.eps),
    self.elementwise_affine and "True" or "False")
end

return LayerNorm
