--- attn.nn.Attention(d_model[, {row_dim = 1, col_dim = 2}]): attention with
-- separate inputs for queries, keys and values (encoder-decoder / cross
-- attention, notebook 000).
-- Parameters: `W_q`, `W_k`, `W_v`, each nn.Linear(d_model, d_model, {bias = false}).
-- forward(q_in, k_in, v_in[, mask]): sims = q k^T over (row_dim, col_dim),
-- scaled by 1/sqrt(k:size(col_dim)); where mask is nonzero (it must hold only
-- 0 and 1) the scaled scores are replaced by -1e9 (so a fully masked row averages v uniformly, as in the
-- notebook); softmax over col_dim; times v.
-- @classmod attn.nn.Attention
local attn = require "attn"
local caller = require "attn.caller"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local checks = require "attn.nn.checks"
local mask_kind = require("attn.core").modules.mask_kind

local Attention = Module:extend("Attention")

function Attention:init(d_model, opts)
  local C = "Attention"
  self.d_model = checks.positive_integer(C, d_model or 2, 1, "d_model")
  opts = checks.options(C, opts, 2, { row_dim = "number", col_dim = "number" })
  self.row_dim = opts.row_dim or 1
  self.col_dim = opts.col_dim or 2
  for _, key in ipairs { "row_dim", "col_dim" } do
    local d = self[key]
    if math.tointeger(d) == nil or d == 0 then
      caller.error(("attn.nn.Attention: bad option '%s' (expected a nonzero integer dim, got %s)"):format(key, tostring(d)))
    end
  end
  self:add_module("W_q", Linear(self.d_model, self.d_model, { bias = false }))
  self:add_module("W_k", Linear(self.d_model, self.d_model, { bias = false }))
  self:add_module("W_v", Linear(self.d_model, self.d_model, { bias = false }))
end

-- Run a core op; its error (a shape mismatch between the inputs) is re-raised
-- naming Attention:forward and what was being combined.
local function guarded(what, fn, ...)
  local ok, res = pcall(fn, ...)
  if not ok then
    local msg = tostring(res):gsub("^[^:\n]*:%d+: ", "")
    caller.error(("Attention:forward: %s: %s"):format(what, msg))
  end
  return res
end

function Attention:forward(encodings_for_q, encodings_for_k, encodings_for_v, mask)
  local C = "Attention"
  checks.input(C, encodings_for_q, "encodings_for_q", self.d_model, 1, 8, "d_model")
  checks.input(C, encodings_for_k, "encodings_for_k", self.d_model, 1, 8, "d_model")
  checks.input(C, encodings_for_v, "encodings_for_v", self.d_model, 1, 8, "d_model")
  if mask ~= nil and not attn.is_tensor(mask) then
    caller.error("Attention:forward: bad argument 'mask' (expected attn.Tensor, got " .. type(mask) .. ")")
  end
  if mask ~= nil then
    local kind, where = mask_kind(mask)
    if not kind then -- e.g. an ALiBi table: masked_fill would hide every nonzero
      caller.error(("Attention:forward: bad argument 'mask' (must hold only 0 and 1 (nonzero = hidden), got %s)"):format(
        where))
    end
  end
  local q = self.W_q(encodings_for_q)
  local k = self.W_k(encodings_for_k)
  local v = self.W_v(encodings_for_v)
  local nd = k:dim()
  for _, key in ipairs { "row_dim", "col_dim" } do
    local d = self[key]
    if d > nd or d < -nd then
      caller.error(("Attention:forward: %s = %d is out of range for keys of shape %s"):format(key, d, checks.shape(k)))
    end
  end
  local kt = k:transpose(self.row_dim, self.col_dim)
  local sims = guarded(("queries of shape %s and keys of shape %s (transposed over row_dim, col_dim) do not match")
    :format(checks.shape(q), checks.shape(k)), attn.matmul, q, kt)
  local scaled_sims = sims / math.sqrt(k:size(self.col_dim))
  if mask ~= nil then
    scaled_sims = guarded(("mask of shape %s does not fit the scores of shape %s"):format(
      checks.shape(mask), checks.shape(scaled_sims)), attn.masked_fill, scaled_sims, mask, -1e9)
  end
  local attention_percents = scaled_sims:softmax(self.col_dim)
  return guarded(("the weights of shape %s and values of shape %s do not match"):format(
    checks.shape(attention_percents), checks.shape(v)), attn.matmul, attention_percents, v)
end

function Attention:extra_repr()
  return ("d_model=%d, row_dim=%d, col_dim=%d"):format(self.d_model, self.row_dim, self.col_dim)
end

return Attention
