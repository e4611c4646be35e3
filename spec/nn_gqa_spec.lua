-- attn.nn.GroupedQueryAttention against the book's Llama 3 class in PyTorch 1.13
-- (scripts/fixtures/make_gqa_fixtures.py: repeat_interleave'd K/V, explicit
-- causal / sliding-window masks, float64): the initial parameters after
-- attn.manual_seed (bit for bit), the forward, the parameter gradients by
-- name, a loaded state dict; KV-cached decoding against the uncached forward;
-- dropout; bad input.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FIX = dofile("spec/fixtures/gqa_cases.lua")
local GQA = attn.nn.GroupedQueryAttention

local RTOL, ATOL = 1e-5, 1e-5

local function build(c)
  return GQA(c.d_in, c.d_out, 64, c.num_heads, c.num_kv_groups,
    { qkv_bias = c.qkv_bias, rope_base = c.rope_base, window = c.window })
end

local function fixture_state(c)
  local d = {}
  for _, name in ipairs(c.names) do d[name] = C.T(c.params[name:gsub("%.", "_")]) end
  return d
end

describe("nn.GroupedQueryAttention against PyTorch 1.13", function()
  for _, c in ipairs(FIX) do
    it("parameters: torch's names, order and initial bits after manual_seed: " .. c.name, function()
      attn.manual_seed(c.seed)
      local m = build(c)
      local names = {}
      for i, np in ipairs(m:named_parameters()) do
        names[i] = np[1]
        C.exact(np[2], c.params[np[1]:gsub("%.", "_")], np[1])
      end
      assert.are.same(c.names, names)
      assert.are.same(c.names, m:state_dict_keys())
    end)

    it("forward and parameter gradients: " .. c.name, function()
      attn.manual_seed(c.seed)
      local m = build(c)
      local out = m(C.T(c.x))
      C.close(out, c.out, RTOL, ATOL, "out")
      attn.sum(out * C.T(c.g)):backward()
      for _, np in ipairs(m:named_parameters()) do
        C.close(np[2].grad, c.grads[np[1]:gsub("%.", "_")], RTOL, ATOL, "grad of " .. np[1])
      end
    end)

    it("a torch state dict loads (strict) into a module drawn from another seed: " .. c.name, function()
      attn.manual_seed(c.seed + 1000)
      local m = build(c)
      m:load_state_dict(fixture_state(c))
      C.close(m(C.T(c.x)), c.out, RTOL, ATOL, "out")
    end)
  end

  it("the notebook version's extra buffers (mask, cos, sin) load with strict = false only", function()
    local c = FIX[3]
    local d = fixture_state(c)
    d.mask, d.cos, d.sin = attn.ones(4, 4), attn.ones(4, 4), attn.ones(4, 4)
    attn.manual_seed(1)
    local m = build(c)
    C.fails(function() m:load_state_dict(d) end, 'unexpected key(s): "cos", "mask", "sin"')
    local r = m:load_state_dict(d, false)
    assert.are.same({ "cos", "mask", "sin" }, r.unexpected_keys)
    assert.are.same({}, r.missing_keys)
    C.close(m(C.T(c.x)), c.out, RTOL, ATOL, "out")
  end)

  it("named_parameters lists the projections' biases with qkv_bias", function()
    local m = GQA(4, 8, 8, 2, 1, { qkv_bias = true })
    assert.are.same({ "W_key.weight", "W_key.bias", "W_value.weight", "W_value.bias", "W_query.weight",
                      "W_query.bias", "out_proj.weight" }, m:state_dict_keys())
    assert.are.same({ 4, 4 }, m.W_key.weight:size()) -- num_kv_groups * head_dim = 1 * 4 rows
  end)
end)

describe("nn.GroupedQueryAttention KV cache", function()
  -- token by token, and in chunks, the cached forward equals the uncached one
  local function check_decoding(m, x, chunks, tol)
    local full = m(x)
    m:reset_cache()
    local at = 1
    for _, len in ipairs(chunks) do
      local y = m(x:narrow(2, at, len), { use_cache = true })
      C.close(y, { shape = { x:size(1), len, m.d_out }, data = C.flat(full:narrow(2, at, len)) }, tol, tol,
        ("rows %d..%d"):format(at, at + len - 1))
      at = at + len
    end
    assert.are.equal(at - 1, m.kv_cache.len)
  end

  for _, c in ipairs(FIX) do
    it("cached decoding equals the uncached forward: " .. c.name, function()
      attn.manual_seed(c.seed)
      local m = build(c)
      m:eval()
      local x = C.T(c.x)
      local ones = {}
      for i = 1, c.n do ones[i] = 1 end
      attn.no_grad(function()
        check_decoding(m, x, ones, 1e-6)
        check_decoding(m, x, { 3, 1, c.n - 4 }, 1e-6) -- a prompt, then a token, then a chunk
        check_decoding(m, x, { c.n }, 1e-6)
      end)
    end)
  end

  it("the cache holds num_kv_groups heads, keeps every token (also with a window); reset_cache restarts", function()
    attn.manual_seed(5)
    local m = GQA(8, 16, 12, 4, 2, { window = 3 })
    local x = attn.randn(2, 12, 8)
    local first = m(x:narrow(2, 1, 5), { use_cache = true })
    assert.are.same({ 2, 2, 12, 4 }, m.kv_cache.keys:size())
    assert.are.equal(5, m.kv_cache.len)
    m:reset_cache()
    assert.is_nil(m.kv_cache)
    C.same_bits(m(x:narrow(2, 1, 5), { use_cache = true }), first)
    m(x:narrow(2, 6, 7), { use_cache = true })
    assert.are.equal(12, m.kv_cache.len)
  end)

  it("a window hides the keys older than w - 1 tokens: rows past the window ignore the first token", function()
    attn.manual_seed(6)
    local m = GQA(8, 8, 16, 2, 1, { window = 4 })
    local x = attn.randn(1, 8, 8)
    local changed = x:clone()
    changed:narrow(2, 1, 1):fill_(5)
    local a, b = m(x), m(changed)
    -- row i sees rows i-3..i: rows 1..4 see row 1, rows 5..8 do not
    assert.is_true((a:narrow(2, 1, 4) - b:narrow(2, 1, 4)):abs():max():item() > 1e-3)
    C.same_bits(a:narrow(2, 5, 4), b:narrow(2, 5, 4))
  end)

  it("errors: past context_length, another batch size; the cache is not recorded", function()
    attn.manual_seed(7)
    local m = GQA(4, 8, 6, 2, 1)
    m(attn.randn(1, 4, 4), { use_cache = true })
    C.fails(function() m(attn.randn(1, 3, 4), { use_cache = true }) end,
      "GroupedQueryAttention:forward: the KV cache holds 4 tokens; 3 more exceed context_length = 6")
    C.fails(function() m(attn.randn(2, 1, 4), { use_cache = true }) end,
      "GroupedQueryAttention:forward: the KV cache holds a batch of 1, got x of shape [2, 1, 4]")
    local y = m(attn.randn(1, 2, 4), { use_cache = true })
    assert.is_false(y.requires_grad)
    C.fails(function() m(attn.randn(1, 7, 4)) end,
      "GroupedQueryAttention:forward: the input has 7 tokens (shape [1, 7, 4]), more than context_length = 6")
  end)
end)

describe("nn.GroupedQueryAttention dropout and bad input", function()
  it("dropout acts on the weights in training only; dropout = 1 gives zeros", function()
    attn.manual_seed(8)
    local m = GQA(8, 8, 8, 2, 1, { dropout = 0.5 })
    local x = attn.randn(1, 6, 8)
    m:eval()
    local plain = m(x)
    m:train()
    attn.manual_seed(1)
    local a = m(x)
    attn.manual_seed(1)
    C.same_bits(m(x), a) -- the same draw
    assert.is_true((a - plain):abs():max():item() > 1e-4)
    local all = GQA(8, 8, 8, 2, 1, { dropout = 1 })
    C.is(all(x), { 1, 6, 8 }, C.flat(attn.zeros(1, 6, 8)))
  end)

  it("constructor errors name the argument, what was expected and what came", function()
    C.fails(function() GQA(8, 12, 8, 4, 3) end,
      "attn.nn.GroupedQueryAttention: num_heads (4) must be divisible by num_kv_groups (3)")
    C.fails(function() GQA(8, 10, 8, 4, 2) end,
      "attn.nn.GroupedQueryAttention: d_out (10) must be divisible by num_heads (4)")
    C.fails(function() GQA(8, 12, 8, 4, 2) end,
      "attn.nn.GroupedQueryAttention: head_dim = d_out / num_heads = 3 must be even (RoPE rotates pairs)")
    C.fails(function() GQA(8, 8, 8, 2, 0) end,
      "attn.nn.GroupedQueryAttention: bad argument #5 'num_kv_groups' (expected a positive integer, got 0)")
    C.fails(function() GQA(8, 8, 8, 2, 1, { window = 0 }) end,
      "attn.nn.GroupedQueryAttention: bad option 'window' (expected a positive integer")
    C.fails(function() GQA(8, 8, 8, 2, 1, { window = 2.5 }) end, "bad option 'window'", "got 2.5")
    C.fails(function() GQA(8, 8, 8, 2, 1, { rope_base = -1 }) end,
      "bad option 'rope_base' (expected a finite number > 0, got -1")
    C.fails(function() GQA(8, 8, 8, 2, 1, { dropout = 2 }) end,
      "bad option 'dropout' (expected a probability in [0, 1], got 2")
    C.fails(function() GQA(8, 8, 8, 2, 1, { scale = 1 }) end, "unknown option 'scale'")
  end)

  it("forward errors: not a tensor, wrong rank or width, bad options", function()
    local m = GQA(8, 8, 8, 2, 1)
    C.fails(function() m("x") end, "GroupedQueryAttention:forward: bad argument 'x' (expected attn.Tensor, got string)")
    C.fails(function() m(attn.randn(3, 8)) end, "'x' must have 3 dims, got shape [3, 8]")
    C.fails(function() m(attn.randn(1, 3, 5)) end, "'x' of shape [1, 3, 5] must end in d_in = 8")
    C.fails(function() m(attn.randn(1, 3, 8), { use_cache = 1 }) end, "bad option 'use_cache' (expected boolean")
  end)
end)
