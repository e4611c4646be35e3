-- Ring attention under mpirun (driven by spec/ring_attention_spec.lua):
--   mpirun -np N scripts/attn-lua spec/dist/ring_check.lua [errors]
-- Without arguments: every case of spec/dist/ring_cases.lua, forward and
-- backward against the whole sequence's attention computed on every rank;
-- each rank prints "ring rank R/N CASE: out E dq E dk E dv E ok|FAIL".
-- With "errors": calls that are wrong across ranks, each caught on every
-- rank (pcall) and printed as "ring rank R/N error CASE: MESSAGE"; the job
-- must go on to the next one (no hang, no abort).
local attn = require "attn"
local dist = require "attn.dist"
local K = dofile("spec/dist/ring_cases.lua")

dist.init()
local r, P = dist.rank(), dist.world_size()

if arg[1] == "errors" then
  local function try(name, fn)
    local ok, err = pcall(fn)
    print(("ring rank %d/%d error %s: %s"):format(r, P, name, ok and "none" or tostring(err)))
    io.stdout:flush()
  end
  try("shapes", function()
    local h = r == P and 3 or 2
    return dist.ring_attention(attn.randn(h, 4, 8), attn.randn(h, 4, 8), attn.randn(h, 4, 8))
  end)
  try("unequal zigzag", function()
    local n = r == 1 and 4 or 6
    return dist.ring_attention(attn.randn(n, 8), attn.randn(n, 8), attn.randn(n, 8), { layout = "zigzag" })
  end)
  try("is_causal", function()
    return dist.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8), { is_causal = r == 1 })
  end)
  -- and a good call after them: the ring is still in step
  local o = dist.ring_attention(attn.ones(4, 8), attn.ones(4, 8), attn.ones(4, 8))
  print(("ring rank %d/%d after errors: %s"):format(r, P, o:equal(attn.ones(4, 8)) and "ok" or "FAIL"))
  dist.finalize()
  return
end

for _, c in ipairs(K.cases(P)) do
  local e = K.check(dist, r, P, c)
  local good = e.out <= K.RTOL and e.dq <= K.RTOL and e.dk <= K.RTOL and e.dv <= K.RTOL
  print(("ring rank %d/%d %s: out %.3g dq %.3g dk %.3g dv %.3g %s"):format(r, P, c.name, e.out, e.dq, e.dk, e.dv,
    good and "ok" or "FAIL"))
  io.stdout:flush()
end
dist.finalize()
