--- attn.help: the doc of a public function or class, read from the same LDoc
-- comments that `make doc` renders (one source of truth). Lua functions are
-- documented where they are defined; the C functions in lua/attn/tools/ldoc_core.lua
-- and lua/attn/tools/ldoc_tensor.lua (`@function` entries, no code).
--
--    attn.help()                      -- the topics
--    attn.help(attn.matmul)           -- by value
--    attn.help("matmul")              -- by name: "nn.Linear", "Tensor.view", "viz.show"
-- @module attn.tools.help
local M = {}

-- The Lua files whose doc comments are read, as module names; every class
-- file in attn/nn/ is added to these (see `source_files`).
local MODULE_FILES = {
  "attn", "attn.tools.ldoc_core", "attn.tools.ldoc_tensor", "attn.viz", "attn.format", "attn.tools.progress",
  "attn.tools.repl", "attn.tools.help", "attn.nn", "attn.autograd",
}

-- "attn.nn.Linear:forward" and "Tensor:view" are named with dots throughout.
local function dotted(name) return (name:gsub(":", ".")) end

-- The qualified name of `name` as written in a file of module `module`:
-- `attn.allclose` in attn, `viz.show` in attn.viz (the module's local table),
-- `Tensor.float` in attn (a field of the module), `matmul` (an @function entry).
local function qualify(module, name)
  name = dotted(name)
  local last = module:match("([^.]+)$")
  local first, rest = name:match("^([^.]+)(.*)$")
  if first == last then return module .. rest end
  return module .. "." .. name
end

--- The doc blocks of one Lua source text: a list of `{name = qualified name,
-- text = the description and parameter lines}`. A block starts with `---`;
-- it documents the module (`@module`, `@submodule`, `@classmod`), an
-- `@function NAME` entry, or the `function NAME(` / `NAME =` line after it.
-- @param source the file's text
-- @param[opt] module the module name when the file declares none
function M.parse(source, module)
  local docs = {}
  local lines = {}
  for line in (source .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
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
        module = kind
        -- a @submodule file adds to its module and does not document it again
        if not tags.submodule then name = kind end
      elseif tags["function"] then
        name = qualify(module or "attn", tags["function"])
      elseif i <= #lines then
        local target = lines[i]:match("^function%s+([%w_.:]+)%s*%(") or lines[i]:match("^([%w_][%w_.]*)%s*=")
        if target and module then name = qualify(module, target) end
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

--- The names of the nn classes: one per lua/attn/nn/NAME.lua (NAME
-- capitalised), as attn.nn finds them on first use, plus nn.ModuleList.
function M.nn_class_names()
  local init = package.searchpath("attn.nn", package.path)
  local names = { "ModuleList" }
  if init then
    for _, f in ipairs(list_dir(init:match("^(.*)[/\\]"))) do
      local name = f:match("^(%u[%w_]*)%.lua$")
      if name then names[#names + 1] = name end
    end
  end
  table.sort(names)
  return names
end

--- The source files read for docs: `{module name, path}` pairs.
function M.source_files()
  local files = {}
  local mods = {}
  for _, m in ipairs(MODULE_FILES) do mods[#mods + 1] = m end
  for _, c in ipairs(M.nn_class_names()) do
    if c ~= "ModuleList" then mods[#mods + 1] = "attn.nn." .. c end
  end
  for _, m in ipairs(mods) do
    local path = package.searchpath(m, package.path)
    if path then files[#files + 1] = { m, path } end
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
      for _, d in ipairs(M.parse(src, f[1])) do
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
  table.sort(scored, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  local out = {}
  for i = 1, math.min(5, #scored) do out[i] = scored[i][1]:gsub("^attn%.", "") end
  return out
end

-- "matmul", "attn.matmul", "nn.Linear", "Tensor:view", "t:view" -> the index name
local function normalise(name)
  name = dotted(name):gsub("^%s+", ""):gsub("%s+$", ""):gsub("%(%)$", "")
  name = name:gsub("^t%.", "Tensor.")
  if not name:match("^attn%.") and name ~= "attn" then name = "attn." .. name end
  return name
end

-- The topics listing: every documented public name, grouped.
local function topics()
  local groups = { { "attn functions", "^attn%.([%w_]+)$" }, { "tensor methods (t:name)", "^attn%.Tensor%.([%w_]+)$" },
    { "nn classes", "^attn%.nn%.(%u[%w_]*)$" }, { "attn.viz", "^attn%.viz%.([%w_]+)$" } }
  local out = { "attn.help(name_or_value) explains one of these, e.g. attn.help(\"matmul\"), attn.help(nn.Linear):" }
  local idx = M.index()
  for _, g in ipairs(groups) do
    local names = {}
    for full in pairs(idx) do
      local short = full:match(g[2])
      if short and (g[1] ~= "attn functions" or type(require("attn")[short]) == "function") then
        names[#names + 1] = short
      end
    end
    table.sort(names)
    out[#out + 1] = ""
    out[#out + 1] = g[1] .. ":"
    local line = " "
    for _, n in ipairs(names) do
      if #line + #n + 1 > 78 then out[#out + 1] = line; line = " " end
      line = line .. " " .. n
    end
    out[#out + 1] = line
  end
  return table.concat(out, "\n")
end

--- The help text of `what` (nil: the topics; a function or class; a name).
-- Raises an error naming close names when there is no such documented name.
-- @param[opt] what a public function or class, or its name
-- @return the text
function M.text(what)
  if what == nil then return topics() end
  local name
  if type(what) == "string" then
    name = normalise(what)
  elseif type(what) == "function" or type(what) == "table" then
    name = name_of(what)
    if not name then
      error("attn.help: bad argument #1 (expected a public attn function or class, or its name; got a "
        .. type(what) .. " that is none of them)", 3)
    end
  else
    error("attn.help: bad argument #1 (expected a public attn function or class, or its name; got "
      .. type(what) .. ")", 3)
  end
  local text = M.index()[name]
  local method = name:match("^attn%.Tensor%.([%w_]+)$")
  if not text and method and rawequal(require("attn").Tensor[method], require("attn")[method]) then
    -- t:add is attn.add: documented once, as the function
    name = "attn." .. method
    text = M.index()[name]
  end
  if not text then
    local close = suggestions(name)
    local hint = #close > 0 and ("; did you mean " .. table.concat(close, ", ") .. "?")
      or "; attn.help() lists the topics"
    error("attn.help: no doc for '" .. tostring(what) .. "'" .. hint, 3)
  end
  return name .. "\n" .. text
end

--- Prints the doc of a public function or class (see the module doc);
-- `attn.help()` lists the topics (`require("attn.tools.help").text(what)` returns the text instead).
-- @param[opt] what a public function or class (`attn.matmul`, `nn.Linear`), or
-- its name (`"matmul"`, `"nn.Linear"`, `"Tensor.view"`)
function M.help(what)
  print(M.text(what))
end

return M
