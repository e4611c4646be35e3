-- Port of shared/seeds/001_0e3feecd8bb76443.txt: simplified self-attention on
-- six tokens, trainable weights, SelfAttentionV1/V2, a causal mask, dropout,
-- CausalAttention and MultiHeadAttentionWrapper.
--   scripts/attn-lua scripts/examples/seeds/001_coding_attention.lua [--plots DIR]
-- Only the simplified-attention prints are determined by the notebook's code:
-- everything after them uses torch.rand / nn.Linear / Dropout without a seed.
-- Those cells run here after attn.manual_seed(2024) (our choice), so their
-- numbers differ from the notebook's.
local attn = require "attn"
local nn = attn.nn
local plots = require("seed_plots").from_args(arg, "scripts/examples/seeds/001_coding_attention.lua")
local tokens = { "Your", "journey", "starts", "with", "one", "step" }

local function shape(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

-- dummy input embeddings for 6 tokens, each of width 3
local inputs = attn.tensor {
  { 0.42, 0.15, 0.89 },
  { 0.78, 0.33, 0.21 },
  { 0.12, 0.44, 0.67 },
  { 0.56, 0.91, 0.73 },
  { 0.34, 0.29, 0.85 },
  { 0.63, 0.11, 0.49 },
}

-- Simplified self-attention
local query = inputs[2] -- second word (inputs[1] in PyTorch)
local attention_scores_2 = attn.empty(inputs:size(1))
for i = 1, #inputs do
  attention_scores_2[i] = inputs[i]:dot(query):item()
end
print(attention_scores_2)

local attention_weights_2 = attention_scores_2:softmax(1)
print(attention_weights_2)
plots:weights("attention_weights_2", attention_weights_2, nil, tokens, "journey")

local context_vec_2 = attn.zeros(query:size())
for i = 1, #inputs do
  context_vec_2:add_(inputs[i] * attention_weights_2[i])
end
print(context_vec_2)

local attention_scores = inputs:matmul(inputs:t())
print(shape(attention_scores))
local attention_weights = attention_scores:softmax(-1)
print(shape(attention_weights))
plots:weights("attention_weights", attention_weights, tokens)
local context_vectors = attention_weights:matmul(inputs)
print(context_vectors)

-- Attention with trainable parameters (unseeded in the notebook: seed 2024 here)
attn.manual_seed(2024)
local x_2 = inputs[2]
local d_in, d_out = inputs:size(2), 2
local W_q = attn.rand(d_in, d_out)
local W_k = attn.rand(d_in, d_out)
local W_v = attn.rand(d_in, d_out)

local query_2 = x_2:matmul(W_q)
local key_2 = x_2:matmul(W_k)
local value_2 = x_2:matmul(W_v)
print(query_2, key_2, value_2)

local keys = inputs:matmul(W_k)
local values = inputs:matmul(W_v)
local attn_scores_2 = query_2:matmul(keys:t())
print(attn_scores_2)

local attn_weights_2 = (attn_scores_2 / keys:size(-1) ^ 0.5):softmax(-1)
print(attn_weights_2)
plots:weights("attn_weights_2", attn_weights_2, nil, tokens, "journey, trainable weights")

context_vec_2 = attn_weights_2:matmul(values)
print(context_vec_2)

-- Compact self-attention classes
local sa_v1 = nn.SelfAttentionV1(d_in, d_out)
print(sa_v1(inputs))

-- the notebook's SelfAttentionV2 uses nn.Linear(d_in, d_out), bias on
local sa_v2 = nn.SelfAttentionV2(d_in, d_out, { qkv_bias = true })
print(sa_v2(inputs))

-- Causal attention. Quirk: the notebook's cell scores `queries @ keys.T` with
-- the `keys` of the earlier W_k cell, not sa_v2's; reproduced here.
local queries = sa_v2.W_query(inputs)
local attn_scores = queries:matmul(keys:t())
print(attn_scores)

local context_length = attn_scores:size(1)
local mask = attn.triu(attn.ones(context_length, context_length), 1)
local masked = attn_scores:masked_fill(mask:bool(), -math.huge)
print(masked)

local attn_weights = (masked / keys:size(-1) ^ 0.5):softmax(2)
print(attn_weights)
plots:weights("causal_attn_weights", attn_weights, tokens)

local context_vec = attn_weights:matmul(values)
print(context_vec)

-- Dropout on the simplified attention weights (~30% dropped, rest scaled by 1/0.7)
local dropout = nn.Dropout(0.3)
print(dropout(attention_weights))

-- The notebook's CausalAttention has three bugs:
--  1. `attn_scores.masked_fill(...)` is not in place and its result is thrown
--     away, so nothing is masked;
--  2. the softmax reads `attention_scores`, a stale global (the [6, 6] simplified
--     scores), instead of `attn_scores`;
--  3. the softmax runs over dim=1 (the query dim of a [b, n, n] batch) instead
--     of the last dim, so rows do not sum to 1.
-- Its output only has the right shape by accident. Reproduced as written:
local batch = attn.stack({ inputs, inputs }, 1)
context_length = batch:size(2)
local function buggy_causal_attention(layer, x)
  local v = layer.W_value(x)
  local d_k = layer.W_key(x):size(-1)
  local w = (attention_scores / d_k ^ 0.5):softmax(1) -- bugs 2 and 3 (bug 1 leaves no mask)
  return w:matmul(v)
end
local ca = nn.CausalAttention(d_in, d_out, context_length, 0.0)
print("notebook's CausalAttention (buggy) shape:", shape(buggy_causal_attention(ca, batch)))
-- and corrected (attn.nn.CausalAttention: in-place mask, its own scores, softmax over the last dim):
local context_vecs = ca(batch)
print(context_vecs)
print("context_vecs.shape:", shape(context_vecs))

-- Multi-head attention
local mha = nn.MultiHeadAttentionWrapper(d_in, d_out, context_length, 0.0, 2)
context_vecs = mha(batch)
print("context_vecs.shape:", shape(context_vecs))
