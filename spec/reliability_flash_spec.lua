-- The flash kernel must not overflow where the math kernel
-- is finite. Values near FLT_MAX / Lk used to overflow flash's unnormalised
-- output accumulator (v = 1e36, Lk = 1000: math 1e36, flash inf), and "auto"
-- switches kernels by size. Each case: math's result is finite, flash's is
-- finite and within tolerance of math (math itself is checked against a
-- double-precision softmax written here, on the first case).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention
local FLT_MAX = 3.4028234663852886e38

local function all_finite(t)
  for i, x in ipairs(C.flat(t)) do
    if x ~= x or x == math.huge or x == -math.huge then return false, i, x end
  end
  return true
end

-- flash (and auto) finite and within tol (default 1e-5) of math, relative to
-- vmax (the largest |v|: an output is a weighted mean of v, so that is its scale)
local function flash_matches_math(q, k, v, opts, vmax, what, tol)
  tol = tol or 1e-5
  local o = {}
  for key, x in pairs(opts or {}) do o[key] = x end
  o.kernel = "math"
  local ref = sdpa(q, k, v, o)
  local ok, i, x = all_finite(ref)
  assert(ok, ("%s: math kernel not finite at %s (%s): the case is ill-posed"):format(what, i, x))
  for _, kernel in ipairs {"flash", "auto"} do
    o.kernel = kernel
    local got = sdpa(q, k, v, o)
    ok, i, x = all_finite(got)
    assert(ok, ("%s: %s kernel gives %s at element %s where math is finite"):format(what, kernel, x, i))
    local a, b = C.flat(got), C.flat(ref)
    for j = 1, #b do
      if math.abs(a[j] - b[j]) > tol * vmax then
        error(("%s: %s element %d: %.9g, math %.9g"):format(what, kernel, j, a[j], b[j]), 2)
      end
    end
  end
  return ref
end

-- A tensor of the given shape, all elements x (when a number) or from the LCG times amp.
local function filled(x, ...) return attn.full({...}, x) end

describe("flash kernel stays finite where the math kernel is", function()
  it("v = 1e36, Lk = 1000 (the reported case), against a double-precision softmax too", function()
    local lq, lk, e, ev = 5, 1000, 8, 3
    local q, k = C.lcg_tensor(1, 0.5, 1, lq, e), C.lcg_tensor(2, 0.5, 1, lk, e)
    local v = filled(1e36, 1, lk, ev)
    local ref = flash_matches_math(q, k, v, {}, 1e36, "v = 1e36")
    -- every value is 1e36 (1e36 in float32), so the weighted mean is that value
    local v32 = C.f32(1e36)
    for _, x in ipairs(C.flat(ref)) do assert.is_true(math.abs(x - v32) <= 1e-5 * v32) end
    -- and with varied v, math against a double softmax computed here
    local vv = C.lcg_tensor(3, 1e36, 1, lk, ev)
    ref = flash_matches_math(q, k, vv, {}, 1e36, "v = +-1e36 varied")
    local Q, K, V, R = q:totable()[1], k:totable()[1], vv:totable()[1], ref:totable()[1]
    local scale = 1 / math.sqrt(e)
    for i = 1, lq do
      local s, mx = {}, -math.huge
      for j = 1, lk do
        local acc = 0
        for d = 1, e do acc = acc + C.f32(Q[i][d] * C.f32(scale)) * K[j][d] end
        s[j] = acc
        if acc > mx then mx = acc end
      end
      local sum = 0
      for j = 1, lk do s[j] = math.exp(s[j] - mx); sum = sum + s[j] end
      for d = 1, ev do
        local out = 0
        for j = 1, lk do out = out + s[j] / sum * V[j][d] end
        assert.is_true(math.abs(R[i][d] - out) <= 1e-5 * 1e36, ("row %d col %d: %g vs %g"):format(i, d, R[i][d], out))
      end
    end
  end)

  it("v near FLT_MAX / Lk and near FLT_MAX itself, long key sequences, several tiles", function()
    for _, c in ipairs {
      {lk = 1030, vmax = FLT_MAX / 1000}, {lk = 2000, vmax = FLT_MAX / 1000}, {lk = 300, vmax = FLT_MAX / 2},
      {lk = 4100, vmax = 1e38},
    } do
      local q, k = C.lcg_tensor(4, 1, 2, 70, 16), C.lcg_tensor(5, 1, 2, c.lk, 16)
      local what = ("Lk %d, |v| up to %g"):format(c.lk, c.vmax)
      flash_matches_math(q, k, filled(c.vmax, 2, c.lk, 4), {}, c.vmax, what .. ", constant v")
      flash_matches_math(q, k, C.lcg_tensor(6, c.vmax, 2, c.lk, 4), {}, c.vmax, what .. ", signed v")
    end
  end)

  it("huge v with causal masking, a boolean mask, a bias and peaked scores", function()
    local lq, lk = 300, 1030
    local q, k = C.lcg_tensor(7, 1, 1, 2, lq, 32), C.lcg_tensor(8, 1, 1, 2, lk, 32)
    local v = C.lcg_tensor(9, 1e37, 1, 2, lk, 8)
    flash_matches_math(q, k, v, {is_causal = true}, 1e37, "causal")
    local mask = C.lcg_tensor(10, 1, lq, lk):gt(0.3) -- about a third hidden
    flash_matches_math(q, k, v, {mask = mask}, 1e37, "mask")
    flash_matches_math(q, k, v, {bias = C.lcg_tensor(11, 4, lq, lk)}, 1e37, "bias")
    -- scores up to ~1e3: nearly one-hot rows, whose weights change by ~1e-4
    -- with the last bit of a score (the kernels sum the scores in other orders)
    flash_matches_math(q * 30, k * 30, v, {is_causal = true}, 1e37, "peaked scores", 1e-3)
    -- every score equal: the plain mean of 1030 huge values
    flash_matches_math(attn.zeros(1, 2, lq, 32), k, filled(FLT_MAX / 2, 1, 2, lk, 8), {}, FLT_MAX / 2, "equal scores")
  end)

  it("denormal and tiny v stay as accurate as before (the normalised accumulator)", function()
    local q, k = C.lcg_tensor(12, 1, 1, 70, 16), C.lcg_tensor(13, 1, 1, 1030, 16)
    flash_matches_math(q, k, C.lcg_tensor(14, 1e-30, 1, 1030, 4), {}, 1e-30, "v ~ 1e-30")
    flash_matches_math(q, k, C.lcg_tensor(15, 1, 1, 1030, 4), {is_causal = true}, 1, "v ~ 1")
  end)
end)
