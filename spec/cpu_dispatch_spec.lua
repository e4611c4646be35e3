-- Runtime CPU dispatch (src/core/cpu.c): attn.cpu_info's fields, ATTN_CPU forcing
-- each kernel set this CPU can run, every set within 2e-6 relative of the
-- others and of a double-precision reference written here, the same bits for
-- 1 and 2 threads within each set, the same bits for the AVX2 and AVX-512
-- sets, and a clear error for an unknown choice.
-- Each ATTN_CPU value runs in a child process (the choice is made once, at
-- require time).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local info = attn.cpu_info()

-- The child: flash attention on varied shapes, each output saved as DIR/NAME.npy.
-- Inputs come from a Lua LCG, so every child computes on the same inputs.
local CHILD = [[
local attn = require "attn"
local dir = arg[1]
local function lcg(seed, amp, ...)
  local shape, n = {...}, 1
  for _, s in ipairs(shape) do n = n * s end
  local state, data = seed, {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    data[i] = (state / 1073741824 - 1) * amp
  end
  return attn.tensor(data):view(shape)
end
local sdpa = attn.scaled_dot_product_attention
local cases = {
  {name = "plain", lq = 70, lk = 300, e = 64, ev = 64},
  {name = "causal", lq = 300, lk = 300, e = 80, ev = 13, opts = {is_causal = true}},
  {name = "causal_rect", lq = 37, lk = 530, e = 3, ev = 80, opts = {is_causal = true}},
  {name = "mask", lq = 65, lk = 270, e = 16, ev = 7, mask = true},
  {name = "bias", lq = 100, lk = 257, e = 32, ev = 24, bias = true},
  {name = "e1", lq = 33, lk = 513, e = 1, ev = 1},
  {name = "peaked", lq = 48, lk = 600, e = 64, ev = 12, amp = 3},
  {name = "dropout", lq = 40, lk = 280, e = 8, ev = 8, opts = {dropout_p = 0.25}},
  -- the AVX-512 micro-tiles of 3 and 2 row vectors (a last query block of 48 or 32 rows), tails of
  -- every width in Ev, a 1-vector softmax step over an odd key count
  {name = "rows48", lq = 112, lk = 389, e = 24, ev = 11},
  {name = "rows32", lq = 96, lk = 131, e = 5, ev = 13, opts = {is_causal = true}},
  -- split-K decoding, row by row (flash_decode.c): vector tails in E and Ev; 6 rows per kv head (GQA)
  {name = "decode", lq = 1, lk = 2100, e = 20, ev = 80},
  {name = "decode_gqa", lq = 2, lk = 1500, e = 64, ev = 19, hq = 6, opts = {enable_gqa = true, window = {-1, 0}}},
  -- E = 64 decoding: one row (queries in registers), 4 rows per kv head (their sums side by side)
  {name = "decode_e64", lq = 1, lk = 2100, e = 64, ev = 64},
  {name = "decode_gqa4", lq = 1, lk = 2100, e = 64, ev = 40, hq = 8, opts = {enable_gqa = true}},
  -- 12 rows: split-K over padded tiles (more rows than the row-wise path takes)
  {name = "decode_tiles", lq = 12, lk = 1100, e = 24, ev = 24},
}
for ci, c in ipairs(cases) do
  local amp = c.amp or 1
  local q = lcg(ci * 3 + 1, amp, 2, c.hq or 2, c.lq, c.e)
  local k = lcg(ci * 3 + 2, amp, 2, 2, c.lk, c.e)
  local v = lcg(ci * 3 + 3, 1, 2, 2, c.lk, c.ev)
  local opts = {kernel = "flash"}
  for key, x in pairs(c.opts or {}) do opts[key] = x end
  if c.mask then opts.mask = lcg(ci + 100, 1, c.lq, c.lk):gt(0.5) end
  if c.bias then opts.bias = lcg(ci + 200, 2, 2, 1, c.lq, c.lk) end
  if c.name == "causal" then v = v:transpose(3, 4):contiguous():transpose(3, 4) end -- strided v
  attn.manual_seed(7)
  attn.save(sdpa(q, k, v, opts), dir .. "/" .. c.name .. ".npy")
  if ci == 1 then attn.save(q, dir .. "/q.npy"); attn.save(k, dir .. "/k.npy"); attn.save(v, dir .. "/v.npy") end
end
print(attn.cpu_info().kernel)
print("END")
]]
local NAMES = {"plain", "causal", "causal_rect", "mask", "bias", "e1", "peaked", "dropout", "rows48", "rows32",
  "decode", "decode_gqa", "decode_e64", "decode_gqa4", "decode_tiles"}

-- each (ATTN_CPU, thread count) runs the child once, in its own process
local sets = require("support.kernel_sets").new(CHILD)
local run_child, read_bytes = sets.run, sets.read_bytes

-- |a - b| <= 2e-6 (|b| + scale) elementwise, scale = max |b| (the outputs are
-- weighted means of v, so an error is relative to the values' size)
local function within(a, b, rel, what)
  local x, y = C.flat(a), C.flat(b)
  assert.are.equal(#y, #x, what)
  local scale = 0
  for i = 1, #y do scale = math.max(scale, math.abs(y[i])) end
  for i = 1, #y do
    local d = math.abs(x[i] - y[i])
    if not (d <= rel * (math.abs(y[i]) + scale)) then
      error(("%s: element %d: %.9g vs %.9g (|diff| %.3g)"):format(what, i, x[i], y[i], d), 2)
    end
  end
end

describe("attn.cpu_info", function()
  it("reports the chosen kernel set, the runnable ones, the forcing, OpenBLAS's core and the threads", function()
    assert.is_string(info.kernel)
    assert.is_table(info.available)
    assert.are.equal("scalar", info.available[1])
    local found = false
    for _, name in ipairs(info.available) do
      assert.is_truthy(({scalar = true, avx2 = true, avx512 = true})[name], name)
      if name == info.kernel then found = true end
    end
    assert.is_true(found, "the chosen kernel is not in available")
    local env = os.getenv("ATTN_CPU")
    if env == nil or env == "" or env == "auto" then
      assert.are.equal(false, info.forced)
      assert.are.equal(info.available[#info.available], info.kernel, "auto picks the best")
    else
      assert.are.equal(env, info.forced)
      assert.are.equal(env, info.kernel)
    end
    assert.are.equal(attn.blas_info().core, info.openblas_core)
    assert.is_true(math.type(info.threads) == "integer" and info.threads >= 1)
    C.fails(function() attn.cpu_info(1) end, "attn.cpu_info", "expected no arguments")
  end)

  it("the x86-64 sets are listed where /proc/cpuinfo has their flags", function()
    assert.is_truthy(({ x86_64 = true, aarch64 = true, i386 = true, riscv64 = true, other = true })[info.arch],
      tostring(info.arch))
    -- (under qemu-user, /proc/cpuinfo is the host's: only an x86-64 build reads it)
    local f = info.arch == "x86_64" and io.open("/proc/cpuinfo")
    if not f then return end
    local cpuinfo = f:read("a")
    f:close()
    local has = {}
    for _, name in ipairs(info.available) do has[name] = true end
    if cpuinfo:find("%savx2%s") and cpuinfo:find("%sfma%s") then assert.is_true(has.avx2, "avx2 missing") end
    if cpuinfo:find("%savx512f%s") then assert.is_true(has.avx512, "avx512 missing") end
  end)
end)

describe("ATTN_CPU", function()
  it("an unknown choice fails the require, naming the value and the choices", function()
    for _, bad in ipairs {"bogus", "AVX2", "avx2 "} do
      local p = assert(io.popen(("ATTN_CPU='%s' scripts/attn-lua -e 'require \"attn\" print(\"LOADED\")' 2>&1"):format(bad)))
      local text = p:read("a")
      p:close()
      assert.is_nil(text:find("LOADED", 1, true), "loaded with ATTN_CPU=" .. bad)
      assert.is_truthy(text:find("attn: ATTN_CPU=" .. bad .. ": unknown kernel choice", 1, true), text)
      assert.is_truthy(text:find("scalar", 1, true), text)
    end
  end)

  it("empty and auto choose automatically", function()
    for _, v in ipairs {"", "auto"} do
      local p = assert(io.popen(("ATTN_CPU='%s' scripts/attn-lua -e 'local i = require(\"attn\").cpu_info() " ..
        "print(i.kernel, i.forced)' 2>&1"):format(v)))
      local text = p:read("a")
      p:close()
      assert.are.equal(info.available[#info.available] .. "\tfalse\n", text)
    end
  end)

  it("every runnable set: 1 and 2 threads give the same bits; every set within 2e-6 of the others and of a double reference", function()
    local dirs = {}
    for _, choice in ipairs(info.available) do
      local d1, d2 = run_child(choice, 1), run_child(choice, 2)
      for _, name in ipairs(NAMES) do
        assert.are.equal(read_bytes(d1 .. "/" .. name .. ".npy"), read_bytes(d2 .. "/" .. name .. ".npy"),
          ("ATTN_CPU=%s: %s differs between 1 and 2 threads"):format(choice, name))
      end
      dirs[choice] = d1
    end
    local base = dirs.scalar
    for choice, dir in pairs(dirs) do
      for _, name in ipairs(NAMES) do
        within(attn.load(dir .. "/" .. name .. ".npy"), attn.load(base .. "/" .. name .. ".npy"), 2e-6,
          ("%s against scalar, %s"):format(choice, name))
      end
      -- the first case against softmax(q k^T / 8) v in double precision
      local q, k, v = attn.load(dir .. "/q.npy"):totable(), attn.load(dir .. "/k.npy"):totable(),
        attn.load(dir .. "/v.npy"):totable()
      local got = attn.load(dir .. "/plain.npy"):totable()
      local want = {}
      for b = 1, 2 do
        for h = 1, 2 do
          local Q, K, V = q[b][h], k[b][h], v[b][h]
          for i = 1, #Q do
            local s, mx = {}, -math.huge
            for j = 1, #K do
              local acc = 0
              for d = 1, #Q[i] do acc = acc + C.f32(Q[i][d] * 0.125) * K[j][d] end
              s[j] = acc
              mx = math.max(mx, acc)
            end
            local sum = 0
            for j = 1, #K do s[j] = math.exp(s[j] - mx); sum = sum + s[j] end
            for d = 1, #V[1] do
              local o = 0
              for j = 1, #K do o = o + s[j] * V[j][d] end
              want[#want + 1] = o / sum
            end
          end
        end
      end
      local flat_got = {}
      for b = 1, 2 do for h = 1, 2 do for _, row in ipairs(got[b][h]) do
        for _, x in ipairs(row) do flat_got[#flat_got + 1] = x end
      end end end
      local scale = 0
      for i = 1, #want do scale = math.max(scale, math.abs(want[i])) end
      for i = 1, #want do
        assert(math.abs(flat_got[i] - want[i]) <= 2e-6 * (math.abs(want[i]) + scale),
          ("%s: element %d: %.9g, double reference %.9g"):format(choice, i, flat_got[i], want[i]))
      end
    end
  end)
end)

describe("ATTN_CPU=avx2 and avx512", function()
  -- docs/guarantees.md: the two vector sets give the same bits, on every path
  -- of the flash kernel, the split-K decoding ones (row by row, with vector
  -- tails in E and Ev; E = 64 with 6 rows per kv head) included
  it("give the same bits for every case, decoding included", function()
    local has = {}
    for _, name in ipairs(info.available) do has[name] = true end
    if not (has.avx2 and has.avx512) then return end
    local d2, d512 = run_child("avx2", 1), run_child("avx512", 1)
    for _, name in ipairs(NAMES) do
      local a, b = read_bytes(d2 .. "/" .. name .. ".npy"), read_bytes(d512 .. "/" .. name .. ".npy")
      if a ~= b then
        local x, y = C.flat(attn.load(d2 .. "/" .. name .. ".npy")), C.flat(attn.load(d512 .. "/" .. name .. ".npy"))
        local first
        for i = 1, #x do if x[i] ~= y[i] then first = i; break end end
        error(("%s: avx2 and avx512 differ, first at element %s: %.9g vs %.9g"):format(name, tostring(first),
          x[first or 1], y[first or 1]))
      end
    end
  end)
end)

-- leave no temporary files behind
teardown(sets.cleanup)
