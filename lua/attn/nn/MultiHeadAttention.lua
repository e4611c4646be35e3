--- attn.nn.MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads[, {qkv_bias = false, scale = nil,
-- score_mod = nil, mask_mod = nil}]):
-- fused multi-head causal self-attention.
-- Parameters, in creation order: `W_query`, `W_key`, `W_value`
-- (nn.Linear(d_in, d_out)), `out_proj` (nn.Linear(d_out, d_out), with bias);
-- a `dropout` child and the `mask` buffer (as PyTorch's register_buffer);
-- as in torch, its [n, n] corner hides where nonzero (see CausalAttention).
-- d_out must be divisible by num_heads; head_dim = d_out / num_heads.
-- forward(x): x [b, n, d_in] -> [b, n, d_out]. Q, K and V are one GEMM each
-- over all tokens, seen as [b, heads, n, head_dim] through strided views (no
-- copies); the C kernel runs across batch and heads; then out_proj.
-- opts.scale (a number finite in float32) overrides the default 1/sqrt(head_dim) of the
-- scores. With dropout = 1 (training) every weight is dropped, as in torch.
-- opts.score_mod / opts.mask_mod (attn.score_mod(fn) / attn.mask_mod(fn)) go to
-- scaled_dot_product_attention with the causal mask (h is the head); such a
-- module runs module by module, and not with use_cache.
-- @classmod attn.nn.MultiHeadAttention
local attn = require "attn"
local caller = require "attn.caller"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local Dropout = require "attn.nn.Dropout"
local checks = require "attn.nn.checks"
local fused_forward = require("attn.core").modules.attention_forward
local fused_recorded = require("attn.autograd.sdpa").fused_attention
local is_grad_enabled = require("attn.autograd").is_grad_enabled
local score_mods = require "attn.score_mod"
-- the class checks of forward: the metatable itself (no __metatable lookup)
local getmetatable = debug.getmetatable

local MHA = Module:extend("MultiHeadAttention")

function MHA:init(d_in, d_out, context_length, dropout, num_heads, opts)
  local C = "MultiHeadAttention"
  self.d_in = checks.positive_integer(C, d_in, 1, "d_in")
  self.d_out = checks.positive_integer(C, d_out, 2, "d_out")
  self.context_length = checks.positive_integer(C, context_length, 3, "context_length")
  checks.probability(C, dropout, 4, "dropout")
  self.num_heads = checks.positive_integer(C, num_heads, 5, "num_heads")
  if type(opts) == "table" then -- before the type checks: their message would say "userdata"
    self.score_mod = score_mods.check_option("attn.nn.MultiHeadAttention", "score_mod", opts.score_mod, "score")
    self.mask_mod = score_mods.check_option("attn.nn.MultiHeadAttention", "mask_mod", opts.mask_mod, "mask")
  end
  opts = checks.options(C, opts, 6, { qkv_bias = "boolean", scale = "number", score_mod = "userdata",
                                      mask_mod = "userdata" })
  if self.d_out % self.num_heads ~= 0 then
    caller.error(("attn.nn.MultiHeadAttention: d_out (%d) must be divisible by num_heads (%d)"):format(
      self.d_out, self.num_heads))
  end
  if opts.scale ~= nil then checks.finite(C, opts.scale, "scale") end
  self.head_dim = self.d_out // self.num_heads
  self.scale = opts.scale or 1 / math.sqrt(self.head_dim)
  local bias = opts.qkv_bias or false
  self:add_module("W_query", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_key", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("W_value", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("out_proj", Linear(self.d_out, self.d_out))
  self:add_module("dropout", Dropout(dropout))
  local n = self.context_length
  self:add_buffer("mask", attn.triu(attn.ones(n, n), 1))
  self._fused_children = false -- forward's cache of its class checks
end

-- The fused forward of x (one C call: projections, heads as strided views,
-- attention, out_proj; recorded when autograd records), or nil when the call
-- is not one the fused path runs (children replaced by other classes, dropout
-- 1, a bad x): it raises no error of its own for bad input, it leaves those
-- to forward_modules.
local function fused_call(self, x)
  local q, k, v, o, dropout = self.W_query, self.W_key, self.W_value, self.out_proj, self.dropout
  -- the class checks are made once per set of children (see CausalAttention's fused_call)
  local checked = self._fused_children
  if not (checked and checked[1] == q and checked[2] == k and checked[3] == v and checked[4] == o
          and checked[5] == dropout) then
    checked = getmetatable(q) == Linear and getmetatable(k) == Linear and getmetatable(v) == Linear
      and getmetatable(o) == Linear and getmetatable(dropout) == Dropout and { q, k, v, o, dropout }
    self._fused_children = checked
  end
  if not checked or self.score_mod or self.mask_mod then return nil end
  local p = dropout.training and dropout.p or 0
  if p >= 1 then return nil end
  -- recording: the same C forward, with the C backward of every parameter (attn.autograd.sdpa)
  local fused = is_grad_enabled() and Module.linears_recording(x, q, k, v, o) and fused_recorded or fused_forward
  return fused(x, self.d_in, self.context_length, 3, self.num_heads, self.scale, p,
    q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight, o.bias, self.mask)
end

--- x [b, n, d_in] (n <= context_length) -> [b, n, d_out]; with
-- `{use_cache = true}` see forward_cached; with
-- `{need_weights = true}` also the attention weights [b, num_heads, n, n]
-- (after dropout, as PyTorch returns them), e.g. for `attn.viz.heads`.
-- One C call (attn.core.modules.attention_forward: projections, heads as
-- strided views, attention, out_proj) when the children are the Linear and
-- Dropout modules the constructor made; otherwise, and for any bad input
-- (whose error the checks below raise), module by module.
function MHA:forward(x, opts)
  if opts ~= nil then
    opts = checks.options("MultiHeadAttention", opts, 2, { need_weights = "boolean", use_cache = "boolean" })
    if opts.use_cache then
      if opts.need_weights then
        caller.error("MultiHeadAttention:forward: options need_weights and use_cache cannot be combined")
      end
      return self:forward_cached(x)
    end
    if opts.need_weights then return self:forward_modules(x, true) end
  end
  return fused_call(self, x) or self:forward_modules(x)
end

-- m(x): the fused call without Module.__call's protected call (Module.direct_call)
MHA.__call = Module.direct_call(MHA, fused_call)

--- The forward module by module (the reference for the fused path); with
-- need_weights, also the weights [b, h, n, n].
function MHA:forward_modules(x, need_weights)
  checks.input("MultiHeadAttention", x, "x", self.d_in, 3, 3)
  local b, n = x:size(1), x:size(2)
  checks.context("MultiHeadAttention", x, self.context_length)
  local mask = checks.mask_buffer("MultiHeadAttention", self.mask, n)
  local h, hd = self.num_heads, self.head_dim
  -- [b, n, d_out] -> [b, n, h, hd] -> [b, h, n, hd]: views, no copies
  local queries = self.W_query(x):view(b, n, h, hd):transpose(2, 3)
  local keys = self.W_key(x):view(b, n, h, hd):transpose(2, 3)
  local values = self.W_value(x):view(b, n, h, hd):transpose(2, 3)
  -- p = 1: every weight dropped, in the graph (zero gradients, as torch), nothing drawn
  local p = self.dropout.training and self.dropout.p or 0
  local context, weights = attn.scaled_dot_product_attention(queries, keys, values,
    { is_causal = mask == nil, mask = mask, dropout_p = p, scale = self.scale, need_weights = need_weights,
      score_mod = self.score_mod, mask_mod = self.mask_mod })
  -- [b, h, n, hd] -> [b, n, h, hd] -> [b, n, d_out]
  context = context:transpose(2, 3):reshape(b, n, self.d_out)
  if need_weights then return self.out_proj(context), weights end
  return self.out_proj(context)
end

--- The KV-cached forward (for decoding): x [b, n, d_in] holds the tokens at
-- positions P+1..P+n, where P is the count of tokens cached by earlier
-- cached calls since reset_cache(). Their keys and values are written into
-- the cache [b, h, context_length, head_dim] and the queries attend over
-- the P+n cached keys under the mask rows P+1..P+n (the causal mask offset
-- by the cache length), so the outputs equal rows P+1..P+n of the uncached
-- forward over all P+n tokens. P+n must not exceed context_length; the
-- batch size must stay the one the cache was started with. Not recorded for
-- autograd (the cache is for inference).
function MHA:forward_cached(x)
  local C = "MultiHeadAttention"
  if self.score_mod or self.mask_mod then
    caller.error("MultiHeadAttention:forward: use_cache is not supported with score_mod / mask_mod (their q is the "
      .. "position within the call)")
  end
  checks.input(C, x, "x", self.d_in, 3, 3)
  local b, n = x:size(1), x:size(2)
  local cache = self.kv_cache
  local cached = checks.kv_cache(C, cache, x, self.context_length)
  local mask = self.mask
  if not attn.is_tensor(mask) or mask:dim() ~= 2 or mask:size(1) < cached + n or mask:size(2) < cached + n then
    checks.mask_buffer(C, mask, cached + n)
  end
  local h, hd = self.num_heads, self.head_dim
  return attn.no_grad(function()
    if not cache then
      cache = { keys = attn.zeros(b, h, self.context_length, hd), values = attn.zeros(b, h, self.context_length, hd),
                len = 0 }
      self.kv_cache = cache
    end
    -- [b, n, d_out] -> [b, n, h, hd] -> [b, h, n, hd]: views, no copies
    local queries = self.W_query(x):view(b, n, h, hd):transpose(2, 3)
    cache.keys:narrow(3, cached + 1, n):copy_(self.W_key(x):view(b, n, h, hd):transpose(2, 3))
    cache.values:narrow(3, cached + 1, n):copy_(self.W_value(x):view(b, n, h, hd):transpose(2, 3))
    cache.len = cached + n
    -- keys, values: [b, h, P+n, hd] (strided views of the cache)
    local keys = cache.keys:narrow(3, 1, cached + n)
    local values = cache.values:narrow(3, 1, cached + n)
    local p = self.dropout.training and self.dropout.p or 0
    -- mask rows P+1..P+n, columns 1..P+n: [n, P+n], nonzero = hidden
    local context = attn.scaled_dot_product_attention(queries, keys, values,
      { mask = mask:narrow(1, cached + 1, n):narrow(2, 1, cached + n), dropout_p = p, scale = self.scale })
    -- [b, h, n, hd] -> [b, n, h, hd] -> [b, n, d_out]
    context = context:transpose(2, 3):reshape(b, n, self.d_out)
    return self.out_proj(context)
  end)
end

--- Empties the KV cache (the next cached forward starts at position 1).
function MHA:reset_cache()
  self.kv_cache = nil
end

return MHA
