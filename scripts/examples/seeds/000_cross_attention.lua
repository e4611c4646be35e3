-- Port of shared/seeds/000_7252ae3488ab1acc.txt: an Attention class with
-- separate encodings for Q, K and V (encoder-decoder / cross attention).
--   scripts/attn-lua scripts/examples/seeds/000_cross_attention.lua [--plots DIR]
-- Porting notes: the notebook's row_dim = 0, col_dim = 1 are 1 and 2 here.
local attn = require "attn"
local nn = attn.nn
local plots = require("seed_plots").from_args(arg, "scripts/examples/seeds/000_cross_attention.lua")

-- matrices of token encodings
local encodings_for_q = attn.tensor { { 1.16, 0.23 }, { 0.57, 1.36 }, { 4.41, -2.16 } }
local encodings_for_k = attn.tensor { { 1.16, 0.23 }, { 0.57, 1.36 }, { 4.41, -2.16 } }
local encodings_for_v = attn.tensor { { 1.16, 0.23 }, { 0.57, 1.36 }, { 4.41, -2.16 } }

attn.manual_seed(42)
local attention = nn.Attention(2, { row_dim = 1, col_dim = 2 })
-- encoder-decoder attention
print(attention(encodings_for_q, encodings_for_k, encodings_for_v))

-- Not in the notebook: the optional mask (nonzero = hidden, filled with -1e9),
-- here a causal one, so query i only sees keys 1..i.
local mask = attn.triu(attn.ones(3, 3), 1)
print("with a causal mask:")
print(attention(encodings_for_q, encodings_for_k, encodings_for_v, mask))
plots:none()
