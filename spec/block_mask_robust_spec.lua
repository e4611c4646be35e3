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

describe("enable_gqa robustness", function()
  it("q's head dim broadcast by the mask (1 query head, 1 kv head, mask of 3 heads): every head reads kv head 1", function()
    -- with a group of 1 the kernels took the kv head from the broadcast head
    -- index, reading past k and v (here: into the other heads of their storage)
    attn.manual_seed(5)
    local lq, lk, e = 5, 7, 4
    local q = attn.randn(2, 1, lq, e)
    local kbase, vbase = attn.randn(2, 3, lk, e), attn.randn(2, 3, lk, e)
    local k, v = kbase:narrow(2, 1, 1), vbase:narrow(2, 1, 1)
    local mask = attn.rand(1, 3, lq, lk):gt(0.7)
    for _, kernel in ipairs({ "math", "flash" }) do
      local want = attn.scaled_dot_product_attention(q, k, v, { mask = mask, kernel = kernel })
      local got = attn.scaled_dot_product_attention(q, k, v, { mask = mask, kernel = kernel, enable_gqa = true })
      assert.are.same({ 2, 3, lq, e }, got:size())
      assert.is_true(attn.equal(want, got), kernel)
      local qr, kr, vr = q:clone():requires_grad_(), k:clone():requires_grad_(), v:clone():requires_grad_()
      attn.scaled_dot_product_attention(qr, kr, vr, { mask = mask, kernel = kernel, enable_gqa = true }):sum():backward()
      local qw, kw, vw = q:clone():requires_grad_(), k:clone():requires_grad_(), v:clone():requires_grad_()
      attn.scaled_dot_product_attention(qw, kw, vw, { mask = mask, kernel = kernel }):sum():backward()
      assert.is_true(attn.equal(qw.grad, qr.grad) and attn.equal(kw.grad, kr.grad) and attn.equal(vw.grad, vr.grad),
        kernel .. " gradients")
    end
  end)
end)
