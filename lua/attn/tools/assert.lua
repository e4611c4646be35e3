--- busted/luassert helpers for tensors.
--
-- `require "attn.assert"` registers two assertions with luassert (the
-- `assert` of busted specs):
--
--    require "attn.assert"
--    assert.tensor_near(got, expected, 1e-5)   -- |got - expected| <= tol everywhere
--    assert.tensor_equal(got, expected)        -- same shape, same values
--    assert.is_not.tensor_equal(a, b)
--
-- Both take tensors; the second argument may also be a number or a nested
-- Lua table (anything `attn.tensor` accepts). Shapes must be equal (no
-- broadcasting). NaN matches NaN and an infinity matches the same infinity.
-- A failure names both shapes, the worst element's 1-based index, its two
-- values and their difference:
--
--    tensors are not near (tolerance 1e-05): shapes [2, 3] and [2, 3];
--    worst element at [2, 1]: 0.5 vs 0.625 (difference 0.125)
--
-- The module returns a table with `near` and `equal`, the checks themselves:
-- each returns `ok, message`.
-- @module attn.tools.assert
local attn = require "attn"
local luassert = require "luassert"

local M = {}

local function shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

local function flat(t)
  if t:dim() == 0 then return { t:item() } end
  local out = {}
  local function walk(x)
    if type(x) == "table" then
      for i = 1, #x do walk(x[i]) end
    else
      out[#out + 1] = x
    end
  end
  walk(t:totable())
  return out
end

-- the 1-based multi-index of flat (1-based) position k in shape
local function unravel(k, shape)
  local idx, rest = {}, k - 1
  for d = #shape, 1, -1 do
    idx[d] = rest % shape[d] + 1
    rest = rest // shape[d]
  end
  return "[" .. table.concat(idx, ", ") .. "]"
end

local function fmt(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return string.format("%.9g", v)
end

local function as_tensor(x, who, pos)
  if attn.is_tensor(x) then return x end
  if pos == 2 and (type(x) == "number" or type(x) == "table") then
    local ok, t = pcall(attn.tensor, x)
    if ok then return t end
    error(string.format("assert.%s: bad argument #2 (expected an attn.Tensor or a table attn.tensor accepts: %s)",
      who, tostring(t)), 0)
  end
  error(string.format("assert.%s: bad argument #%d (expected an attn.Tensor, got %s)", who, pos, type(x)), 0)
end

-- compare a and b; tol == nil for exact equality. Returns ok, message.
local function compare(who, a, b, tol)
  a, b = as_tensor(a, who, 1), as_tensor(b, who, 2)
  local sa, sb = a:size(), b:size()
  local shapes = "shapes " .. shape_str(sa) .. " and " .. shape_str(sb)
  local what = tol and string.format("near (tolerance %s)", fmt(tol)) or "equal"
  local same = #sa == #sb
  for i = 1, #sa do same = same and sa[i] == sb[i] end
  if not same then
    return false, string.format("tensors are not %s: %s differ", what, shapes)
  end
  local fa, fb = flat(a), flat(b)
  local worst, worst_k, bad = -1, nil, false
  for k = 1, #fa do
    local x, y = fa[k], fb[k]
    local d
    if x == y or (x ~= x and y ~= y) then d = 0
    elseif x ~= x or y ~= y then d = math.huge       -- NaN against a number
    else d = math.abs(x - y); if d ~= d then d = math.huge end end  -- inf - inf
    if (tol and d > tol) or (not tol and d ~= 0) then bad = true end
    if d > worst then worst, worst_k = d, k end
  end
  local detail
  if worst_k then
    local x, y = fa[worst_k], fb[worst_k]
    local diff = x - y
    if x ~= x or y ~= y then diff = 0 / 0 end
    detail = string.format("worst element at %s: %s vs %s (difference %s)",
      unravel(worst_k, sa), fmt(x), fmt(y), fmt(diff))
  else
    detail = "no elements"
  end
  if bad then
    return false, string.format("tensors are not %s: %s; %s", what, shapes, detail)
  end
  return true, string.format("tensors are %s, expected them not to be: %s; %s", what, shapes, detail)
end

--- The check behind `assert.tensor_near`: returns ok and a message
-- describing the worst element.
-- @param a tensor
-- @param b tensor, number or nested table
-- @param[opt=1e-5] tol absolute tolerance
function M.near(a, b, tol)
  if tol ~= nil and (type(tol) ~= "number" or tol ~= tol or tol < 0) then
    error("assert.tensor_near: bad argument #3 'tol' (expected a non-negative number, got " .. tostring(tol) .. ")", 0)
  end
  return compare("tensor_near", a, b, tol or 1e-5)
end

--- The check behind `assert.tensor_equal`: returns ok and a message.
-- @param a tensor
-- @param b tensor, number or nested table
function M.equal(a, b)
  return compare("tensor_equal", a, b, nil)
end

-- nargs: how many arguments the check takes; one more may be a message
-- (as luassert's own assertions take), put in front of ours.
local function register(name, check, nargs)
  local function assertion(state, arguments, level)
    local done, ok, msg = pcall(check, table.unpack(arguments, 1, nargs))
    if not done then error(ok, level + 1) end  -- bad arguments: point at the spec line
    local user = arguments[nargs + 1]
    state.failure_message = user ~= nil and (tostring(user) .. ": " .. msg) or msg
    return ok
  end
  -- the whole message is the failure_message: these say keys stay unset,
  -- so luassert adds nothing after it
  luassert:register("assertion", name, assertion,
    "assertion.attn_" .. name .. ".positive", "assertion.attn_" .. name .. ".negative")
end

register("tensor_near", M.near, 3)
register("tensor_equal", M.equal, 2)

return M
