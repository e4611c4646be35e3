-- The FMA throughput reference of scripts/bench.lua (src/core/cpu.c's
-- attn_cpu_fma_peak, each kernel set's fma_chains): the loop of every set
-- this CPU runs computes exactly the recurrence it claims, the measured
-- figure is a positive finite number, attn.cpu_info's avx512_full_width
-- agrees with the CPU's vendor and family, and bench.lua's lines carry
-- fma_peak and of_fma_peak. No timing thresholds.
local attn = require "attn"
local core = require "attn.core"

local info = attn.cpu_info()

-- a double rounded to the nearest float32
local function f32(x) return (string.unpack("f", string.pack("f", x))) end

-- the recurrence x = x * a + b on float32 lanes, computed here in double:
-- fused, one rounding per step (x * a is exact in double for float x and a,
-- and so is the sum for the magnitudes used below, so rounding it once to
-- float is the fused step); unfused, the product and the sum each rounded
local function reference(x0, steps, a, b, fused)
  local out = {}
  for i, x in ipairs(x0) do
    for _ = 1, steps do
      if fused then x = f32(x * a + b) else x = f32(f32(x * a) + b) end
    end
    out[i] = x
  end
  return out
end

local function start_values(lanes)
  local x = {}
  for i = 1, lanes do x[i] = f32(0.25 + i / 64) end -- distinct per lane, all in [0.25, 8.25]
  return x
end

local function differing_lanes(got, want)
  local bad = {}
  for i = 1, #want do
    if got[i] ~= want[i] then bad[#bad + 1] = string.format("lane %d: got %.9g, expected %.9g", i, got[i], want[i]) end
  end
  return bad
end

describe("each kernel set's FMA throughput loop", function()
  local a, b = f32(0.9), f32(0.35) -- products of up to 48 significant bits: fused and unfused steps differ

  it("has the lanes its vectors hold (a multiple of the set's width, enough chains)", function()
    local width = { scalar = 1, avx2 = 8, avx512 = 16 }
    for _, set in ipairs(info.available) do
      local lanes = core._fma_lanes(set)
      assert.are.equal(0, lanes % width[set], set)
      assert.is_true(lanes // width[set] >= 8, set .. ": too few chains to cover FMA latency x ports")
    end
  end)

  for _, set in ipairs(info.available) do
    local fused = set ~= "scalar" -- the scalar set is built without fused products
    it(set .. ": every lane equals the float32 recurrence x = x * a + b after 0, 1, 7 and 40 steps", function()
      local x0 = start_values(core._fma_lanes(set))
      for _, steps in ipairs { 0, 1, 7, 40 } do
        local got = core._fma_chains(set, steps, a, b, x0)
        local bad = differing_lanes(got, reference(x0, steps, a, b, fused))
        assert.are.same({}, bad, set .. ", " .. steps .. " steps")
      end
    end)
  end

  it("the reference tells fused from unfused steps, and one step more from one fewer (so the check can fail)", function()
    local x0 = start_values(32)
    assert.are_not.same({}, differing_lanes(reference(x0, 40, a, b, true), reference(x0, 40, a, b, false)))
    assert.are_not.same({}, differing_lanes(reference(x0, 40, a, b, true), reference(x0, 39, a, b, true)))
  end)

  it("refuses bad arguments, naming the function and the argument", function()
    local set = info.kernel
    local x0 = start_values(core._fma_lanes(set))
    assert.has_error(function() core._fma_chains("sse9", 1, a, b, x0) end)
    local ok, err = pcall(core._fma_chains, "sse9", 1, a, b, x0)
    assert.is_false(ok)
    assert.truthy(err:find("attn.core._fma_chains: set: expected one of scalar", 1, true), err)
    assert.truthy(err:find('got "sse9"', 1, true), err)
    ok, err = pcall(core._fma_chains, set, -1, a, b, x0)
    assert.truthy(err:find("steps: expected an integer in [0, 1e8], got -1", 1, true), err)
    ok, err = pcall(core._fma_chains, set, 1, a, b, { 1, 2 })
    assert.truthy(err:find("x: expected a table of " .. #x0 .. " numbers", 1, true), err)
    local short = start_values(#x0)
    short[3] = "three"
    ok, err = pcall(core._fma_chains, set, 1, a, b, short)
    assert.truthy(err:find("x[3]: expected a number, got a string", 1, true), err)
    ok, err = pcall(core._fma_lanes, 7)
    assert.truthy(err:find("attn.core._fma_lanes: set: expected one of", 1, true), err)
    assert.truthy(err:find("got a number", 1, true), err)
  end)
end)

describe("attn.core._fma_peak", function()
  it("measures a positive, finite GFLOP/s of the chosen set on OpenMP's threads", function()
    local r = core._fma_peak(0.01, 2)
    assert.is_true(r.gflops > 0 and r.gflops < math.huge, tostring(r.gflops))
    assert.is_true(r.ms > 0 and r.ms < math.huge, tostring(r.ms))
    assert.are.equal(info.kernel, r.kernel)
    assert.are.equal(info.threads, r.threads)
    assert.are.equal(core._fma_lanes(info.kernel), r.lanes)
    assert.is_true(r.steps >= 65536)
    -- gflops counts 2 flops per lane step, on every thread, in the best round
    assert.near(2 * r.lanes * r.steps * r.threads / (r.ms / 1000) / 1e9, r.gflops, 1e-9 * r.gflops)
    -- each lane runs x = x / 2 + 1 from 1..1.875 for >= 65536 steps: it ends at 2
    assert.are.equal(2.0 * r.lanes * r.threads, r.checksum)
  end)

  it("refuses bad arguments, naming them", function()
    local ok, err = pcall(core._fma_peak, 0, 1)
    assert.is_false(ok)
    assert.truthy(err:find("attn.core._fma_peak: round_seconds: expected a number in (0, 10], got 0", 1, true), err)
    ok, err = pcall(core._fma_peak, 0.01, 0)
    assert.truthy(err:find("rounds: expected an integer in [1, 100], got 0", 1, true), err)
    ok, err = pcall(core._fma_peak, "fast", 1)
    assert.is_false(ok)
    assert.truthy(err:find("attn.core._fma_peak", 1, true), err)
  end)
end)

describe("attn.cpu_info().avx512_full_width", function()
  -- the vendor, family and flags as Linux reports them (its "cpu family"
  -- already adds cpuid's extended family)
  local f = io.open("/proc/cpuinfo")
  local text = f and f:read("a") or ""
  if f then f:close() end
  local vendor = text:match("vendor_id%s*:%s*(%S+)")
  local family = tonumber(text:match("cpu family%s*:%s*(%d+)") or "")
  local flags = text:match("\nflags%s*:%s*([^\n]*)") or ""
  local test = (info.arch == "x86_64" and vendor and family) and it or pending

  test("is inferred from cpuid: false without AVX-512F and on AMD family 0x19 (Zen 4), true on AMD 0x1A (Zen 5) and Intel", function()
    assert.is_boolean(info.avx512_full_width)
    local has512 = (" " .. flags .. " "):find(" avx512f ", 1, true) ~= nil
    local expect
    if not has512 then expect = false
    elseif vendor == "AuthenticAMD" then expect = family >= 0x1A
    else expect = true end
    assert.are.equal(expect, info.avx512_full_width, vendor .. " family " .. family)
  end)
end)

describe("scripts/bench.lua's FMA reference", function()
  local function lines(args)
    local p = assert(io.popen("scripts/attn-lua scripts/bench.lua " .. args .. " 2>/dev/null"))
    local parse = dofile("scripts/lib/bench_lines.lua").parse
    local out = {}
    for line in p:lines() do out[#out + 1] = { text = line, fields = parse(line) } end
    local _, _, code = p:close()
    assert.are.equal(0, code)
    return out
  end

  it("prints fma_peak first, in the lines' shape, and of_fma_peak on every line with gflops", function()
    local out = lines("--cases sgemm_peak,fma_peak --reps 1")
    assert.are.equal(2, #out)
    local peak, sgemm = out[1].fields, out[2].fields
    assert.are.equal("fma_peak", peak.case, out[1].text)
    -- api.md section 5's fields, all present
    for _, k in ipairs { "case", "kernel", "b", "h", "lq", "lk", "e", "causal", "threads", "ms", "gflops", "peak_rss_mb" } do
      assert.is_not_nil(peak[k], k .. " missing in " .. out[1].text)
    end
    assert.are.equal(info.kernel, peak.kernel)
    assert.is_true(peak.gflops > 0, out[1].text)
    assert.are.equal("sgemm_peak", sgemm.case, out[2].text)
    assert.is_true(sgemm.gflops > 0)
    -- 4 significant digits each in the line
    assert.near(sgemm.gflops / peak.gflops, sgemm.of_fma_peak, 2e-3 * sgemm.of_fma_peak + 1e-4, out[2].text)
    assert.is_nil(peak.of_fma_peak, out[1].text)
  end)

  it("train_gemm: one line per form of the step's products, its gflops their flops over its ms", function()
    local out = lines("--cases train_gemm --reps 1")
    assert.are.equal(3, #out)
    -- 2 * tokens * sum(out * in) over the five weights, counted here
    local flops = 0
    for _, w in ipairs { { 384, 128 }, { 128, 128 }, { 512, 128 }, { 128, 512 }, { 256, 128 } } do
      flops = flops + 2 * 2048 * w[1] * w[2]
    end
    for i, form in ipairs { "x W^T", "g W", "g^T x" } do
      local f = out[i].fields
      assert.are.equal("train_gemm", f.case, out[i].text)
      assert.are.equal(form, f.kernel, out[i].text)
      assert.are.equal("384x128,128x128,512x128,128x512,256x128", f.weights, out[i].text)
      assert.is_true(f.ms > 0, out[i].text)
      assert.near(flops / (f.ms * 1e6), f.gflops, 2e-3 * f.gflops, out[i].text)
      assert.is_true(f.of_fma_peak > 0, out[i].text)
    end
  end)

  it("measures fma_peak for of_fma_peak also when its line is not asked for; no of_fma_peak without gflops", function()
    local out = lines("--cases sgemm_peak --reps 1")
    assert.are.equal(1, #out)
    assert.are.equal("sgemm_peak", out[1].fields.case, out[1].text)
    assert.is_true(out[1].fields.of_fma_peak > 0, out[1].text)
    out = lines("--cases tiny --reps 1")
    for _, l in ipairs(out) do
      assert.are.equal("tiny", l.fields.case, l.text)
      assert.is_nil(l.fields.gflops, l.text)
      assert.is_nil(l.fields.of_fma_peak, l.text)
    end
  end)
end)
