--- attn.nn.MultiheadAttention(embed_dim, num_heads[, {dropout = 0, bias = true, add_bias_kv = false,
-- add_zero_attn = false, kdim, vdim, batch_first = false}]): PyTorch's
-- torch.nn.MultiheadAttention (1.13), not the book's MultiHeadAttention.
-- (This file is TorchMultiheadAttention.lua: a MultiheadAttention.lua would be
-- the book's file on a case-insensitive filesystem.)
--
-- Parameters, with PyTorch's names, shapes and init, so a torch state dict
-- loads unchanged and `attn.manual_seed(s)` then the constructor gives
-- torch's bits: `in_proj_weight` [3E, E] (xavier_uniform_), or
-- `q_proj_weight` [E, E], `k_proj_weight` [E, kdim], `v_proj_weight` [E, vdim]
-- when kdim or vdim differ from E; `in_proj_bias` [3E] (zeros); `bias_k`,
-- `bias_v` [1, 1, E] with add_bias_kv (xavier_normal_); the child `out_proj`
-- (a Linear, shown as torch's NonDynamicallyQuantizableLinear; its bias
-- zeroed). Random numbers are drawn in torch's order: out_proj's Linear
-- init, then the input projections, then bias_k and bias_v.
-- `m.dropout` is the probability (a number, as in torch); dropout acts on the
-- attention weights in training mode, with the same draws as torch's
-- dropout: MKL builds' by default, non-MKL builds' after
-- `attn.set_dropout_stream("default")`.
--
-- Masks, as torch's, by their dtype: a bool tensor (a comparison, `t:bool()`,
-- `attn.triu(attn.ones(L, S), 1):bool()`) is a bool mask, true = not allowed
-- to attend; a float tensor is a float mask, its values added to the scaled
-- scores (-inf hides). A float tensor of 0 and 1 meant as a bool mask says so
-- with `attn_mask_type = "bool"` (or `key_padding_mask_type = "bool"`); it must
-- then hold 0 and 1 only (anything else is an error). Combinations follow
-- torch 1.13: a float key_padding_mask beside a bool attn_mask is read as bool
-- (nonzero = not allowed), as torch's logical_or does; two float masks are
-- added (torch 1.13 raises there, later versions add).
--
-- The forward is built from recorded ops (F.linear, views, cat,
-- scaled_dot_product_attention), so it records for autograd: the gradients of
-- the parameters and inputs are torch's (spec/nn_torch_mha_spec.lua).
--
-- Differences from torch: a query row whose keys are all hidden gives zeros
-- (torch: NaN); `is_causal = true` without attn_mask hides key j > i for
-- query i (torch 1.13 has no is_causal; 2.x requires attn_mask with it);
-- with an attn_mask, is_causal is only a hint and attn_mask is used.
-- @classmod attn.nn.MultiheadAttention
local attn = require "attn"
local argcheck = require "attn.argcheck"
local Module = require "attn.nn.Module"
local Linear = require "attn.nn.Linear"
local checks = require "attn.nn.checks"
local linear = require("attn.autograd.linear").linear -- x [..., in] W^T + b, recorded as torch's F.linear

local NAME = "MultiheadAttention"
local MultiheadAttention = Module:extend(NAME)

-- torch's out_proj class: a Linear under the name torch prints
local NonDynamicallyQuantizableLinear = Linear:extend("NonDynamicallyQuantizableLinear")

-- what came, in messages: numbers by value, tensors with their shape
local describe = argcheck.describer{shape = " of shape "}
local describe_option = argcheck.describer{strings = true, shape = " of shape "} -- strings quoted

local function ctor_fail(fmt, ...)
  argcheck.fail("attn.nn." .. NAME, fmt, ...)
end

-- Errors of forward start with "MultiheadAttention:forward:" (level 0: Module's
-- __call then passes them on unchanged).
local function fwd_fail(fmt, ...)
  error(("%s:forward: " .. fmt):format(NAME, ...), 0)
end

local function positive_option(opts, name)
  local v = opts[name]
  if v == nil then return nil end
  local i = type(v) == "number" and v == v and math.tointeger(v) or nil
  if not i or i < 1 then ctor_fail("bad option '%s' (expected a positive integer, got %s)", name, describe(v)) end
  return i
end

-- torch.nn.init.xavier_uniform_ / xavier_normal_ (gain 1), bounds in doubles as Python computes them.
-- fans of a [out, in] matrix: in, out; of [1, 1, E]: E, E (receptive field E).
local function xavier_uniform_(t, fan_in, fan_out)
  local a = math.sqrt(3.0) * math.sqrt(2.0 / (fan_in + fan_out))
  return t:uniform_(-a, a)
end

local function xavier_normal_(t, fan_in, fan_out)
  return t:normal_(0, math.sqrt(2.0 / (fan_in + fan_out)))
end

function MultiheadAttention:init(embed_dim, num_heads, opts)
  local E = checks.positive_integer(NAME, embed_dim, 1, "embed_dim")
  local H = checks.positive_integer(NAME, num_heads, 2, "num_heads")
  opts = checks.options(NAME, opts, 3, { dropout = "number", bias = "boolean", add_bias_kv = "boolean",
    add_zero_attn = "boolean", kdim = "number", vdim = "number", batch_first = "boolean" })
  if E % H ~= 0 then ctor_fail("embed_dim (%d) must be divisible by num_heads (%d)", E, H) end
  local p = opts.dropout or 0
  if not (p >= 0 and p <= 1) then ctor_fail("bad option 'dropout' (expected a probability in [0, 1], got %s)", describe(p)) end
  self.embed_dim, self.num_heads, self.head_dim = E, H, E // H
  self.kdim = positive_option(opts, "kdim") or E
  self.vdim = positive_option(opts, "vdim") or E
  self._qkv_same_embed_dim = self.kdim == E and self.vdim == E
  self.dropout = p
  self.batch_first = opts.batch_first or false
  self.add_zero_attn = opts.add_zero_attn or false
  local bias = opts.bias ~= false

  -- registered in torch's order (named_parameters, state_dict) ...
  if self._qkv_same_embed_dim then
    self:add_parameter("in_proj_weight", attn.empty(3 * E, E))
  else
    self:add_parameter("q_proj_weight", attn.empty(E, E))
    self:add_parameter("k_proj_weight", attn.empty(E, self.kdim))
    self:add_parameter("v_proj_weight", attn.empty(E, self.vdim))
  end
  if bias then self:add_parameter("in_proj_bias", attn.zeros(3 * E)) end
  -- ... while the random numbers go in torch's order: out_proj's Linear init first
  self:add_module("out_proj", NonDynamicallyQuantizableLinear(E, E, { bias = bias }))
  if opts.add_bias_kv then
    self:add_parameter("bias_k", attn.empty(1, 1, E))
    self:add_parameter("bias_v", attn.empty(1, 1, E))
  end
  -- _reset_parameters
  if self._qkv_same_embed_dim then
    xavier_uniform_(self.in_proj_weight, E, 3 * E)
  else
    xavier_uniform_(self.q_proj_weight, E, E)
    xavier_uniform_(self.k_proj_weight, self.kdim, E)
    xavier_uniform_(self.v_proj_weight, self.vdim, E)
  end
  if bias then self.out_proj.bias:zero_() end
  if opts.add_bias_kv then
    xavier_normal_(self.bias_k, E, E)
    xavier_normal_(self.bias_v, E, E)
  end
end

local FORWARD_OPTIONS = {
  key_padding_mask = "attn.Tensor", attn_mask = "attn.Tensor", need_weights = "boolean",
  average_attn_weights = "boolean", is_causal = "boolean",
  attn_mask_type = "\"bool\" or \"float\"", key_padding_mask_type = "\"bool\" or \"float\"",
}

local function forward_options(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" or attn.is_tensor(opts) then
    fwd_fail("bad argument #4 'opts' (expected a table of options such as {attn_mask = m}, got %s)", describe(opts))
  end
  for k, v in pairs(opts) do
    local want = FORWARD_OPTIONS[k]
    if not want then
      local names = {}
      for n in pairs(FORWARD_OPTIONS) do names[#names + 1] = n end
      table.sort(names)
      fwd_fail("unknown option '%s' (known: %s)", tostring(k), table.concat(names, ", "))
    end
    local ok
    if want == "attn.Tensor" then ok = attn.is_tensor(v)
    elseif want == "boolean" then ok = type(v) == "boolean"
    else ok = v == "bool" or v == "float" end
    if not ok then
      fwd_fail("bad option '%s' (expected %s, got %s)", k, want, describe_option(v))
    end
  end
  return opts
end

local function shape_of(sizes) return "[" .. table.concat(sizes, ", ") .. "]" end

-- The 1-based index of flat position i (1-based) in a tensor of `sizes`, as "[i, j, ...]".
local function index_of(i, sizes)
  local idx, rest = {}, i - 1
  for d = #sizes, 1, -1 do
    idx[d] = rest % sizes[d] + 1
    rest = rest // sizes[d]
  end
  return shape_of(idx)
end

-- A float tensor read as a bool mask must hold 0 and 1 only: anything else (a
-- float mask given the bool type, NaN) would silently change meaning.
local function check_bool_mask(m, name)
  if m:numel() == 0 or m.dtype == "bool" then return end
  local bad = m:ne(0):mul(m:ne(1)):reshape(-1)
  if bad:max():item() ~= 0 then
    local i = math.tointeger(bad:argmax():item())
    fwd_fail("bad option '%s' (a bool mask holds 0 and 1, 1 = not allowed; got %s at %s; for a float mask "
      .. "whose values are added to the scores leave %s_type out)", name,
      Module.pyfloat(m:reshape(-1)[i]), index_of(i, m:size()), name)
  end
end

-- Whether mask m is a float mask (added to the scores): its dtype says, as in
-- torch; `type = "bool"` reads a float tensor of 0 and 1 as a bool mask.
local function mask_is_float(m, type, name)
  if m.dtype == "bool" then
    if type == "float" then
      fwd_fail("bad option '%s_type' (\"float\" is for a float tensor, and %s is a bool tensor, true = not allowed; "
        .. "pass %s:float() to add its values to the scores)", name, name, name)
    end
    return false
  end
  return type ~= "bool"
end

-- x [..., n] -> [..., n + extra], zeros appended (torch's pad(mask, (0, 1)))
local function pad_last(x, extra)
  if extra == 0 then return x end
  local sizes = x:size()
  sizes[#sizes] = extra
  return attn.cat({ x, attn.zeros(sizes) }, -1)
end


--- The attention. query [L, N, E] (batch_first: [N, L, E]; unbatched: [L, E]),
-- key [S, N, kdim], value [S, N, vdim] (same layout) -> out [L, N, E] (same
-- layout) and the weights [N, L, S] averaged over heads, or [N, num_heads, L,
-- S] with `average_attn_weights = false` (unbatched: without N); the weights
-- are nil with `need_weights = false`. Options: `key_padding_mask` [N, S]
-- (unbatched [S]), `attn_mask` [L, S] or [N * num_heads, L, S] (unbatched
-- [num_heads, L, S]): a bool tensor, true = not allowed, or a float one, added to
-- the scores; `attn_mask_type` / `key_padding_mask_type` ("bool": a float
-- tensor of 0 and 1 read as a bool mask; "float", what a float tensor is
-- anyway), `need_weights`
-- (true), `average_attn_weights` (true), `is_causal` (false). S counts one more
-- key with add_bias_kv and one more with add_zero_attn in the weights.
-- Runs through attn.scaled_dot_product_attention (the fused kernel when
-- need_weights is false).
function MultiheadAttention:forward(query, key, value, opts)
  opts = forward_options(opts)
  for i, a in ipairs { { query, "query" }, { key, "key" }, { value, "value" } } do
    if not attn.is_tensor(a[1]) then
      fwd_fail("bad argument #%d '%s' (expected attn.Tensor, got %s)", i, a[2], describe(a[1]))
    end
  end
  local nd = query:dim()
  if nd ~= 2 and nd ~= 3 then
    fwd_fail("'query' must be 2-D (unbatched [L, E]) or 3-D (batched), got shape %s", checks.shape(query))
  end
  if key:dim() ~= nd or value:dim() ~= nd then
    fwd_fail("for a %d-D query, 'key' and 'value' must be %d-D too, got shapes %s and %s", nd, nd,
      checks.shape(key), checks.shape(value))
  end
  local batched = nd == 3
  local E, H, hd = self.embed_dim, self.num_heads, self.head_dim
  -- [N, L, E] views of the inputs, whatever their layout
  local function batch_major(x)
    if not batched then return x:unsqueeze(1) end
    if self.batch_first then return x end
    return x:transpose(1, 2)
  end
  local xq, xk, xv = batch_major(query), batch_major(key), batch_major(value)
  local N, L, S = xq:size(1), xq:size(2), xk:size(2)
  for _, a in ipairs { { xq, "query", E, "embed_dim" }, { xk, "key", self.kdim, "kdim" }, { xv, "value", self.vdim, "vdim" } } do
    if a[1]:size(3) ~= a[3] then
      fwd_fail("'%s' of shape %s must end in %s = %d", a[2], checks.shape(a[2] == "query" and query
        or a[2] == "key" and key or value), a[4], a[3])
    end
  end
  if xk:size(1) ~= N or xv:size(1) ~= N or xv:size(2) ~= S then
    fwd_fail("query, key and value must have the same batch size and key and value the same length, "
      .. "got shapes %s, %s and %s%s", checks.shape(query), checks.shape(key), checks.shape(value),
      batched and (self.batch_first and " (batch_first: [N, L, E])" or " (batch_first = false: [L, N, E])") or "")
  end

  -- masks: shapes as torch checks them
  local am, kpm = opts.attn_mask, opts.key_padding_mask
  local am_float = am ~= nil and mask_is_float(am, opts.attn_mask_type, "attn_mask")
  local kpm_float = kpm ~= nil and mask_is_float(kpm, opts.key_padding_mask_type, "key_padding_mask")
  if am ~= nil then
    local want3 = batched and { N * H, L, S } or { H, L, S }
    local ok = am:dim() == 2 and am:size(1) == L and am:size(2) == S
      or am:dim() == 3 and am:size(1) == want3[1] and am:size(2) == L and am:size(3) == S
    if not ok then
      fwd_fail("bad option 'attn_mask' (expected shape [%d, %d] or %s (%s), got %s)", L, S, shape_of(want3),
        batched and "N * num_heads, L, S" or "num_heads, L, S", checks.shape(am))
    end
    if not am_float then check_bool_mask(am, "attn_mask") end
    if am:dim() == 3 then am = am:reshape(N, H, L, S) end
  end
  if kpm ~= nil then
    local ok = batched and kpm:dim() == 2 and kpm:size(1) == N and kpm:size(2) == S
      or not batched and kpm:dim() == 1 and kpm:size(1) == S
    if not ok then
      fwd_fail("bad option 'key_padding_mask' (expected shape %s, got %s)",
        batched and shape_of { N, S } or shape_of { S }, checks.shape(kpm))
    end
    -- torch 1.13 merges a float key_padding_mask into a bool attn_mask with logical_or
    if kpm_float and am ~= nil and not am_float then
      kpm, kpm_float = kpm:ne(0), false
    elseif not kpm_float then
      check_bool_mask(kpm, "key_padding_mask")
    end
    kpm = kpm:reshape(N, 1, 1, S)
  end
  local causal = opts.is_causal == true and am == nil

  -- input projections: [N, L, E], [N, S, E], [N, S, E]
  local q, k, v
  local b = self.in_proj_bias
  local function bias_part(i) return b and b:narrow(1, (i - 1) * E + 1, E) end
  if self._qkv_same_embed_dim then
    local w = self.in_proj_weight
    if rawequal(query, key) and rawequal(key, value) then
      local qkv = linear(xq, w, b) -- [N, L, 3E]: one GEMM, as torch's self-attention path
      q, k, v = qkv:narrow(3, 1, E), qkv:narrow(3, E + 1, E), qkv:narrow(3, 2 * E + 1, E)
    else
      q = linear(xq, w:narrow(1, 1, E), bias_part(1))
      if rawequal(key, value) then
        local kv = linear(xk, w:narrow(1, E + 1, 2 * E), b and b:narrow(1, E + 1, 2 * E)) -- [N, S, 2E]
        k, v = kv:narrow(3, 1, E), kv:narrow(3, E + 1, E)
      else
        k = linear(xk, w:narrow(1, E + 1, E), bias_part(2))
        v = linear(xv, w:narrow(1, 2 * E + 1, E), bias_part(3))
      end
    end
  else
    q = linear(xq, self.q_proj_weight, bias_part(1))
    k = linear(xk, self.k_proj_weight, bias_part(2))
    v = linear(xv, self.v_proj_weight, bias_part(3))
  end

  -- extra keys: bias_k / bias_v, then a zero key and value per head
  local extra = 0
  if self.bias_k ~= nil and self.bias_v ~= nil then
    k = attn.cat({ k, self.bias_k:expand(N, 1, E) }, 2) -- [N, S + 1, E]
    v = attn.cat({ v, self.bias_v:expand(N, 1, E) }, 2)
    extra = extra + 1
  end
  local S2 = S + extra
  -- heads: [N, L, E] -> [N, L, H, hd] -> [N, H, L, hd]
  q = q:reshape(N, L, H, hd):transpose(2, 3)
  k = k:reshape(N, S2, H, hd):transpose(2, 3)
  v = v:reshape(N, S2, H, hd):transpose(2, 3)
  if self.add_zero_attn then
    k = attn.cat({ k, attn.zeros(N, H, 1, hd) }, 3) -- [N, H, S2 + 1, hd]
    v = attn.cat({ v, attn.zeros(N, H, 1, hd) }, 3)
    extra, S2 = extra + 1, S2 + 1
  end
  if causal and extra > 0 then
    -- the causal mask of the [L, S] keys; the extra keys stay visible (torch pads masks with 0)
    am, am_float, causal = attn.triu(attn.ones(L, S), 1), false, false
  end

  -- one hiding mask (0/1, broadcast to [N, H, L, S2]) and one additive bias
  local mask, bias
  if am ~= nil then
    am = pad_last(am, extra)
    if am_float then bias = am else mask = am end
  end
  if kpm ~= nil then
    kpm = pad_last(kpm, extra)
    if kpm_float then
      bias = bias and bias + kpm or kpm
    else
      mask = mask and (mask + kpm):ne(0) or kpm
    end
  end

  local need_weights = opts.need_weights ~= false
  local p = self.training and self.dropout or 0
  -- p = 1: every weight dropped, in the graph (zero gradients, as torch), nothing drawn
  local context, weights = attn.scaled_dot_product_attention(q, k, v, { mask = mask, bias = bias, is_causal = causal,
    dropout_p = p > 0 and p or nil, need_weights = need_weights })
  -- [N, H, L, hd] -> [L, N, H, hd] -> [L, N, E] (torch's layout), then out_proj
  local out = self.out_proj(context:permute(3, 1, 2, 4):reshape(L, N, E))
  if not batched then
    out = out:squeeze(2)
  elseif self.batch_first then
    out = out:transpose(1, 2)
  end
  if not need_weights then return out, nil end
  if opts.average_attn_weights ~= false then weights = weights:sum(2) / H end -- [N, L, S2]
  if not batched then weights = weights:squeeze(1) end
  return out, weights
end

return MultiheadAttention
