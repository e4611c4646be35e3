-- The C backward of the SDPA variants (enable_gqa, window, alibi_slopes,
-- softcap; src/core/sdpa_backward.c), both kernels, through the recorded
-- attn.scaled_dot_product_attention: gradients of q, k, v and bias against
-- torch 1.13 autograd of plain float64 ops (scripts/fixtures/make_variant_grad_fixtures.py:
-- repeated kv heads, explicit window masks, an explicit ALiBi bias, tanh
-- softcap), each option alone and combined with mask, bias, is_causal, scale,
-- dropout and the weights output, lengths 1 to 1030 with Lq ~= Lk; exact
-- properties; the same bits for 1 and 2 threads; no [Lq, Lk] buffer in the
-- flash backward; bad input.
local attn = require "attn"
local raw = require("attn.core").autograd
local C = dofile("spec/fixtures/tensor_check.lua")

local cases = dofile("spec/fixtures/sdpa_variant_grad_cases.lua")
local fx = attn.load_safetensors("spec/fixtures/sdpa_variant_grad.safetensors")
local sdpa = attn.scaled_dot_product_attention
local RTOL, ATOL = 1e-5, 1e-5

-- |a - b| <= atol + rtol |b| everywhere, with the worst element in the message
local function assert_close(a, b, rtol, atol, what)
  assert.same(b:size(), a:size(), what .. ": shape")
  local err = (a - b):abs() - (b:abs() * rtol + atol)
  local worst = err:max():item()
  assert(worst <= 0, ("%s: off by %.3g beyond the tolerance (max |diff| %.3g)"):format(what, worst,
    (a - b):abs():max():item()))
end

-- The inputs of fixture case c, drawn as the generator draws them (attn's
-- randn / rand are torch's bits after the same seed), and its options.
local function inputs(c)
  attn.manual_seed(c.seed)
  local q = attn.randn(c.b, c.hq, c.lq, c.e)
  local k = attn.randn(c.b, c.hkv, c.lk, c.e)
  local v = attn.randn(c.b, c.hkv, c.lk, c.ev)
  local o = { enable_gqa = c.gqa, window = c.window, softcap = c.softcap, scale = c.scale, is_causal = c.is_causal,
              dropout_p = c.dropout_p }
  if c.slopes == "paper" then o.alibi_slopes = attn.alibi_slopes(c.hq) end
  if c.slopes == "random" then o.alibi_slopes = attn.rand(c.b, c.hq) end
  if c.bias then o.bias = attn.randn(c.lq, c.lk) end
  if c.mask then
    local m = attn.rand(c.lq, c.lk):lt(0.25)
    for i = 6, c.lq, 6 do m[i]:fill_(1) end -- every 6th row wholly hidden
    o.mask = m
  end
  local dweights = c.dweights and attn.randn(c.b, c.hq, c.lq, c.lk) or nil
  local dout = attn.randn(c.b, c.hq, c.lq, c.ev)
  return q, k, v, o, dout, dweights
end

local function describe_case(c)
  local parts = {}
  for _, key in ipairs { "gqa", "is_causal", "softcap", "scale", "dropout_p", "slopes", "mask", "bias", "dweights" } do
    if c[key] ~= nil then parts[#parts + 1] = key .. "=" .. tostring(c[key]) end
  end
  if c.window then parts[#parts + 1] = ("window={%d, %d}"):format(c.window[1], c.window[2]) end
  return ("%s: B %d, Hq %d, Hkv %d, Lq %d, Lk %d, E %d (%s)"):format(c.name, c.b, c.hq, c.hkv, c.lq, c.lk, c.e,
    table.concat(parts, " "))
end

describe("SDPA variants backward against torch 1.13 autograd", function()
  for _, c in ipairs(cases) do
    -- the weights output (and so its gradient) is the math kernel's alone
    for _, kernel in ipairs(c.dweights and { "math" } or { "math", "flash" }) do
      it(kernel .. ": " .. describe_case(c), function()
        local q, k, v, o, dout, dweights = inputs(c)
        for _, t in ipairs { q, k, v, o.bias } do t:requires_grad_() end
        o.kernel, o.need_weights, o.return_lse = kernel, dweights ~= nil, true
        if c.dropout_seed then attn.manual_seed(c.dropout_seed) end
        local r = table.pack(sdpa(q, k, v, o))
        local out, lse = r[1], r[r.n]
        assert.equal("UnsafeViewBackward0", out.grad_fn:name())
        assert.is_false(lse.requires_grad)
        -- the forward first: the same out (with dropout: the same mask as torch's)
        assert_close(out:detach(), fx[c.name .. ".out"], RTOL, ATOL, "out")
        local loss = (out * dout):sum()
        if dweights then loss = loss + (r[2] * dweights):sum() end
        loss:backward()
        assert_close(q.grad, fx[c.name .. ".dq"], RTOL, ATOL, "dq")
        assert_close(k.grad, fx[c.name .. ".dk"], RTOL, ATOL, "dk")
        assert_close(v.grad, fx[c.name .. ".dv"], RTOL, ATOL, "dv")
        if c.bias then assert_close(o.bias.grad, fx[c.name .. ".dbias"], RTOL, ATOL, "dbias") end
        if o.alibi_slopes then assert.is_nil(o.alibi_slopes.grad) end
      end)
    end
  end
end)

-- The raw forward and backward of one call (kernel given), gradients in a table.
local function grads(q, k, v, dout, o)
  local out, saved, _, draw = raw.sdpa_forward(q, k, v, o)
  local b = {}
  for key, val in pairs(o) do b[key] = val end
  b.dropout_draw = draw
  return { raw.sdpa_backward(dout, q, k, v, out, saved, b) }
end

describe("SDPA variants backward: exact properties", function()
  attn.manual_seed(17)
  local q, k, v = attn.randn(2, 4, 70, 16), attn.randn(2, 4, 150, 16), attn.randn(2, 4, 150, 8)
  local dout = attn.randn(2, 4, 70, 8)
  for _, kernel in ipairs { "math", "flash" } do
    it(kernel .. ": window {-1, -1} and enable_gqa with equal head counts change no bit", function()
      local plain = grads(q, k, v, dout, { kernel = kernel })
      for _, o in ipairs { { window = { -1, -1 } }, { enable_gqa = true }, { window = { 300, 300 } } } do
        o.kernel = kernel
        local g = grads(q, k, v, dout, o)
        for i = 1, 3 do C.same_bits(g[i], plain[i], "gradient " .. i) end
      end
    end)
    it(kernel .. ": window {-1, 0} with Lq = Lk is is_causal, bit for bit", function()
      local ks, vs = k:narrow(3, 1, 70), v:narrow(3, 1, 70)
      local a = grads(q, ks, vs, dout, { kernel = kernel, window = { -1, 0 }, softcap = 3 })
      local b = grads(q, ks, vs, dout, { kernel = kernel, is_causal = true, softcap = 3 })
      for i = 1, 3 do C.same_bits(a[i], b[i], "gradient " .. i) end
    end)
    it(kernel .. ": GQA's dk, dv are the sums over each group of the repeated heads' (fixed order, close)", function()
      -- 4 query heads on 2 kv heads against k, v repeated to 4 heads without GQA
      local k2, v2 = k:narrow(2, 1, 2):contiguous(), v:narrow(2, 1, 2):contiguous()
      local o = { kernel = kernel, window = { 40, 5 }, softcap = 2, alibi_slopes = attn.alibi_slopes(4) }
      local ref = grads(q, k2:repeat_interleave(2, 2), v2:repeat_interleave(2, 2), dout, o)
      o.enable_gqa = true
      local g = grads(q, k2, v2, dout, o)
      assert.same({ 2, 2, 150, 16 }, g[2]:size())
      C.same_bits(g[1], ref[1], "dq")
      for i, name in ipairs { "dk", "dv" } do
        local r = ref[i + 1]
        local summed = r:view(2, 2, 2, 150, r:size(4)):sum(3)
        assert_close(g[i + 1], summed, 1e-6, 1e-6, name)
      end
    end)
    it(kernel .. ": GQA with column-major k, v (packed per slice) gives the same bits", function()
      local function colmajor(t) return t:transpose(-1, -2):contiguous():transpose(-1, -2) end
      local k2, v2 = k:narrow(2, 1, 2):contiguous(), v:narrow(2, 1, 2):contiguous()
      local o = { kernel = kernel, enable_gqa = true, softcap = 2, window = { 60, 60 } }
      local a = grads(q, k2, v2, dout, o)
      local b = grads(q, colmajor(k2), colmajor(v2), dout, o)
      for i = 1, 3 do C.same_bits(a[i], b[i], "gradient " .. i) end
    end)
    it(kernel .. ": GQA with k, v broadcast over the batch: dk, dv keep their shape, summed over it", function()
      local k1, v1 = k[1]:narrow(1, 1, 2):contiguous(), v[1]:narrow(1, 1, 2):contiguous() -- [2, 150, E]
      local o = { kernel = kernel, enable_gqa = true, alibi_slopes = attn.rand(2, 4) }
      local g = grads(q, k1, v1, dout, o)
      assert.same({ 2, 150, 16 }, g[2]:size())
      assert.same({ 2, 150, 8 }, g[3]:size())
      local per = grads(q, k1:expand(2, 2, 150, 16):contiguous(), v1:expand(2, 2, 150, 8):contiguous(), dout, o)
      assert_close(g[2], per[2]:sum(1), 1e-6, 1e-6, "dk")
      assert_close(g[3], per[3]:sum(1), 1e-6, 1e-6, "dv")
      C.same_bits(g[1], per[1], "dq")
    end)
    it(kernel .. ": a row that sees no key (window) gets zero gradients, never NaN", function()
      -- Lq 70 > Lk 20: with {0, 0} query i sees key i - 50 only, so rows 1..50 see none
      local ks, vs = k:narrow(3, 1, 20), v:narrow(3, 1, 20)
      local g = grads(q, ks, vs, dout, { kernel = kernel, window = { 0, 0 }, softcap = 1 })
      assert.equal(0, g[1]:narrow(3, 1, 50):abs():max():item())
      assert.is_true(g[1]:narrow(3, 51, 20):abs():max():item() > 0)
      for i = 1, 3 do assert.equal(0, g[i]:ne(g[i]):sum():item()) end
    end)
  end
  it("flash and math agree with every variant at 1030 x 1030 (E 32)", function()
    attn.manual_seed(23)
    local ql, kl, vl = attn.randn(1, 4, 1030, 32), attn.randn(1, 2, 1030, 32), attn.randn(1, 2, 1030, 32)
    local dl = attn.randn(1, 4, 1030, 32)
    local o = { enable_gqa = true, window = { 300, 20 }, softcap = 4, alibi_slopes = attn.alibi_slopes(4),
                bias = attn.randn(1030, 1030) * 0.5, dropout_p = 0.1 }
    local r = {}
    for _, kernel in ipairs { "math", "flash" } do
      o.kernel = kernel
      attn.manual_seed(5)
      r[kernel] = grads(ql, kl, vl, dl, o)
    end
    for i, name in ipairs { "dq", "dk", "dv", "dbias" } do assert_close(r.flash[i], r.math[i], 1e-4, 2e-5, name) end
  end)
end)

describe("SDPA variants backward: the same bits for 1 and 2 threads", function()
  -- each gradient hashed in a child with OMP_NUM_THREADS 1 and 2: several kv
  -- groups (one item each), one group of 4 heads (the flash backward splits it
  -- into key and query blocks with 2 threads), MQA decoding (Lq 3)
  local script = [[
local attn = require "attn"
local raw = require("attn.core").autograd
attn.manual_seed(3)
local h = 0
local function hash(t)
  for _, x in ipairs(t:contiguous():view(-1):totable()) do
    h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
  end
end
local shapes = { {2, 4, 2, 300, 310}, {1, 4, 1, 300, 500}, {1, 8, 1, 3, 2100} }
for _, s in ipairs(shapes) do
  local b, hq, hkv, lq, lk = s[1], s[2], s[3], s[4], s[5]
  local q, k, v = attn.randn(b, hq, lq, 32), attn.randn(b, hkv, lk, 32), attn.randn(b, hkv, lk, 16)
  local dout = attn.randn(b, hq, lq, 16)
  for _, kernel in ipairs({"math", "flash"}) do
    for _, o in ipairs({ {window = {100, 10}, softcap = 2, alibi_slopes = attn.alibi_slopes(hq)},
                         {is_causal = true, bias = attn.randn(lq, lk), dropout_p = 0.2, softcap = 5} }) do
      o.kernel, o.enable_gqa = kernel, true
      attn.manual_seed(9)
      local out, saved, _, draw = raw.sdpa_forward(q, k, v, o)
      o.dropout_draw = draw
      for _, g in ipairs({ raw.sdpa_backward(dout, q, k, v, out, saved, o) }) do hash(g) end
    end
  end
end
io.write(string.format("%d\nEND\n", h))
]]
  it("math and flash, GQA groups, window, ALiBi, softcap, bias, causal, dropout", function()
    assert.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)

describe("SDPA variants backward: memory", function()
  it("a flash backward with a window at L = 8192 allocates no [Lq, Lk] buffer (peak RSS, in a child)", function()
    -- [Lq, Lk] of one head is 256 MiB; q, k, v, out, dout and the gradients together are 28 MiB
    local script = [[
local attn = require "attn"
local raw = require("attn.core").autograd
attn.manual_seed(1)
local q, k, v = attn.randn(1, 4, 8192, 64), attn.randn(1, 1, 8192, 64), attn.randn(1, 1, 8192, 64)
local dout = attn.randn(1, 4, 8192, 64)
local o = {kernel = "flash", enable_gqa = true, window = {255, 0}, softcap = 10}
local before = attn.peak_rss_mb()
local out, lse = raw.sdpa_forward(q, k, v, o)
local dq, dk, dv = raw.sdpa_backward(dout, q, k, v, out, lse, o)
assert(dk:size(2) == 1 and dq:size(2) == 4)
io.write(string.format("%.1f\nEND\n", attn.peak_rss_mb() - before))
]]
    local grown = tonumber(C.run_with_threads(2, script))
    assert.is_true(grown < 48, ("peak RSS grew by %.1f MiB"):format(grown))
  end)
end)

describe("SDPA variants backward: bad input", function()
  attn.manual_seed(4)
  local q, k, v = attn.randn(1, 4, 5, 8), attn.randn(1, 2, 6, 8), attn.randn(1, 2, 6, 4)
  local dout = attn.randn(1, 4, 5, 4)
  local out, lse = raw.sdpa_forward(q, k, v, { kernel = "flash", enable_gqa = true })
  local B = "attn.core.autograd.sdpa_backward: "
  it("the backward's variant options are checked and name it", function()
    C.fails(function() raw.sdpa_backward(dout, q, k, v, out, lse, { kernel = "flash", enable_gqa = true,
      window = { -2, 0 } }) end, B .. "bad option 'window' (expected {left, right} of integers >= -1, got left = -2)")
    C.fails(function() raw.sdpa_backward(dout, q, k, v, out, lse, { kernel = "flash", enable_gqa = true,
      softcap = 0 }) end, B .. "bad option 'softcap' (expected a number > 0")
    C.fails(function() raw.sdpa_backward(dout, q, k, v, out, lse, { kernel = "flash", enable_gqa = true,
      alibi_slopes = attn.ones(3) }) end, B, "alibi_slopes must be [H] = [4]")
    C.fails(function() raw.sdpa_backward(dout, q, k, v, out, lse, { kernel = "flash", enable_gqa = 1 }) end,
      B .. "bad option 'enable_gqa' (expected a boolean, got number)")
  end)
  it("without enable_gqa the head counts must match, with it they must divide", function()
    C.fails(function() raw.sdpa_backward(dout, q, k, v, out, lse, { kernel = "flash" }) end, B, "do not broadcast")
    local k3, v3 = attn.randn(1, 3, 6, 8), attn.randn(1, 3, 6, 4)
    C.fails(function() raw.sdpa_backward(dout, q, k3, v3, out, lse, { kernel = "flash", enable_gqa = true }) end, B,
      "the query heads must be a multiple of the kv heads")
  end)
  it("the recorded call refuses what the public function refuses, naming it", function()
    local qg = q:clone():requires_grad_()
    C.fails(function() sdpa(qg, k, v, { window = { 1, 1 } }) end, "attn.scaled_dot_product_attention", "do not broadcast")
    C.fails(function() sdpa(qg, k, v, { enable_gqa = true, softcap = -1 }) end,
      "attn.scaled_dot_product_attention: bad option 'softcap'")
  end)
  it("an in-place change of the saved ALiBi slopes is caught at backward", function()
    local qg = q:clone():requires_grad_()
    local slopes = attn.alibi_slopes(4)
    local o = sdpa(qg, k, v, { enable_gqa = true, alibi_slopes = slopes })
    slopes:mul_(2)
    assert.has_error(function() o:sum():backward() end)
  end)
end)
