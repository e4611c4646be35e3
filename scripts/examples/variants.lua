-- The attention variants on one small problem, and what each does to a head's
-- weights: scripts/attn-lua scripts/examples/variants.lua [--svg DIR]
-- prints each variant's weights as a terminal heatmap (and, with --svg, writes
-- DIR/window_head.svg: the sliding-window head the README shows).
local attn = require "attn"
local sdpa = attn.scaled_dot_product_attention

local svg_dir
for i = 1, #arg do if arg[i] == "--svg" then svg_dir = arg[i + 1] end end

attn.manual_seed(7)
local n, e = 12, 16
local q, k, v = attn.randn(1, 4, n, e), attn.randn(1, 4, n, e), attn.randn(1, 4, n, e)
local k2, v2 = k:narrow(2, 1, 2):contiguous(), v:narrow(2, 1, 2):contiguous()  -- 2 kv heads

local variants = {
  { "causal", { is_causal = true } },
  { "sliding window of 4 keys: window = {3, 0}", { window = { 3, 0 } } },
  { "ALiBi, causal", { alibi_slopes = attn.alibi_slopes(4), is_causal = true } },
  { "softcap = 1, causal", { softcap = 1.0, is_causal = true } },
  { "GQA: 4 query heads over 2 kv heads, causal", { enable_gqa = true, is_causal = true }, k2, v2 },
}
for _, c in ipairs(variants) do
  local opts = c[2]
  opts.need_weights, opts.kernel = true, "math"
  local _, w = sdpa(q, c[3] or k, c[4] or v, opts)
  attn.viz.show(w[1][1], { title = c[1] .. " (head 1)" })
  print()
  if svg_dir and c[1]:find("^sliding") then
    local file = svg_dir .. "/window_head.svg"
    attn.viz.heatmap(w[1][1], { file = file, title = "window = {3, 0}: each query sees itself and 3 keys before" })
    print("wrote " .. file)
  end
end
