-- FlexAttention's examples with attn.score_mod and attn.mask_mod:
--   scripts/attn-lua scripts/examples/flex.lua
-- For each example (defined in flex_mods.lua beside this file) it prints the
-- traced expression and the largest difference from a dense reference that
-- uses the options attn had before (a bias tensor [B, H, L, L] or a mask,
-- built elementwise in Lua), in the forward and, for the learnable tables,
-- in their gradients; then the examples that built-in options also compute.
local attn = require "attn"
local here = (arg and arg[0] or ""):match("^(.*)/") or "."
local flex = dofile(here .. "/flex_mods.lua")
local sdpa = attn.scaled_dot_product_attention

attn.manual_seed(0)
local B, H, L, E = 2, 4, 64, 16
local q, k, v = attn.randn(B, H, L, E), attn.randn(B, H, L, E), attn.randn(B, H, L, E)

-- document ids [B, L]: three documents in the first sequence, two in the second
local ids = {}
for b = 1, B do
  ids[b] = {}
  for i = 1, L do ids[b][i] = b == 1 and (i <= 10 and 1 or i <= 41 and 2 or 3) or (i <= 30 and 1 or 2) end
end

local x = {
  b = B, hq = H, lq = L, lk = L, c = 2.0, w = 8, prefix = 12, num_buckets = 32, max_exact = 8, max_distance = 100,
  slopes = attn.alibi_slopes(H),                                   -- the ALiBi paper's slopes
  ids = attn.tensor(ids),
}

local function maxdiff(a, b) return (a - b):abs():max():item() end

local order = { "relative_position", "alibi", "softcap", "t5_bias", "relative_table", "causal", "sliding_window",
                "prefix_lm", "document", "combined" }
for _, name in ipairs(order) do
  local ex = flex.examples[name]
  -- a fresh learnable table of the example's width: [H, 2L - 1] or T5's [H, num_buckets]
  x.table = attn.randn(H, name == "t5_bias" and x.num_buckets or 2 * L - 1):mul(0.5):requires_grad_()
  local o = ex.make(x)
  print(("%s (%s)"):format(name, name == "combined" and "score_mod and mask_mod" or o.score_mod and "score_mod"
    or "mask_mod"))
  if o.score_mod then print("  score_mod: " .. tostring(o.score_mod)) end
  if o.mask_mod then print("  mask_mod:  " .. tostring(o.mask_mod)) end
  local learnable = name == "t5_bias" or name == "relative_table" or name == "combined"
  local qg = q:clone():requires_grad_()
  local out = sdpa(qg, k, v, o)
  local table_grad
  if learnable then
    out:sum():backward()
    table_grad = x.table.grad
    x.table.grad = nil
  end
  local d, grads = flex.dense(name, x)
  local qd = q:clone():requires_grad_()
  local ref = sdpa(qd, k, v, d)
  local line = ("  max |out - dense reference| = %.2g"):format(maxdiff(out, ref))
  if learnable then
    ref:sum():backward()
    line = line .. ("; of d(table) %.2g, of dq %.2g"):format(maxdiff(table_grad, grads().table),
      maxdiff(qg.grad, qd.grad))
  end
  print(line)
end

-- the examples that attn also has as built-in options (the fast paths)
print("against the built-in options:")
local slopes = attn.alibi_slopes(H)
local doc_bm = attn.block_mask(attn.block_mask.and_(attn.block_mask.document(x.ids[1]), attn.block_mask.causal),
  1, H, L, L)
local pairs_ = {
  { "ALiBi score_mod vs alibi_slopes", { score_mod = flex.alibi(slopes) }, { alibi_slopes = slopes } },
  { "softcap score_mod vs softcap = 2", { score_mod = flex.softcap(2) }, { softcap = 2 } },
  { "causal mask_mod vs is_causal", { mask_mod = flex.causal() }, { is_causal = true } },
  { "sliding_window(8) mask_mod vs window = {8, 0}", { mask_mod = flex.sliding_window(8) }, { window = { 8, 0 } } },
  { "document mask_mod as attn.block_mask vs block_mask.document and causal",
    { block_mask = attn.block_mask(flex.document(x.ids:narrow(1, 1, 1)), 1, H, L, L) }, { block_mask = doc_bm } },
}
for _, p in ipairs(pairs_) do
  local q1, k1, v1 = q:narrow(1, 1, 1), k:narrow(1, 1, 1), v:narrow(1, 1, 1)
  print(("  %s: max |diff| = %.2g"):format(p[1], maxdiff(sdpa(q1, k1, v1, p[2]), sdpa(q1, k1, v1, p[3]))))
end
