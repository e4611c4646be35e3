-- Random numbers bit for bit against PyTorch 1.13 (CPU): the shared vectors
-- (spec/fixtures/torch_rng_vectors.lua, converted from torch-rng-vectors.json)
-- and extra torch fixtures (spec/fixtures/torch_rng_extra.lua), plus values
-- copied from the printed notebook 002.
local attn = require "attn"

local V = dofile("spec/fixtures/torch_rng_vectors.lua")
local X = dofile("spec/fixtures/torch_rng_extra.lua")
local SEEDS = {0, 42, 123, 789, 2024}

local bits = require "support.bits"
local f32bits, flat, assert_bits, error_matching = bits.f32bits, bits.flat, bits.assert_bits, bits.error_matching

local function keep_flags(t)
  local out = {}
  for i, v in ipairs(flat(t)) do out[i] = (v ~= 0) and 1 or 0 end
  return out
end

describe("attn.manual_seed / raw draws", function()
  for _, seed in ipairs(SEEDS) do
    it("gives torch's first 8 mt19937 outputs for seed " .. seed, function()
      attn.manual_seed(seed)
      assert.are.same(V.seeds[seed].raw32, attn.rng_raw_u32(8))
    end)
    it("gives torch's 64-bit draws (high word first) for seed " .. seed, function()
      attn.manual_seed(seed)
      local r = attn.rng_raw_u32(8)
      for k = 1, 4 do
        local u64 = (r[2 * k - 1] << 32) | r[2 * k]
        assert.are.equal(V.seeds[seed].raw64_mod2p62[k], string.format("0x%016x", u64 & ((1 << 62) - 1)))
      end
    end)
  end

  it("uses the seed mod 2^32, negatives as two's complement", function()
    attn.manual_seed(123)
    local want = attn.rng_raw_u32(4)
    attn.manual_seed((1 << 40) + 123)
    assert.are.same(want, attn.rng_raw_u32(4))
    attn.manual_seed(-1)
    local neg = attn.rng_raw_u32(4)
    attn.manual_seed(0xFFFFFFFF)
    assert.are.same(neg, attn.rng_raw_u32(4))
    attn.manual_seed(123.0)
    assert.are.same(want, attn.rng_raw_u32(4))
  end)

  it("initial_seed returns the seed given (64-bit)", function()
    attn.manual_seed((1 << 40) + 123)
    assert.are.equal((1 << 40) + 123, attn.initial_seed())
    attn.manual_seed(-1)
    assert.are.equal(-1, attn.initial_seed()) -- torch: 2^64 - 1, the same 64 bits
    attn.manual_seed(42)
    assert.are.equal(42, attn.initial_seed())
  end)

  it("manual_seed returns nothing", function()
    assert.are.equal(0, select("#", attn.manual_seed(1)))
  end)

  it("rejects bad seeds and draw counts", function()
    error_matching(function() attn.manual_seed() end, "attn.manual_seed: bad argument #1 'seed' (expected integer, got no value)")
    error_matching(function() attn.manual_seed("12") end, "attn.manual_seed: bad argument #1 'seed' (expected integer, got string)")
    error_matching(function() attn.manual_seed(1.5) end, "attn.manual_seed")
    error_matching(function() attn.manual_seed(2^70) end, "attn.manual_seed")
    error_matching(function() attn.rng_raw_u32(-1) end, "attn.rng_raw_u32: bad argument #1 'n'")
    error_matching(function() attn.rng_raw_u32("x") end, "attn.rng_raw_u32")
  end)
end)

describe("attn.rand / Tensor:uniform_", function()
  for _, seed in ipairs(SEEDS) do
    it("rand(10) matches torch bit for bit, seed " .. seed, function()
      attn.manual_seed(seed)
      assert_bits(attn.rand(10), V.seeds[seed].rand10, "rand10")
    end)
    it("uniform_(-1/sqrt(3), 1/sqrt(3)) matches torch's FMA form, seed " .. seed, function()
      attn.manual_seed(seed)
      local t = attn.empty(16)
      local r = t:uniform_(-1 / math.sqrt(3), 1 / math.sqrt(3))
      assert.are.equal(t, r)
      assert_bits(t, V.seeds[seed].uniform16_sym, "uniform16_sym")
    end)
  end

  it("rand takes sizes as varargs or a table; shape does not change the stream", function()
    attn.manual_seed(0)
    local a = attn.rand(2, 5)
    assert.are.same({2, 5}, a:size())
    assert_bits(a, V.seeds[0].rand10, "rand(2, 5)")
    attn.manual_seed(0)
    local b = attn.rand({5, 2})
    assert.are.same({5, 2}, b:size())
    assert_bits(b, V.seeds[0].rand10, "rand({5, 2})")
  end)

  it("matches notebook 002: manual_seed(123) then three rand(3, 2) (SelfAttention_v1 weights)", function()
    attn.manual_seed(123)
    local wq, wk, wv = attn.rand(3, 2), attn.rand(3, 2), attn.rand(3, 2)
    assert_bits(wq, X.sa_v1_123.W_query, "W_query")
    assert_bits(wk, X.sa_v1_123.W_key, "W_key")
    assert_bits(wv, X.sa_v1_123.W_value, "W_value")
    -- printed in notebook 002 (In [10]): query = inputs @ W_query
    local inputs = attn.tensor({{0.43, 0.15, 0.89}, {0.55, 0.87, 0.66}, {0.57, 0.85, 0.64},
                                {0.22, 0.58, 0.33}, {0.77, 0.25, 0.10}, {0.05, 0.80, 0.55}})
    local printed = {{0.2309, 1.0966}, {0.4306, 1.4551}, {0.4300, 1.4343},
                     {0.2355, 0.7990}, {0.2983, 0.6565}, {0.2568, 1.0533}}
    local q = attn.matmul(inputs, wq):totable()
    for i = 1, 6 do
      for j = 1, 2 do assert.is_true(math.abs(q[i][j] - printed[i][j]) <= 6e-5, "query " .. i .. "," .. j) end
    end
  end)

  for _, name in ipairs({"uniform_t", "uniform_ab", "uniform_slice"}) do
    it("fills like torch (memory order, same draws): " .. name, function()
      local c = X.fills[name]
      attn.manual_seed(7)
      local t
      if name == "uniform_t" then t = attn.empty(4, 3):t():uniform_(-2, 3)
      elseif name == "uniform_ab" then t = attn.empty(3, 5):uniform_(-3.5, 10)
      else
        local base = attn.zeros(5, 6)
        t = base:narrow(1, 2, 3):narrow(2, 3, 3):uniform_()
        -- elements outside the slice are untouched
        assert.are.equal(0, base[1][1])
        assert.are.equal(0, base[5][6])
        assert.are.equal(0, base[2][2])
      end
      assert_bits(t, c.value, name)
      assert_bits(attn.rand(1), c.next_rand, name .. " next draw")
    end)
  end

  it("uniform_ defaults to [0, 1) like rand", function()
    attn.manual_seed(42)
    assert_bits(attn.empty(10):uniform_(), V.seeds[42].rand10, "uniform_()")
  end)

  it("rejects bad arguments", function()
    error_matching(function() attn.rand("a") end, "attn.rand")
    error_matching(function() attn.rand(-2) end, "attn.rand")
    error_matching(function() attn.empty(3):uniform_(1, 0) end,
                   "Tensor:uniform_: expects to return a [from, to) range, but found from=1.0 > to=0.0")
    error_matching(function() attn.empty(3):uniform_(0 / 0, 1) end, "Tensor:uniform_")
    error_matching(function() attn.empty(3):uniform_(-math.huge, 0) end, "Tensor:uniform_: expects to - from to be a finite float32")
    error_matching(function() attn.empty(3):uniform_("a") end, "Tensor:uniform_: bad argument #2 'from'")
    error_matching(function() attn.Tensor.uniform_({}) end, "Tensor:uniform_: bad argument #1 'self' (expected attn.Tensor, got table)")
    error_matching(function() attn.ones(3):expand(2, 3):uniform_() end, "Tensor:uniform_: unsupported operation")
  end)
end)

describe("attn.randn / Tensor:normal_", function()
  for _, seed in ipairs(SEEDS) do
    for _, n in ipairs({1, 3, 15, 16, 17, 32, 40, 100}) do
      it(("randn(%d) matches torch bit for bit, seed %d"):format(n, seed), function()
        attn.manual_seed(seed)
        assert_bits(attn.randn(n), V.seeds[seed].randn[n], "randn" .. n)
        attn.manual_seed(seed)
        assert_bits(attn.empty(n):normal_(), V.seeds[seed].randn[n], "normal_ " .. n)
      end)
    end
    it("randn1 randn1 rand1 randn1 randn2 (cached normal) matches torch, seed " .. seed, function()
      attn.manual_seed(seed)
      local vals = {}
      for _, t in ipairs({attn.randn(1), attn.randn(1), attn.rand(1), attn.randn(1), attn.randn(2)}) do
        for _, v in ipairs(flat(t)) do vals[#vals + 1] = v end
      end
      assert_bits(vals, V.seeds[seed].seq_randn1_randn1_rand1_randn1_randn2, "sequence")
    end)
  end

  it("uses numel, not shape, to pick the path (randn(4, 4) == randn(16))", function()
    attn.manual_seed(789)
    local t = attn.randn(4, 4)
    assert.are.same({4, 4}, t:size())
    assert_bits(t, V.seeds[789].randn[16], "randn(4, 4)")
  end)

  for _, name in ipairs({"normal_t20", "normal_slice", "normal_permute", "normal_mean_std_40",
                         "normal_mean_std_5", "randn_4x5", "randn_2x8x2"}) do
    it("matches torch for " .. name, function()
      local c = X.fills[name]
      attn.manual_seed(7)
      local t
      if name == "normal_t20" then t = attn.empty(5, 4):t():normal_()
      elseif name == "normal_slice" then t = attn.empty(4, 6):narrow(2, 2, 4):normal_(1.5, 2.0)
      elseif name == "normal_permute" then t = attn.empty(2, 3, 4):permute(3, 1, 2):normal_()
      elseif name == "normal_mean_std_40" then t = attn.empty(40):normal_(0.5, 3.0)
      elseif name == "normal_mean_std_5" then t = attn.empty(5):normal_(-1.0, 0.25)
      elseif name == "randn_4x5" then t = attn.randn(4, 5)
      else t = attn.randn({2, 8, 2}) end
      assert_bits(t, c.value, name)
      assert_bits(attn.rand(1), c.next_rand, name .. " next draw")
    end)
  end

  it("rejects bad arguments", function()
    error_matching(function() attn.randn(2, "x") end, "attn.randn")
    error_matching(function() attn.randn(-1) end, "attn.randn")
    error_matching(function() attn.empty(3):normal_(0, -1) end, "Tensor:normal_: bad argument #3 'std' (expected std >= 0, got -1")
    error_matching(function() attn.empty(3):normal_(0, 0 / 0) end, "Tensor:normal_: bad argument #3 'std'")
    error_matching(function() attn.empty(3):normal_({}) end, "Tensor:normal_: bad argument #2 'mean'")
    error_matching(function() attn.Tensor.normal_(5) end, "Tensor:normal_: bad argument #1 'self' (expected attn.Tensor, got number)")
    error_matching(function() attn.zeros(1, 4):expand(3, 4):normal_() end, "Tensor:normal_: unsupported operation")
  end)
end)

describe("long streams (catch rare last-bit FMA/rounding slips)", function()
  local function checksum(t)
    local acc = 0
    for i, v in ipairs(flat(t)) do acc = acc + i * f32bits(v) end -- wraps mod 2^64 like the generator
    return acc
  end
  it("randn(200003), uniform_(-0.3, 0.7) x 200000, normal_(-2, 0.5) x 100000 match torch's checksums", function()
    attn.manual_seed(11)
    assert.are.equal(X.stress.randn_200003, checksum(attn.randn(200003)))
    attn.manual_seed(11)
    assert.are.equal(X.stress.uniform_200000, checksum(attn.empty(200000):uniform_(-0.3, 0.7)))
    attn.manual_seed(11)
    assert.are.equal(X.stress.normal_100000, checksum(attn.empty(100000):normal_(-2.0, 0.5)))
  end)
end)

describe("attn.get_rng_state / attn.set_rng_state", function()
  it("restores the stream mid-way", function()
    attn.manual_seed(42)
    attn.rand(7)
    local st = attn.get_rng_state()
    assert.is_string(st)
    local a = flat(attn.rand(700)) -- crosses a twist of the 624-word block
    attn.rand(3)
    attn.set_rng_state(st)
    local b = flat(attn.rand(700))
    assert.are.same(a, b)
  end)

  it("saves and restores a pending cached normal", function()
    attn.manual_seed(123)
    attn.randn(1) -- leaves sin cached
    local st = attn.get_rng_state()
    local cached = flat(attn.randn(1))
    attn.manual_seed(5)
    attn.set_rng_state(st)
    assert_bits(attn.randn(1), {f32bits(cached[1])}, "cached normal after restore")
    assert_bits(cached, {V.seeds[123].randn[3][2]}, "the cached value is torch's second normal")
  end)

  it("restores the initial seed", function()
    attn.manual_seed(99)
    local st = attn.get_rng_state()
    attn.manual_seed(1)
    attn.set_rng_state(st)
    assert.are.equal(99, attn.initial_seed())
  end)

  it("manual_seed clears the cached normal", function()
    attn.manual_seed(0)
    attn.randn(1)
    attn.manual_seed(0)
    assert_bits(attn.randn(1), V.seeds[0].randn[1], "randn(1) after reseed")
  end)

  it("rand and the 16-lane path leave the cache alone", function()
    attn.manual_seed(2024)
    attn.randn(1)
    attn.randn(16)
    attn.rand(3)
    assert_bits(attn.randn(1), {V.seeds[2024].randn[3][2]}, "cached after rand/randn16")
  end)

  it("rejects states that are not from get_rng_state", function()
    local st = attn.get_rng_state()
    error_matching(function() attn.set_rng_state() end, "attn.set_rng_state: bad argument #1 'state' (expected a string from attn.get_rng_state, got no value)")
    error_matching(function() attn.set_rng_state(12) end, "attn.set_rng_state: bad argument #1 'state' (expected a string from attn.get_rng_state, got number)")
    error_matching(function() attn.set_rng_state(st:sub(2)) end,
                   ("attn.set_rng_state: expected a state of %d bytes (from get_rng_state), got %d bytes"):format(#st, #st - 1))
    error_matching(function() attn.set_rng_state("X" .. st:sub(2)) end, "attn.set_rng_state: not a state from get_rng_state")
    -- index word out of range
    local off = 4 + 4 * 624
    local bad = st:sub(1, off) .. string.pack("<I4", 625) .. st:sub(off + 5)
    error_matching(function() attn.set_rng_state(bad) end, "attn.set_rng_state: corrupt state: index 625")
    local badflag = st:sub(1, off + 12) .. string.pack("<I4", 7) .. st:sub(off + 17)
    error_matching(function() attn.set_rng_state(badflag) end, "attn.set_rng_state: corrupt state: cached-normal flag 7")
    -- a failed set leaves the generator as it was
    attn.set_rng_state(st)
    local a = flat(attn.rand(3))
    attn.set_rng_state(st)
    pcall(attn.set_rng_state, bad)
    assert.are.same(a, flat(attn.rand(3)))
  end)
end)

describe("attn.dropout", function()
  for _, seed in ipairs(SEEDS) do
    for _, key in ipairs({"p0.5_n36", "p0.5_n50", "p0.1_n36", "p0.1_n50"}) do
      it(("MKL-style mask %s matches, seed %d"):format(key, seed), function()
        local p, n = key:match("^p([%d.]+)_n(%d+)$")
        p, n = tonumber(p), tonumber(n)
        attn.manual_seed(seed)
        local y = attn.dropout(attn.ones(n), p)
        assert.are.same(V.seeds[seed].dropout_mkl[key], keep_flags(y))
        -- exactly one draw: the next raw draw is the second output of the seed
        assert.are.equal(V.seeds[seed].raw32[2], attn.rng_raw_u32(1)[1])
      end)
    end
  end

  it("keeps element i by x_i of the MCG31m1 stream also for long (blocked, parallel) calls", function()
    local c = X.dropout_mkl_100000
    attn.manual_seed(c.seed)
    local y = flat(attn.dropout(attn.ones(100000), c.p))
    local acc, kept = 0, 0
    for i, v in ipairs(y) do
      if v ~= 0 then acc, kept = acc + i, kept + 1 end
    end
    assert.are.equal(c.kept, kept)
    assert.are.equal(c.checksum, acc)
  end)

  it("reproduces notebook 002's Dropout(0.5) on ones(6, 6) after manual_seed(123)", function()
    local ref = V.printed_reference_dropout
    attn.manual_seed(ref.seed)
    local y = attn.dropout(attn.ones(6, 6), ref.p)
    assert.are.same(ref.rows, y:totable())
    -- the mask is in logical row-major order, also for a non-contiguous input
    attn.manual_seed(ref.seed)
    assert.are.same(ref.rows, attn.dropout(attn.ones(6, 6):t(), ref.p):totable())
  end)

  it("reproduces notebook 002's dropout(attn_weights) print", function()
    -- attn_weights as printed (In [21]) and dropout of them after manual_seed(123) (In [23])
    local w = attn.tensor({{1.0000, 0, 0, 0, 0, 0}, {0.5517, 0.4483, 0, 0, 0, 0}, {0.3800, 0.3097, 0.3103, 0, 0, 0},
                           {0.2758, 0.2460, 0.2462, 0.2319, 0, 0}, {0.2175, 0.1983, 0.1984, 0.1888, 0.1971, 0},
                           {0.1935, 0.1663, 0.1666, 0.1542, 0.1666, 0.1529}})
    local printed = {{2.0000, 0, 0, 0, 0, 0}, {0, 0.8966, 0, 0, 0, 0}, {0, 0, 0.6206, 0, 0, 0},
                     {0.5517, 0.4921, 0, 0, 0, 0}, {0.4350, 0, 0, 0, 0, 0}, {0, 0.3327, 0, 0, 0, 0}}
    attn.manual_seed(123)
    local y = attn.dropout(w, 0.5):totable()
    for i = 1, 6 do
      for j = 1, 6 do
        assert.is_true(math.abs(y[i][j] - printed[i][j]) <= 2e-4, ("(%d, %d): %g vs %g"):format(i, j, y[i][j], printed[i][j]))
      end
    end
  end)

  it("scales kept values by fl(1 / fl(1 - p)) as torch", function()
    for _, c in ipairs(X.dropout_scale) do
      attn.manual_seed(0)
      local y = flat(attn.dropout(attn.ones(200), c.p))
      local kept = 0
      for _, v in ipairs(y) do
        if v ~= 0 then
          kept = kept + 1
          assert.are.equal(c.scale[1], f32bits(v))
        end
      end
      assert.is_true(kept > 0)
    end
  end)

  it("multiplies in float32 and gives -0.0 for dropped negative inputs", function()
    attn.manual_seed(123)
    local y = flat(attn.dropout(attn.full({36}, -1.5), 0.5))
    local flags = V.seeds[123].dropout_mkl["p0.5_n36"]
    for i, v in ipairs(y) do
      if flags[i] == 1 then assert.are.equal(0xC0400000, f32bits(v)) -- -3.0
      else assert.are.equal(0x80000000, f32bits(v)) end                  -- -0.0
    end
  end)

  it("returns the input itself without draws in eval mode, for p = 0 and for empty tensors", function()
    local x = attn.rand(4)
    attn.manual_seed(42)
    assert.are.equal(x, attn.dropout(x, 0.5, false))
    assert.are.equal(x, attn.dropout(x, 0))
    assert.are.equal(x, attn.dropout(x, 0, true))
    local e = attn.empty(0)
    assert.are.equal(e, attn.dropout(e, 0.5))
    assert_bits(attn.rand(10), V.seeds[42].rand10, "no draws consumed")
  end)

  it("p = 1 gives x * 0 (zeros, -0.0 for negatives) without draws", function()
    local x = attn.tensor({-2, 3, 0.5})
    attn.manual_seed(42)
    local y = attn.dropout(x, 1)
    assert.are_not.equal(x, y)
    assert.are.same({0x80000000, 0, 0}, {f32bits(y[1]), f32bits(y[2]), f32bits(y[3])})
    assert_bits(attn.rand(10), V.seeds[42].rand10, "no draws consumed")
  end)

  it("does not touch the cached normal", function()
    attn.manual_seed(0)
    attn.randn(1)
    attn.dropout(attn.ones(5), 0.3)
    assert_bits(attn.randn(1), {V.seeds[0].randn[3][2]}, "cached normal")
  end)

  it("rejects bad arguments", function()
    error_matching(function() attn.dropout(attn.ones(2), 1.5) end, "attn.dropout: dropout probability has to be between 0 and 1, but got 1.5")
    error_matching(function() attn.dropout(attn.ones(2), -0.1) end, "attn.dropout: dropout probability has to be between 0 and 1, but got -0.1")
    error_matching(function() attn.dropout(attn.ones(2), 0 / 0) end, "attn.dropout: dropout probability has to be between 0 and 1")
    error_matching(function() attn.dropout(attn.ones(2)) end, "attn.dropout: bad argument #2 'p'")
    error_matching(function() attn.dropout({}, 0.5) end, "attn.dropout: bad argument #1 'input' (expected attn.Tensor, got table)")
    error_matching(function() attn.dropout(attn.ones(2), 0.5, "yes") end, "attn.dropout: bad argument #3 'training' (expected boolean, got string)")
  end)
end)
