-- Port of shared/seeds/002_a2117fd3531927b6.txt: the book chapter on attention
-- (simplified self-attention, trainable weights, causal masks, dropout,
-- CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention), printing the
-- same tensors in the same order with the same seeds.
--   scripts/attn-lua scripts/examples/seeds/002_attention_chapter.lua [--plots DIR]
-- Porting notes: dims and indices are 1-based (inputs[1] in PyTorch is
-- inputs[2] here; keys.transpose(1, 2) is keys:transpose(2, 3)).
local attn = require "attn"
local nn = attn.nn
local plots = require("seed_plots").from_args(arg, "scripts/examples/seeds/002_attention_chapter.lua")
local tokens = { "Your", "journey", "starts", "with", "one", "step" }

local function shape(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

local inputs = attn.tensor {
  { 0.43, 0.15, 0.89 }, -- Your     (x^1)
  { 0.55, 0.87, 0.66 }, -- journey  (x^2)
  { 0.57, 0.85, 0.64 }, -- starts   (x^3)
  { 0.22, 0.58, 0.33 }, -- with     (x^4)
  { 0.77, 0.25, 0.10 }, -- one      (x^5)
  { 0.05, 0.80, 0.55 }, -- step     (x^6)
}

-- 3.3.1 Simplified self-attention, step by step for the query "journey"
local query = inputs[2]
local attn_scores_2 = attn.empty(inputs:size(1))
for i = 1, #inputs do
  attn_scores_2[i] = inputs[i]:dot(query):item()
end
print(attn_scores_2)

local attn_weights_2 = attn_scores_2:softmax(1)
print("Attention weights:", attn_weights_2)
plots:weights("attn_weights_2", attn_weights_2, nil, tokens, "journey")
print("Sum:", attn_weights_2:sum())

local context_vec_2 = attn.zeros(query:size())
for i = 1, #inputs do
  context_vec_2:add_(inputs[i] * attn_weights_2[i])
end
print(context_vec_2)

-- every pair of tokens
local attn_scores = attn.empty(6, 6)
for i = 1, 6 do
  for j = 1, 6 do
    attn_scores[i][j] = inputs[i]:dot(inputs[j]):item()
  end
end
print(attn_scores)

local attn_weights = attn_scores:softmax(-1)
print(attn_weights)
plots:weights("attn_weights", attn_weights, tokens)

local all_context_vecs = attn_weights:matmul(inputs)
print(all_context_vecs)
-- the same, as one kernel call
assert(attn.simple_attention(inputs):allclose(all_context_vecs, 1e-6, 1e-6))

-- 3.4 Self-attention with trainable weights
local d_in, d_out = inputs:size(2), 2
attn.manual_seed(123)
local W_query = attn.rand(d_in, d_out)
local W_key = attn.rand(d_in, d_out)
local W_value = attn.rand(d_in, d_out)

local queries = inputs:matmul(W_query)
local keys = inputs:matmul(W_key)
local values = inputs:matmul(W_value)
print(queries)

attn_scores = queries:matmul(keys:t())
print(attn_scores)

local d_k = keys:size(2)
attn_weights = (attn_scores / d_k ^ 0.5):softmax(-1)
print(attn_weights)
plots:weights("attn_weights", attn_weights, tokens, nil, "trainable weights (attn.rand)")

local context_vec = attn_weights:matmul(values)
print(context_vec)

attn.manual_seed(123)
local sa_v1 = nn.SelfAttentionV1(d_in, d_out)
print(sa_v1(inputs))

attn.manual_seed(789)
local sa_v2 = nn.SelfAttentionV2(d_in, d_out)
print(sa_v2(inputs))

-- 3.5 Causal attention
queries = sa_v2.W_query(inputs)
keys = sa_v2.W_key(inputs)
attn_scores = queries:matmul(keys:t())
attn_weights = (attn_scores / keys:size(-1) ^ 0.5):softmax(-1)
print(attn_weights)
plots:weights("attn_weights", attn_weights, tokens, nil, "SelfAttentionV2 weights")

local context_length = attn_scores:size(1)
local mask_simple = attn.tril(attn.ones(context_length, context_length))
print(mask_simple)

local masked_simple = attn_weights * mask_simple
print(masked_simple)
plots:weights("masked_simple", masked_simple, tokens)

local row_sums = masked_simple:sum(-1, true)
local masked_simple_norm = masked_simple / row_sums
print(masked_simple_norm)
plots:weights("masked_simple_norm", masked_simple_norm, tokens)

local mask = attn.triu(attn.ones(context_length, context_length), 1)
local masked = attn_scores:masked_fill(mask:bool(), -math.huge)
print(masked)

attn_weights = (masked / keys:size(-1) ^ 0.5):softmax(-1)
print(attn_weights)
plots:weights("causal_attn_weights", attn_weights, tokens)

-- dropout: the notebook's PyTorch build draws the mask the MKL way (one
-- 32-bit draw per call); attn does the same, so the masks agree.
attn.manual_seed(123)
local dropout = nn.Dropout(0.5)
local example = attn.ones(6, 6)
print(dropout(example))

attn.manual_seed(123)
local dropped_weights = dropout(attn_weights)
print(dropped_weights)
plots:weights("dropped_weights", dropped_weights, tokens)

local batch = attn.stack({ inputs, inputs }, 1)
print("batch shape:", shape(batch))

attn.manual_seed(123)
context_length = batch:size(2)
local ca = nn.CausalAttention(d_in, d_out, context_length, 0.0)
local context_vecs = ca(batch)
print(context_vecs)
print("context_vecs.shape:", shape(context_vecs))

-- 3.6 Multi-head attention
attn.manual_seed(123)
local mha_wrapper = nn.MultiHeadAttentionWrapper(d_in, d_out, context_length, 0.0, 2)
context_vecs = mha_wrapper(batch)
print(context_vecs)
print("context_vecs.shape:", shape(context_vecs))

-- Quirk: the notebook's MultiHeadAttention.forward divides the scores by
-- `key.shape[-1]**0.5`, where `key` is a global left over from an earlier cell
-- (width d_out = 2), not the head width (1). scale = 1/sqrt(2) reproduces the
-- printed numbers ...
attn.manual_seed(123)
local mha = nn.MultiHeadAttention(d_in, d_out, context_length, 0.0, 2, { scale = 1 / math.sqrt(2) })
context_vecs = mha(batch)
print(context_vecs)
print("context_vecs.shape:", shape(context_vecs))

-- ... and the intended 1/sqrt(head_dim) gives the same first row; later rows
-- differ in the 4th decimal.
attn.manual_seed(123)
local mha_head_dim = nn.MultiHeadAttention(d_in, d_out, context_length, 0.0, 2)
print("with 1/sqrt(head_dim):")
print(mha_head_dim(batch))

-- Batched matrix multiplication over heads: (b, num_heads, num_tokens, head_dim) = (1, 2, 3, 4)
local a = attn.tensor { { { { 0.2745, 0.6584, 0.2775, 0.8573 },
                            { 0.8993, 0.0390, 0.9268, 0.7388 },
                            { 0.7179, 0.7058, 0.9156, 0.4340 } },
                          { { 0.0772, 0.3565, 0.1479, 0.5331 },
                            { 0.4066, 0.2318, 0.4545, 0.9737 },
                            { 0.4606, 0.5159, 0.4220, 0.5786 } } } }
print("a shape:", shape(a))
print(a:matmul(a:transpose(3, 4)))

local first_head = a[1][1]
print(first_head)
local first_res = first_head:matmul(first_head:t())
print("First head:\n", first_res)

local second_head = a[1][2]
print(second_head)
local second_res = second_head:matmul(second_head:t())
print("\nSecond head:\n", second_res)

-- Exercise 3.2: a wrapper whose output width is 2 (two heads of width 1)
attn.manual_seed(123)
local mha_w2 = nn.MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, 2)
print("Exercise 3.2, output shape:", shape(mha_w2(batch)))

-- Exercise 3.3: a GPT-2 sized MultiHeadAttention
local gpt2 = nn.MultiHeadAttention(768, 768, 1024, 0.0, 12)
print(string.format("Exercise 3.3, GPT-2 sized MultiHeadAttention parameters: %d", gpt2:num_parameters()))
