--- Training checkpoints: a model, its optimizer and the generator state in
-- one safetensors file, so that a run stopped after step s and resumed
-- gives the bits of the run that never stopped (scripts/train_gpt.lua).
--
--   local checkpoint = require "attn.checkpoint"
--   checkpoint.save(path, model, opt, {step = 100})   -- extra: string -> number/string
--   local extra = checkpoint.load(path, model, opt)   -- the model and opt built as before
--
-- Tensors: "model.NAME" (the model's state_dict), "optim.I.KEY" (the
-- optimizer's per-parameter tensors, I its 1-based parameter index).
-- Metadata (strings): "format", "cfg.KEY" (the model's cfg, when it has one),
-- "optim.class", "optim.group.G.KEY" (group options), "optim.state.I.KEY"
-- (numbers such as step), "rng" (attn.get_rng_state() in hex), "extra.KEY".
-- Values are read back with the types of the live model's cfg and
-- optimizer's options: nothing in the file is evaluated. A checkpoint of
-- another config, optimizer class or parameter shapes is an error naming
-- what differs; nothing is changed then (the model's tensors are copied
-- only after every check passed).
-- @module attn.checkpoint
local attn = require "attn"
local caller = require "attn.caller"

local M = {}
local FORMAT = "attn-checkpoint-1"

local function fail(fname, fmt, ...)
  caller.error(("attn.checkpoint.%s: " .. fmt):format(fname, ...))
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
    fail(fname, "bad argument #4 'extra' (expected a table string -> number or string, got %s)", type(extra))
  end
end

--- Writes model (+ optimizer, + the generator state, + extra) to path.
-- @param path a file name
-- @param model an attn.nn module (its cfg, when it has one, is recorded)
-- @param[opt] optimizer an attn.optim optimizer over model's parameters
-- @param[opt] extra a table string -> number or string (e.g. {step = 100})
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
    if type(k) ~= "string" or (type(v) ~= "number" and type(v) ~= "string") then
      fail("save", "bad argument #4 'extra' (expected string keys with number or string values, got %s = %s)",
        tostring(k), type(v))
    end
    meta["extra." .. k] = encode(v)
  end
  local ok, err = pcall(attn.save_safetensors, path, tensors, meta)
  if not ok then fail("save", "%s", (tostring(err):gsub("^.-attn%.save_safetensors: ", ""))) end
end

--- Restores a checkpoint written by save into model (and optimizer, and the
-- generator), which must be built as the saved ones were; returns extra
-- (numbers where they parse as numbers).
-- @param path a file name
-- @param model an attn.nn module of the saved config
-- @param[opt] optimizer an optimizer of the saved class over model's parameters
-- @return the extra table given to save
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
    local live_state = sd.state
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
        local like = live_state[i] and live_state[i][key]
        local value = decode(v, like ~= nil and like or 0)
        if value == nil then fail("load", "%s: optimizer state '%s' of parameter %d is unreadable", path, key, i) end
        sd.state[i][key] = value
      end
    end
  end
  local rng = meta.rng and unhex(meta.rng)
  if not rng then fail("load", "%s: the generator state (metadata 'rng') is missing or not hex", path) end
  -- every check before any change: the model's tensors (strict), the optimizer's, then the generator
  local okm, err = pcall(model.load_state_dict, model, state, true)
  if not okm then fail("load", "%s: %s", path, (tostring(err):gsub("^.-:load_state_dict: ", ""))) end
  if optimizer then
    local oko, oerr = pcall(optimizer.load_state_dict, optimizer, sd)
    if not oko then fail("load", "%s: %s", path, (tostring(oerr):gsub("^.-:load_state_dict: ", ""))) end
  end
  attn.set_rng_state(rng)
  local extra = {}
  for k, v in pairs(meta) do
    local key = k:match("^extra%.(.+)$")
    if key then extra[key] = tonumber(v) or v end
  end
  return extra
end

return M
