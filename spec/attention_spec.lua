-- attn.scaled_dot_product_attention and attn.simple_attention (math kernel).
-- Reference values: spec/fixtures/sdpa_cases.lua, written by
-- scripts/fixtures/make_sdpa_fixtures.py (float64 PyTorch, rounded), and
-- hand-computed values; the property specs compare the kernel with itself
-- under transformations whose effect is known.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/sdpa_cases.lua")

local sdpa = attn.scaled_dot_product_attention
local NAME = "attn.scaled_dot_product_attention"
local TOL = 2e-6

-- Deterministic pseudo-random values in [-1, 1) from a Lua LCG (not attn's RNG).
local function lcg_tensor(seed, ...) return C.lcg_tensor(seed, 1, ...) end

-- The float32 bits of every element, as one hex string.
local function bits(t) return table.concat(C.bits(t)) end

local function opts_of(c)
  return {mask = c.mask and C.T(c.mask), bias = c.bias and C.T(c.bias), is_causal = c.is_causal, scale = c.scale,
          need_weights = c.need_weights}
end

describe("attn.scaled_dot_product_attention against PyTorch", function()
  for _, c in ipairs(F.sdpa) do
    it(c.name, function()
      local out, w = sdpa(C.T(c.q), C.T(c.k), C.T(c.v), opts_of(c))
      C.close(out, c.out, 0, TOL, "out")
      if c.need_weights then
        C.close(w, c.weights, 0, TOL, "weights")
      else
        assert.is_nil(w)
      end
    end)
  end

  it("kernel = 'math' and 'auto' give the same bits as the default", function()
    local c = F.sdpa[6]
    local a = sdpa(C.T(c.q), C.T(c.k), C.T(c.v))
    local b = sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {kernel = "math"})
    local d = sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {kernel = "auto"})
    assert.equal(bits(a), bits(b))
    assert.equal(bits(a), bits(d))
  end)

  it("strided operands: transposed q/k/v views and an expanded mask", function()
    local c = F.sdpa[1]
    local q = C.T(c.q):t():contiguous():t()   -- column-major [3, 4]
    local k = C.T(c.k):t():contiguous():t()
    local v = C.T(c.v):t():contiguous():t()
    assert.is_false(k:is_contiguous())
    local out, w = sdpa(q, k, v, {need_weights = true, mask = attn.zeros(1, 1):expand(3, 5)})
    C.close(out, c.out, 0, TOL, "out")
    C.close(w, c.weights, 0, TOL, "weights")
    -- a non-unit-stride slice of a wider tensor (packed path)
    local wide = attn.zeros(5, 8)
    wide:narrow(2, 1, 4):copy_(C.T(c.k))
    local kk = wide:view(5, 4, 2):select(3, 1)   -- stride {8, 2}
    local wide2 = attn.zeros(5, 8)
    wide2:view(5, 4, 2):select(3, 1):copy_(C.T(c.k))
    out = sdpa(C.T(c.q), wide2:view(5, 4, 2):select(3, 1), v)
    C.close(out, c.out, 0, TOL, "out, k with stride 2")
    assert.equal(2, kk:stride(2))
  end)

  it("keys expanded from one row (stride 0) give the mean of v", function()
    local q = lcg_tensor(1, 3, 4)
    local k = lcg_tensor(2, 1, 4):expand(5, 4)
    local v = attn.tensor{{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}}
    local out, w = sdpa(q, k, v, {need_weights = true})
    C.close(w, {shape = {3, 5}, data = {0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2}}, 0, 1e-7)
    C.close(out, {shape = {3, 2}, data = {5, 6, 5, 6, 5, 6}}, 0, 4e-6)
  end)
end)

describe("attn.simple_attention against PyTorch", function()
  for i, c in ipairs(F.simple) do
    it("case " .. i .. " x " .. table.concat(c.x.shape, "x"), function()
      C.close(attn.simple_attention(C.T(c.x)), c.out, 0, TOL)
    end)
  end
  it("hand-computed: orthonormal rows", function()
    -- x = I2: scores = I2, softmax rows = {e, 1}/(e + 1), out = those rows
    local e = math.exp(1)
    local a, b = e / (e + 1), 1 / (e + 1)
    C.close(attn.simple_attention(attn.tensor{{1, 0}, {0, 1}}), {shape = {2, 2}, data = {a, b, b, a}}, 0, 1e-7)
  end)
end)

describe("attention properties", function()
  local q, k, v = lcg_tensor(11, 2, 3, 7, 8), lcg_tensor(12, 2, 3, 9, 8), lcg_tensor(13, 2, 3, 9, 5)

  it("weight rows sum to 1", function()
    local _, w = sdpa(q, k, v, {need_weights = true, mask = lcg_tensor(14, 7, 9):gt(0.5)})
    local rows = C.flat(w:sum(-1))
    assert.equal(2 * 3 * 7, #rows)
    for _, s in ipairs(rows) do assert.is_true(math.abs(s - 1) <= 1e-6, "row sum " .. s) end
  end)

  it("causal: position i does not change when later tokens change (bitwise)", function()
    local x = lcg_tensor(21, 6, 4)
    local y = x:clone()
    y:narrow(1, 4, 3):copy_(lcg_tensor(22, 3, 4))
    local ox = sdpa(x, x, x, {is_causal = true})
    local oy = sdpa(y, y, y, {is_causal = true})
    assert.equal(bits(ox:narrow(1, 1, 3)), bits(oy:narrow(1, 1, 3)))
    assert.are_not.equal(bits(ox:narrow(1, 4, 1)), bits(oy:narrow(1, 4, 1)))
  end)

  it("permuting the queries permutes the outputs", function()
    local q2, k2, v2 = lcg_tensor(31, 5, 4), lcg_tensor(32, 6, 4), lcg_tensor(33, 6, 3)
    local perm = {3, 1, 5, 2, 4}
    local qp = attn.stack({q2[3], q2[1], q2[5], q2[2], q2[4]}, 1)
    local o, op = sdpa(q2, k2, v2), sdpa(qp, k2, v2)
    for i, p in ipairs(perm) do assert.is_true(attn.allclose(op[i], o[p], 0, 1e-6)) end
  end)

  it("permuting keys together with values leaves the outputs unchanged", function()
    local q2, k2, v2 = lcg_tensor(41, 5, 4), lcg_tensor(42, 6, 4), lcg_tensor(43, 6, 3)
    local kp = attn.stack({k2[6], k2[2], k2[4], k2[1], k2[5], k2[3]}, 1)
    local vp = attn.stack({v2[6], v2[2], v2[4], v2[1], v2[5], v2[3]}, 1)
    assert.is_true(attn.allclose(sdpa(q2, kp, vp), sdpa(q2, k2, v2), 0, 1e-6))
  end)

  it("batch items are independent", function()
    local o = sdpa(q, k, v)
    for b = 1, 2 do
      for h = 1, 3 do
        assert.is_true(attn.allclose(o[b][h], sdpa(q[b][h], k[b][h], v[b][h]), 0, 1e-6))
      end
    end
  end)

  it("Lk = 1 gives v for every query (bitwise)", function()
    local v1 = lcg_tensor(51, 2, 1, 3)
    local out, w = sdpa(lcg_tensor(52, 2, 4, 5), lcg_tensor(53, 2, 1, 5), v1, {need_weights = true})
    assert.equal(bits(v1:expand(2, 4, 3)), bits(out))
    assert.equal(bits(attn.ones(2, 4, 1)), bits(w))
  end)

  it("is_causal equals an explicit triu(ones, 1) mask (bitwise)", function()
    for _, lk in ipairs({7, 4, 11}) do
      local kk, vv = lcg_tensor(61, 2, 3, lk, 8), lcg_tensor(62, 2, 3, lk, 5)
      local a, wa = sdpa(q, kk, vv, {is_causal = true, need_weights = true})
      local b, wb = sdpa(q, kk, vv, {mask = attn.triu(attn.ones(7, lk), 1), need_weights = true})
      assert.equal(bits(a), bits(b))
      assert.equal(bits(wa), bits(wb))
    end
  end)

  it("a fully hidden row gives zeros, never NaN", function()
    local out, w = sdpa(q, k, v, {mask = attn.ones(9), need_weights = true})
    assert.equal(bits(attn.zeros(2, 3, 7, 5)), bits(out))
    assert.equal(bits(attn.zeros(2, 3, 7, 9)), bits(w))
    -- a bias of -inf hides too
    local bias = attn.zeros(7, 9)
    bias[2] = -math.huge
    local o2 = sdpa(q, k, v, {bias = bias})
    assert.equal(bits(attn.zeros(2, 3, 5)), bits(o2:select(3, 2)))
  end)

  it("empty and degenerate sizes", function()
    -- Lk = 0: every row hidden -> zeros
    local out, w = sdpa(attn.ones(3, 2), attn.zeros(0, 2), attn.zeros(0, 4), {need_weights = true})
    C.is(out, {3, 4}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
    assert.same({3, 0}, w:size())
    -- Lq = 0 and an empty batch
    assert.same({0, 4}, sdpa(attn.ones(0, 2), attn.ones(5, 2), attn.ones(5, 4)):size())
    assert.same({0, 3, 4}, sdpa(attn.ones(0, 3, 2), attn.ones(5, 2), attn.ones(5, 4)):size())
    -- E = 0: all scores 0, uniform weights, out = mean of v
    local o0 = sdpa(attn.ones(2, 0), attn.ones(4, 0), attn.tensor{{1}, {2}, {3}, {6}})
    C.is(o0, {2, 1}, {3, 3})
    -- Ev = 0
    assert.same({2, 0}, sdpa(attn.ones(2, 3), attn.ones(4, 3), attn.ones(4, 0)):size())
  end)

  it("same bits with OMP_NUM_THREADS=1 and 2", function()
    local script = [[
      local attn = require "attn"
      local function gen(seed, ...)
        local shape, n, s, d = {...}, 1, seed, {}
        for _, x in ipairs(shape) do n = n * x end
        for i = 1, n do s = (s * 1103515245 + 12345) % 2147483648; d[i] = s / 1073741824 - 1 end
        return attn.tensor(d):view(shape)
      end
      local function hex(t)
        local p = {}
        local function walk(x) if type(x) == "table" then for i = 1, #x do walk(x[i]) end
          else p[#p + 1] = string.format("%08x", string.unpack("<I4", string.pack("<f", x))) end end
        walk(t:totable())
        return table.concat(p)
      end
      local o1, w1 = attn.scaled_dot_product_attention(gen(1, 3, 4, 40, 16), gen(2, 3, 4, 50, 16),
        gen(3, 3, 4, 50, 8), {need_weights = true, is_causal = true})
      local x = gen(4, 1, 260, 24)
      local o2 = attn.scaled_dot_product_attention(x, x, x, {mask = gen(5, 260, 260):gt(0.8)})
      local o3 = attn.scaled_dot_product_attention(gen(6, 2, 200, 64), gen(7, 2, 200, 64), gen(8, 2, 200, 64))
      io.write(hex(o1), ":", hex(w1), ":", hex(o2), ":", hex(o3), "\nEND\n")
    ]]
    local one, two = C.run_with_threads(1, script), C.run_with_threads(2, script)
    assert.is_true(#one > 1000)
    assert.equal(one, two)
  end)
end)

describe("attention errors", function()
  local q, k, v = attn.ones(2, 3, 4), attn.ones(2, 5, 4), attn.ones(2, 5, 6)

  it("non-tensor q, k, v", function()
    C.fails(function() sdpa(nil, k, v) end, NAME, "#1 'q'", "expected attn.Tensor, got nil")
    C.fails(function() sdpa(q, {}, v) end, NAME, "#2 'k'", "got table")
    C.fails(function() sdpa(q, k, 3) end, NAME, "#3 'v'", "got number")
  end)

  it("wrong ranks", function()
    C.fails(function() sdpa(attn.ones(4), k, v) end, NAME, "q must have at least 2 dims", "[4]")
    C.fails(function() sdpa(q, attn.ones(4), v) end, NAME, "k must have at least 2 dims", "[4]")
    C.fails(function() sdpa(q, k, attn.ones(5)) end, NAME, "v must have at least 2 dims", "[5]")
  end)

  it("mismatched E, mismatched Lk, leading dims that do not broadcast", function()
    C.fails(function() sdpa(q, attn.ones(2, 5, 3), v) end, NAME, "q [2, 3, 4] and k [2, 5, 3]", "(4 ~= 3)")
    C.fails(function() sdpa(q, k, attn.ones(2, 4, 6)) end, NAME, "k [2, 5, 4] and v [2, 4, 6]", "(5 ~= 4)")
    C.fails(function() sdpa(attn.ones(3, 3, 4), k, v) end, NAME, "q [3, 3, 4], k [2, 5, 4] and v [2, 5, 6]",
      "do not broadcast")
  end)

  it("masks and biases that do not broadcast", function()
    C.fails(function() sdpa(q, k, v, {mask = attn.ones(4, 5)}) end, NAME, "mask [4, 5] does not broadcast",
      "[2, 3, 5]")
    C.fails(function() sdpa(q, k, v, {mask = attn.ones(3, 4)}) end, NAME, "mask [3, 4]")
    C.fails(function() sdpa(q, k, v, {mask = attn.ones(3, 3, 5)}) end, NAME, "mask [3, 3, 5]")
    C.fails(function() sdpa(q, k, v, {bias = attn.ones(2, 2, 5)}) end, NAME, "bias [2, 2, 5] does not broadcast")
  end)

  it("option types", function()
    C.fails(function() sdpa(q, k, v, {mask = {{0}}}) end, NAME, "bad option 'mask'",
      "expected attn.Tensor, got table")
    C.fails(function() sdpa(q, k, v, {bias = 1}) end, NAME, "bad option 'bias'", "got number")
    C.fails(function() sdpa(q, k, v, {is_causal = 1}) end, NAME, "bad option 'is_causal'", "expected a boolean")
    C.fails(function() sdpa(q, k, v, {need_weights = "yes"}) end, NAME, "bad option 'need_weights'")
    C.fails(function() sdpa(q, k, v, {scale = "1"}) end, NAME, "bad option 'scale'", "expected a number")
    C.fails(function() sdpa(q, k, v, {scale = 0 / 0}) end, NAME, "bad option 'scale'", "finite")
    C.fails(function() sdpa(q, k, v, 5) end, NAME, "#4 'opts'", "expected a table")
    C.fails(function() sdpa(q, k, v, q) end, NAME, "#4 'opts'")
  end)

  it("dropout_p out of range or NaN", function()
    C.fails(function() sdpa(q, k, v, {dropout_p = -0.1}) end, NAME, "bad option 'dropout_p'", "[0, 1]", "got -0.1")
    C.fails(function() sdpa(q, k, v, {dropout_p = 1.5}) end, NAME, "bad option 'dropout_p'", "[0, 1]", "got 1.5")
    C.fails(function() sdpa(q, k, v, {dropout_p = 0 / 0}) end, NAME, "bad option 'dropout_p'")
    C.fails(function() sdpa(q, k, v, {dropout_p = "0.1"}) end, NAME, "bad option 'dropout_p'", "expected a number")
  end)

  it("dropout_p draws one MKL-style mask from the generator, as torch's dropout of the weights", function()
    -- reference mask: shared/reference torch-rng vectors (seed 123, p = 0.5, 36 elements)
    local vectors = dofile("spec/fixtures/torch_rng_vectors.lua")
    local keep = vectors.seeds[123].dropout_mkl["p0.5_n36"]
    local q6, k6, v6 = attn.rand(6, 4), attn.rand(6, 4), attn.rand(6, 3)
    local _, plain = sdpa(q6, k6, v6, {need_weights = true})
    attn.manual_seed(123)
    local out, dropped = sdpa(q6, k6, v6, {dropout_p = 0.5, need_weights = true})
    local after = attn.rand(1):item()
    for i = 1, 6 do
      for j = 1, 6 do
        local want = keep[(i - 1) * 6 + j] == 1 and plain[i][j] * 2 or 0
        assert.equal(want, dropped[i][j])
      end
    end
    -- out is the dropped weights times v
    assert.is_true(out:allclose(dropped:matmul(v6), 1e-6, 1e-7))
    -- exactly one 32-bit draw was consumed
    attn.manual_seed(123)
    attn.rng_raw_u32(1)
    assert.equal(attn.rand(1):item(), after)
    -- dropout_p = 0 is plain attention and draws nothing
    assert.equal(bits(sdpa(q, k, v)), bits(sdpa(q, k, v, {dropout_p = 0})))
  end)

  it("unknown option, unknown kernel, flash kernel", function()
    C.fails(function() sdpa(q, k, v, {maks = attn.ones(3, 5)}) end, NAME, "unknown option 'maks'")
    C.fails(function() sdpa(q, k, v, {[1] = true}) end, NAME, "bad option key of type number")
    C.fails(function() sdpa(q, k, v, {kernel = "fast"}) end, NAME, "unknown kernel \"fast\"")
    C.fails(function() sdpa(q, k, v, {kernel = 2}) end, NAME, "bad option 'kernel'")
    C.fails(function() sdpa(q, k, v, {kernel = "flash", need_weights = true}) end, NAME, "\"flash\"",
      "need_weights = true")
  end)

  it("attn.simple_attention: bad input", function()
    C.fails(function() attn.simple_attention(attn.ones(4)) end, "attn.simple_attention",
      "bad argument #1 'x' (expected [n, d] or [..., n, d], got [4])")
    C.fails(function() attn.simple_attention("x") end, "attn.simple_attention", "#1 'x'", "got string")
    C.fails(function() attn.simple_attention(attn.ones(2, 2), {}) end, "attn.simple_attention", "one argument")
  end)
end)
