--- attn.nn.MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads[, {qkv_bias = false}]):
-- num_heads independent CausalAttention heads whose outputs are concatenated.
-- Parameters: `heads` (a list; heads[1] is named "heads.0" as in PyTorch), each
-- a CausalAttention(d_in, d_out, ...) created in order. forward(x): x [b, n, d_in]
-- -> [b, n, num_heads * d_out].
-- @classmod attn.nn.MultiHeadAttentionWrapper
local attn = require "attn"
local Module = require "attn.nn.Module"
local CausalAttention = require "attn.nn.CausalAttention"
local checks = require "attn.nn.checks"

local Wrapper = Module:extend("MultiHeadAttentionWrapper")

function Wrapper:init(d_in, d_out, context_length, dropout, num_heads, opts)
  local C = "MultiHeadAttentionWrapper"
  self.d_in = checks.positive_integer(C, d_in, 1, "d_in")
  self.d_out = checks.positive_integer(C, d_out, 2, "d_out")
  self.context_length = checks.positive_integer(C, context_length, 3, "context_length")
  checks.probability(C, dropout, 4, "dropout")
  self.num_heads = checks.positive_integer(C, num_heads, 5, "num_heads")
  opts = checks.options(C, opts, 6, { qkv_bias = "boolean" })
  local heads = {}
  for i = 1, self.num_heads do
    heads[i] = CausalAttention(d_in, d_out, context_length, dropout, { qkv_bias = opts.qkv_bias or false })
  end
  self:add_module_list("heads", heads)
end

function Wrapper:forward(x)
  -- checked here so that errors name the wrapper, not its first head
  checks.input("MultiHeadAttentionWrapper", x, "x", self.d_in, 2, 8)
  checks.context("MultiHeadAttentionWrapper", x, self.context_length)
  local outs = {}
  for i = 1, self.num_heads do outs[i] = self.heads[i](x) end
  return attn.cat(outs, -1)
end

return Wrapper
