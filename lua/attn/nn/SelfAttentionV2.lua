--- attn.nn.SelfAttentionV2(d_in, d_out[, {qkv_bias = false}]): self-attention
-- with nn.Linear projections (the book's listing 3.2).
-- Parameters: `W_query`, `W_key`, `W_value`, each an nn.Linear(d_in, d_out),
-- created in that order (PyTorch's kaiming-uniform draws). forward(x):
-- x [n, d_in] (or [..., n, d_in]) -> [..., n, d_out].
-- @classmod attn.nn.SelfAttentionV2
local attn = require "attn"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local checks = require "attn.nn.checks"

local SelfAttentionV2 = Module:extend("SelfAttentionV2")

function SelfAttentionV2:init(d_in, d_out, opts)
  self.d_in = checks.positive_integer("SelfAttentionV2", d_in, 1, "d_in")
  self.d_out = checks.positive_integer("SelfAttentionV2", d_out, 2, "d_out")
  opts = checks.options("SelfAttentionV2", opts, 3, { qkv_bias = "boolean" })
  local bias = opts.qkv_bias or false
  self:add_module("W_query", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_key", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_value", Linear(self.d_in, self.d_out, { bias = bias }))
end

function SelfAttentionV2:forward(x)
  checks.input("SelfAttentionV2", x, "x", self.d_in, 2, 8)
  local keys = self.W_key(x)
  local queries = self.W_query(x)
  local values = self.W_value(x)
  return attn.scaled_dot_product_attention(queries, keys, values, { scale = 1 / math.sqrt(keys:size(-1)) })
end

return SelfAttentionV2
