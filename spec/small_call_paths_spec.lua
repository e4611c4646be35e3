-- The short paths that notebook-size calls take, and the calls next to them
-- that must still take the general ones: a small in-place op on contiguous
-- tensors of one shape runs as one row (src/core/elementwise.c), a recorded
-- call's inputs are scanned once unless a list or many tensors come
-- (src/binding/lua_autograd.c), a tensor's methods are looked up before its
-- fields (src/binding/lua_tensor.c), backward's implicit gradient is made
-- from the root's sizes (lua/attn/autograd/init.lua). No timing here
-- (scripts/bench.lua's tiny and tiny_train cases measure the speed).
local attn = require "attn"
local autograd = require "attn.autograd"

-- a + b rounded to float32 once, as a float32 add gives it: the sum of two
-- floats is exact in a double unless their exponents lie far apart (not so here)
local function f32_add(a, b) return (string.unpack("f", string.pack("f", a + b))) end

describe("a small in-place add on contiguous tensors of one shape", function()
  it("gives every element its float32 sum, the other operand unchanged", function()
    attn.manual_seed(5)
    local a, b = attn.randn(2, 6, 3), attn.randn(2, 6, 3)
    local a0, b0 = a:reshape({ 36 }):totable(), b:reshape({ 36 }):totable()
    a:add_(b)
    local got = a:reshape({ 36 }):totable()
    for i = 1, 36 do assert.equals(f32_add(a0[i], b0[i]), got[i]) end
    assert.same(b0, b:reshape({ 36 }):totable())
  end)

  it("adds a tensor to itself (the same memory, element by element)", function()
    local a = attn.tensor({ 1.5, -2, 3.25 })
    a:add_(a)
    assert.same({ 3, -4, 6.5 }, a:totable())
  end)

  it("still refuses an operand that overlaps part of the written tensor, as PyTorch 1.13", function()
    local a = attn.arange(1, 11)
    local ok, err = pcall(function() a:narrow(1, 1, 5):add_(a:narrow(1, 2, 5)) end)
    assert.is_false(ok)
    assert.truthy(err:find("the input overlaps the output", 1, true))
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, a:totable())
  end)

  it("takes a broadcast or transposed operand the general way, with the same sums", function()
    local a = attn.tensor({ { 1, 2 }, { 3, 4 } })
    a:add_(attn.tensor({ 10, 20 }))
    assert.same({ { 11, 22 }, { 13, 24 } }, a:totable())
    a:sub_(attn.tensor({ { 1, 2 }, { 3, 4 } }):t())
    assert.same({ { 10, 19 }, { 11, 20 } }, a:totable())
  end)

  it("accumulates a second backward's gradients into .grad of a notebook module, bit for bit", function()
    attn.manual_seed(123)
    local m = attn.nn.CausalAttention(3, 2, 6, 0.0)
    local x = attn.rand(2, 6, 3)
    m(x):sum():backward()
    local first = m.W_query.weight.grad:reshape({ 6 }):totable()
    m(x):sum():backward()
    local second = m.W_query.weight.grad:reshape({ 6 }):totable()
    for i = 1, 6 do assert.equals(f32_add(first[i], first[i]), second[i]) end
  end)
end)

describe("a recorded call's inputs", function()
  -- y = sum_i x_i; its backward gives input i the gradient g * i
  local function sum_of(n)
    return autograd.Function{
      name = "SumOfBackward0",
      forward = function(_, ...)
        local r = attn.zeros(1)
        for i = 1, select("#", ...) do
          local t = select(i, ...)
          if attn.is_tensor(t) then r = r + t end
        end
        return r
      end,
      backward = function(_, g)
        local grads = {}
        for i = 1, n do grads[i] = g * i end
        return table.unpack(grads, 1, n)
      end,
    }
  end

  it("are all recorded when more tensors come than one pass keeps (30)", function()
    local xs = {}
    for i = 1, 30 do xs[i] = attn.tensor({ i }):requires_grad_() end
    local y = sum_of(30)(table.unpack(xs))
    assert.equals(30, #y.grad_fn:next_functions())
    y:sum():backward()
    for i = 1, 30 do assert.same({ i }, xs[i].grad:totable()) end
  end)

  it("skip numbers and nil between tensors, and give an input without grad no edge", function()
    local a, b, c = attn.tensor({ 1 }):requires_grad_(), attn.tensor({ 2 }), attn.tensor({ 3 }):requires_grad_()
    local y = sum_of(3)(a, 2.5, nil, b, "x", c)
    local nf = y.grad_fn:next_functions()
    assert.same({ "AccumulateGrad", 0 }, nf[1])
    assert.same({ nil, 0 }, nf[2])
    assert.same({ "AccumulateGrad", 0 }, nf[3])
    y:backward()
    assert.same({ 1 }, a.grad:totable())
    assert.is_nil(b.grad)
    assert.same({ 3 }, c.grad:totable())
  end)

  it("record nothing when no input requires grad", function()
    local y = sum_of(2)(attn.tensor({ 1 }), attn.tensor({ 2 }))
    assert.is_nil(y.grad_fn)
    assert.is_false(y.requires_grad)
  end)
end)

describe("a tensor's index metamethod", function()
  it("gives methods before fields, and the fields still", function()
    local t = attn.rand(2, 3)
    local index = getmetatable(t).__index
    assert.equals(t.add, index(t, "add"))
    assert.same({ 2, 3 }, t.shape)
    assert.equals("float32", t.dtype)
    assert.is_nil(t.grad)
    assert.is_false(t.requires_grad)
    assert.is_nil(t.no_such_field)
  end)

  it("names the bad self of a field lookup", function()
    local index = getmetatable(attn.rand(1)).__index
    local ok, err = pcall(index, 1, "shape")
    assert.is_false(ok)
    assert.truthy(err:find("attn.Tensor index: bad argument #1 'self' (expected attn.Tensor, got number)", 1, true))
  end)
end)

describe("backward's implicit gradient", function()
  it("has the one-element root's shape ([1, 1] here), so x gets ones", function()
    local x = attn.tensor({ { 1, 2 }, { 3, 4 } }):requires_grad_()
    local y = x:sum(2, true):sum(1, true)
    assert.same({ 1, 1 }, y:size())
    y:backward()
    assert.same({ { 1, 1 }, { 1, 1 } }, x.grad:totable())
  end)

  it("is a fresh tensor each time: a second backward adds the same ones", function()
    local x = attn.tensor({ 2, 3 }):requires_grad_()
    local y = (x * 1):sum()
    y:backward(nil, { retain_graph = true })
    y:backward()
    assert.same({ 2, 2 }, x.grad:totable())
  end)
end)

describe("the fused module backward's gradients, returned without a list", function()
  -- every parameter's gradient from the fused call against the module-by-module
  -- path's (m:forward with need_weights runs module by module)
  local function check(m, x)
    m(x):sum():backward()
    local fused = {}
    for _, np in ipairs(m:named_parameters()) do fused[np[1]] = np[2].grad end
    m:zero_grad()
    m:forward(x, { need_weights = true }):sum():backward()
    local n = 0
    for _, np in ipairs(m:named_parameters()) do
      n = n + 1
      assert.is_not_nil(fused[np[1]], np[1])
      assert.is_true((fused[np[1]] - np[2].grad):abs():max():item() <= 1e-6, np[1])
    end
    return n
  end

  it("reach every parameter of a MultiHeadAttention (out_proj with its bias)", function()
    attn.manual_seed(3)
    assert.equals(5, check(attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2), attn.rand(2, 6, 3)))
  end)

  it("reach every parameter of a MultiHeadAttention whose out_proj has no bias", function()
    attn.manual_seed(3)
    local m = attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2)
    m.out_proj.bias = nil
    assert.equals(4, check(m, attn.rand(2, 6, 3)))
  end)

  it("reach every parameter of a CausalAttention", function()
    attn.manual_seed(3)
    assert.equals(3, check(attn.nn.CausalAttention(3, 2, 6, 0.0), attn.rand(2, 6, 3)))
  end)
end)
