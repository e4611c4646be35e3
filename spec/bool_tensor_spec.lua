-- Bool tensors, as PyTorch 1.13's torch.bool: which ops make them, what
-- arithmetic on them gives, how they print, load and save; and PyTorch's masks:
-- scaled_dot_product_attention's attn_mask (against the older mask and bias
-- options and against torch 1.13's _scaled_dot_product_attention, fixture
-- spec/fixtures/attn_mask_cases.lua from
-- scripts/fixtures/make_attn_mask_fixtures.py) and nn.MultiheadAttention's
-- masks read by their dtype.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local SDPA = attn.scaled_dot_product_attention

local function is_bool(t) return t.dtype == "bool" end

local function values(t) return t:reshape(-1):totable() end

describe("bool tensors: what makes them", function()
  local x = attn.tensor { { 1, -2, 0 }, { 3, 0 / 0, 0 } }

  it("comparisons give bool tensors of 1 where true, as PyTorch 1.13's ==, <, ... (a number or a tensor)", function()
    for _, name in ipairs { "eq", "ne", "lt", "le", "gt", "ge" } do
      local r = x[name](x, 0)
      assert.are.equal("bool", r.dtype, name)
      local r2 = attn[name](x, attn.zeros(3))
      assert.are.equal("bool", r2.dtype, name .. " with a tensor")
      assert.are.same(values(r), values(r2), name)
    end
    assert.are.same({ 0, 0, 1, 0, 0, 1 }, values(x:eq(0)))
    assert.are.same({ 1, 0, 0, 1, 0, 0 }, values(x:gt(0)))
    assert.are.equal("float32", x.dtype)
  end)

  it("t:bool() is true where t is nonzero (NaN included), as PyTorch 1.13's t.bool()", function()
    local b = x:bool()
    assert.is_true(is_bool(b))
    assert.are.same({ 1, 1, 0, 1, 1, 0 }, values(b))
  end)

  it("logical_and/or/xor/not give bool tensors, nonzero being true, as PyTorch 1.13's", function()
    local a, b = attn.tensor { 0, 2, 0, -1 }, attn.tensor { 0, 0, 3, 0 / 0 }
    local cases = {
      { attn.logical_and(a, b), { 0, 0, 0, 1 } },
      { a:logical_or(b), { 0, 1, 1, 1 } },
      { a:logical_xor(b), { 0, 1, 1, 0 } },
      { a:logical_not(), { 1, 0, 1, 0 } },
      { attn.logical_and(a, 5), { 0, 1, 0, 1 } },
    }
    for i, c in ipairs(cases) do
      assert.is_true(is_bool(c[1]), "case " .. i)
      assert.are.same(c[2], values(c[1]), "case " .. i)
    end
  end)

  it("attn.tensor of Lua booleans is a bool tensor, as torch.tensor([True, False]); a number makes it float", function()
    local b = attn.tensor { { true, false }, { false, true } }
    assert.is_true(is_bool(b))
    assert.are.same({ 1, 0, 0, 1 }, values(b))
    assert.is_true(is_bool(attn.tensor(true)))
    local mixed = attn.tensor { true, 2 } -- torch.tensor([True, 2]) is tensor([1, 2]), an integer one
    assert.are.equal("float32", mixed.dtype)
    assert.are.same({ 1, 2 }, values(mixed))
    assert.are.equal("float32", attn.tensor({}).dtype)
    assert.are.equal("float32", attn.tensor { 1, 0 }.dtype)
  end)

  it("creation functions and float ops give float tensors", function()
    for _, t in ipairs { attn.zeros(2), attn.ones(2), attn.rand(2), attn.arange(3), attn.eye(2), attn.full({ 2 }, 1) } do
      assert.are.equal("float32", t.dtype)
    end
  end)
end)

describe("bool tensors: views and copies keep the kind, as PyTorch 1.13", function()
  local m = attn.tensor { { 1, 0, 1 }, { 0, 0, 1 } }:bool()

  it("every view of a bool tensor is bool", function()
    local views = {
      m:select(1, 2), m:narrow(2, 2, 2), m:view(3, 2), m:reshape(6), m:transpose(1, 2), m:t(),
      m:permute(2, 1), m:unsqueeze(1), m:view(1, 2, 3):squeeze(), m:view(2, 1, 3):expand(2, 4, 3), m[1],
      m:detach(), (m:chunk(2, 2)), (select(2, m:split(1, 1))), m:view_as(attn.zeros(3, 2)),
    }
    for i, v in ipairs(views) do assert.are.equal("bool", v.dtype, "view " .. i) end
    assert.are.equal(1, m[{ 1, 3 }]) -- one element: a number, 1 for true
  end)

  it("clone, contiguous, a copying reshape, attn.tensor(t), cat and stack of bools keep bool", function()
    local tr = m:t()
    for i, c in ipairs { m:clone(), tr:contiguous(), tr:reshape(6), attn.tensor(m), attn.cat({ m, m }, 1),
                         attn.stack({ m, m }, 1) } do
      assert.are.equal("bool", c.dtype, "copy " .. i)
    end
    assert.are.same({ 1, 0, 0, 0, 1, 1 }, values(tr:contiguous()))
    -- a float part makes the join float, as PyTorch's promotion
    assert.are.equal("float32", attn.cat({ m, attn.zeros(2, 3) }, 1).dtype)
  end)

  it("triu/tril, masked_fill, where, index_select and gather of bools stay bool, as PyTorch 1.13", function()
    assert.is_true(is_bool(attn.triu(attn.ones(3, 3):bool(), 1)))
    assert.are.same({ 0, 1, 1, 0, 0, 1, 0, 0, 0 }, values(attn.triu(attn.ones(3, 3):bool(), 1)))
    assert.is_true(is_bool(attn.tril(m)))
    local f = m:masked_fill(attn.tensor { 1, 1, 0 }:bool(), 2) -- the value 2 is true in a bool
    assert.is_true(is_bool(f))
    assert.are.same({ 1, 1, 1, 1, 1, 1 }, values(f))
    assert.is_true(is_bool(attn.where(m, m, m:logical_not())))
    assert.are.equal("float32", attn.where(m, m, 0).dtype)
    assert.is_true(is_bool(m:index_select(2, attn.tensor { 3, 1 })))
    assert.is_true(is_bool(m:gather(2, attn.tensor { { 1 }, { 3 } })))
  end)

  it("writes into a bool tensor store 0 or 1, nonzero being true, as PyTorch 1.13's copy_ and fill_", function()
    local b = attn.zeros(4):bool()
    b:copy_(attn.tensor { 0.5, 0, -2, 0 / 0 })
    assert.are.same({ 1, 0, 1, 1 }, values(b))
    b:fill_(0)
    assert.are.same({ 0, 0, 0, 0 }, values(b))
    b[2] = 7
    assert.are.same({ 0, 1, 0, 0 }, values(b))
    b:masked_fill_(attn.tensor { 1, 0, 0, 0 }, 3)
    assert.are.same({ 1, 1, 0, 0 }, values(b))
    assert.is_true(is_bool(b))
  end)
end)

describe("bool tensors: arithmetic, as PyTorch 1.13's type promotion", function()
  local a, b = attn.tensor { true, true, false, false }, attn.tensor { true, false, true, false }

  it("bool + bool is a bool (logical or), bool * bool a bool (logical and), as in PyTorch", function()
    local s, p = a + b, a * b
    assert.is_true(is_bool(s))
    assert.are.same({ 1, 1, 1, 0 }, values(s)) -- torch: tensor([ True,  True,  True, False])
    assert.is_true(is_bool(p))
    assert.are.same({ 1, 0, 0, 0 }, values(p)) -- torch: tensor([ True, False, False, False])
    assert.is_true(is_bool(attn.maximum(a, b)))
    assert.is_true(is_bool(attn.minimum(a, b)))
  end)

  it("a bool with a number or a float tensor gives float (torch: bool + 1 is int64)", function()
    local cases = { { a + 1, { 2, 2, 1, 1 } }, { a * 0.5, { 0.5, 0.5, 0, 0 } }, { a + attn.ones(4), { 2, 2, 1, 1 } },
                    { 1 - a, { 0, 0, 1, 1 } }, { a / b, { 1, math.huge, 0, 0 / 0 } }, { a:exp(), nil } }
    for i, c in ipairs(cases) do
      assert.are.equal("float32", c[1].dtype, "case " .. i)
      if c[2] then
        local got = values(c[1])
        for j = 1, 4 do
          if c[2][j] ~= c[2][j] then assert.is_true(got[j] ~= got[j]) else assert.are.equal(c[2][j], got[j]) end
        end
      end
    end
  end)

  it("refuses bool - bool and -bool, as PyTorch 1.13 does, pointing at logical_xor / logical_not", function()
    C.fails(function() return a - b end, "attn.sub: subtraction of two bool tensors is not supported", "logical_xor")
    C.fails(function() return -a end, "attn.neg: negation of a bool tensor is not supported", "logical_not")
  end)

  it("in place: a bool self takes bool results and refuses float ones, as PyTorch 1.13", function()
    local x = a:clone()
    x:add_(b)
    assert.is_true(is_bool(x))
    assert.are.same({ 1, 1, 1, 0 }, values(x))
    x:mul_(b)
    assert.are.same({ 1, 0, 1, 0 }, values(x))
    C.fails(function() x:add_(1) end, "Tensor:add_: the result is float, which cannot be written into a bool self")
    C.fails(function() x:mul_(attn.ones(4)) end, "Tensor:mul_", "bool self")
    assert.are.same({ 1, 0, 1, 0 }, values(x)) -- untouched by the refused writes
    local f = attn.ones(4)
    f:add_(a) -- a float self takes a bool other
    assert.are.same({ 2, 2, 1, 1 }, values(f))
  end)

  it("t:float() converts a bool to a new float tensor of 0 and 1; a float tensor is returned itself", function()
    local f = a:float()
    assert.are.equal("float32", f.dtype)
    assert.are.same({ 1, 1, 0, 0 }, values(f))
    f:add_(1) -- a copy: a is untouched
    assert.are.same({ 1, 1, 0, 0 }, values(a))
    local y = attn.ones(2)
    assert.are.equal(y, y:float())
    C.fails(function() return attn.Tensor.float(3) end,
      "Tensor:float: bad argument #1 'self' (expected attn.Tensor, got number)")
  end)

  it("sum and mean of a bool are float counts (torch: sum is int64); max, argmax work on 0 and 1", function()
    local m = attn.tensor { { true, false, true }, { false, false, true } }
    local s = m:sum()
    assert.are.equal("float32", s.dtype)
    assert.are.equal(3, s:item())
    assert.are.same({ 1, 0, 2 }, values(m:sum(1)))
    assert.are.equal(0.5, m:mean():item())
    assert.are.same({ 1, 3 }, values(m:argmax(2))) -- torch 1.13 refuses argmax of a bool
    assert.are.equal("float32", m:max().dtype)
  end)

  it("a bool tensor cannot require grad, as in PyTorch ('only Tensors of floating point dtype')", function()
    C.fails(function() a:clone():requires_grad_() end, "only float tensors can require gradients")
    C.fails(function() attn.tensor({ true }, { requires_grad = true }) end, "only float tensors can require gradients")
    -- a float tensor that requires grad, masked by a comparison, records as before
    local x = attn.tensor({ 1, -2, 3 }, { requires_grad = true })
    local y = (x * x:gt(0)):sum()
    y:backward()
    assert.are.same({ 1, 0, 1 }, values(x.grad))
    assert.are.equal("tensor(4., grad_fn=<SumBackward0>)", tostring(y))
  end)
end)

describe("bool tensors: printing, as PyTorch 1.13's str(t)", function()
  -- the expected strings are torch 1.13's str() of the same tensors (printed
  -- with /usr/bin/python3, torch 1.13; the torch expression in each comment)
  local cases = {
    { attn.tensor { true, false }, "tensor([ True, False])" }, -- torch.tensor([True, False])
    { attn.tensor { true, true, true }, "tensor([True, True, True])" },
    { attn.tensor { false, false }, "tensor([False, False])" },
    { attn.tensor(true), "tensor(True)" },
    { attn.tensor(false), "tensor(False)" },
    { attn.zeros(0):bool(), "tensor([], dtype=torch.bool)" },
    { attn.zeros(0, 3):bool(), "tensor([], size=(0, 3), dtype=torch.bool)" },
    -- torch.arange(6).view(2, 3) % 2 == 0
    { attn.arange(6):view(2, 3):remainder(2):eq(0), "tensor([[ True, False,  True],\n        [False,  True, False]])" },
    -- torch.arange(24).view(2, 3, 4) % 3 == 1
    { attn.arange(24):view(2, 3, 4):remainder(3):eq(1),
      "tensor([[[False,  True, False, False],\n         [ True, False, False,  True],\n         [False, False,  True, False]],\n\n"
      .. "        [[False,  True, False, False],\n         [ True, False, False,  True],\n         [False, False,  True, False]]])" },
    -- torch.arange(2000) % 3 == 0
    { attn.arange(2000):remainder(3):eq(0), "tensor([ True, False, False,  ..., False,  True, False])" },
    -- torch.arange(30) % 4 == 0
    { attn.arange(30):remainder(4):eq(0),
      "tensor([ True, False, False, False,  True, False, False, False,  True, False,\n"
      .. "        False, False,  True, False, False, False,  True, False, False, False,\n"
      .. "         True, False, False, False,  True, False, False, False,  True, False])" },
    -- torch.arange(2000).view(40, 50) % 7 == 0
    { attn.arange(2000):view(40, 50):remainder(7):eq(0),
      "tensor([[ True, False, False,  ..., False, False,  True],\n"
      .. "        [False, False, False,  ..., False,  True, False],\n"
      .. "        [False, False, False,  ...,  True, False, False],\n"
      .. "        ...,\n"
      .. "        [False, False, False,  ...,  True, False, False],\n"
      .. "        [False, False, False,  ..., False, False, False],\n"
      .. "        [False, False, False,  ..., False, False, False]])" },
  }
  for i, c in ipairs(cases) do
    it("case " .. i .. ": " .. c[2]:gsub("\n.*", " ..."), function()
      assert.are.equal(c[2], tostring(c[1]))
      assert.are.equal(c[2], attn.format(c[1]))
    end)
  end

  it("a float tensor of 0 and 1 still prints as float (the kind, not the values, decides)", function()
    assert.are.equal("tensor([1., 0.])", tostring(attn.tensor { 1, 0 }))
    assert.are.equal("tensor([1., 0.])", tostring(attn.tensor { true, false }:float()))
  end)
end)

describe("bool tensors: files", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  local m = attn.tensor { { true, false, true }, { false, false, true } }

  it("a NumPy '|b1' file loads as a bool tensor (spec/fixtures/npy/b1_2x2.npy, written by numpy)", function()
    local b = attn.load("spec/fixtures/npy/b1_2x2.npy")
    assert.is_true(is_bool(b))
    assert.are.same({ 1, 0, 0, 1 }, values(b))
  end)

  it("a bool tensor saves as '|b1' .npy and loads back bool; a float one stays '<f4'", function()
    local path = dir .. "/m.npy"
    attn.save(m:t(), path) -- strided: written in C order
    local f = assert(io.open(path, "rb"))
    local bytes = f:read("a")
    f:close()
    assert.is_truthy(bytes:find("'descr': '|b1'", 1, true))
    assert.are.equal("\1\0\0\0\1\1", bytes:sub(-6)) -- one byte per element, m:t() in row-major order
    local back = attn.load(path)
    assert.is_true(is_bool(back))
    assert.is_true(back:equal(m:t()))
    attn.save(m:float(), path)
    assert.are.equal("float32", attn.load(path).dtype)
  end)

  it("a bool tensor saves as safetensors BOOL and loads back bool, beside F32 tensors", function()
    local path = dir .. "/m.safetensors"
    attn.save_safetensors(path, { mask = m, w = attn.ones(2) })
    local f = assert(io.open(path, "rb"))
    local bytes = f:read("a")
    f:close()
    assert.is_truthy(bytes:find('"mask":{"dtype":"BOOL","shape":[2,3]', 1, true))
    local t = attn.load_safetensors(path)
    assert.is_true(is_bool(t.mask))
    assert.is_true(t.mask:equal(m))
    assert.are.equal("float32", t.w.dtype)
  end)
end)

-- ---- scaled_dot_product_attention's attn_mask ---------------------------

describe("scaled_dot_product_attention attn_mask, PyTorch's meaning", function()
  attn.manual_seed(21)
  local q, k, v = attn.randn(2, 3, 4, 8), attn.randn(2, 3, 6, 8), attn.randn(2, 3, 6, 8)
  local allowed = attn.rand(4, 6):gt(0.3)
  allowed[{ 1, 1 }] = 1 -- every row keeps a key
  allowed[{ 2, 1 }] = 1
  allowed[{ 3, 1 }] = 1
  allowed[{ 4, 1 }] = 1
  local added = attn.randn(2, 1, 4, 6)

  for _, kernel in ipairs { "math", "flash" } do
    it("a bool attn_mask (true = may attend) is the same bits as mask = its logical_not (" .. kernel .. ")", function()
      local got = SDPA(q, k, v, { attn_mask = allowed, kernel = kernel })
      C.same_bits(got, SDPA(q, k, v, { mask = allowed:logical_not(), kernel = kernel }))
      -- and not the bits of the opposite reading
      assert.is_false(got:equal(SDPA(q, k, v, { mask = allowed, kernel = kernel })))
    end)

    it("a float attn_mask is added: the same bits as bias (" .. kernel .. ")", function()
      C.same_bits(SDPA(q, k, v, { attn_mask = added, kernel = kernel }), SDPA(q, k, v, { bias = added, kernel = kernel }))
    end)
  end

  it("a float attn_mask of 0/1 values is added, not read as a mask (the kind decides)", function()
    local f01 = allowed:float()
    C.same_bits(SDPA(q, k, v, { attn_mask = f01 }), SDPA(q, k, v, { bias = f01 }))
  end)

  it("combines with bias: a bool one hides beside it, a float one is added to it", function()
    local bias = attn.randn(4, 6)
    C.same_bits(SDPA(q, k, v, { attn_mask = allowed, bias = bias }),
      SDPA(q, k, v, { mask = allowed:logical_not(), bias = bias }))
    C.same_bits(SDPA(q, k, v, { attn_mask = added, bias = bias }), SDPA(q, k, v, { bias = bias + added }))
  end)

  it("leaves the caller's options table as it was", function()
    local opts = { attn_mask = allowed, need_weights = true }
    SDPA(q, k, v, opts)
    assert.are.equal(allowed, opts.attn_mask)
    assert.is_nil(opts.mask)
  end)

  it("gradients flow to a float attn_mask and a bias beside it, as through bias", function()
    local m1 = attn.randn(4, 6, { requires_grad = true })
    local b1 = attn.randn(4, 6, { requires_grad = true })
    local g = attn.randn(2, 3, 4, 8)
    local qq = q:clone():requires_grad_()
    SDPA(qq, k, v, { attn_mask = m1, bias = b1 }):mul(g):sum():backward()
    local s = (m1 + b1):detach():requires_grad_()
    local q2 = q:clone():requires_grad_()
    SDPA(q2, k, v, { bias = s }):mul(g):sum():backward()
    C.same_bits(m1.grad, s.grad)
    C.same_bits(b1.grad, s.grad)
    C.same_bits(qq.grad, q2.grad)
  end)

  it("refuses attn_mask with mask (opposite meanings) or is_causal (as PyTorch 1.13), and a non-tensor", function()
    C.fails(function() SDPA(q, k, v, { attn_mask = allowed, mask = allowed }) end,
      "attn.scaled_dot_product_attention: options 'attn_mask' and 'mask' cannot be given together")
    C.fails(function() SDPA(q, k, v, { attn_mask = allowed, is_causal = true }) end,
      "attn.scaled_dot_product_attention: option 'attn_mask' must not be given with is_causal = true")
    C.fails(function() SDPA(q, k, v, { attn_mask = true }) end,
      "attn.scaled_dot_product_attention: bad option 'attn_mask' (expected attn.Tensor, got boolean)")
    C.fails(function() SDPA(q, k, v, { attn_mask = attn.ones(5, 5):bool() }) end, "attn.scaled_dot_product_attention")
  end)
end)

describe("scaled_dot_product_attention attn_mask against PyTorch 1.13's _scaled_dot_product_attention", function()
  local F = dofile("spec/fixtures/attn_mask_cases.lua")
  local RTOL, ATOL = 1e-5, 2e-6

  for _, c in ipairs(F.cases) do
    for _, kernel in ipairs { "math", "flash" } do
      it(c.name .. " (" .. kernel .. ")", function()
        local q, k, v = C.T(c.q), C.T(c.k), C.T(c.v)
        local m = C.T(c.mask)
        if c.bool then m = m:bool() end
        local grad = c.dq ~= nil
        if grad then
          q:requires_grad_()
          k:requires_grad_()
          v:requires_grad_()
          if not c.bool then m:requires_grad_() end
        end
        local out, w = SDPA(q, k, v, { attn_mask = m, kernel = kernel, need_weights = kernel == "math" })
        C.close(out, c.out, RTOL, ATOL, "out")
        if w then C.close(w, c.weights, RTOL, ATOL, "weights") end
        if grad then
          out:mul(C.T(c.g_out)):sum():backward()
          C.close(q.grad, c.dq, RTOL, ATOL, "dq")
          C.close(k.grad, c.dk, RTOL, ATOL, "dk")
          C.close(v.grad, c.dv, RTOL, ATOL, "dv")
          if c.dmask then C.close(m.grad, c.dmask, RTOL, ATOL, "dmask") end
        end
      end)
    end
  end
end)

-- ---- nn.MultiheadAttention: masks by their dtype ------------------------

describe("nn.MultiheadAttention masks read by their dtype, as torch 1.13", function()
  local M = dofile("spec/fixtures/torch_mha_cases.lua")

  it("the torch fixtures' bool masks as bool tensors, no type option, give the bits of the float 0/1 + 'bool' path",
    function()
      local n = 0
      for _, c in ipairs(M.cases) do
        local am, kpm = c.attn_mask, c.key_padding_mask
        if (am and am.kind == "bool") or (kpm and kpm.kind == "bool") then
          local function run(as_bool)
            attn.manual_seed(c.seed)
            local co = c.ctor
            local m = attn.nn.MultiheadAttention(c.embed_dim, c.num_heads, {
              dropout = co.dropout, bias = co.bias, add_bias_kv = co.add_bias_kv, add_zero_attn = co.add_zero_attn,
              kdim = co.kdim, vdim = co.vdim, batch_first = co.batch_first })
            local q = attn.rand(c.shapes[1])
            local k, v
            if c.same == "qkv" then k, v = q, q
            elseif c.same == "kv" then k = attn.rand(c.shapes[2]); v = k
            else k, v = attn.rand(c.shapes[2]), attn.rand(c.shapes[3]) end
            local fwd = c.fwd or {}
            local o = { need_weights = fwd.need_weights, average_attn_weights = fwd.average_attn_weights,
                        is_causal = c.is_causal or nil }
            for name, mk in pairs { attn_mask = am, key_padding_mask = kpm } do
              if mk then
                o[name] = C.T(mk.t)
                if mk.kind == "bool" and as_bool then o[name] = o[name]:bool()
                else o[name .. "_type"] = mk.kind end
              end
            end
            return m(q, k, v, o)
          end
          n = n + 1
          local o1, w1 = run(true)
          local o2, w2 = run(false)
          C.same_bits(o1, o2, c.name)
          if w1 then C.same_bits(w1, w2, c.name) end
        end
      end
      assert.is_true(n >= 2, "cases run: " .. n)
    end)

  it("a float tensor without a type option is added (torch's float mask); bool = true hides", function()
    attn.manual_seed(8)
    local m = attn.nn.MultiheadAttention(8, 2, { batch_first = true }):eval()
    local x = attn.rand(2, 5, 8)
    local hide = attn.triu(attn.ones(5, 5), 1)
    local added = m(x, x, x, { attn_mask = hide })
    C.same_bits(added, m(x, x, x, { attn_mask = hide, attn_mask_type = "float" }))
    local hidden = m(x, x, x, { attn_mask = hide:bool() })
    C.same_bits(hidden, m(x, x, x, { attn_mask = hide, attn_mask_type = "bool" }))
    C.same_bits(hidden, m(x, x, x, { is_causal = true }))
    assert.is_false(added:equal(hidden))
    local pad = attn.tensor { { false, false, false, false, true }, { false, false, false, true, true } }
    C.same_bits(m(x, x, x, { key_padding_mask = pad }),
      m(x, x, x, { key_padding_mask = pad:float(), key_padding_mask_type = "bool" }))
  end)
end)
