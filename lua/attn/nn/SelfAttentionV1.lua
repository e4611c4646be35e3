--- attn.nn.SelfAttentionV1(d_in, d_out): self-attention with weight matrices
-- drawn by attn.rand (the book's listing 3.1).
-- Parameters, in creation order: `W_query`, `W_key`, `W_value`, each
-- [d_in, d_out] from attn.rand, so after attn.manual_seed(s) they are
-- torch.rand's numbers. forward(x): x [n, d_in] (or [..., n, d_in]) ->
-- softmax(q k^T / sqrt(d_out)) v, [..., n, d_out], by the C attention kernel.
-- @classmod attn.nn.SelfAttentionV1
local attn = require "attn"
local Module = require "attn.nn.Module"
local checks = require "attn.nn.checks"

local SelfAttentionV1 = Module:extend("SelfAttentionV1")

function SelfAttentionV1:init(d_in, d_out, extra)
  checks.none("SelfAttentionV1", extra, 3, "(d_in, d_out) only")
  self.d_in = checks.positive_integer("SelfAttentionV1", d_in, 1, "d_in")
  self.d_out = checks.positive_integer("SelfAttentionV1", d_out, 2, "d_out")
  self:add_parameter("W_query", attn.rand(self.d_in, self.d_out))
  self:add_parameter("W_key", attn.rand(self.d_in, self.d_out))
  self:add_parameter("W_value", attn.rand(self.d_in, self.d_out))
end

function SelfAttentionV1:forward(x)
  checks.input("SelfAttentionV1", x, "x", self.d_in, 2, 8)
  local queries = x:matmul(self.W_query)
  local keys = x:matmul(self.W_key)
  local values = x:matmul(self.W_value)
  return attn.scaled_dot_product_attention(queries, keys, values, { scale = 1 / math.sqrt(keys:size(-1)) })
end

function SelfAttentionV1:extra_repr()
  return ("d_in=%d, d_out=%d"):format(self.d_in, self.d_out)
end

return SelfAttentionV1
