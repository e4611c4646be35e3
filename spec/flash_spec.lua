-- The fused ("flash") kernel against the math kernel, an independent
-- computation (whole score rows, OpenBLAS, glibc expf; itself checked against
-- PyTorch in attention_spec.lua): lengths that are not multiples of the tiles,
-- Lq ~= Lk, every mask/bias broadcast shape, causal or not, E and Ev of 1, 3,
-- 64, 80, 128, strided operands, NaN, and the same bits for any thread count.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention
local ATOL, RTOL = 1e-5, 5e-6

local lcg_tensor = C.lcg_tensor -- values in [-1, 1) * amp from a Lua LCG

-- flash within ATOL + RTOL |math| of math, NaN exactly where math has NaN.
local function same_as_math(q, k, v, opts, what)
  local o = {}
  for key, x in pairs(opts or {}) do o[key] = x end
  o.kernel = "math"
  local ref = sdpa(q, k, v, o)
  o.kernel = "flash"
  local got = sdpa(q, k, v, o)
  assert.same(ref:size(), got:size(), what)
  local a, b = C.flat(got), C.flat(ref)
  for i = 1, #b do
    local x, y = a[i], b[i]
    if y ~= y or x ~= x then
      assert(x ~= x and y ~= y, ("%s: element %d: flash %s, math %s"):format(what, i, x, y))
    elseif math.abs(x - y) > ATOL + RTOL * math.abs(y) then
      error(("%s: element %d: flash %.9g, math %.9g (|diff| %.3g)"):format(what, i, x, y, math.abs(x - y)), 2)
    end
  end
  return got
end

describe("flash kernel equals math kernel", function()
  local dims = {1, 3, 64, 80, 128}
  local pairs_ = {{1, 1}, {7, 7}, {63, 65}, {65, 63}, {267, 267}, {1030, 7}, {7, 1030}, {267, 1030}, {1030, 1030}}
  for pi, p in ipairs(pairs_) do
    for _, causal in ipairs {false, true} do
      local e, ev = dims[(pi - 1) % #dims + 1], dims[(pi + 1) % #dims + 1]
      local name = ("Lq %d, Lk %d, E %d, Ev %d, causal %s"):format(p[1], p[2], e, ev, tostring(causal))
      it(name, function()
        local s = pi * 10 + (causal and 1 or 0)
        local q = lcg_tensor(s, 2, 1, 2, p[1], e)
        local k = lcg_tensor(s + 1, 2, 1, 2, p[2], e)
        local v = lcg_tensor(s + 2, 1, 1, 2, p[2], ev)
        same_as_math(q, k, v, {is_causal = causal}, name)
      end)
    end
  end

  it("every E and Ev of 1, 3, 64, 80, 128 (Lq 65, Lk 267)", function()
    for _, e in ipairs(dims) do
      for _, ev in ipairs(dims) do
        local q, k = lcg_tensor(e, 1, 2, 65, e), lcg_tensor(e + 1, 1, 2, 267, e)
        local v = lcg_tensor(ev + 2, 1, 2, 267, ev)
        same_as_math(q, k, v, {is_causal = (e + ev) % 2 == 0}, ("E %d, Ev %d"):format(e, ev))
      end
    end
  end)

  it("every mask and bias broadcast shape, causal and not", function()
    local B, H, LQ, LK = 2, 3, 67, 263
    local q, k, v = lcg_tensor(1, 3, B, H, LQ, 16), lcg_tensor(2, 3, B, H, LK, 16), lcg_tensor(3, 1, B, H, LK, 24)
    local shapes = {{LK}, {1}, {LQ, LK}, {1, LK}, {LQ, 1}, {H, LQ, LK}, {H, 1, LK}, {1, 1, 1},
                    {B, H, LQ, LK}, {B, 1, 1, LK}, {B, H, LQ, 1}, {B, 1, LQ, LK}}
    for si, shape in ipairs(shapes) do
      local mask = lcg_tensor(100 + si, 1, table.unpack(shape)):gt(0.5) -- a quarter hidden
      local bias = lcg_tensor(200 + si, 4, table.unpack(shape))
      for _, causal in ipairs {false, true} do
        local tag = ("[%s] causal %s"):format(table.concat(shape, ", "), tostring(causal))
        same_as_math(q, k, v, {mask = mask, is_causal = causal}, "mask " .. tag)
        same_as_math(q, k, v, {bias = bias, is_causal = causal}, "bias " .. tag)
        same_as_math(q, k, v, {mask = mask, bias = bias, is_causal = causal, scale = 0.3}, "mask+bias " .. tag)
      end
    end
  end)

  it("hidden rows and key blocks: zeros, as the math kernel", function()
    local q, k, v = lcg_tensor(7, 2, 2, 130, 8), lcg_tensor(8, 2, 2, 600, 8), lcg_tensor(9, 1, 2, 600, 5)
    -- every key of the first 300 hidden (whole key blocks), and rows 3 and 100 fully hidden
    local mask = attn.zeros(130, 600)
    for i = 1, 130 do for j = 1, 300 do mask[i][j] = 1 end end
    for j = 1, 600 do mask[4][j] = 1; mask[101][j] = 1 end
    local got = same_as_math(q, k, v, {mask = mask}, "hidden blocks")
    C.exact(got:select(2, 4), {shape = {2, 5}, data = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}}, "hidden row")
    -- causal with Lq > Lk: rows past the last key see all keys
    same_as_math(q, k:narrow(2, 1, 70), v:narrow(2, 1, 70), {is_causal = true, mask = mask:narrow(2, 1, 70)},
                 "causal Lq > Lk")
  end)

  it("strided, transposed and broadcast operands", function()
    local qt = lcg_tensor(11, 2, 2, 40, 300) -- [B, E, L] transposed to [B, L, E]
    local kt = lcg_tensor(12, 2, 40, 300)
    local v = lcg_tensor(13, 1, 300, 2, 33):transpose(1, 2) -- [2, 300, 33], rows strided
    same_as_math(qt:transpose(2, 3), kt:t():unsqueeze(1):expand(2, 300, 40), v, {}, "transposed")
    same_as_math(qt:transpose(2, 3), kt:t(), v, {is_causal = true}, "k broadcast")
    local big = lcg_tensor(14, 2, 300, 80)
    same_as_math(big:narrow(2, 1, 40):unsqueeze(1), big:narrow(2, 41, 40), big:narrow(2, 11, 64), {is_causal = true},
                 "column slices")
  end)

  it("NaN and infinity in the inputs", function()
    local q, k, v = lcg_tensor(21, 2, 70, 8), lcg_tensor(22, 2, 300, 8), lcg_tensor(23, 1, 300, 4)
    q[5][2] = 0 / 0
    k[280][3] = 0 / 0
    local bias = attn.zeros(70, 300)
    bias[9][1] = math.huge
    local got = same_as_math(q, k, v, {bias = bias}, "NaN")
    local x = got[5][1]
    assert.is_true(x ~= x)
    same_as_math(q, k, v, {bias = bias, is_causal = true}, "NaN causal")
  end)

  it("same bits with OMP_NUM_THREADS=1 and 2", function()
    local script = [[
      local attn = require "attn"
      attn.manual_seed(3)
      local q, k, v = attn.randn(3, 5, 300, 64), attn.randn(3, 5, 333, 64), attn.randn(3, 5, 333, 40)
      local parts = {}
      for _, o in ipairs { {kernel = "flash"}, {kernel = "flash", is_causal = true},
                           {kernel = "flash", mask = attn.rand(300, 333):gt(0.7)} } do
        for _, x in ipairs(attn.scaled_dot_product_attention(q, k, v, o):view(-1):totable()) do
          parts[#parts + 1] = string.format("%08x", string.unpack("<I4", string.pack("<f", x)))
        end
      end
      io.write(table.concat(parts), "\nEND\n")
    ]]
    local one, two = C.run_with_threads(1, script), C.run_with_threads(2, script)
    assert.is_true(#one > 100000)
    assert.equal(one, two)
  end)

  -- a work item takes up to 4 query blocks of 64 rows, fewer where that would
  -- leave under 8 items per thread: one slice of 1024 rows runs 2 blocks per
  -- item on 1 thread and 1 on 2 threads; one of 2048 rows, 4 and 2
  it("same bits however many query blocks a work item holds", function()
    local script = [[
      local attn = require "attn"
      attn.manual_seed(4)
      local parts = {}
      for _, n in ipairs { 1024, 2048 } do
        local q, k, v = attn.randn(1, 1, n, 64), attn.randn(1, 1, n, 64), attn.randn(1, 1, n, 32)
        for _, o in ipairs { {kernel = "flash"}, {kernel = "flash", is_causal = true},
                             {kernel = "flash", window = {100, 0}}, {kernel = "flash", window = {200, 50}} } do
          for _, x in ipairs(attn.scaled_dot_product_attention(q, k, v, o):view(-1):totable()) do
            parts[#parts + 1] = string.format("%08x", string.unpack("<I4", string.pack("<f", x)))
          end
        end
      end
      io.write(table.concat(parts), "\nEND\n")
    ]]
    local one, two = C.run_with_threads(1, script), C.run_with_threads(2, script)
    assert.is_true(#one > 1000000)
    assert.equal(one, two)
    -- and each block of 64 rows alone (an item of one block) gives its rows' bits
    attn.manual_seed(5)
    local q, k, v = attn.randn(2, 3, 512, 64), attn.randn(2, 3, 700, 64), attn.randn(2, 3, 700, 48)
    local whole = attn.scaled_dot_product_attention(q, k, v, {kernel = "flash"})
    for r0 = 0, 511, 64 do
      local part = attn.scaled_dot_product_attention(q:narrow(3, r0 + 1, 64), k, v, {kernel = "flash"})
      assert.is_true(attn.equal(part, whole:narrow(3, r0 + 1, 64)), "rows from " .. r0)
    end
  end)
end)
