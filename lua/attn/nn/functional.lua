--- attn.nn.functional: PyTorch's torch.nn.functional for attn, each
-- differentiable: cross_entropy, gelu, layer_norm, linear, embedding,
-- dropout, softmax and scaled_dot_product_attention. Class ids and token ids
-- are 1-based (a tensor of integer values, or a Lua table).
-- (Not a class: attn.nn.functional is a table of functions.)
-- @module attn.nn.functional
local attn = require "attn"
local argcheck = require "attn.argcheck"
local caller = require "attn.caller"
local ops = require "attn.autograd.train_ops"

local functional = {}

-- what came, in messages: numbers by value, strings quoted
local describe = argcheck.describer{strings = true}

local function bad(fname, argn, what, expected, v)
  argcheck.arg_error(fname, argn, what, expected, describe(v))
end

local function check_tensor(fname, v, argn, what)
  return argcheck.check_tensor(fname, v, argn, what, describe)
end

-- ids or class targets: a tensor, or a (nested) Lua table of numbers made into one
local function check_ids(fname, v, argn, what)
  if attn.is_tensor(v) then return v end
  if type(v) == "table" and getmetatable(v) == nil then
    local ok, t = pcall(attn.tensor, v)
    if ok then return t end
    caller.error(("%s: bad argument #%d '%s' (a table of ids must be a list (of lists) of numbers: %s)"):format(fname,
      argn, what, (tostring(t):gsub("^.-attn%.tensor: ", ""))))
  end
  bad(fname, argn, what, "an attn.Tensor or a table of 1-based ids", v)
end

-- an options table whose keys are all in `known` ({name = "type"}), or nil
local function check_options(fname, opts, argn, known)
  return argcheck.check_options(fname, opts, argn, known, describe)
end

--- Cross entropy of logits [N, C] (or [..., C]) against 1-based class ids
-- target [N] (or [...]), with a fused log-softmax, as torch's
-- F.cross_entropy(logits, target - 1, ...): `ignore_index` (default -100:
-- targets equal to it count for nothing; "mean" divides by the others),
-- `reduction` "mean" (default), "sum" or "none" (a loss per target),
-- `label_smoothing` in [0, 1] (default 0).
-- @param input logits [..., C]
-- @param target class ids [...], a tensor or a table
-- @param[opt] opts {ignore_index = -100, reduction = "mean", label_smoothing = 0}
-- @return the loss
function functional.cross_entropy(input, target, opts)
  local fname = "attn.nn.functional.cross_entropy"
  check_tensor(fname, input, 1, "input")
  target = check_ids(fname, target, 2, "target")
  opts = check_options(fname, opts, 3, {ignore_index = "number", reduction = "string", label_smoothing = "number"})
  return ops.cross_entropy(input, target, opts.ignore_index or -100, opts.reduction or "mean",
    opts.label_smoothing or 0, fname)
end

--- GELU, elementwise: approximate "none" (default: x * Phi(x), with erf) or
-- "tanh" (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the book's GELU).
-- @param input tensor
-- @param[opt] opts {approximate = "none"}
function functional.gelu(input, opts)
  local fname = "attn.nn.functional.gelu"
  check_tensor(fname, input, 1, "input")
  opts = check_options(fname, opts, 2, {approximate = "string"})
  return ops.gelu(input, opts.approximate or "none", fname)
end

-- normalized_shape as a list of positive integers (a number is one dim)
local function normalized_dims(fname, shape, argn)
  if type(shape) == "number" then shape = {shape} end
  if type(shape) ~= "table" or attn.is_tensor(shape) or #shape == 0 then
    bad(fname, argn, "normalized_shape", "a positive integer or a list of them", shape)
  end
  local dims = {}
  for i, d in ipairs(shape) do
    local n = type(d) == "number" and math.tointeger(d) or nil
    if not n or n < 1 then bad(fname, argn, "normalized_shape", "positive integers", d) end
    dims[i] = n
  end
  return dims
end

--- Layer normalisation over the trailing dims `normalized_shape` (a number
-- for the last dim, or a list), biased variance, as torch's F.layer_norm:
-- (x - mean) / sqrt(var + eps) * weight + bias; weight and bias (optional)
-- have shape normalized_shape.
-- @param input tensor [..., *normalized_shape]
-- @param normalized_shape a number or a list of numbers
-- @param[opt] weight tensor
-- @param[opt] bias tensor
-- @param[opt=1e-5] eps
function functional.layer_norm(input, normalized_shape, weight, bias, eps)
  local fname = "attn.nn.functional.layer_norm"
  check_tensor(fname, input, 1, "input")
  local dims = normalized_dims(fname, normalized_shape, 2)
  if weight ~= nil then check_tensor(fname, weight, 3, "weight") end
  if bias ~= nil then check_tensor(fname, bias, 4, "bias") end
  if eps == nil then eps = 1e-5 end
  if type(eps) ~= "number" or not (eps >= 0) then bad(fname, 5, "eps", "a number >= 0", eps) end
  local size, nd, k = input:size(), #dims, 1
  local fits = #size >= nd
  for i = 1, nd do
    fits = fits and size[#size - nd + i] == dims[i]
    k = k * dims[i]
  end
  if not fits then
    caller.error(("%s: input of shape [%s] does not end in normalized_shape [%s]"):format(fname, table.concat(size, ", "),
      table.concat(dims, ", ")))
  end
  for i, t in ipairs({weight or false, bias or false}) do
    if t then
      local s, same = t:size(), #t:size() == nd
      for j = 1, nd do same = same and s[j] == dims[j] end
      if not same then
        caller.error(("%s: '%s' of shape [%s] does not match normalized_shape [%s]"):format(fname,
          i == 1 and "weight" or "bias", table.concat(s, ", "), table.concat(dims, ", ")))
      end
    end
  end
  -- several normalized dims: one row of k values each
  local x = nd == 1 and input or input:reshape(-1, k)
  local w = weight and (nd == 1 and weight or weight:reshape(k))
  local b = bias and (nd == 1 and bias or bias:reshape(k))
  local y
  if w or b then
    y = ops.layer_norm(x, w or attn.ones(k), b or attn.zeros(k), eps, fname)
  else
    y = ops.layer_norm_plain(x, eps, fname)
  end
  if nd ~= 1 then y = y:reshape(size) end
  return y
end

--- y = input weight^T + bias: input [..., in], weight [out, in], bias [out] (optional).
function functional.linear(input, weight, bias)
  local fname = "attn.nn.functional.linear"
  check_tensor(fname, input, 1, "input")
  check_tensor(fname, weight, 2, "weight")
  if bias ~= nil then check_tensor(fname, bias, 3, "bias") end
  if weight:dim() ~= 2 or input:dim() == 0 or input:size(-1) ~= weight:size(2) then
    caller.error(("%s: input of shape [%s] does not fit weight [%s] (expected [..., %s])"):format(fname,
      table.concat(input:size(), ", "), table.concat(weight:size(), ", "),
      weight:dim() == 2 and tostring(weight:size(2)) or "in"))
  end
  if bias ~= nil and (bias:dim() ~= 1 or bias:size(1) ~= weight:size(1)) then
    caller.error(("%s: 'bias' of shape [%s] does not fit weight [%s] (expected [%d])"):format(fname,
      table.concat(bias:size(), ", "), table.concat(weight:size(), ", "), weight:size(1)))
  end
  local y = attn.matmul(input, weight:t())
  if bias ~= nil then y = y + bias end
  return y
end

--- Rows of weight [V, D] at 1-based ids input [...] (a tensor or a table) -> [..., D].
-- @param input ids
-- @param weight tensor [V, D]
function functional.embedding(input, weight)
  local fname = "attn.nn.functional.embedding"
  input = check_ids(fname, input, 1, "input")
  check_tensor(fname, weight, 2, "weight")
  return ops.embedding(input, weight, fname)
end

--- Dropout: zeroes each element with probability p (default 0.5) and scales
-- the rest by 1 / (1 - p) when training (default true); else the input itself.
function functional.dropout(input, p, training)
  local fname = "attn.nn.functional.dropout"
  check_tensor(fname, input, 1, "input")
  if p == nil then p = 0.5 end
  if training == nil then training = true end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then bad(fname, 2, "p", "a probability in [0, 1]", p) end
  if type(training) ~= "boolean" then bad(fname, 3, "training", "a boolean", training) end
  return attn.dropout(input, p, training)
end

--- softmax of input along dim (1-based; negative counts from the end).
function functional.softmax(input, dim)
  check_tensor("attn.nn.functional.softmax", input, 1, "input")
  return attn.softmax(input, dim)
end

--- attn.scaled_dot_product_attention(q, k, v[, opts]) (see its doc).
functional.scaled_dot_product_attention = attn.scaled_dot_product_attention

return functional
