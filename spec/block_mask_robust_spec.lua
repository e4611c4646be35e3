-- Robustness of block masks and the SDPA variants (issues #15 and #12): the
-- crashes and silent wrong answers the fuzzers found, one spec each.
local attn = require "attn"

describe("block_mask robustness", function()
  it("and_/or_ nested 64 deep, built and called inside a coroutine (a small Lua stack)", function()
    -- each nesting level holds 2 Lua stack slots while it evaluates its
    -- operands: without luaL_checkstack that ran past a coroutine's stack
    local bm = attn.block_mask
    local lua_fn = function(_, _, q, k) return attn.ones(1, 1) end
    local f, g = lua_fn, lua_fn
    for _ = 1, 63 do
      f = bm.and_(bm.causal, f)
      g = bm.or_(g, bm.sliding_window(2))
    end
    for _ = 1, 20 do
      local sparsity, called = coroutine.wrap(function()
        local m = bm(f, 1, 1, 16, 16, {block = 8})
        local vis = f(1, 1, attn.tensor({{1}, {2}}), attn.tensor({{1, 2, 3}}))
        return m:sparsity(), vis
      end)()
      assert.are.equal(0.25, sparsity) -- causal: the upper right block of 2 x 2 is empty
      assert.are.same({{1, 0, 0}, {1, 1, 0}}, called:totable())
      local m2 = coroutine.wrap(function() return bm(g, 1, 1, 16, 16, {block = 8}) end)()
      assert.are.equal(0, m2:sparsity())
    end
  end)
end)
