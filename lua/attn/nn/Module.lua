--- attn.nn.Module: the base class of every nn module, with PyTorch's naming.
--
-- A new class lives in one file, lua/attn/nn/NAME.lua, and is found as
-- `attn.nn.NAME` without editing any list (attn.nn loads it on first use):
--
--     local attn = require "attn"
--     local Module = require "attn.nn.Module"
--     local CausalAttention = Module:extend("CausalAttention")
--
--     -- the constructor: self is already a Module in training mode
--     function CausalAttention:init(d_in, d_out, context_length, dropout, opts)
--       opts = opts or {}
--       self.d_out = d_out                                     -- plain fields: not saved
--       self:add_module("W_query", attn.nn.Linear(d_in, d_out, {bias = opts.qkv_bias or false}))
--       self:add_module("dropout", attn.nn.Dropout(dropout))
--       self:add_buffer("mask", attn.triu(attn.ones(context_length, context_length), 1))
--     end
--     function CausalAttention:forward(x) ... end            -- m(x) calls this
--     function CausalAttention:extra_repr() return "d_out=2" end  -- optional, for tostring
--     return CausalAttention
--
-- Registration (each also stores the value as a field, self.NAME, and returns it):
--   self:add_parameter(name, tensor)           a trainable tensor (nn.Parameter)
--   self:add_buffer(name, tensor[, persistent]) a saved non-parameter tensor (register_buffer)
--   self:add_module(name, module)              a child module
--   self:add_module_list(name, {m1, m2, ...})  an nn.ModuleList child: self.NAME[1] is
--                                              named "NAME.0", as in PyTorch
-- Registration order is kept and gives PyTorch's order: named_parameters()
-- lists a module's own parameters, then each child's, recursively (torch
-- walks named_modules() and yields each module's _parameters); state_dict()
-- lists a module's own parameters, its persistent buffers, then each child's.
-- Replacing a registered field (self.weight = other_tensor) replaces the
-- parameter, as setattr does in torch; setting it to nil drops it from the
-- listings.
--
-- state_dict() returns a plain table name -> tensor (the module's own tensors,
-- not copies, like torch's detached views); its key order is given by
-- m:state_dict_keys().
-- @classmod attn.nn.Module
local core = require "attn.core"
local argcheck = require "attn.argcheck"
local caller = require "attn.caller"
local autograd = require "attn.autograd"

local is_tensor = argcheck.is_tensor
local shape_str = argcheck.shape

local Module = {}
Module.__index = Module
Module.__name = "Module"
Module.__module_class = true

--- True when x is an instance of some Module class.
function Module.is_module(x)
  if type(x) ~= "table" then return false end
  local mt = getmetatable(x)
  return type(mt) == "table" and rawget(mt, "__index") == mt and mt.__module_class == true
end
local is_module = Module.is_module

local function class_name(m)
  local mt = getmetatable(m)
  return mt and mt.__name or "Module"
end

local function fail(m, method, fmt, ...)
  argcheck.fail(class_name(m) .. ":" .. method, fmt, ...)
end

-- metamethods are looked up raw in the metatable: every class carries its own copy
local METAMETHODS = {"__call", "__tostring"}

local function new_instance(cls, ...)
  local self = setmetatable({
    training = true,
    _param_names = {},  -- own parameters, registration order
    _buffers = {},      -- {name = ..., persistent = bool}
    _children = {},     -- {name = "W_query" or "0", key = field key (string, or integer in lists)}
  }, cls)
  -- an error from deeper down (an allocation refused for huge sizes, say) is
  -- re-raised naming the class and pointing at the caller
  -- initialisation runs without recording, as torch's init functions (no_grad)
  local ok, err = pcall(autograd.no_grad, self.init, self, ...)
  if not ok then
    local msg = tostring(err):gsub("^[^\n]-:%d+: ", "", 1)
    local name = "attn.nn." .. class_name(self)
    if msg:sub(1, #name + 1) ~= name .. ":" then msg = name .. ": " .. msg end
    caller.error(msg)
  end
  return self
end

--- A subclass named `name` (the name shows in tostring and in error messages).
-- Calling the class, `C(...)`, makes an instance and runs `C.init(self, ...)`.
function Module.extend(parent, name)
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
    caller.error("Module:extend: bad argument #1 'name' (expected a class name such as \"CausalAttention\", got "
          .. (type(name) == "string" and ("%q"):format(name) or type(name)) .. ")")
  end
  local cls = {}
  for _, k in ipairs(METAMETHODS) do cls[k] = parent[k] end
  cls.__index = cls
  cls.__name = name
  cls.super = parent
  return setmetatable(cls, {
    __index = parent,
    __call = new_instance,
    __tostring = function() return "class attn.nn." .. name end,
  })
end

-- Module() itself makes a bare module (a container to add_* into)
setmetatable(Module, {__call = new_instance, __tostring = function() return "class attn.nn.Module" end})

--- The constructor body; subclasses override it. Module itself takes no arguments.
function Module:init() end

--- The computation; every subclass defines it. `m(...)` is `m:forward(...)`.
function Module:forward()
  fail(self, "forward", "not implemented (the class defines no forward method)")
end

-- The directory of attn's Lua files ("/.../attn/"): a position there means
-- nothing to the caller of m(x).
local LIB_DIR = debug.getinfo(1, "S").source:match("^@(.*/)nn/Module%.lua$")

-- An error raised inside m:forward, worded for the caller of m(x): it names
-- Class:forward (unless it already names some forward), without a position
-- inside attn's own files. Error objects that are not strings pass unchanged.
local function forward_error(self, err)
  if type(err) ~= "string" then return err end
  if LIB_DIR and err:sub(1, #LIB_DIR) == LIB_DIR then err = err:gsub("^[^\n]-:%d+: ", "", 1) end
  if err:match("^[%a_][%w_]*:forward[%w_]*: ") then return err end
  return class_name(self) .. ":forward: " .. err
end

local function forward_results(self, ok, ...)
  if ok then return ... end
  caller.error(forward_error(self, (...))) -- at the caller of m(x)
end

function Module.__call(self, ...)
  return forward_results(self, pcall(self.forward, self, ...))
end

--- A `__call` for class `cls` whose m(x) runs `direct(self, x)` straight
-- away, without Module.__call's protected call (which words forward's errors
-- for the caller, at a tenth of a notebook-size forward's cost), when forward
-- is the class's own (not replaced in a subclass or on the instance). direct
-- returns nil for any call it does not take, raising no error for bad input;
-- those calls, and m(x, opts), go the protected way.
function Module.direct_call(cls, direct)
  if type(cls) ~= "table" or type(cls.forward) ~= "function" then
    caller.error("Module.direct_call: bad argument #1 'cls' (expected a module class with a forward method, got "
          .. type(cls) .. ")")
  end
  if type(direct) ~= "function" then
    caller.error("Module.direct_call: bad argument #2 'direct' (expected a function, got " .. type(direct) .. ")")
  end
  local forward, module_call = cls.forward, Module.__call
  return function(self, x, opts)
    if opts == nil and self.forward == forward then
      local y = direct(self, x)
      if y then return y end
    end
    return module_call(self, x, opts)
  end
end

local function check_name(self, method, name)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    fail(self, method, "bad argument #1 'name' (expected a non-empty string without '.', got %s)",
         type(name) == "string" and ("%q"):format(name) or type(name))
  end
  for _, n in ipairs(self._param_names) do
    if n == name then fail(self, method, "%q is already registered as a parameter", name) end
  end
  for _, b in ipairs(self._buffers) do
    if b.name == name then fail(self, method, "%q is already registered as a buffer", name) end
  end
  for _, c in ipairs(self._children) do
    if c.name == name then fail(self, method, "%q is already registered as a child module", name) end
  end
end

--- Register a parameter (a tensor) under `name`; stored as self[name]. Returns it.
function Module:add_parameter(name, t)
  check_name(self, "add_parameter", name)
  if not is_tensor(t) then
    fail(self, "add_parameter", "bad argument #2 'tensor' (expected attn.Tensor, got %s)", type(t))
  end
  self._param_names[#self._param_names + 1] = name
  self[name] = autograd.mark_parameter(t)
  return t
end

--- Register a buffer (saved in state_dict unless persistent == false, never a parameter).
function Module:add_buffer(name, t, persistent)
  check_name(self, "add_buffer", name)
  if not is_tensor(t) then
    fail(self, "add_buffer", "bad argument #2 'tensor' (expected attn.Tensor, got %s)", type(t))
  end
  if persistent ~= nil and type(persistent) ~= "boolean" then
    fail(self, "add_buffer", "bad argument #3 'persistent' (expected boolean, got %s)", type(persistent))
  end
  self._buffers[#self._buffers + 1] = {name = name, persistent = persistent ~= false}
  self[name] = t
  return t
end

--- Register a child module under `name`; stored as self[name]. Returns it.
function Module:add_module(name, m)
  check_name(self, "add_module", name)
  if not is_module(m) then
    fail(self, "add_module", "bad argument #2 'module' (expected an attn.nn module, got %s)", type(m))
  end
  self._children[#self._children + 1] = {name = name, key = name}
  self[name] = m
  return m
end

--- Register a list of child modules as an nn.ModuleList child named `name`.
-- `self[name][i]` is the i-th module (1-based), named "name.(i-1)". Returns the list.
function Module:add_module_list(name, list)
  check_name(self, "add_module_list", name)
  if type(list) ~= "table" or is_module(list) then
    fail(self, "add_module_list", "bad argument #2 'modules' (expected a list of attn.nn modules, got %s)",
         is_module(list) and class_name(list) or type(list))
  end
  return self:add_module(name, Module.ModuleList(list))
end

--- Training mode on (default) or off, for this module and every descendant. Returns self.
function Module:train(on)
  if on == nil then on = true end
  if type(on) ~= "boolean" then
    fail(self, "train", "bad argument #1 'mode' (expected boolean, got %s)", type(on))
  end
  self.training = on
  for _, c in ipairs(self._children) do
    local child = self[c.key]
    if child ~= nil then child:train(on) end
  end
  return self
end

--- Evaluation mode: train(false). Returns self.
function Module:eval()
  return self:train(false)
end

--- Child modules in registration order, as a list of {name, module}.
function Module:named_children()
  local out = {}
  for _, c in ipairs(self._children) do
    local child = self[c.key]
    if child ~= nil then out[#out + 1] = {c.name, child} end
  end
  return out
end

--- This module and every descendant, pre-order, as {dotted name, module} ("" for self).
function Module:named_modules()
  local out = {}
  local function walk(m, prefix)
    out[#out + 1] = {prefix, m}
    for _, nc in ipairs(m:named_children()) do
      walk(nc[2], prefix == "" and nc[1] or (prefix .. "." .. nc[1]))
    end
  end
  walk(self, "")
  return out
end

-- A tensor assigned over a registered parameter becomes one (a parameter
-- whose requires_grad was turned off stays off, as a frozen torch parameter).
local parameters, mark_parameter = autograd._parameters, autograd.mark_parameter
local function adopt_parameter(t)
  if not parameters[t] and is_tensor(t) then mark_parameter(t) end
end

--- Parameters as a list of {dotted name, tensor}, in PyTorch's order (a
-- tensor registered twice is listed once, as torch does).
function Module:named_parameters()
  local out, seen = {}, {}
  for _, nm in ipairs(self:named_modules()) do
    local prefix, m = nm[1], nm[2]
    for _, n in ipairs(m._param_names) do
      local t = m[n]
      if t ~= nil and not seen[t] then
        seen[t] = true
        adopt_parameter(t)
        out[#out + 1] = {prefix == "" and n or (prefix .. "." .. n), t}
      end
    end
  end
  return out
end

--- Parameters as a list of tensors, in named_parameters order.
function Module:parameters()
  local out = {}
  for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
  return out
end

--- Drop the gradients of every parameter (`p.grad = nil`), as torch's
-- `zero_grad(set_to_none=True)`; `m:zero_grad(false)` zeroes them in place instead.
-- @param[opt=true] set_to_none
function Module:zero_grad(set_to_none)
  if set_to_none ~= nil and type(set_to_none) ~= "boolean" then
    fail(self, "zero_grad", "bad argument #1 'set_to_none' (expected boolean, got %s)", type(set_to_none))
  end
  for _, p in ipairs(self:parameters()) do
    if set_to_none == false then
      if p.grad ~= nil then autograd.no_grad(function() p.grad:zero_() end) end
    else
      p.grad = nil
    end
  end
  return self
end

--- Whether a forward now would record (grad mode on and x or a parameter requires grad).
function Module:recording(x)
  if not autograd.is_grad_enabled() then return false end
  if x ~= nil and autograd._history[x] then return true end
  for _, p in ipairs(self:parameters()) do
    if autograd._history[p] then return true end
  end
  return false
end

local history, is_grad_enabled = autograd._history, autograd.is_grad_enabled

-- Whether one of the Linear l's parameters requires grad. Each is visited: a
-- tensor assigned over a registered parameter is adopted first, as
-- named_parameters does.
local function linear_requires_grad(l)
  local names, found = l._param_names, false
  for i = 1, #names do
    local t = l[names[i]]
    if t ~= nil then
      if not parameters[t] then adopt_parameter(t) end -- the call only for a tensor not yet adopted
      if history[t] then found = true end
    end
  end
  return found
end

--- Whether a forward that reads only x and the parameters of the Linear
-- modules a, b, c[, d] would record (the fused forwards of CausalAttention
-- and MultiHeadAttention): grad mode on and x or one of those parameters
-- requires grad. Module:recording's answer for such a module, without its
-- walk over every parameter (no table is made).
function Module.linears_recording(x, a, b, c, d)
  if not is_grad_enabled() then return false end
  local found = history[x] and true or false
  if linear_requires_grad(a) then found = true end
  if linear_requires_grad(b) then found = true end
  if linear_requires_grad(c) then found = true end
  if d ~= nil and linear_requires_grad(d) then found = true end
  return found
end

--- Total element count of the parameters.
function Module:num_parameters()
  local n = 0
  for _, t in ipairs(self:parameters()) do n = n + t:numel() end
  return n
end

-- state dict entries in torch's order: own params, own persistent buffers, then children
local function state_entries(m, prefix, out)
  for _, n in ipairs(m._param_names) do
    if m[n] ~= nil then out[#out + 1] = {prefix .. n, m[n]} end
  end
  for _, b in ipairs(m._buffers) do
    if b.persistent and m[b.name] ~= nil then out[#out + 1] = {prefix .. b.name, m[b.name]} end
  end
  for _, c in ipairs(m._children) do
    local child = m[c.key]
    if child ~= nil then state_entries(child, prefix .. c.name .. ".", out) end
  end
  return out
end

--- The keys of state_dict(), in PyTorch's order.
function Module:state_dict_keys()
  local keys = {}
  for i, e in ipairs(state_entries(self, "", {})) do keys[i] = e[1] end
  return keys
end

--- Table dotted name -> tensor of every parameter and persistent buffer (the
-- module's own tensors, not copies). Order: state_dict_keys().
function Module:state_dict()
  local d = {}
  for _, e in ipairs(state_entries(self, "", {})) do d[e[1]] = e[2] end
  return d
end

local function quoted_list(keys)
  local q = {}
  for i, k in ipairs(keys) do q[i] = ("%q"):format(k) end
  return table.concat(q, ", ")
end

-- The checks of load_state_dict, then a function that makes the load (see
-- prepare_load_state_dict). Errors are raised `level` levels up from here,
-- at the user's call.
local function prepare_load(self, d, strict, level)
  local function fail_load(fmt, ...) error(("%s:load_state_dict: " .. fmt):format(class_name(self), ...), level + 1) end
  if type(d) ~= "table" or is_module(d) then
    fail_load("bad argument #1 'state_dict' (expected a table name -> attn.Tensor, got %s)",
      is_module(d) and class_name(d) or type(d))
  end
  if strict == nil then strict = true end
  if type(strict) ~= "boolean" then
    fail_load("bad argument #2 'strict' (expected boolean, got %s)", type(strict))
  end
  local entries = state_entries(self, "", {})
  local expected, missing, unexpected, problems = {}, {}, {}, {}
  -- d is read once, into srcs: what is checked is what is copied, even if a
  -- finalizer running during the checks replaces entries of d
  local srcs = {}
  for _, e in ipairs(entries) do
    expected[e[1]] = true
    local src = d[e[1]]
    srcs[e[1]] = src
    if src == nil then
      missing[#missing + 1] = e[1]
    elseif not is_tensor(src) then
      problems[#problems + 1] = ("value for %q is not an attn.Tensor (got %s)"):format(e[1], type(src))
    else
      local a, b = src:size(), e[2]:size()
      local same = #a == #b
      for i = 1, #a do same = same and a[i] == b[i] end
      if not same then
        problems[#problems + 1] = ("size mismatch for %q: copying a tensor of shape %s from the state dict, "
          .. "the shape in the module is %s"):format(e[1], shape_str(src), shape_str(e[2]))
      elseif src ~= e[2] and e[2]:has_internal_overlap() then
        -- copy_ would refuse it, after the entries before it were copied
        problems[#problems + 1] = ("the module's %q (shape %s) is an expanded view whose elements share memory: "
          .. "it cannot be loaded into (clone() it first)"):format(e[1], shape_str(e[2]))
      end
    end
  end
  for k in pairs(d) do
    if not expected[k] then unexpected[#unexpected + 1] = tostring(k) end
  end
  table.sort(unexpected)
  if strict then
    if #missing > 0 then table.insert(problems, 1, "missing key(s): " .. quoted_list(missing)) end
    if #unexpected > 0 then
      table.insert(problems, #missing > 0 and 2 or 1, "unexpected key(s): " .. quoted_list(unexpected))
    end
  end
  if #problems > 0 then
    fail_load("error(s) in loading the state dict for %s: %s", class_name(self), table.concat(problems, "; "))
  end
  local function apply()
    autograd.no_grad(function()
      for _, e in ipairs(entries) do
        local src = srcs[e[1]]
        if src ~= nil and src ~= e[2] then e[2]:copy_(src) end
      end
    end)
  end
  return apply, {missing_keys = strict and {} or missing, unexpected_keys = strict and {} or unexpected}
end

--- Checks `d` as load_state_dict does (the same errors) without changing
-- anything, and returns a function that makes the load: it copies the
-- checked tensors and cannot fail. For a caller that restores several things
-- at once (attn.checkpoint.load) and checks them all before changing any.
-- @return apply, {missing_keys = {...}, unexpected_keys = {...}}
function Module:prepare_load_state_dict(d, strict)
  return prepare_load(self, d, strict, 2) -- a tail call: the user's call is 2 levels up from prepare_load
end

--- Copy the tensors of `d` (name -> tensor, as from state_dict) into this
-- module's parameters and buffers, in place. With strict (default true) a
-- missing or unexpected key is an error; a shape mismatch always is. Every
-- entry is checked before the first copy, so nothing is copied when there is
-- an error. Returns {missing_keys = {...}, unexpected_keys = {...}} (both
-- empty when strict).
function Module:load_state_dict(d, strict)
  local apply, result = prepare_load(self, d, strict, 3)
  apply()
  return result
end

--- Save the module's weights to a safetensors file: every state_dict() entry
-- (parameters and persistent buffers, under PyTorch's state_dict keys such as
-- "W_query.weight" and "mask"), as float32, names sorted. `metadata` is an
-- optional table string -> string stored in the file's `__metadata__`.
-- A torch module with the same structure loads the file with
-- `load_state_dict` (see scripts/export_torch.py for the other direction).
-- @param path file to write
-- @param[opt] metadata table string -> string
-- @return self
function Module:save(path, metadata)
  if type(path) ~= "string" then
    fail(self, "save", "bad argument #1 'path' (expected a string, got %s)", type(path))
  end
  if metadata ~= nil and type(metadata) ~= "table" then
    fail(self, "save", "bad argument #2 'metadata' (expected a table string -> string, got %s)", type(metadata))
  end
  local ok, err = pcall(core.save_safetensors, path, self:state_dict(), metadata)
  if not ok then fail(self, "save", "%s", (tostring(err):gsub("^.-attn%.save_safetensors: ", ""))) end
  return self
end

-- "zip" or "legacy" when the file at path starts as torch.save writes (a zip
-- archive, or a pickle: protocol 2 and up start with 0x80 and the protocol), else nil.
local function torch_save_format(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local head = f:read(4) or ""
  f:close()
  if head == "PK\3\4" then return "zip" end
  local b1, b2 = head:byte(1, 2)
  if b1 == 0x80 and b2 and b2 >= 2 and b2 <= 5 then return "legacy" end
  return nil
end

--- Load weights saved by `save` (or written from a PyTorch state_dict by
-- scripts/export_torch.py) into this module, in place, through
-- load_state_dict: with strict (default true) missing and unexpected keys are
-- errors; a shape mismatch always is. Nothing is copied when there is an error.
-- A PyTorch file (torch.save) or a training checkpoint (attn.checkpoint.save)
-- is an error saying how to load it instead.
-- @param path a safetensors file
-- @param[opt=true] strict
-- @return the load_state_dict result ({missing_keys, unexpected_keys}) and the file's metadata table
function Module:load(path, strict)
  if type(path) ~= "string" then
    fail(self, "load", "bad argument #1 'path' (expected a string, got %s)", type(path))
  end
  if strict ~= nil and type(strict) ~= "boolean" then
    fail(self, "load", "bad argument #2 'strict' (expected boolean, got %s)", type(strict))
  end
  local ok, d, metadata = pcall(core.load_safetensors, path)
  if not ok then
    -- sniffed only when the reader read a regular file's bytes (opening a FIFO would block)
    local kind = tostring(d):find("not a safetensors file", 1, true) and torch_save_format(path)
    if kind then
      fail(self, "load", "%s is a PyTorch pickle (torch.save's %s format), not a safetensors file: convert it with "
        .. "scripts/export_torch.py (/usr/bin/python3 scripts/export_torch.py %s out.safetensors), then load "
        .. "out.safetensors", path, kind, path)
    end
    fail(self, "load", "%s", (tostring(d):gsub("^.-attn%.load_safetensors: ", "")))
  end
  -- a checkpoint's tensors are "model.NAME": strict = false would load none of them
  if type(metadata) == "table" and type(metadata.format) == "string" and metadata.format:match("^attn%-checkpoint") then
    fail(self, "load", "%s is a training checkpoint (written by attn.checkpoint.save), not a module's weights: load "
      .. "it with require(\"attn.checkpoint\").load(path, model[, optimizer])", path)
  end
  local okl, res = pcall(self.load_state_dict, self, d, strict)
  if not okl then
    fail(self, "load", "%s: %s", path, (tostring(res):gsub("^.-:load_state_dict: ", "")))
  end
  return res, metadata
end

--- Extra text inside the parentheses of tostring (like torch's extra_repr); "" by default.
function Module:extra_repr() return "" end

-- torch's _addindent: indent every line but the first
local function add_indent(s, n)
  local pad = string.rep(" ", n)
  return (s:gsub("\n", "\n" .. pad))
end

--- PyTorch's repr: "Name(extra)" or, with children, one "(name): child" line each.
function Module.__tostring(self)
  local extra = self:extra_repr()
  local extra_lines = {}
  if extra ~= nil and extra ~= "" then
    for line in (extra .. "\n"):gmatch("(.-)\n") do extra_lines[#extra_lines + 1] = line end
  end
  local lines = {}
  for _, l in ipairs(extra_lines) do lines[#lines + 1] = l end
  local nchild = 0
  for _, nc in ipairs(self:named_children()) do
    nchild = nchild + 1
    lines[#lines + 1] = "(" .. nc[1] .. "): " .. add_indent(tostring(nc[2]), 2)
  end
  local s = class_name(self) .. "("
  if #lines > 0 then
    if #extra_lines == 1 and nchild == 0 then
      s = s .. extra_lines[1]
    else
      s = s .. "\n  " .. table.concat(lines, "\n  ") .. "\n"
    end
  end
  return s .. ")"
end

--- Python's repr of a float (shortest round-trip text, "0.5", "1.0"), for extra_repr.
function Module.pyfloat(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" end
  if x == -math.huge then return "-inf" end
  local s
  for prec = 1, 17 do
    s = ("%." .. prec .. "g"):format(x)
    if tonumber(s) == x then break end
  end
  if not s:find("[%.eEn]") then s = s .. ".0" end
  return s
end

local ModuleList = Module:extend("ModuleList")
--- nn.ModuleList(list): a list of modules; m[i] is the i-th (1-based), named
-- "i-1" as in PyTorch. `m:append(module)` adds one at the end.
Module.ModuleList = ModuleList

function ModuleList:init(list)
  list = list or {}
  if type(list) ~= "table" or is_module(list) then
    caller.error("attn.nn.ModuleList: bad argument #1 'modules' (expected a list of attn.nn modules, got "
          .. (is_module(list) and class_name(list) or type(list)) .. ")")
  end
  for i = 1, #list do self:append(list[i]) end
end

--- Add a module at the end. Returns self.
function ModuleList:append(m)
  if not is_module(m) then
    caller.error(("attn.nn.ModuleList: element %d is not an attn.nn module (got %s)"):format(#self + 1, type(m)))
  end
  local i = #self + 1
  self._children[#self._children + 1] = {name = tostring(i - 1), key = i}
  self[i] = m
  return self
end

function ModuleList:forward()
  caller.error("ModuleList:forward: a ModuleList has no forward; call its modules")
end

return Module
