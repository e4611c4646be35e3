-- attn.score_mod / attn.mask_mod (lua/attn/score_mod.lua, src/core/score_mod.c):
-- tracing and printing; every op's forward and backward in both kernels
-- against the same expression applied to the dense score tensor with attn's
-- tensor ops (the attention written out: softmax(f(q k^T scale)) v, through
-- the recorded tensor ops); captured tables against a dense bias / mask
-- built element by element in Lua and sent through the SDPA path; the
-- tables' gradients against the dense bias's gradient summed by hand; the
-- same bits for 1 and 2 threads; every bad input.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local sdpa = attn.scaled_dot_product_attention

local function assert_close(a, b, rtol, atol, what)
  assert.same(b:size(), a:size(), what .. ": shape")
  local err = (a - b):abs() - (b:abs() * rtol + atol)
  local worst = err:max():item()
  assert(worst <= 0, ("%s: off by %.3g beyond the tolerance (max |diff| %.3g)"):format(what, worst,
    (a - b):abs():max():item()))
end

local function max_diff(a, b) return (a - b):abs():max():item() end

-- positions as float tensors broadcasting to [B, H, Lq, Lk], 1-based
local function positions(B, H, Lq, Lk)
  return attn.arange(1, B + 1):view(B, 1, 1, 1), attn.arange(1, H + 1):view(1, H, 1, 1),
    attn.arange(1, Lq + 1):view(1, 1, Lq, 1), attn.arange(1, Lk + 1):view(1, 1, 1, Lk)
end

-- softmax(f(S)) v with S = fl(q scale) k^T, recorded tensor ops; f(S, b, h, q, k) on tensors
local function reference(q, k, v, f)
  local B, H, Lq, Lk = q:size(1), q:size(2), q:size(3), k:size(3)
  local s = (q * (1 / math.sqrt(q:size(4)))):matmul(k:transpose(3, 4))
  local pb, ph, pq, pk = positions(B, H, Lq, Lk)
  return f(s, pb, ph, pq, pk):softmax(-1):matmul(v)
end

local function inputs(B, H, Lq, Lk, E, seed)
  attn.manual_seed(seed or 1)
  return attn.randn(B, H, Lq, E), attn.randn(B, H, Lk, E), attn.randn(B, H, Lk, E)
end

describe("attn.score_mod / attn.mask_mod: tracing", function()
  it("prints the traced expression, captured tensors numbered", function()
    local rel = attn.zeros(2, 11)
    local sm = attn.score_mod(function(s, b, h, q, k) return s + rel[{ h, q - k + 6 }] end)
    assert.equal("attn.score_mod((score + t1[h, ((q - k) + 6)]))", tostring(sm))
    local mm = attn.mask_mod(function(b, h, q, k) return q:ge(k):logical_and((q - k):lt(4)) end)
    assert.equal("attn.mask_mod(q:ge(k):logical_and((q - k):lt(4)))", tostring(mm))
    assert.equal("attn.score_mod(where(score:gt(0), score, (score * 0.5)))",
      tostring(attn.score_mod(function(s) return attn.where(s:gt(0), s, s * 0.5) end)))
    assert.equal("attn.score_mod((-score ^ 2))", tostring(attn.score_mod(function(s) return (-s) ^ 2 end)))
  end)

  it("equal subexpressions are one operation; more than 128 operations is an error", function()
    -- 100 sums of the same |q - k|: s, q, k, q - k, |q - k| and 100 sums without sharing would be 500
    local function f(s, b, h, q, k)
      local x = s
      for _ = 1, 100 do x = x + (q - k):abs() * 0.01 end
      return x
    end
    local q, k, v = inputs(1, 1, 6, 9, 4)
    assert_close(sdpa(q, k, v, { score_mod = attn.score_mod(f) }), reference(q, k, v, f), 1e-5, 1e-6, "out")
    local ok, e = pcall(attn.score_mod, function(s)
      local x = s
      for i = 1, 130 do x = x * 1.5 + i end
      return x
    end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("attn.score_mod: the traced expression has 392 operations, at most 128 are "
      .. "supported", 1, true), tostring(e))
  end)

  it("a function that ignores its arguments gives a constant program", function()
    local q, k, v = inputs(1, 1, 5, 7, 4)
    local out = sdpa(q, k, v, { score_mod = attn.score_mod(function(_, b) return b * 0 end) })
    -- every score 0: each row is the mean of v's rows
    assert_close(out, v:mean(3, true):expand(1, 1, 5, 4), 1e-6, 1e-6, "constant scores")
  end)
end)

-- the ops: the traced function and the same on tensors (ceil and sign spelled with tensor ops)
local OPS = {
  { "+ - * / constants", function(s, b, h, q, k) return (s * 2 - 1) / 3 + 0.25 + b - h end },
  { "unary minus, ^ 2, ^ 3, ^ 0.5", function(s) return -(s ^ 2) * 0.1 + (s:abs() + 1) ^ 0.5 + (s / 4) ^ 3 end },
  { "abs exp log sqrt", function(s) return s:abs() + (s / 4):exp() + (s:abs() + 1):log() + (s:abs() + 2):sqrt() end },
  { "tanh sigmoid sin cos", function(s) return (s / 3):tanh() * 3 + s:sigmoid() + s:sin() + s:cos() end },
  { "floor and ceil of positions", function(s, b, h, q, k) return s + (q / 3):floor() * 0.5 - (k / 4):ceil() * 0.25 end,
    function(s, b, h, q, k) return s + (q / 3):floor() * 0.5 - (-(-(k / 4)):floor()) * 0.25 end },
  { "sign of a position difference", function(s, b, h, q, k) return s * (q - k):sign() end,
    function(s, b, h, q, k) local d = q - k return s * (d:gt(0):float() - d:lt(0):float()) end },
  { "clamp minimum maximum", function(s, b, h, q, k) return s:clamp(-1, 1.5) + s:minimum(k / 10) - s:maximum(q / 20) end,
    function(s, b, h, q, k) return s:clamp(-1, 1.5) + s:minimum(k / 10) - s:maximum(q / 20) end },
  { "comparisons, logical ops and where", function(s, b, h, q, k)
      local c = q:ge(k):logical_and(s:lt(1)):logical_or(h:eq(2)):logical_or(s:gt(2):logical_not():logical_not())
      return attn.where(c, s, s * 0.5 - 1) + attn.where(q:le(k):logical_and(k:ne(3)), 1, 0)
    end },
}

describe("attn.score_mod: every op, forward and backward, both kernels", function()
  for _, c in ipairs(OPS) do
    for _, kernel in ipairs { "math", "flash" } do
      it(c[1] .. " (" .. kernel .. ")", function()
        local q, k, v = inputs(2, 2, 37, 45, 8, 4)
        q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
        local out = sdpa(q, k, v, { score_mod = attn.score_mod(c[2]), kernel = kernel })
        local w = attn.randn(out:size())
        ;(out * w):sum():backward()
        local got = { q.grad, k.grad, v.grad }
        q.grad, k.grad, v.grad = nil, nil, nil
        local ref = reference(q, k, v, c[3] or c[2])
        ;(ref * w):sum():backward()
        assert_close(out, ref, 1e-5, 2e-6, "out")
        for i, name in ipairs { "dq", "dk", "dv" } do
          assert_close(got[i], ({ q.grad, k.grad, v.grad })[i], 1e-4, 1e-5, name)
        end
      end)
    end
  end
end)

-- [B, H, Lq, Lk] bias of rel[h, q - k + Lk] (Lq <= Lk), element by element
local function relative_bias(rel, B, H, Lq, Lk)
  local bias = attn.zeros(B, H, Lq, Lk)
  for b = 1, B do
    for h = 1, H do
      for i = 1, Lq do for j = 1, Lk do bias[{ b, h, i, j }] = rel[{ h, i - j + Lk }] end end
    end
  end
  return bias
end

describe("attn.score_mod: the built-in variants written as expressions", function()
  it("ALiBi and softcap give the bits of the options alibi_slopes and softcap (both kernels, with causal)", function()
    local B, H, Lq, Lk = 2, 4, 70, 90
    local q, k, v = inputs(B, H, Lq, Lk, 16, 11)
    local slopes = attn.alibi_slopes(H)
    local alibi = attn.score_mod(function(s, b, h, qq, kk) return s - slopes[h] * (qq - kk + Lk - Lq):abs() end)
    local cap = attn.score_mod(function(s) return (s / 30):tanh() * 30 end)
    for _, kernel in ipairs { "math", "flash" } do
      for _, causal in ipairs { false, true } do
        assert.equal(0, max_diff(sdpa(q, k, v, { score_mod = alibi, kernel = kernel, is_causal = causal }),
          sdpa(q, k, v, { alibi_slopes = slopes, kernel = kernel, is_causal = causal })))
        assert.equal(0, max_diff(sdpa(q, k, v, { score_mod = cap, kernel = kernel, is_causal = causal }),
          sdpa(q, k, v, { softcap = 30, kernel = kernel, is_causal = causal })))
      end
    end
  end)
end)

-- Programs of a common shape (s + t[affine index], s - x |d|, (s / c):tanh() * c) run as one fused tile op;
-- the same program with "* 1" appended to its term (x * 1 = x exactly) runs op by op: the two must give
-- the same bits, forward and backward, in every kernel's tile layout (flash's transposed tiles, the math
-- kernel's and the backward's rows, the decode path).
describe("attn.score_mod: the fused shapes give the bits of the program op by op", function()
  local function run(q, k, v, sm, tbls, o)
    for _, t in ipairs(tbls) do t.grad = nil end
    q.grad, k.grad, v.grad = nil, nil, nil
    local opts = { score_mod = sm }
    for name, x in pairs(o) do opts[name] = x end
    local out = sdpa(q, k, v, opts)
    ;(out * attn.arange(1, out:numel() + 1):view(out:size()):sin()):sum():backward()
    local r = { out, q.grad, k.grad, v.grad }
    for _, t in ipairs(tbls) do r[#r + 1] = t.grad end
    return r
  end
  local sizes = { { 2, 3, 70, 90, 3 }, { 1, 4, 2, 300, 2 } } -- B, H, Lq, Lk, KV heads (the second: GQA, decode)
  for _, sz in ipairs(sizes) do
    local B, H, Lq, Lk, HK = sz[1], sz[2], sz[3], sz[4], sz[5]
    attn.manual_seed(21)
    local q = attn.randn(B, H, Lq, 8):requires_grad_()
    local k, v = attn.randn(B, HK, Lk, 8):requires_grad_(), attn.randn(B, HK, Lk, 8):requires_grad_()
    local rel = (attn.randn(H, 2 * Lq + Lk) * 0.5):requires_grad_()
    local rel3 = (attn.randn(B, H, Lq + Lk) * 0.5):requires_grad_()
    local relt = (attn.randn(Lq + Lk, H) * 0.5):t() -- strided: [H, Lq + Lk] with strides {1, H}
    local slopes = attn.alibi_slopes(H)
    local slopes_g = attn.alibi_slopes(H):requires_grad_()
    local big = 8388608 -- 2^23: q big passes 2^24 from q = 3
    local cases = {
      { "s + rel[h, q - k + Lk]", { rel }, function(x, f) return function(s, b, h, qq, kk) return s + f(rel[{ h, qq - kk + Lk }]) end end },
      { "s + rel[h, k - q + Lq]", { rel }, function(x, f) return function(s, b, h, qq, kk) return s + f(rel[{ h, kk - qq + Lq }]) end end },
      { "s + rel[h, 2 q - k + Lk]", { rel }, function(x, f) return function(s, b, h, qq, kk) return s + f(rel[{ h, qq * 2 - kk + Lk }]) end end },
      { "rel[h, q] + s", { rel }, function(x, f) return function(s, b, h, qq, kk) return f(rel[{ h, qq }]) + s end end },
      { "s + rel3[b, h, q - k + Lk]", { rel3 }, function(x, f) return function(s, b, h, qq, kk) return s + f(rel3[{ b, h, qq - kk + Lk }]) end end },
      { "s + strided[h, k - q + Lq]", {}, function(x, f) return function(s, b, h, qq, kk) return s + f(relt[{ h, kk - qq + Lq }]) end end },
      { "an index past 2^24 on the way", { rel }, function(x, f) return function(s, b, h, qq, kk)
        return s + f(rel[{ h, qq * big - qq * big + qq - kk + Lk }]) end end },
      { "s - slopes[h] |q - k|", {}, function(x, f) return function(s, b, h, qq, kk) return s - f(slopes[h] * (qq - kk):abs()) end end },
      { "s - |k - q + 3| 0.25", {}, function(x, f) return function(s, b, h, qq, kk) return s - f((kk - qq + 3):abs() * 0.25) end end },
      { "s - slopes[h] |q - k| (slopes learnable)", { slopes_g }, function(x, f) return function(s, b, h, qq, kk)
        return s - f(slopes_g[h] * (qq - kk):abs()) end end },
      { "(s / 7):tanh() * 7", {}, function(x, f) return function(s) return f((s / 7):tanh() * 7) end end },
      { "7 * (s / 7):tanh()", {}, function(x, f) return function(s) return f(7 * (s / 7):tanh()) end end },
    }
    local function id(x) return x end
    local function times1(x) return x * 1 end
    for _, c in ipairs(cases) do
      it(("%s, [%d, %d, %d, %d]"):format(c[1], B, H, Lq, Lk), function()
        local fused, plain = attn.score_mod(c[3](nil, id)), attn.score_mod(c[3](nil, times1))
        for _, kernel in ipairs { "math", "flash" } do
          for _, causal in ipairs { false, true } do
            local o = { kernel = kernel, is_causal = causal and Lq <= Lk, enable_gqa = HK ~= H }
            local a, b = run(q, k, v, fused, c[2], o), run(q, k, v, plain, c[2], o)
            for i = 1, #b do
              assert(a[i]:equal(b[i]), ("%s%s: result %d differs by %g"):format(kernel, causal and ", causal" or "", i,
                max_diff(a[i], b[i])))
            end
          end
        end
      end)
    end
  end
end)

describe("attn.score_mod: a captured learnable table", function()
  for _, kernel in ipairs { "math", "flash" } do
    for _, causal in ipairs { false, true } do
      it(("relative-position table: out, dq, dk, dv as the dense bias path, rel.grad = the bias gradient summed "
        .. "per relative position (%s%s)"):format(kernel, causal and ", causal" or ""), function()
        local B, H, L = 2, 3, 150
        local q, k, v = inputs(B, H, L, L, 16, 7)
        local rel = (attn.randn(H, 2 * L - 1) * 0.5):requires_grad_()
        q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
        local sm = attn.score_mod(function(s, b, h, qq, kk) return s + rel[{ h, qq - kk + L }] end)
        local out = sdpa(q, k, v, { score_mod = sm, kernel = kernel, is_causal = causal })
        local w = attn.randn(out:size())
        ;(out * w):sum():backward()
        local got = { q.grad, k.grad, v.grad }
        q.grad, k.grad, v.grad = nil, nil, nil
        local bias = relative_bias(rel:detach(), B, H, L, L):requires_grad_()
        local ref = sdpa(q, k, v, { bias = bias, kernel = kernel, is_causal = causal })
        ;(ref * w):sum():backward()
        -- the same additions in the same order: the same bits
        assert.equal(0, max_diff(out, ref))
        for i, name in ipairs { "dq", "dk", "dv" } do assert.equal(0, max_diff(got[i], ({ q.grad, k.grad, v.grad })[i]), name) end
        local want = attn.zeros(H, 2 * L - 1)
        local g = bias.grad
        for h = 1, H do
          local acc = {}
          for b = 1, B do for i = 1, L do for j = 1, L do
            local r = i - j + L
            acc[r] = (acc[r] or 0) + g[{ b, h, i, j }]
          end end end
          for r = 1, 2 * L - 1 do want[{ h, r }] = acc[r] end
        end
        assert_close(rel.grad, want, 1e-5, 1e-6, "rel.grad")
      end)
    end
  end

  it("a table read twice and a 1-D table, with GQA and the decode path (Lq 2)", function()
    attn.manual_seed(3)
    local B, H, Lq, Lk = 1, 4, 2, 2100
    local q, k, v = attn.randn(B, H, Lq, 16), attn.randn(B, 2, Lk, 16), attn.randn(B, 2, Lk, 16)
    local slope = attn.rand(H):requires_grad_()
    local rel = (attn.randn(H, Lq + Lk - 1) * 0.3):requires_grad_()
    local sm = attn.score_mod(function(s, b, h, qq, kk)
      return s - slope[h] * (qq - kk + Lk - Lq):abs() + rel[{ h, qq - kk + Lk }] * rel[{ h, qq - kk + Lk }]
    end)
    for _, kernel in ipairs { "math", "flash" } do
      slope.grad, rel.grad = nil, nil
      local out = sdpa(q, k, v, { score_mod = sm, kernel = kernel, enable_gqa = true })
      out:sum():backward()
      local gs, gr = slope.grad, rel.grad
      local bias = attn.zeros(B, H, Lq, Lk)
      for h = 1, H do for i = 1, Lq do for j = 1, Lk do
        local r = rel[{ h, i - j + Lk }]
        bias[{ 1, h, i, j }] = -slope[h] * math.abs(i - j + Lk - Lq) + r * r
      end end end
      bias:requires_grad_()
      local ref = sdpa(q, k, v, { bias = bias, kernel = kernel, enable_gqa = true })
      ref:sum():backward()
      assert_close(out, ref, 1e-5, 1e-6, kernel .. " out")
      -- d/dslope[h] = -sum dbias |i + d - j|; d/drel[h, r] = sum 2 rel[h, r] dbias over i - j + Lk = r
      for h = 1, H do
        local ws, wr = 0, {}
        for i = 1, Lq do for j = 1, Lk do
          local g, r = bias.grad[{ 1, h, i, j }], i - j + Lk
          ws = ws - g * math.abs(i - j + Lk - Lq)
          wr[r] = (wr[r] or 0) + 2 * rel[{ h, r }] * g
        end end
        assert(math.abs(gs[h] - ws) <= 1e-4 * math.abs(ws) + 1e-5, ("slope.grad[%d] %g, expected %g"):format(h, gs[h], ws))
        for r = 1, Lq + Lk - 1 do
          assert(math.abs(gr[{ h, r }] - wr[r]) <= 1e-4 * math.abs(wr[r]) + 1e-5, ("rel.grad[%d, %d]"):format(h, r))
        end
      end
    end
  end)

  it("NaN in a table propagates to the rows that read it, as a NaN bias does (PyTorch 1.13)", function()
    local B, H, L = 1, 2, 20
    local q, k, v = inputs(B, H, L, L, 8, 5)
    local rel = attn.zeros(H, 2 * L - 1)
    rel[{ 2, L + 3 }] = 0 / 0 -- q - k = 3: rows 4.. of head 2
    local sm = attn.score_mod(function(s, b, h, qq, kk) return s + rel[{ h, qq - kk + L }] end)
    local bias = relative_bias(rel, B, H, L, L)
    for _, kernel in ipairs { "math", "flash" } do
      local out = sdpa(q, k, v, { score_mod = sm, kernel = kernel })
      local ref = sdpa(q, k, v, { bias = bias, kernel = kernel })
      assert.same(ref:ne(ref):totable(), out:ne(out):totable())
      assert.equal(1, out[{ 1, 2, 5, 1 }] ~= out[{ 1, 2, 5, 1 }] and 1 or 0)
      assert.equal(0, max_diff(out[1][1], ref[1][1]))
    end
  end)
end)

-- doc ids [B, L]: document masking with causal, as a dense mask (1 = hidden)
local function document_mask(doc, B, L, causal)
  local m = attn.zeros(B, 1, L, L)
  for b = 1, B do for i = 1, L do for j = 1, L do
    local vis = doc[{ b, i }] == doc[{ b, j }] and (not causal or j <= i)
    m[{ b, 1, i, j }] = vis and 0 or 1
  end end end
  return m
end

describe("attn.mask_mod", function()
  local B, H, L = 2, 3, 130
  local ids = {}
  for b = 1, B do
    ids[b] = {}
    for i = 1, L do ids[b][i] = 1 + (i * (b + 2)) // 37 end
  end
  local doc = attn.tensor(ids)
  local mm = attn.mask_mod(function(b, h, q, k) return doc[{ b, q }]:eq(doc[{ b, k }]):logical_and(q:ge(k)) end)
  local mask = document_mask(doc, B, L, true)

  for _, kernel in ipairs { "math", "flash" } do
    it("document masking with causal: out and gradients as the dense mask (" .. kernel .. ")", function()
      local q, k, v = inputs(B, H, L, L, 16, 8)
      q:requires_grad_(); k:requires_grad_(); v:requires_grad_()
      local out = sdpa(q, k, v, { mask_mod = mm, kernel = kernel })
      out:sum():backward()
      local got = { q.grad, k.grad, v.grad }
      q.grad, k.grad, v.grad = nil, nil, nil
      local ref = sdpa(q, k, v, { mask = mask, kernel = kernel })
      ref:sum():backward()
      -- (attn.scaled_dot_product_attention runs a mask_mod as the block mask it makes: the kernels skip its
      -- empty blocks, which changes the order of some sums: a few ulp)
      assert_close(out, ref, 1e-6, 1e-6, "out")
      for i, name in ipairs { "dq", "dk", "dv" } do
        assert_close(got[i], ({ q.grad, k.grad, v.grad })[i], 1e-5, 1e-6, name)
      end
      -- evaluated in the kernels' tiles (the C functions, no block mask made): the dense mask's bits
      local raw = require("attn.core")
      local o1, s1 = raw.autograd.sdpa_forward(q, k, v, { mask_mod = mm, kernel = kernel })
      local o2, s2 = raw.autograd.sdpa_forward(q, k, v, { mask = mask, kernel = kernel })
      assert.equal(0, max_diff(o1, o2))
      assert.equal(0, max_diff(raw.scaled_dot_product_attention(q, k, v, { mask_mod = mm, kernel = kernel }), o2))
      local dout = attn.randn(o1:size())
      local g1 = { raw.autograd.sdpa_backward(dout, q, k, v, o1, s1, { mask_mod = mm, kernel = kernel }) }
      local g2 = { raw.autograd.sdpa_backward(dout, q, k, v, o2, s2, { mask = mask, kernel = kernel }) }
      for i, name in ipairs { "dq", "dk", "dv" } do assert.equal(0, max_diff(g1[i], g2[i]), name) end
    end)

  it("a mask_mod made into a block mask once per sizes and tables' versions", function()
    local q, k, v = inputs(B, H, L, L, 16, 8)
    local ids2 = doc:clone()
    local mm2 = attn.mask_mod(function(b, h, qq, kk) return ids2[{ b, qq }]:eq(ids2[{ b, kk }]) end)
    local a1 = sdpa(q, k, v, { mask_mod = mm2 })
    ids2:fill_(1) -- every key visible now: the block mask is made anew
    local a2 = sdpa(q, k, v, { mask_mod = mm2 })
    assert_close(a2, sdpa(q, k, v), 1e-6, 1e-6, "after the in-place change")
    assert.is_true(max_diff(a1, a2) > 1e-3)
  end)
  end

  it("combines with score_mod, bias, softcap, window and return_lse (order: softcap, score_mod, bias, masks)", function()
    local q, k, v = inputs(B, H, L, L, 16, 9)
    local bias = attn.randn(L, L)
    local sm = attn.score_mod(function(s, b, h, qq, kk) return s * 0.5 + h end)
    local mm2 = attn.mask_mod(function(b, h, qq, kk) return doc[{ b, qq }]:eq(doc[{ b, kk }]) end)
    local _, ph = positions(B, H, L, L)
    local dense_mask = document_mask(doc, B, L, false)
    for _, kernel in ipairs { "math", "flash" } do
      local out, lse = sdpa(q, k, v, { score_mod = sm, mask_mod = mm2, bias = bias, softcap = 4, window = { 20, 5 },
        kernel = kernel, return_lse = true })
      -- the dense path: score_mod's part can go to the bias only after the cap, so write it out
      local s = (q * (1 / math.sqrt(16))):matmul(k:transpose(3, 4))
      s = (s / 4):tanh() * 4 * 0.5 + ph + bias
      local hidden = dense_mask:clone()
      for i = 1, L do for j = 1, L do
        if j < i - 20 or j > i + 5 then hidden[{ 1, 1, i, j }] = 1; hidden[{ 2, 1, i, j }] = 1 end
      end end
      s = attn.where(hidden:bool(), -math.huge, s)
      local ref = s:softmax(-1):matmul(v)
      assert_close(out, ref, 1e-5, 2e-6, kernel .. " out")
      assert_close(lse, s:exp():sum(-1):log(), 1e-5, 1e-5, kernel .. " lse")
    end
  end)

  it("a row that the mask_mod hides entirely gives zeros, as every mask does", function()
    local q, k, v = inputs(1, 1, 6, 6, 4, 2)
    local none = attn.mask_mod(function(b, h, qq, kk) return qq:ne(3) end)
    for _, kernel in ipairs { "math", "flash" } do
      local out = sdpa(q, k, v, { mask_mod = none, kernel = kernel })
      assert.same({ 0, 0, 0, 0 }, out[1][1][3]:totable())
    end
  end)
end)

describe("attn.block_mask with a mask_mod", function()
  it("classifies blocks in C: the visibility of the dense mask built in Lua, per batch where it reads b", function()
    local B, H, L = 2, 3, 70
    local ids = {}
    for b = 1, B do
      ids[b] = {}
      for i = 1, L do ids[b][i] = 1 + (i * (b + 1)) // 23 end
    end
    local doc = attn.tensor(ids)
    local mm = attn.mask_mod(function(b, h, q, k) return doc[{ b, q }]:eq(doc[{ b, k }]):logical_and(q:ge(k)) end)
    local bm = attn.block_mask(mm, B, H, L, L, { block = 16 })
    local want = document_mask(doc, B, L, true):eq(0):float():expand(B, H, L, L)
    assert.equal(0, max_diff(bm:to_dense(), want))
    assert.truthy(bm:sparsity() > 0.4)
    -- the same attention as the mask_mod option and the dense mask
    local q, k, v = inputs(B, H, L, L, 8, 6)
    local ref = sdpa(q, k, v, { mask = document_mask(doc, B, L, true) })
    for _, kernel in ipairs { "math", "flash" } do
      -- (skipped blocks change the order of the softmax's sums: a few ulp)
      assert_close(sdpa(q, k, v, { block_mask = bm, kernel = kernel }), ref, 1e-6, 1e-6, kernel)
    end
    -- a mask reading neither b nor h stores one pattern (it broadcasts over any B, H)
    local causal = attn.block_mask(attn.mask_mod(function(b, h, q2, k2) return k2:le(q2) end), 1, 1, L, L)
    local builtin = attn.block_mask(attn.block_mask.causal, 1, 1, L, L)
    assert.equal(0, max_diff(causal:to_dense(), builtin:to_dense()))
    assert.equal(builtin:sparsity(), causal:sparsity())
  end)

  it("an index out of range names attn.mask_mod; a score_mod is refused", function()
    local t = attn.zeros(10)
    local ok, e = pcall(attn.block_mask, attn.mask_mod(function(b, h, q, k) return t[q]:eq(0) end), 1, 1, 12, 12)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("attn.mask_mod: index 1 of captured tensor #1 is 11 at b = 1, h = 1, q = 11, "
      .. "k = 1: out of range (expected 1..10)", 1, true), tostring(e))
    ok, e = pcall(attn.block_mask, attn.score_mod(function(s) return s end), 1, 1, 12, 12)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("expected a mask function: attn.mask_mod(fn)", 1, true), tostring(e))
  end)
end)

describe("nn.MultiHeadAttention and nn.GroupedQueryAttention: score_mod and mask_mod", function()
  it("a relative-position MHA: out as its projections through SDPA with the dense bias, the table's gradient", function()
    attn.manual_seed(4)
    local n, H, d = 12, 2, 8
    local rel = (attn.randn(H, 2 * n - 1) * 0.3):requires_grad_()
    local sm = attn.score_mod(function(s, b, h, q, k) return s + rel[{ h, q - k + n }] end)
    local m = attn.nn.MultiHeadAttention(d, d, n, 0.0, H, { score_mod = sm })
    local x = attn.randn(2, n, d)
    local out = m(x)
    out:sum():backward()
    local bias = relative_bias(rel:detach(), 1, H, n, n):requires_grad_()
    local function heads(t) return t:view(2, n, H, d // H):transpose(2, 3) end
    local ctx = sdpa(heads(m.W_query(x)), heads(m.W_key(x)), heads(m.W_value(x)), { bias = bias, is_causal = true })
    local ref = m.out_proj(ctx:transpose(2, 3):reshape(2, n, d))
    assert.equal(0, max_diff(out, ref))
    ref:sum():backward()
    for h = 1, H do
      for r = 1, 2 * n - 1 do
        local want = 0
        for i = 1, n do for j = 1, n do if i - j + n == r then want = want + bias.grad[{ 1, h, i, j }] end end end
        assert(math.abs(rel.grad[{ h, r }] - want) <= 1e-5 + 1e-5 * math.abs(want), ("rel.grad[%d, %d]"):format(h, r))
      end
    end
  end)

  it("GQA with a sliding-window mask_mod equals its window option; bad options and use_cache refused", function()
    attn.manual_seed(5)
    local mm = attn.mask_mod(function(b, h, q, k) return (q - k):lt(4) end)
    local g1 = attn.nn.GroupedQueryAttention(16, 16, 20, 4, 2, { mask_mod = mm })
    local g2 = attn.nn.GroupedQueryAttention(16, 16, 20, 4, 2, { window = 4 })
    g2:load_state_dict(g1:state_dict())
    local x = attn.randn(2, 20, 16)
    assert.equal(0, max_diff(g1(x), g2(x)))
    local ok, e = pcall(g1.forward, g1, x, { use_cache = true })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("use_cache is not supported with score_mod / mask_mod", 1, true))
    ok, e = pcall(attn.nn.MultiHeadAttention, 8, 8, 4, 0.0, 2, { score_mod = mm })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("attn.nn.MultiHeadAttention: bad option 'score_mod' (expected the result of "
      .. "attn.score_mod(fn), got an attn.mask_mod)", 1, true), tostring(e))
  end)
end)

describe("attn.score_mod / attn.mask_mod: the same bits for 1 and 2 threads", function()
  local script = [[
local attn = require "attn"
attn.manual_seed(3)
local h = 0
local function hash(t)
  for _, x in ipairs(t:contiguous():view(-1):totable()) do
    h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
  end
end
for _, kernel in ipairs({"math", "flash"}) do
  for _, s in ipairs({ {2, 4, 300}, {1, 2, 700}, {1, 1, 700} }) do
    local B, H, L = s[1], s[2], s[3]
    local q, k, v = attn.randn(B, H, L, 32):requires_grad_(), attn.randn(B, H, L, 32):requires_grad_(), attn.randn(B, H, L, 32):requires_grad_()
    local rel = attn.randn(H, 2 * L - 1):requires_grad_()
    local sm = attn.score_mod(function(x, b, hh, qq, kk) return (x + rel[{hh, qq - kk + L}]):tanh() * 5 end)
    local mm = attn.mask_mod(function(b, hh, qq, kk) return (qq - kk):abs():lt(200) end)
    local out = attn.scaled_dot_product_attention(q, k, v, {score_mod = sm, mask_mod = mm, kernel = kernel})
    out:sum():backward()
    for _, t in ipairs({out, q.grad, k.grad, v.grad, rel.grad}) do hash(t) end
    -- a fused shape (the table gradient added along its row)
    q.grad, k.grad, v.grad, rel.grad = nil, nil, nil, nil
    local fused = attn.score_mod(function(x, b, hh, qq, kk) return x + rel[{hh, qq - kk + L}] end)
    out = attn.scaled_dot_product_attention(q, k, v, {score_mod = fused, kernel = kernel})
    out:sum():backward()
    for _, t in ipairs({out, q.grad, k.grad, v.grad, rel.grad}) do hash(t) end
  end
end
io.write(string.format("%d\nEND\n", h))
]]
  it("forward, dq, dk, dv and a table's gradient, math and flash, one and several slices", function()
    assert.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)

describe("attn.score_mod / attn.mask_mod: bad input", function()
  local q, k, v = inputs(1, 2, 8, 8, 4, 1)
  local t = attn.zeros(8)
  local function err_of(f, ...)
    local ok, e = pcall(f, ...)
    assert.is_false(ok)
    return tostring(e)
  end
  local cases = {
    { "a function that errors", function() error("boom") end, "attn.score_mod: fn raised an error while being traced: .*boom" },
    { "nil", function() return nil end, "attn.score_mod: fn must return the modified score %(a traced number%), got nil" },
    { "a number", function() return 1 end, "got the number 1" },
    { "a tensor", function() return t end, "got an attn.Tensor" },
    { "a traced boolean", function(s) return s:gt(0) end, "fn returned a traced boolean; a score_mod returns the modified score" },
    { "a comparison with <", function(s) if s < 0 then return s end return s end, "comparison with < or >.*attn.where" },
    { "the operator ..", function(s) return s .. "x" end, "the operator %.%. .*cannot be traced" },
    { "a string operand", function(s) return s + "1" end, "cannot use a string in a traced expression %(operator %+%)" },
    { "a table operand", function(s) return s * {} end, "cannot use a table in a traced expression %(operator %*%)" },
    { "an unknown method", function(s) return s:softmax() end, "no field or method 'softmax'" },
    { "the operator //", function(s) return s // 2 end, "the operator // cannot be traced; use %(x / y%):floor%(%)" },
    { "the operator %", function(s) return s % 2 end, "the operator %% cannot be traced" },
    { "the operator #", function(s) return #s end, "the operator # .*cannot be traced" },
    { "calling a traced value", function(s) return s(1) end, "calling a traced value cannot be traced" },
    { "^ with a traced exponent", function(s) return 2 ^ s end, "operator %^ takes a traced value and a number exponent" },
    { "a float index", function(s, b, h, qq) return s + t[qq / 2] end, "index 1 of a captured tensor is not integer%-valued" },
    { "too few indices", function(s, b, h, qq) return s + attn.zeros(2, 2)[qq] end, "captured tensor of 2 dims with 1 indices" },
  }
  for _, c in ipairs(cases) do
    it("score_mod: " .. c[1], function()
      local e = err_of(attn.score_mod, c[2])
      assert(e:find("attn.score_mod", 1, true) and e:find(c[3]), e)
    end)
  end

  it("mask_mod: a number result, a non-function, extra arguments", function()
    local e = err_of(attn.mask_mod, function(b, h, qq, kk) return qq - kk end)
    assert.truthy(e:find("attn.mask_mod: fn returned a traced number; a mask_mod returns a traced boolean", 1, true), e)
    e = err_of(attn.mask_mod, 3)
    assert.truthy(e:find("attn.mask_mod: bad argument #1 'fn' (expected a function, got a number)", 1, true), e)
    e = err_of(attn.score_mod, function(s) return s end, 2)
    assert.truthy(e:find("attn.score_mod: expected 1 argument (fn), got 2", 1, true), e)
  end)

  it("an index out of the table's range is an error at call time, naming attn.score_mod", function()
    local sm = attn.score_mod(function(s, b, h, qq, kk) return s + t[qq + 1] end)
    local e = err_of(sdpa, q, k, v, { score_mod = sm })
    assert.truthy(e:find("attn.score_mod: index 1 of captured tensor #1 is 9 at b = 1, h = 1, q = 8, k = 1: out of "
      .. "range (expected 1..8)", 1, true), e)
    -- in range where the bound over the call's positions cannot prove it (a where keeps it in), it runs: the
    -- indices are checked at every position then; the value is the clamped expression's
    local t12 = attn.arange(1, 13):view(12) * 0.5
    local q12, k12, v12 = attn.randn(1, 2, 12, 4), attn.randn(1, 2, 12, 4), attn.randn(1, 2, 12, 4)
    local ix_where = attn.score_mod(function(s, b, h, qq, kk)
      return s + t12[attn.where(qq:le(6), qq + 6, qq)] end)
    local ix_clamp = attn.score_mod(function(s, b, h, qq, kk)
      return s + t12[attn.where(qq:le(6), qq + 6, qq):clamp(1, 12)] end)
    for _, kernel in ipairs({ "math", "flash" }) do
      local a = sdpa(q12, k12, v12, { score_mod = ix_where, kernel = kernel })
      local c = sdpa(q12, k12, v12, { score_mod = ix_clamp, kernel = kernel })
      assert.is_true(a:equal(c), kernel)
    end
    local beyond = attn.score_mod(function(s, b, h, qq, kk)
      return s + t12[attn.where(qq:le(7), qq + 6, qq)] end)
    e = err_of(sdpa, q12, k12, v12, { score_mod = beyond })
    assert.truthy(e:find("attn.score_mod: index 1 of captured tensor #1 is 13 at b = 1, h = 1, q = 7, k = 1: out of "
      .. "range (expected 1..12)", 1, true), e)
    -- a where's true branch that is the compared value itself is bounded by the comparison (T5's bucket)
    local bounded = attn.score_mod(function(s, b, h, qq, kk)
      return s + t12[attn.where((qq + kk):lt(12), qq + kk, 12)] end)
    local bounded_clamp = attn.score_mod(function(s, b, h, qq, kk) return s + t12[(qq + kk):clamp(1, 12)] end)
    assert.is_true(sdpa(q12, k12, v12, { score_mod = bounded }):equal(sdpa(q12, k12, v12, { score_mod = bounded_clamp })))
    -- clamped into range it runs
    local ok = attn.score_mod(function(s, b, h, qq, kk) return s + t[(qq + 1):clamp(1, 8)] end)
    assert.equal(8, sdpa(q, k, v, { score_mod = ok }):size(3))
    -- a mask_mod option runs as a block mask made for the call: its error names the call, not attn.block_mask
    local mm = attn.mask_mod(function(b, h, qq, kk) return t[{ kk - 1 }]:eq(0) end)
    for _, kernel in ipairs({ "math", "flash" }) do
      e = err_of(sdpa, q, k, v, { mask_mod = mm, kernel = kernel })
      assert.truthy(e:find("attn.scaled_dot_product_attention: attn.mask_mod: index 1 of captured tensor #1 is 0 at "
        .. "b = 1, h = 1, q = 1, k = 1: out of range (expected 1..8)", 1, true), e)
      assert.falsy(e:find("attn.block_mask", 1, true), e)
    end
  end)

  it("options of the wrong kind", function()
    local sm = attn.score_mod(function(s) return s end)
    local mm = attn.mask_mod(function(b, h, qq, kk) return qq:ge(kk) end)
    local e = err_of(sdpa, q, k, v, { score_mod = mm })
    assert.truthy(e:find("bad option 'score_mod' (expected the result of attn.score_mod(fn), got an attn.mask_mod)", 1,
      true), e)
    e = err_of(sdpa, q, k, v, { mask_mod = sm })
    assert.truthy(e:find("bad option 'mask_mod' (expected the result of attn.mask_mod(fn), got an attn.score_mod)", 1,
      true), e)
    e = err_of(sdpa, q, k, v, { score_mod = function(s) return s end })
    assert.truthy(e:find("bad option 'score_mod' (expected the result of attn.score_mod(fn), got function)", 1, true), e)
  end)

  it("a traced value outside a trace cannot index a tensor", function()
    local leaked
    attn.score_mod(function(s) leaked = s return s end)
    local e = err_of(function() return t[leaked] end)
    assert.truthy(e:find("a traced value can index a tensor only inside attn.score_mod / attn.mask_mod", 1, true), e)
  end)
end)
