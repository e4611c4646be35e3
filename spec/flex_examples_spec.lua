-- FlexAttention's examples (scripts/examples/flex_mods.lua: relative position,
-- ALiBi, tanh softcapping, T5's bucketed bias with a learnable table, a
-- learnable relative-position table, causal, sliding window, prefix LM,
-- document masking, and one combining a score_mod and a mask_mod with the
-- built-in options) through attn.score_mod / attn.mask_mod, as PyTorch 1.13
-- computes them written out densely (scripts/fixtures/make_flex_fixtures.py):
-- the forward and every gradient (q, k, v and each learnable captured
-- tensor), kernels math, flash and auto, the mask_mods also as
-- attn.block_mask(mask_mod, ...) through the block_mask option. The dense
-- references the example script prints beside them (the bias and mask
-- options) are checked against the same fixtures, and each example against
-- the built-in option that computes the same thing.
local attn = require "attn"
local flex = dofile("scripts/examples/flex_mods.lua")

local cases = dofile("spec/fixtures/flex_cases.lua")
local fx = attn.load_safetensors("spec/fixtures/flex.safetensors")
local sdpa = attn.scaled_dot_product_attention
local RTOL, ATOL = 1e-5, 1e-5 -- as spec/sdpa_variants_grad_spec.lua

-- |a - b| <= atol + rtol |b| everywhere, with the worst element in the message
local function assert_close(a, b, rtol, atol, what)
  assert(attn.is_tensor(a), what .. ": no tensor")
  assert.same(b:size(), a:size(), what .. ": shape")
  local err = (a - b):abs() - (b:abs() * rtol + atol)
  local worst = err:max():item()
  assert(worst <= 0, ("%s: off by %.3g beyond the tolerance (max |diff| %.3g)"):format(what, worst,
    (a - b):abs():max():item()))
end

-- case c's inputs from the fixture (fresh copies, requiring grad) and x: its
-- sizes, parameters and captured tensors (the learnable ones requiring grad)
local function inputs(c)
  local function get(name) return fx[c.name .. "." .. name]:clone() end
  local q, k, v = get("q"):requires_grad_(), get("k"):requires_grad_(), get("v"):requires_grad_()
  local x = {}
  for key, val in pairs(c) do x[key] = val end
  for tname, learnable in pairs(c.captured or {}) do
    x[tname] = get(tname)
    if learnable then x[tname]:requires_grad_() end
  end
  return q, k, v, get("dout"), x
end

-- the case's built-in options, around the example's (bias: a leaf requiring grad)
local function builtin(c, o)
  o.scale, o.is_causal, o.enable_gqa, o.softcap = c.scale, c.is_causal, c.gqa, c.softcap
  if c.bias then o.bias = fx[c.name .. ".bias"]:clone():requires_grad_() end
  if c.alibi_slopes then o.alibi_slopes = attn.alibi_slopes(c.hq) end
  return o
end

-- out and every gradient against the fixture: of q, k, v, the case's bias and
-- each learnable captured tensor; grads() -> name -> attn's gradient
local function check(c, out, dout, grads)
  assert_close(out:detach(), fx[c.name .. ".out"], RTOL, ATOL, "out")
  local loss = (out * dout):sum()
  loss:backward()
  local names = { "q", "k", "v" }
  if c.bias then names[#names + 1] = "bias" end
  for tname, learnable in pairs(c.captured or {}) do
    if learnable then names[#names + 1] = tname end
  end
  local g = grads()
  for _, name in ipairs(names) do
    local ref = assert(fx[c.name .. ".d" .. name], "the fixture has no d" .. name)
    assert(g[name], "no gradient of " .. name)
    assert_close(g[name], ref, RTOL, ATOL, "d" .. name)
  end
end

local function describe_case(c)
  local parts = {}
  for _, key in ipairs { "scale", "is_causal", "gqa", "softcap", "bias", "alibi_slopes" } do
    if c[key] ~= nil then parts[#parts + 1] = key .. "=" .. tostring(c[key]) end
  end
  return ("%s: B %d, Hq %d, Hkv %d, Lq %d, Lk %d, E %d%s"):format(c.name, c.b, c.hq, c.hkv, c.lq, c.lk, c.e,
    #parts > 0 and " (" .. table.concat(parts, " ") .. ")" or "")
end

local function attn_grads(q, k, v, x, o)
  return function()
    local g = { q = q.grad, k = k.grad, v = v.grad, bias = o.bias and o.bias.grad }
    for tname, learnable in pairs(x.captured or {}) do
      if learnable then g[tname] = x[tname].grad end
    end
    return g
  end
end

describe("FlexAttention's examples against PyTorch 1.13 (dense torch references)", function()
  for _, c in ipairs(cases) do
    local ex = flex.examples[c.example]
    for _, kernel in ipairs { "math", "flash", "auto" } do
      it(kernel .. ": " .. describe_case(c) .. ", forward and every gradient", function()
        local q, k, v, dout, x = inputs(c)
        local o = builtin(c, ex.make(x))
        o.kernel = kernel
        local out = sdpa(q, k, v, o)
        check(c, out, dout, attn_grads(q, k, v, x, o))
      end)
      if ex.visible then
        it(kernel .. ": " .. describe_case(c) .. ", the mask_mod as attn.block_mask (block 8)", function()
          local q, k, v, dout, x = inputs(c)
          local o = builtin(c, ex.make(x))
          o.block_mask = attn.block_mask(o.mask_mod, c.b, c.hq, c.lq, c.lk, { block = 8 })
          o.mask_mod, o.kernel = nil, kernel
          local out = sdpa(q, k, v, o)
          check(c, out, dout, attn_grads(q, k, v, x, o))
        end)
      end
    end
  end
end)

describe("FlexAttention's examples: the dense references of scripts/examples/flex.lua", function()
  -- the bias and mask options built elementwise in Lua, against the same
  -- fixtures: the references the example script prints its differences to
  for _, c in ipairs(cases) do
    for _, kernel in ipairs { "math", "flash" } do
      it(kernel .. ": " .. describe_case(c), function()
        local q, k, v, dout, x = inputs(c)
        local o, table_grads = flex.dense(c.example, x)
        local user = builtin(c, {})
        for key, val in pairs(user) do if key ~= "bias" then o[key] = val end end
        if user.bias then o.bias = o.bias and o.bias + user.bias or user.bias end
        o.kernel = kernel
        local out = sdpa(q, k, v, o)
        check(c, out, dout, function()
          local g = table_grads()
          g.q, g.k, g.v, g.bias = q.grad, k.grad, v.grad, user.bias and user.bias.grad
          return g
        end)
      end)
    end
  end
  it("the T5 bucket in plain Lua is Hugging Face's for T5's own parameters", function()
    -- transformers' T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=32,
    -- max_distance=128), run with torch 1.13 (distances off its bucket boundaries 16, 32, 64)
    local rel = { -200, -40, -9, -8, -1, 0, 1, 7, 8, 20, 50, 127, 500 }
    local want = { 15, 12, 8, 8, 1, 0, 17, 23, 24, 26, 29, 31, 31 }
    for i, r in ipairs(rel) do assert.equal(want[i], flex.bucket_number(r, 32, 8, 128), "rel " .. r) end
  end)
end)

describe("FlexAttention's examples agree with attn's built-in options", function()
  attn.manual_seed(31)
  local b, h, n, e = 2, 4, 48, 16
  local q, k, v = attn.randn(b, h, n, e), attn.randn(b, h, n, e), attn.randn(b, h, n, e)
  local function agree(mod_opts, builtin_opts, what)
    for _, kernel in ipairs { "math", "flash" } do
      mod_opts.kernel, builtin_opts.kernel = kernel, kernel
      assert_close(sdpa(q, k, v, mod_opts), sdpa(q, k, v, builtin_opts), 1e-5, 1e-6, kernel .. ": " .. what)
    end
  end
  it("ALiBi as a score_mod is alibi_slopes (Lq = Lk, where the definitions agree)", function()
    local slopes = attn.alibi_slopes(h)
    agree({ score_mod = flex.alibi(slopes) }, { alibi_slopes = slopes }, "alibi")
    agree({ score_mod = flex.alibi(slopes), is_causal = true }, { alibi_slopes = slopes, is_causal = true },
      "causal alibi")
  end)
  it("softcapping as a score_mod is the softcap option", function()
    agree({ score_mod = flex.softcap(0.9) }, { softcap = 0.9 }, "softcap")
  end)
  it("the causal and sliding-window mask_mods are is_causal and window = {w, 0}", function()
    agree({ mask_mod = flex.causal() }, { is_causal = true }, "causal")
    agree({ mask_mod = flex.sliding_window(7) }, { window = { 7, 0 } }, "sliding window")
  end)
  it("the document mask_mod is block_mask.document and causal", function()
    local ids = {}
    for i = 1, n do ids[i] = (i - 1) * 3 // n end -- 3 documents of 16
    local doc = attn.tensor({ ids, ids })
    local bm = attn.block_mask(attn.block_mask.and_(attn.block_mask.document(attn.tensor(ids)),
      attn.block_mask.causal), b, h, n, n, { block = 16 })
    agree({ mask_mod = flex.document(doc) }, { block_mask = bm }, "document")
    agree({ block_mask = attn.block_mask(flex.document(doc), b, h, n, n, { block = 16 }) }, { block_mask = bm },
      "document as a block mask")
  end)
  it("each example prints as its traced expression", function()
    local made = { flex.relative_position(), flex.alibi(attn.alibi_slopes(h)), flex.softcap(2),
      flex.t5_bias(attn.zeros(h, 32), { num_buckets = 32, max_exact = 8, max_distance = 100 }),
      flex.relative_table(attn.zeros(h, 2 * n - 1), n), flex.causal(), flex.sliding_window(4), flex.prefix_lm(3),
      flex.document(attn.zeros(b, n)) }
    for i, m in ipairs(made) do
      local s = tostring(m)
      assert.is_string(s)
      assert.is_nil(s:find("^table: "), "example " .. i .. " prints as " .. s)
      assert.is_true(#s > 0)
    end
  end)
end)
