--- attn.optim.AdamW(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 1e-2}):
-- Adam with decoupled weight decay (p = p * (1 - lr * weight_decay) before
-- the Adam step), torch.optim.AdamW's float32 single-tensor update
-- (src/core/optim.c), so the same steps give the same bits.
-- `opt:step()`, `opt:zero_grad()`, `opt:state_dict()`, `opt:load_state_dict(sd)`.
-- @classmod attn.optim.AdamW
local Adam = require "attn.optim.Adam"

return Adam.adam_class("AdamW", 1e-2, true)
