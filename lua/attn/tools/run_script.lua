-- Runs a script as lua5.4 would (`lua5.4 script.lua args`: the same `arg`
-- table, `...`, message and exit status 1 on an error), except that when the
-- script raised after attn.dist was started, the message is printed with the
-- rank and the whole MPI job is ended (MPI_Abort): the other ranks may be
-- blocked in a collective that the failed rank will never join.
-- attn-lua runs scripts through this file under mpirun (OMPI_COMM_WORLD_SIZE set):
--   lua5.4 .../attn/tools/run_script.lua script.lua args...
local script = arg[1]
local new_arg = {[-1] = arg[-1], [0] = script}
for i = 2, #arg do new_arg[i - 1] = arg[i] end
arg = new_arg -- luacheck: ignore (the script's global, as lua5.4 sets it)

-- lua.c's message handler: a non-string error object by its __tostring or type
local function handler(msg)
  if type(msg) ~= "string" then
    local mt = getmetatable(msg)
    if mt and mt.__tostring then
      msg = tostring(msg)
    else
      msg = ("(error object is a %s value)"):format(type(msg))
    end
  end
  return debug.traceback(msg, 2)
end

local function fail(msg)
  local dist = package.loaded["attn.dist"]
  if type(dist) == "table" and dist.is_initialized and dist.is_initialized() then
    local ok, where = pcall(function() return ("rank %d of %d"):format(dist.rank(), dist.world_size()) end)
    io.stderr:write(("attn-lua: %s: %s\nattn-lua: ending the MPI job (MPI_Abort)\n"):format(ok and where or "rank ?",
      msg))
    io.stderr:flush()
    io.stdout:flush()
    dist.abort(1)
  end
  io.stderr:write("lua5.4: " .. msg .. "\n")
  io.stderr:flush()
  os.exit(1, true)
end

local chunk, err = loadfile(script)
if not chunk then fail(err) end
local ok, msg = xpcall(chunk, handler, table.unpack(arg, 1, #arg))
if not ok then fail(msg) end
