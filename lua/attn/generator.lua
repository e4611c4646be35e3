--- Random generators of their own, as `torch.Generator()`: a stream apart
-- from attn's global one (attn.manual_seed), with the same algorithm, so
-- that the same seed gives the same draws as PyTorch's generator.
--
--   local g = attn.Generator():manual_seed(123)
--   attn.data.DataLoader(ds, {batch_size = 8, shuffle = true, generator = g})
--
-- A generator's state is attn.get_rng_state's string, kept out of the
-- user's reach (a weak table by generator); a draw from it runs on the
-- global generator with that state swapped in, then swaps the global state
-- back, so the global stream is as it was.
-- @module attn.generator
local core = require "attn.core"
local caller = require "attn.caller"
local argcheck = require "attn.argcheck"

local M = {}

-- torch.Generator()'s seed before manual_seed (default_rng_seed_val)
local DEFAULT_SEED = 67280421310721

local Generator = {}
Generator.__index = Generator
Generator.__name = "attn.Generator"
--- The metatable of generators, holding their methods (manual_seed,
-- initial_seed, get_state, set_state).
M.Generator_mt = Generator

-- generator -> its state string
local states = setmetatable({}, {__mode = "k"})

--- True when x is an attn.Generator (one that attn.Generator() made).
function M.is_generator(x) return getmetatable(x) == Generator and states[x] ~= nil end
local is_generator = M.is_generator

-- fn() run on the global generator with g's state in it; g keeps the state
-- fn leaves and the global generator gets its own back, on an error too.
local function on(g, fn, ...)
  local saved = core.get_rng_state()
  core.set_rng_state(states[g])
  local ok, r = pcall(fn, ...)
  states[g] = core.get_rng_state()
  core.set_rng_state(saved)
  if not ok then error(r, 0) end
  return r
end

local function check_self(fname, g)
  if not is_generator(g) then argcheck.arg_error(fname, 1, "self", "attn.Generator", argcheck.typename(g)) end
end

local function check_seed(fname, s)
  if math.type(s) ~= "integer" then
    caller.error(("%s: bad argument #2 'seed' (expected an integer, got %s)"):format(fname, argcheck.describe(s)))
  end
end

--- A new generator seeded with torch.Generator()'s default seed
-- (67280421310721); `g:manual_seed(s)` seeds it as torch does.
-- @return an attn.Generator
function M.new(...)
  argcheck.check_nargs("attn.Generator", 0, select("#", ...))
  local g = setmetatable({}, Generator)
  local saved = core.get_rng_state()
  core.manual_seed(DEFAULT_SEED)
  states[g] = core.get_rng_state()
  core.set_rng_state(saved)
  return g
end

--- Seeds the generator as `torch.Generator().manual_seed(s)`; returns it.
-- @param seed an integer (negative ones as 64-bit two's complement, as torch)
function Generator.manual_seed(...)
  local g, s = ...
  argcheck.check_nargs("Generator:manual_seed", 2, select("#", ...))
  check_self("Generator:manual_seed", g)
  check_seed("Generator:manual_seed", s)
  on(g, core.manual_seed, s)
  return g
end

--- The seed it was last seeded with, as `g.initial_seed()`.
function Generator.initial_seed(...)
  local g = ...
  argcheck.check_nargs("Generator:initial_seed", 1, select("#", ...))
  check_self("Generator:initial_seed", g)
  return on(g, core.initial_seed)
end

--- Its state, a string that `g:set_state` (or attn.set_rng_state) takes.
function Generator.get_state(...)
  local g = ...
  argcheck.check_nargs("Generator:get_state", 1, select("#", ...))
  check_self("Generator:get_state", g)
  return states[g]
end

--- Restores a state from `g:get_state()` or attn.get_rng_state(); returns g.
function Generator.set_state(...)
  local g, state = ...
  argcheck.check_nargs("Generator:set_state", 2, select("#", ...))
  check_self("Generator:set_state", g)
  if type(state) ~= "string" then
    caller.error(("Generator:set_state: bad argument #2 'state' (expected a string from get_state, got %s)"):format(
      argcheck.typename(state)))
  end
  local ok, err = pcall(core.check_rng_state, state)
  if not ok then
    caller.error("Generator:set_state: bad argument #2 'state' (" .. tostring(err):gsub("^.-attn%.check_rng_state: ", "")
      .. ")")
  end
  states[g] = state
  return g
end

function Generator.__tostring(g) return "attn.Generator(initial_seed = " .. tostring(g:initial_seed()) .. ")" end

-- ---- draws for the Lua layer (g nil: the global generator) --------------------

local function int64_seed()
  local hi, lo = table.unpack(core.rng_raw_u32(2))
  return ((hi & 0x7FFFFFFF) << 32) | lo
end

--- `torch.empty((), dtype=torch.int64).random_(generator=g).item()`: one
-- 64-bit draw (high word first) modulo 2^63, two 32-bit outputs.
function M.random_int64(g)
  if g == nil then return int64_seed() end
  return on(g, int64_seed)
end

--- `torch.randperm(n, generator=g)` + 1 as a Lua table of 1..n.
function M.randperm(g, n)
  local perm = g == nil and core.randperm(n) or on(g, core.randperm, n)
  local out = perm:totable()
  for i = 1, n do out[i] = math.tointeger(out[i]) end
  return out
end

return M
