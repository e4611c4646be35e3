-- attn.set_dropout_stream("default"): dropout draws its mask as PyTorch builds
-- without MKL do (the installed Debian torch: a 53-bit uniform per element,
-- kept iff below 1 - p), bit for bit against spec/fixtures/sampling_cases.lua
-- (scripts/fixtures/make_sampling_fixtures.py), for every dropout consumer:
-- attn.dropout, nn.Dropout, scaled_dot_product_attention's dropout_p in both
-- kernels and the fused module forwards. "mkl" stays the default
-- (spec/rng_spec.lua checks that stream).
local attn = require "attn"
local nn = attn.nn

local S = dofile("spec/fixtures/sampling_cases.lua")

local bits = require "support.bits"
local f32bits, fl, flat, hex_list, error_matching = bits.f32bits, bits.fl, bits.flat, bits.hex_list, bits.error_matching

local function hex_want(bits)
  local out = {}
  for i, b in ipairs(bits) do out[i] = string.format("0x%08x", b) end
  return out
end

local function assert_after(want, what)
  assert.are.same(hex_want(want), hex_list(flat(attn.rand(2))), what .. ": rand(2) after the call")
end

-- "0110..." of a tensor: 1 where nonzero
local function flag_string(t)
  local out = {}
  for i, v in ipairs(flat(t)) do out[i] = v ~= 0 and "1" or "0" end
  return table.concat(out)
end

local function with_stream(name, fn)
  local before = attn.get_dropout_stream()
  attn.set_dropout_stream(name)
  local ok, err = pcall(fn)
  attn.set_dropout_stream(before)
  if not ok then error(err, 0) end
end

local function max_abs_diff(t, want)
  local got, worst = flat(t), 0
  assert.are.equal(#want, #got, "element count")
  for i = 1, #want do worst = math.max(worst, math.abs(got[i] - want[i])) end
  return worst
end

describe("attn.set_dropout_stream / get_dropout_stream", function()
  it("is \"mkl\" by default and switches both ways", function()
    assert.are.equal("mkl", attn.get_dropout_stream())
    attn.set_dropout_stream("default")
    assert.are.equal("default", attn.get_dropout_stream())
    attn.set_dropout_stream("mkl")
    assert.are.equal("mkl", attn.get_dropout_stream())
  end)

  it("refuses unknown streams and wrong types", function()
    local F = "attn.set_dropout_stream: "
    error_matching(function() attn.set_dropout_stream("MKL") end,
      F .. "bad argument #1 'stream' (expected \"mkl\" or \"default\", got \"MKL\")")
    error_matching(function() attn.set_dropout_stream() end,
      F .. "bad argument #1 'stream' (expected \"mkl\" or \"default\", got no value)")
    error_matching(function() attn.set_dropout_stream(1) end, F .. "bad argument #1 'stream'")
    error_matching(function() attn.set_dropout_stream("mkl", 2) end, F .. "bad argument #2")
    error_matching(function() attn.get_dropout_stream(1) end, "attn.get_dropout_stream: bad argument #1")
    assert.are.equal("mkl", attn.get_dropout_stream())
  end)

  it("switching back to \"mkl\" gives the MKL mask again (notebook 002's print)", function()
    local printed = { { 2, 2, 2, 2, 2, 2 }, { 0, 2, 0, 0, 0, 0 }, { 0, 0, 2, 0, 2, 0 },
      { 2, 2, 0, 0, 0, 2 }, { 2, 0, 0, 0, 0, 2 }, { 0, 2, 0, 0, 0, 0 } }
    with_stream("default", function()
      attn.manual_seed(123)
      assert.are.equal(S.dropout_default_002, flag_string(attn.dropout(attn.ones(6, 6), 0.5)))
    end)
    attn.manual_seed(123)
    assert.are.same(printed, attn.dropout(attn.ones(6, 6), 0.5):totable())
  end)
end)

describe("the default dropout stream", function()
  for _, c in ipairs(S.dropout_default) do
    local shape = table.concat(c.shape, "x")
    it(("attn.dropout(%s %s, %g) is torch's after manual_seed(%d)"):format(c.input, shape, c.p, c.seed), function()
      with_stream("default", function()
        attn.manual_seed(c.seed)
        local x = c.input == "ones" and attn.ones(c.shape) or attn.randn(c.shape)
        local y = attn.dropout(x, c.p)
        if c.input == "ones" then
          assert.are.equal(c.value, flag_string(y))
          local first_kept = c.value:find("1", 1, true)
          if first_kept then -- kept ones become fl(1 / fl(1 - p))
            assert.are.equal(fl(1 / fl(1 - c.p)), flat(y)[first_kept])
          end
        else
          assert.are.same(hex_want(c.value), hex_list(flat(y)))
        end
        assert_after(c.after, "dropout")
      end)
    end)
  end

  it("nn.Dropout in training follows it, in eval draws nothing", function()
    with_stream("default", function()
      attn.manual_seed(123)
      local d = nn.Dropout(0.5)
      assert.are.equal(S.dropout_default_002, flag_string(d(attn.ones(6, 6))))
      d:eval()
      attn.manual_seed(1)
      local x = attn.rand(3)
      assert.are.equal(x, d(x))
      local after = attn.rand(1):item()
      attn.manual_seed(1)
      attn.rand(3)
      assert.are.equal(attn.rand(1):item(), after)
    end)
  end)

  it("a transposed input takes its flags in logical (row-major) order, as torch's F.dropout", function()
    with_stream("default", function()
      attn.manual_seed(123)
      local y = attn.dropout(attn.ones(6, 6):t(), 0.5)
      assert.are.equal(S.dropout_default_002, flag_string(y))
    end)
  end)

  for _, c in ipairs(S.sdpa_default) do
    local name = ("[%d, %d, %d, %d] x Lk %d, p = %g%s"):format(c.b, c.h, c.lq, c.e, c.lk, c.p,
      c.causal and ", causal" or "")
    it("scaled_dot_product_attention's dropout_p (math and flash) is torch's softmax + F.dropout: " .. name, function()
      with_stream("default", function()
        attn.manual_seed(c.seed)
        local q = attn.randn(c.b, c.h, c.lq, c.e)
        local k = attn.randn(c.b, c.h, c.lk, c.e)
        local v = attn.randn(c.b, c.h, c.lk, c.ev)
        local _, plain = attn.scaled_dot_product_attention(q, k, v,
          { is_causal = c.causal, need_weights = true, kernel = "math" })
        -- the expected weights' nonzero pattern: torch's keep flags where a weight is positive
        local keep, pos, expect = c.keep, flat(plain), {}
        for i = 1, #pos do expect[i] = (pos[i] ~= 0 and keep:sub(i, i) == "1") and "1" or "0" end
        expect = table.concat(expect)
        for _, kernel in ipairs { "math", "flash" } do
          attn.manual_seed(c.seed + 1)
          local out, w
          if kernel == "math" then
            out, w = attn.scaled_dot_product_attention(q, k, v,
              { is_causal = c.causal, dropout_p = c.p, need_weights = true, kernel = "math" })
            assert.are.equal(expect, flag_string(w), "math weights' dropout pattern")
          else
            out = attn.scaled_dot_product_attention(q, k, v, { is_causal = c.causal, dropout_p = c.p, kernel = "flash" })
          end
          assert_after(c.after, kernel)
          local err = max_abs_diff(out, c.out_dec)
          assert.is_true(err < 2e-5, kernel .. ": max |out - torch| = " .. err)
        end
      end)
    end)
  end

  for _, c in ipairs(S.modules_default) do
    it(("the fused %s forward in training follows it (seed %d)"):format(c.class, c.seed), function()
      with_stream("default", function()
        attn.manual_seed(c.seed)
        local args = { table.unpack(c.args) }
        args[#args + 1] = { qkv_bias = c.qkv_bias }
        local m = nn[c.class](table.unpack(args))
        local x = attn.rand(c.b, c.n, c.args[1])
        local y = m(x)
        assert_after(c.after, c.class)
        local err = max_abs_diff(y, c.out_dec)
        assert.is_true(err < 2e-5, "max |out - torch| = " .. err)
      end)
    end)
  end
end)

describe("the default dropout stream across thread counts", function()
  -- a child per thread count (OpenMP reads OMP_NUM_THREADS at start) prints a
  -- digest of every output bit of both kernels' dropout and a module's forward
  local CHILD = [[
local attn = require "attn"
attn.set_dropout_stream("default")
attn.manual_seed(3)
local q, k, v = attn.randn(2, 4, 300, 32), attn.randn(2, 4, 310, 32), attn.randn(2, 4, 310, 16)
local outs = {}
for _, kernel in ipairs({"math", "flash"}) do
  attn.manual_seed(4)
  outs[#outs + 1] = attn.scaled_dot_product_attention(q, k, v, {dropout_p = 0.3, is_causal = true, kernel = kernel})
end
attn.manual_seed(5)
local m = attn.nn.MultiHeadAttention(64, 64, 200, 0.2, 4)
outs[#outs + 1] = m(attn.rand(3, 200, 64))
for _, t in ipairs(outs) do
  local h = 0
  for _, x in ipairs(t:reshape(-1):totable()) do
    h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 2147483647
  end
  io.write(h, " ")
end
print("END")
]]

  it("OMP_NUM_THREADS=1 and 2 give the same bits (math, flash, fused module)", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local got = {}
    for _, threads in ipairs { 1, 2 } do
      local p = assert(io.popen(("OMP_NUM_THREADS=%d scripts/attn-lua %s 2>&1"):format(threads, script)))
      got[threads] = p:read("a")
      p:close()
      assert.is_truthy(got[threads]:find("END\n", 1, true), "child with " .. threads .. " threads failed: " .. got[threads])
    end
    os.remove(script)
    assert.are.equal(got[1], got[2])
  end)
end)
