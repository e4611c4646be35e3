-- Every collective and point-to-point call against a local computation: each
-- rank makes every rank's data from that rank's seed (check.data_of), so it
-- knows what the others hold.
package.path = arg[0]:match("^(.*/)") .. "?.lua;" .. package.path
local attn = require "attn"
local dist = require "attn.dist"
local check = require "check"
local core = require "attn.core"

local r, P = check.start()
local close = check.close

-- all_reduce: sum, avg, max, min on contiguous data
local function all_of(seed, ...)
  local list = {}
  for q = 1, P do list[q] = check.data_of(q, seed, ...) end
  return list
end
local xs = all_of(1, 3, 5)
local sum, mx, mn = xs[1]:clone(), xs[1]:clone(), xs[1]:clone()
for q = 2, P do sum = sum + xs[q]; mx = attn.maximum(mx, xs[q]); mn = attn.minimum(mn, xs[q]) end
local t = xs[r]:clone()
local v0 = core._version(t)
local same = dist.all_reduce(t)
close("all_reduce sum", t, sum, 1e-6)
check.report("all_reduce returns its tensor", same == t)
check.report("all_reduce bumps the version counter", core._version(t) == v0 + 1, core._version(t))
t = xs[r]:clone(); dist.all_reduce(t, "avg"); close("all_reduce avg", t, sum / P, 1e-6)
t = xs[r]:clone(); dist.all_reduce(t, "max"); close("all_reduce max", t, mx, 0)
t = xs[r]:clone(); dist.all_reduce(t, "min"); close("all_reduce min", t, mn, 0)

-- every rank holds the same bits of a sum
t = xs[r]:clone(); dist.all_reduce(t)
local g = dist.all_gather(t)
for q = 1, P do close("all_reduce sum: rank " .. q .. "'s bits are rank 1's", g[q], g[1], 0) end
io.stdout:write(("rank %d bits %s\n"):format(r, table.concat((function()
  local out = {}
  for i, x in ipairs(t:view(-1):totable()) do out[i] = ("%a"):format(x) end
  return out
end)(), " ")))

-- strided: a transposed view and a narrowed column block, written in place
local base = xs[r]:clone()
local tv = base:t()
dist.all_reduce(tv)
close("all_reduce on a transposed view", base, sum, 1e-6)
local wide = attn.zeros(3, 9)
local block = wide:narrow(2, 3, 5)
block:copy_(xs[r])
dist.all_reduce(block, "max")
close("all_reduce on a narrowed view: the block", block, mx, 0)
close("all_reduce on a narrowed view: the rest untouched", wide:narrow(2, 1, 2), attn.zeros(3, 2), 0)

-- an empty tensor and a 0-dim one
local e = attn.zeros(0, 4)
dist.all_reduce(e)
close("all_reduce of an empty tensor", e, attn.zeros(0, 4), 0)
local s = attn.tensor(r * 1.0)
dist.all_reduce(s)
close("all_reduce of a 0-dim tensor", s, attn.tensor(P * (P + 1) / 2), 0)

-- broadcast from the last rank, contiguous and strided
t = xs[r]:clone()
dist.broadcast(t, P)
close("broadcast from rank P", t, xs[P], 0)
base = xs[r]:clone()
dist.broadcast(base:t(), 1)
close("broadcast into a transposed view", base, xs[1], 0)

-- all_gather: a strided input; the result is [P, ...]
local gathered = dist.all_gather(xs[r]:t())
local want = {}
for q = 1, P do want[q] = xs[q]:t() end
close("all_gather of a transposed view", gathered, attn.stack(want), 0)

-- send / recv around the ring, one tag each way; a strided send and receive
local nxt, prv = r % P + 1, (r - 2) % P + 1
local ys = all_of(2, 4, 2)
if r % 2 == 1 then
  dist.send(ys[r]:t(), nxt, 3)
  local into = attn.zeros(4, 2)
  dist.recv(into:t(), prv, 3)
  close("send / recv around the ring (odd ranks send first)", into, ys[prv], 0)
else
  local into = attn.zeros(4, 2)
  dist.recv(into:t(), prv, 3)
  dist.send(ys[r]:t(), nxt, 3)
  close("send / recv around the ring (even ranks receive first)", into, ys[prv], 0)
end

-- isend / irecv both ways at once (no order needed), two tags in flight
local a_in, b_in = attn.zeros(2, 4), attn.zeros(4, 2):t()
local reqs = {
  dist.irecv(a_in, prv, 1),
  dist.irecv(b_in, nxt, 2),
  dist.isend(ys[r]:t(), nxt, 1),
  dist.isend(ys[r]:t(), prv, 2),
}
dist.wait_all(reqs)
close("isend / irecv from the previous rank", a_in, ys[prv]:t(), 0)
close("isend / irecv from the next rank into a strided tensor", b_in, ys[nxt]:t(), 0)
reqs[1]:wait() -- a second wait does nothing
check.report("a completed request tests true", reqs[2]:test() == true)

-- barrier, and a last sum: the ranks are still in step
dist.barrier()
t = attn.ones(2)
dist.all_reduce(t)
close("after everything, a sum of ones", t, attn.full({2}, P), 0)
