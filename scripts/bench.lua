-- Attention benchmarks, one JSON object per line (api.md section 5).
--   scripts/attn-lua scripts/bench.lua [--cases LIST] [--threads N] [--reps N]
-- LIST is comma-separated from: fma_peak, sgemm_peak, A, A_causal, B, B_causal,
-- C_causal, A_bwd, A_causal_bwd, B_bwd, C_causal_bwd (forward + backward),
-- options_bwd (each variant's cost on A's flash forward + backward),
-- mha, tiny, tiny_train, decode, decode_gqa, window, block_sparse, train_gpt, tokenize (default: all). Each attention case runs every kernel
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

local function json(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b)
    local order = { case = 1, kernel = 2, b = 3, h = 4, lq = 5, lk = 6, e = 7, causal = 8, threads = 9, ms = 10, gflops = 11 }
    local oa, ob = order[a] or 99, order[b] or 99
    if oa ~= ob then return oa < ob end
    return a < b
  end)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    local s
    if type(v) == "string" then s = string.format("%q", v)
    elseif type(v) == "boolean" then s = tostring(v)
    elseif math.type(v) == "integer" then s = tostring(v)
    else s = string.format("%.4g", v) end
    parts[#parts + 1] = string.format("%q: %s", k, s)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

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

-- decode / decode_gqa: one query row against a long KV cache (api.md section 5);
-- gbps = bytes of K and V / time, beside a membw line: the same bytes summed
-- row-wise by one OpenBLAS sgemv (t [rows, 1024] times ones), the fastest plain
-- sum attn has (t:sum() adds in one double chain: it times the adder, not memory)
if wanted("decode") or wanted("decode_gqa") then
  local b, hkv, lk, e = 1, 8, 65536, 64
  attn.manual_seed(0)
  local k, v = attn.randn(b, hkv, lk, e), attn.randn(b, hkv, lk, e)
  local bytes = 2.0 * b * hkv * lk * e * 4
  local flat = attn.randn(2 * b * hkv * lk * e // 1024, 1024)
  local ones = attn.ones(1024, 1)
  local ms = best_ms("membw", function() attn.matmul(flat, ones) end, opts.reps)
  emit { case = "membw", kernel = "sgemv", b = b, h = hkv, lq = 0, lk = lk, e = e, causal = false, ms = ms,
         gflops = 0.0, gbps = bytes / (ms * 1e6) }
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
  local cfg = { vocab_size = 256, context_length = 128, emb_dim = 128, n_heads = 4, n_layers = 4, drop_rate = 0,
                qkv_bias = false }
  local b, n = 16, cfg.context_length
  attn.manual_seed(123)
  local model = attn.nn.GPTModel(cfg)
  local opt = attn.optim.AdamW(model:parameters(), { lr = 1e-4, weight_decay = 0.1 })
  -- ids 1..256 from the generator's uniforms
  local function ids()
    local t = attn.rand(b, n):totable()
    for _, row in ipairs(t) do for j, u in ipairs(row) do row[j] = math.floor(u * 256) + 1 end end
    return attn.tensor(t)
  end
  local x, y = ids(), ids():reshape(b * n)
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
