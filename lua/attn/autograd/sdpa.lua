--- The recorded attention calls: `attn.scaled_dot_product_attention` and the
-- fused module forward, as `attn.autograd.Function`s over the C forward and
-- backward of `attn.core.autograd` and `attn.core.modules`
-- (src/core/sdpa_backward.c, src/core/modules_backward.c). Unrecorded calls
-- (grad mode off, or no input that requires grad) run the plain C functions.
-- @module attn.autograd.sdpa
local core = require "attn.core"
local autograd = require "attn.autograd"

local raw_sdpa = core.scaled_dot_product_attention
local sdpa_forward, sdpa_backward = core.autograd.sdpa_forward, core.autograd.sdpa_backward
local fused_forward, fused_backward = core.modules.attention_forward, core.modules.attention_backward
local SDPA = "attn.scaled_dot_product_attention"

local M = {}

local is_tensor = require("attn.argcheck").is_tensor
-- the fused call's name function (every recorded module call): the method itself, no __index
local Tensor_mt, t_dim = core.Tensor_mt, core.Tensor.dim
local history = autograd._history

local function score_mod_tables(sm)
  local _, tables = core._score_program_info(sm)
  return tables
end

-- A mask_mod given without a block_mask runs as the block mask it makes
-- (exact: its partial blocks keep every element), so that the kernels skip
-- its empty blocks; kept per program for the sizes and the versions of the
-- tensors it read (an in-place change to one makes it anew). Only for 4-D
-- calls, where the block mask's B and H are the program's b and h.
local block_masks = setmetatable({}, { __mode = "k" })

local function dim4(t) return is_tensor(t) and t:dim() == 4 end

local function mask_mod_as_block_mask(q, k, v, opts)
  local mm = opts.mask_mod
  if opts.block_mask ~= nil or getmetatable(mm) ~= "attn.ScoreMod" or not (dim4(q) and dim4(k) and dim4(v)) then
    return opts
  end
  for _, t in ipairs { opts.mask, opts.bias } do
    if t ~= nil and (not is_tensor(t) or t:dim() > 4) then return opts end
  end
  -- the call's B and H: the sizes that broadcast (q's heads with enable_gqa)
  local B, H = 1, 1
  for _, t in ipairs { q, k, v, opts.mask or false, opts.bias or false } do
    if t and t:dim() == 4 then B = math.max(B, t:size(1)) end
    if t and t:dim() >= 3 and (t == q or not opts.enable_gqa) then H = math.max(H, t:size(-3)) end
  end
  local lq, lk = q:size(3), k:size(3)
  local kind, tables = core._score_program_info(mm)
  if kind ~= "mask" then return opts end -- the options parser words the error
  local key = { B, H, lq, lk }
  for _, t in ipairs(tables) do key[#key + 1] = core._version(t) end
  key = table.concat(key, ",")
  local kept = block_masks[mm]
  if not (kept and kept.key == key) then
    kept = { key = key, bm = core._mask_mod_blocks(SDPA, mm, B, H, lq, lk) }
    block_masks[mm] = kept
  end
  local o = {}
  for name, value in pairs(opts) do o[name] = value end
  o.mask_mod, o.block_mask = nil, kept.bm
  return o
end

-- The recorded call with the bias as an input of its own (a tensor inside
-- the options table would not be one), and score_mod's captured tensors
-- after the options: inner(q, k, v, bias or false, opts, table_1, ...).
local inner = autograd.Function{
  -- torch 1.13's node of the same call: its last op is mm (2-D) or a view of bmm
  name = function(q, k, v)
    return (q:dim() == 2 and k:dim() == 2 and v:dim() == 2) and "MmBackward0" or "UnsafeViewBackward0"
  end,
  fname = SDPA,
  raw = function(q, k, v, _, opts) return raw_sdpa(q, k, v, opts) end,
  forward = function(ctx, q, k, v, bias, opts, ...)
    local r = table.pack(sdpa_forward(q, k, v, opts, SDPA))
    local out, saved, kernel, draw = r[1], r[2], r[3], r[4]
    local o = type(opts) == "table" and opts or {}
    -- what the backward needs; mask, bias and the ALiBi slopes are saved so that an in-place change is caught
    ctx:save_for_backward(q, k, v, out, saved, o.mask, o.bias, o.alibi_slopes, ...)
    ctx.is_causal, ctx.scale, ctx.dropout_p = o.is_causal, o.scale, o.dropout_p
    ctx.enable_gqa, ctx.softcap = o.enable_gqa, o.softcap
    ctx.window = o.window and { o.window[1], o.window[2] } -- a copy: the caller's table may change
    ctx.kernel, ctx.draw, ctx.need_weights = kernel, draw, o.need_weights
    ctx.block_mask = o.block_mask -- an attn.BlockMask is immutable: kept as is
    -- score_mod / mask_mod programs are immutable too; the tables are inputs: saved, so an in-place change is caught
    ctx.score_mod, ctx.mask_mod = o.score_mod, o.mask_mod
    ctx.ntables, ctx.first_table = select("#", ...), 3 + (is_tensor(bias) and 1 or 0) + 1
    -- the public results: out[, weights][, lse]; the lse has no gradient
    if o.return_lse then ctx:mark_non_differentiable(r[r.n]) end
    return out, table.unpack(r, 5, r.n)
  end,
  backward = function(ctx, g_out, g_weights)
    local q, k, v, out, saved, mask, bias, slopes = ctx:saved()
    local need = ctx.needs_input_grad
    local o = { mask = mask, bias = bias, is_causal = ctx.is_causal, scale = ctx.scale, dropout_p = ctx.dropout_p,
                kernel = ctx.kernel, dropout_draw = ctx.draw, bias_grad = need[4] == true,
                dweights = ctx.need_weights and g_weights or nil, enable_gqa = ctx.enable_gqa,
                window = ctx.window, alibi_slopes = slopes, softcap = ctx.softcap,
                block_mask = ctx.block_mask }
    o.score_mod, o.mask_mod = ctx.score_mod, ctx.mask_mod
    local want
    if ctx.ntables > 0 then
      want = {}
      for j = 1, ctx.ntables do want[j] = need[ctx.first_table + j - 1] == true end
      o.score_mod_grads = want
    end
    local dq, dk, dv, dbias, dtables = sdpa_backward(g_out, q, k, v, out, saved, o)
    local grads = { need[1] and dq or nil, need[2] and dk or nil, need[3] and dv or nil, dbias } -- dbias: nil unless needed
    for j = 1, ctx.ntables do grads[ctx.first_table + j - 1] = dtables and dtables[j] or nil end
    return table.unpack(grads, 1, ctx.first_table + ctx.ntables - 1)
  end,
}

local all_dropped -- below: it calls the recorded function

-- opts with PyTorch's attn_mask put into attn's own options: a bool attn_mask
-- (true = may attend) becomes the mask of what is hidden, its logical_not; a
-- float one is added to the scores, so it becomes the bias, or is added to a
-- given bias (a recorded add: both get their gradients). PyTorch has this one
-- mask: attn's `mask` (nonzero = hidden) with it would be two masks of opposite
-- meanings, so that is an error, and so is is_causal, as in PyTorch 1.13's
-- _scaled_dot_product_attention.
local function translate_attn_mask(opts)
  local m = opts.attn_mask
  if not is_tensor(m) then
    error(("%s: bad option 'attn_mask' (expected attn.Tensor, got %s)"):format(SDPA, type(m)), 3)
  end
  if opts.mask ~= nil then
    error(SDPA .. ": options 'attn_mask' and 'mask' cannot be given together (attn_mask is PyTorch's: a bool one is "
      .. "true where the query may attend; mask is attn's: nonzero = hidden); give one of them", 3)
  end
  if opts.is_causal then
    error(SDPA .. ": option 'attn_mask' must not be given with is_causal = true, as in PyTorch 1.13 (put the causal "
      .. "mask into attn_mask)", 3)
  end
  local o = {}
  for key, value in pairs(opts) do o[key] = value end
  o.attn_mask = nil
  if m.dtype == "bool" then
    o.mask = core.logical_not(m)
  elseif is_tensor(o.bias) then
    o.bias = o.bias + m
  else
    o.bias = m
  end
  return o
end

--- `attn.scaled_dot_product_attention` that records: gradients for q, k, v
-- and the bias (an option), both kernels, every option of the backward
-- (mask, bias, is_causal, scale, dropout_p with the forward's mask, the
-- weights output's own gradient, and the variants enable_gqa, window,
-- alibi_slopes, softcap and block_mask; the slopes get no gradient).
-- The option `attn_mask` is PyTorch's (translate_attn_mask above).
function M.scaled_dot_product_attention(...)
  local n = select("#", ...)
  local q, k, v, opts = ...
  -- anything the recorded path would not take as given: the C function words the error
  if n > 4 or (opts ~= nil and (type(opts) ~= "table" or is_tensor(opts))) then return raw_sdpa(...) end
  if opts and opts.attn_mask ~= nil then opts = translate_attn_mask(opts) end
  local p = opts and opts.dropout_p
  if type(p) == "number" and not (p >= 0 and p < 1) then
    -- the C kernels take [0, 1); 1 is taken here
    if p == 1 then return all_dropped(q, k, v, opts) end
    error(("%s: bad option 'dropout_p' (expected a number in [0, 1], got %s)"):format(SDPA,
      p ~= p and "nan" or p == math.floor(p) and ("%.1f"):format(p) or ("%g"):format(p)), 2)
  end
  if opts and opts.mask_mod ~= nil then opts = mask_mod_as_block_mask(q, k, v, opts) end
  local bias = opts and opts.bias
  local sm = opts and opts.score_mod
  if sm ~= nil and getmetatable(sm) == "attn.ScoreMod" then -- its captured tensors are the node's inputs too
    return inner(q, k, v, is_tensor(bias) and bias or false, opts, table.unpack(score_mod_tables(sm)))
  end
  return inner(q, k, v, is_tensor(bias) and bias or false, opts)
end

-- The attention with dropout_p = 1: every weight dropped, as torch's math
-- path computes it (dropout(weights, 1) is weights * 0 and draws nothing, then
-- weights @ v), so the output stays in the graph and q, k, v (and the bias)
-- get zero gradients rather than none. Results as the call asked: out[,
-- weights][, lse]. The weights come from the math kernel (flash returns none).
all_dropped = function(q, k, v, opts)
  local o = {}
  for key, val in pairs(opts) do o[key] = val end
  o.dropout_p, o.need_weights = 0, true
  if o.kernel == nil or o.kernel == "auto" or o.kernel == "flash" then o.kernel = "math" end
  local r = table.pack(M.scaled_dot_product_attention(q, k, v, o))
  local weights = r[2] * 0
  if opts.enable_gqa and is_tensor(v) and v:dim() >= 3 and weights:size(-3) ~= v:size(-3) then
    -- query head h uses kv head floor((h - 1) / g) + 1: v's heads repeated g times each
    local shape, hkv = v:size(), v:size(-3)
    local nd = #shape
    local wide = {}
    for i = 1, nd - 3 do wide[i] = shape[i] end
    wide[nd - 2], wide[nd - 1], wide[nd], wide[nd + 1] = hkv, weights:size(-3) // hkv, shape[nd - 1], shape[nd]
    local heads = {}
    for i = 1, nd - 3 do heads[i] = shape[i] end
    heads[nd - 2], heads[nd - 1], heads[nd] = weights:size(-3), shape[nd - 1], shape[nd]
    v = v:unsqueeze(nd - 1):expand(wide):reshape(heads)
  end
  local out = weights:matmul(v)
  local results = { out }
  if opts.need_weights then results[#results + 1] = weights end
  if opts.return_lse then results[#results + 1] = r[r.n] end
  return table.unpack(results)
end

-- ------------------------------------------------------------ fused modules

-- The definition of the fused module forward's recording as an
-- autograd.Function (M.fused_attention below): its node is torch's:
-- `ViewBackward0` with out_proj (a Linear), else `UnsafeViewBackward0`
-- (batched) or `MmBackward0` (2-D x).
local fused_def = {
  name = function(x, ...)
    if select(13, ...) ~= nil then return "ViewBackward0" end -- wo
    return getmetatable(x) == Tensor_mt and t_dim(x) == 2 and "MmBackward0" or "UnsafeViewBackward0"
  end,
  fname = "attention_forward",
  raw = fused_forward,
  -- the 16 arguments as they are (no table on the tiny path: it is the
  -- notebook-size hot path); the backward takes them back from the saved list
  forward = function(ctx, x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask)
    -- and the dropout draw, and the state the backward needs (not recomputed
    -- there; a call whose backward is tiny keeps none and its backward recomputes)
    local out, draw, qkv, o, c, saved, kernel = fused_forward(x, d_in, context_length, rank, heads, scale, p,
      wq, bq, wk, bk, wv, bv, wo, bo, mask, true, true)
    if out == nil then return nil end
    ctx.draw, ctx.kernel = draw, kernel
    -- What the backward reads (modules_backward.c). Without kept state (a tiny
    -- call) it recomputes Q, K, V from x and every parameter: all 16 arguments
    -- are saved. With it, as torch's module-by-module graph: x for the
    -- parameters' gradients, W_query/W_key/W_value for x's, the output
    -- projection's weight (the context's gradient) and the mask always, biases
    -- never; the C backward still takes every argument (ctx.args), reading
    -- only those. The state is saved with them, so the engine frees it after
    -- the backward.
    if qkv == nil then
      ctx:save_for_backward(x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask)
    else
      local need = ctx.needs_input_grad
      local for_params, for_dx = false, need[1]
      for i = 2, #need do if need[i] then for_params = true end end
      ctx.args = { x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask }
      ctx:save_for_backward(for_params and x or nil, nil, nil, nil, nil, nil, nil, for_dx and wq or nil, nil,
        for_dx and wk or nil, nil, for_dx and wv or nil, nil, wo, nil, mask, qkv, o, c, saved)
    end
    return out
  end,
  into_grad = true,
  -- into: the walk's table of the leaves' .grad (backward, not autograd.grad);
  -- the C backward adds the parameters' gradients into those they have
  -- (its results false for them, returned as nil)
  backward = function(ctx, g, into)
    local x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask, qkv, o, c, saved =
      ctx:saved()
    local a = ctx.args
    if a then
      x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask = table.unpack(a, 1, 16)
    end
    -- x's gradient only when x requires grad (the notebooks' x is data)
    local need = ctx.needs_input_grad
    local dx, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo = fused_backward(x, d_in, context_length, rank, heads, scale,
      p, wq, bq, wk, bk, wv, bv, wo, bo, mask, g, ctx.draw, qkv, o, c, saved, ctx.kernel, need[1] == true,
      into and ctx._edges, into)
    -- one gradient per tensor input: x, then the parameters present (the mask has none)
    if wq ~= nil and wk ~= nil and wv ~= nil and bq == nil and bk == nil and bv == nil and bo == nil then
      -- CausalAttention's parameters, and MultiHeadAttention's with an out_proj
      -- without bias: no list
      if wo == nil then
        return need[1] and dx or nil, need[2] and dwq or nil, need[3] and dwk or nil, need[4] and dwv or nil
      end
      return need[1] and dx or nil, need[2] and dwq or nil, need[3] and dwk or nil, need[4] and dwv or nil,
        need[5] and dwo or nil
    end
    if wq ~= nil and wk ~= nil and wv ~= nil and bq == nil and bk == nil and bv == nil and wo ~= nil and bo ~= nil then
      -- MultiHeadAttention's (the notebooks': no qkv bias, out_proj with bias): no list
      return need[1] and dx or nil, need[2] and dwq or nil, need[3] and dwk or nil, need[4] and dwv or nil,
        need[5] and dwo or nil, need[6] and dbo or nil
    end
    local grads, k = { need[1] and dx or nil }, 1
    if wq ~= nil then k = k + 1; grads[k] = need[k] and dwq or nil end
    if bq ~= nil then k = k + 1; grads[k] = need[k] and dbq or nil end
    if wk ~= nil then k = k + 1; grads[k] = need[k] and dwk or nil end
    if bk ~= nil then k = k + 1; grads[k] = need[k] and dbk or nil end
    if wv ~= nil then k = k + 1; grads[k] = need[k] and dwv or nil end
    if bv ~= nil then k = k + 1; grads[k] = need[k] and dbv or nil end
    if wo ~= nil then k = k + 1; grads[k] = need[k] and dwo or nil end
    if bo ~= nil then k = k + 1; grads[k] = need[k] and dbo or nil end
    return table.unpack(grads, 1, k)
  end,
}
local fused_recorded = autograd.Function(fused_def)

local record, Node, grad_mode = core.modules.attention_record, autograd._Node, autograd.is_grad_enabled
local recorded_def = { backward = core.modules.attention_node_backward, into_grad = true }

--- The fused module forward that records (CausalAttention, MultiHeadAttention):
-- the arguments of `attn.core.modules.attention_forward`; nil when the fused
-- path does not take the call (the module then runs module by module).
-- A call whose backward recomputes (every tiny call) is recorded by one C
-- call, attention_record: the node fused_def's recording would make (name,
-- edges, saved arguments and their versions, the draw), whose backward is
-- attention_node_backward, fused_def's backward in one C call (the saved
-- arguments read and checked there). Any other call, and one with a stale
-- input or no input that requires grad, goes through the Function.
function M.fused_attention(...)
  if grad_mode() then
    local out = record(history, Node, recorded_def, ...)
    if out ~= nil then return out end
  end
  return fused_recorded(...)
end

--- Put the recorded attention in the module table `attn`.
-- @param attn the module table
function M.install(attn)
  attn.scaled_dot_product_attention = M.scaled_dot_product_attention
end

return M
