--- Scriptable scores: `attn.score_mod(fn)` and `attn.mask_mod(fn)` trace a
-- Lua function once into an expression, compiled to a small program that
-- the attention kernels evaluate in C over their score tiles, forward and
-- backward (src/core/score_mod.c; the program object is src/binding/lua_score_mod.c).
--
--   local sm = attn.score_mod(function(s, b, h, q, k) return s + rel[{ h, q - k + L }] end)
--   local mm = attn.mask_mod(function(b, h, q, k) return q:ge(k) end)
--   attn.scaled_dot_product_attention(q, k, v, { score_mod = sm, mask_mod = mm })
--
-- fn gets traced values: the score (score_mod only) and the 1-based
-- positions b, h, q, k (integers). A traced value supports + - * / (Lua
-- numbers are constants), unary -, ^ with a number exponent, the methods
-- abs exp log sqrt tanh sigmoid sin cos floor ceil sign clamp(lo, hi)
-- minimum(x) maximum(x), the comparisons lt le gt ge eq ne (booleans),
-- logical_and logical_or logical_not, attn.where(c, x, y), and indexing a
-- captured tensor by integer-valued traced values, t[e] or t[{e1, e2, ...}]
-- (every dim, 1-based). Integer-valued: positions, integer constants, + - *
-- of them, abs, sign, floor, ceil, minimum, maximum, clamp and where of them.
-- Python-style control flow on a traced value cannot be traced: Lua has no
-- hook for `if`, `and`, `or` on a table (they see a true value), and `==`
-- between a traced value and a number is false without asking it; use
-- attn.where and :eq(). `<`, `<=` and the other constructs Lua lets a value
-- intercept raise an error that says so.
-- @module attn.score_mod
local core = require "attn.core"
local caller = require "attn.caller"

local M = {}

local Traced = {}        -- the metatable of traced values
local methods = {}       -- their methods
local current            -- the function tracing now: "attn.score_mod" or "attn.mask_mod"

local function fail(msg) caller.error((current or "attn.score_mod") .. ": " .. msg) end

local function is_traced(x) return getmetatable(x) == Traced end
M.is_traced = is_traced

-- a node: op, args (nodes), k (a number), t (a captured tensor), kind "float" | "int" | "bool"
local function node(op, kind, args, k, t)
  -- every field present (false when unused): a missing key would reach __index, the user's method lookup
  if k == nil then k = false end
  return setmetatable({ op = op, kind = kind, args = args or {}, k = k, t = t or false }, Traced)
end

local is_tensor = require("attn.argcheck").is_tensor

local function describe(x)
  if is_tensor(x) then return "an attn.Tensor" end
  return "a " .. type(x)
end

-- x as a node: a traced value, or a Lua number as a constant
local function lift(x, what)
  if is_traced(x) then return x end
  if type(x) == "number" then
    local int = x == math.floor(x) and math.abs(x) < 2 ^ 24
    return node("const", int and "int" or "float", nil, x)
  end
  fail(("cannot use %s in a traced expression (%s); only Lua numbers and traced values can be combined")
    :format(describe(x), what))
end

local function numeric(a, b) -- the kind of a + b: int when both are integer-valued
  return (a.kind ~= "float" and b.kind ~= "float") and "int" or "float"
end

local function binary(op, name, kindf)
  return function(x, y)
    local a, b = lift(x, name), lift(y, name)
    return node(op, kindf and kindf(a, b) or numeric(a, b), { a, b })
  end
end

Traced.__add = binary("add", "operator +")
Traced.__sub = binary("sub", "operator -")
Traced.__mul = binary("mul", "operator *")
Traced.__div = binary("div", "operator /", function() return "float" end)
Traced.__unm = function(x) return node("neg", x.kind == "bool" and "int" or x.kind, { x }) end
Traced.__pow = function(x, y)
  if not is_traced(x) or type(y) ~= "number" then
    fail(("operator ^ takes a traced value and a number exponent, got %s ^ %s")
      :format(is_traced(x) and "a traced value" or describe(x), is_traced(y) and "a traced value" or describe(y)))
  end
  return node("pow", "float", { x }, y)
end
local function refuse(construct, way)
  return function() fail(("%s cannot be traced%s"):format(construct, way and ("; " .. way) or "")) end
end
local CMP = "use the methods :lt(x), :le(x), :gt(x), :ge(x), :eq(x), :ne(x) and attn.where(c, x, y)"
Traced.__lt = refuse("a comparison with < or > (Lua makes it a plain boolean, and `if` on it cannot be traced)", CMP)
Traced.__le = refuse("a comparison with <= or >= (Lua makes it a plain boolean, and `if` on it cannot be traced)", CMP)
Traced.__eq = refuse("a comparison with == or ~= (Lua makes it a plain boolean)", CMP)
Traced.__concat = refuse("the operator .. (a traced value is not a string)")
Traced.__len = refuse("the operator # (a traced value has no length)")
Traced.__call = refuse("calling a traced value")
Traced.__idiv = refuse("the operator //", "use (x / y):floor()")
Traced.__mod = refuse("the operator %", "write it with :floor(), e.g. x - (x / m):floor() * m")
for _, mm in ipairs { "__band", "__bor", "__bxor", "__shl", "__shr", "__bnot" } do
  Traced[mm] = refuse("a bitwise operator")
end
Traced.__newindex = refuse("assigning into a traced value")
Traced.__name = "attn.Traced"
Traced.__index = function(_, key)
  local m = methods[key]
  if m then return m end
  fail(("a traced value has no field or method %s (expected one of abs exp log sqrt tanh sigmoid sin cos floor "
    .. "ceil sign clamp minimum maximum lt le gt ge eq ne logical_and logical_or logical_not)")
    :format(type(key) == "string" and ("'" .. key .. "'") or ("key of type " .. type(key))))
end

local function method_self(x, name)
  if not is_traced(x) then fail(("method %s called on %s (call it as x:%s(...))"):format(name, describe(x), name)) end
  return x
end

for _, name in ipairs { "exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos" } do
  methods[name] = function(x) return node(name, "float", { method_self(x, name) }) end
end
for _, name in ipairs { "floor", "ceil", "sign" } do
  methods[name] = function(x) return node(name, "int", { method_self(x, name) }) end
end
methods.abs = function(x)
  x = method_self(x, "abs")
  return node("abs", x.kind == "bool" and "int" or x.kind, { x })
end
for _, name in ipairs { "minimum", "maximum" } do
  methods[name] = function(x, y)
    local a, b = lift(method_self(x, name), name), lift(y, name)
    return node(name, numeric(a, b), { a, b })
  end
end
methods.clamp = function(x, lo, hi)
  x = method_self(x, "clamp")
  if lo == nil and hi == nil then fail("clamp needs lo or hi (a number or a traced value)") end
  local a = lift(lo == nil and -math.huge or lo, "clamp's lo")
  local b = lift(hi == nil and math.huge or hi, "clamp's hi")
  local kind = (x.kind ~= "float" and (lo == nil or a.kind ~= "float") and (hi == nil or b.kind ~= "float")) and "int"
    or "float"
  return node("clamp", kind, { x, a, b })
end
for _, name in ipairs { "lt", "le", "gt", "ge", "eq", "ne" } do
  methods[name] = function(x, y) return node(name, "bool", { lift(method_self(x, name), name), lift(y, name) }) end
end
for _, name in ipairs { "logical_and", "logical_or" } do
  methods[name] = function(x, y) return node(name, "bool", { lift(method_self(x, name), name), lift(y, name) }) end
end
methods.logical_not = function(x) return node("logical_not", "bool", { method_self(x, "logical_not") }) end

--- attn.where(c, x, y) when one of them is traced.
function M.where(c, x, y)
  local a, b, d = lift(c, "attn.where's condition"), lift(x, "attn.where"), lift(y, "attn.where")
  return node("where", numeric(b, d), { a, b, d })
end

-- t[key] for a traced key: key a traced value or a table of them (and integers)
function M.index(t, key)
  local keys
  if is_traced(key) then
    keys = { key }
  elseif type(key) == "table" and getmetatable(key) == nil then
    local any = false
    for _, e in ipairs(key) do if is_traced(e) then any = true end end
    if not any then return nil end
    keys = key
  else
    return nil
  end
  if not current then caller.error("attn.Tensor index: a traced value can index a tensor only inside "
    .. "attn.score_mod / attn.mask_mod") end
  local nd = t:dim()
  if #keys ~= nd then
    fail(("indexing a captured tensor of %d dims with %d indices: a traced index must select every dim, "
      .. "t[{i1, ..., i%d}]"):format(nd, #keys, nd))
  end
  local args = {}
  for d, e in ipairs(keys) do
    local a = lift(e, "an index")
    if a.kind == "float" then
      fail(("index %d of a captured tensor is not integer-valued (it is built with /, exp, log, ... or a tensor's "
        .. "values): make it one with :floor() or :ceil()"):format(d))
    end
    args[d] = a
  end
  return node("gather", t.dtype == "bool" and "bool" or "float", args, nil, t)
end

-- ------------------------------------------------------------ printing

local BINOPS = { add = " + ", sub = " - ", mul = " * ", div = " / " }

local function num_str(x)
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return ("%d"):format(x) end
  return ("%.9g"):format(x)
end

local function text_of(n, names)
  local op = n.op
  if op == "const" then return num_str(n.k) end
  if op == "score" or op == "b" or op == "h" or op == "q" or op == "k" then return op end
  local a = n.args
  if BINOPS[op] then return "(" .. text_of(a[1], names) .. BINOPS[op] .. text_of(a[2], names) .. ")" end
  if op == "neg" then return "-" .. text_of(a[1], names) end
  if op == "pow" then return "(" .. text_of(a[1], names) .. " ^ " .. num_str(n.k) .. ")" end
  if op == "gather" then
    local parts = {}
    for i, e in ipairs(a) do parts[i] = text_of(e, names) end
    return names[n.t] .. "[" .. table.concat(parts, ", ") .. "]"
  end
  if op == "where" then
    return "where(" .. text_of(a[1], names) .. ", " .. text_of(a[2], names) .. ", " .. text_of(a[3], names) .. ")"
  end
  local parts = {}
  for i = 2, #a do parts[#parts + 1] = text_of(a[i], names) end
  return text_of(a[1], names) .. ":" .. op .. "(" .. table.concat(parts, ", ") .. ")"
end

-- ------------------------------------------------------------ compiling

-- The DAG under root as a list of instructions (operands first; equal
-- subexpressions once) and the captured tensors in order of first use.
local function compile(root)
  local code, ids, by_key, tables, tindex = {}, {}, {}, {}, {}
  local function emit(n)
    if ids[n] then return ids[n] end
    local ins = { op = n.op, k = n.k or nil }
    local key = { n.op, n.k and ("%.17g"):format(n.k) or "" }
    if n.op == "gather" then
      if not tindex[n.t] then
        tables[#tables + 1] = n.t
        tindex[n.t] = #tables - 1
      end
      ins.tbl = tindex[n.t]
      ins.ix = {}
      for d, e in ipairs(n.args) do ins.ix[d] = emit(e) end
      key[#key + 1] = "t" .. ins.tbl
      for _, i in ipairs(ins.ix) do key[#key + 1] = i end
    else
      local slots = { "a", "b", "c" }
      for i, e in ipairs(n.args) do
        ins[slots[i]] = emit(e)
        key[#key + 1] = ins[slots[i]]
      end
    end
    local ks = table.concat(key, ",")
    if by_key[ks] then
      ids[n] = by_key[ks]
      return ids[n]
    end
    code[#code + 1] = ins
    local id = #code - 1
    by_key[ks], ids[n] = id, id
    return id
  end
  emit(root)
  return code, tables
end

local function trace(fname, fn, kind)
  if type(fn) ~= "function" then
    caller.error(("%s: bad argument #1 'fn' (expected a function, got %s)"):format(fname, describe(fn)))
  end
  local leaves = { node("b", "int"), node("h", "int"), node("q", "int"), node("k", "int") }
  if kind == "score" then table.insert(leaves, 1, node("score", "float")) end
  local prev = current
  current = fname
  local ok, res = pcall(fn, table.unpack(leaves))
  current = prev
  if not ok then
    local msg = tostring(res)
    if msg:find(fname .. ": ", 1, true) then error(res, 0) end -- the tracer's own error, already placed
    caller.error(("%s: fn raised an error while being traced: %s"):format(fname, msg))
  end
  local want = kind == "score" and "the modified score (a traced number)" or "a traced boolean (true = may attend)"
  if not is_traced(res) then
    local got = res == nil and "nil" or type(res) == "number" and ("the number " .. num_str(res)) or describe(res)
    caller.error(("%s: fn must return %s, got %s"):format(fname, want, got))
  end
  if kind == "score" and res.kind == "bool" then
    caller.error(("%s: fn returned a traced boolean; a score_mod returns the modified score (for a visibility, "
      .. "use attn.mask_mod)"):format(fname))
  end
  if kind == "mask" and res.kind ~= "bool" then
    caller.error(("%s: fn returned a traced number; a mask_mod returns a traced boolean (a comparison such as "
      .. "q:ge(k)); to change the scores, use attn.score_mod"):format(fname))
  end
  local code, tables = compile(res)
  local names = {}
  for i, t in ipairs(tables) do names[t] = "t" .. i end
  local ok2, prog = pcall(core._score_program, kind, code, tables, text_of(res, names))
  if not ok2 then caller.error(tostring(prog):gsub("^.-attn%.core%._score_program: ", fname .. ": ")) end
  return prog
end

--- Trace fn(score, b, h, q, k) into a score modification (see the module's doc).
function M.score_mod(...)
  if select("#", ...) ~= 1 then
    caller.error(("attn.score_mod: expected 1 argument (fn), got %d"):format(select("#", ...)))
  end
  return trace("attn.score_mod", ..., "score")
end

--- Trace fn(b, h, q, k) into a mask (true = the query may attend the key).
function M.mask_mod(...)
  if select("#", ...) ~= 1 then
    caller.error(("attn.mask_mod: expected 1 argument (fn), got %d"):format(select("#", ...)))
  end
  return trace("attn.mask_mod", ..., "mask")
end

--- Check option `name` of `fname` (e.g. a module's constructor): nil, or the
-- result of attn.score_mod (kind "score") / attn.mask_mod (kind "mask"); returns it.
function M.check_option(fname, name, value, kind)
  if value == nil then return nil end
  local want = kind == "score" and "attn.score_mod" or "attn.mask_mod"
  local got = getmetatable(value) == "attn.ScoreMod" and core._score_program_info(value)
  if got ~= kind then
    caller.error(("%s: bad option '%s' (expected the result of %s(fn), got %s)"):format(fname, name, want,
      got and (got == "score" and "an attn.score_mod" or "an attn.mask_mod") or describe(value)))
  end
  return value
end

--- The captured tensors of a program (score_mod or mask_mod), in the order the program numbers them.
function M.tables(prog)
  local _, tables = core._score_program_info(prog)
  return tables
end

--- Install attn.score_mod, attn.mask_mod, the traced attn.where and t[traced] (x:minimum(y) and
-- x:maximum(y) on a traced x are its methods).
function M.install(attn, autograd)
  attn.score_mod, attn.mask_mod = M.score_mod, M.mask_mod
  local where = attn.where
  attn.where = function(...)
    local c, x, y = ...
    if is_traced(c) or is_traced(x) or is_traced(y) then return M.where(c, x, y) end
    return where(...)
  end
  autograd.set_traced_index(M.index)
end

return M
