-- kernel = "auto" of attn.scaled_dot_product_attention (attn_sdpa_choose_kernel_for,
-- src/core/sdpa.c): which kernel it runs, seen by its bits (the same as
-- kernel = "math" or as kernel = "flash", which differ in the last bits on
-- every case here), for the shapes and options that change the choice:
-- decoding (few rows per kv head against many keys, GQA), narrow windows,
-- need_weights; and the calls "auto" must never refuse.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention

local function with(o, kernel)
  local c = { kernel = kernel }
  for key, val in pairs(o) do c[key] = val end
  return c
end

local function same(a, b) return attn.equal(a, b) end

-- "math" or "flash": the kernel whose bits "auto" gives (exactly one of them)
local function picked(q, k, v, o)
  local auto = sdpa(q, k, v, with(o, "auto"))
  local m, f = sdpa(q, k, v, with(o, "math")), sdpa(q, k, v, with(o, "flash"))
  assert.is_false(same(m, f), "the two kernels give the same bits here: the case cannot tell them apart")
  assert.is_true(attn.allclose(m, f, 1e-4, 1e-5), "the kernels disagree")
  if same(auto, m) then return "math" end
  if same(auto, f) then return "flash" end
  error("auto matches neither kernel")
end

describe("kernel = 'auto'", function()
  it("decoding: one query row against more than one split-K chunk of keys takes the fused kernel", function()
    attn.manual_seed(1)
    local q, k, v = attn.randn(1, 2, 1, 32), attn.randn(1, 2, 3000, 32), attn.randn(1, 2, 3000, 32)
    assert.are.equal("flash", picked(q, k, v, {}))
    -- within one chunk the scores are few: the math kernel
    assert.are.equal("math", picked(q, k:narrow(3, 1, 900), v:narrow(3, 1, 900), {}))
  end)

  it("GQA decoding: 4 query heads per kv head, a KV cache (window {-1, 0}), each row of a few", function()
    attn.manual_seed(2)
    local q, k, v = attn.randn(1, 8, 2, 32), attn.randn(1, 2, 2500, 32), attn.randn(1, 2, 2500, 32)
    assert.are.equal("flash", picked(q, k, v, { enable_gqa = true, window = { -1, 0 } }))
    assert.are.equal("flash", picked(q, k, v, { enable_gqa = true }))
  end)

  it("a GQA group too large for one query tile is not a decoding call: the crossover decides", function()
    attn.manual_seed(3)
    -- 64 query heads per kv head x 2 rows = 128 rows > one tile; 2 rows per head, fewer than 16: math
    local q, k, v = attn.randn(1, 64, 2, 8), attn.randn(1, 1, 2500, 8), attn.randn(1, 1, 2500, 8)
    assert.are.equal("math", picked(q, k, v, { enable_gqa = true }))
  end)

  it("a narrow window (a quarter of the pairs or fewer) takes the fused kernel below the dense crossover", function()
    attn.manual_seed(4)
    -- 8 query rows (fewer than a tile's 16): dense and causal-only calls stay on the math kernel
    local q, k, v = attn.randn(1, 1, 8, 16), attn.randn(1, 1, 600, 16), attn.randn(1, 1, 600, 16)
    assert.are.equal("math", picked(q, k, v, {}))
    assert.are.equal("math", picked(q, k, v, { window = { -1, 0 } }))
    assert.are.equal("flash", picked(q, k, v, { window = { 63, 0 } }))
    assert.are.equal("flash", picked(q, k, v, { window = { 31, 31 }, alibi_slopes = attn.alibi_slopes(1) }))
    -- a window over a short key axis (one key tile) gains nothing: math
    local ks, vs = k:narrow(3, 1, 200), v:narrow(3, 1, 200)
    assert.are.equal("math", picked(q, ks, vs, { window = { 15, 0 } }))
  end)

  it("the dense crossover: 32 keys and 16 query rows take the fused kernel, the notebooks' sizes the math one", function()
    attn.manual_seed(5)
    -- square causal calls (the fused module forward and backward choose the same way)
    local notebook = attn.randn(1, 2, 6, 16)
    assert.are.equal("math", picked(notebook, notebook, notebook, { is_causal = true }))
    local below = attn.randn(1, 2, 31, 16)
    assert.are.equal("math", picked(below, below, below, { is_causal = true }))
    local at = attn.randn(1, 2, 32, 16)
    assert.are.equal("flash", picked(at, at, at, { is_causal = true }))
    assert.are.equal("flash", picked(at, at, at, {}))
    -- 15 rows against many keys: math; 16 rows: fused
    local k, v = attn.randn(1, 1, 300, 16), attn.randn(1, 1, 300, 16)
    assert.are.equal("math", picked(attn.randn(1, 1, 15, 16), k, v, {}))
    assert.are.equal("flash", picked(attn.randn(1, 1, 16, 16), k, v, {}))
  end)

  it("a recorded call chooses as the unrecorded one (the same bits); its gradients agree with math's", function()
    attn.manual_seed(7)
    local q, k, v = attn.randn(1, 8, 1, 32), attn.randn(1, 2, 3000, 32), attn.randn(1, 2, 3000, 32)
    local o = { enable_gqa = true, window = { 1999, 0 } }
    local plain = sdpa(q, k, v, o)
    local grads = {}
    for _, kernel in ipairs { "auto", "math" } do
      local qg, kg, vg = q:clone():requires_grad_(), k:clone():requires_grad_(), v:clone():requires_grad_()
      local out = sdpa(qg, kg, vg, with(o, kernel))
      if kernel == "auto" then assert.is_true(same(out:detach(), plain), "recorded vs unrecorded bits") end
      attn.sum(out * out):backward()
      grads[kernel] = { qg.grad, kg.grad, vg.grad }
    end
    for i, name in ipairs { "dq", "dk", "dv" } do
      assert.is_true(attn.allclose(grads.auto[i], grads.math[i], 1e-4, 1e-5), name)
    end
  end)

  it("need_weights always runs the math kernel, also for decoding and windows; explicit flash refuses", function()
    attn.manual_seed(6)
    local q, k, v = attn.randn(1, 8, 1, 32), attn.randn(1, 2, 3000, 32), attn.randn(1, 2, 3000, 32)
    for _, o in ipairs { { enable_gqa = true }, { enable_gqa = true, window = { 99, 0 } } } do
      local out, w = sdpa(q, k, v, with(o, "auto"))
      assert.is_nil(w)
      local opts = with(o, "auto")
      opts.need_weights = true
      local ao, aw = sdpa(q, k, v, opts)
      opts.kernel = "math"
      local mo, mw = sdpa(q, k, v, opts)
      assert.is_true(same(ao, mo) and same(aw, mw))
      assert.is_false(same(out, mo)) -- without weights the same call is a decoding one: flash
      opts.kernel = "flash"
      C.fails(function() sdpa(q, k, v, opts) end, "kernel \"flash\" cannot return the attention weights")
    end
  end)
end)
