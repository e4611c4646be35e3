-- attn against PyTorch, interleaved: scripts/bench.lua, then the PyTorch
-- side (scripts/bench_torch.py) for the same cases, --pairs times, and a
-- table of each case's time on each side per pair, the ratio pair by pair
-- and its median. A VM's speed can drift by 10-20% over minutes, so a ratio
-- means something only between runs seconds apart; the median of several
-- such pairs is the figure to quote.
--   scripts/attn-lua scripts/bench_pairs.lua [--cases LIST] [--pairs N] [--reps N] [--threads N]
--                                            [--torch CMD] [--raw FILE]
-- --cases as bench.lua's (default train_gpt); --reps is passed to both sides;
-- --threads N sets OMP_NUM_THREADS for both (default: this process's);
-- --torch the command of the PyTorch side (default: /usr/bin/python3
-- scripts/bench_torch.py); --raw FILE keeps every JSON line of every run.
-- A case's time on a side is the time of its line whose kernel the other
-- side also has (tiny: CausalAttention with CausalAttention), else the
-- fastest of its lines (attn's flash or math against torch_sdpa). The attn
-- side also prints fma_peak (the machine's FMA limit on its threads, from
-- bench.lua), one figure per pair under the table.
-- Allocator: attn sets glibc's mmap threshold to 32 MiB and its trim
-- threshold to 64 MiB at load (mallopt in src/binding/lua_attn.c), so a
-- step's large tensors come from the heap instead of fresh, page-faulting
-- mmaps. The PyTorch side runs with the same two settings, through
-- GLIBC_TUNABLES (glibc.malloc.mmap_threshold and trim_threshold, prefixed
-- to its command, --torch included); without them its step time swings
-- with page faults. The attn side gets no GLIBC_TUNABLES (attn keeps the
-- environment's settings when it has any).
local opts = { cases = "train_gpt", pairs = 3, reps = 5, threads = nil, raw = nil,
               torch = "/usr/bin/python3 scripts/bench_torch.py" }
local function usage(msg)
  io.stderr:write("bench_pairs.lua: ", msg, "\n")
  os.exit(2)
end
local i = 1
while i <= #arg do
  local a, v = arg[i], arg[i + 1]
  if v == nil then usage("unknown or incomplete argument " .. a) end
  if a == "--cases" then opts.cases = v
  elseif a == "--pairs" or a == "--reps" or a == "--threads" then
    local n = math.tointeger(tonumber(v))
    if not n or n < 1 then usage(a .. " wants a positive integer, got " .. v) end
    opts[a:sub(3)] = n
  elseif a == "--torch" then opts.torch = v
  elseif a == "--raw" then opts.raw = v
  else usage("unknown or incomplete argument " .. a) end
  i = i + 2
end
if not opts.cases:match("^[%w_,]+$") then usage("--cases wants names like train_gpt,tiny; got " .. opts.cases) end

local launcher = arg[0]:gsub("bench_pairs%.lua$", "attn-lua")
local bench = arg[0]:gsub("bench_pairs%.lua$", "bench.lua")
local env = opts.threads and ("OMP_NUM_THREADS=" .. opts.threads .. " ") or ""
-- attn's mallopt values (src/binding/lua_attn.c: M_MMAP_THRESHOLD 32 << 20, M_TRIM_THRESHOLD 64 << 20)
local MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 64 << 20
local torch_env = string.format("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=%d:glibc.malloc.trim_threshold=%d ",
  MMAP_THRESHOLD, TRIM_THRESHOLD)
local sides = {
  { name = "attn", cmd = string.format("%s%s %s --cases fma_peak,%s --reps %d", env, launcher, bench, opts.cases, opts.reps) },
  { name = "torch", cmd = string.format("%s%s%s --cases %s --reps %d", env, torch_env, opts.torch, opts.cases, opts.reps) },
}
local raw = opts.raw and assert(io.open(opts.raw, "w"))

local parse = require("bench_lines").parse

-- one run of a side: {[case] = {[kernel] = ms}}, in the order cases appear;
-- an fma_peak line's gflops goes to fma_peaks
local fma_peaks = {}
local function run(side, order)
  local p = assert(io.popen(side.cmd .. " 2>/dev/null"))
  local got = {}
  for line in p:lines() do
    if raw then raw:write(side.name, " ", line, "\n") end
    local d = parse(line)
    if d.case == "fma_peak" and d.gflops then fma_peaks[#fma_peaks + 1] = string.format("%.4g", d.gflops) end
    if d.case and d.case ~= "sgemm_peak" and d.case ~= "membw" and d.case ~= "fma_peak" and d.ms then
      if not got[d.case] then
        got[d.case] = {}
        if not order.seen[d.case] then order.seen[d.case] = true; order[#order + 1] = d.case end
      end
      got[d.case][d.kernel or ""] = d.ms
    end
  end
  local ok, _, code = p:close()
  if not ok then
    io.stderr:write(string.format("bench_pairs.lua: the %s side failed (exit %s): %s\n", side.name, tostring(code),
      side.cmd))
    os.exit(1)
  end
  return got
end

-- the rows of a case: a kernel both sides have, each alone; else one row,
-- the fastest line of each side
local function rows_of(a, t)
  local rows = {}
  for kernel, ms in pairs(a) do
    if t[kernel] then rows[#rows + 1] = { kernel, ms, t[kernel] } end
  end
  if #rows == 0 then
    local best_a, best_t = math.huge, math.huge
    for _, ms in pairs(a) do best_a = math.min(best_a, ms) end
    for _, ms in pairs(t) do best_t = math.min(best_t, ms) end
    rows[1] = { "fastest", best_a, best_t }
  end
  table.sort(rows, function(x, y) return x[1] < y[1] end)
  return rows
end

local order, results = { seen = {} }, {}
for pair = 1, opts.pairs do
  io.stderr:write(string.format("bench_pairs: pair %d of %d\n", pair, opts.pairs))
  local a = run(sides[1], order)
  local t = run(sides[2], order)
  for case, kernels in pairs(a) do
    if t[case] then
      for _, r in ipairs(rows_of(kernels, t[case])) do
        local key = case .. " " .. r[1]
        results[key] = results[key] or { case = case, kernel = r[1], pairs = {} }
        table.insert(results[key].pairs, { attn = r[2], torch = r[3] })
      end
    end
  end
end
if raw then raw:close() end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

print(string.format("# %d pairs, reps %d, %s", opts.pairs, opts.reps,
  opts.threads and (opts.threads .. " thread(s)") or "threads as the environment sets"))
-- a column of one number per pair: up to 8 characters each, and its title
local width = math.max(22, 9 * opts.pairs)
local row = "%-34s %-" .. width .. "s %-" .. width .. "s %-" .. width .. "s %s"
print(string.format(row, "case kernel", "attn ms per pair", "torch ms per pair", "torch / attn per pair", "median"))
local any = false
for _, case in ipairs(order) do
  local keys = {}
  for key, r in pairs(results) do if r.case == case then keys[#keys + 1] = key end end
  table.sort(keys)
  for _, key in ipairs(keys) do
    any = true
    local a, t, ratio = {}, {}, {}
    for _, p in ipairs(results[key].pairs) do
      a[#a + 1] = string.format("%.4g", p.attn)
      t[#t + 1] = string.format("%.4g", p.torch)
      ratio[#ratio + 1] = p.torch / p.attn
    end
    local shown = {}
    for j, x in ipairs(ratio) do shown[j] = string.format("%.2f", x) end
    print(string.format(row, key, table.concat(a, " "), table.concat(t, " "), table.concat(shown, " "),
      string.format("%.2fx", median(ratio))))
  end
end
if #fma_peaks > 0 then print("# fma_peak GFLOP/s per pair (attn side): " .. table.concat(fma_peaks, " ")) end
if not any then
  io.stderr:write("bench_pairs.lua: no case was timed by both sides (cases: " .. opts.cases .. ")\n")
  os.exit(1)
end
