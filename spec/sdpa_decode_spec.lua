-- The fused kernel's decoding path (src/core/flash_decode.c: split-K over
-- chunks of 1024 keys, GQA heads stacked so each K/V row is read once):
-- exact properties, agreement with the math kernel (broadcast and strided
-- K/V, dropout, every variant), thread-count independence. Its PyTorch
-- references are the "decode" cases of spec/sdpa_variants_spec.lua.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention

describe("flash decoding (split-K)", function()
  it("a window {0, 0} row sees one key: out is that value row exactly, lse its score", function()
    attn.manual_seed(4)
    local q, k, v = attn.randn(1, 4, 3, 16), attn.randn(1, 2, 2500, 16), attn.randn(1, 2, 2500, 16)
    local out, lse = sdpa(q, k, v, {kernel = "flash", enable_gqa = true, window = {0, 0}, return_lse = true})
    -- query i (1-based) of head h sees key 2497 + i of kv head ceil(h / 2)
    for h = 1, 4 do
      local kvh = (h + 1) // 2
      C.same_bits(out:select(1, 1):select(1, h), v:select(1, 1):select(1, kvh):narrow(1, 2498, 3))
      local qs, ks = q:select(1, 1):select(1, h):totable(), k:select(1, 1):select(1, kvh):totable()
      local l = lse:totable()[1][h]
      for i = 1, 3 do
        local s = 0.0
        for d = 1, 16 do s = s + C.f32(qs[i][d] * C.f32(1 / 4)) * ks[2497 + i][d] end
        assert.is_true(math.abs(l[i] - s) <= 1e-5 * (1 + math.abs(s)), "lse")
      end
    end
  end)

  it("rows with no visible key give zeros and lse -inf; chunks without visible keys change nothing", function()
    attn.manual_seed(5)
    local q, k, v = attn.randn(2, 1, 4, 8), attn.randn(2, 1, 3000, 8), attn.randn(2, 1, 3000, 8)
    local mask = attn.zeros(4, 3000)
    for j = 1, 3000 do mask[2][j] = 1 end -- row 2 wholly hidden
    local out, lse = sdpa(q, k, v, {kernel = "flash", mask = mask, window = {10, 0}, return_lse = true})
    local om, lm = sdpa(q, k, v, {kernel = "math", mask = mask, window = {10, 0}, return_lse = true})
    for b = 1, 2 do
      assert.equal(-math.huge, lse:totable()[b][1][2])
      for d = 1, 8 do assert.equal(0, out:totable()[b][1][2][d]) end
    end
    assert.is_true(attn.allclose(out, om, 1e-5, 1e-6))
    assert.is_true(attn.allclose(lse, lm, 1e-6, 1e-5))
  end)

  for _, c in ipairs {
    {name = "Lq 1, 8 heads, Lk 5000", q = {1, 8, 1, 64}, kv = {1, 8, 5000, 64}, o = {}},
    {name = "GQA 32 over 8 heads, Lk 4097", q = {1, 32, 1, 64}, kv = {1, 8, 4097, 64}, o = {enable_gqa = true}},
    {name = "GQA, 4 rows, causal bottom-right, ALiBi, softcap", q = {2, 4, 4, 32}, kv = {2, 2, 3000, 32},
     o = {enable_gqa = true, window = {-1, 0}, alibi = true, softcap = 20}},
    {name = "K/V broadcast over heads", q = {2, 4, 2, 16}, kv = {2, 1, 2050, 16}, o = {}},
    {name = "dropout 0.25, GQA, window", q = {1, 4, 2, 16}, kv = {1, 2, 3100, 16},
     o = {enable_gqa = true, window = {1200, 0}, dropout_p = 0.25}},
    {name = "is_causal (top-left) with Lq < Lk hides most keys", q = {1, 2, 3, 8}, kv = {1, 2, 2000, 8},
     o = {is_causal = true}},
  } do
    it("equals the math kernel: " .. c.name, function()
      attn.manual_seed(6)
      local q, k, v = attn.randn(table.unpack(c.q)), attn.randn(table.unpack(c.kv)), attn.randn(table.unpack(c.kv))
      local o = {return_lse = true}
      for key, val in pairs(c.o) do o[key] = val end
      if o.alibi then o.alibi, o.alibi_slopes = nil, attn.alibi_slopes(c.q[2]) end
      attn.manual_seed(8)
      o.kernel = "math"
      local om, lm = sdpa(q, k, v, o)
      attn.manual_seed(8)
      o.kernel = "flash"
      local of, lf = sdpa(q, k, v, o)
      assert.is_true(attn.allclose(of, om, 1e-5, 2e-6), "out")
      assert.is_true(attn.allclose(lf, lm, 1e-6, 1e-5), "lse")
    end)
  end

  it("strided K and V (transposed views) give the bits of their contiguous copies", function()
    attn.manual_seed(7)
    local q = attn.randn(1, 4, 1, 32)
    local kt, vt = attn.randn(1, 2, 32, 2100), attn.randn(1, 2, 32, 2100)
    local k, v = kt:transpose(3, 4), vt:transpose(3, 4)
    local o = {kernel = "flash", enable_gqa = true}
    C.same_bits(sdpa(q, k, v, o), sdpa(q, k:contiguous(), v:contiguous(), o))
  end)

  it("GQA reads K and V in place: no per-head copies (peak RSS, both kernels, in a child process)", function()
    -- K and V are 64 MiB each; copies for 4 query heads per kv head would add 384 MiB or more
    local script = [[
local attn = require "attn"
local k, v = attn.randn(1, 8, 32768, 64), attn.randn(1, 8, 32768, 64)
local q = attn.randn(1, 32, 2, 64)
local before = attn.peak_rss_mb()
for _, kernel in ipairs({"math", "flash"}) do
  attn.scaled_dot_product_attention(q, k, v, {kernel = kernel, enable_gqa = true, return_lse = true})
end
io.write(string.format("%.1f\nEND\n", attn.peak_rss_mb() - before))
]]
    local grown = tonumber(C.run_with_threads(2, script))
    assert.is_true(grown < 24, ("peak RSS grew by %.1f MiB"):format(grown))
  end)

  it("bits do not depend on the thread count", function()
    local script = [[
local attn = require "attn"
attn.manual_seed(3)
local q, k, v = attn.randn(1, 8, 2, 64), attn.randn(1, 2, 9000, 64), attn.randn(1, 2, 9000, 64)
local out, lse = attn.scaled_dot_product_attention(q, k, v, {kernel = "flash", enable_gqa = true,
  window = {5000, 0}, softcap = 10, return_lse = true})
local h = 0
for _, t in ipairs({out, lse}) do
  for _, x in ipairs(t:view(-1):totable()) do
    h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
  end
end
io.write(string.format("%d\nEND\n", h))
]]
    assert.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)
