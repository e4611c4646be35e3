-- Where bench.lua's train_gpt step spends its time: process CPU time
-- (os.clock) of every call into the C core (attn.core's functions, the
-- Tensor methods and operators, attn.core.train, attn.core.modules) and of
-- every collectgarbage, by phase of the step (forward, loss, zero_grad,
-- backward, optimizer step), in the step with the least total time of
-- --steps steps (after one warm-up step). A phase's time not spent in those
-- calls is the Lua around them (modules, the autograd walk's bookkeeping).
-- CPU time, so run it on one thread (OMP_NUM_THREADS=1) for figures that
-- add up to the step:
--   OMP_NUM_THREADS=1 scripts/attn-lua scripts/train_gpt_breakdown.lua [--steps N]
-- The model and step are bench.lua's: GPTModel (vocab 256, context 128,
-- emb 128, 4 heads, 4 layers), batch 16, AdamW.
local steps = 10
local i = 1
while i <= #arg do
  if arg[i] == "--steps" and tonumber(arg[i + 1]) then steps = math.tointeger(tonumber(arg[i + 1])); i = i + 1
  else io.stderr:write("train_gpt_breakdown.lua: unknown argument " .. tostring(arg[i]) .. "\n"); os.exit(2) end
  i = i + 1
end

local core = require "attn.core"
local clock = os.clock
local acc, cnt = {}, {}
local phase = "setup"
local inside = false

-- fn timed under name (calls made while another timed call runs count in that one)
local function timed(name, fn)
  return function(...)
    if inside then return fn(...) end
    inside = true
    local t0 = clock()
    local r = table.pack(fn(...))
    local dt = clock() - t0
    inside = false
    local key = phase .. "\0" .. name
    acc[key] = (acc[key] or 0) + dt
    cnt[key] = (cnt[key] or 0) + 1
    return table.unpack(r, 1, r.n)
  end
end

-- before attn and its autograd capture the raw functions
local function wrap_table(t, prefix)
  for k, v in pairs(t) do
    if type(v) == "function" and not tostring(k):match("^_autograd") then t[k] = timed(prefix .. k, v) end
  end
end
wrap_table(core.train, "train.")
wrap_table(core.modules, "modules.")
wrap_table(core.Tensor, "")
for k, v in pairs(core) do
  if type(v) == "function" and core.Tensor[k] == nil and not k:match("^_autograd") then core[k] = timed(k, v) end
end
for _, mm in ipairs({ "__add", "__sub", "__mul", "__div", "__unm" }) do
  if core.Tensor_mt[mm] then core.Tensor_mt[mm] = timed(mm, core.Tensor_mt[mm]) end
end
collectgarbage = timed("collectgarbage", collectgarbage)

local attn = require "attn"
local g = dofile((arg[0]:match("^(.*)/") or ".") .. "/lib/bench_train_gpt.lua")()
local cfg, b, n, model, opt, x, y = g.cfg, g.b, g.n, g.model, g.opt, g.x, g.y

local PHASES = { "forward", "loss", "zero_grad", "backward", "step" }
local best
for s = 0, steps do
  for k in pairs(acc) do acc[k], cnt[k] = 0, 0 end
  local t = { clock() }
  phase = "forward"; local logits = model(x); t[2] = clock()
  phase = "loss"; local loss = attn.nn.functional.cross_entropy(logits:view(b * n, cfg.vocab_size), y); t[3] = clock()
  phase = "zero_grad"; opt:zero_grad(); t[4] = clock()
  phase = "backward"; loss:backward(); t[5] = clock()
  phase = "step"; opt:step(); t[6] = clock()
  phase = "setup"
  if s > 0 and (not best or t[6] - t[1] < best.total) then
    best = { total = t[6] - t[1], phase = {}, ops = {}, cnt = {} }
    for p = 1, #PHASES do best.phase[PHASES[p]] = t[p + 1] - t[p] end
    for k, v in pairs(acc) do best.ops[k], best.cnt[k] = v, cnt[k] end
  end
end

local function ms(v) return ("%.2f"):format(v * 1e3) end
print(("step %s ms (CPU time, the best of %d)"):format(ms(best.total), steps))
for _, p in ipairs(PHASES) do
  local keys, inner = {}, 0
  for k, v in pairs(best.ops) do
    if k:match("^(.-)%z") == p and v > 0 then keys[#keys + 1] = k; inner = inner + v end
  end
  table.sort(keys, function(u, v) return best.ops[u] > best.ops[v] end)
  print(("%-10s %8s ms"):format(p, ms(best.phase[p])))
  for _, k in ipairs(keys) do
    print(("  %-28s %8s ms  %5.1f%%  x%d"):format(k:match("%z(.*)$"), ms(best.ops[k]), 100 * best.ops[k] / best.total,
      best.cnt[k]))
  end
  print(("  %-28s %8s ms"):format("(Lua around the calls)", ms(best.phase[p] - inner)))
end
