-- The backward of scaled dot-product attention, both kernels
-- (attn.core.autograd.sdpa_forward / sdpa_backward over src/core/sdpa_backward.c):
-- gradients of q, k, v and bias against torch 1.13 autograd (float64 plain ops,
-- scripts/fixtures/make_sdpa_grad_fixtures.py), each option, broadcast leading
-- dims, dropout with a seed; long sequences flash against math; zero gradients
-- for rows with no visible key; the same bits for 1 and 2 threads; bad input.
local attn = require "attn"
local raw = require("attn.core").autograd

local cases = dofile("spec/fixtures/sdpa_grad_cases.lua")
local fx = attn.load_safetensors("spec/fixtures/sdpa_grad.safetensors")

-- |a - b| <= atol + rtol |b| everywhere, with the worst element in the message
local function assert_close(a, b, rtol, atol, what)
  assert.same(b:size(), a:size(), what .. ": shape")
  local err = (a - b):abs() - (b:abs() * rtol + atol)
  local worst = err:max():item()
  assert(worst <= 0, ("%s: off by %.3g beyond the tolerance (max |diff| %.3g)"):format(what, worst,
    (a - b):abs():max():item()))
end

-- the forward's and backward's options of a fixture case
local function options(c, kernel)
  local o = { kernel = kernel, is_causal = c.is_causal, scale = c.scale, dropout_p = c.dropout_p }
  if c.has_mask then o.mask = fx[c.name .. ".mask"] end
  if c.has_bias then o.bias = fx[c.name .. ".bias"] end
  return o
end

local function run(c, kernel)
  local function t(n) return fx[c.name .. "." .. n] end
  local o = options(c, kernel)
  if c.seed then attn.manual_seed(c.seed) end
  o.need_weights = c.has_dweights
  local out, saved, ran, draw, weights = raw.sdpa_forward(t "q", t "k", t "v", o)
  assert.equal(kernel, ran)
  assert.equal(c.has_dweights == true, weights ~= nil)
  o.need_weights, o.dropout_draw, o.dweights = nil, draw, c.has_dweights and t "dweights" or nil
  local dq, dk, dv, dbias = raw.sdpa_backward(t "dout", t "q", t "k", t "v", out, saved, o)
  return { out = out, dq = dq, dk = dk, dv = dv, dbias = dbias }
end

describe("sdpa backward against torch 1.13 autograd", function()
  for _, c in ipairs(cases) do
    -- the weights output (and so its gradient) is the math kernel's alone
    for _, kernel in ipairs(c.has_dweights and { "math" } or { "math", "flash" }) do
      it(("%s, kernel %s"):format(c.name, kernel), function()
        local r = run(c, kernel)
        -- the forward first: the same out (with dropout: the same mask as torch's)
        assert_close(r.out, fx[c.name .. ".out"], 1e-5, 1e-5, "out")
        for _, g in ipairs { "dq", "dk", "dv" } do
          assert_close(r[g], fx[c.name .. "." .. g], 1e-5, 1e-5, g)
        end
        if c.has_bias then
          assert_close(r.dbias, fx[c.name .. ".dbias"], 1e-5, 1e-5, "dbias")
        else
          assert.is_nil(r.dbias)
        end
      end)
    end
  end

  it("the fixtures' broadcast case sums dk, dv and dbias back to the operands' shapes", function()
    local r = run(cases[10], "flash")
    assert.equal("broadcast", cases[10].name)
    assert.same({ 3, 9, 8 }, r.dk:size())
    assert.same({ 1, 3, 9, 8 }, r.dv:size())
    assert.same({ 1, 3, 1, 9 }, r.dbias:size())
  end)

  it("a query row with no visible key gets zero gradients, not NaN (mask case, row 5)", function()
    for _, kernel in ipairs { "math", "flash" } do
      local r = run(cases[4], kernel)
      assert.equal("mask", cases[4].name)
      local row = r.dq:select(3, 5)
      assert.equal(0, row:abs():max():item())
      assert.equal(0, r.dk:ne(r.dk):sum():item()) -- no NaN
    end
  end)

  it("bias_grad = false skips dbias", function()
    local c = cases[5]
    local o = options(c, "math")
    local q, k, v = fx[c.name .. ".q"], fx[c.name .. ".k"], fx[c.name .. ".v"]
    local out, saved, kernel = raw.sdpa_forward(q, k, v, o)
    o.kernel, o.bias_grad = kernel, false
    local dq, _, _, dbias = raw.sdpa_backward(fx[c.name .. ".dout"], q, k, v, out, saved, o)
    assert.is_nil(dbias)
    assert_close(dq, fx[c.name .. ".dq"], 1e-5, 1e-5, "dq")
  end)
end)

describe("attn.scaled_dot_product_attention records (attn.autograd.sdpa)", function()
  for _, idx in ipairs { 9, 10, 11, 12 } do -- dropout, broadcast (bias), weights_grad, all
    local c = cases[idx]
    for _, kernel in ipairs(c.has_dweights and { "math" } or { "math", "flash" }) do
      it(("%s, kernel %s: x.grad after backward is torch's"):format(c.name, kernel), function()
        local function t(n) return fx[c.name .. "." .. n]:clone() end
        local q, k, v = t "q":requires_grad_(), t "k":requires_grad_(), t "v":requires_grad_()
        local bias = c.has_bias and t "bias":requires_grad_() or nil
        local o = { kernel = kernel, is_causal = c.is_causal, scale = c.scale, dropout_p = c.dropout_p,
                    mask = c.has_mask and t "mask" or nil, bias = bias, need_weights = c.has_dweights,
                    return_lse = true }
        if c.seed then attn.manual_seed(c.seed) end
        local r = table.pack(attn.scaled_dot_product_attention(q, k, v, o))
        local out, lse = r[1], r[r.n]
        assert.equal("UnsafeViewBackward0", out.grad_fn:name())
        assert.is_false(lse.requires_grad)
        local loss = (out * t "dout"):sum()
        if c.has_dweights then loss = loss + (r[2] * t "dweights"):sum() end
        loss:backward()
        for _, pair in ipairs { { q, "dq" }, { k, "dk" }, { v, "dv" }, { bias, "dbias" } } do
          if pair[1] then assert_close(pair[1].grad, fx[c.name .. "." .. pair[2]], 1e-5, 1e-5, pair[2]) end
        end
      end)
    end
  end
  it("2-D inputs name MmBackward0; only the inputs that require grad get one", function()
    attn.manual_seed(1)
    local q, k, v = attn.randn(5, 4, { requires_grad = true }), attn.randn(6, 4), attn.randn(6, 3)
    local out = attn.scaled_dot_product_attention(q, k, v)
    assert.equal("MmBackward0", out.grad_fn:name())
    out:sum():backward()
    assert.same({ 5, 4 }, q.grad:size())
    assert.is_nil(k.grad)
    -- q.grad against the raw backward
    local o2, saved, kernel = raw.sdpa_forward(q:detach(), k, v)
    local dq = raw.sdpa_backward(attn.ones(5, 3), q:detach(), k, v, o2, saved, { kernel = kernel })
    assert.is_true(attn.equal(q.grad, dq))
  end)
  it("unrecorded calls (no_grad, nothing requires grad) give the plain function's results", function()
    attn.manual_seed(2)
    local q = attn.randn(2, 5, 4, { requires_grad = true })
    local a = attn.no_grad(attn.scaled_dot_product_attention, q, q, q)
    assert.is_nil(a.grad_fn)
    assert.is_true(attn.equal(a, attn.scaled_dot_product_attention(q:detach(), q:detach(), q:detach())))
    assert.is_true(attn.equal(a, attn.scaled_dot_product_attention(q, q, q)))
  end)
end)

describe("sdpa backward: the default dropout stream (per-element keep flags)", function()
  it("the forward hands back its keep flags; math and flash give the same gradients, not the mkl stream's", function()
    attn.manual_seed(31)
    local q, k, v = attn.randn(2, 40, 16), attn.randn(2, 50, 16), attn.randn(2, 50, 8)
    local dout = attn.randn(2, 40, 8)
    local function grads(kernel, stream)
      local prev = attn.get_dropout_stream()
      attn.set_dropout_stream(stream)
      attn.manual_seed(6)
      local o = { kernel = kernel, dropout_p = 0.4 }
      local out, saved, _, draw = raw.sdpa_forward(q, k, v, o)
      attn.set_dropout_stream(prev)
      assert.equal(stream == "default" and "userdata" or "number", type(draw))
      -- the forward is the public function's (the same stream, the same seed)
      attn.set_dropout_stream(stream)
      attn.manual_seed(6)
      assert.is_true(attn.equal(out, attn.scaled_dot_product_attention(q, k, v, { kernel = kernel, dropout_p = 0.4 })))
      attn.set_dropout_stream(prev)
      o.dropout_draw = draw
      return { raw.sdpa_backward(dout, q, k, v, out, saved, o) }
    end
    local m, f, mkl = grads("math", "default"), grads("flash", "default"), grads("math", "mkl")
    for i = 1, 3 do assert_close(f[i], m[i], 1e-5, 1e-5, "gradient " .. i) end
    assert.is_false(attn.allclose(m[1], mkl[1], 1e-3, 1e-3))
    -- keep flags of another call's size are refused
    local out, saved, _, draw = raw.sdpa_forward(q, k, v, { kernel = "math" })
    attn.set_dropout_stream("default")
    local _, _, _, other = raw.sdpa_forward(q[1], k[1], v[1], { kernel = "math", dropout_p = 0.4 })
    attn.set_dropout_stream("mkl")
    assert.equal(0, draw)
    local ok, e = pcall(raw.sdpa_backward, dout, q, k, v, out, saved, { kernel = "math", dropout_p = 0.4,
      dropout_draw = other })
    assert.is_false(ok)
    assert.is_truthy(tostring(e):find("its keep flags for 4000 elements, got userdata", 1, true))
  end)
end)

describe("sdpa backward: layouts and empty sizes", function()
  -- the column-major copy of t (same values, strides swapped in the last two dims)
  local function colmajor(t) return t:transpose(-1, -2):contiguous():transpose(-1, -2) end
  for _, kernel in ipairs { "math", "flash" } do
    it(kernel .. ": column-major q, k, v and dout (packed per slice) give the same bits", function()
      attn.manual_seed(21)
      local q, k, v = attn.randn(2, 70, 24), attn.randn(2, 300, 24), attn.randn(2, 300, 20)
      local dout = attn.randn(2, 70, 20)
      local o = { kernel = kernel, is_causal = true }
      local out, saved = raw.sdpa_forward(q, k, v, o)
      local a = { raw.sdpa_backward(dout, q, k, v, out, saved, o) }
      local b = { raw.sdpa_backward(colmajor(dout), colmajor(q), colmajor(k), colmajor(v), out, saved, o) }
      for i = 1, 3 do assert.is_true(attn.equal(a[i], b[i]), "gradient " .. i) end
    end)
    it(kernel .. ": Lk = 0, Lq = 0 and E = 0 give zero or empty gradients", function()
      for _, shape in ipairs { { 3, 0, 4, 5 }, { 0, 3, 4, 5 }, { 3, 4, 0, 5 } } do
        local lq, lk, e, ev = table.unpack(shape)
        local q, k, v = attn.randn(2, lq, e), attn.randn(2, lk, e), attn.randn(2, lk, ev)
        local out, saved = raw.sdpa_forward(q, k, v, { kernel = kernel })
        local dq, dk, dv = raw.sdpa_backward(attn.ones(2, lq, ev), q, k, v, out, saved, { kernel = kernel })
        assert.same({ 2, lq, e }, dq:size())
        assert.same({ 2, lk, e }, dk:size())
        assert.same({ 2, lk, ev }, dv:size())
        for _, g in ipairs { dq, dk } do
          if g:numel() > 0 then assert.equal(0, g:abs():max():item()) end
        end
        if lq > 0 and lk > 0 then -- E = 0: every weight 1 / Lk, so dv = (sum over queries of dout) / Lk = Lq / Lk
          assert.is_true(attn.allclose(dv, attn.full({ 2, lk, ev }, lq / lk), 1e-6, 1e-6))
        end
      end
    end)
  end
end)

describe("sdpa_forward hands back what the backward needs", function()
  attn.manual_seed(3)
  local q, k, v = attn.randn(2, 2, 40, 16), attn.randn(2, 2, 50, 16), attn.randn(2, 2, 50, 8)
  it("flash: out and the log-sum-exp of the public function", function()
    local out, lse, kernel, draw = raw.sdpa_forward(q, k, v, { kernel = "flash", is_causal = true })
    local o2, l2 = attn.scaled_dot_product_attention(q, k, v, { kernel = "flash", is_causal = true, return_lse = true })
    assert.equal("flash", kernel)
    assert.equal(0, draw)
    assert.is_true(attn.equal(out, o2))
    assert.is_true(attn.equal(lse, l2))
  end)
  it("math: the softmax before dropout, and the weights after it", function()
    attn.manual_seed(9)
    local out, probs, kernel, draw, w = raw.sdpa_forward(q, k, v, { kernel = "math", dropout_p = 0.5, need_weights = true })
    assert.equal("math", kernel)
    attn.manual_seed(9)
    local o2, w2 = attn.scaled_dot_product_attention(q, k, v, { kernel = "math", dropout_p = 0.5, need_weights = true })
    assert.is_true(attn.equal(out, o2))
    assert.is_true(attn.equal(w, w2))
    local _, p0 = attn.scaled_dot_product_attention(q, k, v, { kernel = "math", need_weights = true })
    assert.is_true(attn.equal(probs, p0))
    assert.is_true(draw > 0)
    -- the dropped weights are zero where probs is not, and the rest are probs / (1 - p)
    assert.is_true(attn.allclose(w, probs:mul(w:ne(0)) * 2, 1e-6, 0))
  end)
  it("return_lse: the lse comes last, the public function's, for both kernels", function()
    for _, kernel in ipairs { "math", "flash" } do
      local r = table.pack(raw.sdpa_forward(q, k, v, { kernel = kernel, return_lse = true, need_weights = kernel == "math",
        is_causal = true }))
      local p = table.pack(attn.scaled_dot_product_attention(q, k, v, { kernel = kernel, return_lse = true,
        need_weights = kernel == "math", is_causal = true }))
      assert.equal(kernel == "math" and 6 or 5, r.n)
      assert.is_true(attn.equal(r[1], p[1]))
      assert.is_true(attn.equal(r[r.n], p[p.n]))
      if kernel == "math" then assert.is_true(attn.equal(r[5], p[2])) end
      if kernel == "flash" then assert.are_not.equal(r[2], r[5]) end -- a copy: the saved lse stays the backward's
    end
  end)
  it("auto picks a kernel and says which", function()
    local sq = attn.randn(2, 2, 12, 16) -- fewer than 32 keys: math
    local _, _, small = raw.sdpa_forward(sq, sq, sq)
    assert.equal("math", small)
    local big = attn.randn(1, 1, 600, 8)
    local _, _, large = raw.sdpa_forward(big, big, big)
    assert.equal("flash", large)
  end)
end)

describe("sdpa backward, long sequences: flash against math", function()
  for _, c in ipairs {
    { lq = 1030, lk = 1030, e = 64, ev = 64, causal = true },
    { lq = 1030, lk = 267, e = 128, ev = 80, causal = false, mask = true },
    { lq = 65, lk = 1030, e = 80, ev = 64, causal = false, bias = true, dropout_p = 0.25 },
    { lq = 7, lk = 1030, e = 1, ev = 16, causal = true },
  } do
    it(("Lq %d, Lk %d, E %d, causal %s%s%s%s"):format(c.lq, c.lk, c.e, tostring(c.causal), c.mask and ", mask" or "",
      c.bias and ", bias" or "", c.dropout_p and ", dropout" or ""), function()
      attn.manual_seed(11)
      local q, k, v = attn.randn(1, 2, c.lq, c.e), attn.randn(1, 2, c.lk, c.e), attn.randn(1, 2, c.lk, c.ev)
      local dout = attn.randn(1, 2, c.lq, c.ev)
      local o = { is_causal = c.causal, dropout_p = c.dropout_p }
      if c.mask then o.mask = attn.rand(c.lq, c.lk):lt(0.3) end
      if c.bias then o.bias = attn.randn(2, c.lq, c.lk) end
      local r = {}
      for _, kernel in ipairs { "math", "flash" } do
        o.kernel = kernel
        attn.manual_seed(5)
        local out, saved, _, draw = raw.sdpa_forward(q, k, v, o)
        o.dropout_draw = draw
        r[kernel] = { raw.sdpa_backward(dout, q, k, v, out, saved, o) }
        o.dropout_draw = nil
      end
      for i, name in ipairs { "dq", "dk", "dv", "dbias" } do
        if r.math[i] then assert_close(r.flash[i], r.math[i], 1e-4, 2e-5, name) end
      end
      if c.causal and c.lq == c.lk then -- the last key is seen by the last query only
        assert.is_true(r.flash[2]:select(3, c.lk):abs():sum():item() > 0)
      end
    end)
  end
end)

describe("sdpa backward: the same bits for 1 and 2 threads", function()
  local CHILD = [[
local attn = require "attn"
local raw = require("attn.core").autograd
local dir = arg[1]
attn.manual_seed(1)
local q, k, v = attn.randn(2, 3, 300, 32), attn.randn(2, 3, 310, 32), attn.randn(2, 3, 310, 16)
local dout = attn.randn(2, 3, 300, 16)
local mask, bias = attn.rand(300, 310):lt(0.2), attn.randn(3, 1, 310)
local n = 0
for _, kernel in ipairs({"math", "flash"}) do
  for _, o in ipairs({ {is_causal = true}, {mask = mask, bias = bias}, {dropout_p = 0.3} }) do
    o.kernel = kernel
    attn.manual_seed(2)
    local out, saved, _, draw = raw.sdpa_forward(q, k, v, o)
    o.dropout_draw = draw
    local grads = { raw.sdpa_backward(dout, q, k, v, out, saved, o) }
    for i = 1, 4 do
      if grads[i] then n = n + 1; attn.save(grads[i], dir .. "/" .. n .. ".npy") end
    end
  end
end
-- one slice: with 2 threads the flash backward splits it into key and query
-- blocks (two passes), with 1 it runs it whole: the same bits
local q1, k1, v1, d1 = q[1]:narrow(1, 1, 1), k[1]:narrow(1, 1, 1), v[1]:narrow(1, 1, 1), dout[1]:narrow(1, 1, 1)
for _, o in ipairs({ {is_causal = true}, {mask = mask, bias = bias[1]}, {dropout_p = 0.3} }) do
  o.kernel = "flash"
  attn.manual_seed(2)
  local out, saved, _, draw = raw.sdpa_forward(q1, k1, v1, o)
  o.dropout_draw = draw
  local grads = { raw.sdpa_backward(d1, q1, k1, v1, out, saved, o) }
  for i = 1, 4 do
    if grads[i] then n = n + 1; attn.save(grads[i], dir .. "/" .. n .. ".npy") end
  end
end
io.write("END ", n, "\n")
]]
  it("math and flash, causal, mask + bias, dropout; one slice split in blocks", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local dirs, count = {}, nil
    for _, threads in ipairs { 1, 2 } do
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir " .. dir))
      dirs[threads] = dir
      local p = assert(io.popen(("OMP_NUM_THREADS=%d scripts/attn-lua %s %s 2>&1"):format(threads, script, dir)))
      local text = p:read("a")
      p:close()
      count = tonumber(text:match("END (%d+)\n"))
      assert(count, "child with " .. threads .. " threads failed: " .. text)
    end
    os.remove(script)
    assert.equal(30, count)
    local differ = {}
    for i = 1, count do
      local a = assert(io.open(dirs[1] .. "/" .. i .. ".npy", "rb")):read("a")
      local b = assert(io.open(dirs[2] .. "/" .. i .. ".npy", "rb")):read("a")
      assert(#a > 128)
      if a ~= b then differ[#differ + 1] = i end
    end
    for _, threads in ipairs { 1, 2 } do os.execute("rm -rf " .. dirs[threads]) end
    assert.same({}, differ)
  end)
end)

describe("sdpa backward: memory", function()
  it("the flash backward holds at most 256 KiB of the scaled q per thread, not a slice's [Lq, E] " ..
     "(peak RSS, in a child, 1 and 2 threads)", function()
    -- q, out, dq: 16 MiB each; a slice's scaled q per thread would add 8 MiB a thread
    local script = [[
local attn = require "attn"
local raw = require("attn.core").autograd
attn.manual_seed(1)
local q, k, v = attn.randn(1, 2, 32768, 64), attn.randn(1, 2, 64, 64), attn.randn(1, 2, 64, 64)
local o = {kernel = "flash"}
local out, lse = raw.sdpa_forward(q, k, v, o)
local before = attn.peak_rss_mb()
local dq = raw.sdpa_backward(out, q, k, v, out, lse, o)
assert(dq:size(3) == 32768)
io.write(string.format("%.1f\nEND\n", attn.peak_rss_mb() - before))
]]
    local run_with_threads = dofile("spec/fixtures/tensor_check.lua").run_with_threads
    -- under make asan the sanitizer's shadow of dq (an eighth of its bytes)
    -- is resident too
    local under_asan = (os.getenv("ATTN_BUILD") or ""):find("build-asan", 1, true) or os.getenv("LD_PRELOAD")
    local shadow = under_asan and 16 / 8 or 0
    for _, threads in ipairs { 1, 2 } do
      local grown = tonumber(run_with_threads(threads, script))
      assert.is_true(grown < 16 + shadow + threads + 1,
        ("%d threads: peak RSS grew by %.1f MiB (dq is 16%s)"):format(threads, grown,
          under_asan and ", its shadow 2" or ""))
    end
  end)
end)

describe("sdpa backward: every instruction set's exponential", function()
  -- the flash backward's P = exp(S - lse) goes through the chosen set
  -- (src/core/cpu.h exp_minus): each set this CPU runs, in a child with
  -- ATTN_CPU forcing it, against the fixture (the "all" case: tails of 1 to
  -- 15 keys, masked and dropped keys, hidden rows)
  local CHILD = [[
local attn = require "attn"
local raw = require("attn.core").autograd
local fx = attn.load_safetensors("spec/fixtures/sdpa_grad.safetensors")
local function t(n) return fx["all." .. n] end
local o = { kernel = "flash", is_causal = true, scale = 0.2, dropout_p = 0.2, mask = t "mask", bias = t "bias" }
attn.manual_seed(7)
local out, saved, _, draw = raw.sdpa_forward(t "q", t "k", t "v", o)
o.dropout_draw = draw
local g = { raw.sdpa_backward(t "dout", t "q", t "k", t "v", out, saved, o) }
local worst = 0
for i, n in ipairs({ "dq", "dk", "dv", "dbias" }) do
  local ref = t(n)
  worst = math.max(worst, ((g[i] - ref):abs() - ref:abs() * 1e-5):max():item())
end
io.write(attn.cpu_info().kernel, " ", string.format("%.3g", worst), "\n")
]]
  it("scalar, avx2, avx512 (those available) give the torch gradients", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    for _, set in ipairs(attn.cpu_info().available) do
      local p = assert(io.popen(("ATTN_CPU=%s scripts/attn-lua %s 2>&1"):format(set, script)))
      local text = p:read("a")
      p:close()
      local ran, worst = text:match("^(%w+) (%S+)\n$")
      assert.equal(set, ran, text)
      assert(tonumber(worst) <= 1e-5, set .. ": off by " .. worst)
    end
    os.remove(script)
  end)
end)

describe("sdpa backward: bad input", function()
  attn.manual_seed(4)
  local q, k, v = attn.randn(2, 5, 8), attn.randn(2, 6, 8), attn.randn(2, 6, 4)
  local dout = attn.randn(2, 5, 4)
  local out, lse = raw.sdpa_forward(q, k, v, { kernel = "flash" })
  local _, probs = raw.sdpa_forward(q, k, v, { kernel = "math" })
  local function err(fn, ...)
    local ok, e = pcall(fn, ...)
    assert.is_false(ok)
    return tostring(e)
  end
  local B = "attn.core.autograd.sdpa_backward: "
  it("dout, out and saved of the wrong shape", function()
    assert.equal(B .. "bad argument #1 'dout' (expected the shape of out [2, 5, 4], got [2, 5, 3])",
      err(raw.sdpa_backward, attn.randn(2, 5, 3), q, k, v, out, lse, { kernel = "flash" }):match("attn%.core.*"))
    assert.equal(B .. "bad argument #5 'out' (expected the forward's out [2, 5, 4], got [5, 4])",
      err(raw.sdpa_backward, dout, q, k, v, out[1], lse, { kernel = "flash" }):match("attn%.core.*"))
    assert.equal(B .. "bad argument #6 'saved' (expected the flash forward's contiguous lse [2, 5], got [2, 5, 6])",
      err(raw.sdpa_backward, dout, q, k, v, out, probs, { kernel = "flash" }):match("attn%.core.*"))
    assert.equal(B .. "bad argument #6 'saved' (expected the math forward's contiguous probs [2, 5, 6], got [2, 5])",
      err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "math" }):match("attn%.core.*"))
    assert.equal(B .. "bad argument #6 'saved' (expected the math forward's contiguous probs [2, 5, 6], got "
      .. "[2, 5, 6], not contiguous)",
      err(raw.sdpa_backward, dout, q, k, v, out, probs:transpose(2, 3):contiguous():transpose(2, 3),
        { kernel = "math" }):match("attn%.core.*"))
  end)
  it("dweights: the math kernel's, of the weights' shape", function()
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", dweights = probs }):find(
      B .. "bad option 'dweights' (the weights are the math kernel's; the forward ran \"flash\")", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, probs, { kernel = "math", dweights = lse }):find(
      B .. "bad option 'dweights' (expected the weights' shape [2, 5, 6], got [2, 5])", 1, true))
  end)
  it("the kernel and the dropout draw are required", function()
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse):find(
      "bad argument #7 'opts' (expected option kernel = \"math\" or \"flash\"", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "auto" }):find(
      "bad option 'kernel' (expected \"math\" or \"flash\", the kernel the forward ran, got auto)", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", dropout_p = 0.2 }):find(
      "dropout_p > 0 needs dropout_draw", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", dropout_p = 0.2,
      dropout_draw = -1 }):find(B .. "bad option 'dropout_draw' (expected the forward's dropout draw: an integer in "
      .. "[0, 2^32), or its keep flags for 60 elements, got number)", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", dropout_p = 0.2,
      dropout_draw = "x" }):find(B .. "bad option 'dropout_draw' (expected the forward's dropout draw", 1, true))
  end)
  it("unknown options, wrong types, bad operands", function()
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", need_weights = true })
      :find("unknown option 'need_weights' (expected one of mask, bias, is_causal, scale, dropout_p, kernel, "
        .. "dropout_draw, bias_grad, dweights, enable_gqa, window, alibi_slopes, softcap, block_mask, score_mod, mask_mod, "
        .. "score_mod_grads)", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", mask = 1 })
      :find("bad option 'mask' (expected attn.Tensor, got number)", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, "q", k, v, out, lse, { kernel = "flash" })
      :find(B .. "bad argument #2 'q' (expected attn.Tensor, got string)", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, attn.randn(2, 6, 7), v, out, lse, { kernel = "flash" })
      :find(B .. "q [2, 5, 8] and k [2, 6, 7] differ in the embedding size E", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash", mask = attn.full({ 5, 6 }, 0.5) })
      :find("mask must hold only 0 and 1", 1, true))
    assert.is_truthy(err(raw.sdpa_backward, dout, q, k, v, out, lse, { kernel = "flash" }, 8)
      :find("no more than 7 arguments expected", 1, true))
  end)
  it("the forward refuses flash with weights, and bad options", function()
    local F = "attn.core.autograd.sdpa_forward: "
    assert.is_truthy(err(raw.sdpa_forward, q, k, v, { kernel = "flash", need_weights = true })
      :find(F .. "kernel \"flash\" cannot return the attention weights", 1, true))
    assert.is_truthy(err(raw.sdpa_forward, q, k, v, { dropout_p = 1 })
      :find(F .. "bad option 'dropout_p' (expected a number in [0, 1), got 1.0)", 1, true))
    assert.is_truthy(err(raw.sdpa_forward, q, k, v, { dropout_draw = 3 }):find(F .. "unknown option 'dropout_draw'", 1, true))
    -- errors name the caller's function when it passes its name
    assert.is_truthy(err(raw.sdpa_forward, q, k, "v", nil, "attn.scaled_dot_product_attention"):find(
      "attn.scaled_dot_product_attention: bad argument #3 'v' (expected attn.Tensor, got string)", 1, true))
    assert.is_truthy(err(raw.sdpa_forward, q, attn.randn(2, 6, 7), v, nil, "attn.scaled_dot_product_attention"):find(
      "attn.scaled_dot_product_attention: q [2, 5, 8] and k [2, 6, 7] differ in the embedding size E", 1, true))
  end)
  it("the recorded forward words every bad option as the plain call does (one parser for both)", function()
    local NAME = "attn.scaled_dot_product_attention"
    local plain = require("attn.core").scaled_dot_product_attention
    local bad = {
      { kernel = "fast" }, { kernel = 2 }, { scale = 1e39 }, { scale = "x" }, { dropout_p = 1 }, { softcap = -1 },
      { softcap = "x" }, { window = { 1 } }, { window = { 1, 0.5 } }, { window = 3 }, { mask = 1 }, { bias = {} },
      { block_mask = 1 }, { alibi_slopes = true }, { enable_gqa = 1 }, { is_causal = 0 }, { need_weights = "yes" },
      { return_lse = 1 }, { maks = 1 }, { [1] = true }, { kernel = "flash", need_weights = true }, "opts",
    }
    for i, o in ipairs(bad) do
      local e_plain = err(plain, q, k, v, o):match("attn%..*")
      local e_recorded = err(raw.sdpa_forward, q, k, v, o, NAME):match("attn%..*")
      assert.is_truthy(e_plain:find(NAME .. ": ", 1, true), e_plain)
      assert.are.equal(e_plain, e_recorded, "case " .. i)
    end
  end)
end)
