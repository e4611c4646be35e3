-- FlexAttention's examples (the PyTorch blog post "FlexAttention: The
-- Flexibility of PyTorch with the Performance of FlashAttention") written
-- with attn.score_mod and attn.mask_mod as a user writes them, each beside
-- a dense reference in plain Lua that builds the same thing with the options
-- attn had before: an explicit bias tensor [B, H, Lq, Lk] or an explicit mask.
-- scripts/examples/flex.lua runs them; spec/flex_examples_spec.lua checks them
-- against PyTorch 1.13.
--   local flex = dofile("scripts/examples/flex_mods.lua")
--   local sm = flex.alibi(attn.alibi_slopes(8))
-- Positions b, h, q, k are 1-based, as attn's tracer gives them.
local attn = require "attn"

local M = {}

-- score_mods ---------------------------------------------------------------

-- relative position: the score plus the signed distance q - k
function M.relative_position()
  return attn.score_mod(function(score, b, h, q, k) return score + (q - k) end)
end

-- ALiBi: each head's slope (a captured [H] tensor) times the distance
function M.alibi(slopes)
  return attn.score_mod(function(score, b, h, q, k) return score - slopes[h] * (q - k):abs() end)
end

-- tanh softcapping (Gemma 2, Grok): c * tanh(score / c)
function M.softcap(c)
  return attn.score_mod(function(score, b, h, q, k) return (score / c):tanh() * c end)
end

-- T5's relative-position bucket of rel = k - q (Hugging Face's
-- _relative_position_bucket, bidirectional), 0-based: the nearer distances
-- get a bucket each, the farther ones share log-spaced buckets. Written with
-- traced operations only; attn.where picks per element, as an `if` cannot.
function M.t5_bucket(rel, num_buckets, max_exact, max_distance)
  local half = num_buckets // 2
  local base = attn.where(rel:gt(0), half, 0)
  local n = rel:abs()
  -- maximum(1): the log of distance 0 is never taken, though where discards it
  local large = ((n:maximum(1) / max_exact):log() / math.log(max_distance / max_exact) * (half - max_exact)):floor()
  large = (large + max_exact):minimum(half - 1)
  return base + attn.where(n:lt(max_exact), n, large)
end

-- T5-style bucketed relative bias: a learnable table [H, num_buckets]
function M.t5_bias(tbl, o)
  return attn.score_mod(function(score, b, h, q, k)
    local bucket = M.t5_bucket(k - q, o.num_buckets, o.max_exact, o.max_distance)
    return score + tbl[{ h, bucket + 1 }]
  end)
end

-- a learnable relative-position table [H, Lq + Lk - 1] ([H, 2L - 1] for Lq = Lk = L)
function M.relative_table(tbl, lk)
  return attn.score_mod(function(score, b, h, q, k) return score + tbl[{ h, q - k + lk }] end)
end

-- mask_mods (true = may attend) --------------------------------------------

function M.causal()
  return attn.mask_mod(function(b, h, q, k) return q:ge(k) end)
end

-- causal, and at most w keys back (w + 1 keys in all)
function M.sliding_window(w)
  return attn.mask_mod(function(b, h, q, k) return q:ge(k):logical_and((q - k):le(w)) end)
end

-- prefix LM: the first `prefix` keys are seen by every query, the rest causally
function M.prefix_lm(prefix)
  return attn.mask_mod(function(b, h, q, k) return k:le(prefix):logical_or(q:ge(k)) end)
end

-- document masking: ids [B, L] (a captured tensor of document ids), causal
function M.document(ids)
  return attn.mask_mod(function(b, h, q, k) return ids[{ b, q }]:eq(ids[{ b, k }]):logical_and(q:ge(k)) end)
end

-- The examples by name, as spec/fixtures/flex_cases.lua names them. x holds
-- a case's sizes (b, hq, lq, lk), parameters (c, w, prefix, num_buckets,
-- max_exact, max_distance) and captured tensors (slopes, table, ids).
-- make(x): the scaled_dot_product_attention options of the example.
-- bias(x, b, h, q, k, at) / visible(x, b, h, q, k, at): the dense reference at
-- one position in plain Lua numbers (at(name, i, j) reads a captured tensor);
-- bias returns const[, name, flat index, coef]: const + coef * name's element
-- at that flat 1-based index, so that the reference knows where each
-- learnable table entry went. dense_opts(x): options the dense reference adds.
local function bucket_number(rel, nb, me, md)
  local half = nb // 2
  local base = rel > 0 and half or 0
  local n = math.abs(rel)
  if n < me then return base + n end
  local large = me + math.floor(math.log(math.max(n, 1) / me) / math.log(md / me) * (half - me))
  return base + math.min(large, half - 1)
end
M.bucket_number = bucket_number

local function table_bias(x, h, q, k)
  local width = x.table:size(2)
  return 0, "table", (h - 1) * width + q - k + x.lk, 1
end

M.examples = {
  relative_position = {
    make = function() return { score_mod = M.relative_position() } end,
    bias = function(_, _, _, q, k) return q - k end,
  },
  alibi = {
    make = function(x) return { score_mod = M.alibi(x.slopes) } end,
    bias = function(_, _, h, q, k) return 0, "slopes", h, -math.abs(q - k) end,
  },
  softcap = {
    make = function(x) return { score_mod = M.softcap(x.c) } end,
    dense_opts = function(x) return { softcap = x.c } end,
  },
  t5_bias = {
    make = function(x) return { score_mod = M.t5_bias(x.table, x) } end,
    bias = function(x, _, h, q, k)
      return 0, "table", (h - 1) * x.num_buckets + bucket_number(k - q, x.num_buckets, x.max_exact, x.max_distance)
        + 1, 1
    end,
  },
  relative_table = {
    make = function(x) return { score_mod = M.relative_table(x.table, x.lk) } end,
    bias = function(x, _, h, q, k) return table_bias(x, h, q, k) end,
  },
  causal = {
    make = function() return { mask_mod = M.causal() } end,
    visible = function(_, _, _, q, k) return q >= k end,
  },
  sliding_window = {
    make = function(x) return { mask_mod = M.sliding_window(x.w) } end,
    visible = function(x, _, _, q, k) return q >= k and q - k <= x.w end,
  },
  prefix_lm = {
    make = function(x) return { mask_mod = M.prefix_lm(x.prefix) } end,
    visible = function(x, _, _, q, k) return k <= x.prefix or q >= k end,
  },
  document = {
    make = function(x) return { mask_mod = M.document(x.ids) } end,
    visible = function(_, b, _, q, k, at) return at("ids", b, q) == at("ids", b, k) and q >= k end,
  },
  -- a learnable relative table and document masking together (the case adds
  -- the built-in options around them)
  combined = {
    make = function(x) return { score_mod = M.relative_table(x.table, x.lk), mask_mod = M.document(x.ids) } end,
    bias = function(x, _, h, q, k) return table_bias(x, h, q, k) end,
    visible = function(_, b, _, q, k, at) return at("ids", b, q) == at("ids", b, k) and q >= k end,
  },
}

-- The dense reference of example `name` for x: the options (bias tensor
-- [B, H, Lq, Lk] requiring grad, mask [B, H, Lq, Lk] with 1 = hidden, and
-- dense_opts) and grads(), which after a backward maps the bias's gradient
-- back to the captured tensors named in bias(): { name = gradient }.
function M.dense(name, x)
  local ex = assert(M.examples[name], "no example " .. tostring(name))
  local data = {}
  local function at(tname, i, j)
    data[tname] = data[tname] or x[tname]:totable()
    local row = data[tname][i]
    return j and row[j] or row
  end
  local o = ex.dense_opts and ex.dense_opts(x) or {}
  local where = {} -- per learnable bias element: { name, flat index, coef, its flat position in the bias }
  local leaf -- the bias tensor (a caller may add to o.bias; the gradient is read here)
  if ex.bias or ex.visible then
    local bias, mask = {}, {}
    for b = 1, x.b do
      local bb, mb = {}, {}
      for h = 1, x.hq do
        local bh, mh = {}, {}
        for q = 1, x.lq do
          local bq, mq = {}, {}
          for k = 1, x.lk do
            if ex.bias then
              local const, tname, index, coef = ex.bias(x, b, h, q, k, at)
              if tname then
                data["flat " .. tname] = data["flat " .. tname] or x[tname]:contiguous():view(-1):totable()
                const = const + coef * data["flat " .. tname][index]
                where[#where + 1] = { tname, index, coef, (((b - 1) * x.hq + h - 1) * x.lq + q - 1) * x.lk + k }
              end
              bq[k] = const
            end
            if ex.visible then mq[k] = ex.visible(x, b, h, q, k, at) and 0 or 1 end
          end
          bh[q], mh[q] = bq, mq
        end
        bb[h], mb[h] = bh, mh
      end
      bias[b], mask[b] = bb, mb
    end
    if ex.bias then leaf = attn.tensor(bias, { requires_grad = true }); o.bias = leaf end
    if ex.visible then o.mask = attn.tensor(mask) end
  end
  local function grads()
    local g, sums = {}, {}
    if #where == 0 or not leaf.grad then return g end
    local db = leaf.grad:contiguous():view(-1):totable()
    for _, w in ipairs(where) do
      local s = sums[w[1]]
      if not s then
        s = {}
        for j = 1, x[w[1]]:numel() do s[j] = 0 end
        sums[w[1]] = s
      end
      s[w[2]] = s[w[2]] + w[3] * db[w[4]]
    end
    for tname, s in pairs(sums) do g[tname] = attn.tensor(s):view(table.unpack(x[tname]:size())) end
    return g
  end
  return o, grads
end

return M
