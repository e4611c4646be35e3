-- The attention variants (enable_gqa, window, alibi_slopes,
-- softcap, return_lse), alone and combined with mask, bias, is_causal, scale
-- and dropout, in both kernels. References: spec/fixtures/sdpa_variant_cases.lua,
-- from PyTorch 1.13 plain ops in float64 (scripts/fixtures/make_variant_fixtures.py:
-- repeated heads for GQA, explicit masks for windows, an explicit ALiBi bias,
-- tanh softcap). The inputs are redrawn here with attn.manual_seed + randn /
-- rand, bit-compatible with torch's; masks are formulas of (i, j) written in
-- both files. Large shapes compare the flash kernel with the math kernel.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FIX = dofile("spec/fixtures/sdpa_variant_cases.lua")

local sdpa = attn.scaled_dot_product_attention
local NAME = "attn.scaled_dot_product_attention"
local ATOL, RTOL = 3e-5, 1e-5

-- The formula masks of make_variant_fixtures.py (1 = hidden), [lq, lk].
local function mask_formula(kind, lq, lk)
  local d = {}
  for i = 0, lq - 1 do
    for j = 0, lk - 1 do
      local hidden = (i * 7 + j * 3) % 5 == 0 or (kind == "rows" and i % 6 == 5)
      d[#d + 1] = hidden and 1 or 0
    end
  end
  return attn.tensor(d):view(lq, lk)
end

-- The inputs and options of fixture case c, drawn as the generator draws them.
local function inputs(c)
  attn.manual_seed(c.seed)
  local q = attn.randn(c.b, c.hq, c.lq, c.e)
  local k = attn.randn(c.b, c.hkv, c.lk, c.e)
  local v = attn.randn(c.b, c.hkv, c.lk, c.ev)
  local o = {return_lse = true, enable_gqa = c.gqa, window = c.window, softcap = c.softcap, scale = c.scale,
             is_causal = c.causal}
  if c.bias then o.bias = attn.randn(c.hq, c.lq, c.lk) end
  if c.alibi == "paper" then o.alibi_slopes = attn.alibi_slopes(c.hq) end
  if c.alibi == "random" then o.alibi_slopes = attn.rand(c.b, c.hq) end
  if c.mask then o.mask = mask_formula(c.mask, c.lq, c.lk) end
  return q, k, v, o
end

-- The rows (0-based, along dim -2 of out and -1 of lse) of out [b, h, lq, ev]
-- and lse [b, h, lq] that the fixture keeps, as {shape, data} lists.
local function pick_rows(out, lse, c)
  local o, l = out:totable(), lse:totable()
  local od, ld = {}, {}
  for b = 1, c.b do
    for h = 1, c.hq do
      for _, r in ipairs(c.rows) do
        for d = 1, c.ev do od[#od + 1] = o[b][h][r + 1][d] end
        ld[#ld + 1] = l[b][h][r + 1]
      end
    end
  end
  return attn.tensor(od):view(c.b, c.hq, #c.rows, c.ev), attn.tensor(ld):view(c.b, c.hq, #c.rows)
end

local function describe_case(c)
  local parts = {}
  for _, key in ipairs {"gqa", "causal", "bias", "alibi", "softcap", "scale", "mask"} do
    if c[key] ~= nil and c[key] ~= false then parts[#parts + 1] = key .. "=" .. tostring(c[key]) end
  end
  if c.window then parts[#parts + 1] = ("window={%d, %d}"):format(c.window[1], c.window[2]) end
  return ("%s: B %d, Hq %d, Hkv %d, Lq %d, Lk %d (%s)"):format(c.name, c.b, c.hq, c.hkv, c.lq, c.lk,
    table.concat(parts, " "))
end

describe("scaled_dot_product_attention variants against PyTorch 1.13", function()
  for _, c in ipairs(FIX.cases) do
    for _, kernel in ipairs {"math", "flash"} do
      it(kernel .. ": " .. describe_case(c), function()
        local q, k, v, o = inputs(c)
        o.kernel = kernel
        local out, lse = sdpa(q, k, v, o)
        assert.are.same({c.b, c.hq, c.lq, c.ev}, out:size())
        assert.are.same({c.b, c.hq, c.lq}, lse:size())
        local po, pl = pick_rows(out, lse, c)
        C.close(po, c.out, RTOL, ATOL, "out")
        C.close(pl, c.lse, RTOL, ATOL, "lse")
      end)
    end
  end

  it("attn.alibi_slopes(H) is the ALiBi reference's get_slopes (powers of 2 and not)", function()
    for _, s in ipairs(FIX.alibi_slopes) do
      C.close(attn.alibi_slopes(s.h), s.slopes, 1e-7, 0, "H = " .. s.h)
    end
  end)
end)

-- Independent of the fixtures: properties that hold exactly.
describe("scaled_dot_product_attention variants, exact properties", function()
  attn.manual_seed(7)
  local q, k, v = attn.randn(2, 4, 9, 8), attn.randn(2, 4, 13, 8), attn.randn(2, 4, 13, 5)
  for _, kernel in ipairs {"math", "flash"} do
    it(kernel .. ": window {-1, -1} and enable_gqa with equal head counts change nothing", function()
      local plain = sdpa(q, k, v, {kernel = kernel})
      C.same_bits(sdpa(q, k, v, {kernel = kernel, window = {-1, -1}}), plain)
      C.same_bits(sdpa(q, k, v, {kernel = kernel, window = {math.maxinteger, math.maxinteger}}), plain)
      C.same_bits(sdpa(q, k, v, {kernel = kernel, window = {22, 13}}), plain) -- wider than Lq + Lk
      C.same_bits(sdpa(q, k, v, {kernel = kernel, enable_gqa = true}), plain)
    end)
    it(kernel .. ": window {-1, 0} with Lq = Lk is is_causal", function()
      local qs = q:narrow(3, 1, 9)
      local ks, vs = k:narrow(3, 1, 9), v:narrow(3, 1, 9)
      C.same_bits(sdpa(qs, ks, vs, {kernel = kernel, window = {-1, 0}}),
        sdpa(qs, ks, vs, {kernel = kernel, is_causal = true}))
    end)
    it(kernel .. ": a window that hides every key gives zeros and lse -inf", function()
      -- Lq 9 > Lk 4: with {0, 0} query i sees key i - 5 only, so rows 1..5 see none
      local out, lse = sdpa(q, k:narrow(3, 1, 4), v:narrow(3, 1, 4), {kernel = kernel, window = {0, 0},
                                                                        return_lse = true})
      local o, l = out:totable(), lse:totable()
      for i = 1, 5 do
        assert.equal(-math.huge, l[2][3][i])
        for d = 1, 5 do assert.equal(0, o[2][3][i][d]) end
      end
      for i = 6, 9 do assert.is_true(l[2][3][i] > -math.huge) end
      -- row i (1-based) sees exactly key i - 5: out is that value row
      C.same_bits(out:narrow(3, 6, 4), v:narrow(3, 1, 4))
    end)
  end
  it("math returns out, weights, lse; window-hidden weights are exactly 0", function()
    local out, w, lse = sdpa(q, k, v, {kernel = "math", need_weights = true, return_lse = true, window = {2, 1}})
    assert.are.same({2, 4, 9, 13}, w:size())
    assert.are.same({2, 4, 9}, lse:size())
    local wt = w:totable()
    for i = 1, 9 do
      for j = 1, 13 do
        local visible = (i + 4 - 2 <= j) and (j <= i + 4 + 1) -- d = 4
        if not visible then assert.equal(0, wt[1][2][i][j]) else assert.is_true(wt[1][2][i][j] > 0) end
      end
    end
  end)
end)

describe("scaled_dot_product_attention variants, flash against math at long lengths", function()
  for _, c in ipairs {
    {lq = 267, lk = 1030, hq = 4, hkv = 2, e = 32, opts = {enable_gqa = true, window = {255, 0}}},
    {lq = 1030, lk = 1030, hq = 2, hkv = 2, e = 16, opts = {window = {255, 0}}},
    {lq = 1030, lk = 267, hq = 2, hkv = 1, e = 16, opts = {enable_gqa = true, is_causal = true, softcap = 5}},
    {lq = 1030, lk = 1030, hq = 4, hkv = 4, e = 16, opts = {window = {100, 300}, softcap = 2}},
    {lq = 1, lk = 1030, hq = 8, hkv = 2, e = 64, opts = {enable_gqa = true, window = {500, 0}}},
    {lq = 7, lk = 1030, hq = 4, hkv = 1, e = 64, opts = {enable_gqa = true, window = {-1, 0}, softcap = 30}},
    {lq = 267, lk = 1030, hq = 3, hkv = 3, e = 8, alibi = true, opts = {window = {600, 5}, is_causal = false}},
    {lq = 267, lk = 267, hq = 4, hkv = 2, e = 8, alibi = true, dropout = true,
     opts = {enable_gqa = true, window = {30, 0}, softcap = 3, dropout_p = 0.2}},
  } do
    local parts = {}
    for key, val in pairs(c.opts) do
      parts[#parts + 1] = key .. "=" .. (type(val) == "table" and ("{" .. table.concat(val, ", ") .. "}") or tostring(val))
    end
    table.sort(parts)
    it(("Lq %d, Lk %d, Hq %d, Hkv %d, E %d%s: %s"):format(c.lq, c.lk, c.hq, c.hkv, c.e, c.alibi and ", alibi" or "",
      table.concat(parts, " ")), function()
      attn.manual_seed(11)
      local q, k, v = attn.randn(1, c.hq, c.lq, c.e), attn.randn(1, c.hkv, c.lk, c.e), attn.randn(1, c.hkv, c.lk, c.e)
      local o = {return_lse = true}
      for key, val in pairs(c.opts) do o[key] = val end
      if c.alibi then o.alibi_slopes = attn.alibi_slopes(c.hq) end
      o.kernel = "math"
      attn.manual_seed(3)
      local om, lm = sdpa(q, k, v, o)
      o.kernel = "flash"
      attn.manual_seed(3)
      local of, lf = sdpa(q, k, v, o)
      assert.is_true(attn.allclose(of, om, 1e-5, 2e-5), "out")
      assert.is_true(attn.allclose(lf, lm, 2e-6, 2e-5), "lse")
    end)
  end
end)

describe("scaled_dot_product_attention variants: bits do not depend on the thread count", function()
  it("flash and math with GQA, window, ALiBi and softcap, 1 and 2 threads", function()
    local script = [[
local attn = require "attn"
attn.manual_seed(2)
local q, k, v = attn.randn(1, 8, 300, 32), attn.randn(1, 2, 700, 32), attn.randn(1, 2, 700, 32)
local h = 0
for _, kernel in ipairs({"math", "flash"}) do
  local out, lse = attn.scaled_dot_product_attention(q, k, v, {kernel = kernel, enable_gqa = true,
    window = {255, 3}, alibi_slopes = attn.alibi_slopes(8), softcap = 4, return_lse = true})
  for _, t in ipairs({out, lse}) do
    for _, x in ipairs(t:view(-1):totable()) do
      h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
    end
  end
end
io.write(string.format("%d\nEND\n", h))
]]
    assert.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)

describe("scaled_dot_product_attention variants: bad input", function()
  local q, k, v = attn.randn(2, 6, 5, 8), attn.randn(2, 4, 7, 8), attn.randn(2, 4, 7, 8)
  local q4, k2, v2 = attn.randn(2, 4, 5, 8), attn.randn(2, 2, 7, 8), attn.randn(2, 2, 7, 8)
  it("enable_gqa: head counts that do not divide, differing k and v heads, no head dim", function()
    C.fails(function() sdpa(q, k, v, {enable_gqa = true}) end, NAME, "enable_gqa",
      "multiple of the kv heads", "[2, 6, 5, 8] with 6", "[2, 4, 7, 8] with 4")
    C.fails(function() sdpa(q4, k2, v, {enable_gqa = true}) end, NAME, "enable_gqa", "head count",
      "2 ~= 4")
    C.fails(function() sdpa(attn.randn(5, 8), attn.randn(7, 8), attn.randn(7, 8), {enable_gqa = true}) end,
      NAME, "enable_gqa needs a head dim")
    C.fails(function() sdpa(q4, k2, v2) end, NAME, "do not broadcast") -- fewer kv heads without enable_gqa
    C.fails(function() sdpa(q4, k2, v2, {enable_gqa = "yes"}) end, NAME, "bad option 'enable_gqa'",
      "expected a boolean, got string")
  end)
  it("window: sizes < -1, wrong types and lengths", function()
    C.fails(function() sdpa(q4, k2, v2, {window = {-2, 0}}) end, NAME, "bad option 'window'", "left = -2")
    C.fails(function() sdpa(q4, k2, v2, {window = {0, -5}}) end, NAME, "bad option 'window'", "right = -5")
    C.fails(function() sdpa(q4, k2, v2, {window = {1.5, 0}}) end, NAME, "bad option 'window'", "left = 1.5")
    C.fails(function() sdpa(q4, k2, v2, {window = {"a", 0}}) end, NAME, "bad option 'window'",
      "left of type string")
    C.fails(function() sdpa(q4, k2, v2, {window = {3}}) end, NAME, "bad option 'window'", "got 1 entries")
    C.fails(function() sdpa(q4, k2, v2, {window = 3}) end, NAME, "bad option 'window'",
      "expected a table {left, right}, got number")
    C.fails(function() sdpa(q4, k2, v2, {window = attn.zeros(2)}) end, NAME, "bad option 'window'",
      "got attn.Tensor")
  end)
  it("alibi_slopes: wrong shapes and types", function()
    C.fails(function() sdpa(q4, k2, v2, {enable_gqa = true, alibi_slopes = attn.ones(2)}) end, NAME,
      "alibi_slopes must be [H] = [4] or [B, H] = [2, 4], got [2]")
    C.fails(function() sdpa(q4, k2, v2, {enable_gqa = true, alibi_slopes = attn.ones(4, 2)}) end, NAME,
      "alibi_slopes must be [H] = [4]", "got [4, 2]")
    C.fails(function() sdpa(q4, k2, v2, {enable_gqa = true, alibi_slopes = attn.ones(1, 2, 4)}) end, NAME,
      "alibi_slopes must be", "got [1, 2, 4]")
    C.fails(function() sdpa(attn.randn(5, 8), attn.randn(7, 8), attn.randn(7, 8), {alibi_slopes = attn.ones(1)}) end,
      NAME, "alibi_slopes needs q with a head dim")
    C.fails(function() sdpa(q4, k2, v2, {alibi_slopes = {1, 2, 3, 4}}) end, NAME, "bad option 'alibi_slopes'",
      "expected attn.Tensor")
  end)
  it("softcap: <= 0, not finite, wrong type", function()
    for _, bad in ipairs {0, -1, math.huge, 0 / 0, 1e39} do
      C.fails(function() sdpa(q4, q4, q4, {softcap = bad}) end, NAME, "bad option 'softcap'", "expected a number > 0")
    end
    C.fails(function() sdpa(q4, q4, q4, {softcap = "1"}) end, NAME, "bad option 'softcap'", "expected a number, got string")
  end)
  it("attn.alibi_slopes: bad H", function()
    for _, bad in ipairs {0, -3, 2.5, 1e9} do
      C.fails(function() attn.alibi_slopes(bad) end, "attn.alibi_slopes", "bad argument #1 'H'")
    end
    C.fails(function() attn.alibi_slopes("8") end, "attn.alibi_slopes", "got string")
    C.fails(function() attn.alibi_slopes() end, "attn.alibi_slopes")
  end)
  it("unknown options are still refused, naming the new ones", function()
    C.fails(function() sdpa(q4, q4, q4, {windows = {1, 1}}) end, NAME, "unknown option 'windows'", "softcap")
  end)
end)

-- Gradients through attn's autograd (the C backward of each kernel,
-- src/core/sdpa_backward.c), against torch autograd of the float64 reference.
describe("scaled_dot_product_attention variants: gradients against PyTorch 1.13", function()
  for _, c in ipairs(FIX.grads) do
    for _, kernel in ipairs {"math", "flash"} do
      it(kernel .. ": " .. describe_case(c), function()
        local q, k, v, o = inputs(c)
        local g = attn.randn(c.b, c.hq, c.lq, c.ev)
        local leaves = {q, k, v, o.bias}
        for _, t in ipairs(leaves) do attn.autograd.requires_grad_(t, true) end
        o.kernel, o.return_lse = kernel, nil
        sdpa(q, k, v, o):backward(g)
        C.close(q.grad, c.dq, RTOL, ATOL, "dq")
        C.close(k.grad, c.dk, RTOL, ATOL, "dk")
        C.close(v.grad, c.dv, RTOL, ATOL, "dv")
        if c.dbias then C.close(o.bias.grad, c.dbias, RTOL, ATOL, "dbias") end
      end)
    end
  end
end)
