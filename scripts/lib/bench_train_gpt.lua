-- The train_gpt case's setup, shared by scripts/bench.lua (its timed step)
-- and scripts/train_gpt_breakdown.lua (the same step, timed by phase): a
-- GPTModel (vocab 256, context 128, 128 wide, 4 heads, 4 layers, no
-- dropout), AdamW, and a batch of 16 token rows with their targets.
local attn = require "attn"

return function()
  local cfg = { vocab_size = 256, context_length = 128, emb_dim = 128, n_heads = 4, n_layers = 4, drop_rate = 0,
                qkv_bias = false }
  local b, n = 16, cfg.context_length
  attn.manual_seed(123)
  local model = attn.nn.GPTModel(cfg)
  local opt = attn.optim.AdamW(model:parameters(), { lr = 1e-4, weight_decay = 0.1 })
  -- ids 1..256 from the generator's uniforms
  local function ids()
    local t = attn.rand(b, n):totable()
    for _, row in ipairs(t) do for j, u in ipairs(row) do row[j] = math.floor(u * 256) + 1 end end
    return attn.tensor(t)
  end
  local x, y = ids(), ids():reshape(b * n)
  return { cfg = cfg, b = b, n = n, model = model, opt = opt, x = x, y = y }
end
