--- attn.nn.GELU([{approximate = "none"}]): elementwise GELU, "none" (erf:
-- x * Phi(x)) or "tanh" (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),
-- the book's GELU), as torch.nn.GELU.
-- @classmod attn.nn.GELU
local Module = require "attn.nn.Module"
local caller = require "attn.caller"
local checks = require "attn.nn.checks"
local F = require "attn.nn.functional"

local GELU = Module:extend("GELU")

function GELU:init(opts)
  opts = checks.options("GELU", opts, 1, {approximate = "string"})
  local a = opts.approximate or "none"
  if a ~= "none" and a ~= "tanh" then
    caller.error(("attn.nn.GELU: bad option 'approximate' (expected \"none\" or \"tanh\", got %q)"):format(a))
  end
  self.approximate = a
end

function GELU:forward(x)
  local ok, y = pcall(F.gelu, x, {approximate = self.approximate})
  if not ok then checks.forward_error("GELU", "attn.nn.functional.gelu", y) end
  return y
end

function GELU:extra_repr()
  return ("approximate='%s'"):format(self.approximate)
end

return GELU
