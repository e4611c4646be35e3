--- attn.dist: several processes, launched by Open MPI's mpirun, working on
-- one job (PyTorch's torch.distributed, 1-based ranks).
--
--   mpirun -np 2 scripts/attn-lua script.lua
--   local dist = require "attn.dist"
--   dist.init()
--   dist.all_reduce(t)            -- in place: the sum over the ranks
--
-- Ranks and roots are 1-based (1..world_size()). Tensors may be strided: they
-- are packed into a contiguous buffer to send and unpacked into place on
-- receipt. Collectives compare the ranks' shapes (and which collective each
-- rank called) before moving any data: a difference is the same error on
-- every rank, not a hang. A Lua error on one rank ends the whole job when the
-- script runs under attn-lua (attn.tools.run_script calls dist.abort).
-- @module attn.dist
local ok, core = pcall(require, "attn.dist_core")
if not ok then
  error("attn.dist needs Open MPI, and attn built with it: install the Debian packages libopenmpi-dev and "
    .. "openmpi-bin ('make deps' does), then run 'make' again (" .. tostring(core):match("^[^\n]*") .. ")", 2)
end
local attn = require "attn"
local argcheck = require "attn.argcheck"

local fail = argcheck.fail

local M = {}

local function check_tensor(fname, t, argn, what)
  return argcheck.check_tensor(fname, t, argn or 1, what or "t")
end

-- An in-place target: no two elements may share memory (an expanded view).
local function check_writable(fname, t, argn)
  check_tensor(fname, t, argn)
  if t:has_internal_overlap() then
    fail(fname, "bad argument #%d 't' (an expanded tensor whose elements share memory cannot be written in place; "
      .. "clone it first)", argn or 1)
  end
end

local function check_rank(fname, r, argn, what)
  local n = core.world_size()
  if math.type(r) ~= "integer" and not (type(r) == "number" and r == math.floor(r)) then
    argcheck.arg_error(fname, argn, what, ("a rank (an integer in 1..%d)"):format(n), argcheck.describe(r))
  end
  r = math.tointeger(r)
  if r < 1 or r > n then
    argcheck.arg_error(fname, argn, what, ("a rank in 1..%d"):format(n), tostring(r))
  end
  return r
end

local function check_tag(fname, tag, argn)
  if tag ~= nil and math.type(tag) ~= "integer" then
    argcheck.arg_error(fname, argn, "tag", "an integer", argcheck.describe(tag))
  end
  return tag
end

local function running(fname)
  if not core.is_initialized() then
    fail(fname, core.is_finalized() and "called after dist.finalize()" or "call dist.init() first")
  end
end

-- Write buf (a contiguous copy) back into the strided t; outside autograd,
-- as torch.distributed's in-place collectives.
local function unpack_into(t, buf)
  attn.no_grad(function() t:copy_(buf) end)
end

--- Start MPI (MPI_Init_thread, MPI_THREAD_FUNNELED: attn's OpenMP threads
-- never call MPI). Calling it again does nothing.
function M.init()
  core.init()
end

--- Whether init() was called and finalize() not yet.
function M.is_initialized() return core.is_initialized() end

--- End MPI (MPI_Finalize). Done at exit too when the script does not.
function M.finalize() core.finalize() end

--- End every rank of the job now with this exit code (MPI_Abort).
function M.abort(code) core.abort(code or 1) end

--- This process's rank, 1..world_size().
function M.rank()
  running("dist.rank")
  return core.rank()
end

--- The number of ranks.
function M.world_size()
  running("dist.world_size")
  return core.world_size()
end

--- Wait until every rank has called barrier().
function M.barrier()
  running("dist.barrier")
  core.barrier()
end

local OPS = {sum = true, avg = true, max = true, min = true}

--- Reduce t over the ranks, in place on every rank: op "sum" (default),
-- "avg" (the sum divided by world_size()), "max" or "min". Sums are reduced
-- to rank 1 and broadcast, so every rank gets the same bits.
function M.all_reduce(t, op)
  local fname = "dist.all_reduce"
  running(fname)
  check_writable(fname, t, 1)
  if op == nil then op = "sum" end
  if not OPS[op] then
    argcheck.arg_error(fname, 2, "op", '"sum", "avg", "max" or "min"', argcheck.describe(op, {strings = true}))
  end
  if t:is_contiguous() then
    core.all_reduce(t, op)
  else
    local buf = t:contiguous()
    core.all_reduce(buf, op)
    unpack_into(t, buf)
  end
  return t
end

--- Copy rank `root`'s t into t on every other rank (in place).
function M.broadcast(t, root)
  local fname = "dist.broadcast"
  running(fname)
  check_writable(fname, t, 1)
  root = check_rank(fname, root, 2, "root")
  if t:is_contiguous() then
    core.broadcast(t, root)
  else
    local buf = t:contiguous()
    core.broadcast(buf, root)
    if core.rank() ~= root then unpack_into(t, buf) end
  end
  return t
end

--- A new tensor [world_size(), ...t's shape]: row r is rank r's t.
function M.all_gather(t)
  local fname = "dist.all_gather"
  running(fname)
  check_tensor(fname, t, 1)
  local shape = t:size()
  table.insert(shape, 1, core.world_size())
  local out = attn.empty(shape)
  core.all_gather(t:contiguous(), out)
  if t.dtype == "bool" then out = out:bool() end -- the gathered 0/1 values, of t's kind
  return out
end

-- A blocking send or receive with this rank itself would wait forever
-- (PyTorch 1.13's send refuses it the same way).
local function check_not_self(fname, r, argn, what)
  if r == core.rank() then
    argcheck.arg_error(fname, argn, what, "another rank than this one (a blocking " .. fname:match("%.(.*)$")
      .. " with itself would wait forever; use isend / irecv)", tostring(r))
  end
  return r
end

--- Send t to rank dst (blocking: returns when t may be changed again).
-- tag (an integer >= 0, default 0) tells messages between the same ranks apart.
function M.send(t, dst, tag)
  local fname = "dist.send"
  running(fname)
  check_tensor(fname, t, 1)
  dst = check_not_self(fname, check_rank(fname, dst, 2, "dst"), 2, "dst")
  core.send(t:contiguous(), dst, check_tag(fname, tag, 3))
end

--- Receive into t (in place) what rank src sent with the same tag; the shape
-- sent must be t's.
function M.recv(t, src, tag)
  local fname = "dist.recv"
  running(fname)
  check_writable(fname, t, 1)
  src = check_not_self(fname, check_rank(fname, src, 2, "src"), 2, "src")
  tag = check_tag(fname, tag, 3)
  if t:is_contiguous() then
    core.recv(t, src, tag)
  else
    local buf = t:contiguous()
    core.recv(buf, src, tag)
    unpack_into(t, buf)
  end
  return t
end

--- A pending isend or irecv: req:wait() completes it (an irecv's tensor
-- holds the data after it), req:test() says whether it completed.
local Request = {}
Request.__index = Request
Request.__name = "attn.dist.Request"

local function new_request(creq, target, buf)
  return setmetatable({_req = creq, _target = target, _buf = buf}, Request)
end

function Request:wait()
  if getmetatable(self) ~= Request then
    argcheck.arg_error("dist.Request:wait", 1, "self", "a request from dist.isend or dist.irecv",
      argcheck.typename(self))
  end
  if self._req then
    local creq = self._req
    self._req = nil
    creq:wait()
    if self._target then unpack_into(self._target, self._buf) end
    self._target, self._buf = nil, nil
  end
end

function Request:test()
  if self._req and not self._req:test() then return false end
  self:wait()
  return true
end

function Request:__tostring()
  return self._req and tostring(self._req) or "attn.dist.Request(done)"
end

--- Start sending t to rank dst; returns a request. t must not change until
-- req:wait() returns (a strided t is packed at once, and may).
function M.isend(t, dst, tag)
  local fname = "dist.isend"
  running(fname)
  check_tensor(fname, t, 1)
  return new_request(core.isend(t:contiguous(), check_rank(fname, dst, 2, "dst"), check_tag(fname, tag, 3)))
end

--- Start receiving into t what rank src sends; returns a request: t holds
-- the data once req:wait() returns.
function M.irecv(t, src, tag)
  local fname = "dist.irecv"
  running(fname)
  check_writable(fname, t, 1)
  src = check_rank(fname, src, 2, "src")
  tag = check_tag(fname, tag, 3)
  if t:is_contiguous() then return new_request(core.irecv(t, src, tag)) end
  local buf = attn.empty(t:size())
  return new_request(core.irecv(buf, src, tag), t, buf)
end

--- Wait for every request of the list.
function M.wait_all(reqs)
  if type(reqs) ~= "table" then argcheck.arg_error("dist.wait_all", 1, "reqs", "a list of requests", type(reqs)) end
  for i, r in ipairs(reqs) do
    if getmetatable(r) ~= Request then
      argcheck.arg_error("dist.wait_all", 1, "reqs", "a list of requests",
        ("a list whose item %d is %s"):format(i, argcheck.typename(r)))
    end
  end
  for _, r in ipairs(reqs) do r:wait() end
end

--- dist.DistributedDataParallel(model[, {bucket_mb = 25}]): see attn.dist.ddp.
M.DistributedDataParallel = require("attn.dist.ddp")(M)

--- The class of the requests dist.isend and dist.irecv return (req:wait(), req:test()).
M.Request = Request
M._core = core

-- dist.ring_attention, dist.zigzag_split, dist.zigzag_merge (attn.dist.ring)
require("attn.dist.ring").install(M)

return M
