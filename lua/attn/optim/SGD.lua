--- attn.optim.SGD(params, {lr, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false}):
-- stochastic gradient descent with momentum, torch.optim.SGD's float32
-- update (src/core/optim.c), so the same steps give the same bits.
-- `opt:step()`, `opt:zero_grad()`, `opt:state_dict()`, `opt:load_state_dict(sd)`.
-- @classmod attn.optim.SGD
local attn = require "attn"
local Optimizer = require "attn.optim.Optimizer"
local T = require("attn.core").train

local c = Optimizer.checks
local SGD = Optimizer.extend("SGD", {
  {"lr", nil, c.nonneg},
  {"momentum", 0, c.nonneg},
  {"dampening", 0, function(v) if type(v) ~= "number" then return "a number" end end},
  {"weight_decay", 0, c.nonneg},
  {"nesterov", false, c.boolean},
  {"maximize", false, c.falsy},
})

function SGD.check_group(o)
  if o.nesterov and (o.momentum <= 0 or o.dampening ~= 0) then
    return "nesterov momentum requires a momentum > 0 and zero dampening"
  end
end

function SGD.check_state(s)
  if s.momentum_buffer ~= nil and not attn.is_tensor(s.momentum_buffer) then return "'momentum_buffer' is not a tensor" end
end

function SGD:update(p, g, o, state)
  local buf, first = nil, false
  if o.momentum ~= 0 then
    buf = state.momentum_buffer
    if buf == nil then
      buf = attn.zeros(p:size())
      state.momentum_buffer, first = buf, true
    end
  end
  T.sgd_step(p, g, buf, first, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, "attn.optim.SGD:step")
end

return SGD
