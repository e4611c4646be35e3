--- attn.optim.Optimizer: what SGD, Adam and AdamW share (PyTorch's
-- torch.optim.Optimizer): parameter groups, per-parameter state, step(),
-- zero_grad() and state_dict() / load_state_dict() for a bit-exact resume.
--
-- `params` is a list of tensors (`model:parameters()`), or a list of groups
-- `{params = {...}, lr = ...}` whose options override the constructor's.
-- `opt.param_groups[i]` holds a group's `params` and its options (change
-- `lr` there to schedule it). The update arithmetic is in the C kernels of
-- attn.core.train (src/core/optim.c), torch 1.13's float32 single-tensor path.
-- @classmod attn.optim.Optimizer
local attn = require "attn"
local argcheck = require "attn.argcheck"

local Optimizer = {}
Optimizer.__index = Optimizer

-- what came, in messages: numbers and booleans by value, strings quoted
local describe = argcheck.describer{strings = true, booleans = true}
Optimizer.describe = describe

-- The error of fname at the user's call of the class or method.
local fail = argcheck.fail
Optimizer.fail = fail

--- A subclass named `name` whose options are `spec`: a list of
-- {name, default, check(v) -> message or nil}; a default of nil means required.
function Optimizer.extend(name, spec)
  local cls = {__name = name, spec = spec}
  cls.__index = cls
  cls.__tostring = Optimizer.__tostring
  return setmetatable(cls, {
    __index = Optimizer,
    __call = function(c, ...) return Optimizer.new(c, ...) end,
    __tostring = function() return "class attn.optim." .. name end,
  })
end

-- options of a group: those given (checked), else the defaults
local function group_options(cls, fname, given, defaults, where)
  local known = {}
  for _, s in ipairs(cls.spec) do known[s[1]] = s end
  for k in pairs(given) do
    if k ~= "params" and not known[k] then
      local names = {}
      for _, s in ipairs(cls.spec) do names[#names + 1] = s[1] end
      fail(fname, "unknown option '%s'%s (known: %s)", tostring(k), where, table.concat(names, ", "))
    end
  end
  local out = {}
  for _, s in ipairs(cls.spec) do
    local v = given[s[1]]
    if v == nil then v = defaults[s[1]] end
    if v == nil then fail(fname, "option '%s' is required%s", s[1], where) end
    local msg = s[3](v)
    if msg then fail(fname, "bad option '%s'%s (expected %s, got %s)", s[1], where, msg, describe(v)) end
    out[s[1]] = v
  end
  if cls.check_group then
    local msg = cls.check_group(out)
    if msg then fail(fname, "%s%s", msg, where) end
  end
  return out
end

function Optimizer.new(cls, params, opts, ...)
  local fname = "attn.optim." .. cls.__name
  if select("#", ...) > 0 then fail(fname, "bad argument #3 (no more than 2 arguments expected: params, opts)") end
  if type(params) ~= "table" or attn.is_tensor(params) or getmetatable(params) ~= nil then
    fail(fname, "bad argument #1 'params' (expected a list of tensors, e.g. model:parameters(), got %s)", describe(params))
  end
  if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
    fail(fname, "bad argument #2 'opts' (expected a table of options, got %s)", describe(opts))
  end
  opts = opts or {}
  local defaults = {}
  for _, s in ipairs(cls.spec) do defaults[s[1]] = s[2] end
  local base = group_options(cls, fname, opts, defaults, "")
  local groups_given = #params > 0 and not attn.is_tensor(params[1]) and type(params[1]) == "table"
  local list = groups_given and params or {{params = params}}
  local self = setmetatable({param_groups = {}, state = {}}, cls)
  local seen, count = {}, 0
  for gi, g in ipairs(list) do
    local where = groups_given and (" of param group %d"):format(gi) or ""
    if type(g) ~= "table" or attn.is_tensor(g) or type(g.params) ~= "table" then
      fail(fname, "bad argument #1 'params' (element %d: expected a param group {params = {...}, ...}, got %s)", gi,
        describe(g))
    end
    local group = group_options(cls, fname, g, base, where)
    group.params = {}
    local ps = attn.is_tensor(g.params) and {g.params} or g.params
    for i, p in ipairs(ps) do
      if not attn.is_tensor(p) then
        fail(fname, "bad argument #1 'params' (element %d%s is not an attn.Tensor, got %s)", i, where, describe(p))
      end
      -- as PyTorch 1.13: a computed tensor gets no .grad, so stepping it would do nothing
      if not p.is_leaf then
        fail(fname, "bad argument #1 'params' (element %d%s is not a leaf tensor: can't optimize a non-leaf tensor; "
          .. "optimize the leaves it was computed from, or a detached copy)", i, where)
      end
      if seen[p] then fail(fname, "bad argument #1 'params' (a parameter appears more than once: element %d%s)", i, where) end
      seen[p] = true
      count = count + 1
      group.params[i] = p
    end
    self.param_groups[gi] = group
  end
  if count == 0 then fail(fname, "bad argument #1 'params' (got an empty parameter list)") end
  return self
end

--- One update of every parameter whose `.grad` is not nil, in place (with
-- gradient recording off). `closure` (optional) is called first and its
-- result returned, as torch's step(closure).
function Optimizer:step(closure)
  local loss
  if closure ~= nil then loss = closure() end
  attn.no_grad(function()
    for _, group in ipairs(self.param_groups) do
      for _, p in ipairs(group.params) do
        local g = p.grad
        if g ~= nil then
          self.state[p] = self.state[p] or {}
          self:update(p, g, group, self.state[p])
        end
      end
    end
  end)
  return loss
end

--- Sets the `.grad` of every parameter to nil.
function Optimizer:zero_grad()
  for _, group in ipairs(self.param_groups) do
    for _, p in ipairs(group.params) do p.grad = nil end
  end
end

--- The optimizer's state as a table: `state[i]` for the i-th parameter
-- (1-based, in param_groups order) that has state (its step count and
-- tensors: the optimizer's own, not copies), `param_groups[g]` the options
-- of group g with `params` = the parameters' indices.
function Optimizer:state_dict()
  local sd, index = {state = {}, param_groups = {}}, 0
  for gi, group in ipairs(self.param_groups) do
    local g = {params = {}}
    for k, v in pairs(group) do
      if k ~= "params" then g[k] = type(v) == "table" and table.move(v, 1, #v, 1, {}) or v end
    end
    for _, p in ipairs(group.params) do
      index = index + 1
      g.params[#g.params + 1] = index
      local s = self.state[p]
      if s and next(s) then
        local copy = {}
        for k, v in pairs(s) do copy[k] = v end
        sd.state[index] = copy
      end
    end
    sd.param_groups[gi] = g
  end
  return sd
end

-- The largest step count accepted: past 2^53 a double no longer holds every integer.
local MAX_COUNT = 2 ^ 53

-- A step count as an integer, or nil: a number that is an exact integer in
-- [0, 2^53], or a one-element tensor holding one (PyTorch 1.13 keeps Adam's
-- `step` as a float32 tensor of shape []).
local function count_value(v)
  if attn.is_tensor(v) then
    if v:numel() ~= 1 then return nil end
    v = v:item()
  end
  if type(v) ~= "number" or v ~= v or v < 0 or v > MAX_COUNT or v ~= math.floor(v) then return nil end
  return math.tointeger(v)
end

-- The checks of load_state_dict, then a function that makes the load (see
-- prepare_load_state_dict).
local function prepare_load(self, sd)
  local fname = "attn.optim." .. self.__name .. ":load_state_dict"
  if type(sd) ~= "table" or type(sd.state) ~= "table" or type(sd.param_groups) ~= "table" then
    fail(fname, "bad argument #1 'state_dict' (expected a table {state = ..., param_groups = ...}, got %s)",
      describe(sd))
  end
  if #sd.param_groups ~= #self.param_groups then
    fail(fname, "the state dict has %d param group(s), the optimizer %d", #sd.param_groups, #self.param_groups)
  end
  local params, groups = {}, {}
  for gi, group in ipairs(self.param_groups) do
    local g = sd.param_groups[gi]
    if type(g) ~= "table" or type(g.params) ~= "table" or #g.params ~= #group.params then
      fail(fname, "param group %d of the state dict has %s parameter(s), the optimizer's %d", gi,
        type(g) == "table" and type(g.params) == "table" and tostring(#g.params) or "no", #group.params)
    end
    groups[gi] = group_options(getmetatable(self), fname, g, group, (" in param group %d"):format(gi))
    for i, p in ipairs(group.params) do params[g.params[i]] = p end
  end
  -- in a fixed order (indices, then field names), so that the first problem reported is always the same
  local indices = {}
  for index in pairs(sd.state) do indices[#indices + 1] = index end
  table.sort(indices, function(a, b) return tostring(a) < tostring(b) end)
  local counts = self.count_fields or {}
  local state = {}
  for _, index in ipairs(indices) do
    local s = sd.state[index]
    local p = params[index]
    if not p then fail(fname, "the state dict has state for parameter %s, which no param group lists", tostring(index)) end
    if type(s) ~= "table" then fail(fname, "state %s is not a table (got %s)", tostring(index), describe(s)) end
    local copy, keys = {}, {}
    for k in pairs(s) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      local v = s[k]
      if counts[k] then
        -- a count the next step increments: anything else would make the update's
        -- bias corrections wrong (or NaN), or make the step start over from zero
        local n = count_value(v)
        if n == nil then
          local got = math.type(v) == "float" and ("%.17g"):format(v) or describe(v)
          if attn.is_tensor(v) then
            got = v:numel() == 1 and ("a tensor holding %.17g"):format(v:item())
              or ("a tensor of shape [%s]"):format(table.concat(v:size(), ", "))
          end
          fail(fname, "bad state '%s' of parameter %s (expected an integer in [0, 2^53] or a one-element tensor "
            .. "holding one, got %s)", tostring(k), tostring(index), got)
        end
        copy[k] = n
      elseif attn.is_tensor(v) then
        local a, b = v:size(), p:size()
        local same = #a == #b
        for d = 1, #a do same = same and a[d] == b[d] end
        if not same then
          fail(fname, "state '%s' of parameter %s has shape [%s], the parameter [%s]", tostring(k), tostring(index),
            table.concat(a, ", "), table.concat(b, ", "))
        end
        copy[k] = v:contiguous():clone()
      else
        copy[k] = v
      end
    end
    local msg = self.check_state and self.check_state(copy)
    if msg then fail(fname, "state of parameter %s: %s", tostring(index), msg) end
    state[p] = copy
  end
  return function()
    for gi, group in ipairs(self.param_groups) do
      for k, v in pairs(groups[gi]) do group[k] = v end
    end
    self.state = state
  end
end

--- Checks a state_dict() as load_state_dict does (the same errors) without
-- changing anything, and returns a function that makes the load (it sets
-- the checked options and state, with no check left to fail). For a caller
-- that restores several things at once (attn.checkpoint.load) and checks
-- them all before changing any.
function Optimizer:prepare_load_state_dict(sd)
  local apply = prepare_load(self, sd) -- not a tail call: errors name the user's line, 4 levels up
  return apply
end

--- Restores a state_dict() (of an optimizer of the same class over the
-- same parameter shapes): group options and per-parameter state, the tensors
-- copied, so that the next steps are the bits an uninterrupted run gives.
-- A step count must be an exact integer in [0, 2^53] (a Lua number, or a
-- one-element tensor as PyTorch 1.13 saves Adam's `step`). Everything is
-- checked before anything changes: nothing changes when there is an error.
function Optimizer:load_state_dict(sd)
  prepare_load(self, sd)()
end

function Optimizer:__tostring()
  local lines = {self.__name .. " ("}
  for gi, group in ipairs(self.param_groups) do
    lines[#lines + 1] = ("Parameter Group %d"):format(gi - 1)
    for _, s in ipairs(self.spec) do
      local v = group[s[1]]
      if type(v) == "table" then v = "(" .. table.concat(v, ", ") .. ")" end
      lines[#lines + 1] = ("    %s: %s"):format(s[1], tostring(v))
    end
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

--- Option checks shared by the classes: nil when v is fine, else what was expected.
Optimizer.checks = {
  nonneg = function(v) if type(v) ~= "number" or not (v >= 0) then return "a number >= 0" end end,
  boolean = function(v) if type(v) ~= "boolean" then return "a boolean" end end,
  falsy = function(v) if v ~= false then return "false (not supported)" end end,
  betas = function(v)
    if type(v) ~= "table" or #v ~= 2 or type(v[1]) ~= "number" or type(v[2]) ~= "number"
       or not (v[1] >= 0 and v[1] < 1 and v[2] >= 0 and v[2] < 1) then
      return "{beta1, beta2}, each in [0, 1)"
    end
  end,
}

return Optimizer
