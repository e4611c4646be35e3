--- Argument checks shared by the attention classes of attn.nn: every bad
-- argument gets an error naming the class, the argument, what was expected
-- and what came. (Not a class: attn.nn.checks is a helper table.) The
-- checks every part of the Lua layer shares are attn.argcheck's; these are
-- the ones only the nn classes make.
-- @module attn.nn.checks
local argcheck = require "attn.argcheck"
local caller = require "attn.caller"

local checks = {}

-- Constructor checks run inside Class:init, which Module's __call runs; their
-- errors go through attn.caller, which finds the user's call however deep.

local describe = argcheck.describe
local is_tensor = argcheck.is_tensor

--- A positive integer argument (floats with an integral value are accepted).
function checks.positive_integer(cls, v, argn, what)
  local i = type(v) == "number" and v == v and math.tointeger(v) or nil
  if not i or i < 1 then
    caller.error(("attn.nn.%s: bad argument #%d '%s' (expected a positive integer, got %s)"):format(
      cls, argn, what, describe(v)))
  end
  return i
end

--- A dropout probability in [0, 1].
function checks.probability(cls, v, argn, what)
  if type(v) ~= "number" or not (v >= 0 and v <= 1) then
    caller.error(("attn.nn.%s: bad argument #%d '%s' (expected a probability in [0, 1], got %s)"):format(
      cls, argn, what, describe(v)))
  end
  return v
end

-- The largest finite float32: the kernels compute in float32, where a larger
-- double (1e39) becomes inf.
local FLT_MAX = 0x1.fffffep+127

--- A number finite in float32 (options such as scale).
function checks.finite(cls, v, what)
  if type(v) ~= "number" or not (math.abs(v) <= FLT_MAX) then
    caller.error(("attn.nn.%s: bad option '%s' (expected a number finite in float32, |%s| <= %.9g, got %s)"):format(
      cls, what, what, FLT_MAX, describe(v)))
  end
  return v
end

--- No argument where the class takes none (torch raises TypeError for extra arguments).
function checks.none(cls, v, argn, takes)
  if v ~= nil then
    caller.error(("attn.nn.%s: unexpected argument #%d (got %s; the constructor takes %s)"):format(
      cls, argn, describe(v), takes))
  end
end

--- An options table whose keys are all in `allowed` ({name = "type"}); returns it (or {}).
function checks.options(cls, opts, argn, allowed)
  return argcheck.check_options("attn.nn." .. cls, opts, argn, allowed)
end

--- Re-raise an error of the functional form `fname` (e.g.
-- "attn.nn.functional.embedding") that a module's forward called, as
-- "Class:forward: ..." at the caller of the module (any position in front of
-- the function's name is dropped).
function checks.forward_error(cls, fname, err)
  err = tostring(err)
  local at = err:find(fname .. ": ", 1, true)
  if at then err = err:sub(at + #fname + 2) end
  caller.error(cls .. ":forward: " .. err)
end

local shape = argcheck.shape
checks.shape = shape

--- x must be a tensor of rank in [min_rank, max_rank] whose last dim is width
-- (named width_name, default "d_in").
function checks.input(cls, x, what, width, min_rank, max_rank, width_name)
  if not is_tensor(x) then
    caller.error(("%s:forward: bad argument '%s' (expected attn.Tensor, got %s)"):format(cls, what, describe(x)))
  end
  local n = x:dim()
  if n < min_rank or n > max_rank then
    local ranks = min_rank == max_rank and tostring(min_rank) or (min_rank .. " to " .. max_rank)
    caller.error(("%s:forward: '%s' must have %s dims, got shape %s"):format(cls, what, ranks, shape(x)))
  end
  if x:size(n) ~= width then
    caller.error(("%s:forward: '%s' of shape %s must end in %s = %d"):format(cls, what, shape(x),
      width_name or "d_in", width))
  end
end

--- The token count of x [..., n, d] must not exceed context_length.
function checks.context(cls, x, context_length)
  local n = x:size(-2)
  if n > context_length then
    caller.error(("%s:forward: the input has %d tokens (shape %s), more than context_length = %d"):format(
      cls, n, shape(x), context_length))
  end
  return n
end

--- A KV cache (nil, or {keys [b, ...], len}) can take x [b, n, d]: the same
-- batch size as when it started, and len + n tokens within context_length.
-- Returns the cached length.
function checks.kv_cache(cls, cache, x, context_length)
  local cached = cache and cache.len or 0
  if cache and cache.keys:size(1) ~= x:size(1) then
    caller.error(("%s:forward: the KV cache holds a batch of %d, got x of shape %s (call reset_cache() first)"):format(
      cls, cache.keys:size(1), shape(x)))
  end
  local n = x:size(2)
  if cached + n > context_length then
    caller.error(("%s:forward: the KV cache holds %d tokens; %d more exceed context_length = %d (call reset_cache())"):format(
      cls, cached, n, context_length))
  end
  return cached
end

local mask_kind = require("attn.core").modules.mask_kind

--- The module's `mask` buffer for n tokens, as torch's modules read it
-- (`self.mask.bool()[:n, :n]`): nil when its [n, n] corner is the causal
-- triangle triu(ones, 1) (the kernel's is_causal then does the work), else
-- that corner, to pass as the attention's mask. A buffer that is not a 2-D
-- tensor of at least [n, n], or holds values other than 0 and 1, is an error.
function checks.mask_buffer(cls, mask, n)
  if not is_tensor(mask) or mask:dim() ~= 2 or mask:size(1) < n or mask:size(2) < n then
    caller.error(("%s:forward: the 'mask' buffer must be a tensor of at least [%d, %d] for %d tokens, got %s"):format(
      cls, n, n, n, is_tensor(mask) and shape(mask) or describe(mask)))
  end
  local kind, where = mask_kind(mask, n)
  if not kind then
    caller.error(("%s:forward: the 'mask' buffer must hold only 0 and 1 (nonzero = hidden), got %s"):format(cls, where))
  end
  if kind == "causal" then return nil end
  return mask:narrow(1, 1, n):narrow(2, 1, n)
end

return checks
