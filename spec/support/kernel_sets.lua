--- Running one child script under each kernel set (ATTN_CPU) and thread
-- count, for the specs that compare the sets' results bit for bit: the set
-- is chosen once, when attn is required, so each choice needs its own
-- process. `require "support.kernel_sets"`.
--   local sets = require("support.kernel_sets").new(CHILD)
--   local dir = sets.run("avx2", 1)   -- the child's files, written once per (set, threads)
--   sets.read_bytes(dir .. "/x.npy"); teardown(sets.cleanup)
-- The child gets its output directory as arg[1], prints the kernel set it
-- ran first and "END" last.
local assert = require "luassert"

local M = {}

function M.read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function M.new(child_source)
  local tmp = os.tmpname()
  os.remove(tmp)
  assert(os.execute("mkdir -p " .. tmp))
  local script = tmp .. "/child.lua"
  local f = assert(io.open(script, "w"))
  f:write(child_source)
  f:close()

  local done = {}
  local sets = { read_bytes = M.read_bytes }
  -- the child's directory for (choice, threads); run at the first call only
  function sets.run(choice, threads)
    local dir = ("%s/%s_%d"):format(tmp, choice, threads)
    if done[dir] then return dir end
    assert(os.execute("mkdir -p " .. dir))
    local p = assert(io.popen(("ATTN_CPU=%s OMP_NUM_THREADS=%d scripts/attn-lua %s %s 2>&1"):format(choice, threads,
      script, dir)))
    local text = p:read("a")
    p:close()
    assert(text:find("\nEND\n", 1, true), ("child ATTN_CPU=%s failed: %s"):format(choice, text:sub(1, 400)))
    assert.are.equal(choice, text:match("^([^\n]*)"), "the child ran another kernel set")
    done[dir] = true
    return dir
  end
  function sets.cleanup() os.execute("rm -rf '" .. tmp .. "'") end
  return sets
end

return M
