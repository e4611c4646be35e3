-- The fused module backward (attn.core.modules.attention_backward,
-- src/core/modules_backward.c, src/core/modules_backward_tiny.c) recomputes
-- the forward's state (projections, probabilities, the attention's output)
-- when the forward kept none: a call whose backward is tiny, or a caller that
-- passes no state.
-- The recomputed state must be the bits the forward computed, whichever path
-- the forward took (its direct loops, or BLAS and the math or flash kernel),
-- so that the gradients are the same bits whether the state was kept or
-- recomputed. Shapes on both sides of the forward's tiny bound, of the
-- backward's and of the small products (4096 multiply-adds), CausalAttention-
-- (1 head, no out_proj), SelfAttentionV2- (no position hidden) and
-- MultiHeadAttention-shaped (heads, out_proj), with and without biases; the
-- gradients also against a float64 reference computed here.
local attn = require "attn"
local modules = require("attn.core").modules

-- {B, n, d_in, d_out, heads, out_proj}: the notebook's [2, 6, 3]; tiny
-- forwards whose backward is not tiny (n 20 to 40); [2, 24, 16] with 4 heads
-- of 4 (the forward past its tiny bound, the products below 4096
-- multiply-adds); the flash kernel (from 32 keys); a call past every bound
local SHAPES = {
  { 2, 6, 3, 2, 1, false }, { 2, 6, 3, 2, 2, true }, { 2, 6, 3, 4, 2, true },
  { 1, 20, 3, 16, 4, false }, { 1, 20, 3, 8, 2, true }, { 1, 32, 4, 8, 2, true }, { 1, 40, 3, 4, 1, false },
  { 2, 12, 8, 8, 2, true }, { 2, 16, 16, 16, 4, false }, { 2, 24, 16, 16, 4, true }, { 2, 24, 16, 16, 4, false },
  { 2, 24, 16, 16, 1, false }, { 2, 32, 8, 8, 2, true }, { 2, 48, 8, 4, 1, true }, { 2, 40, 16, 32, 4, true },
}

local function name_of(s, bias, mask)
  return ("[%d, %d, %d] -> %d, %d head(s), %s, %s, %s"):format(s[1], s[2], s[3], s[4], s[5],
    s[6] and "out_proj" or "no out_proj", bias and "biases" or "no bias", mask or "causal")
end

-- the module of shape s: weights (and biases when bias), a mask buffer for
-- "full" (nothing hidden: SelfAttentionV2's attention) and "pattern" (a
-- non-causal 0/1 pattern with a fully hidden row); wo = the identity when eye
local function make(s, bias, mask, eye)
  local n, d_in, d_out = s[2], s[3], s[4]
  local r = { x = attn.randn(s[1], n, d_in), heads = s[5] }
  r.w = { attn.randn(d_out, d_in) * 0.4, attn.randn(d_out, d_in) * 0.4, attn.randn(d_out, d_in) * 0.4 }
  if bias then r.b = { attn.randn(d_out) * 0.3, attn.randn(d_out) * 0.3, attn.randn(d_out) * 0.3 } else r.b = {} end
  if s[6] then
    r.wo = eye and attn.eye(d_out) or attn.randn(d_out, d_out) * 0.3
    r.bo = bias and not eye and attn.randn(d_out) * 0.3 or nil
  end
  if mask == "full" then
    r.mask = attn.zeros(n, n)
  elseif mask == "pattern" then
    r.mask = attn.rand(n, n):gt(0.6) -- 0/1 float32
    for j = 1, n do r.mask[2][j] = 1 end -- row 2 sees no key: zeros, no NaN
  end
  r.scale = 1 / math.sqrt(d_out // s[5])
  return r
end

local function fargs(r, p)
  return r.x, r.x:size(3), r.x:size(2), 3, r.heads, r.scale, p, r.w[1], r.b[1], r.w[2], r.b[2], r.w[3], r.b[3],
    r.wo, r.bo, r.mask
end

-- out, and the gradients (dx, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo) with the
-- forward's kept state (keep) or recomputed; the same dropout stream both times
local function forward_backward(r, p, dout, keep)
  attn.manual_seed(31)
  local a = table.pack(fargs(r, p))
  a[17], a[18] = true, keep
  local f = table.pack(modules.attention_forward(table.unpack(a, 1, 18)))
  assert.is_not_nil(f[1], "the fused path took the call")
  a[17], a[18] = dout, f[2]
  for i = 1, 5 do a[18 + i] = keep and f[2 + i] or nil end
  return f, table.pack(modules.attention_backward(table.unpack(a, 1, 23)))
end

local GRADS = { "dx", "dwq", "dbq", "dwk", "dbk", "dwv", "dbv", "dwo", "dbo" }

-- Whether the backward of shape s runs its tiny direct loops (16 KiB of
-- stack scratch, at most 32768 multiply-adds of the forward): then the
-- forward keeps no state; every other call keeps it, tiny forwards included.
local function backward_is_tiny(s)
  local nb, n, d_in, d = s[1], s[2], s[3], s[4]
  local macs = nb * n * (3 * d_in * d + 2 * n * d + (s[6] and d * d or 0))
  return 8 * n * d + 2 * n * n + 2 * (n + d) <= 4096 and macs <= 32768
end

-- ---------------------------------------------------------------- float64 reference

local function zeros(r, c)
  local m = {}
  for i = 1, r do
    m[i] = {}
    for j = 1, c do m[i][j] = 0 end
  end
  return m
end

-- a [r, k] b^T (b [c, k]) + bias
local function linear(a, b, bias)
  local y = zeros(#a, #b)
  for i = 1, #a do
    for j = 1, #b do
      local s = bias and bias[j] or 0
      for k = 1, #a[i] do s = s + a[i][k] * b[j][k] end
      y[i][j] = s
    end
  end
  return y
end

-- the gradients of sum(out * dout) for one batch item's x [n, d_in] (tables),
-- module tables w, b, wo, bo, mask, scale, heads; added into acc
local function reference_item(x, dout, M, acc)
  local n, d_out = #x, #M.w[1]
  local hd = d_out // M.heads
  local qkv = { linear(x, M.w[1], M.b[1]), linear(x, M.w[2], M.b[2]), linear(x, M.w[3], M.b[3]) }
  local q, k, v = qkv[1], qkv[2], qkv[3]
  local c, dq, dk, dv = zeros(n, d_out), zeros(n, d_out), zeros(n, d_out), zeros(n, d_out)
  local probs = {}
  for h = 0, M.heads - 1 do
    probs[h] = {}
    for i = 1, n do
      local s, mx = {}, -math.huge
      for j = 1, n do
        local hidden = M.mask and M.mask[i][j] ~= 0 or (not M.mask and j > i)
        if hidden then s[j] = -math.huge else
          local acc_s = 0
          for d = 1, hd do acc_s = acc_s + q[i][h * hd + d] * M.scale * k[j][h * hd + d] end
          s[j] = acc_s
          mx = math.max(mx, acc_s)
        end
      end
      local p, sum = {}, 0
      for j = 1, n do
        p[j] = mx == -math.huge and 0 or math.exp(s[j] - mx)
        sum = sum + p[j]
      end
      for j = 1, n do p[j] = sum > 0 and p[j] / sum or 0 end
      probs[h][i] = p
      for d = 1, hd do
        local o = 0
        for j = 1, n do o = o + p[j] * v[j][h * hd + d] end
        c[i][h * hd + d] = o
      end
    end
  end
  local dc = dout
  if M.wo then
    dc = zeros(n, d_out)
    for i = 1, n do
      for j = 1, d_out do
        acc.dbo[j] = acc.dbo[j] + dout[i][j]
        for l = 1, d_out do
          acc.dwo[j][l] = acc.dwo[j][l] + dout[i][j] * c[i][l]
          dc[i][l] = dc[i][l] + dout[i][j] * M.wo[j][l]
        end
      end
    end
  end
  for h = 0, M.heads - 1 do
    for i = 1, n do
      local p, dp, rowsum = probs[h][i], {}, 0
      for j = 1, n do
        local t = 0
        for d = 1, hd do
          t = t + dc[i][h * hd + d] * v[j][h * hd + d]
          dv[j][h * hd + d] = dv[j][h * hd + d] + p[j] * dc[i][h * hd + d]
        end
        dp[j] = t
        rowsum = rowsum + t * p[j]
      end
      for j = 1, n do
        local ds = p[j] * (dp[j] - rowsum)
        for d = 1, hd do
          dq[i][h * hd + d] = dq[i][h * hd + d] + ds * M.scale * k[j][h * hd + d]
          dk[j][h * hd + d] = dk[j][h * hd + d] + ds * M.scale * q[i][h * hd + d]
        end
      end
    end
  end
  local dx = zeros(n, #x[1])
  for t, d in ipairs { dq, dk, dv } do
    for i = 1, n do
      for j = 1, d_out do
        acc.db[t][j] = acc.db[t][j] + d[i][j]
        for l = 1, #x[1] do
          acc.dw[t][j][l] = acc.dw[t][j][l] + d[i][j] * x[i][l]
          dx[i][l] = dx[i][l] + d[i][j] * M.w[t][j][l]
        end
      end
    end
  end
  return dx
end

-- the float64 gradients, as float32 tensors in GRADS's order (nil where absent)
local function reference(r, dout)
  local function tbl(t) return t and t:totable() end
  local M = { w = { tbl(r.w[1]), tbl(r.w[2]), tbl(r.w[3]) }, b = { tbl(r.b[1]), tbl(r.b[2]), tbl(r.b[3]) },
              wo = tbl(r.wo), mask = tbl(r.mask), scale = r.scale, heads = r.heads }
  local d_out, d_in = r.w[1]:size(1), r.w[1]:size(2)
  local acc = { dw = { zeros(d_out, d_in), zeros(d_out, d_in), zeros(d_out, d_in) }, dwo = zeros(d_out, d_out),
                db = { zeros(1, d_out)[1], zeros(1, d_out)[1], zeros(1, d_out)[1] }, dbo = zeros(1, d_out)[1] }
  local xs, ds, dx = r.x:totable(), dout:totable(), {}
  for b = 1, #xs do dx[b] = reference_item(xs[b], ds[b], M, acc) end
  local T = attn.tensor
  return { T(dx), T(acc.dw[1]), r.b[1] and T(acc.db[1]), T(acc.dw[2]), r.b[2] and T(acc.db[2]), T(acc.dw[3]),
           r.b[3] and T(acc.db[3]), r.wo and T(acc.dwo), r.bo and T(acc.dbo) }
end

-- ---------------------------------------------------------------- specs

describe("fused module backward: the recomputed state is the forward's", function()
  -- with out_proj = the identity (no bias) the forward's out is its context C
  -- exactly, and with dout one-hot on the diagonal (row i, column i) dWo =
  -- dout^T C has C's rows 1..min(n, d_out) of batch item 1 exactly (sums of
  -- one product by 1 and products by 0): the backward's C against the forward's
  for _, s in ipairs(SHAPES) do
    for _, bias in ipairs { false, true } do
      for _, p in ipairs { 0.0, 0.3 } do
        local shape = { s[1], s[2], s[3], s[4], s[5], true }
        it(name_of(shape, bias) .. (p > 0 and ", dropout" or ""), function()
          attn.manual_seed(41)
          local r = make(shape, bias, nil, true)
          local m = math.min(s[2], s[4])
          local dout = attn.zeros(s[1], s[2], s[4])
          for i = 1, m do dout[1][i][i] = 1 end
          local f, g = forward_backward(r, p, dout, false)
          local c_forward, c_backward = f[1][1]:narrow(1, 1, m), g[8]:narrow(1, 1, m)
          assert.is_true(attn.equal(c_backward, c_forward),
            ("the recomputed context differs from the forward's by up to %.3g"):format(
              (c_backward - c_forward):abs():max():item()))
        end)
      end
    end
  end
end)

describe("fused module backward: kept and recomputed state give the same gradient bits", function()
  for _, s in ipairs(SHAPES) do
    for _, bias in ipairs { false, true } do
      for _, mask in ipairs { false, "full", "pattern" } do
        it(name_of(s, bias, mask or nil), function()
          attn.manual_seed(42)
          local r = make(s, bias, mask or nil)
          local dout = attn.randn(s[1], s[2], s[4])
          for _, p in ipairs { 0.0, 0.25 } do
            local fk, gk = forward_backward(r, p, dout, true)
            local fr, gr = forward_backward(r, p, dout, false)
            assert.equal(not backward_is_tiny(s), fk[3] ~= nil, "the forward kept its state")
            assert.is_true(attn.equal(fk[1], fr[1]), "out")
            assert.equal(9, gk.n)
            for i = 1, 9 do
              if gr[i] == nil then
                assert.is_nil(gk[i], GRADS[i])
              else
                assert.is_true(attn.equal(gk[i], gr[i]), ("%s (dropout %g): kept and recomputed differ by up to %.3g")
                  :format(GRADS[i], p, (gk[i] - gr[i]):abs():max():item()))
              end
            end
            if p == 0 then
              -- both against float64: |a - b| <= 1e-5 |b| + 2e-5 max(1, max |b|)
              local want = reference(r, dout)
              for i = 1, 9 do
                assert.equal(want[i] == nil, gr[i] == nil, GRADS[i])
                if want[i] then
                  local b = want[i]:view(gr[i]:size())
                  local atol = 2e-5 * math.max(1, b:abs():max():item())
                  local worst = ((gr[i] - b):abs() - (b:abs() * 1e-5 + atol)):max():item()
                  assert(worst <= 0, ("%s: off the float64 reference by %.3g beyond the tolerance"):format(GRADS[i],
                    worst))
                end
              end
            end
          end
        end)
      end
    end
  end
end)

describe("fused module backward through the modules' own recorded calls", function()
  -- m(x) records the fused forward, which keeps its state unless its backward
  -- is tiny; its backward's gradients are the bits of attention_backward
  -- recomputing from nothing
  for _, c in ipairs {
    { "MultiHeadAttention [2, 24, 16], 4 heads", function() return attn.nn.MultiHeadAttention(16, 16, 24, 0.0, 4) end,
      { 2, 24, 16 } },
    { "CausalAttention [2, 24, 16], biases", function()
      return attn.nn.CausalAttention(16, 16, 24, 0.0, { qkv_bias = true }) end, { 2, 24, 16 } },
    { "MultiHeadAttention [2, 6, 3] (tiny)", function() return attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2) end,
      { 2, 6, 3 } },
    { "MultiHeadAttention [1, 32, 4] (a tiny forward, its backward not tiny)", function()
      return attn.nn.MultiHeadAttention(4, 8, 32, 0.0, 2, { qkv_bias = true }) end, { 1, 32, 4 } },
  } do
    it(c[1], function()
      attn.manual_seed(43)
      local m = c[2]()
      local x, dout = attn.randn(c[3]), attn.randn(c[3][1], c[3][2], m.d_out)
      local out = m(x)
      local loss = (out * dout):sum()
      loss:backward()
      local q, k, v, o = m.W_query, m.W_key, m.W_value, m.out_proj
      local heads = m.num_heads or 1
      local scale = m.scale or 1 / math.sqrt(m.d_out)
      local g = table.pack(modules.attention_backward(x, x:size(3), m.context_length, 3, heads, scale, 0.0,
        q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o and o.weight, o and o.bias, m.mask, dout, 0))
      local params = { q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o and o.weight, o and o.bias }
      for i = 1, 8 do
        if params[i] then
          assert.is_true(attn.equal(params[i].grad, g[i + 1]), GRADS[i + 1])
        end
      end
    end)
  end
end)
