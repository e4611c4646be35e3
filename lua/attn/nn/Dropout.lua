--- attn.nn.Dropout(p = 0.5): zeroes each element with probability p and scales
-- the rest by 1/(1-p), in training mode only (attn.dropout: PyTorch's
-- MKL-style mask, one random draw per call). In eval mode, or for p = 0,
-- forward returns its input itself.
-- @classmod attn.nn.Dropout
local attn = require "attn"
local caller = require "attn.caller"
local Module = require "attn.nn.Module"

local Dropout = Module:extend("Dropout")

function Dropout:init(p)
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    caller.error("attn.nn.Dropout: dropout probability has to be between 0 and 1, but got "
          .. (type(p) == "number" and tostring(p) or type(p)))
  end
  self.p = p
  self.inplace = false
end

function Dropout:forward(x)
  if not attn.is_tensor(x) then
    -- attn.dropout's own message, naming this method also when forward is called directly
    local _, err = pcall(attn.dropout, x, self.p, self.training)
    error("Dropout:forward: " .. tostring(err):gsub("^[^\n]-%.lua:%d+: ", "", 1), 0)
  end
  return attn.dropout(x, self.p, self.training)
end

function Dropout:extra_repr()
  return ("p=%s, inplace=False"):format(Module.pyfloat(self.p))
end

return Dropout
