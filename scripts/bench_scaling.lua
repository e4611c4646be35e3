-- OpenMP scaling: scripts/bench.lua once per thread count, then one table of
-- each case's figure by thread count, its speedup over the first count, its
-- ratio to the sgemm_peak of the same run (so a slow OpenBLAS core or a busy
-- machine shows as such rather than as a slow kernel), and, after a "|", its
-- ratio to the same run's fma_peak (the machine's FMA limit on those threads).
--   scripts/attn-lua scripts/bench_scaling.lua [--threads 1,2,4] [--cases LIST] [--reps N] [--raw FILE]
-- --cases as bench.lua's (default fma_peak,sgemm_peak,A,A_causal,A_bwd,decode,tiny,train_gpt;
-- fma_peak and sgemm_peak are always added); --raw FILE keeps every JSON line of every run.
-- The figure of a line is tokens_per_s, gbps, us_per_call or gflops, the
-- first it has; for decode and membw the ratio column is to membw instead.
local opts = { threads = "1,2", cases = "fma_peak,sgemm_peak,A,A_causal,A_bwd,decode,tiny,train_gpt", reps = 3, raw = nil }
local i = 1
while i <= #arg do
  local a, v = arg[i], arg[i + 1]
  if a == "--threads" and v then opts.threads = v
  elseif a == "--cases" and v then opts.cases = v
  elseif a == "--reps" and v then opts.reps = tonumber(v)
  elseif a == "--raw" and v then opts.raw = v
  else io.stderr:write("bench_scaling.lua: unknown or incomplete argument " .. a .. "\n"); os.exit(2) end
  i = i + 2
end
if not opts.cases:find("sgemm_peak", 1, true) then opts.cases = "sgemm_peak," .. opts.cases end
if not opts.cases:find("fma_peak", 1, true) then opts.cases = "fma_peak," .. opts.cases end

local counts = {}
for n in opts.threads:gmatch("[^,]+") do
  local t = math.tointeger(tonumber(n))
  if not t or t < 1 then io.stderr:write("bench_scaling.lua: --threads wants counts like 1,2,4; got " .. n .. "\n"); os.exit(2) end
  counts[#counts + 1] = t
end

local launcher = arg[0]:gsub("bench_scaling%.lua$", "attn-lua")
local bench = arg[0]:gsub("bench_scaling%.lua$", "bench.lua")
local raw = opts.raw and assert(io.open(opts.raw, "w"))

local parse = require("bench_lines").parse

local function figure(d)
  for _, key in ipairs { "tokens_per_s", "gbps", "us_per_call", "gflops" } do
    if d[key] and d[key] ~= 0 then return d[key], key end
  end
end

local rows, order, peak, fma_peak, membw, core = {}, {}, {}, {}, {}, nil
for _, t in ipairs(counts) do
  io.stderr:write(string.format("bench_scaling: %d thread(s)\n", t))
  local cmd = string.format("OMP_NUM_THREADS=%d %s %s --cases %s --reps %d", t, launcher, bench, opts.cases, opts.reps)
  local p = assert(io.popen(cmd))
  for line in p:lines() do
    if raw then raw:write(line, "\n") end
    local d = parse(line)
    if d.case then
      core = core or (d.blas_core and (d.blas_core .. ", " .. tostring(d.cpu_kernel)))
      local key = d.case .. " " .. (d.kernel or "")
      if not rows[key] then rows[key] = {}; order[#order + 1] = key end
      local f, unit = figure(d)
      rows[key][t] = { value = f, unit = unit, case = d.case }
      if d.case == "sgemm_peak" then peak[t] = d.gflops end
      if d.case == "fma_peak" then fma_peak[t] = d.gflops end
      if d.case == "membw" then membw[t] = d.gbps end
    end
  end
  p:close()
end
if raw then raw:close() end

print(string.format("# OpenBLAS core, attn kernel: %s; reps %d", core or "?", opts.reps))
local header = { string.format("%-34s %-12s", "case kernel", "unit") }
for _, t in ipairs(counts) do header[#header + 1] = string.format(" %9s", t .. "t") end
header[#header + 1] = string.format("  %8s", "speedup")
header[#header + 1] = string.format("  %s", "vs peak (sgemm; membw for decode) at each count | of fma_peak")
print(table.concat(header))
for _, key in ipairs(order) do
  local r = rows[key]
  local first, last, unit, case
  local parts = {}
  local ratios, of_fma = {}, {}
  for _, t in ipairs(counts) do
    local c = r[t]
    if c and c.value then
      unit, case = c.unit, c.case
      first = first or c.value
      last = c.value
      parts[#parts + 1] = string.format(" %9.5g", c.value)
      local ref = (case == "decode" or case == "decode_gqa" or case == "membw") and membw[t] or peak[t]
      if unit == "gflops" or unit == "gbps" then
        ratios[#ratios + 1] = ref and string.format("%.2f", c.value / ref) or "-"
      end
      if unit == "gflops" then of_fma[#of_fma + 1] = fma_peak[t] and string.format("%.2f", c.value / fma_peak[t]) or "-" end
    else
      parts[#parts + 1] = string.format(" %9s", "-")
    end
  end
  local speedup = "-"
  if first and last then
    -- time per call falls as threads help: invert us_per_call
    speedup = string.format("%.2fx", unit == "us_per_call" and first / last or last / first)
  end
  local fma_part = #of_fma > 0 and (" | " .. table.concat(of_fma, " ")) or ""
  print(string.format("%-34s %-12s%s  %8s  %s%s", key, unit or "-", table.concat(parts), speedup,
    table.concat(ratios, " "), fma_part))
end
