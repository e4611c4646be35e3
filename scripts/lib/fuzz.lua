--- Fuzzing attn with hostile input: random sequences of API calls as a
-- careless user would make them.
--
--     scripts/attn-lua scripts/fuzz.lua --iterations N --seed S [--verbose]
--
-- Every call runs under pcall. It must either succeed or raise a non-empty
-- string message that names the function it came from (its Lua-visible name,
-- e.g. "view" for t:view, "zeros" for attn.zeros, "Linear" for nn.Linear) and
-- is not a raw Lua runtime error ("attempt to index a nil value"). Anything
-- else is a fuzz failure: the seed, the iteration and the Lua source of the
-- call are printed and the exit status is 1. A crash kills the process: rerun
-- with --verbose, which prints each call before it runs.
--
-- The run is deterministic for a seed: its own PRNG (splitmix64), not attn's.
-- Sizes stay small (tensors of at most ~1e5 elements enter the pool), except
-- the huge sizes that must be refused before anything is allocated.
--
-- As a module (`require "fuzz"`), `fuzz.run{iterations =, seed =, verbose =,
-- out =}` returns a summary table {calls, ok, errors, outcomes = "oeo..." (one
-- letter per call), failure = text or nil}.

local attn = require "attn"
local nn = attn.nn

local M = {}

-- ---- PRNG: splitmix64 on Lua's wrapping 64-bit integers -------------------

local new_rng = require("fuzz_rng")

-- ---- Lua source of values, for reproductions ------------------------------

local function num_src(v)
  if v ~= v then return "(0/0)" end
  if v == math.huge then return "math.huge" end
  if v == -math.huge then return "-math.huge" end
  if math.type(v) == "integer" then
    if v == math.mininteger then return "math.mininteger" end
    return tostring(v)
  end
  return string.format("%.17g", v)
end

-- src[value] = expression, for tensors, modules, functions and such
local function value_src(v, srcs, depth)
  depth = depth or 0
  local ty = type(v)
  if ty == "nil" or ty == "boolean" then return tostring(v) end
  if ty == "number" then return num_src(v) end
  if ty == "string" then return string.format("%q", v) end
  if srcs[v] then return srcs[v] end
  if ty == "table" and depth < 4 then
    local parts, n = {}, 0
    for i, x in ipairs(v) do parts[i] = value_src(x, srcs, depth + 1); n = i end
    local keys = {}
    for k in pairs(v) do
      if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
    end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      local ks = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. value_src(k, srcs, depth + 1) .. "]")
      parts[#parts + 1] = ks .. " = " .. value_src(v[k], srcs, depth + 1)
    end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return "<" .. ty .. ">"
end

-- ---- the fuzzer -------------------------------------------------------------

local function pack(...) return { n = select("#", ...), ... } end

local POOL_MAX, MOD_MAX = 24, 6
local POOL_NUMEL = 100000

local function new_state(seed, tmpdir)
  local r = new_rng(seed)
  local S = { r = r, pool = {}, mods = {}, srcs = {}, tmpdir = tmpdir, seed = seed }
  S.srcs[io.stdout] = "io.stdout"
  return S
end

local function remember(S, t, src)
  if #src > 240 then
    local shape = attn.is_tensor(t) and ("[" .. table.concat(t:size(), ", ") .. "] stride ["
      .. table.concat(t:stride(), ", ") .. "]") or ""
    src = "--[[" .. shape .. "]] " .. src:sub(1, 120) .. "...]]"
    src = src:gsub("%]%]%]%]$", "]]")
  end
  S.srcs[t] = src
end

local function add_tensor(S, t, src)
  if not attn.is_tensor(t) or t:numel() > POOL_NUMEL then return end
  remember(S, t, src)
  local pool = S.pool
  if #pool >= POOL_MAX then table.remove(pool, S.r.int(1, #pool)) end
  pool[#pool + 1] = t
end

local HOSTILE_NUMBERS = { 0, -1, -2, 0.5, -0.5, 1.5, 1e300, -1e300, 0 / 0, math.huge, -math.huge, math.maxinteger,
  math.mininteger, 2 ^ 40, 2 ^ 62, 2 ^ 63, 2 ^ 53 + 1, 1e-310, -0.0, 3.4e38, 65 }
local HUGE_SIZES = { 2 ^ 40, math.tointeger(2 ^ 62), math.maxinteger, 2 ^ 63, 1e300, math.tointeger(2 ^ 50) }
local STRINGS = { "", "abc", "flash", "math", "auto", "1", "2", "-1", "nan", "weight", "bias", "\0" }
local SPECIAL_VALUES = { 0 / 0, math.huge, -math.huge, 1e-45, -1e-45, 1e-39, -0.0, 3.4e38, -3.4e38, 1e39, 0, 1 }

local function small_size(r)
  if r.chance(0.1) then return 0 end
  if r.chance(0.03) then return r.int(7, 64) end
  return r.int(1, 5)
end

-- a size list: mostly small; sometimes hostile (negative, fractional, huge, not numbers)
local function gen_sizes(S, allow_infer)
  local r = S.r
  local n = r.chance(0.02) and r.int(7, 10) or r.int(0, 4)
  local sizes = {}
  for i = 1, n do sizes[i] = n > 5 and r.int(0, 2) or small_size(r) end
  if n > 0 and allow_infer and r.chance(0.2) then sizes[r.int(1, n)] = -1 end
  if n > 0 and r.chance(0.08) then
    local k = r.int(1, n)
    local c = r.int(1, 4)
    if c == 1 then sizes[k] = r.pick(HUGE_SIZES)
      if r.chance(0.5) then sizes[r.int(1, n)] = r.pick(HUGE_SIZES) end
    elseif c == 2 then sizes[k] = r.pick(HOSTILE_NUMBERS)
    elseif c == 3 then sizes[k] = r.pick(STRINGS)
    else sizes[k] = r.chance(0.5) and {} or false end
  end
  -- a huge size next to a nonzero small one must never allocate: keep them
  -- either overflowing (two huge) or refused by the allocator (>= 2^40 elements)
  return sizes
end

local function gen_special_tensor(S)
  local r = S.r
  local n = r.int(0, 6)
  local data = {}
  for i = 1, n do data[i] = r.chance(0.6) and r.pick(SPECIAL_VALUES) or (r.float() * 4 - 2) end
  if n == 4 and r.chance(0.5) then data = { { data[1], data[2] }, { data[3], data[4] } } end
  return attn.tensor, pack(data), "attn.tensor"
end

-- a new random tensor for the fuzzer's own use: sizes clamped so it never fails
local function fresh(S, sizes, how)
  local ok = {}
  for i, x in ipairs(sizes) do
    if i > 6 then break end
    ok[i] = (math.type(x) == "integer" and x >= 0 and x <= 64) and x or 2
  end
  how = how or (S.r.chance(0.5) and "rand" or "randn")
  local t = attn[how](ok)
  remember(S, t, "attn." .. how .. "(" .. value_src(ok, S.srcs) .. ")")
  return t
end

local function pool_tensor(S)
  local pool = S.pool
  if #pool == 0 or S.r.chance(0.08) then
    return fresh(S, gen_sizes(S))
  end
  return S.r.pick(pool)
end

local function gen_module_value(S)
  if #S.mods > 0 then return S.r.pick(S.mods) end
  return nil
end

-- any Lua value at all, the careless way
local function anyval(S, depth)
  local r = S.r
  depth = depth or 0
  local c = r.int(1, 16)
  if c <= 4 then return pool_tensor(S) end
  if c == 5 then return r.int(-3, 6) end
  if c == 6 then return r.pick(HOSTILE_NUMBERS) end
  if c == 7 then return r.pick(STRINGS) end
  if c == 8 then return nil end
  if c == 9 then return r.chance(0.5) end
  if c == 10 and depth < 2 then
    local t = {}
    for i = 1, r.int(0, 3) do t[i] = anyval(S, depth + 1) end
    return t
  end
  if c == 11 then return print end
  if c == 12 then
    local co = coroutine.create(function() end)
    S.srcs[co] = "coroutine.create(function() end)"
    return co
  end
  if c == 13 then return io.stdout end
  if c == 14 then return gen_module_value(S) end
  if c == 15 then return { 2, 3 } end
  return pool_tensor(S)
end

-- typed argument generators; each sometimes yields a hostile value instead
local function dim_for(S, t)
  local r = S.r
  local n = attn.is_tensor(t) and t:dim() or 2
  if r.chance(0.85) then
    local d = r.int(-math.max(n, 1), math.max(n, 1))
    if d == 0 then d = 1 end
    return d
  end
  return r.pick({ 0, n + 1, -n - 1, 1.5, 100, math.maxinteger, math.mininteger, 0 / 0, "1", nil })
end

local function gen_number(S)
  if S.r.chance(0.8) then return S.r.float() * 4 - 2 end
  return S.r.pick(HOSTILE_NUMBERS)
end

local function maybe(S, p, good, ...)
  if S.r.chance(p) then return good(S, ...) end
  return anyval(S)
end

-- a tensor shaped to broadcast with t (or not)
local function shaped_like(S, t)
  local r = S.r
  if not attn.is_tensor(t) or r.chance(0.2) then return pool_tensor(S) end
  local sizes = t:size()
  if r.chance(0.4) then
    for i = 1, #sizes do if r.chance(0.4) then sizes[i] = 1 end end
    while #sizes > 0 and r.chance(0.3) do table.remove(sizes, 1) end
  end
  if r.chance(0.1) and #sizes > 0 then sizes[r.int(1, #sizes)] = r.int(0, 7) end
  return fresh(S, sizes, "rand")
end

local function tmp_path(S, ext)
  local r = S.r
  if r.chance(0.08) then return r.pick({ "", "/nonexistent/dir/x" .. ext, S.tmpdir, "/", "/dev/null" }) end
  return S.tmpdir .. "/f" .. r.int(1, 4) .. ext
end

-- ---- the operations -------------------------------------------------------
-- Each returns fn, args (a table with .n), src prefix and the context names
-- one of which every error message must contain.

local OPS = {}
local function op(weight, f) for _ = 1, weight do OPS[#OPS + 1] = f end end


-- a function of attn, with arguments from gen
local function fn_op(name, weight, gen, ctx)
  op(weight, function(S)
    return attn[name], pack(gen(S)), "attn." .. name, ctx or { name }
  end)
end

-- a method of attn.Tensor: self is mostly a pool tensor
local function method_op(name, weight, gen, ctx)
  op(weight, function(S)
    local self = S.r.chance(0.95) and pool_tensor(S) or anyval(S)
    local args = pack(self, gen(S, self))
    if attn.is_tensor(self) and S.r.chance(0.9) then
      return self[name], args, "(" .. value_src(self, S.srcs) .. "):" .. name, ctx or { name }, true
    end
    return attn.Tensor[name], args, "attn.Tensor." .. name, ctx or { name }
  end)
end

local function none() end
local function sizes_gen(S)
  local sizes = gen_sizes(S)
  if S.r.chance(0.5) then return sizes end
  return table.unpack(sizes, 1, #sizes)
end
local function sizes_infer(S, t)
  local r = S.r
  local sizes = gen_sizes(S, true)
  if attn.is_tensor(t) and r.chance(0.4) then
    sizes = { t:numel() }
    if r.chance(0.5) then sizes = { -1 } end
    if r.chance(0.3) and t:numel() % 2 == 0 then sizes = { 2, -1 } end
  end
  if S.r.chance(0.5) then return sizes end
  return table.unpack(sizes, 1, #sizes)
end

for _, name in ipairs { "zeros", "ones", "empty", "rand", "randn" } do fn_op(name, 2, sizes_gen) end
fn_op("full", 2, function(S) return gen_sizes(S), maybe(S, 0.8, gen_number) end)
fn_op("eye", 1, function(S) return S.r.chance(0.8) and S.r.int(0, 6) or anyval(S), S.r.chance(0.5) and S.r.int(0, 6) or anyval(S) end)
fn_op("arange", 2, function(S)
  local r = S.r
  local n = r.int(1, 3)
  local a = { r.int(-5, 20), r.int(-5, 20), r.pick({ 1, 2, -1, 0.5, 3 }) }
  for i = 1, n do if r.chance(0.15) then a[i] = anyval(S) end end
  if r.chance(0.05) then a = { 0, 1e300, 1e-300 } ; n = 3 end
  return table.unpack(a, 1, n)
end)
op(3, function(S)
  local fn, args, src = gen_special_tensor(S)
  if S.r.chance(0.2) then args = pack(anyval(S)) end
  return fn, args, src, { "tensor" }
end)
fn_op("tensor", 1, function(S) return { { 1, 2 }, { 3 } } end)
fn_op("tensor", 1, function(S) return { { { 1 }, { "x" } } } end)
fn_op("zeros_like", 2, function(S) return maybe(S, 0.8, pool_tensor) end)
fn_op("ones_like", 2, function(S) return maybe(S, 0.8, pool_tensor) end)
for _, name in ipairs { "cat", "stack" } do
  fn_op(name, 3, function(S)
    local r = S.r
    local a = pool_tensor(S)
    local list = { a }
    for i = 2, r.int(1, 4) do list[i] = r.chance(0.7) and shaped_like(S, a) or anyval(S) end
    if r.chance(0.5) then
      for i = 2, #list do if attn.is_tensor(list[i]) and list[i]:dim() == a:dim() then list[i] = a:clone() end end
    end
    if r.chance(0.05) then list = {} end
    if r.chance(0.05) then list = a end
    return list, maybe(S, 0.85, dim_for, a)
  end)
end
fn_op("manual_seed", 1, function(S) return S.r.chance(0.8) and S.r.int(-5, 1000) or anyval(S) end)
fn_op("initial_seed", 1, none)
fn_op("get_rng_state", 1, none)
fn_op("set_rng_state", 1, function(S)
  local r = S.r
  local st = attn.get_rng_state()
  local c = r.int(1, 4)
  if c == 1 then return st end
  if c == 2 then return st:sub(1, r.int(0, #st)) end
  if c == 3 then return st .. "x" end
  return anyval(S)
end)
fn_op("rng_raw_u32", 1, function(S) return S.r.chance(0.7) and S.r.int(0, 10) or anyval(S) end)
fn_op("dropout", 2, function(S)
  return maybe(S, 0.9, pool_tensor), S.r.chance(0.8) and S.r.pick({ 0, 0.1, 0.5, 0.9, 1 }) or anyval(S),
    S.r.chance(0.7) and S.r.chance(0.5) or anyval(S)
end)
-- sampling: probabilities mostly valid (rand, some zeros), sometimes hostile
fn_op("multinomial", 2, function(S)
  local r = S.r
  local probs
  if r.chance(0.8) then
    local sizes = r.chance(0.5) and { r.int(0, 6) } or { r.int(0, 3), r.int(0, 6) }
    probs = fresh(S, sizes, "rand")
    if r.chance(0.3) and probs:numel() > 0 then probs = probs:gt(0.5) end
  else
    probs = maybe(S, 0.7, pool_tensor)
  end
  return probs, r.chance(0.8) and r.int(0, 7) or anyval(S), r.chance(0.7) and r.chance(0.5) or anyval(S)
end)
fn_op("randint", 2, function(S)
  local r = S.r
  local sizes = r.chance(0.8) and gen_sizes(S) or anyval(S)
  local low = r.chance(0.8) and r.int(-10, 10) or anyval(S)
  local high = r.chance(0.8) and r.int(-10, 20) or anyval(S)
  if r.chance(0.3) then return high, sizes end
  return low, high, sizes
end)
fn_op("randperm", 1, function(S) return S.r.chance(0.8) and S.r.int(-1, 40) or anyval(S) end)
fn_op("get_dropout_stream", 1, none)
op(1, function(S)
  local r = S.r
  local stream = r.chance(0.8) and r.pick({ "mkl", "default" }) or anyval(S)
  -- the stream is the Lua state's setting: set it, draw a dropout through it, restore
  local function set_drop_restore(name)
    local saved = attn.get_dropout_stream()
    local ok, err = pcall(attn.set_dropout_stream, name)
    local ok2, err2 = pcall(attn.dropout, attn.ones(3, 4), 0.5)
    attn.set_dropout_stream(saved)
    if not ok then error(err, 0) end
    if not ok2 then error(err2, 0) end
  end
  return set_drop_restore, pack(stream), "attn.set_dropout_stream", { "set_dropout_stream" }
end)
fn_op("matmul", 4, function(S)
  local r = S.r
  local a = pool_tensor(S)
  if r.chance(0.6) and attn.is_tensor(a) and a:dim() >= 1 then
    local sizes = { a:size(-1) }
    if r.chance(0.6) then sizes[2] = r.int(0, 5) end
    if r.chance(0.3) then table.insert(sizes, 1, r.int(1, 3)) end
    return a, fresh(S, sizes, "randn")
  end
  return a, maybe(S, 0.8, pool_tensor)
end)
fn_op("dot", 1, function(S) return maybe(S, 0.9, pool_tensor), maybe(S, 0.9, pool_tensor) end)
fn_op("allclose", 2, function(S)
  local a = maybe(S, 0.9, pool_tensor)
  return a, maybe(S, 0.9, shaped_like, a), S.r.chance(0.7) and 1e-5 or anyval(S), S.r.chance(0.7) and 1e-8 or anyval(S)
end)
fn_op("is_tensor", 1, function(S) return anyval(S) end)
for _, name in ipairs { "triu", "tril" } do
  fn_op(name, 2, function(S) return maybe(S, 0.9, pool_tensor), S.r.chance(0.7) and S.r.int(-3, 3) or anyval(S) end)
end
fn_op("simple_attention", 2, function(S) return maybe(S, 0.9, pool_tensor), S.r.chance(0.9) and nil or anyval(S) end)
fn_op("format", 2, function(S)
  local r = S.r
  local opts = nil
  if r.chance(0.5) then
    opts = {}
    for _, k in ipairs { "precision", "threshold", "edgeitems", "linewidth", "sci_mode" } do
      if r.chance(0.3) then opts[k] = r.chance(0.7) and r.int(0, 10) or anyval(S) end
    end
    if r.chance(0.1) then opts.bogus = 1 end
  end
  return maybe(S, 0.9, pool_tensor), opts
end)
fn_op("save", 2, function(S)
  local path = S.r.chance(0.9) and tmp_path(S, ".npy") or anyval(S)
  -- a hostile string is still a file name: keep it inside the temporary directory
  if type(path) == "string" and path:sub(1, 1) ~= "/" then path = S.tmpdir .. "/" .. path end
  return maybe(S, 0.9, pool_tensor), path
end)
fn_op("save_safetensors", 2, function(S)
  local r = S.r
  local path = r.chance(0.9) and tmp_path(S, ".safetensors") or anyval(S)
  if type(path) == "string" and path:sub(1, 1) ~= "/" then path = S.tmpdir .. "/" .. path end
  local tensors = {}
  for i = 1, r.int(0, 3) do
    local key = r.chance(0.9) and ("t" .. i) or anyval(S)
    if key == nil or key ~= key then key = "t" .. i end -- not a valid table key in Lua itself
    tensors[key] = r.chance(0.9) and pool_tensor(S) or anyval(S)
  end
  if r.chance(0.1) then tensors = anyval(S) end
  local meta = nil
  if r.chance(0.3) then meta = { note = r.chance(0.8) and "x" or anyval(S) } end
  return path, tensors, meta
end, { "save_safetensors" })
fn_op("load_safetensors", 2, function(S)
  local r = S.r
  local p = tmp_path(S, ".safetensors")
  if r.chance(0.4) then -- a corrupted copy of a file written here
    local good = io.open(p, "rb")
    local bytes = good and good:read("a") or ""
    if good then good:close() end
    local cut = #bytes > 0 and r.int(0, #bytes) or 0
    local bad = bytes:sub(1, cut)
    if r.chance(0.5) and #bad > 12 then
      local i = r.int(9, #bad)
      bad = bad:sub(1, i - 1) .. string.char(r.int(0, 255)) .. bad:sub(i + 1)
    end
    local f = io.open(S.tmpdir .. "/bad.safetensors", "wb")
    if f then f:write(bad); f:close() end
    return S.tmpdir .. "/bad.safetensors"
  end
  return r.chance(0.9) and p or anyval(S)
end, { "load_safetensors" })
op(1, function(S)
  local r = S.r
  local opts = {}
  for _, k in ipairs { "precision", "threshold", "edgeitems", "linewidth", "sci_mode", "profile" } do
    if r.chance(0.3) then
      opts[k] = k == "profile" and (r.chance(0.8) and r.pick({ "default", "short", "full" }) or anyval(S))
        or k == "sci_mode" and (r.chance(0.8) and r.chance(0.5) or anyval(S))
        or (r.chance(0.7) and r.int(0, 10) or anyval(S))
    end
  end
  if r.chance(0.1) then opts = anyval(S) end
  -- the options are process-wide: set, print something, restore
  local function set_print_restore(o)
    local saved = attn.get_printoptions()
    local ok, err = pcall(attn.set_printoptions, o)
    local ok2, err2 = pcall(tostring, attn.ones(2, 3))
    attn.set_printoptions(saved)
    if not ok then error(err, 0) end
    if not ok2 then error(err2, 0) end
  end
  return set_print_restore, pack(opts), "attn.set_printoptions", { "set_printoptions" }
end)
fn_op("load", 2, function(S)
  local r = S.r
  local p = tmp_path(S, ".npy")
  if r.chance(0.2) then -- a corrupted file
    local f = io.open(S.tmpdir .. "/bad.npy", "wb")
    local good = io.open(p, "rb")
    local bytes = good and good:read("a") or "\147NUMPY\1\0"
    if good then good:close() end
    local k = r.int(1, math.max(1, #bytes))
    bytes = bytes:sub(1, k - 1) .. string.char(r.int(0, 255)) .. bytes:sub(k + 1, r.chance(0.5) and -1 or r.int(0, #bytes))
    f:write(bytes)
    f:close()
    p = S.tmpdir .. "/bad.npy"
  end
  return r.chance(0.9) and p or anyval(S)
end)

-- The elementwise and reduction ops come from the one op table (src/core/op_table.h,
-- as attn.ops_table()), in its order, so a new op is fuzzed with no change here.
local TABLE_OPS = attn.ops_table()
local function table_names(kinds, field)
  local names = {}
  for _, e in ipairs(TABLE_OPS) do
    if kinds[e.kind] and not e.indices_of and (field == nil or e[field]) then names[#names + 1] = e[field or "name"] end
  end
  return names
end
local BINARY = table_names { binary = true, comparison = true }
local UNARY = table_names { unary = true }
local INPLACE = table_names({ binary = true, comparison = true, unary = true }, "inplace")
-- sum, mean, max, min, then argmax, argmin
local REDUCTIONS = table_names { reduction = true }
for _, name in ipairs(table_names({ reduction = true }, "index_name")) do REDUCTIONS[#REDUCTIONS + 1] = name end
local LUA_OPERATORS = { __add = "+", __sub = "-", __mul = "*", __div = "/", __pow = "^", __unm = "-", __mod = "%", __idiv = "//" }
local BINARY_OPERATORS, OPERATOR_OF = {}, {} -- "add", ...; add = "+", ...
for _, e in ipairs(TABLE_OPS) do
  if e.operator and e.arity == 2 then
    BINARY_OPERATORS[#BINARY_OPERATORS + 1] = e.name
    OPERATOR_OF[e.name] = assert(LUA_OPERATORS[e.operator], e.operator)
  end
end
local function list_with(list, more)
  local all = table.move(list, 1, #list, 1, {})
  return table.move(more, 1, #more, #all + 1, all)
end

-- binary maths, as functions, methods and operators
for _, name in ipairs(BINARY) do
  method_op(name, 1, function(S, self) return S.r.chance(0.3) and gen_number(S) or maybe(S, 0.85, shaped_like, self) end)
end
local operator_fns = {}
for name, o in pairs(OPERATOR_OF) do operator_fns[name] = assert(load("return function(x, y) return x " .. o .. " y end"))() end
op(5, function(S)
  local r = S.r
  local name = r.pick(BINARY_OPERATORS)
  local a = pool_tensor(S)
  local b = r.chance(0.3) and gen_number(S) or maybe(S, 0.85, shaped_like, a)
  if r.chance(0.3) then a, b = b, a end
  return operator_fns[name], pack(a, b), "(function(x, y) return x " .. OPERATOR_OF[name] .. " y end)", { name }
end)
op(1, function(S) return function(x) return -x end, pack(pool_tensor(S)), "(function(x) return -x end)", { "neg" } end)
for _, name in ipairs(INPLACE) do
  method_op(name, 1, function(S, self) return S.r.chance(0.3) and gen_number(S) or maybe(S, 0.85, shaped_like, self) end)
end
for _, name in ipairs(list_with(UNARY, { "contiguous", "clone", "float", "dim", "numel", "is_contiguous", "zero_" })) do
  method_op(name, 1, none)
end
method_op("size", 1, function(S, self) if S.r.chance(0.5) then return dim_for(S, self) end end)
method_op("stride", 1, function(S, self) if S.r.chance(0.5) then return dim_for(S, self) end end)
method_op("item", 1, none)
method_op("totable", 1, none)
method_op("fill_", 1, function(S) return maybe(S, 0.8, gen_number) end)
method_op("copy_", 1, function(S, self) return maybe(S, 0.85, shaped_like, self) end)
method_op("uniform_", 1, function(S) return maybe(S, 0.8, gen_number), maybe(S, 0.8, gen_number) end)
method_op("normal_", 1, function(S) return maybe(S, 0.8, gen_number), maybe(S, 0.8, gen_number) end)
method_op("select", 2, function(S, self) return dim_for(S, self), S.r.chance(0.8) and S.r.int(-3, 3) or anyval(S) end)
method_op("narrow", 2, function(S, self)
  return dim_for(S, self), S.r.chance(0.8) and S.r.int(-3, 4) or anyval(S), S.r.chance(0.8) and S.r.int(-1, 3) or anyval(S)
end)
method_op("view", 3, sizes_infer)
method_op("reshape", 3, sizes_infer)
method_op("expand", 3, function(S, self)
  local r = S.r
  if not attn.is_tensor(self) then return sizes_gen(S) end
  local sizes = self:size()
  for i = 1, #sizes do
    if sizes[i] == 1 and r.chance(0.5) then sizes[i] = r.chance(0.9) and r.int(0, 6) or r.pick(HUGE_SIZES) end
    if r.chance(0.2) then sizes[i] = -1 end
  end
  while r.chance(0.3) and #sizes < 9 do table.insert(sizes, 1, r.chance(0.9) and r.int(0, 4) or r.pick(HUGE_SIZES)) end
  if r.chance(0.15) then sizes = gen_sizes(S, true) end
  if r.chance(0.5) then return sizes end
  return table.unpack(sizes, 1, #sizes)
end)
method_op("expand_as", 1, function(S, self) return maybe(S, 0.8, shaped_like, self) end)
method_op("view_as", 1, function(S) return maybe(S, 0.8, pool_tensor) end)
method_op("transpose", 2, function(S, self) return dim_for(S, self), dim_for(S, self) end)
method_op("t", 1, none)
method_op("permute", 2, function(S, self)
  local r = S.r
  local n = attn.is_tensor(self) and self:dim() or 2
  local dims = {}
  for i = 1, n do dims[i] = i end
  for i = n, 2, -1 do local j = r.int(1, i); dims[i], dims[j] = dims[j], dims[i] end
  if r.chance(0.2) and n > 0 then dims[r.int(1, n)] = dim_for(S, self) end
  if r.chance(0.1) then dims[#dims + 1] = 1 end
  if r.chance(0.5) then return dims end
  return table.unpack(dims, 1, #dims)
end)
method_op("unsqueeze", 2, function(S, self)
  local n = attn.is_tensor(self) and self:dim() + 1 or 1
  if S.r.chance(0.85) then return S.r.int(-n, n) end
  return anyval(S)
end)
method_op("squeeze", 2, function(S, self) if S.r.chance(0.5) then return dim_for(S, self) end end)
for _, name in ipairs(REDUCTIONS) do
  method_op(name, 2, function(S, self)
    if S.r.chance(0.3) then return end
    return dim_for(S, self), S.r.chance(0.7) and S.r.chance(0.5) or anyval(S)
  end)
end
for _, name in ipairs { "softmax", "log_softmax" } do
  method_op(name, 2, function(S, self) return S.r.chance(0.9) and dim_for(S, self) or nil end)
end
method_op("masked_fill", 3, function(S, self)
  return maybe(S, 0.85, shaped_like, self), S.r.chance(0.8) and S.r.pick({ -math.huge, 0, -1e9, 0 / 0 }) or anyval(S)
end)
method_op("masked_fill_", 2, function(S, self)
  return maybe(S, 0.85, shaped_like, self), S.r.chance(0.8) and S.r.pick({ -math.huge, 0, -1e9, 0 / 0 }) or anyval(S)
end)
method_op("triu_", 1, function(S) return S.r.chance(0.7) and S.r.int(-3, 3) or anyval(S) end)
method_op("tril_", 1, function(S) return S.r.chance(0.7) and S.r.int(-3, 3) or anyval(S) end)
method_op("equal", 1, function(S, self) return maybe(S, 0.85, shaped_like, self) end)
method_op("matmul", 1, function(S) return maybe(S, 0.9, pool_tensor) end)
method_op("dot", 1, function(S) return maybe(S, 0.9, pool_tensor) end)

-- clamp, var/std, where, cumsum, indexing, sorting (src/binding/lua_ops.c):
-- bounds, dims, indices in and out of range, as tables and as tensors
local function size_at(t, d)
  if not attn.is_tensor(t) or math.type(d) ~= "integer" or d == 0 or d < -t:dim() or d > t:dim() then return 3 end
  return t:size(d)
end
local function one_index(S, n)
  if S.r.chance(0.95) then return S.r.int(1, math.max(n, 1)) end
  return S.r.pick({ 0, -1, n + 1, 1.5, 0 / 0, math.huge, "x" })
end
-- a (nested) list of indices of shape `shape`, or a tensor of it
local function index_for(S, n, shape)
  local function build(k)
    local list = {}
    for i = 1, math.min(shape[k] or 0, 6) do list[i] = k == #shape and one_index(S, n) or build(k + 1) end
    return list
  end
  if #shape == 0 or S.r.chance(0.05) then return anyval(S) end
  local list = build(1)
  if S.r.chance(0.5) then
    local ok, t = pcall(attn.tensor, list)
    if ok then return t end
  end
  return list
end
local function self_shape(S, self)
  if not attn.is_tensor(self) then return { 2, 2 } end
  local sizes = self:size()
  for i = 1, #sizes do if S.r.chance(0.3) then sizes[i] = S.r.int(0, sizes[i] + 1) end end
  return sizes
end
local function bound(S, self)
  local r = S.r
  if r.chance(0.3) then return nil end
  if r.chance(0.6) then return gen_number(S) end
  return maybe(S, 0.85, shaped_like, self)
end
method_op("clamp", 2, function(S, self) return bound(S, self), bound(S, self) end)
method_op("clamp_", 1, function(S, self) return bound(S, self), bound(S, self) end)
for _, name in ipairs { "var", "std" } do
  method_op(name, 2, function(S, self)
    local r = S.r
    local opts = r.chance(0.5) and { unbiased = r.chance(0.5) } or (r.chance(0.1) and anyval(S) or nil)
    if r.chance(0.3) then return opts end
    return dim_for(S, self), r.chance(0.7) and r.chance(0.5) or anyval(S), opts
  end)
end
fn_op("where", 2, function(S)
  local c = pool_tensor(S)
  local function side() return S.r.chance(0.4) and gen_number(S) or maybe(S, 0.85, shaped_like, c) end
  return maybe(S, 0.9, shaped_like, c), side(), side()
end)
method_op("where", 1, function(S, self) return maybe(S, 0.9, shaped_like, self), maybe(S, 0.9, shaped_like, self) end)
method_op("cumsum", 2, function(S, self) return dim_for(S, self) end)
method_op("index_select", 2, function(S, self)
  local d = dim_for(S, self)
  return d, index_for(S, size_at(self, d), { S.r.int(0, 5) })
end)
method_op("gather", 2, function(S, self)
  local d = dim_for(S, self)
  return d, index_for(S, size_at(self, d), self_shape(S, self))
end)
method_op("scatter_add_", 1, function(S, self)
  local d = dim_for(S, self)
  local shape = self_shape(S, self)
  return d, index_for(S, size_at(self, d), shape), S.r.chance(0.9) and fresh(S, shape) or anyval(S)
end)
method_op("chunk", 2, function(S, self)
  return S.r.chance(0.85) and S.r.int(1, 5) or anyval(S), maybe(S, 0.9, dim_for, self)
end)
method_op("split", 2, function(S, self)
  local r = S.r
  local d = dim_for(S, self)
  local arg = r.int(0, 4)
  if r.chance(0.4) then -- sizes: mostly summing to the dim's size
    local n, left = size_at(self, d), size_at(self, d)
    arg = {}
    while left > 0 and #arg < 6 do arg[#arg + 1] = r.int(0, left); left = left - arg[#arg] end
    if r.chance(0.2) then arg[#arg + 1] = r.pick({ 1, -1, 0.5, "x" }) end
    if n == 0 and r.chance(0.5) then arg = {} end
  elseif r.chance(0.1) then
    arg = anyval(S)
  end
  return arg, d
end)
method_op("repeat_interleave", 2, function(S, self)
  local r = S.r
  if r.chance(0.4) then return r.chance(0.9) and r.int(0, 3) or r.pick({ -1, 1.5, 0 / 0 }) end
  local d = dim_for(S, self)
  local reps = {}
  for i = 1, size_at(self, d) % 7 do reps[i] = r.chance(0.95) and r.int(0, 3) or r.pick({ -1, 0.5 }) end
  if r.chance(0.2) then reps = { r.int(0, 3) } end
  if r.chance(0.4) then reps = attn.tensor(reps) end
  return reps, d
end)
method_op("topk", 2, function(S, self)
  local r = S.r
  local d = dim_for(S, self)
  local k = r.chance(0.9) and r.int(0, size_at(self, d) + 1) or anyval(S)
  return k, d, r.chance(0.9) and r.chance(0.5) or anyval(S), r.chance(0.9) and r.chance(0.5) or anyval(S)
end)
for _, name in ipairs { "sort", "argsort" } do
  method_op(name, 2, function(S, self) return dim_for(S, self), S.r.chance(0.9) and S.r.chance(0.5) or anyval(S) end)
end

-- huge expanded views (no memory behind them): what must refuse rather than
-- allocate or build billions of Lua values
local HUGE_VIEW_METHODS = { "totable", "clone", "contiguous", "exp", "view", "reshape", "size", "select", "narrow",
  "softmax", "matmul", "mul", "masked_fill", "unsqueeze", "t", "transpose", "item", "numel", "fill_", "add_" }
op(2, function(S)
  local r = S.r
  local base = fresh(S, { 1, r.int(1, 3) })
  local big = r.pick({ math.tointeger(2 ^ 36), math.tointeger(2 ^ 40), math.tointeger(2 ^ 20) })
  local v = base:expand(big, -1)
  S.srcs[v] = "(" .. S.srcs[base] .. "):expand(" .. big .. ", -1)"
  local name = r.pick(HUGE_VIEW_METHODS)
  local args = pack(v)
  if name == "view" or name == "reshape" then args = pack(v, -1)
  elseif name == "select" or name == "narrow" then args = pack(v, 1, 2, 3)
  elseif name == "softmax" or name == "unsqueeze" then args = pack(v, 1)
  elseif name == "matmul" or name == "mul" then args = pack(v, fresh(S, { v:size(2), 2 }))
  elseif name == "masked_fill" then args = pack(v, fresh(S, { 1 }), 0)
  elseif name == "transpose" then args = pack(v, 1, 2)
  elseif name == "fill_" or name == "add_" then args = pack(v, 1) end
  if r.chance(0.2) then return tostring, pack(v), "tostring", { "format", "tostring" } end
  return v[name], args, "(" .. S.srcs[v] .. "):" .. name, { name }, true
end)

-- indexing, assignment and length through the metatable
op(3, function(S)
  local r = S.r
  local t = pool_tensor(S)
  local i = r.chance(0.8) and r.int(-3, 4) or anyval(S)
  return function(x, k) return x[k] end, pack(t, i), "(function(x, k) return x[k] end)", { "index" }
end)
op(2, function(S)
  local r = S.r
  local t = pool_tensor(S)
  local i = r.chance(0.8) and r.int(-3, 4) or anyval(S)
  local v = r.chance(0.5) and gen_number(S) or anyval(S)
  return function(x, k, y) x[k] = y end, pack(t, i, v), "(function(x, k, y) x[k] = y end)", { "index" }
end)
op(1, function(S) return function(x) return #x end, pack(pool_tensor(S)), "(function(x) return #x end)", { "length" } end)
op(1, function(S) return function(x) return x.shape end, pack(pool_tensor(S)), "(function(x) return x.shape end)", { "shape" } end)
op(2, function(S) return tostring, pack(maybe(S, 0.9, pool_tensor)), "tostring", { "format", "tostring" } end)

-- scaled_dot_product_attention with every option
op(8, function(S)
  local r = S.r
  local lead = {}
  for i = 1, r.int(0, 2) do lead[i] = r.int(1, 3) end
  local lq, lk, e, ev = r.int(0, 6), r.int(0, 6), r.int(1, 8), r.int(1, 8)
  if r.chance(0.2) then lq = r.int(17, 70) end
  local function shape(a, b)
    local s = {}
    for i, x in ipairs(lead) do s[i] = (r.chance(0.1) and 1 or x) end
    s[#s + 1] = a
    s[#s + 1] = b
    if r.chance(0.05) then s[#s] = s[#s] + 1 end
    return s
  end
  local function t(sz) return fresh(S, sz, "randn") end
  local q, k, v = t(shape(lq, e)), t(shape(lk, e)), t(shape(lk, ev))
  local args = pack(q, k, v)
  if r.chance(0.1) then args[r.int(1, 3)] = anyval(S) end
  if r.chance(0.8) then
    local o = {}
    if r.chance(0.3) then
      local ms = r.pick({ { lq, lk }, { 1, lk }, { lq, 1 }, { lk, lq }, { 1 }, {}, { 2, 1, lq, lk }, { lq + 1, lk } })
      local m = attn.rand(ms):gt(r.float())
      remember(S, m, "attn.rand(" .. value_src(ms, S.srcs) .. "):gt(0.5)")
      o.mask = r.chance(0.9) and m or anyval(S)
    end
    if r.chance(0.2) then
      local bs = r.pick({ { lq, lk }, { 1, lk }, { lk, lq }, {} })
      o.bias = r.chance(0.9) and t(bs) or anyval(S)
      if r.chance(0.2) and attn.is_tensor(o.bias) then o.bias:fill_(r.pick(SPECIAL_VALUES)) end
    end
    if r.chance(0.4) then o.is_causal = r.chance(0.9) and r.chance(0.5) or anyval(S) end
    if r.chance(0.3) then o.scale = r.chance(0.8) and r.float() * 2 or anyval(S) end
    if r.chance(0.3) then o.dropout_p = r.chance(0.8) and r.pick({ 0, 0.1, 0.5, 0.99 }) or anyval(S) end
    if r.chance(0.3) then o.need_weights = r.chance(0.9) and r.chance(0.5) or anyval(S) end
    if r.chance(0.5) then o.kernel = r.chance(0.9) and r.pick({ "flash", "math", "auto" }) or anyval(S) end
    if r.chance(0.03) then o.bogus = true end
    if r.chance(0.05) then o[1] = 1 end
    args[4] = r.chance(0.95) and o or anyval(S)
    args.n = 4
  end
  if r.chance(0.05) then q:fill_(r.pick(SPECIAL_VALUES)) end
  return attn.scaled_dot_product_attention, args, "attn.scaled_dot_product_attention", { "scaled_dot_product_attention" }
end)

-- scaled_dot_product_attention with its variants (enable_gqa,
-- window, alibi_slopes, softcap, block_mask, return_lse), each good or
-- careless, in any combination, sometimes recorded (requires_grad) with a
-- backward. The block mask is built inside the call: fn a built-in, an
-- and_/or_ of them and Lua fns, or a Lua fn that errors, returns the wrong
-- shape or type, or NaN; built for the call's sizes or others. A build error
-- must name attn.block_mask; a successful sane call (finite randn inputs, good
-- options) must give finite out and gradients.
local BAD_WINDOWS = { { -2, 0 }, { 0, -5 }, { 2 ^ 62, 0 }, { math.huge, 0 }, { 1.5, 0 }, { 1 }, { 1, 2, 3 }, {},
  { 0 / 0, 0 }, { math.mininteger, 0 }, { "1", 0 }, 3, "x", { -1e18, 5 } }
local BAD_SOFTCAPS = { 0, -1, 0 / 0, math.huge, -math.huge, -0.0, "1", true, 1e-45 }

local function all_finite(t)
  local total = t:abs():sum():item()
  return total == total and total < math.huge
end

local function gen_mask_fn(S, lq, lk)
  local r, bm = S.r, attn.block_mask
  local c = r.int(1, 12)
  if c == 1 then return bm.causal, "attn.block_mask.causal" end
  if c == 2 then
    local w = r.chance(0.8) and r.int(1, 8) or r.pick(HOSTILE_NUMBERS)
    return function() return bm.sliding_window(w) end, "attn.block_mask.sliding_window(" .. num_src(w) .. ")", true
  end
  if c == 3 then
    local n = r.chance(0.8) and math.max(lq, lk) or r.int(0, 8)
    local ids = attn.tensor(n > 0 and (function() local t = {} for i = 1, n do t[i] = (i - 1) // r.int(1, 4) end return t end)() or {})
    if r.chance(0.1) and n > 0 then ids[r.int(1, n)] = r.pick(SPECIAL_VALUES) end
    remember(S, ids, "--[[ids]] attn.tensor{...}")
    return function() return bm.document(ids) end, "attn.block_mask.document(" .. S.srcs[ids] .. ")", true
  end
  if c == 4 then return function(_, _, q, k) return k:le(q) end, "function(b, h, q, k) return k:le(q) end" end
  if c == 5 then return function(_, h, q, k) return (q - k):remainder(h + 1):eq(0) end,
    "function(b, h, q, k) return (q - k):remainder(h + 1):eq(0) end" end
  if c == 6 then return function() error("mask fn failed on purpose") end,
    "function() error('mask fn failed on purpose') end" end
  if c == 7 then
    local ret = r.pick({ "nil", "number", "table", "wrong", "3d", "nan", "empty" })
    return function(_, _, q, k)
      if ret == "nil" then return nil end
      if ret == "number" then return 1 end
      if ret == "table" then return { 1 } end
      if ret == "wrong" then return attn.ones(q:size(1) + 1, k:size(2)) end
      if ret == "3d" then return attn.ones(1, q:size(1), k:size(2)) end
      if ret == "nan" then return attn.full({ q:size(1), k:size(2) }, 0 / 0) end
      return attn.ones(0)
    end, "function(b, h, q, k) --[[returns " .. ret .. "]] end"
  end
  if c == 8 then return r.pick({ 1, "causal", {}, true, math.abs }), "--[[not a mask fn]]" end
  local a, asrc, alazy = gen_mask_fn(S, lq, lk)
  local b, bsrc, blazy = gen_mask_fn(S, lq, lk)
  local comb = r.chance(0.5) and "and_" or "or_"
  return function()
    local x, y = alazy and a() or a, blazy and b() or b
    if r.chance(0.3) then for _ = 1, r.int(1, 70) do x = bm[comb](x, y) end return x end
    return bm[comb](x, y)
  end, "attn.block_mask." .. comb .. "(" .. asrc .. ", " .. bsrc .. ")", true
end

op(16, function(S)
  local r = S.r
  local nb, hkv = r.int(1, 2), r.int(1, 2)
  local group = r.chance(0.5) and r.int(1, 3) or 1
  local h = hkv * group
  local lq, lk, e, ev = r.int(0, 6), r.int(0, 6), r.int(1, 8), r.int(1, 8)
  if r.chance(0.25) then lq, lk = r.int(17, 70), r.int(1, 90) end
  local leading = r.chance(0.8)
  local function shape(heads, l, d)
    local s = leading and { nb, heads, l, d } or { heads, l, d }
    if r.chance(0.03) then s[#s - r.int(0, 2)] = r.int(0, 4) end
    return s
  end
  local q, k, v = fresh(S, shape(h, lq, e), "randn"), fresh(S, shape(hkv, lk, e), "randn"),
    fresh(S, shape(hkv, lk, ev), "randn")
  local sane = q:size(-1) == k:size(-1) -- good options only, finite inputs: then finite results
  local o = {}
  if r.chance(0.8) then
    if r.chance(0.9) then o.enable_gqa = group > 1 or r.chance(0.5) else o.enable_gqa = anyval(S) end
  end
  if group > 1 and o.enable_gqa ~= true then sane = false end
  if r.chance(0.4) then
    if r.chance(0.8) then o.window = { r.pick({ -1, 0, 1, 3, 20 }), r.pick({ -1, 0, 2 }) }
    else o.window, sane = r.pick(BAD_WINDOWS), false end
  end
  if r.chance(0.3) then
    local c = r.int(1, 6)
    if c <= 3 then o.alibi_slopes = attn.alibi_slopes(h)
    elseif c == 4 then o.alibi_slopes = attn.rand(nb, h)
    else
      o.alibi_slopes, sane = r.pick({ attn.rand(h + 1), attn.rand(2, nb, h), attn.rand(nb + 1, h), attn.full({ h }, 0 / 0),
        attn.rand(0), 0.5, "x" }), false
    end
    if attn.is_tensor(o.alibi_slopes) then remember(S, o.alibi_slopes, "--[[slopes " .. table.concat(o.alibi_slopes:size(), "x") .. "]] attn.rand") end
  end
  if r.chance(0.3) then
    if r.chance(0.7) then o.softcap = r.pick({ 0.5, 5, 30, 1e30 })
    else o.softcap, sane = r.pick(BAD_SOFTCAPS), false end
  end
  if r.chance(0.3) then
    if r.chance(0.9) then o.return_lse = r.chance(0.7) else o.return_lse = anyval(S) end
  end
  if r.chance(0.2) then o.is_causal = true end
  if r.chance(0.2) then o.need_weights = true end
  if r.chance(0.15) then
    local m = attn.rand(lq, lk):gt(0.5)
    remember(S, m, "attn.rand(" .. lq .. ", " .. lk .. "):gt(0.5)")
    o.mask = m
  end
  if r.chance(0.1) then o.dropout_p = 0.3 end
  if r.chance(0.5) then o.kernel = r.pick({ "flash", "math", "auto" }) end
  local build, bsrc
  if r.chance(0.5) then
    local fn, fsrc, lazy = gen_mask_fn(S, lq, lk)
    local bb, bh, blq, blk = r.pick({ 1, nb }), r.pick({ 1, h }), lq, lk
    if r.chance(0.15) then
      local c = r.int(1, 4)
      if c == 1 then blq = lq + 1 elseif c == 2 then blk = r.int(0, 3) elseif c == 3 then bh = h + 1 else bb = nb + 2 end
      sane = false
    end
    local bopts = r.chance(0.5) and { block = r.chance(0.9) and r.int(1, 20) or r.pick(HOSTILE_NUMBERS) } or nil
    build = function()
      return attn.block_mask(lazy and fn() or fn, bb, bh, blq, blk, bopts)
    end
    bsrc = ("attn.block_mask(%s, %d, %d, %d, %d, %s)"):format(fsrc, bb, bh, blq, blk, value_src(bopts, S.srcs))
  end
  local recorded = r.chance(0.4)
  if r.chance(0.05) then q:fill_(r.pick(SPECIAL_VALUES)); sane = false end
  local function call(qq, kk, vv, opts)
    if build then
      local ok, m = pcall(build)
      if not ok then
        -- a build error must name attn.block_mask; else raise a table (reported with the call)
        if M.bad_message(m, { "attn.block_mask" }) then error({ block_mask_build = tostring(m) }) end
        error(m, 0)
      end
      opts.block_mask = m
    end
    -- recorded: on fresh leaves, and the results detached, so no graph enters
    -- the pool (the optimizer op sets requires_grad on pool tensors)
    if recorded then qq, kk, vv = qq:clone():requires_grad_(), kk:clone():requires_grad_(), vv:clone():requires_grad_() end
    local res = pack(attn.scaled_dot_product_attention(qq, kk, vv, opts))
    if recorded then
      res[1]:sum():backward()
      if sane then
        for _, x in ipairs({ qq, kk, vv }) do
          if x.grad and not all_finite(x.grad) then error({ nonfinite_grad = true }) end
        end
      end
    end
    if sane and not all_finite(res[1]) then error({ nonfinite_out = true }) end
    for i = 1, res.n do if attn.is_tensor(res[i]) then res[i] = res[i]:detach() end end
    return table.unpack(res, 1, res.n)
  end
  local src = ("(function(q, k, v, o) --[[%sblock_mask = %s]] end)"):format(recorded and "recorded, backward; " or "",
    bsrc or "none")
  return call, pack(q, k, v, o), src, { "scaled_dot_product_attention", "attn.block_mask", "backward" }
end)

-- viz, writing to temporary files; show only returns its text
op(2, function(S)
  local r = S.r
  local w = maybe(S, 0.9, pool_tensor)
  local opts = { file = tmp_path(S, ".svg") }
  if r.chance(0.3) then opts.rows = r.chance(0.5) and { "a", "b" } or anyval(S) end
  if r.chance(0.3) then opts.cols = r.chance(0.5) and { 1, 2, 3 } or anyval(S) end
  if r.chance(0.2) then opts.title = r.chance(0.5) and "<t&>" or anyval(S) end
  if r.chance(0.2) then opts.vmin = gen_number(S) end
  if r.chance(0.2) then opts.vmax = gen_number(S) end
  if r.chance(0.1) then opts.cell = anyval(S) end
  if r.chance(0.05) then opts = anyval(S) end
  local which = r.pick({ "heatmap", "heads", "show" })
  if which == "show" and (type(opts) ~= "table" or getmetatable(opts)) then which = "heatmap" end
  if which == "show" then
    opts.print = false
    opts.color = r.chance(0.5)
  end
  return attn.viz[which], pack(w, opts), "attn.viz." .. which, { which }
end)

-- ---- nn classes -------------------------------------------------------------

local function small_int(S) return S.r.chance(0.9) and S.r.int(1, 6) or anyval(S) end

local CTORS = {
  Linear = function(S) return small_int(S), small_int(S), S.r.chance(0.7) and { bias = S.r.chance(0.5) } or nil end,
  Dropout = function(S) return S.r.chance(0.8) and S.r.pick({ 0, 0.5, 1 }) or anyval(S) end,
  SelfAttentionV1 = function(S) return small_int(S), small_int(S) end,
  SelfAttentionV2 = function(S) return small_int(S), small_int(S), S.r.chance(0.3) and { qkv_bias = S.r.chance(0.5) } or nil end,
  CausalAttention = function(S)
    return small_int(S), small_int(S), small_int(S), S.r.chance(0.8) and S.r.pick({ 0, 0.5 }) or anyval(S),
      S.r.chance(0.3) and { qkv_bias = true } or nil
  end,
  MultiHeadAttentionWrapper = function(S)
    return small_int(S), small_int(S), small_int(S), S.r.chance(0.8) and 0.0 or anyval(S), small_int(S),
      S.r.chance(0.3) and { qkv_bias = true } or nil
  end,
  MultiHeadAttention = function(S)
    local r = S.r
    local h = r.int(1, 3)
    return small_int(S), r.chance(0.8) and h * r.int(1, 3) or anyval(S), small_int(S),
      r.chance(0.8) and 0.0 or anyval(S), r.chance(0.9) and h or anyval(S),
      r.chance(0.3) and { qkv_bias = true, scale = r.chance(0.5) and 0.5 or nil } or nil
  end,
  Attention = function(S) return small_int(S), S.r.chance(0.3) and { row_dim = S.r.int(-2, 2), col_dim = S.r.int(-2, 2) } or nil end,
}
-- the training layers
CTORS.Embedding = function(S) return small_int(S), small_int(S) end
CTORS.LayerNorm = function(S)
  local r = S.r
  return r.chance(0.8) and small_int(S) or { small_int(S), small_int(S) },
    r.chance(0.3) and { eps = r.chance(0.8) and 1e-5 or anyval(S), elementwise_affine = r.chance(0.5) } or nil
end
CTORS.GELU = function(S)
  return S.r.chance(0.5) and { approximate = S.r.chance(0.9) and S.r.pick({ "none", "tanh" }) or anyval(S) } or nil
end
CTORS.CrossEntropyLoss = function(S)
  local r = S.r
  if r.chance(0.5) then return nil end
  return { reduction = r.chance(0.9) and r.pick({ "mean", "sum", "none" }) or anyval(S),
    label_smoothing = r.chance(0.8) and r.pick({ 0, 0.1 }) or anyval(S),
    ignore_index = r.chance(0.3) and r.int(-100, 3) or nil }
end
CTORS.Sequential = function(S)
  local mods = {}
  for i = 1, S.r.int(0, 3) do mods[i] = S.r.chance(0.9) and gen_module_value(S) or anyval(S) end
  return table.unpack(mods)
end
local CLASS_NAMES = {}
for k in pairs(CTORS) do CLASS_NAMES[#CLASS_NAMES + 1] = k end
table.sort(CLASS_NAMES)

op(4, function(S)
  local name = S.r.pick(CLASS_NAMES)
  return nn[name], pack(CTORS[name](S)), "attn.nn." .. name, { name }
end)

-- the input width a module expects
local function width(m)
  return m.in_features or m.d_in or m.d_model or (m.W_query and (m.W_query.in_features or m.W_query:size(1)))
    or (m.heads and m.heads[1] and m.heads[1].W_query.in_features) or 2
end

op(8, function(S)
  local r = S.r
  if #S.mods == 0 then return nn.Linear, pack(2, 2), "attn.nn.Linear", { "Linear" } end
  local m = r.pick(S.mods)
  local cls = getmetatable(m).__name
  local msrc = value_src(m, S.srcs)
  local c = r.int(1, 10)
  if c <= 5 then -- forward with random shapes
    local d = width(m)
    local sizes = {}
    for i = 1, r.int(0, 2) do sizes[i] = r.int(1, 3) end
    sizes[#sizes + 1] = r.int(0, 5)
    sizes[#sizes + 1] = r.chance(0.85) and d or r.int(0, 7)
    local x = fresh(S, sizes, "rand")
    local args = pack(m, x)
    if cls == "Attention" then
      args = pack(m, x, r.chance(0.8) and x or shaped_like(S, x), r.chance(0.8) and x or anyval(S))
      if r.chance(0.3) then
        local n = x:dim() >= 2 and x:size(-2) or 1
        local mk = attn.rand(n, n):gt(0.5)
        remember(S, mk, "attn.rand(" .. n .. ", " .. n .. "):gt(0.5)")
        args[5] = r.chance(0.8) and mk or anyval(S)
        args.n = 5
      end
    end
    if r.chance(0.1) then args[2] = anyval(S) end
    return m.forward, args, "(" .. msrc .. ").forward", { cls }
  end
  if c == 6 then return m.train, pack(m, r.chance(0.7) and r.chance(0.5) or anyval(S)), "(" .. msrc .. ").train", { cls, "train" } end
  if c == 7 then
    local g = r.pick({ "eval", "state_dict", "parameters", "named_parameters", "num_parameters", "state_dict_keys" })
    return m[g], pack(m), "(" .. msrc .. ")." .. g, { cls, g }
  end
  if c == 8 then
    local g = r.int(1, 4)
    if g == 1 then return tostring, pack(m), "tostring", { cls } end
    local path = r.chance(0.9) and tmp_path(S, ".safetensors") or anyval(S)
    if type(path) == "string" and path:sub(1, 1) ~= "/" then path = S.tmpdir .. "/" .. path end
    if g == 2 then return m.save, pack(m, path), "(" .. msrc .. "):save", { cls, "save" } end
    if g == 3 then return m.load, pack(m, path, r.chance(0.8) and nil or anyval(S)), "(" .. msrc .. "):load", { cls, "load" } end
    -- forward asking for the weights (the attention modules), or with a bad option table
    local d = width(m)
    local x = fresh(S, { r.int(1, 2), r.int(0, 5), r.chance(0.9) and d or r.int(0, 7) }, "rand")
    local o = r.chance(0.8) and { need_weights = r.chance(0.9) and r.chance(0.5) or anyval(S) } or anyval(S)
    return m.forward, pack(m, x, o), "(" .. msrc .. ").forward", { cls }
  end
  -- load_state_dict: from itself, another module, a mutated dict, garbage
  local other = r.pick(S.mods)
  local d = other:state_dict()
  if r.chance(0.3) then
    for k, v in pairs(d) do
      local cc = r.int(1, 4)
      if cc == 1 then d[k] = nil elseif cc == 2 then d[k] = anyval(S) elseif cc == 3 then d[k] = v:t() end
      break
    end
  end
  if r.chance(0.1) then d = anyval(S) end
  return m.load_state_dict, pack(m, d, r.chance(0.8) and nil or anyval(S)), "(" .. msrc .. ").load_state_dict",
    { cls, "load_state_dict" }
end)

-- ---- nn.functional and nn.utils -----------------------------------------------

-- ids or class targets of a shape: integer values in [1, n] (sometimes not)
local function gen_ids(S, sizes, n)
  local r = S.r
  local t = fresh(S, sizes, "rand")
  if r.chance(0.9) then
    local count = 1
    for _, x in ipairs(sizes) do count = count * x end
    local data = {}
    for i = 1, count do data[i] = r.chance(0.97) and r.int(1, math.max(n, 1)) or r.pick(HOSTILE_NUMBERS) end
    t = count > 0 and attn.tensor(data):view(sizes) or attn.zeros(sizes)
    remember(S, t, "attn.tensor(" .. value_src(data, S.srcs) .. "):view(" .. value_src(sizes, S.srcs) .. ")")
  end
  return t
end

op(4, function(S)
  local r = S.r
  local F = nn.functional
  local lead = {}
  for i = 1, r.int(0, 2) do lead[i] = r.int(0, 3) end
  local c = r.int(1, 6)
  local x_sizes = table.move(lead, 1, #lead, 1, {})
  x_sizes[#x_sizes + 1] = c
  local x = fresh(S, x_sizes, "randn")
  if r.chance(0.1) then x:fill_(r.pick(SPECIAL_VALUES)) end
  local which = r.int(1, 7)
  if which == 1 then
    local target = r.chance(0.9) and gen_ids(S, lead, c) or anyval(S)
    local o = r.chance(0.6) and { reduction = r.chance(0.9) and r.pick({ "mean", "sum", "none" }) or anyval(S),
      label_smoothing = r.chance(0.8) and r.pick({ 0, 0.2, 1 }) or anyval(S),
      ignore_index = r.chance(0.3) and r.pick({ -100, 1, 2 }) or nil } or nil
    if r.chance(0.05) then o = anyval(S) end
    return F.cross_entropy, pack(r.chance(0.95) and x or anyval(S), target, o), "attn.nn.functional.cross_entropy",
      { "cross_entropy" }
  elseif which == 2 then
    local o = r.chance(0.5) and { approximate = r.chance(0.9) and r.pick({ "none", "tanh" }) or anyval(S) } or nil
    return F.gelu, pack(r.chance(0.95) and x or anyval(S), o), "attn.nn.functional.gelu", { "gelu" }
  elseif which == 3 then
    local shape = r.chance(0.8) and c or r.chance(0.5) and { c } or anyval(S)
    local w = r.chance(0.5) and fresh(S, { r.chance(0.9) and c or r.int(0, 7) }, "randn") or nil
    local b = r.chance(0.5) and fresh(S, { r.chance(0.9) and c or r.int(0, 7) }, "randn") or nil
    local eps = r.chance(0.8) and 1e-5 or anyval(S)
    return F.layer_norm, pack(x, shape, w, b, eps), "attn.nn.functional.layer_norm", { "layer_norm" }
  elseif which == 4 then
    local n = r.int(1, 5)
    local w = r.chance(0.9) and fresh(S, { n, r.int(0, 4) }, "randn") or anyval(S)
    local ids = r.chance(0.9) and gen_ids(S, lead, n + (r.chance(0.1) and 1 or 0)) or anyval(S)
    return F.embedding, pack(ids, w), "attn.nn.functional.embedding", { "embedding" }
  elseif which == 5 then
    local out = r.int(1, 4)
    local w = r.chance(0.9) and fresh(S, { out, r.chance(0.9) and c or r.int(1, 7) }, "randn") or anyval(S)
    local b = r.chance(0.5) and fresh(S, { r.chance(0.9) and out or r.int(1, 7) }, "randn") or nil
    return F.linear, pack(x, w, b), "attn.nn.functional.linear", { "linear" }
  elseif which == 6 then
    return F.dropout, pack(x, r.chance(0.8) and r.pick({ 0, 0.5, 1 }) or anyval(S), r.chance(0.8) and r.chance(0.5) or anyval(S)),
      "attn.nn.functional.dropout", { "dropout" }
  end
  -- clip_grad_norm_ over tensors without gradients (nothing to clip) or careless values
  local params = r.chance(0.8) and { x, pool_tensor(S) } or anyval(S)
  return nn.utils.clip_grad_norm_, pack(params, r.chance(0.8) and r.float() * 2 or anyval(S)),
    "attn.nn.utils.clip_grad_norm_", { "clip_grad_norm_" }
end)

-- attn.optim: an optimizer over fresh parameters (or careless ones) with
-- careless options, a step after gradients were set, then its state dict loaded back
op(1, function(S)
  local r = S.r
  local name = r.pick({ "SGD", "Adam", "AdamW" })
  local params = {}
  for i = 1, r.int(0, 3) do params[i] = fresh(S, { r.int(0, 4), r.int(1, 3) }, "randn") end
  if r.chance(0.1) then params[#params + 1] = anyval(S) end
  local o = { lr = r.chance(0.9) and r.pick({ 0.1, 1e-3, 0 }) or anyval(S) }
  if r.chance(0.3) then o.weight_decay = r.chance(0.8) and r.pick({ 0, 0.1 }) or anyval(S) end
  if name == "SGD" then
    if r.chance(0.5) then o.momentum = r.chance(0.8) and r.pick({ 0, 0.9 }) or anyval(S) end
    if r.chance(0.3) then o.nesterov = r.chance(0.8) and r.chance(0.5) or anyval(S) end
  else
    if r.chance(0.3) then o.betas = r.chance(0.8) and { 0.9, 0.99 } or anyval(S) end
    if r.chance(0.3) then o.eps = r.chance(0.8) and 1e-8 or anyval(S) end
  end
  if r.chance(0.05) then o.bogus = 1 end
  local steps = r.int(1, 3)
  local function run(ps, opts)
    local tensors = {}
    if type(ps) == "table" and getmetatable(ps) == nil then
      for _, p in ipairs(ps) do if attn.is_tensor(p) then tensors[#tensors + 1] = p:requires_grad_() end end
    end
    local opt = attn.optim[name](ps, opts)
    for _ = 1, steps do
      opt:zero_grad()
      for _, p in ipairs(tensors) do (p * p):sum():backward() end
      attn.nn.utils.clip_grad_norm_(ps, 1.0)
      opt:step()
    end
    opt:load_state_dict(opt:state_dict())
    return opt
  end
  return run, pack(r.chance(0.95) and params or anyval(S), r.chance(0.95) and o or anyval(S)),
    "(function(ps, opts) --[[attn.optim." .. name .. "(ps, opts), " .. steps .. " steps]] end)", { name }
end)

-- ---- checking one call ----------------------------------------------------

-- a message is acceptable when it is a non-empty string, names one of ctx and
-- is not a raw Lua runtime error leaking out of the implementation
local function bad_message(msg, ctx)
  if type(msg) ~= "string" then return "raised a " .. type(msg) .. " instead of a message" end
  if msg == "" then return "raised an empty message" end
  if msg:find("attempt to ", 1, true) or msg:find("bad argument #%d+ to '") then
    return "raised a raw Lua error instead of a message naming the function"
  end
  if msg:find("table index is ") or msg:find("stack overflow") then return "raised a raw Lua error" end
  for _, c in ipairs(ctx) do if msg:find(c, 1, true) then return nil end end
  return "raised a message that names none of: " .. table.concat(ctx, ", ")
end

M.bad_message = bad_message

-- ---- call kinds beyond careless calls -----------------------------------------
-- Each class of bug of the adversarial review has a kind, switchable with
-- --kinds (see KINDS). In-process kinds take about one iteration in eight;
-- child-process kinds (fifo, swap, failsave, env) one iteration in
-- CHILD_EVERY, in turn. Each check returns "o" or "e" and, on a finding, the
-- failure text and the Lua source of what it did.

local CHILD_EVERY = 150
local LUA = "lua5.4"

-- with --verbose, a kind says what it is about to do (a crash leaves it as the last line)
local function note(S, src) if S.note then S.note(src); io.stdout:flush() end end

local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- a child lua5.4 with this process's module paths (sanitizer preloads and the
-- rest of the environment are inherited); returns ok, output
local function child(env, script, limit_s, prefix)
  local cmd = ("%s env LUA_PATH=%s LUA_CPATH=%s %s timeout %d %s -e %s 2>&1; echo \"rc=$?\""):format(
    prefix or "", shq(package.path), shq(package.cpath), env or "", limit_s or 60, LUA, shq(script))
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc == 0, out, rc
end

-- float32 bits of every element, NaNs made equal
local function bits_of(t)
  local v = t:contiguous():view(-1):totable()
  local b = {}
  for i, x in ipairs(v) do b[i] = x ~= x and "nan" or string.pack("<f", x) end
  return table.concat(b)
end

local function is_expanded(t)
  for d = 1, t:dim() do
    if t:stride(d) == 0 and t:size(d) > 1 then return true end
  end
  return false
end

-- coroutine: the careless call, run inside a coroutine, sometimes below a deep Lua stack
local function run_in_coroutine(depth, fn, args)
  local function deep(n)
    if n > 0 then
      local r = deep(n - 1)
      return r
    end
    return pack(pcall(fn, table.unpack(args, 1, args.n)))
  end
  local co = coroutine.create(deep)
  local ok, res = coroutine.resume(co, depth)
  if not ok then return pack(false, res) end
  return res
end

-- longlist: cat / stack / a MultiHeadAttentionWrapper of many heads; every
-- list that fits in memory must work, with the right values
local function kind_longlist(S)
  local r = S.r
  local n = r.chance(0.03) and 100000 or r.pick({ 150, 200, 256, 400, 1000, 3000, r.int(100, 2000) })
  local which = r.pick({ "cat", "stack", "cat", "stack", "mhaw" })
  local in_co = r.chance(0.5)
  local src, fn, check
  if which == "mhaw" then
    local h = r.pick({ 40, 64, 200, r.int(30, 300) })
    local m = nn.MultiHeadAttentionWrapper(4, 1, 8, 0.0, h)
    local x = attn.rand(1, 3, 4)
    src = ("nn.MultiHeadAttentionWrapper(4, 1, 8, 0.0, %d)(attn.rand(1, 3, 4))"):format(h)
    fn = function() return m(x) end
    check = function(y)
      if not attn.is_tensor(y) or table.concat(y:size(), ",") ~= "1,3," .. h then return "wrong shape" end
      for j = 1, h, math.max(1, h // 7) do
        if bits_of(y:narrow(3, j, 1)) ~= bits_of(m.heads[j](x)) then return "head " .. j .. " differs from its own forward" end
      end
    end
  else
    local list = {}
    for i = 1, n do list[i] = attn.full({ 2 }, i) end
    src = ("attn.%s(<list of %d attn.full({2}, i)>, 1)"):format(which, n)
    fn = function() return attn[which](list, 1) end
    check = function(y)
      local v = attn.is_tensor(y) and y:view(-1):totable() or {}
      if #v ~= 2 * n then return "wrong size" end
      for i = 1, n do
        if v[2 * i - 1] ~= i or v[2 * i] ~= i then return ("element %d is %s, not %d"):format(2 * i, v[2 * i], i) end
      end
    end
  end
  if in_co then src = "inside a coroutine: " .. src end
  note(S, src)
  local res = in_co and run_in_coroutine(r.int(0, 200), fn, pack()) or pack(pcall(fn))
  if not res[1] then return "e", "failed on a long list: " .. tostring(res[2]), src end
  local why = check(res[2])
  if why then return "o", "a silently wrong result: " .. why, src end
  return "o"
end

-- finalizer: objects whose __gc replaces entries of the argument tables,
-- collected while the call runs (a collector stepping on every allocation)
local function kind_finalizer(S)
  local r = S.r
  local which = r.pick({ "save_safetensors", "cat", "stack", "load_state_dict", "tensor" })
  local args, ctx, tables = nil, { which }, {}
  local path = S.tmpdir .. "/gc.safetensors"
  local m
  if which == "save_safetensors" then
    local tensors, meta = {}, {}
    for i = 1, r.int(1, 6) do tensors["t" .. i] = attn.rand(r.int(1, 3), 2) end
    for i = 1, r.int(0, 3) do meta["k" .. i] = "v" .. i end
    args = pack(path, tensors, meta)
    tables = { tensors, meta }
  elseif which == "cat" or which == "stack" then
    local list = {}
    for i = 1, r.int(2, 60) do list[i] = attn.rand(2) end
    args = pack(list, 1)
    tables = { list }
  elseif which == "load_state_dict" then
    m = nn.MultiHeadAttention(4, 4, 3, 0.0, 2)
    local d = m:state_dict()
    args = pack(m, d)
    tables = { d }
    ctx = { "MultiHeadAttention", "load_state_dict" }
  else
    local rows = {}
    for i = 1, r.int(2, 30) do rows[i] = { i, i + 1 } end
    args = pack(rows)
    tables = { rows }
    for i = 1, #rows do tables[#tables + 1] = rows[i] end
  end
  local replacements = { "str", false, 1, {}, attn.ones(5), print }
  -- an aggressive collector at a random phase (random pause, step sizes and
  -- garbage between the finalizers), so that they run at any allocation of the call
  collectgarbage("incremental", r.int(1, 100), r.int(100, 1000), r.int(1, 13))
  if r.chance(0.5) then collectgarbage() end
  for _ = 1, r.int(1, 12) do
    local t = r.pick(tables)
    local keys = {}
    for key in pairs(t) do keys[#keys + 1] = key end
    table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
    if #keys > 0 then
      local key, v = r.pick(keys), r.pick(replacements)
      if v == false then v = nil end
      setmetatable({}, { __gc = function() t[key] = v end })
    end
    for _ = 1, r.int(0, 30) do local _ = {} end
  end
  local fn = which == "load_state_dict" and m.load_state_dict or attn[which]
  local src = ("attn.%s(...) while finalizers replace entries of its argument tables"):format(which)
  note(S, src)
  local res = pack(pcall(fn, table.unpack(args, 1, args.n)))
  collectgarbage("incremental", 200, 100, 13) -- Lua 5.4's defaults
  if not res[1] then
    local why = bad_message(res[2], ctx)
    if why then return "e", why .. ": " .. tostring(res[2]), src end
    return "e"
  end
  return "o"
end

-- wrongself: every metamethod and method of attn.Tensor called with a self
-- that is not a tensor; an error naming the function (or its operator), never a crash
local WRONG_SELF_NAMES = { __index = "index", __newindex = "index", __len = "length", __tostring = "tostring" }
for _, e in ipairs(TABLE_OPS) do if e.operator then WRONG_SELF_NAMES[e.operator] = e.name end end
local wrong_self_fns
local function kind_wrongself(S)
  local r = S.r
  if not wrong_self_fns then
    wrong_self_fns = {}
    for k, v in pairs(getmetatable(attn.ones(1))) do
      if type(v) == "function" then wrong_self_fns[#wrong_self_fns + 1] = { "mt." .. k, v, WRONG_SELF_NAMES[k] or k } end
    end
    for k, v in pairs(attn.Tensor) do
      if type(v) == "function" then wrong_self_fns[#wrong_self_fns + 1] = { "attn.Tensor." .. k, v, k } end
    end
    table.sort(wrong_self_fns, function(a, b) return a[1] < b[1] end)
  end
  local e = r.pick(wrong_self_fns)
  local fake = setmetatable({}, { __name = "attn.Tensor" })
  local selves = { {}, false, 1, "x", io.stdout, print, fake, attn.ones(2, 2):totable(), coroutine.create(print) }
  local self = r.pick(selves)
  if self == false then self = nil end
  local args = pack(self, anyval(S), r.chance(0.5) and anyval(S) or nil)
  args.n = r.int(1, 3)
  local src = ("getmetatable(attn.ones(1)) / attn.Tensor: %s(%s)"):format(e[1], value_src(args[1], S.srcs))
  note(S, src)
  local res = pack(pcall(e[2], table.unpack(args, 1, args.n)))
  if res[1] then return "o" end
  local why = bad_message(res[2], { e[3] })
  if why then return "e", why .. ": " .. tostring(res[2]), src end
  return "e"
end

-- overlap: in-place ops whose output and operand are views of one storage
-- (shifted narrows, transposes, expands). The result must equal the same
-- op on cloned inputs, or the call must raise; writing to an expanded
-- (self-overlapping) view must raise.
local function kind_overlap(S)
  local r = S.r
  local h, w = r.int(1, 4), r.int(1, 4)
  local L = h * w
  local N = L + r.int(0, 6)
  local data = {}
  for i = 1, N do data[i] = r.pick({ 0, 1, 2, -1, 0.5, -3, 4 }) end
  local base = attn.tensor(data)
  -- a view of shape [h, w] (or [w] for a row) of a flat storage, as an expression
  local function gen_view()
    local c = r.int(1, 4)
    local off = r.int(1, N - L + 1)
    if c == 1 then return function(b) return b:narrow(1, off, L):view(h, w) end, ("narrow(1, %d, %d):view(%d, %d)"):format(off, L, h, w) end
    if c == 2 then return function(b) return b:narrow(1, off, L):view(w, h):t() end, ("narrow(1, %d, %d):view(%d, %d):t()"):format(off, L, w, h) end
    if c == 3 then
      local o2 = r.int(1, N - w + 1)
      return function(b) return b:narrow(1, o2, w):view(1, w):expand(h, w) end, ("narrow(1, %d, %d):view(1, %d):expand(%d, %d)"):format(o2, w, w, h, w)
    end
    local o3 = r.int(1, N - h + 1)
    return function(b) return b:narrow(1, o3, h):view(h, 1):expand(h, w) end, ("narrow(1, %d, %d):view(%d, 1):expand(%d, %d)"):format(o3, h, h, h, w)
  end
  local out_fn, out_src = gen_view()
  local opd_fn, opd_src = gen_view()
  local name = r.pick(list_with(INPLACE, { "copy_", "masked_fill_", "triu_", "tril_", "fill_", "zero_", "index",
    "uniform_", "normal_" }))
  local k, value, row, srow = r.int(-2, 2), r.pick({ 0, 7, -1.5 }), r.int(1, h), r.int(1, h)
  local function apply(out, opd)
    if name == "masked_fill_" then return out:masked_fill_(opd, value) end
    if name == "triu_" or name == "tril_" then return out[name](out, k) end
    if name == "fill_" then return out:fill_(value) end
    if name == "zero_" then return out:zero_() end
    if name == "uniform_" or name == "normal_" then return out[name](out) end
    if name == "index" then out[row] = opd[srow]; return out end
    return out[name](out, opd)
  end
  -- what the op writes to: a row for index assignment, else the output
  local function written(out) return name == "index" and out[row] or out end
  local src = ("local b = attn.tensor(%s); b:%s %s (b:%s)"):format(value_src(data, S.srcs), out_src,
    name == "index" and ("[" .. row .. "] = (row " .. srow .. " of)") or (":" .. name .. " with"), opd_src)
  local out = out_fn(base)
  local ctx = { name == "index" and "index" or name }
  note(S, src)
  -- the expected storage: the op on a copy of the storage, with a cloned operand
  local want
  local rng = attn.get_rng_state()
  if not is_expanded(written(out)) and name ~= "uniform_" and name ~= "normal_" then
    local copy = base:clone()
    local ok = pcall(apply, out_fn(copy), opd_fn(base):clone())
    want = ok and bits_of(copy) or nil
  end
  attn.set_rng_state(rng)
  local res = pack(pcall(apply, out, opd_fn(base)))
  if not res[1] then
    local why = bad_message(res[2], ctx)
    if why then return "e", why .. ": " .. tostring(res[2]), src end
    return "e"
  end
  if is_expanded(written(out)) then
    -- fills write one value everywhere, so they are allowed (as in PyTorch)
    if name ~= "fill_" and name ~= "zero_" then
      return "o", "an in-place write to an expanded (self-overlapping) view did not raise", src
    end
    local v = name == "zero_" and 0 or value
    for _, x in ipairs(out:reshape(-1):totable()) do
      if x ~= v then return "o", "a fill of an expanded view left an element other than " .. v, src end
    end
  end
  if want and bits_of(base) ~= want then
    return "o", "a silently wrong result: the storage differs from the same op on cloned inputs", src
  end
  return "o"
end

-- fifo: every loader on a FIFO must raise promptly (a child under a time limit)
local function kind_fifo(S)
  local fifo = S.tmpdir .. "/fifo"
  os.remove(fifo)
  if not os.execute("mkfifo " .. shq(fifo)) then return "o" end
  local script = ([[
local attn = require "attn"
local p = %q
for _, c in ipairs { { "load", attn.load }, { "load_safetensors", attn.load_safetensors },
    { "load", function(x) return attn.nn.Linear(2, 2):load(x) end } } do
  local ok, err = pcall(c[2], p)
  print(c[1], ok, err)
end
print("END")]]):format(fifo)
  local ok, out, rc = child(nil, script, 20)
  os.remove(fifo)
  local src = "attn.load / load_safetensors / m:load on a FIFO (child process)"
  if rc == 124 or rc == 137 then return "e", "blocked on a FIFO (killed after 20 s)", src end
  if not ok or not out:find("END", 1, true) then return "e", "the child failed: " .. out:sub(1, 400), src end
  for line in out:gmatch("[^\n]+") do
    local fname, okv, msg = line:match("^(%S+)\t(%S+)\t(.*)$")
    if fname then
      if okv ~= "false" then return "o", fname .. " on a FIFO did not raise", src end
      local why = bad_message(msg, { fname })
      if why then return "e", why .. ": " .. msg, src end
    end
  end
  return "e"
end

-- swap: loads while another process replaces the file by rename; each load
-- must give one file or the other, whole
local function kind_swap(S)
  local r = S.r
  local dir = S.tmpdir
  local st = r.chance(0.5)
  local ext = st and ".safetensors" or ".npy"
  local a, b = attn.full({ r.int(100, 3000) }, 1), attn.full({ r.int(2, 40), r.int(2, 40) }, 2)
  S.swaps = (S.swaps or 0) + 1
  local stem = dir .. "/swap" .. S.swaps
  local pa, pb, target = stem .. "A" .. ext, stem .. "B" .. ext, stem .. ext
  if st then
    attn.save_safetensors(pa, { x = a })
    attn.save_safetensors(pb, { x = b })
  else
    attn.save(a, pa)
    attn.save(b, pb)
  end
  os.execute(("cp %s %s"):format(shq(pa), shq(target)))
  local stop = stem .. ".stop"
  os.remove(stop)
  local loop = ("i=0; while [ ! -e %s ] && [ -e %s ] && [ $i -lt 20000 ]; do cp %s %s.1 && mv %s.1 %s; "
    .. "cp %s %s.2 && mv %s.2 %s; i=$((i+1)); done; : > %s"):format(shq(stop), shq(pa), shq(pa), shq(target), shq(target),
    shq(target), shq(pb), shq(target), shq(target), shq(target), shq(stem .. ".done"))
  os.execute("sh -c " .. shq(loop) .. " >/dev/null 2>&1 &")
  local wa, wb = bits_of(a) .. table.concat(a:size(), ","), bits_of(b) .. table.concat(b:size(), ",")
  local src = ("%d loads of %s while another process swaps two files in by rename"):format(300, target)
  local finding
  for _ = 1, 300 do
    local ok, t = pcall(st and attn.load_safetensors or attn.load, target)
    if st and ok then t = t.x end
    if not ok then
      finding = "raised while the file was swapped: " .. tostring(t)
      break
    end
    local got = attn.is_tensor(t) and (bits_of(t) .. table.concat(t:size(), ",")) or "?"
    if got ~= wa and got ~= wb then
      finding = "a silently wrong result: a mix of the two files (shape [" .. (attn.is_tensor(t) and table.concat(t:size(), ", ") or "?") .. "])"
      break
    end
  end
  local f = io.open(stop, "w")
  if f then f:close() end
  -- wait (2 s at most) for the swapping loop to end before its files go
  for _ = 1, 200 do
    local done = io.open(stem .. ".done")
    if done then done:close(); break end
    os.execute("sleep 0.01")
  end
  if finding then return "e", finding, src end
  return "o"
end

-- failsave: a save over an existing file that fails midway (file size limit
-- in a child) must leave the old file as it was
local function kind_failsave(S)
  local r = S.r
  local which = r.pick({ "save", "save_safetensors", "module" })
  local target = S.tmpdir .. "/keep" .. (which == "save" and ".npy" or ".safetensors")
  local old = which == "save" and "npy" or "st"
  if which == "save" then attn.save(attn.full({ 3 }, 5), target)
  else attn.save_safetensors(target, { x = attn.full({ 3 }, 5) }) end
  local f = io.open(target, "rb")
  local before = f:read("a")
  f:close()
  local call = which == "save" and "attn.save(attn.ones(100000), p)"
    or which == "save_safetensors" and "attn.save_safetensors(p, { x = attn.ones(100000) })"
    or "attn.nn.Linear(300, 300):save(p)"
  local script = ("local attn = require 'attn'; local p = %q; local ok, err = pcall(function() return %s end); print(ok, err); print('END')")
    :format(target, call)
  -- the limit is in 512- or 1024-byte blocks (the shell's): 8 KiB at most
  local ok, out = child(nil, script, 30, "trap '' XFSZ; ulimit -f 8 &&")
  local src = ("%s over an existing file, failing at a file size limit (child process)"):format(call)
  f = io.open(target, "rb")
  local after = f and f:read("a")
  if f then f:close() end
  if not ok or not out:find("END", 1, true) then return "e", "the child failed: " .. out:sub(1, 400), src end
  if after ~= before then return "e", "the failed save destroyed the previous file (" .. old .. ", "
    .. (after and #after or "no") .. " bytes now, " .. #before .. " before): " .. out:match("^[^\n]*"), src end
  return out:find("^true") and "o" or "e"
end

-- env: a child under a hostile environment computes what this process
-- computes; the bits must agree (and the child must neither crash nor hang)
local ENV_SCRIPT = [[
local attn = ...
local function gen(seed, ...)
  local shape, n, s, d = { ... }, 1, seed, {}
  for _, x in ipairs(shape) do n = n * x end
  for i = 1, n do s = (s * 1103515245 + 12345) % 2147483648; d[i] = s / 1073741824 - 1 end
  return attn.tensor(d):view(shape)
end
local h = 0
local function fold(t)
  for _, x in ipairs(t:contiguous():view(-1):totable()) do h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) & 0xffffffff end
end
local a, b = gen(1, 200, 180), gen(2, 200, 180)
fold(a + b); fold(a:softmax(-1)); fold(gen(3, 40000) * 2)
fold(gen(4, 120, 90):matmul(gen(5, 90, 130)))
local q, k, v = gen(6, 2, 2, 80, 16), gen(7, 2, 2, 80, 16), gen(8, 2, 2, 80, 8)
fold(attn.scaled_dot_product_attention(q, k, v, { kernel = "math", is_causal = true }))
fold(attn.scaled_dot_product_attention(q, k, v, { kernel = "flash" }))
attn.manual_seed(3)
fold(attn.nn.MultiHeadAttention(16, 16, 80, 0.0, 4)(gen(9, 2, 80, 16)))
fold(attn.dropout(gen(10, 50000), 0.25))
return tostring(h)]]
local HOSTILE_ENV = { "OMP_NUM_THREADS=100000", "OMP_NUM_THREADS=20000", "OMP_NUM_THREADS=0", "OMP_NUM_THREADS=-1",
  "OMP_NUM_THREADS=garbage", "OMP_NUM_THREADS=", "OMP_NUM_THREADS=3,2", "OMP_STACKSIZE=1", "OMP_STACKSIZE=garbage",
  "OPENBLAS_NUM_THREADS=100000", "OMP_DYNAMIC=true", "OMP_PROC_BIND=spread", "OMP_PROC_BIND=garbage",
  "GOMP_SPINCOUNT=infinite", "GOMP_SPINCOUNT=0", "MALLOC_ARENA_MAX=1", "ATTN_NO_MALLOC_TUNING=1",
  "OMP_THREAD_LIMIT=1", "OMP_WAIT_POLICY=active", "GOMP_CPU_AFFINITY=garbage", "OMP_MAX_ACTIVE_LEVELS=100" }
local env_want
local function kind_env(S)
  local r = S.r
  local env = { r.pick(HOSTILE_ENV) }
  if r.chance(0.3) then env[2] = r.pick(HOSTILE_ENV) end
  local rng = attn.get_rng_state()
  env_want = env_want or assert(load(ENV_SCRIPT))(attn)
  attn.set_rng_state(rng)
  local script = ("print('H', (load(%q))(require 'attn')); print('END')"):format(ENV_SCRIPT)
  local ok, out, rc = child(table.concat(env, " "), script, 60)
  local src = "a child under " .. table.concat(env, " ")
  if rc == 124 or rc == 137 then return "e", "hung (killed after 60 s)", src end
  if not ok or not out:find("END", 1, true) then return "e", "crashed or failed: " .. out:sub(1, 400), src end
  local got = out:match("H\t(%d+)")
  if got ~= env_want then return "o", ("other bits than this process's (digest %s, here %s)"):format(got, env_want), src end
  return "o"
end

local IN_PROCESS = { coroutine = true, longlist = kind_longlist, finalizer = kind_finalizer,
  wrongself = kind_wrongself, overlap = kind_overlap }
local CHILD_KINDS = { fifo = kind_fifo, swap = kind_swap, failsave = kind_failsave, env = kind_env }

--- Every kind, in order; "calls" is the careless call sequence above.
M.KINDS = { "calls", "coroutine", "longlist", "finalizer", "wrongself", "overlap", "fifo", "swap", "failsave", "env" }

local function call_src(S, src, args)
  local parts = {}
  for i = 1, args.n do parts[i] = value_src(args[i], S.srcs) end
  return src .. "(" .. table.concat(parts, ", ") .. ")"
end

-- The kinds a run uses unless told (--kinds): every kind.
M.DEFAULT_KINDS = M.KINDS

local KIND_SET = {}
for _, k in ipairs(M.KINDS) do KIND_SET[k] = true end

-- a set of kinds from a list or "a,b,c" ("all": every kind); nil, message if unknown
function M.parse_kinds(spec)
  if spec == nil then spec = M.DEFAULT_KINDS end
  if spec == "all" then spec = M.KINDS end
  if type(spec) == "string" then
    local list = {}
    for k in spec:gmatch("[^,%s]+") do list[#list + 1] = k end
    spec = list
  end
  local set = {}
  for _, k in ipairs(spec) do
    if not KIND_SET[k] then return nil, ("unknown kind '%s' (kinds: %s, or all)"):format(k, table.concat(M.KINDS, ",")) end
    set[k] = true
  end
  return set
end

--- Run the fuzzer; returns {calls, ok, errors, failure = text or nil, kind = the failing kind}.
-- @param o table: iterations, seed, verbose, out (a function taking a line; default print),
--   kinds (a list or "a,b,c"; default M.DEFAULT_KINDS), child_every (child-process kinds run on
--   every child_every-th iteration, in turn; default 150)
function M.run(o)
  local out = o.out or print
  local seed = math.tointeger(o.seed) or 7
  local kinds = assert(M.parse_kinds(o.kinds))
  local child_every = math.tointeger(o.child_every) or CHILD_EVERY
  local child_list, inproc_list = {}, {}
  for _, k in ipairs(M.KINDS) do
    if kinds[k] and CHILD_KINDS[k] then child_list[#child_list + 1] = k end
    if kinds[k] and IN_PROCESS[k] and k ~= "coroutine" then inproc_list[#inproc_list + 1] = k end
  end
  local base_calls = kinds.calls or kinds.coroutine
  local kinds_arg = type(o.kinds) == "string" and o.kinds or table.concat(o.kinds or M.DEFAULT_KINDS, ",")
  if o.child_every then kinds_arg = kinds_arg .. " --child-every " .. child_every end
  local tmpdir = os.tmpname()
  os.remove(tmpdir)
  assert(os.execute("mkdir -p '" .. tmpdir .. "'"))
  local S = new_state(seed, tmpdir)
  local r = S.r
  if o.verbose then S.note = function(src) out("--   " .. src) end end
  local stats = { calls = 0, ok = 0, errors = 0, seed = seed, by_kind = {} }
  local outcomes = {} -- "o"/"e" per call: the run's fingerprint
  local saved_rng = attn.get_rng_state()
  attn.manual_seed(seed)
  -- a full collection first: the finalizer kind's outcome depends on when the
  -- collector runs, so a run must not inherit the garbage of what ran before it
  collectgarbage()
  local child_turn = 0
  for it = 1, o.iterations or 1000 do
    -- now and then: drop a base (keeping its views) and collect
    if r.chance(0.03) then
      for _ = 1, r.int(1, 4) do
        if #S.pool > 0 then table.remove(S.pool, r.int(1, #S.pool)) end
      end
      collectgarbage()
      if o.verbose then out(("-- %d: collectgarbage()"):format(it)) end
    end
    local kind
    if #child_list > 0 and it % child_every == 0 then
      child_turn = child_turn + 1
      kind = child_list[(child_turn - 1) % #child_list + 1]
    elseif #inproc_list > 0 and (not base_calls or r.chance(0.12)) then
      kind = r.pick(inproc_list)
    elseif base_calls then
      kind = "calls"
    end
    if kind == "calls" then
      local fn, args, src, ctx, is_method = OPS[r.int(1, #OPS)](S)
      local shown = is_method and (src .. "(" .. (function()
        local p = {}
        for i = 2, args.n do p[#p + 1] = value_src(args[i], S.srcs) end
        return table.concat(p, ", ")
      end)() .. ")") or call_src(S, src, args)
      -- coroutine: the call inside a coroutine, below a Lua stack up to 300 calls deep
      local depth = kinds.coroutine and (not kinds.calls or r.chance(0.25)) and r.int(0, 300)
      if depth then
        kind = "coroutine"
        shown = ("inside a coroutine %d Lua calls deep: %s"):format(depth, shown)
      end
      if o.verbose then out(("-- %d: %s"):format(it, shown)) ; io.stdout:flush() end
      stats.calls = stats.calls + 1
      stats.by_kind[kind] = (stats.by_kind[kind] or 0) + 1
      local res = depth and run_in_coroutine(depth, fn, args) or pack(pcall(fn, table.unpack(args, 1, args.n)))
      outcomes[#outcomes + 1] = res[1] and "o" or "e"
      if res[1] then
        stats.ok = stats.ok + 1
        for i = 2, res.n do
          local v = res[i]
          if attn.is_tensor(v) then add_tensor(S, v, shown)
          elseif nn.Module.is_module(v) then
            S.srcs[v] = shown
            if #S.mods >= MOD_MAX then table.remove(S.mods, r.int(1, #S.mods)) end
            S.mods[#S.mods + 1] = v
          end
        end
      else
        stats.errors = stats.errors + 1
        local why = bad_message(res[2], ctx)
        if why then
          stats.kind = kind
          stats.failure = ("fuzz failure (kind %s): seed %d, iteration %d: the call %s\n  %s\n  message: %s\n"
            .. "reproduce: scripts/attn-lua scripts/fuzz.lua --seed %d --iterations %d --kinds %s --verbose"):format(
            kind, seed, it, why, shown, tostring(res[2]), seed, it, kinds_arg)
          break
        end
      end
    elseif kind then
      if o.verbose then out(("-- %d: kind %s"):format(it, kind)) ; io.stdout:flush() end
      stats.calls = stats.calls + 1
      stats.by_kind[kind] = (stats.by_kind[kind] or 0) + 1
      local check = IN_PROCESS[kind] or CHILD_KINDS[kind]
      local outcome, failure, src = check(S)
      outcomes[#outcomes + 1] = outcome
      if outcome == "o" then stats.ok = stats.ok + 1 else stats.errors = stats.errors + 1 end
      if failure then
        stats.kind = kind
        stats.failure = ("fuzz failure (kind %s): seed %d, iteration %d: %s\n  %s\n"
          .. "reproduce: scripts/attn-lua scripts/fuzz.lua --seed %d --iterations %d --kinds %s --verbose"):format(
          kind, seed, it, failure, src or "", seed, it, kinds_arg)
        break
      end
    end
  end
  stats.outcomes = table.concat(outcomes)
  os.execute("rm -rf '" .. tmpdir .. "'")
  attn.set_rng_state(saved_rng)
  return stats
end

--- The autograd mode (scripts/lib/fuzz_autograd.lua): random chains of in-place
-- and out-of-place ops on leaves, views and detached aliases, their gradients
-- against an out-of-place replay. o = {iterations, seed, max_len, with_known};
-- returns {chains, agreed, errors, errors_by_kind, outcomes, failure}.
function M.run_autograd(o)
  return require("fuzz_autograd").run(o, bad_message)
end

local function main_autograd(o)
  local s = M.run_autograd(o)
  if s.failure then print(s.failure) end
  local kinds = {}
  for k, n in pairs(s.errors_by_kind) do kinds[#kinds + 1] = ("  %5d  %s"):format(n, k) end
  table.sort(kinds)
  print(("fuzz --mode autograd: %d chains, %d agreed with the replay, %d ended in an attn error at backward, seed %d%s")
    :format(s.chains, s.agreed, s.errors, s.seed, #kinds > 0 and "; steps refused with an attn error:" or ""))
  if #kinds > 0 then print(table.concat(kinds, "\n")) end
  os.exit(s.failure and 1 or 0)
end

local function main(argv)
  local o = { iterations = 1000, seed = 7, verbose = false }
  local usage = "usage: fuzz.lua --iterations N --seed S [--kinds a,b,c|all] [--child-every N] [--verbose]\n"
    .. "       fuzz.lua --mode autograd --iterations N --seed S [--max-len N] [--with-known] [--emit-torch FILE.py]\n"
    .. "kinds: " .. table.concat(M.KINDS, ",") .. " (default " .. table.concat(M.DEFAULT_KINDS, ",") .. ")\n"
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--iterations" then o.iterations = math.tointeger(tonumber(argv[i + 1])); i = i + 2
    elseif a == "--seed" then o.seed = math.tointeger(tonumber(argv[i + 1])); i = i + 2
    elseif a == "--kinds" then o.kinds = argv[i + 1] or ""; i = i + 2
    elseif a == "--child-every" then
      o.child_every = math.tointeger(tonumber(argv[i + 1]))
      if not o.child_every or o.child_every < 1 then io.stderr:write("fuzz.lua: --child-every takes a positive integer\n"); os.exit(2) end
      i = i + 2
    elseif a == "--verbose" then o.verbose = true; i = i + 1
    elseif a == "--mode" and (argv[i + 1] == "autograd" or argv[i + 1] == "api") then o.mode = argv[i + 1]; i = i + 2
    elseif a == "--with-known" then o.with_known = true; i = i + 1
    elseif a == "--emit-torch" and argv[i + 1] then o.emit_torch = argv[i + 1]; i = i + 2
    elseif a == "--max-len" then
      o.max_len = math.tointeger(tonumber(argv[i + 1]))
      if not o.max_len or o.max_len < 2 then io.stderr:write("fuzz.lua: --max-len takes an integer >= 2\n"); os.exit(2) end
      i = i + 2
    else io.stderr:write(usage); os.exit(2) end
    if o.iterations == nil or o.seed == nil then
      io.stderr:write("fuzz.lua: --iterations and --seed take integers\n"); os.exit(2)
    end
  end
  if o.mode == "autograd" then return main_autograd(o) end
  local _, err = M.parse_kinds(o.kinds)
  if err then io.stderr:write("fuzz.lua: " .. err .. "\n"); os.exit(2) end
  local s = M.run(o)
  if s.failure then print(s.failure) end
  local kinds = {}
  for _, k in ipairs(M.KINDS) do if s.by_kind[k] then kinds[#kinds + 1] = k .. " " .. s.by_kind[k] end end
  print(("fuzz: %d calls, %d ok, %d errors, seed %d (%s)"):format(s.calls, s.ok, s.errors, s.seed, table.concat(kinds, ", ")))
  os.exit(s.failure and 1 or 0)
end

-- the command line (scripts/fuzz.lua): M.main(arg)
M.main = main

return M
