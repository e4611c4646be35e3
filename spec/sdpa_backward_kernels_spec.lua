-- The backward's micro-kernels (src/core/kernels_bwd.h): every runnable set
-- (ATTN_CPU) against a double-precision reference written here, the AVX2 and
-- AVX-512 sets bit for bit (each element's sum in the same order), each set
-- the same bits for 1 and 2 threads, on shapes with row and column tails in
-- every product (E 37, Ev 70, 300 keys: two key blocks and a tail), causal,
-- the math kernel with a bias, GQA with a window and one slice that two
-- threads split into key and query blocks. Each ATTN_CPU value runs in a
-- child process (the choice is made once, at require time). The flash tiles
-- that nothing modifies run S -> P and dW -> dS in one fused pass (p_ds):
-- the same inputs with a bias of zeros (which takes the separate products,
-- exponential and dS passes) must give dq, dk, dv with the same bits, the
-- causal and window diagonals' per-row ranges included.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local info = attn.cpu_info()

-- The child: each case's dq, dk, dv saved as DIR/CASE.dq.npy etc. Inputs come
-- from a Lua LCG, so every child computes on the same inputs.
local CHILD = [[
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local raw = require("attn.core").autograd
local dir = arg[1]
local cases = {
  {name = "tails", b = 2, hq = 2, hkv = 2, lq = 77, lk = 300, e = 37, ev = 70, opts = {kernel = "flash"}},
  {name = "causal", b = 1, hq = 2, hkv = 2, lq = 200, lk = 200, e = 64, ev = 64,
   opts = {kernel = "flash", is_causal = true}},
  {name = "math_bias", b = 1, hq = 2, hkv = 2, lq = 70, lk = 150, e = 20, ev = 36, bias = true,
   opts = {kernel = "math"}},
  {name = "gqa_window", b = 1, hq = 4, hkv = 2, lq = 90, lk = 130, e = 16, ev = 24,
   opts = {kernel = "flash", enable_gqa = true, window = {40, 10}}},
  {name = "one_slice", b = 1, hq = 1, hkv = 1, lq = 300, lk = 260, e = 64, ev = 64, opts = {kernel = "flash"}},
  -- the inputs of tails, causal and one_slice (seed: their index) with a bias of zeros
  {name = "tails_zero_bias", seed = 1, zero_bias = true, b = 2, hq = 2, hkv = 2, lq = 77, lk = 300, e = 37, ev = 70,
   opts = {kernel = "flash"}},
  {name = "causal_zero_bias", seed = 2, zero_bias = true, b = 1, hq = 2, hkv = 2, lq = 200, lk = 200, e = 64, ev = 64,
   opts = {kernel = "flash", is_causal = true}},
  {name = "one_slice_zero_bias", seed = 5, zero_bias = true, b = 1, hq = 1, hkv = 1, lq = 300, lk = 260, e = 64,
   ev = 64, opts = {kernel = "flash"}},
  {name = "gqa_window_zero_bias", seed = 4, zero_bias = true, b = 1, hq = 4, hkv = 2, lq = 90, lk = 130, e = 16,
   ev = 24, opts = {kernel = "flash", enable_gqa = true, window = {40, 10}}},
}
for ci, c in ipairs(cases) do
  local seed = c.seed or ci
  local q = C.lcg_tensor(seed * 5 + 1, 1, c.b, c.hq, c.lq, c.e)
  local k = C.lcg_tensor(seed * 5 + 2, 1, c.b, c.hkv, c.lk, c.e)
  local v = C.lcg_tensor(seed * 5 + 3, 1, c.b, c.hkv, c.lk, c.ev)
  local dout = C.lcg_tensor(seed * 5 + 4, 1, c.b, c.hq, c.lq, c.ev)
  local o = {}
  for key, x in pairs(c.opts) do o[key] = x end
  if c.bias then o.bias = C.lcg_tensor(seed * 5 + 5, 2, c.lq, c.lk) end
  if c.zero_bias then o.bias = attn.zeros(c.lq, c.lk) end
  local out, saved = raw.sdpa_forward(q, k, v, o)
  local dq, dk, dv = raw.sdpa_backward(dout, q, k, v, out, saved, o)
  attn.save(dq, dir .. "/" .. c.name .. ".dq.npy")
  attn.save(dk, dir .. "/" .. c.name .. ".dk.npy")
  attn.save(dv, dir .. "/" .. c.name .. ".dv.npy")
  if ci == 1 then
    attn.save(q, dir .. "/q.npy"); attn.save(k, dir .. "/k.npy"); attn.save(v, dir .. "/v.npy")
    attn.save(dout, dir .. "/dout.npy")
  end
end
print(attn.cpu_info().kernel)
print("END")
]]
local CASES = {"tails", "causal", "math_bias", "gqa_window", "one_slice", "tails_zero_bias", "causal_zero_bias",
  "one_slice_zero_bias", "gqa_window_zero_bias"}
local NAMES = {}
for _, c in ipairs(CASES) do
  for _, g in ipairs {"dq", "dk", "dv"} do NAMES[#NAMES + 1] = c .. "." .. g end
end

-- each (ATTN_CPU, thread count) runs the child once, in its own process
local sets = require("support.kernel_sets").new(CHILD)
local run_child, read_bytes = sets.run, sets.read_bytes

-- |a - b| <= rel (|b| + max |b|) elementwise
local function within(x, y, rel, what)
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

-- The gradients of the first case's slice (1, 1) in double precision, from
-- the definitions: S = q k^T / sqrt(E), P = softmax(S), O = P v, dP = dO v^T,
-- dS = P (dP - rowsum(dO O)), dq = dS k / sqrt(E), dk = dS^T q / sqrt(E), dv = P^T dO.
local function reference(dir)
  local q, k, v = attn.load(dir .. "/q.npy"):totable(), attn.load(dir .. "/k.npy"):totable(),
    attn.load(dir .. "/v.npy"):totable()
  local dout = attn.load(dir .. "/dout.npy"):totable()
  local Q, K, V, DO = q[1][1], k[1][1], v[1][1], dout[1][1]
  local lq, lk, e, ev = #Q, #K, #Q[1], #V[1]
  local scale = 1 / math.sqrt(e)
  local dq, dk, dv = {}, {}, {}
  for j = 1, lk do
    dk[j], dv[j] = {}, {}
    for d = 1, e do dk[j][d] = 0 end
    for d = 1, ev do dv[j][d] = 0 end
  end
  for i = 1, lq do
    local s, mx = {}, -math.huge
    for j = 1, lk do
      local acc = 0
      for d = 1, e do acc = acc + Q[i][d] * K[j][d] end
      s[j] = acc * scale
      mx = math.max(mx, s[j])
    end
    local sum = 0
    for j = 1, lk do s[j] = math.exp(s[j] - mx); sum = sum + s[j] end
    local o = {}
    for d = 1, ev do o[d] = 0 end
    for j = 1, lk do
      s[j] = s[j] / sum
      for d = 1, ev do o[d] = o[d] + s[j] * V[j][d] end
    end
    local D = 0
    for d = 1, ev do D = D + DO[i][d] * o[d] end
    dq[i] = {}
    for d = 1, e do dq[i][d] = 0 end
    for j = 1, lk do
      local dp = 0
      for d = 1, ev do dp = dp + DO[i][d] * V[j][d] end
      local ds = s[j] * (dp - D)
      for d = 1, e do
        dq[i][d] = dq[i][d] + ds * K[j][d] * scale
        dk[j][d] = dk[j][d] + ds * Q[i][d] * scale
      end
      for d = 1, ev do dv[j][d] = dv[j][d] + s[j] * DO[i][d] end
    end
  end
  return {dq = dq, dk = dk, dv = dv}
end

local function flat_rows(rows)
  local out = {}
  for _, r in ipairs(rows) do for _, x in ipairs(r) do out[#out + 1] = x end end
  return out
end

describe("the backward's micro-kernel sets", function()
  it("every runnable set: 1 and 2 threads give the same bits, within 1e-5 of the others and of a double reference",
    function()
    local dirs = {}
    for _, choice in ipairs(info.available) do
      local d1, d2 = run_child(choice, 1), run_child(choice, 2)
      for _, name in ipairs(NAMES) do
        assert.are.equal(read_bytes(d1 .. "/" .. name .. ".npy"), read_bytes(d2 .. "/" .. name .. ".npy"),
          ("ATTN_CPU=%s: %s differs between 1 and 2 threads"):format(choice, name))
      end
      dirs[choice] = d1
    end
    local ref = reference(dirs.scalar)
    for choice, dir in pairs(dirs) do
      for _, name in ipairs(NAMES) do
        within(C.flat(attn.load(dir .. "/" .. name .. ".npy")), C.flat(attn.load(dirs.scalar .. "/" .. name .. ".npy")),
          1e-5, ("%s against scalar, %s"):format(choice, name))
      end
      for _, g in ipairs {"dq", "dk", "dv"} do
        local got = attn.load(dir .. "/tails." .. g .. ".npy"):totable()[1][1]
        within(flat_rows(got), flat_rows(ref[g]), 1e-5, ("%s against the double reference, %s"):format(choice, g))
      end
    end
  end)

  it("every runnable set: the fused S -> P, dW -> dS pass gives the bits of the separate passes (a zero bias)",
    function()
    for _, choice in ipairs(info.available) do
      for _, th in ipairs {1, 2} do
        local dir = run_child(choice, th)
        for _, case in ipairs {"tails", "causal", "one_slice", "gqa_window"} do
          for _, g in ipairs {"dq", "dk", "dv"} do
            local fused, separate = case .. "." .. g, case .. "_zero_bias." .. g
            local a, b = read_bytes(dir .. "/" .. fused .. ".npy"), read_bytes(dir .. "/" .. separate .. ".npy")
            if a ~= b then
              local x, y = C.flat(attn.load(dir .. "/" .. fused .. ".npy")), C.flat(attn.load(dir .. "/" .. separate .. ".npy"))
              local first
              for i = 1, #x do if x[i] ~= y[i] then first = i; break end end
              error(("ATTN_CPU=%s, %d threads: %s and %s differ, first at element %s: %.9g vs %.9g"):format(choice, th,
                fused, separate, tostring(first), x[first or 1], y[first or 1]))
            end
          end
        end
      end
    end
  end)

  it("AVX2 and AVX-512 give the same bits", function()
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

teardown(sets.cleanup)
