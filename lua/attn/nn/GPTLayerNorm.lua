--- attn.nn.GPTLayerNorm(emb_dim): the book's chapter 4 LayerNorm, the one
-- GPTModel uses: (x - mean) / sqrt(var + eps) * scale + shift over the last
-- dim, biased variance, eps = 1e-5. Parameters `scale` (ones) and `shift`
-- (zeros) [emb_dim], the book's names, so its state dicts load unchanged.
-- The arithmetic is nn.functional.layer_norm's (the fused kernel): it agrees
-- with the book's composed ops to float32 rounding.
-- @classmod attn.nn.GPTLayerNorm
local attn = require "attn"
local Module = require "attn.nn.Module"
local checks = require "attn.nn.checks"
local F = require "attn.nn.functional"

local GPTLayerNorm = Module:extend("GPTLayerNorm")

function GPTLayerNorm:init(emb_dim, extra)
  self.emb_dim = checks.positive_integer("GPTLayerNorm", emb_dim, 1, "emb_dim")
  checks.none("GPTLayerNorm", extra, 2, "(emb_dim)")
  self.eps = 1e-5
  self:add_parameter("scale", attn.ones(self.emb_dim))
  self:add_parameter("shift", attn.zeros(self.emb_dim))
end

--- x [..., emb_dim] -> [..., emb_dim].
function GPTLayerNorm:forward(x)
  local ok, y = pcall(F.layer_norm, x, {self.emb_dim}, self.scale, self.shift, self.eps)
  if not ok then checks.forward_error("GPTLayerNorm", "attn.nn.functional.layer_norm", y) end
  return y
end

function GPTLayerNorm:extra_repr()
  return ("%d, eps=%s"):format(self.emb_dim, Module.pyfloat(self.eps))
end

return GPTLayerNorm
