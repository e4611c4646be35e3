--- attn.optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0}):
-- torch.optim.Adam's float32 single-tensor update (src/core/optim.c), so the
-- same steps give the same bits; weight_decay is added to the gradient
-- (L2). State per parameter: `step`, `exp_avg`, `exp_avg_sq`.
-- `opt:step()`, `opt:zero_grad()`, `opt:state_dict()`, `opt:load_state_dict(sd)`.
-- @classmod attn.optim.Adam
local attn = require "attn"
local Optimizer = require "attn.optim.Optimizer"
local T = require("attn.core").train

local c = Optimizer.checks

local function adam_class(name, default_weight_decay, decoupled)
  local cls = Optimizer.extend(name, {
    {"lr", 1e-3, c.nonneg},
    {"betas", {0.9, 0.999}, c.betas},
    {"eps", 1e-8, c.nonneg},
    {"weight_decay", default_weight_decay, c.nonneg},
    {"amsgrad", false, c.falsy},
    {"maximize", false, c.falsy},
  })
  cls.count_fields = {step = true} -- checked by Optimizer's load_state_dict
  function cls.check_state(s)
    if s.step == nil then return "'step' is missing" end
    if not attn.is_tensor(s.exp_avg) or not attn.is_tensor(s.exp_avg_sq) then
      return "'exp_avg' and 'exp_avg_sq' must be tensors"
    end
  end
  local fname = "attn.optim." .. name .. ":step"
  function cls:update(p, g, o, state)
    if state.step == nil then
      state.step, state.exp_avg, state.exp_avg_sq = 0, attn.zeros(p:size()), attn.zeros(p:size())
    end
    state.step = state.step + 1
    T.adam_step(p, g, state.exp_avg, state.exp_avg_sq, state.step, o.lr, o.betas[1], o.betas[2], o.eps,
      o.weight_decay, decoupled, fname)
  end
  return cls
end

local Adam = adam_class("Adam", 0, false)
Adam.adam_class = adam_class
return Adam
