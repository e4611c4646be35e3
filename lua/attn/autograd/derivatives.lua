--- The backward formula of every differentiable built-in op of the core, in
-- one table (PyTorch's derivatives.yaml, as Lua). Each entry is an
-- autograd.Function over the raw C function of the op; `install` puts the
-- recorded versions in place of the raw ones in the methods table, the module
-- table and the metatable, so `t:exp()`, `attn.exp(t)` and `a + b` all record.
-- The other files of formulas (clamp, gather, sort, attention, rope, linear,
-- the training layers...) and which op each holds: lua/attn/autograd/formulas.lua,
-- whose install runs this one.
--
-- Conventions of the formulas: `g` is the gradient of the output, `ctx:saved()`
-- gives back what forward saved, dims are 1-based as everywhere in the API and
-- normalised once in forward (`ctx.dim`). Broadcast inputs get their gradient
-- summed back with `sum_to`. The node names are PyTorch 1.13's for the same
-- call (checked by spec/autograd_spec.lua against torch's printout).
-- @module attn.autograd.derivatives
local core = require "attn.core"
local autograd = require "attn.autograd"
local Function, sum_to = autograd.Function, autograd.sum_to
local Tensor, Tensor_mt = core.Tensor, core.Tensor_mt

local M = {}

local is_tensor = require("attn.argcheck").is_tensor

-- the raw C functions, captured before install replaces them
local raw = {}
for k, v in pairs(Tensor) do raw[k] = v end
for k, v in pairs(core) do if type(v) == "function" and raw[k] == nil then raw[k] = v end end
M.raw = raw
-- the methods themselves for the per-call bookkeeping: x:size() first goes
-- through the tensor's __index
local t_size, t_dim = raw.size, raw.dim

local function norm_dim(d, ndim) if d < 0 then return d + ndim + 1 end return d end

-- ------------------------------------------------------------ elementwise ----

-- What a gradient formula reads of (a, b, r): a string of those letters.
local function reads(spec)
  return { a = spec:find("a", 1, true) ~= nil, b = spec:find("b", 1, true) ~= nil, r = spec:find("r", 1, true) ~= nil }
end

-- one binary op: forward raw(a, b) with numbers allowed on either side.
-- reads_a, reads_b: what grad_a and grad_b read of (a, b, r); an operand or
-- the result is saved only when the formula of an input that needs a
-- gradient reads it (derivatives.yaml), a number operand as well (torch
-- saves it as a wrapped-number tensor, so a second backward is refused alike)
local function binary(opname, name_of, grad_a, grad_b, reads_a, reads_b)
  local f = raw[opname]
  local ua, ub = reads(reads_a), reads(reads_b)
  return Function{
    name = name_of, fname = "attn." .. opname, raw = f,
    forward = function(ctx, ...)
      local a, b = ...
      local r = f(...)
      local ta, tb = is_tensor(a), is_tensor(b)
      ctx.a_shape = ta and t_size(a) or nil
      ctx.b_shape = tb and t_size(b) or nil
      local need = ctx.needs_input_grad
      local na = ta and need[1]
      local nb = tb and need[ta and 2 or 1]
      local keep_a = (na and ua.a) or (nb and ub.a)
      local keep_b = (na and ua.b) or (nb and ub.b)
      local keep_r = (na and ua.r) or (nb and ub.r)
      if keep_a or keep_b or keep_r then
        ctx:save_for_backward(keep_a and a or nil, keep_b and b or nil, keep_r and r or nil)
      end
      return r
    end,
    backward = function(ctx, g)
      local a, b, r = ctx:saved()
      local ga, gb
      local ia = ctx.a_shape and 1 or nil
      local ib = ctx.b_shape and (ia and 2 or 1) or nil
      if ia and ctx.needs_input_grad[ia] then ga = sum_to(grad_a(g, a, b, r), ctx.a_shape) end
      if ib and ctx.needs_input_grad[ib] then gb = sum_to(grad_b(g, a, b, r), ctx.b_shape) end
      if ia and ib then return ga, gb end
      if ia then return ga end
      return gb
    end,
  }
end

local function const(name) return function() return name end end

M.add = binary("add", const("AddBackward0"), function(g) return g end, function(g) return g end, "", "")
M.sub = binary("sub", function(a) return is_tensor(a) and "SubBackward0" or "RsubBackward1" end,
  function(g) return g end, function(g) return -g end, "", "")
M.mul = binary("mul", const("MulBackward0"), function(g, _, b) return g * b end, function(g, a) return g * a end,
  "b", "a")
M.div = binary("div", function(a) return is_tensor(a) and "DivBackward0" or "MulBackward0" end,
  function(g, _, b) return g / b end,
  function(g, a, b) return -g * a / (b * b) end, "b", "ab")
-- torch's pow_backward_self / pow_backward_exponent, with its grouping g * (...):
-- d/dx x^y = y x^(y-1), 0 where y == 0 (also at x = 0, where the formula is NaN);
-- d/dy x^y = x^y log x, 0 where x == 0 and y >= 0. Nodes: PowBackward0 (number
-- exponent), PowBackward1 (both tensors), PowBackward2 (number base: log(base) in double)
M.pow = binary("pow",
  function(a, b) return not is_tensor(a) and "PowBackward2" or is_tensor(b) and "PowBackward1" or "PowBackward0" end,
  function(g, a, b)
    if b == 0 then return raw.zeros(a:size()) end
    local d = g * (b * raw.pow(a, b - 1))
    if is_tensor(b) then return d:masked_fill(b:eq(0), 0) end
    return d
  end,
  function(g, a, b, r)
    if is_tensor(a) then return g * (r * raw.log(a)):masked_fill(a:eq(0):mul(b:ge(0)), 0) end
    local d = r * math.log(a)
    if a == 0 then d = d:masked_fill(b:ge(0), 0) end
    return g * d
  end, "ab", "abr")
-- remainder(a, b) = a - b * (a // b): d/da = 1, d/db = -(a // b), the quotient of
-- floor_divide as torch's remainder backward (div rounding_mode="floor"), not
-- floor(a / b), whose rounded a / b can reach the next integer (1 % 0.1: 9, not 10)
M.remainder = binary("remainder", function(_, b) return is_tensor(b) and "RemainderBackward1" or "RemainderBackward0" end,
  function(g) return g end,
  function(g, a, b) return -g * raw.floor_divide(a, b) end, "", "ab")
-- maximum/minimum: the gradient to the larger (smaller) input, halved on ties
local function extremum_grad(g, x, y, larger)
  local wins = larger and x:gt(y) or x:lt(y)
  return g * (wins + x:eq(y) * 0.5)
end
M.maximum = binary("maximum", const("MaximumBackward0"),
  function(g, a, b) return extremum_grad(g, a, b, true) end, function(g, a, b) return extremum_grad(g, b, a, true) end,
  "ab", "ab")
M.minimum = binary("minimum", const("MinimumBackward0"),
  function(g, a, b) return extremum_grad(g, a, b, false) end, function(g, a, b) return extremum_grad(g, b, a, false) end,
  "ab", "ab")

-- in-place binary ops: self op= other. grad_self reads other (or nothing);
-- grad_other reads other and self's old value (a copy made before the write,
-- as torch's original_self) or nothing: each kept only for an input that
-- needs a gradient (derivatives.yaml), so later in-place ops on self are free
local function binary_(opname, name, grad_self, grad_other, self_reads_other, other_reads_old, other_reads_other)
  local f = raw[opname .. "_"]
  return Function{
    name = name, fname = "Tensor:" .. opname .. "_", dirty = true, raw = f,
    forward = function(ctx, ...)
      local self, other = ...
      local need, to = ctx.needs_input_grad, is_tensor(other)
      local ns, no = need[1], to and need[2]
      local old = no and other_reads_old and self:clone() or nil
      ctx.other_shape = to and other:size() or nil
      local keep_other = (ns and self_reads_other) or (no and other_reads_other)
      -- saved before the write: an other that shares self's storage (s:mul_(s),
      -- s:mul_(s:detach())) is then seen as modified at backward, as PyTorch
      -- raises, instead of giving a gradient from the written values
      if old or keep_other then ctx:save_for_backward(old, keep_other and other or nil) end
      return f(...)
    end,
    backward = function(ctx, g)
      local old, other = ctx:saved()
      local gs = ctx.needs_input_grad[1] and grad_self(g, other) or nil
      if ctx.other_shape then
        local go = ctx.needs_input_grad[2] and sum_to(grad_other(g, old, other), ctx.other_shape) or nil
        return gs, go
      end
      return gs
    end,
  }
end
M.add_ = binary_("add", "AddBackward0", function(g) return g end, function(g) return g end, false, false, false)
M.sub_ = binary_("sub", "SubBackward0", function(g) return g end, function(g) return -g end, false, false, false)
M.mul_ = binary_("mul", "MulBackward0", function(g, o) return g * o end, function(g, old) return g * old end, true,
  true, false)
-- other's gradient -g * r / o with r = old / o recomputed (the same bits as the forward's result)
M.div_ = binary_("div", "DivBackward0", function(g, o) return g / o end,
  function(g, old, o) return -g * raw.div(old, o) / o end, true, true, true)
M.remainder_ = binary_("remainder", function(_, o) return is_tensor(o) and "RemainderBackward1" or "RemainderBackward0" end,
  function(g) return g end, function(g, old, o) return -g * raw.floor_divide(old, o) end, false, true, true)

-- unary ops: grad of the input from g, the input x and the result r; only
-- what the formula reads ("x", "r" or "") is saved
local function unary(opname, name, grad, reads_spec)
  local f = raw[opname]
  local save_x, save_r = reads_spec:find("x", 1, true) ~= nil, reads_spec:find("r", 1, true) ~= nil
  return Function{
    name = name, fname = "attn." .. opname, raw = f,
    forward = function(ctx, x, ...)
      local r = f(x, ...)
      if save_x or save_r then ctx:save_for_backward(save_x and x or nil, save_r and r or nil) end
      return r
    end,
    backward = function(ctx, g)
      local x, r = ctx:saved()
      return grad(g, x, r)
    end,
  }
end
M.neg = Function{name = "NegBackward0", fname = "attn.neg", raw = raw.neg,
  forward = function(_, x, ...) return raw.neg(x, ...) end, backward = function(_, g) return -g end}
M.exp = unary("exp", "ExpBackward0", function(g, _, r) return g * r end, "r")
M.log = unary("log", "LogBackward0", function(g, x) return g / x end, "x")
M.sqrt = unary("sqrt", "SqrtBackward0", function(g, _, r) return g / (r * 2) end, "r")
M.tanh = unary("tanh", "TanhBackward0", function(g, _, r) return g * (1 - r * r) end, "r")
-- sign(x): 1, -1, or 0 at 0 (torch's sgn)
M.abs = unary("abs", "AbsBackward0", function(g, x) return g * (x:gt(0):float() - x:lt(0)) end, "x") -- bool - bool is refused
M.floor = unary("floor", "FloorBackward0", function(g) return raw.zeros(g:size()) end, "")
M.sigmoid = unary("sigmoid", "SigmoidBackward0", function(g, _, r) return g * r * (1 - r) end, "r")
M.relu = unary("relu", "ReluBackward0", function(g, _, r) return g * r:gt(0) end, "r")
M.reciprocal = unary("reciprocal", "ReciprocalBackward0", function(g, _, r) return -g * r * r end, "r")

-- ------------------------------------------------------------ reductions ----

local shape_key, fill_key = core._autograd_shape_key, core._autograd_fill_key

-- g of a reduction along d (keepdim or not) back to x's shape
local function unreduce(g, d, keepdim, x_shape)
  if d and not keepdim then g = g:unsqueeze(d) end
  return g:expand(x_shape)
end

local function total(opname, name_all, name_dim, scale)
  local f = raw[opname]
  return Function{
    name = function(_, d) return d == nil and name_all or name_dim end, fname = "attn." .. opname, raw = f,
    forward = function(ctx, ...)
      local x, d, keepdim = ...
      local r = f(...)
      if d == nil and not scale then
        -- a whole sum: its backward needs x's sizes alone, kept as their key (no table)
        ctx.shape_key = shape_key(x)
        return r
      end
      ctx.shape = t_size(x)
      ctx.dim = d and norm_dim(d, t_dim(x)) or nil
      ctx.keepdim = keepdim
      ctx.count = scale and (d and ctx.shape[ctx.dim] or x:numel()) or nil
      -- torch 1.13's MeanBackward1 saves self (its formula reads self's numel), so
      -- an in-place write of x before the backward is an error there: the same here
      if scale and d ~= nil and ctx.needs_input_grad[1] then ctx:save_for_backward(x) end
      return r
    end,
    backward = function(ctx, g)
      ctx:saved()
      -- a whole sum: g's one value everywhere (its bits, a NaN's too), in one
      -- call (expand and contiguous are two and a view)
      if ctx.shape_key then return fill_key(ctx.shape_key, g) end
      local gx = unreduce(g, ctx.dim, ctx.keepdim, ctx.shape)
      if ctx.count then gx = gx / ctx.count end
      return gx:contiguous()
    end,
  }
end
M.sum = total("sum", "SumBackward0", "SumBackward1", false)
M.mean = total("mean", "MeanBackward0", "MeanBackward1", true)

-- max/min: with a dim, the gradient goes to the selected index (the first NaN
-- where there is one) and zeros elsewhere, as torch's scatter into zeros; over
-- all elements it is shared evenly among the elements equal to the result, or
-- among the NaNs when the result is NaN (torch 1.13's evenly_distribute_backward)
local function extreme(opname, name_all, name_dim)
  local f = raw[opname]
  return Function{
    name = function(_, d) return d == nil and name_all or name_dim end, fname = "attn." .. opname, raw = f,
    forward = function(ctx, ...)
      local x, d, keepdim = ...
      if d == nil then
        local r = f(...)
        ctx:save_for_backward(x, r)
        return r
      end
      local v, idx = f(...)
      ctx:mark_non_differentiable(idx)
      ctx.dim = norm_dim(d, x:dim())
      ctx.keepdim = keepdim
      ctx.shape = x:size()
      ctx:save_for_backward(idx)
      return v, idx
    end,
    backward = function(ctx, g)
      if ctx.dim == nil then
        local x, r = ctx:saved()
        local hits = r:item() ~= r:item() and x:ne(x) or x:eq(r)
        return raw.zeros(x:size()):masked_fill(hits, (g / hits:sum()):item())
      end
      local idx = ctx:saved()
      local d, n = ctx.dim, ctx.shape[ctx.dim]
      if not ctx.keepdim then
        idx = idx:unsqueeze(d)
        g = g:unsqueeze(d)
      end
      local pos_shape = {}
      for i = 1, #ctx.shape do pos_shape[i] = 1 end
      pos_shape[d] = n
      local positions = raw.arange(1, n + 1):view(pos_shape)
      return g:expand(ctx.shape):masked_fill(positions:ne(idx), 0)
    end,
  }
end
M.max = extreme("max", "MaxBackward1", "MaxBackward0")
M.min = extreme("min", "MinBackward1", "MinBackward0")

-- ------------------------------------------------------------ nn maths ----

M.softmax = Function{
  name = "SoftmaxBackward0", fname = "attn.softmax", raw = raw.softmax,
  forward = function(ctx, ...)
    local _, d = ...
    local r = raw.softmax(...)
    ctx.dim = d
    ctx:save_for_backward(r)
    return r
  end,
  -- dx = y * (g - sum(g * y, d))
  backward = function(ctx, g)
    local y = ctx:saved()
    return y * (g - (g * y):sum(ctx.dim, true))
  end,
}

M.log_softmax = Function{
  name = "LogSoftmaxBackward0", fname = "attn.log_softmax", raw = raw.log_softmax,
  forward = function(ctx, ...)
    local _, d = ...
    local r = raw.log_softmax(...)
    ctx.dim = d
    ctx:save_for_backward(r)
    return r
  end,
  -- dx = g - exp(y) * sum(g, d)
  backward = function(ctx, g)
    local y = ctx:saved()
    return g - y:exp() * g:sum(ctx.dim, true)
  end,
}

M.masked_fill = Function{
  name = "MaskedFillBackward0", fname = "attn.masked_fill", raw = raw.masked_fill,
  forward = function(ctx, ...)
    local x, mask = ...
    local r = raw.masked_fill(...)
    ctx.shape = x:size()
    ctx:save_for_backward(mask) -- saved, so an in-place change of the mask is caught
    return r
  end,
  backward = function(ctx, g) return sum_to(g:masked_fill(ctx:saved(), 0), ctx.shape), nil end,
}
M.masked_fill_ = Function{
  name = "MaskedFillBackward0", fname = "Tensor:masked_fill_", dirty = true, raw = raw.masked_fill_,
  forward = function(ctx, ...)
    local _, mask = ...
    local r = raw.masked_fill_(...)
    ctx:save_for_backward(mask)
    return r
  end,
  backward = function(ctx, g) return g:masked_fill(ctx:saved(), 0), nil end,
}

local function triangle(opname, name, inplace)
  local f = raw[opname]
  local mask_op = opname:gsub("_$", "")
  return Function{
    name = name, fname = (inplace and "Tensor:" or "attn.") .. opname, dirty = inplace, raw = f,
    forward = function(ctx, ...)
      local _, k = ...
      ctx.k = k
      return f(...)
    end,
    backward = function(ctx, g) return raw[mask_op](g, ctx.k) end,
  }
end
M.triu = triangle("triu", "TriuBackward0")
M.tril = triangle("tril", "TrilBackward0")
M.triu_ = triangle("triu_", "TriuBackward0", true)
M.tril_ = triangle("tril_", "TrilBackward0", true)

-- dropout: out = x * noise with noise = bernoulli(1 - p) / (1 - p), drawn by
-- the C dropout of a ones tensor: the same draws and the same float products
-- as attn.dropout(x), and the noise kept for the backward
local dropout_recorded = Function{
  name = "MulBackward0", fname = "attn.dropout",
  forward = function(ctx, x, p)
    local noise = raw.dropout(raw.ones(x:size()), p, true)
    ctx:save_for_backward(noise)
    return raw.mul(x, noise)
  end,
  backward = function(ctx, g) return g * ctx:saved() end,
}
function M.dropout(...)
  local x, p, training = ...
  if select("#", ...) > 3 or not is_tensor(x) or type(p) ~= "number" or not (p > 0 and p <= 1)
      or (training ~= nil and training ~= true) or x:numel() == 0 then
    return raw.dropout(...) -- identity (returns x itself, as torch) or the C function's error
  end
  return dropout_recorded(x, p, training)
end

-- ----------------------------------------------------------------- matmul ----

local function matmul_name(a, b)
  local da, db = a:dim(), b:dim()
  if da == 1 and db == 1 then return "DotBackward0" end
  if da == 2 and db == 2 then return "MmBackward0" end
  if da == 2 and db == 1 then return "MvBackward0" end
  if da == 1 and db == 2 then return "SqueezeBackward3" end
  -- torch 1.13 computes a matrix times a batch as (b^T a^T)^T made contiguous,
  -- unless a 3-D b is already transposed in memory
  if da == 2 and db >= 3 and not (db == 3 and not b:is_contiguous() and b:transpose(-1, -2):is_contiguous()) then
    return "CloneBackward0"
  end
  return "UnsafeViewBackward0"
end

-- torch.matmul's gradients: 1-D operands act as a row (a) or a column (b).
-- a is saved only for b's gradient and b only for a's (mm's formulas); the
-- sizes are kept apart
local function matmul_backward(ctx, g)
  local a, b = ctx:saved()
  local a_shape, b_shape = ctx.a_shape, ctx.b_shape
  local a1, b1 = #a_shape == 1, #b_shape == 1
  local g2 = g
  if b1 then g2 = g2:unsqueeze(-1) end
  if a1 then g2 = g2:unsqueeze(math.max(g2:dim(), 1)) end
  local ga, gb
  if ctx.needs_input_grad[1] then
    local b2 = b1 and b:unsqueeze(2) or b
    ga = sum_to(raw.matmul(g2, b2:transpose(-1, -2)), a1 and { 1, a_shape[1] } or a_shape):reshape(a_shape)
  end
  if ctx.needs_input_grad[2] then
    local a2 = a1 and a:unsqueeze(1) or a
    gb = sum_to(raw.matmul(a2:transpose(-1, -2), g2), b1 and { b_shape[1], 1 } or b_shape):reshape(b_shape)
  end
  return ga, gb
end

-- save a and b as the formulas of the inputs that need a gradient read them
local function save_operands(ctx, a, b)
  local need = ctx.needs_input_grad
  if need[1] or need[2] then ctx:save_for_backward(need[2] and a or nil, need[1] and b or nil) end
end

M.matmul = Function{
  name = matmul_name, fname = "attn.matmul", raw = raw.matmul,
  forward = function(ctx, ...)
    local a, b = ...
    local r = raw.matmul(...)
    ctx.a_shape, ctx.b_shape = a:size(), b:size()
    save_operands(ctx, a, b)
    return r
  end,
  backward = matmul_backward,
}

M.dot = Function{
  name = "DotBackward0", fname = "attn.dot", raw = raw.dot,
  forward = function(ctx, ...)
    local a, b = ...
    local r = raw.dot(...)
    save_operands(ctx, a, b)
    return r
  end,
  backward = function(ctx, g)
    local a, b = ctx:saved()
    return ctx.needs_input_grad[1] and g * b or nil, ctx.needs_input_grad[2] and g * a or nil
  end,
}

-- ------------------------------------------------------------------ views ----

local function view_fn(opname, name, back)
  local f = raw[opname]
  return Function{
    name = name, fname = "Tensor:" .. opname, view = true, raw = f,
    forward = function(ctx, x, ...)
      local r = f(x, ...)
      ctx.shape = x:size()
      return r
    end,
    backward = back,
  }
end

local function back_reshape(ctx, g) return g:reshape(ctx.shape) end

M.view = view_fn("view", "ViewBackward0", back_reshape)
M.squeeze = Function{
  name = function(_, d) return d == nil and "SqueezeBackward0" or "SqueezeBackward1" end,
  fname = "Tensor:squeeze", view = true, raw = raw.squeeze,
  forward = function(ctx, x, ...)
    local r = raw.squeeze(x, ...)
    ctx.shape = x:size()
    return r
  end,
  backward = back_reshape,
}
M.unsqueeze = view_fn("unsqueeze", "UnsqueezeBackward0", back_reshape)
M.expand = view_fn("expand", "ExpandBackward0", function(ctx, g) return sum_to(g, ctx.shape) end)
M.transpose = Function{
  name = "TransposeBackward0", fname = "Tensor:transpose", view = true, raw = raw.transpose,
  forward = function(ctx, ...)
    local _, d1, d2 = ...
    ctx.d1, ctx.d2 = d1, d2
    return raw.transpose(...)
  end,
  backward = function(ctx, g) return g:transpose(ctx.d1, ctx.d2) end,
}
M.t = Function{
  name = "TBackward0", fname = "Tensor:t", view = true, raw = raw.t,
  forward = function(_, x, ...) return raw.t(x, ...) end,
  backward = function(_, g) return g:t() end,
}
M.permute = Function{
  name = "PermuteBackward0", fname = "Tensor:permute", view = true, raw = raw.permute,
  forward = function(ctx, x, ...)
    local r = raw.permute(x, ...)
    -- the permutation as given (varargs or one table), normalised; its inverse for backward
    local dims = select("#", ...) == 1 and type((...)) == "table" and { table.unpack((...)) } or { ... }
    local inv, nd = {}, x:dim()
    for i, d in ipairs(dims) do inv[norm_dim(d, nd)] = i end
    ctx.inv = inv
    return r
  end,
  backward = function(ctx, g) return g:permute(ctx.inv) end,
}

-- narrow/select: the gradient is g placed into zeros at the slice
local function slice_back(opname)
  return function(ctx, g)
    local z = raw.zeros(ctx.shape)
    local part = ctx.len and raw[opname](z, ctx.d, ctx.i, ctx.len) or raw[opname](z, ctx.d, ctx.i)
    raw.copy_(part, g)
    return z
  end
end
M.narrow = Function{
  name = "SliceBackward0", fname = "Tensor:narrow", view = true, raw = raw.narrow,
  forward = function(ctx, ...)
    local x, d, start, len = ...
    local r = raw.narrow(...)
    ctx.shape, ctx.d, ctx.i, ctx.len = x:size(), d, start, len
    return r
  end,
  backward = slice_back("narrow"),
}
M.select = Function{
  name = "SelectBackward0", fname = "Tensor:select", view = true, raw = raw.select,
  forward = function(ctx, ...)
    local x, d, i = ...
    local r = raw.select(...)
    ctx.shape, ctx.d, ctx.i = x:size(), d, i
    return r
  end,
  backward = slice_back("select"),
}

-- reshape: a view when the strides allow it (ReshapeAliasBackward0), else a copy (UnsafeViewBackward0)
local reshape_alias = view_fn("reshape", "ReshapeAliasBackward0", back_reshape)
local reshape_copy = Function{
  name = "UnsafeViewBackward0", fname = "Tensor:reshape",
  forward = function(ctx, x, ...)
    local r = raw.reshape(x, ...)
    ctx.shape = x:size()
    return r
  end,
  backward = back_reshape,
}
function M.reshape(x, ...)
  if autograd.is_grad_enabled() and autograd._history[x] and is_tensor(x) then
    if pcall(raw.view, x, ...) then return reshape_alias(x, ...) end
    return reshape_copy(x, ...)
  end
  return raw.reshape(x, ...)
end

M.clone = Function{
  name = "CloneBackward0", fname = "Tensor:clone", raw = raw.clone,
  forward = function(_, x, ...) return raw.clone(x, ...) end,
  backward = function(_, g) return g end,
}
-- contiguous: a copy (CloneBackward0) when x is not contiguous, else x itself
M.contiguous = Function{
  name = "CloneBackward0", fname = "Tensor:contiguous", raw = raw.contiguous,
  forward = function(_, x, ...) return raw.contiguous(x, ...) end,
  backward = function(_, g) return g end,
}

-- cat/stack: each input's gradient is its slice of g
M.cat = Function{
  name = "CatBackward0", fname = "attn.cat", raw = raw.cat,
  forward = function(ctx, ...)
    local list, d = ...
    local r = raw.cat(...)
    local sizes, tensors = {}, {}
    ctx.dim = norm_dim(d or 1, r:dim())
    for _, t in ipairs(list) do
      if is_tensor(t) then
        tensors[#tensors + 1] = t
        sizes[#sizes + 1] = t:dim() == 1 and t:size(1) == 0 and 0 or t:size(ctx.dim)
      end
    end
    ctx.sizes = sizes
    return r
  end,
  backward = function(ctx, g)
    local out, start = {}, 1
    for i, n in ipairs(ctx.sizes) do
      if ctx.needs_input_grad[i] then out[i] = g:narrow(ctx.dim, start, n):contiguous() end
      start = start + n
    end
    return out
  end,
}
M.stack = Function{
  name = "StackBackward0", fname = "attn.stack", raw = raw.stack,
  forward = function(ctx, ...)
    local list, d = ...
    local r = raw.stack(...)
    ctx.dim = norm_dim(d or 1, r:dim())
    ctx.n = #list
    return r
  end,
  backward = function(ctx, g)
    local out = {}
    for i = 1, ctx.n do
      if ctx.needs_input_grad[i] then out[i] = g:select(ctx.dim, i):contiguous() end
    end
    return out
  end,
}

-- simple_attention(x) = softmax(x x^T) x, differentiated through its three uses of x:
-- with P = softmax(S), S = x x^T, O = P x: dx = P^T g + (dS + dS^T) x, dS = P * (dP - rowsum(dP * P)), dP = g x^T
M.simple_attention = Function{
  name = function(x) return x:dim() == 2 and "MmBackward0" or "UnsafeViewBackward0" end,
  fname = "attn.simple_attention", raw = raw.simple_attention,
  forward = function(ctx, ...)
    local r = raw.simple_attention(...)
    ctx:save_for_backward((...))
    return r
  end,
  backward = function(ctx, g)
    local x = ctx:saved()
    local xt = x:transpose(-1, -2)
    local p = raw.matmul(x, xt):softmax(-1)
    local dp = raw.matmul(g, xt)
    local ds = p * (dp - (dp * p):sum(-1, true))
    return raw.matmul(p:transpose(-1, -2), g) + raw.matmul(ds + ds:transpose(-1, -2), x)
  end,
}

-- ------------------------------------------------------- in place, fills ----

local function fill_like(opname, name)
  local f = raw[opname]
  return Function{
    name = name, fname = "Tensor:" .. opname, dirty = true, raw = f,
    forward = function(_, x, ...) return f(x, ...) end,
    backward = function(_, g) return raw.zeros(g:size()) end,
  }
end
M.fill_ = fill_like("fill_", "FillBackward2")
M.zero_ = fill_like("zero_", "ZeroBackward0")
M.uniform_ = fill_like("uniform_", "UniformBackward0")
M.normal_ = fill_like("normal_", "NormalBackward0")
M.copy_ = Function{
  name = "torch::autograd::CopyBackwards", fname = "Tensor:copy_", dirty = true, raw = raw.copy_,
  forward = function(ctx, ...)
    local _, src = ...
    local r = raw.copy_(...)
    ctx.src_shape = src:size()
    return r
  end,
  backward = function(ctx, g)
    return ctx.needs_input_grad[1] and raw.zeros(g:size()) or nil,
      ctx.needs_input_grad[2] and sum_to(g, ctx.src_shape) or nil
  end,
}

-- ---------------------------------------------------------------- install ----

local METAMETHODS = { __add = "add", __sub = "sub", __mul = "mul", __div = "div", __pow = "pow", __mod = "remainder" }

--- Put the recorded functions in place of the raw ones wherever the raw ones
-- are published: the methods table, the module table `attn` and the tensor
-- metatable (`attn.add`, `t:add` and `a + b` all record).
function M.install(attn)
  local recorded = {}
  for name, fn in pairs(M) do
    if type(fn) == "function" and raw[name] ~= nil and name ~= "install" then recorded[name] = fn end
  end
  for name, fn in pairs(recorded) do
    if rawget(Tensor, name) ~= nil then Tensor[name] = fn end
    if attn[name] ~= nil then attn[name] = fn end
  end
  for mm, name in pairs(METAMETHODS) do Tensor_mt[mm] = recorded[name] end
  -- number ^ tensor: torch's __rpow__ makes the number a 0-dim tensor first
  -- (PowBackward1, log of the float32 base), unlike attn.pow(number, t)
  local pow, tensor = recorded.pow, raw.tensor
  Tensor_mt.__pow = function(a, b)
    if type(a) == "number" and is_tensor(b) then a = tensor(a) end
    return pow(a, b)
  end
  local neg = M.neg
  Tensor_mt.__unm = function(a) return neg(a) end
end

return M
