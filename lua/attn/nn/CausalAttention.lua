--- attn.nn.CausalAttention(d_in, d_out, context_length, dropout[, {qkv_bias = false}]):
-- single-head causal self-attention with dropout on the attention weights.
-- Parameters: `W_query`, `W_key`, `W_value` (nn.Linear(d_in, d_out), in that
-- order); a `dropout` child; the buffer `mask` = triu(ones(context_length,
-- context_length), 1), saved in the state dict as PyTorch's register_buffer.
-- forward(x): x [b, n, d_in] (or [n, d_in]) with n <= context_length ->
-- [b, n, d_out]. As in torch, the [n, n] corner of the mask buffer hides
-- where nonzero: the causal triangle runs as is_causal (no mask read by the
-- kernel), any other 0/1 pattern (loaded, or edited in place) as the
-- attention's mask; a row it hides entirely gives zeros. Dropout (training mode only) draws one number per
-- call from the generator, as torch's nn.Dropout on the weights does; with
-- dropout = 1 (training) every weight is dropped and the output is zeros.
-- @classmod attn.nn.CausalAttention
local attn = require "attn"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local Dropout = require "attn.nn.Dropout"
local checks = require "attn.nn.checks"
local fused_forward = require("attn.core").modules.attention_forward
local fused_recorded = require("attn.autograd.sdpa").fused_attention
local is_grad_enabled = require("attn.autograd").is_grad_enabled
local sqrt = math.sqrt
-- the class checks of forward: the metatable itself (no __metatable lookup)
local getmetatable = debug.getmetatable

local CausalAttention = Module:extend("CausalAttention")

function CausalAttention:init(d_in, d_out, context_length, dropout, opts)
  local C = "CausalAttention"
  self.d_in = checks.positive_integer(C, d_in, 1, "d_in")
  self.d_out = checks.positive_integer(C, d_out, 2, "d_out")
  self.context_length = checks.positive_integer(C, context_length, 3, "context_length")
  checks.probability(C, dropout, 4, "dropout")
  opts = checks.options(C, opts, 5, { qkv_bias = "boolean" })
  local bias = opts.qkv_bias or false
  self:add_module("W_query", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_key", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_value", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("dropout", Dropout(dropout))
  local n = self.context_length
  self:add_buffer("mask", attn.triu(attn.ones(n, n), 1))
  self._fused_children = false -- forward's cache of its class checks
end

-- The fused forward of x (one C call, recorded when autograd records), or
-- nil when the call is not one the fused path runs (children replaced by
-- other classes, dropout 1, a bad x): it raises no error of its own for
-- bad input, it leaves those to forward_modules.
local function fused_call(self, x)
  local q, k, v, dropout = self.W_query, self.W_key, self.W_value, self.dropout
  -- the class checks are made once per set of children (they cost more than
  -- the rest of a tiny forward's Lua): a child replaced by assignment is checked anew
  local checked = self._fused_children
  if not (checked and checked[1] == q and checked[2] == k and checked[3] == v and checked[4] == dropout) then
    checked = getmetatable(q) == Linear and getmetatable(k) == Linear and getmetatable(v) == Linear
      and getmetatable(dropout) == Dropout and { q, k, v, dropout }
    self._fused_children = checked
  end
  if not checked then return nil end
  local p = dropout.training and dropout.p or 0
  if p >= 1 then return nil end
  -- recording: the same C forward, with the C backward of every parameter (attn.autograd.sdpa)
  local fused = is_grad_enabled() and Module.linears_recording(x, q, k, v) and fused_recorded or fused_forward
  return fused(x, self.d_in, self.context_length, 0, 1, 1 / sqrt(self.d_out), p,
    q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, nil, nil, self.mask)
end

--- x [..., n, d_in] (2 to 8 dims, n <= context_length) -> [..., n, d_out]; with
-- `{need_weights = true}` also the attention weights [..., n, n] (after dropout).
-- One C call (attn.core.modules.attention_forward) when the children are the
-- Linear and Dropout modules the constructor made; otherwise, and for any bad
-- input (whose error the checks below raise), module by module.
function CausalAttention:forward(x, opts)
  if opts ~= nil then
    opts = checks.options("CausalAttention", opts, 2, { need_weights = "boolean" })
    if opts.need_weights then return self:forward_modules(x, true) end
  end
  return fused_call(self, x) or self:forward_modules(x)
end

-- m(x): the fused call without Module.__call's protected call (Module.direct_call)
CausalAttention.__call = Module.direct_call(CausalAttention, fused_call)

--- The forward module by module (the reference for the fused path); with
-- need_weights, also the weights [..., n, n].
function CausalAttention:forward_modules(x, need_weights)
  checks.input("CausalAttention", x, "x", self.d_in, 2, 8)
  local n = checks.context("CausalAttention", x, self.context_length)
  local mask = checks.mask_buffer("CausalAttention", self.mask, n)
  local keys = self.W_key(x)
  local queries = self.W_query(x)
  local values = self.W_value(x)
  -- p = 1: every weight dropped, in the graph (zero gradients, as torch), nothing drawn
  local p = self.dropout.training and self.dropout.p or 0
  return attn.scaled_dot_product_attention(queries, keys, values,
    { is_causal = mask == nil, mask = mask, dropout_p = p, scale = 1 / math.sqrt(keys:size(-1)),
      need_weights = need_weights })
end

return CausalAttention
