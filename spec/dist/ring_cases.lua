-- The ring attention's checks on one rank, shared by the simulated ring
-- (spec/ring_attention_spec.lua) and MPI (spec/dist/ring_check.lua): every
-- rank makes the same whole q, k, v and upstream gradient from one seed,
-- computes the whole sequence's attention and its gradients locally with
-- attn.scaled_dot_product_attention, and compares its chunk of them with what
-- the ring gives it.
local attn = require "attn"

local K = {}

K.RTOL = 2e-6 -- max |ring - whole| over max |whole|, per tensor

-- The cases: both layouts, causal and not, over any world size P (n a
-- multiple of 2P for zigzag); lens: contiguous chunks of unequal sizes.
function K.cases(P)
  local list = {}
  for _, layout in ipairs{ "contiguous", "zigzag" } do
    for _, causal in ipairs{ false, true } do
      list[#list + 1] = { name = ("%s %s"):format(layout, causal and "causal" or "full"), layout = layout,
                          causal = causal, b = 2, h = 3, n = 2 * P * 7, e = 16, ev = 16 }
    end
  end
  -- E ~= Ev, a scale, 3-D tensors, chunks longer than the flash kernel's tiles
  list[#list + 1] = { name = "zigzag causal, Ev ~= E, scale", layout = "zigzag", causal = true, h = 2, n = 2 * P * 40,
                      e = 24, ev = 8, scale = 0.3 }
  list[#list + 1] = { name = "contiguous causal, 2-D", layout = "contiguous", causal = true, n = P * 70, e = 32,
                      ev = 32 }
  local lens = {}
  for j = 1, P do lens[j] = 3 + 4 * (j - 1) end
  for _, causal in ipairs{ false, true } do
    list[#list + 1] = { name = ("contiguous %s, unequal chunks"):format(causal and "causal" or "full"),
                        layout = "contiguous", causal = causal, b = 1, h = 2, lens = lens, e = 8, ev = 8 }
  end
  return list
end

local function shape(c, len, e)
  local s = {}
  if c.b then s[#s + 1] = c.b end
  if c.h then s[#s + 1] = c.h end
  s[#s + 1], s[#s + 2] = len, e
  return s
end

local function rel(got, want)
  local den = want:abs():max():item()
  return (got - want):abs():max():item() / (den > 0 and den or 1)
end

--- Run case c on rank r of P with the ring functions R; returns the
-- relative errors {out, dq, dk, dv}.
function K.check(R, r, P, c)
  attn.manual_seed(1234)
  local lens = c.lens
  if not lens then
    lens = {}
    for j = 1, P do lens[j] = c.n // P end
  end
  local n = 0
  for j = 1, P do n = n + lens[j] end
  local Q, Kt, V = attn.randn(shape(c, n, c.e)), attn.randn(shape(c, n, c.e)), attn.randn(shape(c, n, c.ev))
  local G = attn.randn(shape(c, n, c.ev))
  local q0, k0, v0 = Q:clone():requires_grad_(), Kt:clone():requires_grad_(), V:clone():requires_grad_()
  local ref = attn.scaled_dot_product_attention(q0, k0, v0, { is_causal = c.causal, scale = c.scale })
  ref:backward(G)
  local function part(x)
    if c.layout == "zigzag" then return R.zigzag_split(x, -2) end
    local at = 1
    for j = 1, r - 1 do at = at + lens[j] end
    return x:narrow(-2, at, lens[r])
  end
  local q, k, v = part(Q):requires_grad_(), part(Kt):requires_grad_(), part(V):requires_grad_()
  local out = R.ring_attention(q, k, v, { is_causal = c.causal, scale = c.scale, layout = c.layout })
  out:backward(part(G))
  return { out = rel(out, part(ref)), dq = rel(q.grad, part(q0.grad)), dk = rel(k.grad, part(k0.grad)),
           dv = rel(v.grad, part(v0.grad)) }
end

return K
