-- attn.randperm, attn.randint and attn.multinomial draw for draw as PyTorch
-- 1.13 on CPU (spec/fixtures/sampling_cases.lua, written by
-- scripts/fixtures/make_sampling_fixtures.py from torch itself): the same
-- values (1-based where torch gives 0-based indices) and the same stream
-- position after the call (the torch.rand(2) that followed). Then bad input.
local attn = require "attn"

local S = dofile("spec/fixtures/sampling_cases.lua")

local bits = require "support.bits"
local f32bits, flat, error_matching = bits.f32bits, bits.flat, bits.error_matching

-- torch's 0-based values + shift, as a plain list
local function shifted(values, shift)
  local out = {}
  for i, v in ipairs(values) do out[i] = v + shift end
  return out
end

local function assert_after(want, what)
  local got = flat(attn.rand(2))
  for i = 1, 2 do
    assert.are.equal(string.format("0x%08x", want[i]), string.format("0x%08x", f32bits(got[i])),
      what .. ": rand() after the call (the stream position)")
  end
end

describe("attn.randperm", function()
  for _, c in ipairs(S.randperm) do
    it(("is torch.randperm(%d) + 1 after manual_seed(%d)"):format(c.n, c.seed), function()
      attn.manual_seed(c.seed)
      local p = attn.randperm(c.n)
      assert.are.same({ c.n }, p:size())
      assert.are.same(shifted(c.value, 1), flat(p))
      assert_after(c.after, "randperm")
    end)
  end

  it("is a permutation of 1..n for a large n (every value once)", function()
    attn.manual_seed(3)
    local n = 100000
    local seen, count = {}, 0
    for _, v in ipairs(flat(attn.randperm(n))) do
      assert.is_true(v >= 1 and v <= n and v == math.floor(v) and not seen[v])
      seen[v] = true
      count = count + 1
    end
    assert.are.equal(n, count)
  end)
end)

describe("attn.randint", function()
  for _, c in ipairs(S.randint) do
    local form = c.low and ("randint(%d, %d, {%s})"):format(c.low, c.high, table.concat(c.size, ", "))
      or ("randint(%d, {%s})"):format(c.high, table.concat(c.size, ", "))
    it(("is torch.%s after manual_seed(%d)"):format(form, c.seed), function()
      attn.manual_seed(c.seed)
      local t = c.low and attn.randint(c.low, c.high, c.size) or attn.randint(c.high, c.size)
      assert.are.same(c.size, t:size())
      assert.are.same(c.value, flat(t))
      assert_after(c.after, form)
    end)
  end
end)

describe("attn.multinomial", function()
  for _, c in ipairs(S.multinomial) do
    local name = ("multinomial(probs %s, %d, %s) after manual_seed(%d)"):format(
      table.concat(c.shape, "x"), c.n, tostring(c.replacement), c.seed)
    it("is torch." .. name .. " + 1", function()
      local probs = attn.tensor(c.probs):view(c.shape)
      attn.manual_seed(c.seed)
      local got = attn.multinomial(probs, c.n, c.replacement)
      local want_shape = #c.shape == 1 and { c.n } or { c.shape[1], c.n }
      assert.are.same(want_shape, got:size())
      assert.are.same(shifted(c.value, 1), flat(got))
      assert_after(c.after, name)
    end)
  end

  it("reads non-contiguous probabilities logically", function()
    local c = S.multinomial[11] -- 4 rows of 6, two samples without replacement
    assert.are.same({ 4, 6 }, c.shape)
    local stored = attn.zeros(6, 4)
    stored:copy_(attn.tensor(c.probs):view(4, 6):t())
    local probs = stored:t() -- [4, 6], the fixture's values, not contiguous
    assert.is_false(probs:is_contiguous())
    attn.manual_seed(c.seed)
    assert.are.same(shifted(c.value, 1), flat(attn.multinomial(probs, c.n, false)))
  end)

  it("without replacement never repeats a category in a row", function()
    attn.manual_seed(11)
    local probs = attn.rand(20, 30)
    for _, row in ipairs(attn.multinomial(probs, 30):totable()) do
      local seen = {}
      for _, v in ipairs(row) do
        assert.is_nil(seen[v])
        seen[v] = true
      end
    end
  end)

  it("with replacement follows the probabilities (a chi-square bound over 20000 draws)", function()
    attn.manual_seed(12)
    local p = { 0.1, 0.2, 0.3, 0.4 }
    local counts = { 0, 0, 0, 0 }
    for _, v in ipairs(flat(attn.multinomial(attn.tensor(p), 20000, true))) do counts[v] = counts[v] + 1 end
    local chi2 = 0
    for i = 1, 4 do
      local e = 20000 * p[i]
      chi2 = chi2 + (counts[i] - e) ^ 2 / e
    end
    assert.is_true(chi2 < 16.27, "chi-square " .. chi2) -- 3 degrees of freedom, p = 0.001
  end)
end)

describe("sampling: bad input", function()
  local F = "attn.multinomial: "
  it("multinomial refuses probabilities that are negative, NaN, infinite or all zero", function()
    error_matching(function() attn.multinomial(attn.tensor { 0.5, -0.1 }, 1) end,
      F .. "bad argument #1 'probs' (expected finite probabilities >= 0, got -0.1 at row 1, column 2)")
    error_matching(function() attn.multinomial(attn.tensor { { 1, 1 }, { 0.5, 0 / 0 } }, 1, true) end,
      F .. "bad argument #1 'probs' (expected finite probabilities >= 0, got nan at row 2, column 2)")
    error_matching(function() attn.multinomial(attn.tensor { 1, math.huge }, 1) end,
      F .. "bad argument #1 'probs' (expected finite probabilities >= 0, got inf at row 1, column 2)")
    error_matching(function() attn.multinomial(attn.tensor { { 1, 2 }, { 0, 0 } }, 1, true) end,
      F .. "bad argument #1 'probs' (expected a positive probability in every row, got only zeros in row 2)")
    error_matching(function() attn.multinomial(attn.tensor { 3e38, 3e38 }, 1, true) end,
      F .. "bad argument #1 'probs' (expected rows whose sum is finite in float32, got infinity in row 1")
  end)

  it("multinomial refuses more samples than categories (or nonzero ones) without replacement", function()
    error_matching(function() attn.multinomial(attn.tensor { 1, 1 }, 3) end,
      F .. "bad argument #2 'n' (cannot draw 3 samples without replacement from 2 categories)")
    error_matching(function() attn.multinomial(attn.tensor { { 1, 1, 1 }, { 1, 0, 0 } }, 2) end,
      F .. "bad argument #1 'probs' (expected at least n = 2 nonzero probabilities per row to draw without "
        .. "replacement, got 1 in row 2)")
    error_matching(function() attn.multinomial(attn.tensor { 1, 1 }, 0) end,
      F .. "bad argument #2 'n' (expected a number of samples >= 1, got 0)")
  end)

  it("multinomial checks its arguments' types and shapes", function()
    error_matching(function() attn.multinomial({ 0.5, 0.5 }, 1) end,
      F .. "bad argument #1 'probs' (expected attn.Tensor, got table)")
    error_matching(function() attn.multinomial(attn.ones(2, 2, 2), 1) end,
      F .. "bad argument #1 'probs' (expected a 1-D or 2-D tensor, got shape [2, 2, 2])")
    error_matching(function() attn.multinomial(attn.tensor(1), 1) end,
      F .. "bad argument #1 'probs' (expected a 1-D or 2-D tensor, got shape []")
    error_matching(function() attn.multinomial(attn.ones(3, 0), 1) end,
      F .. "bad argument #1 'probs' (expected 1 to 2^24 categories in the last dim, got shape [3, 0])")
    error_matching(function() attn.multinomial(attn.ones(2), 1.5) end, F .. "bad argument #2 'n'")
    error_matching(function() attn.multinomial(attn.ones(2), 1, "yes") end, F .. "bad argument #3 'replacement'")
    error_matching(function() attn.multinomial(attn.ones(2), 1, true, 4) end, F .. "bad argument #4")
  end)

  it("a refused call draws nothing", function()
    attn.manual_seed(5)
    pcall(attn.multinomial, attn.tensor { 1, -1 }, 1)
    pcall(attn.randint, 4, 2, { 3 })
    local after = attn.rand(1):item()
    attn.manual_seed(5)
    assert.are.equal(attn.rand(1):item(), after)
  end)

  it("randint refuses low >= high, non-integers, bounds past 2^24 and bad sizes", function()
    local R = "attn.randint: "
    error_matching(function() attn.randint(3, 3, { 2 }) end,
      R .. "bad argument #2 'high' (expected low < high, got low = 3, high = 3)")
    error_matching(function() attn.randint(0, { 2 }) end,
      R .. "bad argument #1 'high' (expected low < high, got low = 0, high = 0)")
    error_matching(function() attn.randint(-5, { 2 }) end, R .. "bad argument #1 'high' (expected low < high")
    error_matching(function() attn.randint(0, 2 ^ 25, { 1 }) end,
      R .. "bad argument #2 'high' (expected an integer within +-2^24 = 16777216, got 33554432)")
    error_matching(function() attn.randint(-2 ^ 24 - 1, 0, { 1 }) end, R .. "bad argument #1 'low'")
    error_matching(function() attn.randint(0.5, 2, { 1 }) end, R .. "bad argument #1 'low'")
    error_matching(function() attn.randint(0, 10) end,
      R .. "bad argument #3 'size' (expected a table of sizes such as {2, 3}, got no value)")
    error_matching(function() attn.randint(0, 10, 3) end,
      R .. "bad argument #3 'size' (expected a table of sizes such as {2, 3}, got number)")
    error_matching(function() attn.randint(10, { 2 }, 5) end, R .. "bad argument #3")
    error_matching(function() attn.randint(0, 10, { -1 }) end, R)
    error_matching(function() attn.randint(0, 10, { 2 }, 1) end, R .. "bad argument #4")
  end)

  it("randperm refuses negative, fractional and too large n", function()
    local P = "attn.randperm: "
    error_matching(function() attn.randperm(-1) end,
      P .. "bad argument #1 'n' (expected 0 <= n <= 2^24 = 16777216, got -1)")
    error_matching(function() attn.randperm(2 ^ 24 + 1) end, P .. "bad argument #1 'n'")
    error_matching(function() attn.randperm(2.5) end, P .. "bad argument #1 'n'")
    error_matching(function() attn.randperm("3") end, P .. "bad argument #1 'n'")
    error_matching(function() attn.randperm(3, 4) end, P .. "bad argument #2")
  end)
end)
