-- The backward of the fused module forward (attn.core.modules.attention_backward,
-- src/core/modules_backward.c): the gradients of x and of every parameter of
-- CausalAttention- and MultiHeadAttention-shaped calls against torch 1.13
-- autograd in float64 (scripts/fixtures/make_sdpa_grad_fixtures.py): the tiny
-- path's sizes, the BLAS path, the flash kernel's, dropout with a seed, a
-- mask buffer with a fully hidden row; the same bits for 1 and 2 threads; bad input.
local attn = require "attn"
local modules = require("attn.core").modules

local cases = dofile("spec/fixtures/module_grad_cases.lua")
local fx = attn.load_safetensors("spec/fixtures/module_grad.safetensors")

-- |a - b| <= atol + rtol |b|, atol scaled by the reference's largest
-- magnitude (dx sums 3 d_out products of float32 rounding: 3e-5 at |dx| 97;
-- dbk, zero in exact arithmetic, comes out at 1e-5)
local function assert_close(a, b, rtol, atol, what)
  assert.same(b:size(), a:size(), what .. ": shape")
  atol = atol * math.max(1, b:abs():max():item())
  local worst = ((a - b):abs() - (b:abs() * rtol + atol)):max():item()
  assert(worst <= 0, ("%s: off by %.3g beyond the tolerance (max |diff| %.3g)"):format(what, worst,
    (a - b):abs():max():item()))
end

local PARAMS = { "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo" }

-- the argument list of attention_forward for case c (a mask buffer when the case has one)
local function args(c, override)
  local t = function(n) return (override and override[n]) or fx[c.name .. "." .. n] end
  local x = t "x"
  local d_in = x:size(-1)
  return x, d_in, 300, 0, c.heads, c.scale, c.dropout_p, t "wq", t "bq", t "wk", t "bk", t "wv", t "bv", t "wo",
    t "bo", c.has_mask and t "mask" or nil
end

local function forward_backward(c, override)
  if c.seed then attn.manual_seed(c.seed) end
  local a = table.pack(args(c, override))
  a[17], a.n = true, 17
  local out, draw = modules.attention_forward(table.unpack(a, 1, a.n))
  assert.is_not_nil(out, "the fused path took the call")
  a[17], a[18], a.n = fx[c.name .. ".dout"], draw, 18
  return out, table.pack(modules.attention_backward(table.unpack(a, 1, a.n)))
end

describe("fused module backward against torch 1.13 autograd", function()
  for _, c in ipairs(cases) do
    it(c.name, function()
      local out, g = forward_backward(c)
      assert_close(out, fx[c.name .. ".out"], 1e-5, 1e-5, "out")
      assert.equal(9, g.n)
      assert_close(g[1], fx[c.name .. ".dx"], 1e-5, 2e-5, "dx")
      for i, name in ipairs(PARAMS) do
        local ref = fx[c.name .. ".d" .. name]
        if ref then
          assert_close(g[i + 1], ref, 1e-5, 2e-5, "d" .. name)
        else
          assert.is_nil(g[i + 1], "d" .. name)
        end
      end
    end)
  end

  it("weights given as transposed (column-major) views give the same gradients", function()
    local c = cases[4]
    assert.equal("mha_blas", c.name)
    local override = {}
    for _, name in ipairs { "wq", "wk", "wv", "wo" } do override[name] = fx[c.name .. "." .. name]:t():contiguous():t() end
    local _, g = forward_backward(c, override)
    local _, ref = forward_backward(c)
    for i = 1, 9 do assert.is_true(attn.equal(g[i], ref[i]), "result " .. i) end
  end)

  it("a query row that sees no key (mask case, row 4): no NaN in any gradient", function()
    local c = cases[6]
    assert.equal("mha_mask", c.name)
    local _, g = forward_backward(c)
    for i = 1, 9 do
      if g[i] then assert.equal(0, g[i]:ne(g[i]):sum():item()) end
    end
  end)
end)

describe("the modules record through the fused forward and its C backward", function()
  -- the fused path (one C call forward, one backward) against the module-by-module path
  -- (forward_modules: Linear, scaled_dot_product_attention, ... each recorded), both through attn.autograd
  for _, spec in ipairs {
    { "CausalAttention", function() return attn.nn.CausalAttention(5, 4, 12, 0.0) end, { 2, 12, 5 }, "UnsafeViewBackward0" },
    { "CausalAttention, 2-D x", function() return attn.nn.CausalAttention(5, 4, 12, 0.0) end, { 12, 5 }, "MmBackward0" },
    { "MultiHeadAttention with qkv bias, dropout", function()
        return attn.nn.MultiHeadAttention(6, 8, 40, 0.25, 2, { qkv_bias = true }):train() end, { 3, 40, 6 },
      "ViewBackward0" },
    { "MultiHeadAttention, BLAS path", function() return attn.nn.MultiHeadAttention(32, 48, 64, 0.0, 4) end,
      { 2, 64, 32 }, "ViewBackward0" },
  } do
    it(spec[1], function()
      attn.manual_seed(8)
      local m = spec[2]()
      local x = attn.randn(spec[3], { requires_grad = true })
      local g = attn.randn(m:forward_modules(x:detach()):size())
      local function grads(forward)
        m:zero_grad()
        x.grad = nil
        attn.manual_seed(9)
        local y = forward(x)
        y:backward(g)
        local r = { y = y, x = x.grad, name = y.grad_fn:name(), edges = #y.grad_fn:next_functions() }
        for _, np in ipairs(m:named_parameters()) do r[np[1]] = np[2].grad end
        return r
      end
      local fused = grads(function(t) return m(t) end)
      local modules = grads(function(t) return m:forward_modules(t) end)
      assert.equal(spec[4], fused.name)
      -- one node for the whole module (x, every parameter, the mask buffer), not the last op of many
      assert.equal(#m:parameters() + 2, fused.edges)
      assert.are_not.equal(fused.edges, modules.edges)
      assert.is_true(attn.equal(fused.y, modules.y))
      assert_close(fused.x, modules.x, 1e-5, 2e-5, "x")
      for _, np in ipairs(m:named_parameters()) do
        assert_close(fused[np[1]], modules[np[1]], 1e-5, 2e-5, np[1])
      end
    end)
  end
end)

describe("the training forward keeps what the backward needs", function()
  -- attention_forward(..., true, true) returns qkv, o, c, saved, kernel and the backward takes them
  -- instead of recomputing: the forward's out and every gradient are the bits of the recomputing pair
  local function run(x, d_in, heads, p, w, b, wo, bo, keep)
    attn.manual_seed(11)
    local a = table.pack(x, d_in, x:size(2), 3, heads, 0.3, p, w[1], b, w[2], b, w[3], b, wo, bo, nil, true, keep)
    local r = table.pack(modules.attention_forward(table.unpack(a, 1, 18)))
    a[17], a[18] = attn.randn(x:size(1), x:size(2), w[1]:size(1)), r[2]
    for i = 1, 5 do a[18 + i] = r[2 + i] end
    return r, table.pack(modules.attention_backward(table.unpack(a, 1, 23)))
  end
  for _, c in ipairs {
    { "math kernel, out_proj, 4 heads, dropout", 2, 24, 16, 32, 4, 0.2, true, 1 },
    { "math kernel, no out_proj (CausalAttention), 1 head", 3, 31, 8, 12, 1, 0.0, false, 1 },
    { "math kernel, 1 head with out_proj, dropout", 2, 20, 16, 16, 1, 0.1, true, 1 },
    { "flash kernel, out_proj, 2 heads, dropout", 2, 300, 16, 16, 2, 0.2, true, 2 },
    { "flash kernel, no out_proj", 1, 260, 8, 8, 2, 0.0, false, 2 },
  } do
    it(c[1], function()
      attn.manual_seed(12)
      local nb, n, d_in, d_out, heads, p, has_wo, kernel = c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
      local x = attn.randn(nb, n, d_in)
      local w = { attn.randn(d_out, d_in) * 0.3, attn.randn(d_out, d_in) * 0.3, attn.randn(d_out, d_in) * 0.3 }
      local b = attn.randn(d_out)
      local wo, bo = has_wo and attn.randn(d_out, d_out) * 0.3 or nil, has_wo and attn.randn(d_out) or nil
      local kept, gk = run(x, d_in, heads, p, w, b, wo, bo, true)
      local plain, gp = run(x, d_in, heads, p, w, b, wo, bo, false)
      assert.equal(kernel, kept[7])
      assert.same({ 3, nb * n, d_out }, kept[3]:size())
      assert.same({ nb, heads, n, d_out // heads }, kept[4]:size())
      assert.equal(has_wo, kept[5] ~= nil)
      assert.same(kernel == 1 and { nb, heads, n, n } or { nb, heads, n }, kept[6]:size())
      assert.is_nil(plain[3])
      assert.is_true(attn.equal(kept[1], plain[1]), "out")
      -- the kept Q is the projection x Wq^T + b (an independent check of what was kept)
      local q = (x:reshape(nb * n, d_in):matmul(w[1]:t()) + b)
      assert.is_true((kept[3][1] - q):abs():max():item() <= 1e-5, "Q")
      assert.equal(gp.n, gk.n)
      for i = 1, 9 do
        if gp[i] then assert.is_true(attn.equal(gk[i], gp[i]), "gradient " .. i) else assert.is_nil(gk[i]) end
      end
    end)
  end

  it("a call whose backward is tiny keeps nothing (its backward recomputes)", function()
    local x, w = attn.randn(2, 6, 3), attn.randn(2, 3)
    local r = table.pack(modules.attention_forward(x, 3, 6, 3, 1, 0.5, 0.0, w, nil, w, nil, w, nil, nil, nil, nil,
      true, true))
    assert.equal(7, r.n)
    for i = 3, 7 do assert.is_nil(r[i]) end
  end)
end)

describe("fused module backward without x's gradient (want_dx = false)", function()
  -- the parameters' gradients are the bits of the call that also computes dx; dx is nil
  local function run(c, want_dx)
    if c.seed then attn.manual_seed(c.seed) end
    local a = table.pack(args(c))
    a[17] = true
    local _, draw = modules.attention_forward(table.unpack(a, 1, 17))
    a[17], a[18], a[24] = fx[c.name .. ".dout"], draw, want_dx
    return table.pack(modules.attention_backward(table.unpack(a, 1, 24)))
  end
  local function recomputing_args(x, w, b, wo, bo, dout, want_dx)
    return x, x:size(3), x:size(2), 3, 2, 0.3, 0.0, w, b, w, b, w, b, wo, bo, nil, dout, 0, nil, nil, nil, nil, nil,
      want_dx
  end
  for _, c in ipairs(cases) do
    it(c.name, function()
      local with, without = run(c, true), run(c, false)
      assert.equal(9, without.n)
      assert.is_not_nil(with[1])
      assert.is_nil(without[1])
      for i = 2, 9 do
        if with[i] then assert.is_true(attn.equal(with[i], without[i]), PARAMS[i - 1]) else assert.is_nil(without[i]) end
      end
    end)
  end
  it("a call past the tiny path, recomputing and with the kept state", function()
    attn.manual_seed(21)
    local x, w, b = attn.randn(2, 40, 16), attn.randn(16, 16) * 0.2, attn.randn(16)
    local wo, bo, dout = attn.randn(16, 16) * 0.2, attn.randn(16), attn.randn(2, 40, 16)
    local with = table.pack(modules.attention_backward(recomputing_args(x, w, b, wo, bo, dout)))
    local without = table.pack(modules.attention_backward(recomputing_args(x, w, b, wo, bo, dout, false)))
    local r = table.pack(modules.attention_forward(x, 16, 40, 3, 2, 0.3, 0.0, w, b, w, b, w, b, wo, bo, nil, true,
      true))
    local kept = table.pack(modules.attention_backward(x, 16, 40, 3, 2, 0.3, 0.0, w, b, w, b, w, b, wo, bo, nil, dout,
      r[2], r[3], r[4], r[5], r[6], r[7], false))
    assert.is_nil(without[1])
    assert.is_nil(kept[1])
    for i = 2, 9 do
      assert.is_true(attn.equal(with[i], without[i]), "recomputing " .. PARAMS[i - 1])
      -- the recomputed state is the forward's bits, so the gradients are too
      assert.is_true(attn.equal(with[i], kept[i]), "kept " .. PARAMS[i - 1])
    end
  end)
end)

describe("fused module backward: the same bits for 1 and 2 threads", function()
  local CHILD = [[
local attn = require "attn"
local modules = require("attn.core").modules
local dir = arg[1]
attn.manual_seed(3)
local x, dout = attn.randn(4, 200, 64), attn.randn(4, 200, 64)
local w = {}
for i = 1, 4 do w[i] = attn.randn(64, 64) * 0.1 end
local b = attn.randn(64)
local n = 0
for _, p in ipairs({ 0, 0.2 }) do
  attn.manual_seed(4)
  local _, draw = modules.attention_forward(x, 64, 200, 3, 4, 0.25, p, w[1], b, w[2], b, w[3], b, w[4], b, nil, true)
  local g = { modules.attention_backward(x, 64, 200, 3, 4, 0.25, p, w[1], b, w[2], b, w[3], b, w[4], b, nil, dout, draw) }
  for i = 1, 9 do n = n + 1; attn.save(g[i], dir .. "/" .. n .. ".npy") end
end
io.write("END ", n, "\n")
]]
  it("MultiHeadAttention-shaped, with and without dropout", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local dirs = {}
    for _, threads in ipairs { 1, 2 } do
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir " .. dir))
      dirs[threads] = dir
      local p = assert(io.popen(("OMP_NUM_THREADS=%d scripts/attn-lua %s %s 2>&1"):format(threads, script, dir)))
      local text = p:read("a")
      p:close()
      assert(text:find("END 18\n", 1, true), "child with " .. threads .. " threads failed: " .. text)
    end
    os.remove(script)
    local differ = {}
    for i = 1, 18 do
      local a = assert(io.open(dirs[1] .. "/" .. i .. ".npy", "rb")):read("a")
      local b = assert(io.open(dirs[2] .. "/" .. i .. ".npy", "rb")):read("a")
      if a ~= b then differ[#differ + 1] = i end
    end
    for _, threads in ipairs { 1, 2 } do os.execute("rm -rf " .. dirs[threads]) end
    assert.same({}, differ)
  end)
end)

describe("fused module backward: bad input", function()
  local c = cases[3]
  local B = "attn.core.modules.attention_backward: "
  local function call(...)
    local ok, e = pcall(modules.attention_backward, ...)
    assert.is_false(ok)
    return tostring(e)
  end
  it("dout of the wrong shape, a bad draw, arguments the forward would not take", function()
    local a = table.pack(args(c))
    a[17], a[18] = attn.zeros(2, 6, 3), 0
    assert.is_truthy(call(table.unpack(a, 1, 18)):find(
      B .. "bad argument #17 'dout' (expected the shape of out [2, 6, 2], got [2, 6, 3])", 1, true))
    a[7], a[17], a[18] = 0.25, fx[c.name .. ".dout"], -1 -- with dropout, the draw is read
    assert.is_truthy(call(table.unpack(a, 1, 18)):find(
      B .. "bad argument #18 'draw' (expected the forward's dropout draw: an integer in [0, 2^32), or its keep "
      .. "flags for 144 elements, got number)", 1, true))
    a[18] = "x"
    assert.is_truthy(call(table.unpack(a, 1, 18)):find(B .. "bad argument #18 'draw'", 1, true))
    a[7], a[18] = c.dropout_p, 0
    a[17] = nil
    assert.is_truthy(call(table.unpack(a, 1, 18)):find(B .. "bad argument #17 'dout' (expected attn.Tensor", 1, true))
    a[17] = fx[c.name .. ".dout"]
    a[5] = 3 -- heads that do not divide d_out
    assert.is_truthy(call(table.unpack(a, 1, 18)):find(
      B .. "arguments 1 to 16 are not those of a call attention_forward runs", 1, true))
    a[5] = c.heads
    assert.is_truthy(call(table.unpack(a, 1, 27)):find("no more than 26 arguments expected", 1, true))
  end)

  it("a kept state that does not fit the call", function()
    attn.manual_seed(5)
    local x, w = attn.randn(2, 24, 16), attn.randn(16, 16) * 0.2
    local a = table.pack(x, 16, 24, 3, 2, 0.25, 0.0, w, nil, w, nil, w, nil, w, nil, nil, true, true)
    local r = table.pack(modules.attention_forward(table.unpack(a, 1, 18)))
    assert.equal(7, r.n)
    a[17], a[18] = attn.randn(2, 24, 16), r[2]
    for i = 1, 5 do a[18 + i] = r[2 + i] end
    assert.equal(9, select("#", modules.attention_backward(table.unpack(a, 1, 23))))
    a[19] = attn.zeros(3, 80, 15)
    assert.is_truthy(call(table.unpack(a, 1, 23)):find(B .. "bad argument #19 'qkv' (expected the contiguous tensor "
      .. "of 2304 floats attention_forward kept for these sizes)", 1, true))
    a[19], a[22] = r[3], r[6]:narrow(4, 1, 20)
    assert.is_truthy(call(table.unpack(a, 1, 23)):find(B .. "bad argument #22 'saved'", 1, true))
    a[22], a[23] = r[6], 2
    assert.is_truthy(call(table.unpack(a, 1, 23)):find(B .. "bad argument #23 'kernel' (expected 1", 1, true))
  end)
end)
