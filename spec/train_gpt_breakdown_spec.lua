-- scripts/train_gpt_breakdown.lua: the phases of bench.lua's train_gpt step
-- add up to the step, and each phase lists its core calls.
local function run(args)
  local p = assert(io.popen("OMP_NUM_THREADS=1 scripts/attn-lua scripts/train_gpt_breakdown.lua " .. args .. " 2>&1"))
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and 0 or code, out
end

describe("scripts/train_gpt_breakdown.lua", function()
  it("prints the step's phases, which add up to the step, and the core calls in each", function()
    local code, out = run("--steps 1")
    assert.are.equal(0, code, out)
    local total = tonumber(out:match("^step ([%d.]+) ms %(CPU time, the best of 1%)\n"))
    assert.is_not_nil(total, out)
    local sum = 0
    for _, p in ipairs({ "forward", "loss", "zero_grad", "backward", "step" }) do
      local v = tonumber(out:match("\n" .. p .. " +([%d.]+) ms\n"))
      assert.is_not_nil(v, p .. ": " .. out)
      sum = sum + v
    end
    assert.is_true(math.abs(sum - total) <= 0.05, out) -- each printed to 0.01 ms
    -- the Linear layers with a bias in the forward, 4 fused attention modules each way, AdamW per parameter
    assert.is_truthy(out:find("\n  train.linear +[%d.]+ ms +[%d.]+%% +x8\n"), out)
    assert.is_truthy(out:find("\n  modules.attention_forward +[%d.]+ ms +[%d.]+%% +x4\n"), out)
    assert.is_truthy(out:find("\n  modules.attention_backward +[%d.]+ ms +[%d.]+%% +x4\n"), out)
    assert.is_truthy(out:find("\n  train.adam_step +[%d.]+ ms +[%d.]+%% +x57\n"), out)
  end)

  it("refuses an unknown argument", function()
    local code, out = run("--bogus")
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("train_gpt_breakdown.lua: unknown argument --bogus", 1, true), out)
  end)
end)
