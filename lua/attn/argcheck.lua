--- Argument checks of the Lua layer (what lauxlib is to the C binding): every
-- bad argument is a Lua error naming the function, the argument, what was
-- expected and what came, raised at the user's line (attn.caller).
--
--   local argcheck = require "attn.argcheck"
--   argcheck.check_tensor("attn.fn", x, 1, "x")   -- "attn.fn: bad argument #1 'x' (expected attn.Tensor, got nil)"
--   opts = argcheck.check_options("attn.fn", opts, 2, {reduction = "string"})
--   argcheck.fail("attn.fn", "n must be even, got %d", n)
--
-- Files that the module table's own construction loads (the autograd files,
-- viz) require this one: it takes the tensor metatable from attn.core and
-- never requires "attn".
-- @module attn.argcheck
local core = require "attn.core"
local caller = require "attn.caller"

local Tensor_mt = core.Tensor_mt

local M = {}

--- True when x is an attn tensor.
function M.is_tensor(x) return getmetatable(x) == Tensor_mt end
local is_tensor = M.is_tensor

--- A tensor's shape as "[2, 3]".
function M.shape(t) return "[" .. table.concat(t:size(), ", ") .. "]" end
local shape = M.shape

--- A value as messages show what came: a number by its value, a tensor as
-- "attn.Tensor", anything else by its Lua type. `how` adds detail:
-- `strings` (a string quoted, "%q"), `booleans` (true / false), `shape` (the
-- text between "attn.Tensor" and the tensor's shape, e.g. " of shape ").
-- @param v the value
-- @param[opt] how {strings = bool, booleans = bool, shape = string}
function M.describe(v, how)
  if is_tensor(v) then
    if how and how.shape then return "attn.Tensor" .. how.shape .. shape(v) end
    return "attn.Tensor"
  end
  local t = type(v)
  if t == "number" then return tostring(v) end
  if how then
    if t == "string" and how.strings then return ("%q"):format(v) end
    if t == "boolean" and how.booleans then return tostring(v) end
  end
  return t
end
local describe = M.describe

--- describe with `how` fixed: a function of one value.
function M.describer(how)
  return function(v) return describe(v, how) end
end

--- "attn.Tensor", or the Lua type of anything else (its metatable's __name
-- when it has one; a look-alike named "attn.Tensor" is said not to be one).
function M.typename(x)
  if getmetatable(x) == Tensor_mt then return "attn.Tensor" end
  local m = getmetatable(x)
  if type(m) == "table" and type(rawget(m, "__name")) == "string" then
    if rawget(m, "__name") == "attn.Tensor" then return type(x) .. " (not an attn.Tensor)" end
    return rawget(m, "__name")
  end
  return type(x)
end

--- Raises "fname: " .. fmt:format(...) at the user's line.
function M.fail(fname, fmt, ...)
  caller.error(fname .. ": " .. fmt:format(...))
end

--- Raises "fname: bad argument #argn 'what' (expected <expected>, got <got>)"
-- at the user's line; `got` is the description of what came (see describe).
function M.arg_error(fname, argn, what, expected, got)
  caller.error(("%s: bad argument #%d '%s' (expected %s, got %s)"):format(fname, argn, what, expected, got))
end
local arg_error = M.arg_error

--- Extra arguments are a mistake, never silently ignored (as attnL_check_nargs):
-- n arguments came where fname takes at most max.
function M.check_nargs(fname, max, n)
  if n > max then
    caller.error(("%s: bad argument #%d (no more than %d argument%s expected, got %d)"):format(fname, max + 1, max,
      max == 1 and "" or "s", n))
  end
end

--- v must be a tensor; returns it. What came is worded by `got` (a function
-- of the value; default typename).
function M.check_tensor(fname, v, argn, what, got)
  if not is_tensor(v) then arg_error(fname, argn, what, "attn.Tensor", (got or M.typename)(v)) end
  return v
end

--- An options table (argument #argn) whose keys are all in `known`
-- ({name = "Lua type"}), each value of its type; returns it, or {} for nil.
-- What came is worded by `got` (a function of the value; default describe).
function M.check_options(fname, opts, argn, known, got)
  got = got or describe
  if opts == nil then return {} end
  if type(opts) ~= "table" then arg_error(fname, argn, "opts", "a table of options", got(opts)) end
  for k, v in pairs(opts) do
    local want = known[k]
    if not want then
      local names = {}
      for name in pairs(known) do names[#names + 1] = name end
      table.sort(names)
      caller.error(("%s: unknown option '%s' (known: %s)"):format(fname, tostring(k), table.concat(names, ", ")))
    end
    if type(v) ~= want then
      caller.error(("%s: bad option '%s' (expected %s, got %s)"):format(fname, k, want, got(v)))
    end
  end
  return opts
end

return M
