--- attn.help: the doc of a public function or class, read from the same LDoc
-- comments that `make doc` renders (one source of truth). Lua functions are
-- documented where they are defined; the C functions in lua/attn/tools/ldoc_core.lua
-- and lua/attn/tools/ldoc_tensor.lua (`@function` entries, no code).
--
--    attn.help()                      -- the topics
--    attn.help(attn.matmul)           -- by value
--    attn.help("matmul")              -- by name: "nn.Linear", "Tensor.view", "viz.show"
-- @module attn.tools.help
local caller = require "attn.caller"
local M = {}

-- The Lua files whose doc comments are read, as module names; every class
-- file in attn/nn/ is added to these (see `source_files`).
local MODULE_FILES = {
  "attn", "attn.tools.ldoc_core", "attn.tools.ldoc_tensor", "attn.viz", "attn.format", "attn.tools.progress",
  "attn.tools.repl", "attn.tools.help", "attn.nn", "attn.autograd",
  "attn.nn.functional", "attn.nn.utils", "attn.optim", "attn.optim.Optimizer", "attn.optim.SGD", "attn.optim.Adam",
  "attn.optim.AdamW", "attn.tokenizer", "attn.data", "attn.generator",
}

-- "attn.nn.Linear:forward" and "Tensor:view" are named with dots throughout.
local function dotted(name) return (name:gsub(":", ".")) end

-- The qualified name of `name` as written in a file of module `module`:
-- `attn.allclose` in attn, `viz.show` in attn.viz (the module's local table),
-- `M.grad` in attn.autograd (`returned`: the local table the file returns),
-- `Tensor.float` in attn (a field of the module), `matmul` (an @function entry).
local function qualify(module, name, returned)
  name = dotted(name)
  local last = module:match("([^.]+)$")
  local first, rest = name:match("^([^.]+)(.*)$")
  if first == last or first == returned then return module .. rest end
  return module .. "." .. name
end

--- The doc blocks of one Lua source text: a list of `{name = qualified name,
-- text = the description and parameter lines}`. A block starts with `---`;
-- it documents the module (`@module`, `@submodule`, `@classmod`), an
-- `@function NAME` entry, or the `function NAME(` / `NAME =` line after it.
-- @param source the file's text
-- @param[opt] module the module name when the file declares none
-- @param[opt] as the module name to use whatever the file declares (a module
-- published under another name: attn.assert is attn.tools.assert)
function M.parse(source, module, as)
  local docs = {}
  local lines = {}
  for line in (source .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  -- the local table the file returns names its functions (`function M.grad`)
  local returned
  for j = #lines, 1, -1 do
    if lines[j]:match("%S") then returned = lines[j]:match("^return%s+([%a_][%w_]*)%s*$"); break end
  end
  local i = 1
  while i <= #lines do
    if lines[i]:match("^%-%-%-") and not lines[i]:match("^%-%-%-%-") then
      local text, tags = {}, {}
      local first = true
      -- the block ends at the first non-comment line or at the next `---`
      while i <= #lines and lines[i]:match("^%-%-") and (first or not lines[i]:match("^%-%-%-[^%-]")) do
        local body = first and lines[i]:gsub("^%-%-%-%s?", "") or lines[i]:gsub("^%-%-%s?", "")
        first = false
        local tag, value = body:match("^%s*@([%w_]+%[?[^%]%s]*%]?)%s*(.*)$")
        local param = tag and (tag == "param" or tag:match("^param%[")) -- @param[opt] is a tag "param" then "[opt]"
        if param or tag == "return" then
          local opt = tag:match("%[(.*)%]")
          if param and opt then value = value:gsub("^(%S+)", "%1 (" .. opt:gsub("^opt=", "optional, default ") .. ")") end
          text[#text + 1] = "  " .. (param and "" or "returns ") .. value
        elseif tag then
          tags[tag] = value
        else
          text[#text + 1] = body
        end
        i = i + 1
      end
      local kind = tags.module or tags.submodule or tags.classmod
      local name
      if kind then
        module = as or kind
        -- a @submodule file adds to its module and does not document it again
        if not tags.submodule then name = module end
      elseif tags["function"] then
        name = qualify(module or "attn", tags["function"], returned)
      elseif i <= #lines then
        local target = lines[i]:match("^function%s+([%w_.:]+)%s*%(") or lines[i]:match("^([%w_][%w_.]*)%s*=")
        if target and module then name = qualify(module, target, returned) end
      end
      -- trailing blank lines go
      while #text > 0 and text[#text]:match("^%s*$") do text[#text] = nil end
      if name and #text > 0 then docs[#docs + 1] = { name = name, text = table.concat(text, "\n") } end
    else
      i = i + 1
    end
  end
  return docs
end

-- The files of the attn/nn/ directory (class files), via lfs when present
-- and `ls` otherwise.
local function list_dir(dir)
  local names = {}
  local ok, lfs = pcall(require, "lfs")
  if ok and lfs then
    for f in lfs.dir(dir) do names[#names + 1] = f end
  else
    local p = io.popen("ls '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
    if p then
      for f in p:lines() do names[#names + 1] = f end
      p:close()
    end
  end
  table.sort(names)
  return names
end

-- attn.nn's map class name -> file name for classes whose file is not NAME.lua
local function nn_files()
  local ok, nn = pcall(require, "attn.nn")
  return ok and type(nn) == "table" and rawget(nn, "_files") or {}
end

--- The names of the nn classes: one per lua/attn/nn/NAME.lua (NAME
-- capitalised, or the class that attn.nn._files maps to that file), as
-- attn.nn finds them on first use, plus nn.ModuleList.
function M.nn_class_names()
  local init = package.searchpath("attn.nn", package.path)
  local class_of = {}
  for class, file in pairs(nn_files()) do class_of[file] = class end
  local names = { "ModuleList" }
  if init then
    for _, f in ipairs(list_dir(init:match("^(.*)[/\\]"))) do
      local name = f:match("^(%u[%w_]*)%.lua$")
      if name then names[#names + 1] = class_of[name] or name end
    end
  end
  table.sort(names)
  return names
end

-- Modules under lua/attn/ that are attn's own plumbing, not an area a user
-- calls into (attn.core is the C module; sdpa_autograd installs the recorded
-- attention; nn.checks holds the nn classes' argument checks).
local INTERNAL_MODULES = { ["attn.core"] = true, ["attn.sdpa_autograd"] = true, ["attn.nn.checks"] = true,
                           ["attn.score_mod"] = true } -- its public names are attn.score_mod and attn.mask_mod

-- Public-looking names that attn's own files share with each other.
local INTERNAL_NAMES = {
  ["attn.autograd"] = { mark_parameter = true, is_parameter = true, sum_to = true, print_suffixes = true },
}

-- The directory of a module's files ("attn" -> .../lua/attn), or nil.
local function module_dir(name)
  local init = package.searchpath(name, package.path)
  return init and init:match("[/\\]init%.lua$") and init:match("^(.*)[/\\]") or nil
end

-- The modules one level below `parent` ("attn" -> attn.checkpoint, attn.optim,
-- ...): lower-case NAME.lua files and NAME/ directories with an init.lua.
local function submodules(parent)
  local dir, out = module_dir(parent), {}
  if not dir then return out end
  for _, f in ipairs(list_dir(dir)) do
    local name = f:match("^(%l[%w_]*)%.lua$")
    if not name and f:match("^%l[%w_]*$") then
      local fh = io.open(dir .. "/" .. f .. "/init.lua", "r")
      if fh then fh:close(); name = f end
    end
    if name and name ~= "init" then out[#out + 1] = parent .. "." .. name end
  end
  return out
end

--- The public areas beyond attn's functions, the tensor methods and the nn
-- classes, as found now (an area added later is listed with no change here):
-- every table field of attn (attn.block_mask, attn.optim, ...), every
-- lower-case module of nn (nn.functional, nn.utils), and every module under
-- lua/attn/ that attn does not load as a field (`require "attn.checkpoint"`).
-- Returns a sorted list of `{name = "attn.optim", value = the table or nil,
-- require = true for a module required on its own}`.
function M.areas()
  local attn = require "attn"
  local out, seen = {}, { ["attn.Tensor"] = true, ["attn.nn"] = true }
  for k, v in pairs(attn) do
    local name = "attn." .. tostring(k)
    if type(k) == "string" and not k:match("^_") and type(v) == "table" and not seen[name] then
      seen[name] = true
      out[#out + 1] = { name = name, value = v }
    end
  end
  local function add(name, value, required)
    if seen[name] or INTERNAL_MODULES[name] then return end
    seen[name] = true
    out[#out + 1] = { name = name, value = type(value) == "table" and value or nil, require = required }
  end
  for _, m in ipairs(submodules("attn")) do
    local field = m:match("^attn%.(.*)$")
    if not INTERNAL_MODULES[m] then
      -- a field attn loads on first use is a field, not a module required on its own
      local got, as_field = pcall(function() return attn[field] end)
      if got and type(as_field) == "table" then
        add("attn." .. field, as_field)
      elseif not (got and as_field ~= nil) then
        local ok, v = pcall(require, m)
        add(m, ok and v, true)
      end
    end
  end
  for _, m in ipairs(submodules("attn.nn")) do
    if not INTERNAL_MODULES[m] then add(m, attn.nn[m:match("([^.]+)$")]) end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- The public names of an area (its table's keys, or the documented names
-- under it when its module cannot be loaded here), sorted.
local function area_names(area, idx)
  local names, hidden = {}, INTERNAL_NAMES[area.name] or {}
  if area.value then
    for k in pairs(area.value) do
      if type(k) == "string" and not k:match("^_") and not hidden[k] then names[#names + 1] = k end
    end
  else
    local prefix = "^" .. area.name:gsub("%.", "%%.") .. "%.([%w_]+)$"
    for full in pairs(idx) do
      local k = full:match(prefix)
      if k and not hidden[k] then names[#names + 1] = k end
    end
  end
  table.sort(names)
  return names
end
M.area_names = area_names

--- The source files read for docs: `{module name, path[, published name]}`:
-- the fixed list above, every nn class file, and each area's module with the
-- files of its directory (a module that only forwards, `return require "Y"`,
-- is read from Y's file under its own name).
function M.source_files()
  local files, mods, listed = {}, {}, {}
  local function add(m, as)
    if listed[m] then return end
    listed[m] = true
    mods[#mods + 1] = { m, as }
  end
  for _, m in ipairs(MODULE_FILES) do add(m) end
  local file_of = nn_files()
  for _, c in ipairs(M.nn_class_names()) do
    if c ~= "ModuleList" then add("attn.nn." .. (file_of[c] or c)) end
  end
  for _, area in ipairs(M.areas()) do
    add(area.name)
    local dir = module_dir(area.name)
    if dir then
      for _, f in ipairs(list_dir(dir)) do
        local name = f:match("^([%a_][%w_]*)%.lua$")
        if name and name ~= "init" then add(area.name .. "." .. name) end
      end
    end
  end
  for _, m in ipairs(mods) do
    local path = package.searchpath(m[1], package.path)
    if path then
      local fh = io.open(path, "r")
      local src = fh and fh:read("a") or ""
      if fh then fh:close() end
      local target = src:match("^%s*[^\n]*\n?[^\n]*\n?%s*return%s+require%s*%(?%s*[\"']([%w_.]+)[\"']%s*%)?%s*$")
      local tpath = target and package.searchpath(target, package.path)
      if tpath then
        files[#files + 1] = { m[1], tpath, m[1] }
      else
        files[#files + 1] = { m[1], path, m[2] }
      end
    end
  end
  return files
end

local index -- name -> text, read once

--- Every doc block of the source files, by qualified name ("attn.matmul",
-- "attn.Tensor.view", "attn.nn.Linear", "attn.nn.Module.parameters").
function M.index()
  if index then return index end
  index = {}
  for _, f in ipairs(M.source_files()) do
    local fh = io.open(f[2], "r")
    if fh then
      local src = fh:read("a")
      fh:close()
      for _, d in ipairs(M.parse(src, f[1], f[3])) do
        if not index[d.name] then index[d.name] = d.text end
      end
    end
  end
  -- nn.ModuleList is defined (and documented) in Module.lua
  index["attn.nn.ModuleList"] = index["attn.nn.ModuleList"] or index["attn.nn.Module.ModuleList"]
  return index
end

-- The public tables whose values help() recognises, in order of preference
-- (attn.add before attn.Tensor.add: the same C function).
local function public_tables()
  local attn = require "attn"
  local nn = attn.nn
  for _, c in ipairs(M.nn_class_names()) do local _ = nn[c] end -- load every class
  return {
    { "attn", attn }, { "attn.nn", nn }, { "attn.viz", attn.viz }, { "attn.Tensor", attn.Tensor },
    { "attn.block_mask", attn.block_mask }, { "attn.tokenizer", attn.tokenizer },
    { "attn.tokenizer.Tokenizer", attn.tokenizer.Tokenizer }, { "attn.data", attn.data },
    { "attn.nn.functional", nn.functional }, { "attn.nn.utils", nn.utils }, { "attn.optim", attn.optim },
  }
end

-- The qualified public name of a function or class value, or nil.
local function name_of(value)
  for _, pt in ipairs(public_tables()) do
    local prefix, t = pt[1], pt[2]
    local keys = {}
    for k in pairs(t) do if type(k) == "string" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      if rawequal(t[k], value) then return prefix .. "." .. k end
    end
  end
  return nil
end

-- Levenshtein distance, for suggestions.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- Up to 5 documented names close to `name` (by edit distance of the last
-- component, or containing it).
local function suggestions(name)
  local want = name:lower():match("([^.]+)$") or name:lower()
  local scored = {}
  for full in pairs(M.index()) do
    local short = full:lower():match("([^.]+)$")
    local d = distance(want, short)
    if #short >= 3 and #want >= 3 and (short:find(want, 1, true) or want:find(short, 1, true)) then d = math.min(d, 1) end
    if d <= math.max(1, #want // 3) then scored[#scored + 1] = { full, d } end
  end
  -- names in the namespace asked for ("nn." of "nn.Lnear") first: others only when it has none
  local parent = name:match("^(.*)%.[^.]+$") -- name is normalised ("attn.nn.Lnear")
  local same = {}
  for _, sc in ipairs(scored) do
    if sc[1]:match("^(.*)%.[^.]+$") == parent then same[#same + 1] = sc end
  end
  if #same > 0 then scored = same end
  table.sort(scored, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  local out = {}
  for i = 1, math.min(5, #scored) do out[i] = scored[i][1]:gsub("^attn%.", "") end
  return out
end

-- "matmul", "attn.matmul", "nn.Linear", "Tensor:view", "t:view" -> the index name
-- (a class's file name, nn.TorchMultiheadAttention, is its class's name)
local function normalise(name)
  name = dotted(name):gsub("^%s+", ""):gsub("%s+$", ""):gsub("%(%)$", "")
  name = name:gsub("^t%.", "Tensor.")
  if not name:match("^attn%.") and name ~= "attn" then name = "attn." .. name end
  for class, file in pairs(nn_files()) do
    local rest = name:match("^attn%.nn%." .. file .. "(.*)$")
    if rest and (rest == "" or rest:sub(1, 1) == ".") then name = "attn.nn." .. class .. rest end
  end
  return name
end

-- Names in columns after a heading, wrapped at 78 columns.
local function name_columns(out, names)
  local line = " "
  for _, n in ipairs(names) do
    if #line + #n + 1 > 78 then out[#out + 1] = line; line = " " end
    line = line .. " " .. n
  end
  if line ~= " " then out[#out + 1] = line end
end

-- The topics listing: attn's functions, the tensor methods and the nn classes
-- (their documented names), then every area M.areas() finds, with its names.
local function topics()
  local attn = require "attn"
  local idx = M.index()
  local out = { "attn.help(name_or_value) explains one of these, e.g. attn.help(\"matmul\"), attn.help(nn.Linear):" }
  local groups = { { "attn functions", "^attn%.([%w_]+)$" }, { "tensor methods (t:name)", "^attn%.Tensor%.([%w_]+)$" },
    { "nn classes", "^attn%.nn%.(%u[%w_]*)$" } }
  for _, g in ipairs(groups) do
    local names = {}
    for full in pairs(idx) do
      local short = full:match(g[2])
      if short and (g[1] ~= "attn functions" or type(rawget(attn, short)) == "function") then
        names[#names + 1] = short
      end
    end
    table.sort(names)
    out[#out + 1] = ""
    out[#out + 1] = g[1] .. ":"
    name_columns(out, names)
  end
  for _, area in ipairs(M.areas()) do
    out[#out + 1] = ""
    out[#out + 1] = area.name .. (area.require and (" (require \"" .. area.name .. "\")") or "") .. ":"
    name_columns(out, area_names(area, idx))
  end
  return table.concat(out, "\n")
end

-- The documented methods of the tensors (t:name), sorted.
local function tensor_methods()
  local attn = require "attn"
  local idx, names = M.index(), {}
  for k, v in pairs(attn.Tensor) do
    if type(k) == "string" and not k:match("^_") and type(v) == "function"
        and (idx["attn.Tensor." .. k] or (rawequal(v, attn[k]) and idx["attn." .. k])) then
      names[#names + 1] = k
    end
  end
  table.sort(names)
  return names
end

-- The text for a tensor value: its shape and its methods.
local function tensor_text(t)
  local out = { ("attn.Tensor of shape [%s]: its methods (t:name(...); attn.help(\"Tensor.name\") explains one):")
    :format(table.concat(t:size(), ", ")) }
  name_columns(out, tensor_methods())
  return table.concat(out, "\n")
end

-- The first line of a doc text.
local function summary(text) return (text:match("^([^\n]*)")) end

-- "methods:" lines for an nn class: its own public methods, then the public
-- ones it inherits (from Module and any class between), each with the first
-- line of its doc. Hidden: `_names`, and the methods attn's own classes use
-- to build themselves and their fused calls (a user never calls them on a module).
local HIDDEN_METHODS = {
  init = true, extend = true, is_module = true, pyfloat = true, -- class building, extra_repr's helper
  direct_call = true, recording = true, linears_recording = true, -- the fused forwards' plumbing
  forward_modules = true, forward_cached = true, -- forward's reference path and its KV-cache path
}
local function class_methods(cls)
  local idx = M.index()
  local out, seen = {}, {}
  local c, first = cls, true
  while type(c) == "table" do
    local cname = rawget(c, "__name") or "Module"
    local names = {}
    for k, v in pairs(c) do
      if type(k) == "string" and type(v) == "function" and not k:match("^_") and not HIDDEN_METHODS[k]
          and not seen[k] then
        seen[k] = true
        names[#names + 1] = k
      end
    end
    table.sort(names)
    if #names > 0 then
      out[#out + 1] = first and "methods:" or ("methods from " .. cname .. ":")
      for _, k in ipairs(names) do
        -- an override without a doc of its own (Linear:extra_repr) has its ancestor's
        local doc
        local d = c
        while type(d) == "table" and not doc do
          doc = idx["attn.nn." .. (rawget(d, "__name") or "Module") .. "." .. k]
          d = rawget(d, "super")
        end
        out[#out + 1] = "  m:" .. k .. (doc and ("  " .. summary(doc)) or "")
      end
    end
    first = false
    c = rawget(c, "super")
  end
  return table.concat(out, "\n")
end

-- The nn class (a table) behind a name "attn.nn.Class", or nil.
local function nn_class(name)
  local short = name:match("^attn%.nn%.(%u[%w_]*)$")
  if not short then return nil end
  local ok, cls = pcall(function() return require("attn").nn[short] end)
  return ok and type(cls) == "table" and cls or nil
end

-- The text of `what`, or nil, the message and its kind: "unknown" (a name
-- with no doc) or "bad" (a value help cannot explain).
local function lookup(what)
  if what == nil then return topics() end
  local attn = require "attn"
  if attn.is_tensor(what) then return tensor_text(what) end
  local Module = require "attn.nn.Module"
  if Module.is_module(what) then what = getmetatable(what) end -- an instance: its class
  local name
  if type(what) == "string" then
    name = normalise(what)
  elseif type(what) == "function" or type(what) == "table" then
    name = name_of(what)
    if not name then
      return nil, "attn.help: bad argument #1 (expected a public attn function or class, or its name; got a "
        .. type(what) .. " that is none of them)", "bad"
    end
  else
    return nil, "attn.help: bad argument #1 (expected a public attn function or class, or its name; got "
      .. type(what) .. ")", "bad"
  end
  local idx = M.index()
  local text = idx[name]
  local method = name:match("^attn%.Tensor%.([%w_]+)$")
  if not text and method and rawequal(attn.Tensor[method], attn[method]) then
    -- t:add is attn.add: documented once, as the function
    name = "attn." .. method
    text = idx[name]
  end
  local short = name:match("^attn%.([%w_]+)$")
  if not text and short and idx["attn.Tensor." .. short] then
    -- a method by its short name: help("transpose") is Tensor:transpose
    name = "attn.Tensor." .. short
    text = idx[name]
  end
  if not text then
    local close = suggestions(name)
    local hint = #close > 0 and ("; did you mean " .. table.concat(close, ", ") .. "?")
      or "; attn.help() lists the topics"
    return nil, "attn.help: no doc for '" .. tostring(what) .. "'" .. hint, "unknown"
  end
  text = name .. "\n" .. text
  local cls = nn_class(name)
  if cls then
    local methods = class_methods(cls)
    if methods ~= "" then text = text .. "\n" .. methods end
  end
  return text
end

--- The help text of `what`: nil gives the topics; a public function or class
-- (its doc; a class also lists its methods), a module instance (its class), a
-- tensor (its methods) or a name. Raises an error naming close names when
-- there is no such documented name.
-- @param[opt] what a public function or class, a tensor, or a name
-- @return the text
function M.text(what)
  local text, msg = lookup(what)
  if not text then caller.error(msg) end
  return text
end

--- Prints the doc of a public function or class (see the module doc);
-- `attn.help()` lists the topics. An unknown name prints close names instead
-- (not an error); a value that is no public function, class, module or
-- tensor is an error. (`require("attn.tools.help").text(what)` returns the
-- text instead, and raises for unknown names.)
-- @param[opt] what a public function or class (`attn.matmul`, `nn.Linear`), a
-- tensor, a module, or a name (`"matmul"`, `"nn.Linear"`, `"Tensor.view"`, `"transpose"`)
function M.help(what)
  local text, msg, kind = lookup(what)
  if text then
    print(text)
  elseif kind == "unknown" then
    print(msg)
  else
    caller.error(msg)
  end
end

return M
