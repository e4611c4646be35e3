--- attn.nn.TransformerBlock(cfg): the book's chapter 4 pre-norm block:
-- x = x + drop_shortcut(att(norm1(x))); x = x + drop_shortcut(ff(norm2(x))).
-- Children, in torch's creation order (so the same seed draws the same
-- weights): `att` (MultiHeadAttention(emb_dim, emb_dim, context_length,
-- drop_rate, n_heads, {qkv_bias})), `ff` (FeedForward), `norm1`, `norm2`
-- (GPTLayerNorm: `scale`, `shift`), `drop_shortcut` (Dropout(drop_rate)).
-- `forward(x[, {use_cache = false}])`: x [b, n, emb_dim] -> [b, n, emb_dim];
-- with use_cache the attention appends this call's keys and values to its
-- KV cache and attends over all of it (see MultiHeadAttention); `reset_cache()`.
-- @classmod attn.nn.TransformerBlock
local Module = require "attn.nn.Module"
local caller = require "attn.caller"
local MultiHeadAttention = require "attn.nn.MultiHeadAttention"
local FeedForward = require "attn.nn.FeedForward"
local GPTLayerNorm = require "attn.nn.GPTLayerNorm"
local Dropout = require "attn.nn.Dropout"
local checks = require "attn.nn.checks"

local TransformerBlock = Module:extend("TransformerBlock")

function TransformerBlock:init(cfg)
  if type(cfg) ~= "table" then
    caller.error(("attn.nn.TransformerBlock: bad argument #1 'cfg' (expected a GPT config table, got %s)"):format(type(cfg)))
  end
  local C = "TransformerBlock"
  local d = checks.positive_integer(C, cfg.emb_dim, 1, "cfg.emb_dim")
  local ctx = checks.positive_integer(C, cfg.context_length, 1, "cfg.context_length")
  local heads = checks.positive_integer(C, cfg.n_heads, 1, "cfg.n_heads")
  local p = checks.probability(C, cfg.drop_rate, 1, "cfg.drop_rate")
  if d % heads ~= 0 then
    caller.error(("attn.nn.TransformerBlock: bad argument #1 'cfg' (emb_dim = %d must be divisible by n_heads = %d)"):format(
      d, heads))
  end
  if cfg.qkv_bias ~= nil and type(cfg.qkv_bias) ~= "boolean" then
    caller.error(("attn.nn.TransformerBlock: bad argument #1 'cfg' (qkv_bias must be a boolean, got %s)"):format(
      type(cfg.qkv_bias)))
  end
  self:add_module("att", MultiHeadAttention(d, d, ctx, p, heads, {qkv_bias = cfg.qkv_bias or false}))
  self:add_module("ff", FeedForward(cfg))
  self:add_module("norm1", GPTLayerNorm(d))
  self:add_module("norm2", GPTLayerNorm(d))
  self:add_module("drop_shortcut", Dropout(p))
end

-- x: (b, n, emb_dim) -> (b, n, emb_dim)
function TransformerBlock:forward(x, opts)
  local use_cache = opts ~= nil and opts.use_cache or false
  -- attention sub-block, residual around it
  local h = self.att(self.norm1(x), use_cache and {use_cache = true} or nil)
  x = self.drop_shortcut(h) + x
  -- feed-forward sub-block, residual around it
  h = self.ff(self.norm2(x))
  return self.drop_shortcut(h) + x
end

--- Empties the attention's KV cache.
function TransformerBlock:reset_cache()
  self.att:reset_cache()
end

return TransformerBlock
