-- What the scripts under spec/dist/ share: each check prints
-- "ok <name>" or "FAIL <name>: <detail>" with its rank, for spec/dist_spec.lua to read.
local attn = require "attn"
local dist = require "attn.dist"

local M = {}

function M.start()
  dist.init()
  M.rank, M.world = dist.rank(), dist.world_size()
  return M.rank, M.world
end

function M.report(name, ok, detail)
  io.stdout:write(("rank %d %s %s%s\n"):format(M.rank, ok and "ok" or "FAIL", name,
    ok and "" or (": " .. tostring(detail))))
  io.stdout:flush()
end

-- equal within rel (0: the same bits), shapes included
function M.close(name, got, want, rel)
  local same_shape = table.concat(got:size(), ",") == table.concat(want:size(), ",")
  if not same_shape then
    return M.report(name, false, ("shape [%s] expected [%s]"):format(table.concat(got:size(), ","),
      table.concat(want:size(), ",")))
  end
  local g, w = got:contiguous():view(-1):totable(), want:contiguous():view(-1):totable()
  for i = 1, #w do
    local err = math.abs(g[i] - w[i])
    if (rel == 0 and g[i] ~= w[i]) or err > (rel or 0) * math.max(1, math.abs(w[i])) then
      return M.report(name, false, ("element %d is %.9g, expected %.9g"):format(i, g[i], w[i]))
    end
  end
  M.report(name, true)
end

-- error raised by fn(...) must contain every pattern (plain text)
function M.raises(name, texts, fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then return M.report(name, false, "no error") end
  err = tostring(err)
  for _, t in ipairs(texts) do
    if not err:find(t, 1, true) then return M.report(name, false, ("message %q lacks %q"):format(err, t)) end
  end
  M.report(name, true)
end

-- rank q's data for a test: the same on every rank, from its own seed
function M.data_of(q, seed, ...)
  local g = attn.get_rng_state()
  attn.manual_seed(seed * 100 + q)
  local t = attn.randn(...)
  attn.set_rng_state(g)
  return t
end

return M
