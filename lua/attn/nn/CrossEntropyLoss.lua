--- attn.nn.CrossEntropyLoss([{ignore_index = -100, reduction = "mean", label_smoothing = 0}]):
-- `forward(input, target)` is nn.functional.cross_entropy(input, target, opts):
-- logits [..., C] against 1-based class ids [...].
-- @classmod attn.nn.CrossEntropyLoss
local Module = require "attn.nn.Module"
local caller = require "attn.caller"
local checks = require "attn.nn.checks"
local F = require "attn.nn.functional"

local CrossEntropyLoss = Module:extend("CrossEntropyLoss")

function CrossEntropyLoss:init(opts)
  opts = checks.options("CrossEntropyLoss", opts, 1,
    {ignore_index = "number", reduction = "string", label_smoothing = "number"})
  local r = opts.reduction or "mean"
  if r ~= "mean" and r ~= "sum" and r ~= "none" then
    caller.error(("attn.nn.CrossEntropyLoss: bad option 'reduction' (expected \"mean\", \"sum\" or \"none\", got %q)"):format(r))
  end
  local ls = opts.label_smoothing or 0
  if not (ls >= 0 and ls <= 1) then
    caller.error(("attn.nn.CrossEntropyLoss: bad option 'label_smoothing' (expected a number in [0, 1], got %s)"):format(
      tostring(ls)))
  end
  self.ignore_index, self.reduction, self.label_smoothing = opts.ignore_index or -100, r, ls
end

function CrossEntropyLoss:forward(input, target)
  local ok, loss = pcall(F.cross_entropy, input, target,
    {ignore_index = self.ignore_index, reduction = self.reduction, label_smoothing = self.label_smoothing})
  if not ok then checks.forward_error("CrossEntropyLoss", "attn.nn.functional.cross_entropy", loss) end
  return loss
end

return CrossEntropyLoss
