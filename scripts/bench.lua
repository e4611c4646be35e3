-- Attention benchmarks, one JSON object per line (api.md section 5).
--   scripts/attn-lua scripts/bench.lua [--cases LIST] [--threads N] [--reps N]
-- LIST is comma-separated from: fma_peak, sgemm_peak, A, A_causal, B, B_causal,
-- C_causal, A_bwd, A_causal_bwd, B_bwd, C_causal_bwd (forward + backward),
-- options_bwd (each variant's cost on A's flash forward + backward),
-- score_mod_relbias, score_mod_alibi, score_mod_softcap, mask_mod_document
-- (attn.score_mod / attn.mask_mod against the plain or built-in call, same rounds),
-- mha, tiny, tiny_train, decode, decode_gqa, window, block_sparse, train_gpt, train_gemm, tokenize, gpt2_decode (default: all). Each attention case runs every kernel
-- that applies (math and flash; C_causal flash only, in a child process so its
-- peak_rss_mb is its own). gflops = 4*b*h*lq*lk*e / time (dense-equivalent,
-- also for causal). Every line names the OpenBLAS core and the flash kernel's
-- instruction set in use (attn.cpu_info; the sgemm line also lists the
-- available sets). fma_peak: the FP32 fused multiply-add throughput of that
-- instruction set on the run's threads (independent FMA chains in registers,
-- 2 flops per lane step; attn.core._fma_peak), the machine's own limit where
-- sgemm_peak is OpenBLAS's. It is measured in every run (up to a second),
-- its line printed first when asked for (or by default), and every
-- line with gflops gets of_fma_peak = its gflops / fma_peak. --threads N
-- re-runs the script with OMP_NUM_THREADS=N (OpenMP reads it at start).
local attn = require "attn"

local opts = { cases = nil, threads = nil, reps = 3, child = false }
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--cases" then opts.cases = arg[i + 1]; i = i + 1
  elseif a == "--threads" then opts.threads = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--reps" then opts.reps = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--child" then opts.child = true
  else io.stderr:write("bench.lua: unknown argument " .. a .. "\n"); os.exit(2) end
  i = i + 1
end

local script = arg[0]
local launcher = script:gsub("bench%.lua$", "attn-lua")

if opts.threads and os.getenv("OMP_NUM_THREADS") ~= tostring(opts.threads) then
  local cmd = string.format("OMP_NUM_THREADS=%d %s %s --cases %s --reps %d", opts.threads, launcher, script,
    opts.cases or "all", opts.reps)
  local ok = os.execute(cmd)
  os.exit(ok and 0 or 1)
end

local threads = tonumber(os.getenv("OMP_NUM_THREADS") or "") or attn.blas_info().threads
local core = attn.blas_info().core
local cpu = attn.cpu_info() -- the flash kernel's instruction set (ATTN_CPU forces one)

local format_line = require("bench_lines").format
local FIRST_KEYS = { "case", "kernel", "b", "h", "lq", "lk", "e", "causal", "threads", "ms", "gflops" }
local function json(t) return format_line(t, FIRST_KEYS) end

local selected = {}
if opts.cases and opts.cases ~= "all" then
  for name in opts.cases:gmatch("[^,]+") do selected[name] = true end
end
local function wanted(name) return next(selected) == nil or selected[name] end

-- the reference of of_fma_peak: the best of many short rounds (20 per --reps,
-- at most 100, of 10 ms each), so that one quiet moment of a shared machine
-- is enough to see its limit; measured once, when a run first needs it (a run
-- of only us_per_call or MB/s cases never does)
local fma
local function fma_peak()
  fma = fma or require("attn.core")._fma_peak(0.01, math.min(100, 20 * math.max(1, math.tointeger(opts.reps) or 3)))
  return fma
end

local function emit(t)
  if t.gflops and t.gflops > 0 and t.case ~= "fma_peak" then t.of_fma_peak = t.gflops / fma_peak().gflops end
  t.threads = t.threads or threads -- a single-threaded case says 1
  t.blas_core = core
  t.cpu_kernel = cpu.kernel
  t.peak_rss_mb = t.peak_rss_mb or attn.peak_rss_mb()
  io.write(json(t), "\n")
  io.flush()
end

-- best of reps wall-clock milliseconds of fn(); a progress line on stderr
-- (a terminal only) counts the warm-up and the reps of this case
local function best_ms(label, fn, reps)
  local p = attn.progress(reps + 1, label)
  -- the last case's results are garbage by now, but their data, outside the
  -- Lua heap, does not hurry the collector: free it before the warm-up too,
  -- so that peak_rss_mb is this case's alone
  collectgarbage()
  fn() -- warm-up
  p:step()
  local best = math.huge
  for _ = 1, reps do
    collectgarbage()
    local t0 = attn.clock()
    fn()
    local dt = (attn.clock() - t0) * 1000
    if dt < best then best = dt end
    p:step()
  end
  p:done()
  return best
end

if wanted("fma_peak") then
  local fma = fma_peak()
  emit { case = "fma_peak", kernel = fma.kernel, b = 1, h = 1, lq = 0, lk = 0, e = 0, causal = false, ms = fma.ms,
         gflops = fma.gflops, fma_lanes = fma.lanes, fma_steps = fma.steps,
         avx512_full_width = cpu.avx512_full_width }
end

local function attention_case(name, b, h, n, e, causal, kernels)
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  for _, kernel in ipairs(kernels) do
    local ms = best_ms(name .. " " .. kernel, function()
      attn.scaled_dot_product_attention(q, k, v, { is_causal = causal, kernel = kernel })
    end, opts.reps)
    emit { case = name, kernel = kernel, b = b, h = h, lq = n, lk = n, e = e, causal = causal, ms = ms,
           gflops = 4.0 * b * h * n * n * e / (ms * 1e6) }
  end
end

if wanted("sgemm_peak") then
  local n = 2048
  local a, bm = attn.randn(n, n), attn.randn(n, n)
  local ms = best_ms("sgemm_peak", function() attn.matmul(a, bm) end, opts.reps)
  emit { case = "sgemm_peak", kernel = "sgemm", b = 1, h = 1, lq = n, lk = n, e = n, causal = false, ms = ms,
         gflops = 2.0 * n * n * n / (ms * 1e6), cpu_available = table.concat(cpu.available, ","),
         cpu_forced = cpu.forced or "no" }
end

local cases = {
  { "A", 4, 12, 1024, 64, false }, { "A_causal", 4, 12, 1024, 64, true },
  { "B", 1, 8, 4096, 64, false }, { "B_causal", 1, 8, 4096, 64, true },
}
for _, c in ipairs(cases) do
  if wanted(c[1]) then attention_case(c[1], c[2], c[3], c[4], c[5], c[6], { "math", "flash" }) end
end

if wanted("C_causal") then
  if opts.child then
    attention_case("C_causal", 1, 8, 16384, 64, true, { "flash" })
  else
    -- its own process, so that peak_rss_mb is this case's alone
    local cmd = string.format("%s %s --cases C_causal --reps %d --child", launcher, script, opts.reps)
    local p = io.popen(cmd)
    io.write(p:read("a"))
    p:close()
  end
end

-- GB/s of memory read by the fastest plain sum attn has: one OpenBLAS sgemv
-- (t [rows, 1024] times ones) over about `bytes` bytes (t:sum() adds in one
-- double chain: it times the adder, not memory)
local function membw_gbps(label, bytes)
  local flat = attn.randn(math.max(1, math.floor(bytes / 4096)), 1024)
  local ones = attn.ones(1024, 1)
  local ms = best_ms(label, function() attn.matmul(flat, ones) end, opts.reps)
  return flat:numel() * 4.0 / (ms * 1e6), ms
end

-- decode / decode_gqa: one query row against a long KV cache (api.md section 5);
-- gbps = bytes of K and V / time, beside a membw line: the same bytes summed
-- row-wise by one OpenBLAS sgemv (t [rows, 1024] times ones), the fastest plain
-- sum attn has (t:sum() adds in one double chain: it times the adder, not memory)
if wanted("decode") or wanted("decode_gqa") then
  local b, hkv, lk, e = 1, 8, 65536, 64
  attn.manual_seed(0)
  local k, v = attn.randn(b, hkv, lk, e), attn.randn(b, hkv, lk, e)
  local bytes = 2.0 * b * hkv * lk * e * 4
  local gbps, ms = membw_gbps("membw", bytes)
  emit { case = "membw", kernel = "sgemv", b = b, h = hkv, lq = 0, lk = lk, e = e, causal = false, ms = ms,
         gflops = 0.0, gbps = gbps }
  for _, c in ipairs { { "decode", hkv, false }, { "decode_gqa", 4 * hkv, true } } do
    if wanted(c[1]) then
      local q = attn.randn(b, c[2], 1, e)
      for _, kernel in ipairs { "math", "flash" } do
        local run_ms = best_ms(c[1] .. " " .. kernel, function()
          attn.scaled_dot_product_attention(q, k, v, { kernel = kernel, enable_gqa = c[3] })
        end, opts.reps)
        emit { case = c[1], kernel = kernel, b = b, h = c[2], h_kv = hkv, lq = 1, lk = lk, e = e, causal = false,
               ms = run_ms, gflops = 4.0 * b * c[2] * lk * e / (run_ms * 1e6), gbps = bytes / (run_ms * 1e6) }
      end
    end
  end
end

-- window: B with a causal sliding window of 256 keys (window = {255, 0});
-- gflops counted on the visible (query, key) pairs
if wanted("window") then
  local b, h, n, e, left = 1, 8, 4096, 64, 255
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local pairs = 0
  for i = 0, n - 1 do pairs = pairs + math.min(i + 1, left + 1) end
  for _, kernel in ipairs { "math", "flash" } do
    local ms = best_ms("window " .. kernel, function()
      attn.scaled_dot_product_attention(q, k, v, { kernel = kernel, window = { left, 0 } })
    end, opts.reps)
    emit { case = "window", kernel = kernel, b = b, h = h, lq = n, lk = n, e = e, causal = true, window = left,
           ms = ms, gflops = 4.0 * b * h * pairs * e / (ms * 1e6), visible_pairs = pairs }
  end
end

-- block_sparse: B with a document block mask of 8 equal documents (block 128,
-- attn.block_mask.document); vs_dense = ms / the same kernel's dense B in this
-- run (1/8 is the ideal: 7/8 of the blocks are empty); build_ms: attn.block_mask
if wanted("block_sparse") then
  local b, h, n, e, docs = 1, 8, 4096, 64, 8
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local ids = {}
  for i = 0, n - 1 do ids[#ids + 1] = i * docs // n end
  local document = attn.block_mask.document(attn.tensor(ids))
  local bm
  local build_ms = best_ms("block_sparse build", function() bm = attn.block_mask(document, b, h, n, n) end, opts.reps)
  for _, kernel in ipairs { "math", "flash" } do
    local dense_ms = best_ms("block_sparse dense " .. kernel, function()
      attn.scaled_dot_product_attention(q, k, v, { kernel = kernel })
    end, opts.reps)
    local ms = best_ms("block_sparse " .. kernel, function()
      attn.scaled_dot_product_attention(q, k, v, { kernel = kernel, block_mask = bm })
    end, opts.reps)
    emit { case = "block_sparse", kernel = kernel, b = b, h = h, lq = n, lk = n, e = e, causal = false, docs = docs,
           block = bm.block, sparsity = bm:sparsity(), ms = ms, dense_ms = dense_ms, vs_dense = ms / dense_ms,
           build_ms = build_ms, gflops = 4.0 * b * h * n * n * e / (ms * 1e6) }
  end
end

-- forward + backward through the raw calls the autograd engine records
-- (attn.core.autograd): ms of both, fwd_ms of the forward alone, gflops =
-- 14*b*h*lq*lk*e / time (the forward's 4 plus the backward's 10). dout is out
-- itself (any tensor of out's shape times the same; it saves one [B, H, L, E]).
local raw_sdpa = require("attn.core").autograd
local function backward_case(name, b, h, n, e, causal, kernels)
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  for _, kernel in ipairs(kernels) do
    local o = { is_causal = causal, kernel = kernel }
    local fwd_ms = best_ms(name .. " " .. kernel .. " forward", function() raw_sdpa.sdpa_forward(q, k, v, o) end,
      opts.reps)
    local ms = best_ms(name .. " " .. kernel, function()
      local out, saved = raw_sdpa.sdpa_forward(q, k, v, o)
      raw_sdpa.sdpa_backward(out, q, k, v, out, saved, o)
    end, opts.reps)
    emit { case = name, kernel = kernel, b = b, h = h, lq = n, lk = n, e = e, causal = causal, ms = ms,
           fwd_ms = fwd_ms, gflops = 14.0 * b * h * n * n * e / (ms * 1e6) }
  end
end

local bwd_cases = {
  { "A_bwd", 4, 12, 1024, 64, false }, { "A_causal_bwd", 4, 12, 1024, 64, true },
  { "B_bwd", 1, 8, 4096, 64, false },
}
for _, c in ipairs(bwd_cases) do
  if wanted(c[1]) then backward_case(c[1], c[2], c[3], c[4], c[5], c[6], { "math", "flash" }) end
end

-- options_bwd: each variant's cost on the flash kernel's forward + backward of
-- A (ms and fwd_ms as backward_case; x_plain = ms / the plain line's ms). The
-- variants run interleaved, one call each per round, best of the rounds, so
-- that a change of load hits them alike. gqa: 4 query heads per kv head (k, v
-- [4, 3, 1024, 64]); window {1023, 1023} hides no key (the per-row cut, no
-- work saved); ALiBi: the paper's slopes; softcap 30 (Gemma 2 uses 50); all:
-- the four at once
if wanted("options_bwd") then
  local b, h, n, e = 4, 12, 1024, 64
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local kg, vg = attn.randn(b, h // 4, n, e), attn.randn(b, h // 4, n, e)
  local slopes = attn.alibi_slopes(h)
  local variants = {
    { "plain", {} }, { "gqa", { enable_gqa = true } }, { "window", { window = { n - 1, n - 1 } } },
    { "alibi", { alibi_slopes = slopes } }, { "softcap", { softcap = 30 } },
    { "all", { enable_gqa = true, window = { n - 1, n - 1 }, alibi_slopes = slopes, softcap = 30 } },
  }
  local function timed(fn)
    collectgarbage()
    local t0 = attn.clock()
    fn()
    return (attn.clock() - t0) * 1000
  end
  local best = {}
  local p = attn.progress(opts.reps + 1, "options_bwd")
  for round = 0, opts.reps do -- round 0 warms up
    for i, c in ipairs(variants) do
      local o = c[2]
      o.kernel = "flash"
      local kk, vv = o.enable_gqa and kg or k, o.enable_gqa and vg or v
      local out, saved
      local f = timed(function() out, saved = raw_sdpa.sdpa_forward(q, kk, vv, o) end)
      local bw = timed(function() raw_sdpa.sdpa_backward(out, q, kk, vv, out, saved, o) end)
      if round > 0 then
        best[i] = best[i] or { fwd = math.huge, ms = math.huge }
        best[i].fwd, best[i].ms = math.min(best[i].fwd, f), math.min(best[i].ms, f + bw)
      end
    end
    p:step()
  end
  p:done()
  for i, c in ipairs(variants) do
    local ms, fwd_ms = best[i].ms, best[i].fwd
    emit { case = "options_bwd", kernel = "flash", option = c[1], b = b, h = h, lq = n, lk = n, e = e, causal = false,
           ms = ms, fwd_ms = fwd_ms, gflops = 14.0 * b * h * n * n * e / (ms * 1e6), x_plain = ms / best[1].ms,
           fwd_x_plain = fwd_ms / best[1].fwd }
  end
end

-- the best ms of each of fns, run interleaved (one call each per round, round 0
-- warms up), so that a change of load hits them alike
local function interleaved_ms(label, fns)
  local best = {}
  local p = attn.progress(opts.reps + 1, label)
  for round = 0, opts.reps do
    for i, fn in ipairs(fns) do
      collectgarbage()
      local t0 = attn.clock()
      fn()
      local dt = (attn.clock() - t0) * 1000
      if round > 0 then best[i] = math.min(best[i] or math.huge, dt) end
    end
    p:step()
  end
  p:done()
  return best
end

-- score_mod_relbias (api.md "Scriptable scores"): B's shape on the flash
-- kernel with a learnable relative-position table [H, 2L - 1] read by a
-- score_mod; ms is forward + backward through autograd (dout = out, the
-- table's gradient filled), fwd_ms the forward alone (no_grad), each beside
-- the plain call timed the same way in the same rounds (plain_ms,
-- plain_fwd_ms: B_bwd and B) and their ratios ratio_to_plain, fwd_ratio_to_plain
if wanted("score_mod_relbias") then
  local b, h, n, e = 1, 8, 4096, 64
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local rel = attn.zeros(h, 2 * n - 1, { requires_grad = true })
  local sm = attn.score_mod(function(s, _, hh, qq, kk) return s + rel[{ hh, qq - kk + n }] end)
  local function fwd(o) return function() attn.no_grad(attn.scaled_dot_product_attention, q, k, v, o) end end
  local function fwd_bwd(o)
    return function()
      local qg, kg, vg = q:detach():requires_grad_(), k:detach():requires_grad_(), v:detach():requires_grad_()
      local out = attn.scaled_dot_product_attention(qg, kg, vg, o)
      out:backward(out:detach())
      rel.grad = nil
    end
  end
  local plain, flex = { kernel = "flash" }, { kernel = "flash", score_mod = sm }
  local t = interleaved_ms("score_mod_relbias", { fwd(plain), fwd(flex), fwd_bwd(plain), fwd_bwd(flex) })
  emit { case = "score_mod_relbias", kernel = "flash", b = b, h = h, lq = n, lk = n, e = e, causal = false,
         ms = t[4], fwd_ms = t[2], plain_ms = t[3], plain_fwd_ms = t[1], ratio_to_plain = t[4] / t[3],
         fwd_ratio_to_plain = t[2] / t[1], gflops = 14.0 * b * h * n * n * e / (t[4] * 1e6) }
end

-- score_mod_alibi, score_mod_softcap: B's forward on the flash kernel with
-- ALiBi (the paper's slopes) or softcap 30 written as a score_mod, beside the
-- built-in option (builtin_ms, ratio_to_builtin) and the plain B (plain_ms),
-- interleaved in the same rounds
local score_mod_builtin = {
  { "score_mod_alibi", function(h)
    local slopes = attn.alibi_slopes(h)
    return attn.score_mod(function(s, _, hh, qq, kk) return s - slopes[hh] * (qq - kk):abs() end),
      { alibi_slopes = slopes }
  end },
  { "score_mod_softcap", function()
    return attn.score_mod(function(s) return (s / 30):tanh() * 30 end), { softcap = 30 }
  end },
}
for _, c in ipairs(score_mod_builtin) do
  if wanted(c[1]) then
    local b, h, n, e = 1, 8, 4096, 64
    attn.manual_seed(0)
    local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
    local sm, builtin = c[2](h)
    builtin.kernel = "flash"
    local function run(o) return function() attn.scaled_dot_product_attention(q, k, v, o) end end
    local t = interleaved_ms(c[1], { run { kernel = "flash" }, run(builtin), run { kernel = "flash", score_mod = sm } })
    emit { case = c[1], kernel = "flash", b = b, h = h, lq = n, lk = n, e = e, causal = false, ms = t[3],
           builtin_ms = t[2], plain_ms = t[1], ratio_to_builtin = t[3] / t[2], ratio_to_plain = t[3] / t[1],
           gflops = 4.0 * b * h * n * n * e / (t[3] * 1e6) }
  end
end

-- mask_mod_document: B's forward on the flash kernel, 8 equal documents,
-- causal, as a mask_mod (document ids [1, L] captured) given as the mask_mod
-- option (ms) and as attn.block_mask(mask_mod, ...) (block_mask_ms), beside
-- the built-in block_mask.document and causal (builtin_ms; ratio_to_builtin
-- = ms / builtin_ms) in the same rounds; build_ms / builtin_build_ms: the two
-- attn.block_mask calls; gflops counted dense-equivalent as every case
if wanted("mask_mod_document") then
  local b, h, n, e, docs = 1, 8, 4096, 64, 8
  attn.manual_seed(0)
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local ids = {}
  for i = 0, n - 1 do ids[#ids + 1] = i * docs // n end
  local doc = attn.tensor({ ids })
  local mm = attn.mask_mod(function(bb, _, qq, kk) return doc[{ bb, qq }]:eq(doc[{ bb, kk }]):logical_and(qq:ge(kk)) end)
  local builtin = attn.block_mask.and_(attn.block_mask.document(attn.tensor(ids)), attn.block_mask.causal)
  local bm_mod, bm_builtin
  local build_ms = best_ms("mask_mod_document build", function() bm_mod = attn.block_mask(mm, b, h, n, n) end,
    opts.reps)
  local builtin_build_ms = best_ms("mask_mod_document built-in build", function()
    bm_builtin = attn.block_mask(builtin, b, h, n, n)
  end, opts.reps)
  local function run(o) return function() attn.scaled_dot_product_attention(q, k, v, o) end end
  local t = interleaved_ms("mask_mod_document", { run { kernel = "flash", block_mask = bm_builtin },
    run { kernel = "flash", mask_mod = mm }, run { kernel = "flash", block_mask = bm_mod } })
  emit { case = "mask_mod_document", kernel = "flash", b = b, h = h, lq = n, lk = n, e = e, causal = true, docs = docs,
         ms = t[2], block_mask_ms = t[3], builtin_ms = t[1], ratio_to_builtin = t[2] / t[1],
         block_mask_ratio_to_builtin = t[3] / t[1], build_ms = build_ms, builtin_build_ms = builtin_build_ms,
         gflops = 4.0 * b * h * n * n * e / (t[2] * 1e6) }
end

if wanted("C_causal_bwd") then
  if opts.child then
    backward_case("C_causal_bwd", 1, 8, 16384, 64, true, { "flash" })
  else
    -- its own process, so that peak_rss_mb is this case's alone
    local cmd = string.format("%s %s --cases C_causal_bwd --reps %d --child", launcher, script, opts.reps)
    local p = io.popen(cmd)
    io.write(p:read("a"))
    p:close()
  end
end

if wanted("mha") then
  attn.manual_seed(0)
  local b, n, d, h = 4, 1024, 768, 12
  local m = attn.nn.MultiHeadAttention(d, d, n, 0.0, h)
  m:eval()
  local x = attn.randn(b, n, d)
  local ms = best_ms("mha", function() attn.no_grad(m, x) end, opts.reps) -- inference: nothing recorded
  emit { case = "mha", kernel = "module", b = b, h = h, lq = n, lk = n, e = d // h, causal = true, ms = ms,
         gflops = 4.0 * b * h * n * n * (d // h) / (ms * 1e6) }
end

-- the notebook modules at notebook size: tiny is the inference forward (under
-- no_grad, nothing recorded); tiny_train is forward + backward with recording
-- (us_per_call), with the recorded forward alone as fwd_us
local function tiny_modules()
  attn.manual_seed(123)
  return {
    { "CausalAttention", attn.nn.CausalAttention(3, 2, 6, 0.0) },
    { "MultiHeadAttention", attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2) },
  }
end
local tiny_batch = attn.stack({ attn.rand(6, 3), attn.rand(6, 3) }, 1)

if wanted("tiny") then
  for _, spec in ipairs(tiny_modules()) do
    local m = spec[2]
    local calls = 20000
    local us = best_ms("tiny " .. spec[1], function()
      attn.no_grad(function() for _ = 1, calls do m(tiny_batch) end end)
    end, opts.reps) * 1000 / calls
    emit { case = "tiny", kernel = spec[1], b = 2, h = m.num_heads or 1, lq = 6, lk = 6, e = 2, causal = true,
           ms = us / 1000, us_per_call = us }
  end
end

if wanted("tiny_train") then
  for _, spec in ipairs(tiny_modules()) do
    local m = spec[2]
    local calls = 5000
    local fwd_us = best_ms("tiny_train fwd " .. spec[1], function()
      for _ = 1, calls do m(tiny_batch) end
    end, opts.reps) * 1000 / calls
    local us = best_ms("tiny_train " .. spec[1], function()
      for _ = 1, calls do
        m(tiny_batch):sum():backward()
      end
    end, opts.reps) * 1000 / calls
    emit { case = "tiny_train", kernel = spec[1], b = 2, h = m.num_heads or 1, lq = 6, lk = 6, e = 2, causal = true,
           ms = us / 1000, us_per_call = us, fwd_us = fwd_us }
  end
end

-- train_gpt (api.md section 5): one training step of the book's GPTModel
-- (vocab 256, context 128, emb 128, 4 heads, 4 layers, batch 16): forward,
-- cross entropy, backward, AdamW; tokens_per_s = b * n / time; gflops counts
-- 6 flops per weight of the Linear layers and token (forward 2, backward 4)
-- and 12 per score and channel of the attention (forward 4, backward 8,
-- counted dense): 11.7 GFLOP a step (scripts/bench_llmc_driver.c counts the same)
if wanted("train_gpt") then
  local g = dofile((script:match("^(.*)/") or ".") .. "/lib/bench_train_gpt.lua")()
  local cfg, b, n, model, opt, x, y = g.cfg, g.b, g.n, g.model, g.opt, g.x, g.y
  local ms = best_ms("train_gpt", function()
    local loss = attn.nn.functional.cross_entropy(model(x):view(b * n, cfg.vocab_size), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
  end, opts.reps)
  local d = cfg.emb_dim
  local flops = 6.0 * (cfg.n_layers * 12 * d * d + d * cfg.vocab_size) * b * n + 12.0 * cfg.n_layers * b * n * n * d
  emit { case = "train_gpt", kernel = "GPTModel + AdamW", b = b, h = cfg.n_heads, lq = n, lk = n,
         e = d // cfg.n_heads, causal = true, ms = ms, gflops = flops / (ms * 1e6), tokens_per_s = b * n / (ms / 1000) }
end

-- train_gemm: the train_gpt step's Linear products on attn.matmul, one line
-- per form over its five weights [out, in] (the attention's q, k and v
-- together, its output, the MLP's two, the output head) at the step's 2048
-- tokens: forward x W^T, input gradient g W, weight gradient g^T x (g and x
-- as the step holds them, [tokens, features]); gflops = the form's flops over
-- the sum of each product's best time
if wanted("train_gemm") then
  local tokens = 2048
  local weights = { { 384, 128 }, { 128, 128 }, { 512, 128 }, { 128, 512 }, { 256, 128 } }
  local forms = {
    { "x W^T", function(x, w, g) return function() attn.matmul(x, w:t()) end end },
    { "g W", function(x, w, g) return function() attn.matmul(g, w) end end },
    { "g^T x", function(x, w, g) return function() attn.matmul(g:t(), x) end end },
  }
  attn.manual_seed(0)
  local shapes = {}
  for _, wd in ipairs(weights) do shapes[#shapes + 1] = wd[1] .. "x" .. wd[2] end
  for _, form in ipairs(forms) do
    local ms, flops = 0, 0
    for _, wd in ipairs(weights) do
      local out, inp = wd[1], wd[2]
      local x, w, g = attn.randn(tokens, inp), attn.randn(out, inp), attn.randn(tokens, out)
      ms = ms + best_ms("train_gemm " .. form[1] .. " " .. out .. "x" .. inp, form[2](x, w, g), opts.reps)
      flops = flops + 2.0 * tokens * out * inp
    end
    emit { case = "train_gemm", kernel = form[1], b = 1, h = 1, lq = tokens, lk = 0, e = 0, causal = false, ms = ms,
           gflops = flops / (ms * 1e6), weights = table.concat(shapes, ",") }
  end
end

-- tokenize: GPT-2's tokenizer (attn.tokenizer.gpt2, one thread) over the
-- repository's LICENSE, data/gpt2/LICENSE and README.md repeated to at least
-- 300 KB; mb_per_s counts input bytes (10^6 per MB); load_ms is reading
-- encoder.json and vocab.bpe
if wanted("tokenize") then
  local root = script:match("^(.*)[/\\]scripts[/\\][^/\\]*$") or "."
  local parts = {}
  for _, f in ipairs({ "LICENSE", "data/gpt2/LICENSE", "README.md" }) do
    local fh = assert(io.open(root .. "/" .. f, "rb"))
    parts[#parts + 1] = fh:read("a")
    fh:close()
  end
  local unit = table.concat(parts, "\n")
  local text = unit:rep(math.ceil(300000 / #unit))
  local t0 = attn.clock()
  local tok = attn.tokenizer.gpt2()
  local load_ms = (attn.clock() - t0) * 1000
  local n
  local ms = best_ms("tokenize", function() n = #tok:encode(text, { disallowed_special = {} }) end, opts.reps)
  emit { case = "tokenize", kernel = "gpt2 bpe", threads = 1, ms = ms, bytes = #text, tokens = n,
         mb_per_s = #text / (ms * 1000), load_ms = load_ms }
end

-- gpt2_decode: KV-cache greedy decoding of one sequence by GPT-2 124M's
-- configuration (vocab 50257, context 1024, emb 768, 12 heads, 12 layers,
-- qkv biases, out_head tied to tok_emb as GPT-2) with random weights: a
-- 16-token prompt, then `new_tokens` steps of one token each (the model's
-- cached forward and argmax), timed together. Each step reads every weight
-- once (the blocks' matrices and the tied [vocab, emb] output head: the
-- `weight_bytes`), so the fastest step memory allows is weight_bytes / membw,
-- with membw measured in the same rounds over the same bytes (a `membw` line);
-- of_membw_limit = tokens_per_s * weight_bytes / membw (1 = at the limit).
if wanted("gpt2_decode") then
  local cfg = { vocab_size = 50257, context_length = 1024, emb_dim = 768, n_heads = 12, n_layers = 12, drop_rate = 0,
                qkv_bias = true }
  attn.manual_seed(0)
  local model = attn.nn.GPTModel(cfg)
  model.out_head.weight = model.tok_emb.weight
  model:eval()
  -- every parameter but the position table (one row per token) is read per step
  local weight_bytes = 4.0 * (model:num_parameters() - model.pos_emb.weight:numel())
  local flat = attn.randn(math.floor(weight_bytes / 4096), 1024)
  local ones = attn.ones(1024, 1)
  local prompt = attn.tensor({ { 464, 3290, 4201, 345, 1, 50, 777, 20, 9, 30000, 12, 50257, 2, 3, 4, 5 } })
  local new_tokens = 32
  local function decode(steps)
    attn.no_grad(function()
      model:reset_cache()
      local logits = model(prompt, { use_cache = true })
      for _ = 1, steps do
        local next_id = attn.argmax(logits:select(2, logits:size(2)), 2, true)
        logits = model(next_id, { use_cache = true })
      end
    end)
  end
  -- membw, the whole decode and the prompt's forward alone (taken off:
  -- tokens_per_s is the decode steps'), in interleaved rounds, best of each:
  -- the memory speed of a shared machine drifts
  local membw_ms, ms, prefill_ms = math.huge, math.huge, math.huge
  local function timed(fn)
    collectgarbage()
    local t0 = attn.clock()
    fn()
    return (attn.clock() - t0) * 1000
  end
  decode(2) -- warm-up
  local p = attn.progress(opts.reps, "gpt2_decode")
  for _ = 1, opts.reps do
    membw_ms = math.min(membw_ms, timed(function() attn.matmul(flat, ones) end))
    ms = math.min(ms, timed(function() decode(new_tokens) end))
    prefill_ms = math.min(prefill_ms, timed(function() decode(0) end))
    p:step()
  end
  p:done()
  local gbps = flat:numel() * 4.0 / (membw_ms * 1e6)
  emit { case = "membw", kernel = "sgemv", b = 1, h = 1, lq = 0, lk = 0, e = 0, causal = false, ms = membw_ms,
         gflops = 0.0, gbps = gbps, bytes = weight_bytes }
  local step_ms = (ms - prefill_ms) / new_tokens
  local tokens_per_s = 1000 / step_ms
  emit { case = "gpt2_decode", kernel = "GPTModel cached", b = 1, h = cfg.n_heads, lq = 1, lk = #prompt[1] + new_tokens,
         e = cfg.emb_dim // cfg.n_heads, causal = true, ms = ms, prefill_ms = prefill_ms, step_ms = step_ms,
         tokens_per_s = tokens_per_s, weight_bytes = weight_bytes, membw_gbps = gbps,
         of_membw_limit = tokens_per_s * weight_bytes / (gbps * 1e9) }
end
