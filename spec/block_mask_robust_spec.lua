-- Robustness of block masks and the SDPA variants: the
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

describe("block_mask error objects", function()
  -- fn's error object is the user's: its __tostring may raise or return a
  -- non-string, and the message must still come from attn.block_mask
  local raising = setmetatable({}, { __tostring = function() error("tostring failed on purpose") end })
  local not_a_string = setmetatable({}, { __tostring = function() return {} end })
  local raising_a_table = setmetatable({}, { __tostring = function() error(raising) end })
  local cases = { { "raises", raising }, { "returns a table", not_a_string }, { "raises a table like itself", raising_a_table } }
  for _, case in ipairs(cases) do
    local what, obj = case[1], case[2]
    it("fn raising an object whose __tostring " .. what .. ": an attn.block_mask message", function()
      local ok, err = pcall(attn.block_mask, function() error(obj) end, 1, 1, 4, 4)
      assert.is_false(ok)
      assert.are.equal("string", type(err))
      assert.truthy(err:find("attn.block_mask: fn raised an error at b 1, h 1, query block 1, key block 1: "
        .. "a table whose __tostring failed", 1, true), err)
    end)
    it("an opts key whose __tostring " .. what .. ": an attn.block_mask message", function()
      local ok, err = pcall(attn.block_mask, attn.block_mask.causal, 1, 1, 4, 4, { [obj] = 1 })
      assert.is_false(ok)
      assert.are.equal("string", type(err))
      assert.truthy(err:find("attn.block_mask: bad argument #6 'opts' (unknown option 'a table whose __tostring failed'",
        1, true), err)
    end)
  end
  it("fn raising an object with a working __tostring: its text in the message", function()
    local obj = setmetatable({}, { __tostring = function() return "custom failure" end })
    local ok, err = pcall(attn.block_mask, function() error(obj) end, 1, 1, 4, 4)
    assert.is_false(ok)
    assert.truthy(err:find("attn.block_mask: fn raised an error at b 1, h 1, query block 1, key block 1: custom failure",
      1, true), err)
  end)
end)
