-- attn.dist benchmarks, one JSON object per line: each case run as P ranks
-- of 1 thread under mpirun against 1 process of P threads (and 1 process of
-- 1 thread, the baseline of both), on the same machine in the same run, and
-- the ratio of their times.
--   scripts/attn-lua scripts/bench_dist.lua [--cases LIST] [--np P] [--reps N]
-- LIST is comma-separated from the cases below (default: all). The script
-- launches the runs itself (mpirun --oversubscribe --allow-run-as-root -np P,
-- shared memory only) as workers (--worker CASE): a worker times its case on
-- world_size() ranks (1 without mpirun) and rank 1 prints the result.
--   train_gpt  one training step (forward, backward, clip_grad_norm_, AdamW) of
--              the bench GPTModel (vocab 256, context 128, emb 128, 4 heads,
--              4 layers) on a global batch of 16, each rank its share through
--              DistributedDataParallel; tokens_per_s of the global batch.
--   ring_B_causal  dist.ring_attention (layout "zigzag") on bench.lua's B_causal
--              shape (b 1, h 8, n 4096, E 64, causal), each rank its chunk,
--              against the whole sequence's scaled_dot_product_attention in
--              one process (scripts/lib/bench_ring.lua); ring_B_causal_bwd:
--              forward + backward; ring_B_causal_contiguous: layout "contiguous".
-- A case is a table in CASES: worker(opts, dist) returns the fields of its
-- line ({ms = per-run time on rank 1, ...}).
local attn = require "attn"

local opts = {cases = nil, np = 2, reps = 5, worker = nil}
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--cases" then opts.cases = arg[i + 1]; i = i + 1
  elseif a == "--np" then opts.np = math.tointeger(tonumber(arg[i + 1])); i = i + 1
  elseif a == "--reps" then opts.reps = math.tointeger(tonumber(arg[i + 1])); i = i + 1
  elseif a == "--worker" then opts.worker = arg[i + 1]; i = i + 1
  else io.stderr:write("bench_dist.lua: unknown argument " .. a .. "\n"); os.exit(2) end
  i = i + 1
end
if not opts.np or opts.np < 1 then io.stderr:write("bench_dist.lua: --np expects an integer >= 1\n"); os.exit(2) end
if not opts.reps or opts.reps < 1 then io.stderr:write("bench_dist.lua: --reps expects an integer >= 1\n"); os.exit(2) end

local format_line = require("bench_lines").format
local FIRST_KEYS = { "case", "procs", "threads", "ms" }
local function json(t) return format_line(t, FIRST_KEYS) end

-- median of a list of numbers
local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

local CASES = {}
local ORDER = {}

ORDER[#ORDER + 1] = "train_gpt"
CASES.train_gpt = {
  worker = function(o, dist)
    local rank, world = 1, 1
    if dist then rank, world = dist.rank(), dist.world_size() end
    local cfg = {vocab_size = 256, context_length = 128, emb_dim = 128, n_heads = 4, n_layers = 4, drop_rate = 0,
                 qkv_bias = false}
    local batch = 16
    assert(batch % world == 0, "train_gpt: the global batch of 16 must divide by the ranks")
    local share = batch // world
    attn.manual_seed(1)
    local model = attn.nn.GPTModel(cfg)
    local net = dist and dist.DistributedDataParallel(model) or model
    local opt = attn.optim.AdamW(model:parameters(), {lr = 1e-3, weight_decay = 0.1})
    local x = attn.randint(1, 257, {batch, cfg.context_length})
    local y = attn.randint(1, 257, {batch, cfg.context_length})
    x, y = x:narrow(1, (rank - 1) * share + 1, share), y:narrow(1, (rank - 1) * share + 1, share)
    local n = share * cfg.context_length
    local function step()
      local loss = attn.nn.functional.cross_entropy(net(x):view(n, 256), y:reshape(n))
      collectgarbage()
      opt:zero_grad()
      loss:backward()
      attn.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
      opt:step()
      collectgarbage()
    end
    step() -- warm-up
    local times = {}
    for _ = 1, o.reps do
      if dist then dist.barrier() end
      local t0 = attn.clock()
      step()
      if dist then dist.barrier() end
      times[#times + 1] = (attn.clock() - t0) * 1000
    end
    local ms = median(times)
    return {ms = ms, tokens_per_s = batch * cfg.context_length / (ms / 1000), batch = batch}
  end,
}

for _, c in ipairs({{"ring_B_causal", "zigzag", false}, {"ring_B_causal_bwd", "zigzag", true},
                   {"ring_B_causal_contiguous", "contiguous", false}}) do
  ORDER[#ORDER + 1] = c[1]
  CASES[c[1]] = {
    worker = function(o, dist)
      local ring = dofile((arg[0]:match("^(.*)/") or ".") .. "/lib/bench_ring.lua")
      if dist then return ring.ring(dist, c[2], o.reps, c[3]) end
      return ring.whole(o.reps, c[3])
    end,
  }
end

-- ---- worker: inside mpirun (or alone) -----------------------------------------------
if opts.worker then
  local case = CASES[opts.worker]
  if not case then io.stderr:write("bench_dist.lua: unknown case " .. opts.worker .. "\n"); os.exit(2) end
  local dist
  if os.getenv("OMPI_COMM_WORLD_SIZE") then
    dist = require "attn.dist"
    dist.init()
  end
  local r = case.worker(opts, dist)
  if not dist or dist.rank() == 1 then
    r.case = opts.worker
    r.procs = dist and dist.world_size() or 1
    r.threads = tonumber(os.getenv("OMP_NUM_THREADS") or "") or attn.blas_info().threads
    io.write(json(r), "\n")
  end
  return
end

-- ---- driver: each case as P ranks x 1 thread and 1 process x P threads ---------------
local script = arg[0]
local launcher = script:gsub("bench_dist%.lua$", "attn-lua")
local wanted = {}
if opts.cases and opts.cases ~= "all" then
  for c in opts.cases:gmatch("[^,]+") do
    if not CASES[c] then
      local known = table.concat(ORDER, ", ")
      io.stderr:write(("bench_dist.lua: unknown case %s (known: %s)\n"):format(c, known))
      os.exit(2)
    end
    wanted[#wanted + 1] = c
  end
else
  wanted = ORDER
end

local function run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok = p:close()
  local line = out:match("(%b{})")
  if not ok or not line then
    io.stderr:write("bench_dist.lua: failed: " .. cmd .. "\n" .. out)
    os.exit(1)
  end
  io.write(line, "\n")
  io.stdout:flush()
  return tonumber(line:match('"ms": ([%d.e+-]+)'))
end

for _, c in ipairs(wanted) do
  local common = (" %s --worker %s --reps %d"):format(script, c, opts.reps)
  local one = run(("OMP_NUM_THREADS=1 %s%s"):format(launcher, common))
  local single = run(("OMP_NUM_THREADS=%d %s%s"):format(opts.np, launcher, common))
  local multi = run(("OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe "
    .. "--bind-to none -x OMP_NUM_THREADS=1 -np %d %s%s"):format(opts.np, launcher, common))
  -- ranks_over_threads: P ranks' time over P threads'; speedups: over 1 process x 1 thread
  io.write(json({case = c .. "_ratio", procs = opts.np, ranks_over_threads = multi / single,
    ranks_speedup = one / multi, threads_speedup = one / single}), "\n")
end
