-- Shapes or calls that differ across ranks raise the same error on every
-- rank (never a hang), bad arguments name dist.<fn> and the argument, and the
-- ranks stay in step after each caught error.
package.path = arg[0]:match("^(.*/)") .. "?.lua;" .. package.path
local attn = require "attn"
local dist = require "attn.dist"
local check = require "check"

local r, P = check.start()
local raises = check.raises

raises("all_reduce: shapes that differ across ranks", {"dist.all_reduce: tensor shapes differ across ranks",
  "rank 1 has [2, 3]", "rank 2 has [3, 3]"}, dist.all_reduce, attn.zeros(r == 1 and 2 or 3, 3))
raises("all_reduce: ops that differ across ranks", {"dist.all_reduce: the ranks gave different ops",
  "rank 1 'sum'", "'max'"}, dist.all_reduce, attn.zeros(2), r == 1 and "sum" or "max")
raises("broadcast: roots that differ across ranks", {"dist.broadcast: the ranks gave different roots"},
  dist.broadcast, attn.zeros(2), r == 1 and 1 or 2)
raises("all_gather: shapes that differ across ranks", {"dist.all_gather: tensor shapes differ across ranks"},
  dist.all_gather, attn.zeros(r))
raises("different collectives on different ranks", {"the ranks called different collectives",
  "rank 1 called dist.all_reduce", "called dist.broadcast"}, function()
    if r == 1 then dist.all_reduce(attn.zeros(2)) else dist.broadcast(attn.zeros(2), 1) end
  end)
raises("a barrier against an all_reduce", {"the ranks called different collectives", "dist.barrier"}, function()
  if r == 1 then dist.barrier() else dist.all_reduce(attn.zeros(2)) end
end)

-- send / recv of different shapes: the receiver raises, naming both, and the
-- message is consumed (the next one arrives right)
if r == 1 then
  dist.send(attn.zeros(2, 3), 2)
  dist.send(attn.full({4}, 7), 2)
elseif r == 2 then
  raises("recv: a shape other than the one sent", {"dist.recv: shape mismatch: rank 1 sent [2, 3]",
    "the receiving tensor is [3, 2]"}, dist.recv, attn.zeros(3, 2), 1)
  local t = attn.zeros(4)
  dist.recv(t, 1)
  check.close("recv after a refused one gets the next message", t, attn.full({4}, 7), 0)
end
if r == 1 then
  dist.isend(attn.zeros(5), 2):wait()
elseif r == 2 then
  local req = dist.irecv(attn.zeros(6), 1)
  raises("irecv: a shape other than the one sent, at wait", {"dist.wait: shape mismatch: rank 1 sent [5]",
    "the receiving tensor is [6]"}, req.wait, req)
end

-- bool tensors: reduced by max / min only, gathered as bool, and a bool
-- tensor receives only what a bool tensor sent
raises("all_reduce: a bool tensor summed", {"dist.all_reduce: bad argument #1 't'", "bool", "'sum'"},
  dist.all_reduce, attn.tensor({1, 0}):bool())
local flags = attn.tensor({r == 1 and 1 or 0, 1}):bool()
dist.all_reduce(flags, "max")
check.close("all_reduce max of bool tensors", flags, attn.tensor({1, 1}):bool(), 0)
local gb = dist.all_gather(attn.tensor({1, 0}):bool())
check.report("all_gather of a bool tensor is bool", gb.dtype == "bool", gb.dtype)
raises("broadcast: a bool tensor on one rank, a float one on another", {"dist.broadcast: tensor kinds differ"},
  dist.broadcast, r == 1 and attn.zeros(2):bool() or attn.zeros(2), 1)
if r == 1 then
  dist.send(attn.full({2}, 0.5), 2)
elseif r == 2 then
  raises("recv: floats into a bool tensor", {"dist.recv: rank 1 sent a float tensor, the receiving tensor is a bool one"},
    dist.recv, attn.zeros(2):bool(), 1)
end

-- bad arguments, the same on every rank
raises("all_reduce: not a tensor", {"dist.all_reduce: bad argument #1 't' (expected attn.Tensor, got nil)"},
  dist.all_reduce, nil)
raises("all_reduce: an unknown op", {"dist.all_reduce: bad argument #2 'op'", '"prod"'}, dist.all_reduce,
  attn.zeros(2), "prod")
raises("all_reduce: an expanded tensor", {"dist.all_reduce: bad argument #1 't'", "share memory"},
  dist.all_reduce, attn.zeros(1, 3):expand(4, 3))
raises("broadcast: root 0", {"dist.broadcast: bad argument #2 'root' (expected a rank in 1.." .. P .. ", got 0)"},
  dist.broadcast, attn.zeros(2), 0)
raises("broadcast: root past the world", {"dist.broadcast: bad argument #2 'root'"}, dist.broadcast,
  attn.zeros(2), P + 1)
raises("send: dst not a number", {"dist.send: bad argument #2 'dst'", "got string"}, dist.send, attn.zeros(2), "x")
raises("send to this rank itself, as PyTorch 1.13 refuses it", {"dist.send: bad argument #2 'dst' (expected another rank than this one",
  "got " .. r .. ")"}, dist.send, attn.zeros(2), r)
raises("recv from this rank itself", {"dist.recv: bad argument #2 'src' (expected another rank than this one"},
  dist.recv, attn.zeros(2), r)
do -- isend / irecv with itself is fine
  local got = attn.zeros(3)
  local rq = dist.irecv(got, r, 5)
  dist.isend(attn.full({3}, r), r, 5):wait()
  rq:wait()
  check.close("isend / irecv with this rank itself", got, attn.full({3}, r), 0)
end
raises("recv: a negative tag", {"dist.recv: bad argument #3 'tag'"}, dist.recv, attn.zeros(2), r % P + 1, -1)
raises("isend: not a tensor", {"dist.isend: bad argument #1 't' (expected attn.Tensor, got table)"}, dist.isend,
  {}, 1)
raises("wait_all: not requests", {"dist.wait_all: bad argument #1 'reqs'"}, dist.wait_all, {1})
raises("DistributedDataParallel: not a module", {"dist.DistributedDataParallel: bad argument #1 'model'"},
  dist.DistributedDataParallel, 42)
raises("DistributedDataParallel: a bad bucket_mb", {"dist.DistributedDataParallel: bad option 'bucket_mb'"},
  dist.DistributedDataParallel, attn.nn.Linear(2, 2), {bucket_mb = 0})

-- still in step
local t = attn.ones(3)
dist.all_reduce(t)
check.close("after the caught errors, a sum of ones", t, attn.full({3}, P), 0)
dist.finalize()
raises("a call after finalize", {"dist.all_reduce", "after dist.finalize()"}, dist.all_reduce, attn.zeros(1))
check.report("finalized: is_initialized() is false", dist.is_initialized() == false)
