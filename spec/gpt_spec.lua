-- nn.GPTModel (the book's chapter 4 GPT) against its PyTorch twin
-- (spec/fixtures/gpt_cases.lua from scripts/fixtures/make_gpt_fixtures.py):
-- the same weights after the same seed, the same logits, the same greedy
-- text, per-step AdamW training losses within 1e-3 relative (dropout 0, and
-- dropout 0.1 under the same seed), the same count of random draws; then the
-- KV cache, attn.generate, checkpoints (attn.checkpoint) and bad input.
local attn = require "attn"
local checkpoint = require "attn.checkpoint"
local C = dofile("spec/fixtures/tensor_check.lua")
local FX = dofile("spec/fixtures/gpt_cases.lua")
local F = attn.nn.functional

local TINY = {vocab_size = 256, context_length = 8, emb_dim = 16, n_heads = 2, n_layers = 2, drop_rate = 0,
              qkv_bias = false}

local function copy(t, over)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  for k, v in pairs(over or {}) do out[k] = v end
  return out
end

-- one training step on inputs x [B, T], targets y [B, T]: the loss before the update
local function train_step(model, opt, x, y)
  local logits = model(x)
  local b, t = x:size(1), x:size(2)
  local loss = F.cross_entropy(logits:view(b * t, logits:size(3)), y:reshape(b * t))
  opt:zero_grad()
  loss:backward()
  opt:step()
  return loss:item()
end

local function tmpname()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".safetensors"
end

describe("nn.GPTModel against the book's PyTorch model", function()
  for ci, case in ipairs(FX) do
    describe(("case %d (drop_rate %s, qkv_bias %s)"):format(ci, case.cfg.drop_rate, tostring(case.cfg.qkv_bias)),
      function()
      it("has the book's parameter names, shapes and, after the same seed, torch's bits", function()
        attn.manual_seed(case.seed)
        local m = attn.nn.GPTModel(case.cfg)
        local named = m:named_parameters()
        assert.are.equal(#case.params, #named)
        for i, p in ipairs(case.params) do
          local name, t = named[i][1], named[i][2]
          assert.are.equal(p.name, name)
          assert.are.same(p.shape, t:size(), name)
          local flat = C.flat(t)
          for j = 1, 4 do assert.are.equal(p.head.data[j], flat[j], name) end
          assert.are.equal(p.tail.data[1], flat[#flat - 1], name)
          assert.are.equal(p.tail.data[2], flat[#flat], name)
          local sum = 0
          for _, v in ipairs(flat) do sum = sum + v end
          assert.is_true(math.abs(sum - p.sum) <= 1e-9 * (1 + math.abs(p.sum)), name)
        end
      end)

      it("gives torch's logits and greedy continuation (with and without the KV cache)", function()
        attn.manual_seed(case.seed)
        local m = attn.nn.GPTModel(case.cfg)
        m:eval()
        local x = C.T(case.x):select(1, 1):narrow(1, 1, 1)   -- the first row of the first batch: [1, T]
        C.close(m(x), case.logits0, 0, 2e-5, "logits")
        local prompt = C.T(case.prompt)
        C.exact(attn.generate(m, prompt, case.cfg.context_length + 4), case.greedy, "greedy (cached)")
        C.exact(attn.generate(m, prompt, case.cfg.context_length + 4, {use_cache = false}), case.greedy, "greedy")
      end)

      it("samples torch's tokens after the same seed (temperature 1.5, top_k 40: attn.multinomial)", function()
        attn.manual_seed(case.seed)
        local m = attn.nn.GPTModel(case.cfg)
        m:eval()
        local prompt = C.T(case.prompt)
        for _, use_cache in ipairs({true, false}) do
          attn.manual_seed(case.sample_seed)
          C.exact(attn.generate(m, prompt, case.cfg.context_length + 4,
            {temperature = 1.5, top_k = 40, use_cache = use_cache}), case.sampled, "sampled")
        end
      end)

      it(("trains as torch does: %d AdamW steps, losses within 1e-3 relative, the same random draws"):format(
          case.steps), function()
        attn.manual_seed(case.seed)
        local m = attn.nn.GPTModel(case.cfg)
        local opt = attn.optim.AdamW(m:parameters(), {lr = case.lr, weight_decay = case.weight_decay})
        local xs, ys = C.T(case.x), C.T(case.y)
        assert.is_true(case.steps >= 20)
        for s = 1, case.steps do
          local loss = train_step(m, opt, xs:select(1, s), ys:select(1, s))
          local want = case.losses[s]
          assert.is_true(math.abs(loss - want) <= 1e-3 * math.abs(want),
            ("step %d: loss %.7g, torch %.7g"):format(s, loss, want))
        end
        -- the training drew as many numbers from the generator as torch's (dropout masks)
        C.exact(attn.rand(2), case.after, "draws after training")
        -- and it learned something: the last loss is below the first
        assert.is_true(case.losses[case.steps] < case.losses[1])
      end)
    end)
  end
end)

describe("GPTModel KV cache", function()
  it("gives the uncached logits, chunk by chunk, for a batch, and reset_cache starts over", function()
    attn.manual_seed(3)
    local m = attn.nn.GPTModel(copy(TINY, {qkv_bias = true}))
    m:eval()
    local ids = attn.tensor({{5, 80, 33, 200, 7, 7, 91, 256}, {1, 2, 3, 4, 5, 6, 7, 8}})
    local full = m(ids)
    for _, chunks in ipairs({{8}, {3, 1, 4}, {1, 1, 1, 1, 1, 1, 1, 1}, {5, 3}}) do
      m:reset_cache()
      local pos = 1
      for _, n in ipairs(chunks) do
        local got = m(ids:narrow(2, pos, n), {use_cache = true})
        C.close(got, {shape = got:size(), data = C.flat(full:narrow(2, pos, n))}, 0, 1e-5, "cached logits")
        pos = pos + n
      end
    end
  end)

  it("refuses tokens past context_length and a batch other than the cached one", function()
    local m = attn.nn.GPTModel(TINY)
    m:reset_cache()
    m(attn.ones(1, 6), {use_cache = true})
    C.fails(function() m(attn.ones(1, 3), {use_cache = true}) end,
      "GPTModel:forward", "KV cache holds 6 tokens; 3 more exceed context_length = 8")
    C.fails(function() m(attn.ones(2, 1), {use_cache = true}) end, "KV cache holds a batch of 1")
    m:reset_cache()
    assert.are.same({2, 8, 256}, m(attn.ones(2, 8), {use_cache = true}):size())
  end)

  it("leaves MultiHeadAttention's uncached forward as it was (bits)", function()
    attn.manual_seed(11)
    local mha = attn.nn.MultiHeadAttention(8, 8, 6, 0, 2)
    mha:eval()
    local x = C.lcg_tensor(5, 1, 2, 6, 8)
    local before = mha(x)
    mha(x:narrow(2, 1, 2), {use_cache = true})
    C.same_bits(before, mha(x), "uncached after a cached call")
    C.fails(function() mha(x, {use_cache = true, need_weights = true}) end, "cannot be combined")
  end)
end)

describe("attn.generate", function()
  local function model()
    attn.manual_seed(21)
    local m = attn.nn.GPTModel(TINY)
    m:eval()
    return m
  end

  it("samples the same tokens after the same seed, with the cache or without", function()
    local m = model()
    local prompt = attn.tensor({{72, 101}, {33, 34}})
    attn.manual_seed(99)
    local a = attn.generate(m, prompt, 12, {temperature = 1.3, top_k = 20})
    attn.manual_seed(99)
    local b = attn.generate(m, prompt, 12, {temperature = 1.3, top_k = 20, use_cache = false})
    C.same_bits(a, b)
    assert.are.same({2, 14}, a:size())
    attn.manual_seed(100)
    local c = attn.generate(m, prompt, 12, {temperature = 1.3, top_k = 20})
    assert.is_false(attn.equal(a, c))
  end)

  it("keeps every sampled token among the top_k logits (checked against the uncached forward)", function()
    local m = model()
    attn.manual_seed(5)
    local out = attn.generate(m, attn.tensor({{10, 20, 30}}), 10, {temperature = 2, top_k = 3})
    local ids = C.flat(out)
    for pos = 4, #ids do
      local first = math.max(1, pos - 1 - TINY.context_length + 1)
      local ctx = attn.tensor({table.move(ids, first, pos - 1, 1, {})})
      local logits = C.flat(attn.no_grad(function() return m(ctx) end):select(2, pos - first):select(1, 1))
      local chosen = logits[ids[pos]]
      local above = 0
      for _, v in ipairs(logits) do if v > chosen then above = above + 1 end end
      assert.is_true(above < 3, ("token %d: %d logits above the chosen one"):format(pos, above))
    end
  end)

  it("is greedy for temperature 0 and for top_k = 1 (an independent argmax)", function()
    local m = model()
    local prompt = attn.tensor({{65, 66, 67}})
    local greedy = attn.generate(m, prompt, 5)
    C.same_bits(greedy, attn.generate(m, prompt, 5, {temperature = 0}))
    attn.manual_seed(1)
    C.same_bits(greedy, attn.generate(m, prompt, 5, {temperature = 0.7, top_k = 1}))
    local logits = C.flat(attn.no_grad(function() return m(prompt) end):select(2, 3):select(1, 1))
    local best = 1
    for i, v in ipairs(logits) do if v > logits[best] then best = i end end
    assert.are.equal(best, C.flat(greedy)[4])
  end)

  it("rejects bad arguments by name", function()
    local m = model()
    local p = attn.tensor({{1, 2}})
    C.fails(function() attn.generate({}, p, 3) end, "attn.generate: bad argument #1 'model'")
    local uncachable = setmetatable({cfg = {context_length = 8, vocab_size = 256}}, {__call = function() end})
    C.fails(function() attn.generate(uncachable, p, 3, {use_cache = true}) end, "the model has no KV cache")
    C.fails(function() attn.generate(m, attn.ones(3), 3) end, "attn.generate: bad argument #2 'idx'")
    C.fails(function() attn.generate(m, p, 1.5) end, "bad argument #3 'max_new_tokens'", "got 1.5")
    C.fails(function() attn.generate(m, p, 3, {temperature = -1}) end, "bad option 'temperature'")
    C.fails(function() attn.generate(m, p, 3, {top_k = 0}) end, "bad option 'top_k'")
    C.fails(function() attn.generate(m, p, 3, {top_k = 300}) end, "at most vocab_size = 256")
    C.fails(function() attn.generate(m, p, 3, {topk = 3}) end, "unknown option 'topk'")
    C.fails(function() attn.generate(m, attn.tensor({{0, 2}}), 3) end, "attn.generate: bad argument #2 'idx'", "1..vocab_size = 256, got 0")
  end)
end)

describe("GPT checkpoints (attn.checkpoint)", function()
  local cfg = copy(TINY, {drop_rate = 0.1})
  local function batch(s)
    -- ids from a Lua LCG, not attn's generator: [2, 8] inputs, the next ids as targets
    local data = C.lcg(s, 18)
    local ids = {}
    for i, v in ipairs(data) do ids[i] = math.floor((v + 1) * 128) + 1 end
    local x = attn.tensor({table.move(ids, 1, 8, 1, {}), table.move(ids, 10, 17, 1, {})})
    local y = attn.tensor({table.move(ids, 2, 9, 1, {}), table.move(ids, 11, 18, 1, {})})
    return x, y
  end

  it("resumes with the bits of the run that never stopped (dropout on)", function()
    attn.manual_seed(4)
    local m = attn.nn.GPTModel(cfg)
    local opt = attn.optim.AdamW(m:parameters(), {lr = 3e-3})
    for s = 1, 3 do train_step(m, opt, batch(s)) end
    local path = tmpname()
    checkpoint.save(path, m, opt, {step = 3})
    local straight = {}
    for s = 4, 6 do straight[#straight + 1] = train_step(m, opt, batch(s)) end

    attn.manual_seed(777)   -- another generator state and other weights: the checkpoint restores all
    local m2 = attn.nn.GPTModel(cfg)
    local opt2 = attn.optim.AdamW(m2:parameters(), {lr = 3e-3})
    local extra = checkpoint.load(path, m2, opt2)
    assert.are.equal(3, extra.step)
    for s = 4, 6 do assert.are.equal(straight[s - 3], train_step(m2, opt2, batch(s)), "step " .. s) end
    for i, np in ipairs(m:named_parameters()) do C.same_bits(np[2], m2:named_parameters()[i][2], np[1]) end
    os.remove(path)
  end)

  it("refuses a checkpoint of another config or optimizer, changing nothing", function()
    attn.manual_seed(4)
    local m = attn.nn.GPTModel(cfg)
    local opt = attn.optim.AdamW(m:parameters())
    local path = tmpname()
    checkpoint.save(path, m, opt)
    local other = attn.nn.GPTModel(copy(cfg, {n_layers = 1}))
    C.fails(function() checkpoint.load(path, other) end, "saved from another config", "n_layers = 2 there, 1 here")
    local wider = attn.nn.GPTModel(copy(cfg, {emb_dim = 32}))
    local before = C.bits(wider.tok_emb.weight)
    C.fails(function() checkpoint.load(path, wider) end, "emb_dim = 16 there, 32 here")
    assert.are.same(before, C.bits(wider.tok_emb.weight))
    local m3 = attn.nn.GPTModel(cfg)
    C.fails(function() checkpoint.load(path, m3, attn.optim.SGD(m3:parameters(), {lr = 0.1})) end,
      "holds the state of AdamW, not of SGD")
    C.fails(function() checkpoint.load("/nonexistent/ck.safetensors", m3) end, "attn.checkpoint.load")
    C.fails(function() checkpoint.save(42, m3) end, "attn.checkpoint.save: bad argument #1 'path'")
    os.remove(path)
  end)
end)

describe("GPTModel bad input", function()
  it("names the config key that does not fit", function()
    C.fails(function() attn.nn.GPTModel(copy(TINY, {emb_dim = 15})) end,
      "attn.nn.GPTModel: bad argument #1 'cfg'", "emb_dim = 15 must be divisible by n_heads = 2")
    C.fails(function() attn.nn.GPTModel(copy(TINY, {n_layers = 0})) end, "n_layers must be a positive integer, got 0")
    C.fails(function() attn.nn.GPTModel(copy(TINY, {drop_rate = 1.5})) end, "drop_rate must be a probability")
    C.fails(function() attn.nn.GPTModel(copy(TINY, {qkv_bias = 1})) end, "qkv_bias must be a boolean")
    C.fails(function() attn.nn.GPTModel(copy(TINY, {emb = 3})) end, "unknown key 'emb'")
    C.fails(function() attn.nn.GPTModel(copy(TINY, {vocab_size = "256"})) end, "vocab_size must be a positive integer")
    C.fails(function() attn.nn.GPTModel() end, "expected a table")
  end)

  it("rejects ids out of range, non-integer ids, wrong shapes and too many tokens", function()
    local m = attn.nn.GPTModel(TINY)
    C.fails(function() m(attn.tensor({{1, 257}})) end, "GPTModel:forward: bad argument #1 'idx'", "257 is out of range")
    C.fails(function() m(attn.tensor({{0, 3}})) end, "0 is out of range")
    C.fails(function() m(attn.tensor({{2.5, 3}})) end, "2.5 is not an integer token id")
    C.fails(function() m(attn.tensor({{0 / 0, 3}})) end, "not an integer token id")
    C.fails(function() m(attn.ones(4)) end, "expected shape [batch, tokens]", "[4]")
    C.fails(function() m({{1, 2}}) end, "expected an attn.Tensor")
    C.fails(function() m(attn.ones(1, 9)) end, "9 tokens", "more than context_length = 8")
    C.fails(function() m(attn.ones(1, 2), {use_cach = true}) end, "unknown option 'use_cach'")
  end)

  it("an optimizer refuses lr < 0", function()
    local m = attn.nn.GPTModel(TINY)
    C.fails(function() attn.optim.AdamW(m:parameters(), {lr = -1e-3}) end, "lr")
  end)
end)
