--- attn.nn.GPTModel(cfg): the book's chapter 4 GPT. cfg = {vocab_size,
-- context_length, emb_dim, n_heads, n_layers, drop_rate, qkv_bias}.
-- Children, in torch's creation order (so after the same attn.manual_seed
-- the weights are the book model's bits): `tok_emb` (Embedding(vocab_size,
-- emb_dim)), `pos_emb` (Embedding(context_length, emb_dim)), `drop_emb`
-- (Dropout), `trf_blocks` (Sequential of n_layers TransformerBlock),
-- `final_norm` (GPTLayerNorm), `out_head` (Linear(emb_dim, vocab_size, no
-- bias)). Parameter names are the book's: `tok_emb.weight`,
-- `trf_blocks.0.att.W_query.weight`, `trf_blocks.0.ff.layers.0.weight`,
-- `trf_blocks.0.norm1.scale`, `final_norm.shift`, `out_head.weight`, ...,
-- so its state dicts load unchanged (m:load, load_state_dict).
-- `forward(idx[, {use_cache = false}])`: idx [b, n] of 1-based token ids
-- (integer-valued floats in 1..vocab_size) -> logits [b, n, vocab_size].
-- With use_cache the tokens continue the ones cached since `reset_cache()`
-- (positions P+1..P+n) and the logits equal those rows of the uncached
-- forward over the whole sequence. See attn.generate.
--
-- `GPTModel.from_pretrained(path)`: Hugging Face GPT-2 weights (its
-- `model.safetensors`, the file or its folder, with the `config.json` beside
-- it when there is one) as a GPTModel in eval mode, qkv_bias = true,
-- `out_head` tied to `tok_emb` (one tensor; a file with its own, different
-- `lm_head.weight` keeps it), LayerNorm eps and drop_rate (resid_pdrop) from
-- config.json. Keys with or without the `transformer.` prefix; the causal-mask
-- buffers `h.N.attn.bias` / `attn.masked_bias` are ignored. Without
-- config.json the sizes come from the shapes and n_head = emb / 64 (GPT-2's
-- head size at every size). A missing, unexpected or misshapen tensor is an
-- error naming its key, raised before anything is built. The logits equal
-- Hugging Face's GPT2LMHeadModel's to float32 rounding.
-- `model:save_pretrained(dir)`: writes dir/model.safetensors (that layout,
-- no prefix, F32, names sorted, no mask buffers; lm_head.weight only when
-- out_head differs from tok_emb) and dir/config.json; dir must exist.
-- Saving what from_pretrained loaded gives the same bytes.
-- @classmod attn.nn.GPTModel
local attn = require "attn"
local caller = require "attn.caller"
local Module = require "attn.nn.Module"
local Embedding = require "attn.nn.Embedding"
local Dropout = require "attn.nn.Dropout"
local Sequential = require "attn.nn.Sequential"
local Linear = require "attn.nn.Linear"
local TransformerBlock = require "attn.nn.TransformerBlock"
local GPTLayerNorm = require "attn.nn.GPTLayerNorm"
local checks = require "attn.nn.checks"

local GPTModel = Module:extend("GPTModel")

local CFG_KEYS = {vocab_size = true, context_length = true, emb_dim = true, n_heads = true, n_layers = true,
                  drop_rate = true, qkv_bias = true}

local function bad_cfg(fmt, ...)
  caller.error(("attn.nn.GPTModel: bad argument #1 'cfg' (" .. fmt .. ")"):format(...))
end

-- every key known, each of its type and range, emb_dim divisible by n_heads
local function check_cfg(cfg)
  if type(cfg) ~= "table" or attn.is_tensor(cfg) then
    bad_cfg("expected a table {vocab_size, context_length, emb_dim, n_heads, n_layers, drop_rate, qkv_bias}, got %s",
      attn.is_tensor(cfg) and "attn.Tensor" or type(cfg))
  end
  for k in pairs(cfg) do
    if not CFG_KEYS[k] then
      bad_cfg("unknown key '%s'; known: context_length, drop_rate, emb_dim, n_heads, n_layers, qkv_bias, vocab_size",
        tostring(k))
    end
  end
  local out = {}
  for _, k in ipairs({"vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"}) do
    local v = cfg[k]
    local i = type(v) == "number" and v == v and math.tointeger(v) or nil
    if not i or i < 1 then
      bad_cfg("%s must be a positive integer, got %s", k, type(v) == "number" and tostring(v) or type(v))
    end
    out[k] = i
  end
  local p = cfg.drop_rate == nil and 0 or cfg.drop_rate
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    bad_cfg("drop_rate must be a probability in [0, 1], got %s", type(p) == "number" and tostring(p) or type(p))
  end
  out.drop_rate = p
  if cfg.qkv_bias ~= nil and type(cfg.qkv_bias) ~= "boolean" then
    bad_cfg("qkv_bias must be a boolean, got %s", type(cfg.qkv_bias))
  end
  out.qkv_bias = cfg.qkv_bias or false
  if out.emb_dim % out.n_heads ~= 0 then
    bad_cfg("emb_dim = %d must be divisible by n_heads = %d", out.emb_dim, out.n_heads)
  end
  if out.vocab_size > 1 << 24 or out.context_length > 1 << 24 then
    bad_cfg("vocab_size and context_length must be at most 2^24 (ids are float32), got %d and %d",
      out.vocab_size, out.context_length)
  end
  return out
end

function GPTModel:init(cfg, extra)
  cfg = check_cfg(cfg)
  checks.none("GPTModel", extra, 2, "(cfg)")
  self.cfg = cfg
  self.cache_len = 0
  self:add_module("tok_emb", Embedding(cfg.vocab_size, cfg.emb_dim))
  self:add_module("pos_emb", Embedding(cfg.context_length, cfg.emb_dim))
  self:add_module("drop_emb", Dropout(cfg.drop_rate))
  local blocks = {}
  for i = 1, cfg.n_layers do blocks[i] = TransformerBlock(cfg) end
  self:add_module("trf_blocks", Sequential(table.unpack(blocks)))
  self:add_module("final_norm", GPTLayerNorm(cfg.emb_dim))
  self:add_module("out_head", Linear(cfg.emb_dim, cfg.vocab_size, {bias = false}))
end

local function shape(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

-- idx must be [b, n] (n >= 1); its values are checked by the embedding (integers in 1..vocab_size)
local function check_ids(idx)
  if not attn.is_tensor(idx) then
    caller.error(("GPTModel:forward: bad argument #1 'idx' (expected an attn.Tensor [batch, tokens] of 1-based token ids, "
      .. "got %s)"):format(type(idx)))
  end
  if idx:dim() ~= 2 or idx:size(2) < 1 or idx:size(1) < 1 then
    caller.error(("GPTModel:forward: bad argument #1 'idx' (expected shape [batch, tokens] with both >= 1, got %s)"):format(
      shape(idx)))
  end
end

-- idx: (b, n) -> logits (b, n, vocab_size)
function GPTModel:forward(idx, opts)
  opts = checks.options("GPTModel", opts, 2, {use_cache = "boolean"})
  check_ids(idx)
  local b, n = idx:size(1), idx:size(2)
  local use_cache = opts.use_cache or false
  local start = use_cache and self.cache_len or 0
  if start + n > self.cfg.context_length then
    if use_cache then
      caller.error(("GPTModel:forward: the KV cache holds %d tokens; %d more exceed context_length = %d (call reset_cache())"):format(
        start, n, self.cfg.context_length))
    end
    caller.error(("GPTModel:forward: idx has %d tokens (shape %s), more than context_length = %d"):format(
      n, shape(idx), self.cfg.context_length))
  end
  if use_cache and start > 0 and self.cache_batch ~= b then
    caller.error(("GPTModel:forward: the KV cache holds a batch of %d, got idx of shape %s (call reset_cache() first)"):format(
      self.cache_batch, shape(idx)))
  end
  -- tokens (b, n, emb) + positions (n, emb), broadcast over the batch
  local positions = attn.arange(start + 1, start + n + 1)
  local ok, tokens = pcall(self.tok_emb, idx)
  if not ok then
    -- "Embedding:forward: ids[3] = 1.5 is not an integer token id" names idx here
    caller.error(("GPTModel:forward: bad argument #1 'idx' (%s)"):format(
      (tostring(tokens):gsub("^.-Embedding:forward: ", ""))))
  end
  local x = tokens + self.pos_emb(positions)
  x = self.drop_emb(x)
  local block_opts = use_cache and {use_cache = true} or nil
  for i = 1, #self.trf_blocks do x = self.trf_blocks[i](x, block_opts) end
  if use_cache then self.cache_len, self.cache_batch = start + n, b end
  x = self.final_norm(x)
  return self.out_head(x)
end

--- Empties every block's KV cache (the next cached forward starts at position 1).
function GPTModel:reset_cache()
  self.cache_len, self.cache_batch = 0, nil
  for i = 1, #self.trf_blocks do self.trf_blocks[i]:reset_cache() end
end

local pretrained = require "attn.nn.gpt2_pretrained"

--- A GPTModel holding Hugging Face GPT-2 weights (see above).
function GPTModel.from_pretrained(path) return pretrained.from_pretrained(GPTModel, path) end

--- Writes dir/model.safetensors and dir/config.json in Hugging Face's GPT-2 layout (see above).
function GPTModel:save_pretrained(dir) return pretrained.save_pretrained(self, dir) end

return GPTModel
