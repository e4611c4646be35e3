-- Port of shared/seeds/003_2002f6724c07b525.txt: self-attention on a 1x10x10
-- positional-encoded embedding with identity projections, scaled scores,
-- softmax, weighted sum, then an output Linear.
--   scripts/attn-lua scripts/examples/seeds/003_positional_self_attention.lua [--plots DIR]
local attn = require "attn"
local nn = attn.nn
local plots = require("seed_plots").from_args(arg, "scripts/examples/seeds/003_positional_self_attention.lua")
local positions = {}
for i = 1, 10 do positions[i] = "pos " .. i end

-- Positional encoded embeddings from the notebook's previous module: [1, 10, 10]
local pos_encoded_embeddings = attn.tensor { {
  { 0.0171, 1.0654, 0.4616, 0.9196, 0.7193, -0.7430, 0.7120, 0.4198, 2.7427, 0.2844 },
  { 0.9161, -0.4999, 1.8302, 1.2182, 0.0651, 2.0396, 0.3780, 0.4085, 1.3560, -1.3176 },
  { -0.3461, 0.2526, 0.4120, 0.0398, 1.6146, 2.6475, -0.1887, -0.6907, -0.4066, 1.2899 },
  { -0.8345, -0.4657, -0.5635, 1.1514, 0.1762, 1.8148, -1.4084, 0.9153, -1.1734, 1.1989 },
  { -0.3981, -0.7277, -1.2657, 1.9887, -0.2399, 0.0412, 1.9375, 0.6083, 0.2095, 1.5739 },
  { -1.5240, 1.2359, 0.5596, -0.1529, -0.4064, -0.0906, -1.6746, 0.2480, -0.2364, 0.8417 },
  { 0.6992, -1.1193, 0.5642, 1.3861, -0.5185, 0.6701, -0.5353, 1.8013, 0.7900, -0.9430 },
  { -0.3550, 2.1032, 1.8690, 0.7174, -1.7692, 0.8200, -0.9620, 1.8325, 0.3009, 1.0083 },
  { 1.5902, -0.8516, 3.2954, -0.5147, 0.1798, 1.8522, -1.0186, 0.6484, 0.9932, 0.4030 },
  { -0.5990, -0.4916, 0.5419, -0.0293, -0.3465, 1.1548, -1.1130, -0.8118, 0.3455, 0.9474 },
} }
print("Positional Encoded Embeddings Shape: [" .. table.concat(pos_encoded_embeddings:size(), ", ") .. "]")
print(pos_encoded_embeddings)

-- Quirk: the notebook takes d_model = size(1) (0-based), the token count (10),
-- which equals the feature width only by coincidence; size(3) is the width.
local d_model = pos_encoded_embeddings:size(2)
local d_k = d_model

-- identity projections, for simplicity
local W_q, W_k, W_v = attn.eye(d_model), attn.eye(d_model), attn.eye(d_model)
local queries = attn.matmul(pos_encoded_embeddings, W_q)
local keys = attn.matmul(pos_encoded_embeddings, W_k)
local values = attn.matmul(pos_encoded_embeddings, W_v)
print("Queries Matrix:\n", queries)
print("Keys Matrix:\n", keys)
print("Values Matrix:\n", values)

print(string.format("square root of the dim of keys: %.17g", math.sqrt(d_k)))
local scores = attn.matmul(queries, keys:transpose(-2, -1)) / math.sqrt(d_k)
print("Dot Product of Queries and Keys.Transposed (Scaled):")
print(scores)

local attention = scores:softmax(-1)
print("Attention Weights:\n", attention)
plots:weights("attention", attention[1], positions, nil, "Attention Weights")

local output = attn.matmul(attention, values)
print("attention weights:")
print(attention)
print("values matrix: ")
print(values)
print("Output:\n", output)

-- the same in one call of the fused-kernel API (scale 1/sqrt(10), here also 1/sqrt(E))
local sdpa = attn.scaled_dot_product_attention(queries, keys, values)
assert(sdpa:allclose(output, 1e-5, 1e-6))

-- Combine heads (one head) and the final linear projection. The notebook never
-- seeds this nn.Linear, so its printed numbers cannot be reproduced: seed 0 here.
local N, heads, head_dim, embedding_size = 1, 1, d_model, d_model
output = output:view(N, -1, heads * head_dim)
attn.manual_seed(0)
local fc_out = nn.Linear(heads * head_dim, embedding_size)
output = fc_out(output)
print("Final Output (fc_out seeded with 0, the notebook's is unseeded):\n", output)
