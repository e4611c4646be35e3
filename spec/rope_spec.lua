-- attn.rope (rotary position embedding) and its raw backward attn._rope_backward
-- against PyTorch 1.13 float64 references of the models' formulas (Llama's
-- rotate_half, GPT-J's rotate_every_two; scripts/fixtures/make_rope_fixtures.py):
-- inputs redrawn from the fixture's seed (attn.randn is bit-compatible with
-- torch.randn), both styles, any positions, strided inputs; bad input.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FIX = dofile("spec/fixtures/rope_cases.lua")

local ATOL, RTOL = 1e-6, 1e-6

describe("attn.rope against PyTorch 1.13", function()
  for _, c in ipairs(FIX) do
    local function draw()
      attn.manual_seed(c.seed)
      local x = attn.randn(table.unpack(c.shape))
      local grad = attn.randn(table.unpack(c.shape))
      return x, grad
    end
    local opts = {style = c.style, base = c.base, positions = c.positions}
    it("forward: " .. c.name, function()
      local x = draw()
      C.close(attn.rope(x, opts), c.out, RTOL, ATOL, "out")
    end)
    it("backward (rotation by -theta) is torch autograd's x.grad: " .. c.name, function()
      local _, grad = draw()
      C.close(attn._rope_backward(grad, opts), c.dx, RTOL, ATOL, "dx")
    end)
  end

  it("positions as opts[1], as a tensor, or as a list give the same bits; a strided x too", function()
    attn.manual_seed(9)
    local x = attn.randn(3, 5, 8)
    local pos = {3, 1, 4, 1, 5}
    local a = attn.rope(x, {pos})
    C.same_bits(attn.rope(x, {positions = pos}), a)
    C.same_bits(attn.rope(x, {positions = attn.tensor(pos)}), a)
    local xt = x:transpose(1, 2):contiguous():transpose(1, 2) -- same values, other strides
    C.same_bits(attn.rope(xt, {pos}), a)
    -- default positions are 1..n, and position 1 is not rotated
    C.same_bits(attn.rope(x), attn.rope(x, {{1, 2, 3, 4, 5}}))
    C.same_bits(attn.rope(x:narrow(2, 1, 1)), x:narrow(2, 1, 1):contiguous())
  end)

  it("keeps each pair's norm (a rotation), for both styles", function()
    attn.manual_seed(10)
    local x = attn.randn(4, 16)
    for _, style in ipairs {"half", "interleaved"} do
      local y = attn.rope(x, {style = style, positions = {10, 200, 3000, 40000}}):totable()
      local xs = x:totable()
      for r = 1, 4 do
        for i = 1, 8 do
          local ia, ib = style == "half" and i or 2 * i - 1, style == "half" and i + 8 or 2 * i
          local nx = xs[r][ia] ^ 2 + xs[r][ib] ^ 2
          local ny = y[r][ia] ^ 2 + y[r][ib] ^ 2
          assert.is_true(math.abs(nx - ny) <= 1e-5 * (1 + nx), style)
        end
      end
    end
  end)

  it("bad input", function()
    local x = attn.randn(2, 4, 6)
    C.fails(function() attn.rope(attn.randn(2, 4, 5)) end, "attn.rope: bad argument #1 'x'", "E even", "[2, 4, 5]")
    C.fails(function() attn.rope(attn.randn(6)) end, "attn.rope: bad argument #1 'x'", "[6]")
    C.fails(function() attn.rope("x") end, "attn.rope: bad argument #1 'x'", "expected attn.Tensor")
    C.fails(function() attn.rope(x, 5) end, "attn.rope: bad argument #2 'opts'", "got number")
    C.fails(function() attn.rope(x, {positions = {1, 2, 3}}) end, "bad option 'positions'", "expected 4 numbers",
      "got 3")
    C.fails(function() attn.rope(x, {positions = attn.zeros(5)}) end, "bad option 'positions'", "[4]", "got [5]")
    C.fails(function() attn.rope(x, {positions = {1, 2, "3", 4}}) end, "bad option 'positions'", "string at 3")
    C.fails(function() attn.rope(x, {positions = {1, 2, 0 / 0, 4}}) end, "bad option 'positions'", "finite")
    C.fails(function() attn.rope(x, {positions = 7}) end, "bad option 'positions'", "got number")
    C.fails(function() attn.rope(x, {base = 0}) end, "bad option 'base'", "> 0")
    C.fails(function() attn.rope(x, {base = math.huge}) end, "bad option 'base'", "> 0")
    C.fails(function() attn.rope(x, {base = "1e4"}) end, "bad option 'base'", "got string")
    C.fails(function() attn.rope(x, {style = "neox"}) end, "bad option 'style'", "\"half\" or \"interleaved\"",
      "\"neox\"")
    C.fails(function() attn.rope(x, {stlye = "half"}) end, "attn.rope: unknown option 'stlye'")
    C.fails(function() attn.rope(x, {}, 3) end, "attn.rope: bad argument #3")
    C.fails(function() attn._rope_backward(attn.randn(3, 3)) end, "attn._rope_backward: bad argument #1 'grad'")
  end)
end)

describe("attn.rope under autograd", function()
  for _, c in ipairs(FIX) do
    it("x.grad of rope(x):backward(grad) is torch autograd's: " .. c.name, function()
      attn.manual_seed(c.seed)
      local x = attn.randn(table.unpack(c.shape))
      local grad = attn.randn(table.unpack(c.shape))
      attn.autograd.requires_grad_(x, true)
      local positions = c.positions and attn.tensor(c.positions) or nil
      local y = attn.rope(x, {style = c.style, base = c.base, positions = positions})
      assert.equal("RopeBackward0", y.grad_fn:name())
      if positions then positions:fill_(0) end -- changing the positions after the forward changes nothing
      y:backward(grad)
      C.close(x.grad, c.dx, RTOL, ATOL, "dx")
    end)
  end
  it("without grad the output has no history and the same bits", function()
    attn.manual_seed(3)
    local x = attn.randn(2, 5, 8)
    local a = attn.rope(x, {style = "interleaved"})
    assert.is_nil(a.grad_fn)
    attn.autograd.requires_grad_(x, true)
    C.same_bits(attn.rope(x, {style = "interleaved"}):detach(), a)
  end)
end)
