-- Hostile input: every public tensor function given garbage must raise a clear
-- Lua error naming itself, never crash; empty tensors go through every op;
-- memory stays bounded.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local garbage = {
  {"nil", nil}, {"string", "abc"}, {"table", {1, 2}}, {"function", print}, {"boolean", true},
}

-- name in messages, function(x) calling it with x as the tensor argument
local tensor_args = {
  {"Tensor:size", function(x) return attn.Tensor.size(x) end},
  {"Tensor:stride", function(x) return attn.Tensor.stride(x) end},
  {"Tensor:select", function(x) return attn.Tensor.select(x, 1, 1) end},
  {"Tensor:narrow", function(x) return attn.Tensor.narrow(x, 1, 1, 1) end},
  {"Tensor:view", function(x) return attn.Tensor.view(x, 2) end},
  {"Tensor:reshape", function(x) return attn.Tensor.reshape(x, 2) end},
  {"Tensor:transpose", function(x) return attn.Tensor.transpose(x, 1, 2) end},
  {"Tensor:t", function(x) return attn.Tensor.t(x) end},
  {"Tensor:permute", function(x) return attn.Tensor.permute(x, 1) end},
  {"Tensor:unsqueeze", function(x) return attn.Tensor.unsqueeze(x, 1) end},
  {"Tensor:squeeze", function(x) return attn.Tensor.squeeze(x) end},
  {"Tensor:expand", function(x) return attn.Tensor.expand(x, 2) end},
  {"Tensor:contiguous", function(x) return attn.Tensor.contiguous(x) end},
  {"Tensor:clone", function(x) return attn.Tensor.clone(x) end},
  {"attn.sum", function(x) return attn.sum(x) end},
  {"attn.mean", function(x) return attn.mean(x, 1) end},
  {"attn.max", function(x) return attn.max(x) end},
  {"attn.min", function(x) return attn.min(x, 1) end},
  {"attn.argmax", function(x) return attn.argmax(x) end},
  {"attn.softmax", function(x) return attn.softmax(x, 1) end},
  {"attn.log_softmax", function(x) return attn.log_softmax(x, 1) end},
  {"attn.masked_fill", function(x) return attn.masked_fill(x, attn.zeros(1), 0) end},
  {"attn.masked_fill", function(x) return attn.masked_fill(attn.zeros(1), x, 0) end},
  {"Tensor:masked_fill_", function(x) return attn.Tensor.masked_fill_(x, attn.zeros(1), 0) end},
  {"attn.triu", function(x) return attn.triu(x) end},
  {"attn.tril", function(x) return attn.tril(x, 1) end},
  {"Tensor:equal", function(x) return attn.Tensor.equal(attn.zeros(1), x) end},
  {"attn.matmul", function(x) return attn.matmul(x, attn.zeros(1)) end},
  {"attn.dot", function(x) return attn.dot(attn.zeros(1), x) end},
  {"Tensor:fill_", function(x) return attn.Tensor.fill_(x, 1) end},
  {"Tensor:zero_", function(x) return attn.Tensor.zero_(x) end},
  {"Tensor:copy_", function(x) return attn.Tensor.copy_(attn.zeros(1), x) end},
  {"Tensor:add_", function(x) return attn.Tensor.add_(x, 1) end},
  {"Tensor:mul_", function(x) return attn.Tensor.mul_(x, 1) end},
  {"attn.allclose", function(x) return attn.allclose(x, attn.zeros(1)) end},
}

describe("wrong types", function()
  for _, f in ipairs(tensor_args) do
    it(f[1] .. " rejects nil, strings, tables, functions and booleans as a tensor", function()
      for _, g in ipairs(garbage) do
        C.fails(function() return f[2](g[2]) end, f[1], g[1])
      end
    end)
  end
  it("number operands reject garbage in every operator and binary method", function()
    local t = attn.zeros(2)
    for _, op in ipairs{"add", "sub", "mul", "div", "pow", "eq", "ne", "gt", "lt", "ge", "le"} do
      for _, g in ipairs(garbage) do
        C.fails(function() return t[op](t, g[2]) end, "attn." .. op, "'other'", g[1])
      end
    end
  end)
  it("dims, indices and sizes reject garbage, NaN, inf and fractions", function()
    local t = attn.zeros(2, 3)
    for _, bad in ipairs{0 / 0, math.huge, 1.5, "1", true, print} do
      C.fails(function() return t:size(bad) end, "Tensor:size", "'dim'")
      C.fails(function() return t:select(1, bad) end, "Tensor:select", "'index'")
      C.fails(function() return t:narrow(1, bad, 1) end, "Tensor:narrow", "'start'")
      C.fails(function() return t:narrow(1, 1, bad) end, "Tensor:narrow", "'length'")
      C.fails(function() return t:transpose(bad, 1) end, "Tensor:transpose", "'dim'")
      C.fails(function() return t:view(bad, 6) end, "Tensor:view", "size #1")
      C.fails(function() return t:expand(bad, 2, 3) end, "Tensor:expand", "size #1")
      C.fails(function() return attn.ones(bad) end, "attn.ones", "size #1")
      C.fails(function() return attn.ones{2, bad} end, "attn.ones", "size #2")
    end
    C.fails(function() return t:view({6}, 1) end, "Tensor:view", "no further size")
    C.fails(function() return t:view{{6}} end, "Tensor:view", "size #1", "table")
  end)
end)

describe("dims out of range", function()
  local t = attn.zeros(2, 3, 4)
  local calls = {
    {"Tensor:size", function(d) return t:size(d) end},
    {"Tensor:stride", function(d) return t:stride(d) end},
    {"Tensor:select", function(d) return t:select(d, 1) end},
    {"Tensor:narrow", function(d) return t:narrow(d, 1, 1) end},
    {"Tensor:transpose", function(d) return t:transpose(1, d) end},
    {"Tensor:permute", function(d) return t:permute(1, 2, d) end},
    {"Tensor:squeeze", function(d) return t:squeeze(d) end},
    {"attn.sum", function(d) return t:sum(d) end},
    {"attn.max", function(d) return t:max(d) end},
    {"attn.argmax", function(d) return t:argmax(d) end},
    {"attn.softmax", function(d) return t:softmax(d) end},
    {"attn.cat", function(d) return attn.cat({t, t}, d) end},
  }
  for _, c in ipairs(calls) do
    it(c[1] .. " rejects dims 0, ndim + 1 and -ndim - 1", function()
      for _, d in ipairs{0, 4, -4, 100, math.mininteger} do
        C.fails(function() return c[2](d) end, c[1], "'dim'", "got " .. string.format("%d", d))
      end
    end)
  end
  it("unsqueeze and stack accept ndim + 1 but not ndim + 2", function()
    assert.same({2, 3, 4, 1}, t:unsqueeze(4):size())
    assert.same({2, 3, 4, 2}, attn.stack({t, t}, 4):size())
    C.fails(function() return t:unsqueeze(5) end, "Tensor:unsqueeze", "got 5")
    C.fails(function() return attn.stack({t, t}, -5) end, "attn.stack", "got -5")
  end)
end)

describe("out-of-range indices", function()
  it("select, narrow, [] and []= reject huge and negative indices", function()
    local t = attn.zeros(3, 2)
    for _, i in ipairs{4, -4, math.maxinteger, math.mininteger, 2 ^ 53} do
      C.fails(function() return t:select(1, i) end, "Tensor:select", "out of range")
      C.fails(function() return t[i] end, "attn.Tensor index", "out of range")
      C.fails(function() t[i] = 1 end, "attn.Tensor index assignment", "out of range")
      C.fails(function() return t:narrow(1, i, 1) end, "Tensor:narrow", "dim 1 of size 3")
    end
    C.fails(function() return t:narrow(1, 1, math.maxinteger) end, "Tensor:narrow", "exceeds")
    C.fails(function() return t:narrow(1, -1, math.maxinteger) end, "Tensor:narrow", "exceeds")
  end)
end)

describe("9-dim tensors (at most 8)", function()
  local t8 = attn.zeros(1, 1, 1, 1, 1, 1, 1, 2)
  it("cannot be created, viewed, unsqueezed, stacked or nested", function()
    C.fails(function() return attn.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1) end, "attn.zeros", "at most 8")
    C.fails(function() return attn.full({1, 1, 1, 1, 1, 1, 1, 1, 1}, 0) end, "attn.full", "at most 8")
    C.fails(function() return t8:view(1, 1, 1, 1, 1, 1, 1, 1, 2) end, "Tensor:view", "at most 8")
    C.fails(function() return t8:reshape{1, 1, 1, 1, 1, 1, 1, 2, 1} end, "Tensor:reshape", "at most 8")
    C.fails(function() return t8:unsqueeze(1) end, "Tensor:unsqueeze", "at most 8")
    C.fails(function() return t8:expand(1, 1, 1, 1, 1, 1, 1, 1, 2) end, "Tensor:expand", "at most 8")
    C.fails(function() return attn.stack({t8, t8}) end, "attn.stack", "at most 8")
    C.fails(function() return attn.tensor{{{{{{{{{0}}}}}}}}} end, "attn.tensor", "deeper than 8")
  end)
  it("8-dim tensors work through maths, reductions and matmul", function()
    local a = attn.ones(1, 2, 1, 1, 1, 1, 2, 3)
    assert.equal(24, (a + a):sum():item())
    assert.same({1, 2, 1, 1, 1, 1, 2, 2}, a:matmul(a:transpose(-1, -2)):size())
    assert.equal(3, a:matmul(a:transpose(-1, -2)):max():item())
    assert.same({1, 2, 1, 1, 1, 1, 2}, a:sum(-1):size())
  end)
end)

describe("empty tensors through every op", function()
  local e = attn.zeros(0, 3)
  it("views", function()
    assert.same({3, 0}, e:t():size())
    assert.same({0}, e:view(-1):size())
    assert.same({0, 1, 3}, e:unsqueeze(2):size())
    assert.same({3, 0}, e:permute(2, 1):size())
    assert.same({0, 3}, e:reshape(0, 3):size())
    assert.same({0, 3}, e:contiguous():size())
    assert.same({0, 3}, e:clone():size())
    assert.same({2, 0, 3}, e:expand(2, 0, 3):size())
    assert.same({0, 2}, e:narrow(2, 2, 2):size())
    assert.same({}, e:totable())
    C.fails(function() return e:view(0, -1) end, "Tensor:view", "invalid")
  end)
  it("maths, comparisons and in-place ops", function()
    for _, r in ipairs{e + e, e - 1, 2 * e, e / e, e ^ 2, -e, e:exp(), e:log(), e:sqrt(), e:tanh(), e:abs(),
                       e:eq(e), e:ne(0), e:gt(e), e:lt(1), e:ge(e), e:le(e), e:bool(), e + attn.zeros(3)} do
      assert.same({0, 3}, r:size())
    end
    assert.same({0, 3}, e:fill_(1):zero_():add_(1):mul_(2):copy_(attn.ones(3)):size())
    assert.same({0, 3}, e:masked_fill(attn.ones(3), 1):size())
    assert.same({0, 3}, attn.triu(e):size())
    assert.is_true(attn.allclose(e, e))
    assert.is_true(e:equal(attn.zeros(0, 3)))
  end)
  it("reductions, softmax, cat/stack and matmul", function()
    C.is(e:sum(1), {3}, {0, 0, 0})
    assert.same({0}, e:sum(2):size())
    assert.same({0, 3}, e:softmax(2):size())
    assert.same({0, 3}, e:log_softmax(1):size())
    assert.same({0, 3}, attn.cat({e, e}):size())
    assert.same({2, 0, 3}, attn.stack({e, e}):size())
    C.is(attn.zeros(2, 0):matmul(attn.zeros(0, 3)), {2, 3}, {0, 0, 0, 0, 0, 0})
    assert.same({0, 4}, e:matmul(attn.zeros(3, 4)):size())
  end)
end)

describe("memory", function()
  local function rss_mib()
    local f = assert(io.open("/proc/self/status"))
    local s = f:read("a")
    f:close()
    return tonumber(s:match("VmRSS:%s*(%d+)")) / 1024
  end
  it("20000 temporary 1 MiB tensors keep RSS under 400 MiB", function()
    -- the growth over what the process held before (the whole suite runs in one
    -- process, and under ASan its quarantine and earlier specs' heap count too)
    collectgarbage()
    local base, peak = rss_mib(), 0
    for i = 1, 20000 do
      local t = attn.full({262144}, i) -- 1 MiB of float32
      t = t + 1
      if i % 500 == 0 then peak = math.max(peak, rss_mib()) end
    end
    assert.is_true(peak > 0)
    assert.is_true(peak - base < 400, string.format("peak RSS %.0f MiB, %.0f MiB over the start", peak, peak - base))
  end)
  it("views of views of a collected base stay valid", function()
    local views = {}
    for k = 1, 20 do
      local base = attn.arange(100):view(10, 10)
      views[k] = base:t():narrow(1, 3, 2):select(2, 4):view(2, 1) -- base[4][3], base[4][4]
    end
    collectgarbage()
    collectgarbage()
    for k = 1, 20 do C.is(views[k], {2, 1}, {32, 33}) end
  end)
end)
