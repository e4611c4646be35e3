--- The backward of the ops of src/binding/lua_ops.c and of erf, sin, cos, as
-- `autograd.Function` definitions: erf, sin, cos, clamp, var, std, where,
-- cumsum, index_select, gather, scatter_add(_), chunk, split,
-- repeat_interleave, topk and sort (values). Each Function carries the
-- grad_fn name PyTorch 1.13 prints for the same computation and PyTorch's
-- formula (tools/autograd/derivatives.yaml and FunctionsManual.cpp), written
-- with attn's own ops; the forwards are the raw C functions of `attn.core`.
-- `install(attn)` (run by attn.autograd.formulas, the one installer) puts
-- them in place of `attn.name` and `Tensor.name`; argsort is not
-- differentiable and stays the C function. Checked by
-- spec/indexing_stats_ops_grad_spec.lua against torch autograd.
-- @module attn.autograd.indexing_stats_ops
local core = require "attn.core"
local autograd = require "attn.autograd"

local raw_method = core.Tensor -- methods only C has (clamp_, scatter_add_)

local is_tensor = require("attn.argcheck").is_tensor

-- the positions of the tensor arguments among ..., in order: the engine's inputs
local function tensor_positions(...)
  local pos = {}
  for i = 1, select("#", ...) do
    if is_tensor((select(i, ...))) then pos[#pos + 1] = i end
  end
  return pos
end

-- one gradient per tensor input, from gradients keyed by argument position
local function per_input(ctx, by_position)
  local out = {}
  for i, p in ipairs(ctx.positions) do out[i] = by_position[p] end
  return table.unpack(out, 1, #ctx.positions)
end

-- an index argument (a table or a tensor of 1-based integers) as a tensor
local function index_tensor(index)
  if is_tensor(index) then return index end
  return core.tensor(index)
end

-- a 1-based dim as a positive one
local function positive_dim(d, ndim)
  if d < 0 then return d + math.max(ndim, 1) + 1 end
  return d
end

local M = { functions = {} }
local F = M.functions

-- ---- elementwise ---------------------------------------------------------

F.erf = autograd.Function {
  name = "ErfBackward0", fname = "attn.erf", raw = core.erf,
  forward = function(ctx, x, ...)
    ctx:save_for_backward(x)
    return core.erf(x, ...)
  end,
  backward = function(ctx, grad) -- 2 / sqrt(pi) * exp(-x^2) * grad
    local x = ctx:saved()
    return core.exp(core.neg(x * x)) * (2 / math.sqrt(math.pi)) * grad
  end,
}

F.sin = autograd.Function {
  name = "SinBackward0", fname = "attn.sin", raw = core.sin,
  forward = function(ctx, x, ...)
    ctx:save_for_backward(x)
    return core.sin(x, ...)
  end,
  backward = function(ctx, grad)
    local x = ctx:saved()
    return grad * core.cos(x)
  end,
}

F.cos = autograd.Function {
  name = "CosBackward0", fname = "attn.cos", raw = core.cos,
  forward = function(ctx, x, ...)
    ctx:save_for_backward(x)
    return core.cos(x, ...)
  end,
  backward = function(ctx, grad)
    local x = ctx:saved()
    return grad * core.neg(core.sin(x))
  end,
}

-- ---- clamp -----------------------------------------------------------------

-- PyTorch's clamp_backward (number bounds, ClampBackward1): x's gradient
-- passes where min <= x <= max (bounds included, NaN excluded); with tensor
-- bounds (ClampBackward0, clamp_backward_min_max) min's passes where x < min
-- (and min < max), max's where x > max (or max < min); each is summed back to
-- its input's shape. x is the input before the op (a copy for clamp_).
local function clamp_backward(ctx, grad)
  local x, lo_t, hi_t = ctx:saved()
  local lo, hi = ctx.lo, ctx.hi
  if ctx.lo_size then lo = lo_t end
  if ctx.hi_size then hi = hi_t end
  local g = {}
  if lo ~= nil and hi ~= nil then
    g[1] = core.where(core.ge(x, lo) * core.le(x, hi), grad, 0)
    if is_tensor(lo) then g[2] = core.where(core.lt(x, lo) * core.lt(lo, hi), grad, 0) end
    if is_tensor(hi) then g[3] = core.where(core.gt(x, hi) + core.lt(hi, lo), grad, 0) end -- or of 0/1 masks
  elseif lo ~= nil then
    g[1] = core.where(core.ge(x, lo), grad, 0)
    if is_tensor(lo) then g[2] = core.where(core.lt(x, lo), grad, 0) end
  else
    g[1] = core.where(core.le(x, hi), grad, 0)
    if is_tensor(hi) then g[3] = core.where(core.gt(x, hi), grad, 0) end
  end
  local sizes = { ctx.x_size, ctx.lo_size, ctx.hi_size }
  local by_position = {}
  for i = 1, 3 do
    if g[i] and sizes[i] then by_position[i] = autograd.sum_to(g[i], sizes[i]) end
  end
  return per_input(ctx, by_position)
end

local function clamp_name(_, lo, hi)
  return (is_tensor(lo) or is_tensor(hi)) and "ClampBackward0" or "ClampBackward1"
end

-- a tensor bound is saved with x (by the caller), a number kept as it is
local function clamp_forward(ctx, x, lo, hi, ...)
  ctx.positions = tensor_positions(x, lo, hi)
  ctx.lo = not is_tensor(lo) and lo or nil
  ctx.hi = not is_tensor(hi) and hi or nil
  ctx.x_size = x:size()
  ctx.lo_size = is_tensor(lo) and lo:size() or nil
  ctx.hi_size = is_tensor(hi) and hi:size() or nil
  return ctx
end

F.clamp = autograd.Function {
  name = clamp_name, fname = "attn.clamp", raw = core.clamp,
  forward = function(ctx, x, lo, hi, ...)
    local r = core.clamp(x, lo, hi, ...) -- first: its argument errors name clamp
    clamp_forward(ctx, x, lo, hi)
    ctx:save_for_backward(x, ctx.lo_size and lo or nil, ctx.hi_size and hi or nil)
    return r
  end,
  backward = clamp_backward,
}

F.clamp_ = autograd.Function {
  name = clamp_name, fname = "Tensor:clamp_", raw = raw_method.clamp_, dirty = true,
  forward = function(ctx, x, lo, hi, ...)
    if not is_tensor(x) then return raw_method.clamp_(x, lo, hi, ...) end -- its error
    local before = x:clone() -- x before it is overwritten
    local r = raw_method.clamp_(x, lo, hi, ...)
    clamp_forward(ctx, x, lo, hi)
    ctx:save_for_backward(before, ctx.lo_size and lo or nil, ctx.hi_size and hi or nil)
    return r
  end,
  backward = clamp_backward,
}

-- ---- var, std --------------------------------------------------------------

-- the arguments of var/std: dim, keepdim and the correction, as the C binding reads them
local function moment_args(...)
  local n = select("#", ...)
  local last = n > 0 and select(n, ...) or nil
  local correction = 1
  if type(last) == "table" and not is_tensor(last) then
    if last.unbiased == false then correction = 0 end
    n = n - 1
  end
  local dim, keepdim = ...
  if n < 1 then dim = nil end
  if n < 2 then keepdim = nil end
  return dim, keepdim, correction
end

-- PyTorch's var_backward: (2 / (n - correction)) * grad * (x - mean), grad
-- unsqueezed at dim unless keepdim; over every element with n <= correction:
-- grad * (NaN where x == mean, else inf)
local function var_backward(grad, x, dim, keepdim, correction)
  if dim == nil or x:dim() == 0 then
    local dof = x:numel() - correction
    if dof <= 0 then
      local hit = core.eq(x, core.mean(x))
      return grad * core.where(hit, 0 / 0, math.huge)
    end
    return grad * (2 / dof) * (x - core.mean(x))
  end
  local d = positive_dim(dim, x:dim())
  if not keepdim and x:dim() > 1 then grad = grad:unsqueeze(d) end
  local dof = x:size(d) - correction
  return grad * (2 / dof) * (x - core.mean(x, d, true))
end

F.var = autograd.Function {
  name = "VarBackward0", fname = "attn.var", raw = core.var,
  forward = function(ctx, x, ...)
    ctx:save_for_backward(x)
    ctx.dim, ctx.keepdim, ctx.correction = moment_args(...)
    return core.var(x, ...)
  end,
  backward = function(ctx, grad)
    local x = ctx:saved()
    return var_backward(grad, x, ctx.dim, ctx.keepdim, ctx.correction)
  end,
}

-- std_backward: var_backward of grad / (2 * result), 0 where result is 0
F.std = autograd.Function {
  name = "StdBackward0", fname = "attn.std", raw = core.std,
  forward = function(ctx, x, ...)
    local result = core.std(x, ...)
    ctx:save_for_backward(x, result)
    ctx.dim, ctx.keepdim, ctx.correction = moment_args(...)
    return result
  end,
  backward = function(ctx, grad)
    local x, result = ctx:saved()
    local g = core.masked_fill(grad / (result * 2), core.eq(result, 0), 0)
    return var_backward(g, x, ctx.dim, ctx.keepdim, ctx.correction)
  end,
}

-- ---- where, cumsum ---------------------------------------------------------

F.where = autograd.Function {
  name = "WhereBackward0", fname = "attn.where", raw = core.where,
  forward = function(ctx, cond, a, b, ...)
    local r = core.where(cond, a, b, ...)
    ctx.positions = tensor_positions(cond, a, b)
    ctx:save_for_backward(cond)
    ctx.a_size = is_tensor(a) and a:size() or nil
    ctx.b_size = is_tensor(b) and b:size() or nil
    return r
  end,
  backward = function(ctx, grad)
    local cond = ctx:saved()
    local by_position = {}
    if ctx.a_size then by_position[2] = autograd.sum_to(core.where(cond, grad, 0), ctx.a_size) end
    if ctx.b_size then by_position[3] = autograd.sum_to(core.where(cond, 0, grad), ctx.b_size) end
    return per_input(ctx, by_position)
  end,
}

-- t:where(condition, other) is where(condition, t, other)
function M.where_method(t, cond, other, ...)
  return F.where(cond, t, other, ...)
end

-- the indices n, n - 1, ..., 1: a flip along a dim as an index_select
local function reversed(n)
  return core.arange(n, 0, -1)
end

F.cumsum = autograd.Function {
  name = "CumsumBackward0", fname = "attn.cumsum", raw = core.cumsum,
  forward = function(ctx, x, dim, ...)
    ctx.dim = dim
    return core.cumsum(x, dim, ...)
  end,
  backward = function(ctx, grad) -- PyTorch's reversed cumsum: grad.flip(d).cumsum(d).flip(d)
    if grad:numel() <= 1 or grad:dim() == 0 then return grad end
    local d = positive_dim(ctx.dim, grad:dim())
    local n = grad:size(d)
    if n == 1 then return grad end
    local rev = reversed(n)
    return core.index_select(core.cumsum(core.index_select(grad, d, rev), d), d, rev)
  end,
}

-- ---- index ops ---------------------------------------------------------------

-- zeros of `size` with grad added at index along d (index_add_): index [m]
-- 1-based, grad of size m along d; adds in index order, as PyTorch's index_add_
local function index_add(size, d, index, grad)
  local shape = {}
  for k = 1, #size do shape[k] = 1 end
  shape[d] = index:numel()
  local expanded = index:reshape(shape):expand(grad:size())
  return raw_method.scatter_add_(core.zeros(size), d, expanded, grad)
end

F.index_select = autograd.Function {
  name = "IndexSelectBackward0", fname = "attn.index_select", raw = core.index_select,
  forward = function(ctx, x, dim, index, ...)
    local r = core.index_select(x, dim, index, ...)
    ctx.positions = tensor_positions(x, dim, index)
    ctx.size, ctx.dim = x:size(), dim
    ctx:save_for_backward(index_tensor(index)) -- saved: an in-place change of the index is caught
    return r
  end,
  backward = function(ctx, grad)
    local d = positive_dim(ctx.dim, #ctx.size)
    return per_input(ctx, { index_add(ctx.size, d, ctx:saved(), grad) })
  end,
}

F.gather = autograd.Function {
  name = "GatherBackward0", fname = "attn.gather", raw = core.gather,
  forward = function(ctx, x, dim, index, ...)
    local r = core.gather(x, dim, index, ...)
    ctx.positions = tensor_positions(x, dim, index)
    ctx.size, ctx.dim = x:size(), dim
    ctx:save_for_backward(index_tensor(index))
    return r
  end,
  backward = function(ctx, grad) -- zeros(x):scatter_add_(dim, index, grad)
    return per_input(ctx, { raw_method.scatter_add_(core.zeros(ctx.size), ctx.dim, ctx:saved(), grad) })
  end,
}

-- src's gradient: grad gathered at index, zeros where src is larger than index
local function scatter_add_src_grad(grad, dim, index, src_size)
  local picked = core.gather(grad, dim, index)
  local same = #src_size == picked:dim()
  for k = 1, #src_size do same = same and src_size[k] == picked:size(k) end
  if same then return picked end
  local g = core.zeros(src_size)
  local region = g
  for k = 1, picked:dim() do region = region:narrow(k, 1, picked:size(k)) end
  region:copy_(picked)
  return g
end

local function scatter_add_function(inplace)
  return autograd.Function {
    name = "ScatterAddBackward0",
    fname = inplace and "Tensor:scatter_add_" or "attn.scatter_add",
    raw = inplace and raw_method.scatter_add_ or core.scatter_add,
    dirty = inplace or nil,
    forward = function(ctx, self, dim, index, src, ...)
      local r
      if inplace then r = raw_method.scatter_add_(self, dim, index, src, ...)
      else r = core.scatter_add(self, dim, index, src, ...) end
      ctx.positions = tensor_positions(self, dim, index, src)
      ctx.dim = dim
      ctx.src_size = src:size()
      -- the index only for src's gradient (derivatives.yaml)
      local need = ctx.needs_input_grad
      if need[#ctx.positions] then ctx:save_for_backward(index_tensor(index)) end
      return r
    end,
    backward = function(ctx, grad) -- self: grad; src: grad.gather(dim, index)
      local by_position = { grad }
      local index = ctx:saved()
      if index then by_position[4] = scatter_add_src_grad(grad, ctx.dim, index, ctx.src_size) end
      return per_input(ctx, by_position)
    end,
  }
end
F.scatter_add = scatter_add_function(false)
F.scatter_add_ = scatter_add_function(true)

-- ---- chunk, split ------------------------------------------------------------

-- the gradient of x from the pieces' gradients: their concatenation along dim
local function join_pieces(ctx, ...)
  local grads = { ... }
  if #grads == 0 then return core.zeros(ctx.size) end
  return core.cat(grads, positive_dim(ctx.dim or 1, #ctx.size))
end

F.chunk = autograd.Function {
  name = "SplitBackward0", fname = "attn.chunk", raw = core.chunk, view = true, multi_view = true,
  forward = function(ctx, x, chunks, dim, ...)
    local n = select("#", ...) -- (an extra argument: the C function's error)
    if n > 0 then return core.chunk(x, chunks, dim, ...) end
    ctx.size, ctx.dim = is_tensor(x) and x:size() or nil, dim
    return core.chunk(x, chunks, dim)
  end,
  backward = join_pieces,
}

local split_size = autograd.Function {
  name = "SplitBackward0", fname = "attn.split", raw = core.split, view = true, multi_view = true,
  forward = function(ctx, x, size, dim, ...)
    if select("#", ...) > 0 then return core.split(x, size, dim, ...) end
    ctx.size, ctx.dim = is_tensor(x) and x:size() or nil, dim
    return core.split(x, size, dim)
  end,
  backward = join_pieces,
}

local split_sizes = autograd.Function {
  name = "SplitWithSizesBackward0", fname = "attn.split", raw = core.split, view = true, multi_view = true,
  forward = function(ctx, x, sizes, dim, ...)
    if select("#", ...) > 0 then return core.split(x, sizes, dim, ...) end
    ctx.size, ctx.dim = is_tensor(x) and x:size() or nil, dim
    return core.split(x, sizes, dim)
  end,
  backward = join_pieces,
}

function F.split(x, size, ...)
  if type(size) == "table" and not is_tensor(size) then return split_sizes(x, size, ...) end
  return split_size(x, size, ...)
end

-- ---- repeat_interleave -------------------------------------------------------

-- PyTorch runs it as an index_select (IndexSelectBackward0): the index is
-- 1..n repeated as x's slices are
F.repeat_interleave = autograd.Function {
  name = "IndexSelectBackward0", fname = "attn.repeat_interleave", raw = core.repeat_interleave,
  forward = function(ctx, x, repeats, dim, ...)
    local out = core.repeat_interleave(x, repeats, dim, ...)
    ctx.positions = tensor_positions(x, repeats, dim)
    ctx.size, ctx.dim = x:size(), dim
    local n = dim == nil and x:numel() or x:size(dim)
    ctx.index = core.repeat_interleave(core.arange(1, n + 1), repeats)
    return out
  end,
  backward = function(ctx, grad)
    local g
    if ctx.dim == nil then -- x was flattened
      local n = 1
      for _, s in ipairs(ctx.size) do n = n * s end
      g = index_add({ n }, 1, ctx.index, grad):reshape(ctx.size)
    else
      g = index_add(ctx.size, positive_dim(ctx.dim, #ctx.size), ctx.index, grad)
    end
    return per_input(ctx, { g })
  end,
}

-- ---- topk, sort ----------------------------------------------------------------

-- the values' gradient put back where the values came from: zeros(x) with grad
-- at indices along dim (PyTorch's value_selecting_reduction_backward; the
-- indices of one line are distinct, so adding equals scattering)
local function to_indices(ctx, grad)
  if #ctx.size == 0 then return grad:reshape(ctx.size) end
  return raw_method.scatter_add_(core.zeros(ctx.size), ctx.dim, ctx:saved(), grad)
end

F.topk = autograd.Function {
  name = "TopkBackward0", fname = "attn.topk", raw = core.topk,
  forward = function(ctx, x, k, dim, ...)
    local values, indices = core.topk(x, k, dim, ...)
    ctx:mark_non_differentiable(indices)
    ctx.size = x:size()
    ctx:save_for_backward(indices) -- saved: an in-place change of the returned indices is caught
    ctx.dim = positive_dim(dim or -1, x:dim())
    return values, indices
  end,
  backward = to_indices,
}

F.sort = autograd.Function {
  name = "SortBackward0", fname = "attn.sort", raw = core.sort,
  forward = function(ctx, x, dim, ...)
    local values, indices = core.sort(x, dim, ...)
    ctx:mark_non_differentiable(indices)
    ctx.size = x:size()
    ctx:save_for_backward(indices) -- saved: an in-place change of the returned indices is caught
    ctx.dim = positive_dim(dim or -1, x:dim())
    return values, indices
  end,
  backward = to_indices,
}

-- Put the functions in place of the C ones: attn.name and Tensor.name, and the
-- in-place methods clamp_ and scatter_add_.
function M.install(attn)
  local Tensor = attn.Tensor
  for _, name in ipairs { "erf", "sin", "cos", "clamp", "var", "std", "cumsum", "index_select", "gather",
    "scatter_add", "chunk", "split", "repeat_interleave", "topk", "sort" } do
    attn[name], Tensor[name] = F[name], F[name]
  end
  attn.where = F.where
  Tensor.where = M.where_method
  Tensor.scatter_add_ = F.scatter_add_
  Tensor.clamp_ = F.clamp_
end

return M
