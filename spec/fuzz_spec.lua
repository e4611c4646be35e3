-- The fuzzer (scripts/fuzz.lua) in-process: random careless call sequences
-- for a few seeds must each end without a fuzz failure (every error a
-- non-empty message naming its function), and the message check itself must
-- reject what it is there to catch.
local fuzz = require "fuzz"

describe("scripts/fuzz.lua", function()
  for _, seed in ipairs { 7, 42, 1234 } do
    it("seed " .. seed .. ": 1000 calls, every error names its function", function()
      local lines = {}
      local s = fuzz.run { iterations = 1000, seed = seed, out = function(l) lines[#lines + 1] = l end }
      assert.is_nil(s.failure, s.failure)
      assert.are.equal(1000, s.calls)
      assert.are.equal(s.calls, s.ok + s.errors)
      -- a careless user hits both outcomes often
      assert.is_true(s.ok > 200 and s.errors > 200, ("ok %d, errors %d"):format(s.ok, s.errors))
    end)
  end

  it("is deterministic for a seed", function()
    local a = fuzz.run { iterations = 300, seed = 99 }
    local b = fuzz.run { iterations = 300, seed = 99 }
    local c = fuzz.run { iterations = 300, seed = 100 }
    assert.are.equal(300, #a.outcomes)
    assert.are.equal(a.outcomes, b.outcomes)
    assert.are_not.equal(a.outcomes, c.outcomes)
  end)

  it("flags messages that are not strings, empty, raw Lua errors or lacking the function's name", function()
    local ctx = { "view" }
    assert.truthy(fuzz.bad_message(nil, ctx))
    assert.truthy(fuzz.bad_message({}, ctx))
    assert.truthy(fuzz.bad_message("", ctx))
    assert.truthy(fuzz.bad_message("init.lua:3: attempt to index a nil value (local 'view')", ctx))
    assert.truthy(fuzz.bad_message("x.lua:1: bad argument #1 to 'view' (number expected)", ctx))
    assert.truthy(fuzz.bad_message("attn.reshape: shape [2] is invalid", ctx))
    assert.is_nil(fuzz.bad_message("x.lua:1: Tensor:view: shape [2] is invalid for input of size 5", ctx))
  end)
end)
