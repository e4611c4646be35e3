--- Training checkpoints: a model, its optimizer and the generator state in
-- one safetensors file, so that a run stopped after step s and resumed
-- gives the bits of the run that never stopped (scripts/train_gpt.lua).
--
--   local checkpoint = require "attn.checkpoint"
--   checkpoint.save(path, model, opt, {step = 100})   -- extra: string -> value
--   local extra = checkpoint.load(path, model, opt)   -- the model and opt built as before
--
-- Tensors: "model.NAME" (the model's state_dict), "optim.I.KEY" (the
-- optimizer's per-parameter tensors, I its 1-based parameter index).
-- Metadata (strings): "format", "cfg.KEY" (the model's cfg, when it has one),
-- "optim.class", "optim.group.G.KEY" (group options), "optim.state.I.KEY"
-- (numbers such as step), "rng" (attn.get_rng_state() in hex), "extra.KEY"
-- with "extra_type.KEY" (string, integer, float, boolean or table: extra
-- values come back with their types; a table is written in the format of
-- encode_table below). Values are read back with the types of the live
-- model's cfg and optimizer's options: nothing in the file is evaluated.
--
-- A load is all or nothing: the file, the config, the model's tensors, the
-- optimizer's options and state, the generator state and the extra values
-- are all read and checked before the first change, so a checkpoint of
-- another config, optimizer class or parameter shapes, or a damaged one, is
-- an error naming what is wrong, and the model, the optimizer and the
-- generator are then as they were.
-- @module attn.checkpoint
local attn = require "attn"
local argcheck = require "attn.argcheck"

local M = {}
local FORMAT = "attn-checkpoint-1"

local function fail(fname, fmt, ...)
  argcheck.fail("attn.checkpoint." .. fname, fmt, ...)
end

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end
local function unhex(s)
  if #s % 2 == 1 or s:find("[^0-9a-f]") then return nil end
  return (s:gsub("..", function(h) return string.char(tonumber(h, 16)) end))
end

-- a scalar (or a list of numbers) as text, exactly (%.17g round-trips doubles)
local function encode(v)
  if type(v) == "number" then
    return math.type(v) == "integer" and tostring(v) or ("%.17g"):format(v)
  elseif type(v) == "boolean" then
    return tostring(v)
  elseif type(v) == "string" then
    return v
  elseif type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = encode(x) end
    return table.concat(parts, ",")
  end
  return nil
end

-- text back to a value of the type of `like` (nil when it does not parse)
local function decode(s, like)
  if type(s) ~= "string" then return nil end
  if type(like) == "number" then
    local n = tonumber(s)
    if n and math.type(like) == "integer" then n = math.tointeger(n) end
    return n
  elseif type(like) == "boolean" then
    if s == "true" then return true elseif s == "false" then return false end
    return nil
  elseif type(like) == "string" then
    return s
  elseif type(like) == "table" then
    local out = {}
    for part in (s .. ","):gmatch("([^,]*),") do
      local n = tonumber(part)
      if not n then return nil end
      out[#out + 1] = n
    end
    if #out ~= #like then return nil end
    return out
  end
  return nil
end

-- ---- extra values ------------------------------------------------------------

-- Nesting deeper than this is refused at save and taken for damage at load
-- (the reader is recursive).
local MAX_DEPTH = 100
-- A table whose subtables are shared would be written once per reference:
-- past this many values it is refused rather than grow without bound.
local MAX_PIECES = 1 << 24

local function float_text(x)
  if x ~= x then return "nan" elseif x == math.huge then return "inf" elseif x == -math.huge then return "-inf" end
  return ("%.17g"):format(x)
end

local function float_value(s)
  if s == "nan" then return 0 / 0 elseif s == "inf" then return math.huge elseif s == "-inf" then return -math.huge end
  if not s:find("^%-?[%d.]+[eE]?[-+]?%d*$") then return nil end
  -- read as a float ("-0" must stay -0.0, which an integer read would lose)
  local n = tonumber(s:find("[.eE]") and s or s .. ".0")
  return n
end

local function integer_value(s)
  if not s:find("^%-?%d+$") then return nil end
  return math.tointeger(tonumber(s))
end

-- where a nested value sits, for errors: key, key.name, key[3], key["a b"]
local function path_of(prefix, k)
  if type(k) == "string" and k:find("^[%a_][%w_]*$") then return prefix .. "." .. k end
  if type(k) == "string" then return ("%s[%q]"):format(prefix, k) end
  return ("%s[%s]"):format(prefix, type(k) == "number" and math.type(k) == "float" and float_text(k) or tostring(k))
end

local UNSUPPORTED = "%s: expected a string, number, boolean or table of them, got %s"
local NOT_UTF8 = "%s: expected a string of valid UTF-8 (safetensors metadata must be), got one that is not"

local TYPE_RANK = {boolean = 1, number = 2, string = 3}
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return TYPE_RANK[ta] < TYPE_RANK[tb] end
  if ta == "boolean" then return not a and b end
  return a < b
end

-- A table as text, exactly and without evaluation at load: each key then its
-- value, inside "{" "}", keys in a fixed order; a value is "s" LEN ":" BYTES,
-- "i" INTEGER ";", "f" %.17g-or-inf-or-nan ";", "b1", "b0" or a table. Errors
-- (as messages) name the path of the value that cannot be written.
local function encode_table(t, path, depth, open, out)
  if #out > MAX_PIECES then
    return nil, ("%s: expected at most %d values in all, got more"):format(path, MAX_PIECES)
  end
  if depth > MAX_DEPTH then
    return nil, ("%s...: expected tables nested at most %d deep, got deeper"):format(path:sub(1, 60), MAX_DEPTH)
  end
  if open[t] then return nil, ("%s: expected a table without cycles, got one that contains itself"):format(path) end
  open[t] = true
  local keys = {}
  for k in next, t do
    if not TYPE_RANK[type(k)] then
      return nil, ("%s: expected string, number or boolean keys, got a %s key"):format(path, type(k))
    end
    keys[#keys + 1] = k
  end
  table.sort(keys, key_less)
  out[#out + 1] = "{"
  for _, k in ipairs(keys) do
    for _, v in ipairs({k, rawget(t, k)}) do
      local tv, where = type(v), path_of(path, k)
      if tv == "string" then
        if not utf8.len(v) then return nil, NOT_UTF8:format(where) end
        out[#out + 1] = ("s%d:%s"):format(#v, v)
      elseif math.type(v) == "integer" then
        out[#out + 1] = ("i%d;"):format(v)
      elseif tv == "number" then
        out[#out + 1] = ("f%s;"):format(float_text(v))
      elseif tv == "boolean" then
        out[#out + 1] = v and "b1" or "b0"
      elseif tv == "table" and not attn.is_tensor(v) then
        local ok, err = encode_table(v, where, depth + 1, open, out)
        if not ok then return nil, err end
      else
        return nil, UNSUPPORTED:format(where, attn.is_tensor(v) and "an attn.Tensor" or "a " .. tv)
      end
    end
  end
  out[#out + 1] = "}"
  open[t] = nil
  return true
end

-- The reader of encode_table's text: the value at position i and the
-- position after it, or nil and what is wrong.
local function decode_value(s, i, depth)
  local c = s:sub(i, i)
  if c == "s" then
    local len, at = s:match("^(%d+):()", i + 1)
    len = len and math.tointeger(tonumber(len))
    if not len or at + len - 1 > #s then return nil, ("a bad string at byte %d"):format(i) end
    return s:sub(at, at + len - 1), at + len
  elseif c == "i" or c == "f" then
    local text, after = s:match("^([^;]*);()", i + 1)
    local v = text and (c == "i" and integer_value(text) or c == "f" and float_value(text))
    if v == nil then return nil, ("a bad number at byte %d"):format(i) end
    return v, after
  elseif c == "b" then
    local b = s:sub(i + 1, i + 1)
    if b ~= "0" and b ~= "1" then return nil, ("a bad boolean at byte %d"):format(i) end
    return b == "1", i + 2
  elseif c == "{" then
    if depth > MAX_DEPTH then return nil, ("tables nested more than %d deep"):format(MAX_DEPTH) end
    local t = {}
    i = i + 1
    while s:sub(i, i) ~= "}" do
      if i > #s then return nil, "a table that does not end" end
      local k, v, err
      k, i = decode_value(s, i, depth + 1)
      if k == nil then return nil, i end
      if type(k) == "table" or k ~= k then return nil, "a key that is a table or NaN" end
      v, err = decode_value(s, i, depth + 1)
      if v == nil then return nil, err end
      i = err
      t[k] = v
    end
    return t, i + 1
  end
  return nil, ("an unknown value at byte %d"):format(i)
end

-- An extra value as (text, type name), or nil and what is wrong.
local function encode_extra(where, v)
  local tv = type(v)
  if tv == "string" then
    if not utf8.len(v) then return nil, NOT_UTF8:format(where) end
    return v, "string"
  elseif math.type(v) == "integer" then
    return tostring(v), "integer"
  elseif tv == "number" then
    return float_text(v), "float"
  elseif tv == "boolean" then
    return tostring(v), "boolean"
  elseif tv == "table" and not attn.is_tensor(v) then
    local out = {}
    local ok, err = encode_table(v, where, 1, {}, out)
    if not ok then return nil, err end
    return table.concat(out), "table"
  end
  return nil, UNSUPPORTED:format(where, attn.is_tensor(v) and "an attn.Tensor" or "a " .. tv)
end

-- An extra value back from its text and type name (nil and what is wrong
-- when they do not fit); no type name: a checkpoint written before types were
-- recorded, where a text that reads as a number was a number.
local function decode_extra(text, kind)
  if kind == nil then return tonumber(text) or text end
  if kind == "string" then return text end
  if kind == "integer" then return integer_value(text) end
  if kind == "float" then return float_value(text) end
  if kind == "boolean" then
    if text == "true" then return true elseif text == "false" then return false end
    return nil
  end
  if kind == "table" then
    local v, after = decode_value(text, 1, 1)
    if type(v) ~= "table" then return nil, after end
    if after ~= #text + 1 then return nil, ("text after the table at byte %d"):format(after) end
    return v
  end
  return nil, ("an unknown type %q"):format(kind)
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function check_args(fname, path, model, optimizer, extra)
  if type(path) ~= "string" then fail(fname, "bad argument #1 'path' (expected a string, got %s)", type(path)) end
  if not attn.nn.Module.is_module(model) then
    fail(fname, "bad argument #2 'model' (expected an attn.nn module, got %s)", type(model))
  end
  if optimizer ~= nil and (type(optimizer) ~= "table" or type(optimizer.state_dict) ~= "function") then
    fail(fname, "bad argument #3 'optimizer' (expected an attn.optim optimizer or nil, got %s)", type(optimizer))
  end
  if extra ~= nil and type(extra) ~= "table" then
    fail(fname, "bad argument #4 'extra' (expected a table string -> value, got %s)", type(extra))
  end
end

--- Writes model (+ optimizer, + the generator state, + extra) to path.
-- @param path a file name
-- @param model an attn.nn module (its cfg, when it has one, is recorded)
-- @param[opt] optimizer an attn.optim optimizer over model's parameters
-- @param[opt] extra a table string -> value (e.g. {step = 100}): strings
-- (valid UTF-8), integers, floats, booleans and tables of them (string,
-- number or boolean keys, no cycles, at most 100 deep) come back from load
-- with their types; anything else is an error naming the key
function M.save(path, model, optimizer, extra)
  check_args("save", path, model, optimizer, extra)
  local tensors, meta = {}, {format = FORMAT, rng = hex(attn.get_rng_state())}
  for name, t in pairs(model:state_dict()) do tensors["model." .. name] = t end
  if type(model.cfg) == "table" then
    for k, v in pairs(model.cfg) do meta["cfg." .. k] = encode(v) end
  end
  if optimizer then
    local sd = optimizer:state_dict()
    meta["optim.class"] = optimizer.__name
    for g, group in ipairs(sd.param_groups) do
      for k, v in pairs(group) do
        if k ~= "params" then meta[("optim.group.%d.%s"):format(g, k)] = encode(v) end
      end
    end
    for i, s in pairs(sd.state) do
      for k, v in pairs(s) do
        if attn.is_tensor(v) then tensors[("optim.%d.%s"):format(i, k)] = v
        else meta[("optim.state.%d.%s"):format(i, k)] = encode(v) end
      end
    end
  end
  for k, v in pairs(extra or {}) do
    if type(k) ~= "string" or not utf8.len(k) then
      fail("save", "bad argument #4 'extra' (expected string keys of valid UTF-8, got the %s key %s)", type(k),
        type(k) == "string" and ("%q"):format(k) or tostring(k))
    end
    local text, kind = encode_extra("extra." .. k, v)
    if not text then fail("save", "bad argument #4 'extra' (%s)", kind) end
    meta["extra." .. k], meta["extra_type." .. k] = text, kind
  end
  local ok, err = pcall(attn.save_safetensors, path, tensors, meta)
  if not ok then fail("save", "%s", (tostring(err):gsub("^.-attn%.save_safetensors: ", ""))) end
end

-- the metadata value text of a state field as a number where it reads as one
-- (an integer where it is written as one), else the text: the optimizer's
-- load_state_dict checks it
local function state_value(text)
  return integer_value(text) or float_value(text) or tonumber(text) or text
end

--- Restores a checkpoint written by save into model (and optimizer, and the
-- generator), which must be built as the saved ones were; returns extra.
-- All or nothing: everything is read and checked before the first change;
-- on an error the model, the optimizer and the generator are as they were.
-- @param path a file name
-- @param model an attn.nn module of the saved config
-- @param[opt] optimizer an optimizer of the saved class over model's parameters
-- @return the extra table given to save, its values with their types
function M.load(path, model, optimizer)
  check_args("load", path, model, optimizer, nil)
  local ok, tensors, meta = pcall(attn.load_safetensors, path)
  if not ok then fail("load", "%s", (tostring(tensors):gsub("^.-attn%.load_safetensors: ", ""))) end
  meta = meta or {}
  if meta.format ~= FORMAT then
    fail("load", "%s is not an attn checkpoint (metadata 'format' is %s, expected %q)", path,
      meta.format and ("%q"):format(meta.format) or "missing", FORMAT)
  end
  -- the config: every key of the live model's cfg, with the same value
  if type(model.cfg) == "table" then
    for _, k in ipairs(sorted_keys(model.cfg)) do
      local here = model.cfg[k]
      local there = meta["cfg." .. k]
      if there == nil or decode(there, here) ~= here then
        fail("load", "%s was saved from another config: %s = %s there, %s here", path, k,
          there or "missing", encode(here))
      end
    end
  end
  local state = {}
  for name, t in pairs(tensors) do
    local pname = name:match("^model%.(.+)$")
    if pname then state[pname] = t end
  end
  local sd
  if optimizer then
    if meta["optim.class"] ~= optimizer.__name then
      fail("load", "%s holds the state of %s, not of %s", path, meta["optim.class"] or "no optimizer",
        optimizer.__name)
    end
    sd = optimizer:state_dict()
    for g, group in ipairs(sd.param_groups) do
      for k, v in pairs(group) do
        if k ~= "params" then
          local there = meta[("optim.group.%d.%s"):format(g, k)]
          local value = decode(there, v)
          if value == nil then fail("load", "%s: optimizer option '%s' of group %d is missing or unreadable", path, k, g) end
          group[k] = value
        end
      end
    end
    sd.state = {}
    for name, t in pairs(tensors) do
      local i, key = name:match("^optim%.(%d+)%.(.+)$")
      if i then
        i = tonumber(i)
        sd.state[i] = sd.state[i] or {}
        sd.state[i][key] = t
      end
    end
    for k, v in pairs(meta) do
      local i, key = k:match("^optim%.state%.(%d+)%.(.+)$")
      if i then
        i = tonumber(i)
        sd.state[i] = sd.state[i] or {}
        sd.state[i][key] = state_value(v)
      end
    end
  end
  local rng = meta.rng and unhex(meta.rng)
  if not rng then fail("load", "%s: the generator state (metadata 'rng') is missing or not hex", path) end
  local okr, rerr = pcall(attn.check_rng_state, rng)
  if not okr then
    fail("load", "%s: the generator state (metadata 'rng') is unusable: %s", path,
      (tostring(rerr):gsub("^.-attn%.check_rng_state: ", "")))
  end
  local extra = {}
  for k, v in pairs(meta) do
    local key = k:match("^extra%.(.+)$")
    if key then
      local value, why = decode_extra(v, meta["extra_type." .. key])
      if value == nil then
        fail("load", "%s: extra '%s' is unreadable as a %s%s", path, key, meta["extra_type." .. key],
          why and " (" .. why .. ")" or "")
      end
      extra[key] = value
    end
  end
  -- every check before any change: the model's tensors (strict), the
  -- optimizer's options and state; then the changes, none of which can fail
  local okm, apply_model = pcall(model.prepare_load_state_dict, model, state, true)
  if not okm then fail("load", "%s: %s", path, (tostring(apply_model):gsub("^.-:load_state_dict: ", ""))) end
  local apply_optimizer
  if optimizer then
    local oko, res = pcall(optimizer.prepare_load_state_dict, optimizer, sd)
    if not oko then fail("load", "%s: %s", path, (tostring(res):gsub("^.-:load_state_dict: ", ""))) end
    apply_optimizer = res
  end
  apply_model()
  if apply_optimizer then apply_optimizer() end
  attn.set_rng_state(rng)
  return extra
end

return M
