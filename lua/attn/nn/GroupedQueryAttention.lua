--- attn.nn.GroupedQueryAttention(d_in, d_out, context_length, num_heads, num_kv_groups[, {qkv_bias = false, rope_base = 10000, window = nil, dropout = 0}]):
-- Llama-style causal self-attention with grouped-query heads and RoPE, as the
-- GroupedQueryAttention of "LLMs from scratch" (ch05/07, Llama 3).
-- Parameters, in the book's creation order (so attn.manual_seed gives
-- torch's bits): `W_key`, `W_value` (nn.Linear(d_in, num_kv_groups *
-- head_dim)), `W_query` (nn.Linear(d_in, d_out)), `out_proj`
-- (nn.Linear(d_out, d_out), no bias); the three projections have a bias only
-- with qkv_bias. A `dropout` child drops attention weights in training.
-- head_dim = d_out / num_heads, which must be even (RoPE rotates pairs);
-- num_heads must be divisible by num_kv_groups: query heads g*(j-1)+1..g*j
-- (g = num_heads / num_kv_groups) share kv head j, as the book's
-- repeat_interleave, but the kernel reads K and V in place (enable_gqa).
-- RoPE ("half" style, base rope_base) on queries and keys at positions 1..n;
-- causal, or with `window = w` each token sees itself and the w - 1 before.
-- `score_mod` / `mask_mod` (attn.score_mod(fn) / attn.mask_mod(fn)) go to
-- scaled_dot_product_attention with the causal mask (h is the query head);
-- not with use_cache.
-- forward(x[, {use_cache = false}]): x [b, n, d_in] -> [b, n, d_out]; with
-- use_cache the tokens continue the cached sequence (see forward_cached);
-- reset_cache() empties the cache. The state dict holds the parameters
-- only: a torch state dict of the class loads as it is; one of the book's
-- notebook version, which also saves its `mask`, `cos` and `sin` buffers,
-- loads with strict = false (they are recomputed here).
-- @classmod attn.nn.GroupedQueryAttention
local attn = require "attn"
local argcheck = require "attn.argcheck"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local Dropout = require "attn.nn.Dropout"
local checks = require "attn.nn.checks"
local caller = require "attn.caller"
local score_mods = require "attn.score_mod"

local GQA = Module:extend("GroupedQueryAttention")
local C = "GroupedQueryAttention"

local function ctor_error(fmt, ...)
  argcheck.fail("attn.nn." .. C, fmt, ...)
end

function GQA:init(d_in, d_out, context_length, num_heads, num_kv_groups, opts)
  self.d_in = checks.positive_integer(C, d_in, 1, "d_in")
  self.d_out = checks.positive_integer(C, d_out, 2, "d_out")
  self.context_length = checks.positive_integer(C, context_length, 3, "context_length")
  self.num_heads = checks.positive_integer(C, num_heads, 4, "num_heads")
  self.num_kv_groups = checks.positive_integer(C, num_kv_groups, 5, "num_kv_groups")
  if type(opts) == "table" then -- before the type checks: their message would say "userdata"
    self.score_mod = score_mods.check_option("attn.nn.GroupedQueryAttention", "score_mod", opts.score_mod, "score")
    self.mask_mod = score_mods.check_option("attn.nn.GroupedQueryAttention", "mask_mod", opts.mask_mod, "mask")
  end
  opts = checks.options(C, opts, 6, { qkv_bias = "boolean", rope_base = "number", window = "number",
                                      dropout = "number", score_mod = "userdata", mask_mod = "userdata" })
  if self.d_out % self.num_heads ~= 0 then
    ctor_error("d_out (%d) must be divisible by num_heads (%d)", self.d_out, self.num_heads)
  end
  if self.num_heads % self.num_kv_groups ~= 0 then
    ctor_error("num_heads (%d) must be divisible by num_kv_groups (%d)", self.num_heads, self.num_kv_groups)
  end
  self.head_dim = self.d_out // self.num_heads
  if self.head_dim % 2 ~= 0 then
    ctor_error("head_dim = d_out / num_heads = %d must be even (RoPE rotates pairs)", self.head_dim)
  end
  self.group_size = self.num_heads // self.num_kv_groups
  local base = opts.rope_base or 10000
  if not (base > 0 and base < math.huge) then
    ctor_error("bad option 'rope_base' (expected a finite number > 0, got %s)", tostring(base))
  end
  self.rope_base = base
  if opts.window ~= nil then
    local w = math.tointeger(opts.window)
    if not w or w < 1 then
      ctor_error("bad option 'window' (expected a positive integer, the tokens each token sees, got %s)",
        tostring(opts.window))
    end
    self.window = w
  end
  local p = opts.dropout or 0
  if not (p >= 0 and p <= 1) then
    ctor_error("bad option 'dropout' (expected a probability in [0, 1], got %s)", tostring(p))
  end
  local bias = opts.qkv_bias or false
  local kv_width = self.num_kv_groups * self.head_dim
  self:add_module("W_key", Linear(self.d_in, kv_width, { bias = bias }))
  self:add_module("W_value", Linear(self.d_in, kv_width, { bias = bias }))
  self:add_module("W_query", Linear(self.d_in, self.d_out, { bias = bias }))
  self:add_module("out_proj", Linear(self.d_out, self.d_out, { bias = false }))
  self:add_module("dropout", Dropout(p))
end

--- The sizes and options, for tostring(m).
function GQA:extra_repr()
  return ("num_heads=%d, num_kv_groups=%d, head_dim=%d, rope_base=%.10g%s"):format(self.num_heads,
    self.num_kv_groups, self.head_dim, self.rope_base,
    self.window and (", window=" .. self.window) or "")
end

-- The projections of x [b, n, d_in] as heads: queries [b, h, n, hd] and
-- keys [b, kv, n, hd] rotated at positions first..first+n-1, values
-- [b, kv, n, hd] (a strided view, no copy).
local function project(self, x, b, n, first)
  local h, kv, hd = self.num_heads, self.num_kv_groups, self.head_dim
  local rope = { base = self.rope_base }
  if first ~= 1 then
    local pos = {}
    for i = 1, n do pos[i] = first + i - 1 end
    rope.positions = pos
  end
  local queries = attn.rope(self.W_query(x):view(b, n, h, hd):transpose(2, 3), rope)
  local keys = attn.rope(self.W_key(x):view(b, n, kv, hd):transpose(2, 3), rope)
  local values = self.W_value(x):view(b, n, kv, hd):transpose(2, 3)
  return queries, keys, values
end

-- The attention of queries [b, h, Lq, hd] over keys, values [b, kv, Lk, hd]
-- (Lk >= Lq, the queries being the last Lq positions), then out_proj.
local function attend(self, queries, keys, values, b, n)
  -- p = 1: every weight dropped, in the graph (zero gradients, as torch), nothing drawn
  local p = self.dropout.training and self.dropout.p or 0
  local o = { dropout_p = p, score_mod = self.score_mod, mask_mod = self.mask_mod }
  if self.group_size > 1 then o.enable_gqa = true end
  if self.window then
    o.window = { self.window - 1, 0 }
  elseif queries:size(3) == keys:size(3) then
    o.is_causal = true -- the plain kernel (and its C backward) when no variant is needed
  else
    o.window = { -1, 0 } -- bottom-right causal: the queries are the last positions
  end
  local context = attn.scaled_dot_product_attention(queries, keys, values, o)
  -- [b, h, n, hd] -> [b, n, h, hd] -> [b, n, d_out]
  return self.out_proj(context:transpose(2, 3):reshape(b, n, self.d_out))
end

--- x [b, n, d_in] (n <= context_length) -> [b, n, d_out]; with
-- `{use_cache = true}` see forward_cached. Recorded for autograd.
function GQA:forward(x, opts)
  if opts ~= nil then
    opts = checks.options(C, opts, 2, { use_cache = "boolean" })
    if opts.use_cache then return self:forward_cached(x) end
  end
  checks.input(C, x, "x", self.d_in, 3, 3)
  checks.context(C, x, self.context_length)
  local b, n = x:size(1), x:size(2)
  local queries, keys, values = project(self, x, b, n, 1)
  return attend(self, queries, keys, values, b, n)
end

--- The KV-cached forward (for decoding): x [b, n, d_in] holds the tokens at
-- positions P+1..P+n, P being the tokens cached since reset_cache(). Their
-- rotated keys and values join the cache [b, num_kv_groups,
-- context_length, head_dim] (num_kv_groups heads only: the cache is
-- group_size times smaller than a multi-head one) and the queries, rotated
-- at P+1..P+n, attend over the P+n cached keys bottom-right causally (or in
-- the window), so the outputs equal rows P+1..P+n of the uncached forward
-- over all P+n tokens. The cache keeps every token, also with a window
-- (the window hides the older ones); P+n must not exceed context_length and
-- the batch size must stay the one the cache started with. Not recorded
-- for autograd (the cache is for inference).
function GQA:forward_cached(x)
  if self.score_mod or self.mask_mod then
    caller.error("GroupedQueryAttention:forward: use_cache is not supported with score_mod / mask_mod (their q is "
      .. "the position within the call)")
  end
  checks.input(C, x, "x", self.d_in, 3, 3)
  local b, n = x:size(1), x:size(2)
  local cache = self.kv_cache
  local cached = checks.kv_cache(C, cache, x, self.context_length)
  return attn.no_grad(function()
    if not cache then
      local kv, hd = self.num_kv_groups, self.head_dim
      cache = { keys = attn.zeros(b, kv, self.context_length, hd), values = attn.zeros(b, kv, self.context_length, hd),
                len = 0 }
      self.kv_cache = cache
    end
    local queries, keys, values = project(self, x, b, n, cached + 1)
    cache.keys:narrow(3, cached + 1, n):copy_(keys)
    cache.values:narrow(3, cached + 1, n):copy_(values)
    cache.len = cached + n
    -- [b, kv, P+n, hd]: strided views of the cache
    return attend(self, queries, cache.keys:narrow(3, 1, cached + n), cache.values:narrow(3, 1, cached + n), b, n)
  end)
end

--- Empties the KV cache (the next cached forward starts at position 1).
function GQA:reset_cache()
  self.kv_cache = nil
end

return GQA
