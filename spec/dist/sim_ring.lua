-- A simulated ring of P ranks in one Lua process, for the ring attention's
-- specs without MPI: each rank is a coroutine with a communicator of its own;
-- a message is a copy queued from sender to receiver (FIFO per pair and tag,
-- as MPI matches them), a receive waits (yields) until its message is there, and
-- all_gather waits for every rank. run() steps the ranks round-robin and
-- reports a deadlock (every live rank waiting and nothing arriving).
local attn = require "attn"

local S = {}

local function sizes_str(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

--- Run fn(comm, rank) on P simulated ranks; returns the list of each rank's
-- results (packed), or raises the first rank's error (prefixed by its rank).
function S.run(P, fn)
  local queues = {} -- queues[src][dst][tag] = list of tensors
  for a = 1, P do
    queues[a] = {}
    for b = 1, P do queues[a][b] = setmetatable({}, { __index = function(q, tag) q[tag] = {} return q[tag] end }) end
  end
  local gathers, gather_round = {}, {}
  local moved = false -- any message or gather progress in this round
  local comms = {}
  for r = 1, P do
    local comm = {}
    function comm.rank() return r end
    function comm.world_size() return P end
    function comm.isend(t, dst, tag)
      table.insert(queues[r][dst][tag or 0], t:clone())
      moved = true
      return { wait = function() end }
    end
    function comm.irecv(t, src, tag)
      local done = false
      return { wait = function()
        if done then return end
        local q = queues[src][r][tag or 0]
        while #q == 0 do coroutine.yield() end
        local m = table.remove(q, 1)
        moved = true
        if sizes_str(m) ~= sizes_str(t) then
          error(("simulated recv on rank %d from %d: message %s into buffer %s"):format(r, src, sizes_str(m),
            sizes_str(t)), 0)
        end
        t:copy_(m)
        done = true
      end }
    end
    function comm.send(t, dst, tag) comm.isend(t, dst, tag):wait() end
    function comm.recv(t, src, tag) comm.irecv(t, src, tag):wait() end
    function comm.all_gather(t)
      local round = (gather_round[r] or 0) + 1
      gather_round[r] = round
      gathers[round] = gathers[round] or { n = 0 }
      local g = gathers[round]
      g[r], g.n = t:clone(), g.n + 1
      moved = true
      while g.n < P do coroutine.yield() end
      local list = {}
      for j = 1, P do list[j] = g[j] end
      return attn.stack(list, 1)
    end
    comms[r] = comm
  end
  local cos, results, live = {}, {}, P
  for r = 1, P do
    cos[r] = coroutine.create(function() return table.pack(fn(comms[r], r)) end)
  end
  local idle = 0
  while live > 0 do
    moved = false
    for r = 1, P do
      local co = cos[r]
      if co and coroutine.status(co) == "suspended" then
        local ok, res = coroutine.resume(co)
        if not ok then error(("rank %d: %s"):format(r, tostring(res)), 0) end
        if coroutine.status(co) == "dead" then
          results[r], cos[r], live, moved = res, nil, live - 1, true
        end
      end
    end
    idle = moved and 0 or idle + 1
    if idle > 2 then error("simulated ring: deadlock (every live rank waits for a message that never comes)", 0) end
  end
  return results
end

return S
