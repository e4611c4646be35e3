-- return_lse: the per-row log-sum-exp of scaled_dot_product_attention from
-- both kernels, against a double-precision computation written here (scores
-- from float32-scaled q, as torch 1.13 scales q before q k^T; max + log of the
-- sum of exp(s - max) over the visible keys; -inf where none is visible).
-- Shapes cross the flash kernel's tiles (64 query rows, 256 keys).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention
local NAME = "attn.scaled_dot_product_attention"
local ATOL, RTOL = 2e-5, 2e-6

-- The reference lse [nb * lq] of q [nb, lq, e], k [nb, lk, e] (flat lists),
-- with optional mask/bias [lq, lk] (flat lists, shared by every slice).
local function lse_ref(q, k, nb, lq, lk, e, o)
  local scale = o.scale or 1 / math.sqrt(e)
  local out = {}
  for b = 0, nb - 1 do
    for i = 0, lq - 1 do
      local s = {}
      local mx = -math.huge
      for j = 0, lk - 1 do
        local hidden = (o.causal and j > i) or (o.mask and o.mask[i * lk + j + 1] ~= 0)
        if not hidden then
          local acc = 0.0
          for d = 1, e do acc = acc + C.f32(q[(b * lq + i) * e + d] * scale) * k[(b * lk + j) * e + d] end
          if o.bias then acc = acc + o.bias[i * lk + j + 1] end
          s[#s + 1] = acc
          if acc > mx then mx = acc end
        end
      end
      local sum = 0.0
      for _, x in ipairs(s) do sum = sum + math.exp(x - mx) end
      out[#out + 1] = #s == 0 and -math.huge or mx + math.log(sum)
    end
  end
  return out
end

local function check_lse(lse, ref, what)
  local got = C.flat(lse)
  assert.are.equal(#ref, #got, what)
  for i, y in ipairs(ref) do
    local x = got[i]
    if y == -math.huge then
      assert(x == -math.huge, ("%s: row %d: lse %s, expected -inf"):format(what, i, x))
    elseif not (math.abs(x - y) <= ATOL + RTOL * math.abs(y)) then
      error(("%s: row %d: lse %.9g, expected %.9g (|diff| %.3g)"):format(what, i, x, y, math.abs(x - y)), 2)
    end
  end
end

-- Both kernels: lse against the reference, out the same as without return_lse.
local function both_kernels(nb, lq, lk, e, ev, o, seed)
  local q = C.lcg_tensor(seed, 2, nb, lq, e)
  local k = C.lcg_tensor(seed + 1, 2, nb, lk, e)
  local v = C.lcg_tensor(seed + 2, 1, nb, lk, ev)
  local opts = {is_causal = o.causal, scale = o.scale}
  if o.mask then opts.mask = attn.tensor(o.mask):view(lq, lk) end
  if o.bias then opts.bias = attn.tensor(o.bias):view(lq, lk) end
  local ref = lse_ref(C.flat(q), C.flat(k), nb, lq, lk, e, o)
  for _, kernel in ipairs {"math", "flash"} do
    local what = ("%s, [%d, %d, %d] x [%d, %d, %d]%s%s%s"):format(kernel, nb, lq, e, nb, lk, e,
      o.causal and ", causal" or "", o.mask and ", mask" or "", o.bias and ", bias" or "")
    opts.kernel = kernel
    opts.return_lse = nil
    local plain = sdpa(q, k, v, opts)
    opts.return_lse = true
    local out, lse, extra = sdpa(q, k, v, opts)
    assert.is_nil(extra, what)
    assert.are.same({nb, lq}, lse:size(), what)
    C.same_bits(plain, out, what .. ": out")
    check_lse(lse, ref, what)
  end
end

describe("scaled_dot_product_attention return_lse", function()
  it("plain, across the flash tiles (Lq 70, Lk 300)", function()
    both_kernels(2, 70, 300, 8, 5, {}, 11)
  end)

  it("causal, square and Lk < Lq; a scale", function()
    both_kernels(1, 300, 300, 8, 4, {causal = true}, 21)
    both_kernels(2, 70, 20, 5, 3, {causal = true, scale = 0.3}, 31)
  end)

  it("mask with fully hidden rows (-inf) and bias", function()
    local lq, lk = 67, 270
    local mask, bias = C.lcg(41, lq * lk), C.lcg(43, lq * lk)
    for i = 1, lq * lk do mask[i] = mask[i] > 0.3 and 1 or 0 end
    for j = 1, lk do mask[2 * lk + j], mask[65 * lk + j] = 1, 1 end -- rows 3 and 66 see nothing
    both_kernels(1, lq, lk, 6, 4, {mask = mask, bias = bias}, 45)
    both_kernels(1, lq, lk, 6, 4, {mask = mask, causal = true}, 47)
  end)

  it("no key (Lk = 0) gives -inf, and Ev = 0 still gives lse", function()
    for _, kernel in ipairs {"math", "flash"} do
      local out, lse = sdpa(attn.ones(2, 3, 4), attn.zeros(2, 0, 4), attn.zeros(2, 0, 5),
        {kernel = kernel, return_lse = true})
      assert.are.same({2, 3}, lse:size(), kernel)
      for _, x in ipairs(C.flat(lse)) do assert.are.equal(-math.huge, x, kernel) end
      C.same_bits(attn.zeros(2, 3, 5), out, kernel)
    end
    both_kernels(1, 70, 300, 4, 0, {causal = true}, 51)
  end)

  it("comes last after the weights; dropout does not change it", function()
    local q, k, v = C.lcg_tensor(61, 1, 3, 9, 4), C.lcg_tensor(62, 1, 3, 11, 4), C.lcg_tensor(63, 1, 3, 11, 2)
    local out, w, lse = sdpa(q, k, v, {need_weights = true, return_lse = true})
    assert.are.same({3, 9, 2}, out:size())
    assert.are.same({3, 9, 11}, w:size())
    check_lse(lse, lse_ref(C.flat(q), C.flat(k), 3, 9, 11, 4, {}), "with weights")
    for _, kernel in ipairs {"math", "flash"} do
      attn.manual_seed(5)
      local _, dropped = sdpa(q, k, v, {kernel = kernel, dropout_p = 0.5, return_lse = true})
      C.same_bits(select(2, sdpa(q, k, v, {kernel = kernel, return_lse = true})), dropped, kernel .. " with dropout")
    end
  end)

  it("broadcast batch dims give lse [B..., Lq]", function()
    local q, k, v = C.lcg_tensor(71, 1, 2, 1, 5, 4), C.lcg_tensor(72, 1, 3, 7, 4), C.lcg_tensor(73, 1, 3, 7, 2)
    local _, lse = sdpa(q, k, v, {return_lse = true})
    assert.are.same({2, 3, 5}, lse:size())
    local _, lse2 = sdpa(q:expand(2, 3, 5, 4):contiguous(), k:expand(2, 3, 7, 4):contiguous(),
      v:expand(2, 3, 7, 2):contiguous(), {return_lse = true})
    C.same_bits(lse2, lse, "broadcast")
  end)

  it("bad return_lse", function()
    local q = attn.ones(2, 3)
    C.fails(function() sdpa(q, q, q, {return_lse = 1}) end, NAME, "bad option 'return_lse'",
      "expected a boolean, got number")
  end)
end)
