--- Where an error raised in the Lua layer should point: at the user's code
-- that called into attn (a script, a spec, the REPL), never at a file of
-- the library, however deep the call went.
--
--   local caller = require "attn.caller"
--   caller.error("attn.fn: bad argument #1 ...")         -- the message, at the user's line
--   error(msg, caller.level())                         -- the same, as a level for error()
-- @module attn.caller
local M = {}

-- Every file of the Lua layer lives under the directory of this one (the
-- folder that require found for "attn"), subfolders included.
local PREFIX = debug.getinfo(1, "S").source:match("^(@.*[/\\])[^/\\]+$")

--- The chunk-source prefix of the library's files ("@.../attn/"), or nil.
M.PREFIX = PREFIX

-- The binding's errors skip the same frames (src/binding/lua_util.c reads it).
if PREFIX then debug.getregistry()["attn.lua_source_prefix"] = PREFIX end

-- The first frame, counting from getinfo's frame l of the caller of this
-- function, that is not a Lua function of the library. A C function such as
-- pcall ends the walk: what it catches is the catcher's to word (error()
-- then adds no position, as for an error of a C function).
local function first_outside(l)
  while true do
    local info = debug.getinfo(l + 1, "S")
    if info == nil or info.what == "C" or PREFIX == nil or info.source:sub(1, #PREFIX) ~= PREFIX then return l end
    l = l + 1
  end
end

--- The level, for `error(msg, level)` raised by the function that calls this,
-- of the first function outside the library (the position is left out when
-- that is a C function, as for an error of a C function called directly).
function M.level()
  -- getinfo's numbering here: 1 this function, 2 its caller (level 1 for error() there)
  return first_outside(3) - 1
end

--- Raises msg at the first caller outside the library.
function M.error(msg)
  error(msg, first_outside(2)) -- here getinfo's and error()'s numbering agree: 1 is this function
end

return M
