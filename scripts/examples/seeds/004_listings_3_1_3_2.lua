-- Port of shared/seeds/004_dcb765a032a3e11b.txt: book listings 3.1 and 3.2
-- (SelfAttention_v1 and _v2) and exercise 3.1.
--   scripts/attn-lua scripts/examples/seeds/004_listings_3_1_3_2.lua [--plots DIR]
local attn = require "attn"
local nn = attn.nn
local plots = require("seed_plots").from_args(arg, "scripts/examples/seeds/004_listings_3_1_3_2.lua")

-- the six tokens of "Your journey starts with one step" (defined earlier in the book)
local inputs = attn.tensor {
  { 0.43, 0.15, 0.89 }, { 0.55, 0.87, 0.66 }, { 0.57, 0.85, 0.64 },
  { 0.22, 0.58, 0.33 }, { 0.77, 0.25, 0.10 }, { 0.05, 0.80, 0.55 },
}
local d_in, d_out = 3, 2

-- Listing 3.1: weights from attn.rand, [d_in, d_out]
attn.manual_seed(123)
local sa_v1 = nn.SelfAttentionV1(d_in, d_out)
print(sa_v1(inputs))

-- Listing 3.2: weights from nn.Linear (kaiming-uniform), stored [d_out, d_in]
attn.manual_seed(789)
local sa_v2 = nn.SelfAttentionV2(d_in, d_out)
print(sa_v2(inputs))

-- Exercise 3.1: nn.Linear stores its weight transposed ([out, in]), so
-- SelfAttentionV1 takes weight:t() of each of SelfAttentionV2's layers.
sa_v1:load_state_dict {
  W_query = sa_v2.W_query.weight:t(),
  W_key = sa_v2.W_key.weight:t(),
  W_value = sa_v2.W_value.weight:t(),
}
print("Exercise 3.1, SelfAttentionV1 with SelfAttentionV2's weights:")
local out_v1, out_v2 = sa_v1(inputs), sa_v2(inputs)
print(out_v1)
print(string.format("max |v1 - v2| = %.3g", (out_v1 - out_v2):abs():max():item()))
plots:none()
