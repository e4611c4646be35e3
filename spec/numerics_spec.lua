-- Edge-case numerics of attention, for both kernels ("math" and "flash"):
-- large scores, -1e9 fills against boolean masks, fully hidden rows, NaN in
-- queries, hidden keys and hidden values, empty sequences (kernels and every
-- module), denormals, E = 1. Expected values: PyTorch 1.13 fixtures
-- (spec/fixtures/numerics_cases.lua, scripts/fixtures/make_numerics_fixtures.py)
-- and a double-precision reference written here in plain Lua. The behaviour
-- is documented in docs/guarantees.md.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local CASES = dofile("spec/fixtures/numerics_cases.lua")

local sdpa = attn.scaled_dot_product_attention
local KERNELS = {"math", "flash"}

local function case(name)
  for _, c in ipairs(CASES) do if c.name == name then return c end end
  error("no fixture case " .. name)
end

-- Values in [-1, 1) from a Lua LCG (not attn's RNG), as a flat list.
local function lcg(seed, n, lo, hi)
  local d = C.lcg(seed, n)
  if lo then
    for i = 1, n do d[i] = lo + math.floor((d[i] + 1) / 2 * (hi - lo + 1)) end -- integers in [lo, hi]
  end
  return d
end

local function T(data, ...) return attn.tensor(data):view({...}) end

--- Double-precision attention over flat row-major lists: q [lq, e], k [lk, e],
-- v [lk, ev]; hidden(i, j) (1-based) hides key j from query i; a row with
-- every key hidden gives zeros (attn's rule).
local function reference(q, k, v, lq, lk, e, ev, scale, hidden)
  local out = {}
  for i = 1, lq do
    local s, mx = {}, -math.huge
    for j = 1, lk do
      if not hidden(i, j) then
        local acc = 0
        for d = 1, e do acc = acc + q[(i - 1) * e + d] * k[(j - 1) * e + d] end
        s[j] = acc * scale
        if s[j] > mx then mx = s[j] end
      end
    end
    local sum = 0
    for j = 1, lk do if s[j] then s[j] = math.exp(s[j] - mx); sum = sum + s[j] end end
    for d = 1, ev do
      local acc = 0
      for j = 1, lk do if s[j] then acc = acc + s[j] / sum * v[(j - 1) * ev + d] end end
      out[(i - 1) * ev + d] = mx == -math.huge and 0 or acc
    end
  end
  return {shape = {lq, ev}, data = out}
end

local function causal(i, j) return j > i end
local function none() return false end

local bits = C.bits

describe("numerics: large scores", function()
  -- integer q, k: every score (up to 3 * 60 * 60 = 10800) is exact in float32
  local lq, lk, e, ev = 70, 300, 3, 2
  local qd, kd, vd = lcg(1, lq * e, -60, 60), lcg(2, lk * e, -60, 60), lcg(3, lk * ev)
  local q, k, v = T(qd, lq, e), T(kd, lk, e), T(vd, lk, ev)

  for _, kernel in ipairs(KERNELS) do
    it(kernel .. ": scores around 1e4 stay finite and match the double reference (max subtracted)", function()
      for _, is_causal in ipairs({false, true}) do
        local out = sdpa(q, k, v, {scale = 1, is_causal = is_causal, kernel = kernel})
        for _, x in ipairs(C.flat(out)) do assert(x == x and math.abs(x) < 2, "not finite: " .. x) end
        C.close(out, reference(qd, kd, vd, lq, lk, e, ev, 1, is_causal and causal or none), 1e-5, 1e-6, kernel)
      end
    end)
  end

  it("both kernels match PyTorch on scores around 1e4", function()
    local c = case("large_scores")
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {kernel = kernel}), c.sdpa, 1e-6, 1e-6, kernel)
    end
  end)
end)

describe("numerics: masks", function()
  local lq, lk, e, ev = 70, 300, 8, 5
  local qd, kd, vd = lcg(11, lq * e), lcg(12, lk * e), lcg(13, lk * ev)
  local q, k, v = T(qd, lq, e), T(kd, lk, e), T(vd, lk, ev)
  -- about 30% hidden, never a whole row
  local md = lcg(14, lq * lk)
  for i = 1, lq do md[(i - 1) * lk + 1] = 0 end
  for n = 1, #md do if md[n] > 0.4 then md[n] = 1 else md[n] = 0 end end
  local mask = T(md, lq, lk)
  local function hidden(i, j) return md[(i - 1) * lk + j] ~= 0 end

  it("a -1e9 fill (masked_fill then softmax) and a boolean mask (-inf) agree on partly hidden rows", function()
    local scores = q:matmul(k:t()) / math.sqrt(e)
    local notebook = scores:masked_fill(mask:bool(), -1e9):softmax(-1):matmul(v)
    local want = reference(qd, kd, vd, lq, lk, e, ev, 1 / math.sqrt(e), hidden)
    C.close(notebook, want, 1e-5, 2e-6, "notebook -1e9")
    for _, kernel in ipairs(KERNELS) do
      local out = sdpa(q, k, v, {mask = mask:bool(), kernel = kernel})
      C.close(out, want, 1e-5, 2e-6, kernel)
      C.close(out, {shape = {lq, ev}, data = C.flat(notebook)}, 1e-5, 2e-6, kernel .. " vs -1e9 fill")
    end
  end)

  it("a fully hidden row gives zeros in both kernels (PyTorch: NaN with -inf, the mean of v with -1e9)", function()
    local c = case("fully_hidden_row")
    for _, kernel in ipairs(KERNELS) do
      local out = sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel})
      local want = C.flat(C.T(c.notebook_inf))
      want[3], want[4] = 0, 0 -- row 2: zeros where torch gives NaN
      C.close(out, {shape = c.notebook_inf.shape, data = want}, 1e-6, 1e-6, kernel)
    end
    -- the same across tiles: rows 5 and 66 hide every one of 300 keys
    local m2 = mask:clone()
    m2[5]:fill_(1)
    m2[66]:fill_(1)
    local want = reference(qd, kd, vd, lq, lk, e, ev, 1 / math.sqrt(e),
      function(i, j) return i == 5 or i == 66 or hidden(i, j) end)
    for _, kernel in ipairs(KERNELS) do
      local out = sdpa(q, k, v, {mask = m2, kernel = kernel})
      C.close(out, want, 1e-5, 2e-6, kernel)
      for _, x in ipairs(C.flat(out[66])) do assert.equal(0, x) end
    end
  end)
end)

describe("numerics: NaN", function()
  it("NaN in a query row only affects that row (PyTorch fixture)", function()
    local c = case("nan_query_row")
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel}), c.sdpa, 1e-6, 1e-6, kernel)
    end
  end)

  it("NaN in a query row only affects that row, bit for bit, across tiles", function()
    local lq, lk, e, ev = 70, 300, 8, 5
    local qd = lcg(21, lq * e)
    local q, k, v = T(qd, lq, e), T(lcg(22, lk * e), lk, e), T(lcg(23, lk * ev), lk, ev)
    local qn = q:clone()
    qn[66][3] = 0 / 0
    for _, kernel in ipairs(KERNELS) do
      for _, is_causal in ipairs({false, true}) do
        local clean, dirty = bits(sdpa(q, k, v, {kernel = kernel, is_causal = is_causal})),
          C.flat(sdpa(qn, k, v, {kernel = kernel, is_causal = is_causal}))
        local dirty_bits = bits(T(dirty, lq, ev))
        for n = 1, lq * ev do
          local row = (n - 1) // ev + 1
          if row == 66 then assert(dirty[n] ~= dirty[n], kernel .. ": row 66 not NaN")
          else assert.equal(clean[n], dirty_bits[n], kernel .. ": element " .. n .. " changed") end
        end
      end
    end
  end)

  it("NaN in a hidden key is hidden, as in the notebooks' masked_fill (PyTorch 1.13's SDPA gives NaN)", function()
    local c = case("nan_hidden_key")
    local kclean = C.T(c.k):clone()
    kclean[3][2] = 0
    for _, kernel in ipairs(KERNELS) do
      local out = sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel})
      C.close(out, c.notebook_inf, 1e-6, 1e-6, kernel)
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {is_causal = true, kernel = kernel}), c.notebook_inf, 1e-6, 1e-6,
        kernel .. " causal")
      -- rows 1 and 2 are exactly what they are with a finite hidden key
      local clean = bits(sdpa(C.T(c.q), kclean, C.T(c.v), {mask = C.T(c.mask), kernel = kernel}))
      local got = bits(out)
      for n = 1, 4 do assert.equal(clean[n], got[n]) end
    end
  end)

  it("NaN in a hidden value reaches the rows that weigh it by 0 (0 * NaN), as in PyTorch", function()
    local c = case("nan_hidden_value")
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel}), c.sdpa, 1e-6, 1e-6, kernel)
    end
  end)

  it("a NaN value across tiles: rows that see it are NaN; math (as PyTorch) makes its column NaN everywhere", function()
    local n, e = 300, 4
    local q, k = T(lcg(31, n * e), n, e), T(lcg(32, n * e), n, e)
    local v = T(lcg(33, n * 2), n, 2)
    v[280][1] = 0 / 0
    local math_out = C.flat(sdpa(q, k, v, {is_causal = true, kernel = "math"}))
    local flash_out = C.flat(sdpa(q, k, v, {is_causal = true, kernel = "flash"}))
    for i = 1, n do
      local a, b = math_out[(i - 1) * 2 + 1], flash_out[(i - 1) * 2 + 1]
      assert(a ~= a, "math row " .. i)
      if i >= 280 then assert(b ~= b, "flash row " .. i) end
      -- the other column is finite everywhere
      assert(math_out[i * 2] == math_out[i * 2] and flash_out[i * 2] == flash_out[i * 2])
    end
    -- the flash kernel never visits the key blocks above the diagonal: row 1 stays finite
    assert(flash_out[1] == flash_out[1])
  end)
end)

describe("numerics: empty sequences", function()
  local function shape(t) return t:size() end
  for _, kernel in ipairs(KERNELS) do
    it(kernel .. ": Lq = 0, Lk = 0 and both give well-shaped results (Lk = 0: zeros)", function()
      for _, is_causal in ipairs({false, true}) do
        local o = {kernel = kernel, is_causal = is_causal}
        assert.same({2, 0, 5}, shape(sdpa(attn.ones(2, 0, 3), attn.ones(2, 4, 3), attn.ones(2, 4, 5), o)))
        local z = sdpa(attn.ones(2, 3, 3), attn.ones(2, 0, 3), attn.ones(2, 0, 5), o)
        C.is(z, {2, 3, 5}, C.flat(attn.zeros(2, 3, 5)))
        assert.same({2, 0, 5}, shape(sdpa(attn.ones(2, 0, 3), attn.ones(2, 0, 3), attn.ones(2, 0, 5), o)))
        assert.same({0, 3, 5}, shape(sdpa(attn.ones(0, 3, 3), attn.ones(0, 4, 3), attn.ones(0, 4, 5), o)))
        o.mask = attn.zeros(0, 4):bool()
        assert.same({0, 5}, shape(sdpa(attn.ones(0, 3), attn.ones(4, 3), attn.ones(4, 5), o)))
      end
    end)
  end

  it("every module's forward on an empty sequence", function()
    attn.manual_seed(3)
    local x = attn.ones(2, 0, 4)
    assert.same({2, 0, 3}, shape(nn.SelfAttentionV1(4, 3)(x)))
    assert.same({2, 0, 3}, shape(nn.SelfAttentionV2(4, 3)(x)))
    assert.same({0, 3}, shape(nn.SelfAttentionV2(4, 3)(attn.ones(0, 4))))
    assert.same({2, 0, 3}, shape(nn.CausalAttention(4, 3, 6, 0.0)(x)))
    assert.same({2, 0, 6}, shape(nn.MultiHeadAttentionWrapper(4, 3, 6, 0.0, 2)(x)))
    assert.same({2, 0, 4}, shape(nn.MultiHeadAttention(4, 4, 6, 0.0, 2)(x)))
    assert.same({0, 0, 4}, shape(nn.MultiHeadAttention(4, 4, 6, 0.0, 2)(attn.ones(0, 0, 4))))
    local train = nn.MultiHeadAttention(4, 4, 6, 0.5, 2):train()
    assert.same({2, 0, 4}, shape(train(x)))
    local cross = nn.Attention(4)
    assert.same({0, 4}, shape(cross(attn.ones(0, 4), attn.ones(3, 4), attn.ones(3, 4))))
    -- no keys: the weights are [2, 0] and the product of nothing is 0
    C.is(cross(attn.ones(2, 4), attn.ones(0, 4), attn.ones(0, 4)), {2, 4}, C.flat(attn.zeros(2, 4)))
  end)
end)

describe("numerics: denormals and E = 1", function()
  it("denormal inputs: scores underflow to 0, the output is the (denormal) mean of the visible values", function()
    local c = case("denormal")
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel}), c.sdpa, 1e-5, 3e-45, kernel)
    end
    -- across tiles, against the double reference (which sees the same float32 inputs)
    local lq, lk = 70, 300
    local qd, kd, vd = lcg(41, lq * 2), lcg(42, lk * 2), lcg(43, lk * 2)
    for i = 1, #vd do vd[i] = (string.unpack("f", string.pack("f", vd[i] * 1e-39))) end
    local want = reference(qd, kd, vd, lq, lk, 2, 2, 1 / math.sqrt(2), causal)
    for _, kernel in ipairs(KERNELS) do
      local out = sdpa(T(qd, lq, 2), T(kd, lk, 2), T(vd, lk, 2), {is_causal = true, kernel = kernel})
      C.close(out, want, 1e-4, 1e-44, kernel)
    end
  end)

  it("E = 1 (PyTorch fixture and the double reference across tiles)", function()
    local c = case("e1")
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(C.T(c.q), C.T(c.k), C.T(c.v), {mask = C.T(c.mask), kernel = kernel}), c.sdpa, 1e-6, 1e-6, kernel)
    end
    local lq, lk = 70, 300
    local qd, kd, vd = lcg(51, lq), lcg(52, lk), lcg(53, lk)
    local want = reference(qd, kd, vd, lq, lk, 1, 1, 1, causal)
    for _, kernel in ipairs(KERNELS) do
      C.close(sdpa(T(qd, lq, 1), T(kd, lk, 1), T(vd, lk, 1), {is_causal = true, kernel = kernel}), want, 1e-5, 2e-6,
        kernel)
    end
  end)
end)
