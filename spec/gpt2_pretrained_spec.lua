-- nn.GPTModel.from_pretrained / save_pretrained against Hugging Face's GPT-2
-- layout, and attn.generate's top_p and eos_id, with the fixtures of
-- scripts/fixtures/make_gpt2_pretrained_fixtures.py: spec/fixtures/gpt2_tiny/
-- (model.safetensors as Hugging Face publishes gpt2's, config.json) and
-- spec/fixtures/gpt2_pretrained_cases.lua (the logits of GPT2LMHeadModel's
-- forward, written in torch 1.13 after modeling_gpt2.py, and generations).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FX = dofile("spec/fixtures/gpt2_pretrained_cases.lua")
local GPTModel = attn.nn.GPTModel

local DIR = "spec/fixtures/gpt2_tiny"
local FILE = DIR .. "/model.safetensors"

local function T(f) return attn.tensor(f.data):view(table.unpack(f.shape)) end

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "'"))
  return p
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- the fixture's tensors, renamed or changed by fn(name, tensor) -> name, tensor (nil drops it)
local function variant(fn)
  local out = {}
  for name, t in pairs((attn.load_safetensors(FILE))) do
    local n2, t2 = fn(name, t)
    if n2 then out[n2] = t2 end
  end
  return out
end

-- logits within 16 float32 ulps of the largest logit of the case: the
-- products are summed in another order than torch's addmm
local function check_logits(m, case)
  local want = T(case.logits)
  local got = m(T(case.ids))
  local tol = 16 * 2 ^ -23 * want:abs():max():item()
  local err = (got - want):abs():max():item()
  assert(err <= tol, ("logits differ by %g (tolerance %g)"):format(err, tol))
end

describe("nn.GPTModel.from_pretrained", function()
  it("gives Hugging Face GPT2LMHeadModel's logits (folder with config.json: 4 heads), in eval mode, tied", function()
    local m = GPTModel.from_pretrained(DIR)
    assert.is_false(m.training)
    assert.are.equal(m.tok_emb.weight, m.out_head.weight)
    assert.are.same({vocab_size = 64, context_length = 16, emb_dim = 64, n_heads = 4, n_layers = 2, drop_rate = 0.1,
                     qkv_bias = true}, m.cfg)
    for _, case in ipairs(FX.logits) do check_logits(m, case) end
    -- the same from the file path
    check_logits(GPTModel.from_pretrained(FILE), FX.logits[1])
  end)

  it("reads GPT2LMHeadModel's state_dict keys ('transformer.' prefix, lm_head.weight, attn.masked_bias)", function()
    local dir = tmpdir()
    local t = variant(function(name, x) return "transformer." .. name, x end)
    t["lm_head.weight"] = t["transformer.wte.weight"]:clone()
    t["transformer.h.0.attn.masked_bias"] = attn.tensor({-1e4})
    attn.save_safetensors(dir .. "/model.safetensors", t)
    write(dir .. "/config.json", read(DIR .. "/config.json"))
    local m = GPTModel.from_pretrained(dir)
    assert.are.equal(m.tok_emb.weight, m.out_head.weight)
    for _, case in ipairs(FX.logits) do check_logits(m, case) end
  end)

  it("without config.json infers the sizes from the shapes and n_head = emb / 64 (GPT-2's head size)", function()
    local dir = tmpdir()
    write(dir .. "/model.safetensors", read(FILE))
    local m = GPTModel.from_pretrained(dir .. "/model.safetensors")
    assert.are.same({vocab_size = 64, context_length = 16, emb_dim = 64, n_heads = 1, n_layers = 2, drop_rate = 0,
                     qkv_bias = true}, m.cfg)
    check_logits(m, FX.logits_one_head[1])
  end)

  it("keeps a separate lm_head.weight when it differs from wte", function()
    local dir = tmpdir()
    local t = variant(function(name, x) return name, x end)
    t["lm_head.weight"] = t["wte.weight"] * 2
    attn.save_safetensors(dir .. "/model.safetensors", t)
    local m = GPTModel.from_pretrained(dir)
    assert.are_not.equal(m.tok_emb.weight, m.out_head.weight)
    C.same_bits(m.out_head.weight, t["wte.weight"] * 2)
  end)

  it("leaves the global generator as it was", function()
    attn.manual_seed(5)
    local want = attn.rand(3)
    attn.manual_seed(5)
    GPTModel.from_pretrained(DIR)
    C.same_bits(attn.rand(3), want)
  end)

  it("names the key of a missing, unexpected or misshapen tensor", function()
    local cases = {
      {function(n, x) if n ~= "h.1.mlp.c_fc.bias" then return n, x end end, "tensor 'h.1.mlp.c_fc.bias' is missing"},
      {function(n, x) if n ~= "wte.weight" then return n, x end end, "tensor 'wte.weight' is missing"},
      {function(n, x) if n == "h.0.ln_1.weight" then return "h.0.ln_3.weight", x end return n, x end,
       "tensor 'h.0.ln_1.weight' is missing"},
      {function(n, x) if n == "ln_f.bias" then return n, x:narrow(1, 1, 10) end return n, x end,
       "tensor 'ln_f.bias' has shape [10], expected [64]"},
      {function(n, x) if n == "h.0.attn.c_attn.weight" then return n, x:t():contiguous() end return n, x end,
       "tensor 'h.0.attn.c_attn.weight' has shape [192, 64], expected [64, 192]"},
      {function(n, x) if n == "h.1.ln_2.bias" then return "h.3.ln_2.bias", x end return n, x end,
       "tensor 'h.1.ln_2.bias' is missing"},
    }
    for _, c in ipairs(cases) do
      local dir = tmpdir()
      attn.save_safetensors(dir .. "/model.safetensors", variant(c[1]))
      C.fails(function() GPTModel.from_pretrained(dir) end, "attn.nn.GPTModel.from_pretrained", c[2])
    end
    local dir = tmpdir()
    local t = variant(function(n, x) return n, x end)
    t["h.0.attn.rotary"] = attn.zeros(2)
    attn.save_safetensors(dir .. "/model.safetensors", t)
    C.fails(function() GPTModel.from_pretrained(dir) end, "unexpected tensor 'h.0.attn.rotary'")
    t["h.0.attn.rotary"] = nil
    t["transformer.wpe.weight"] = t["wpe.weight"]
    attn.save_safetensors(dir .. "/model.safetensors", t)
    C.fails(function() GPTModel.from_pretrained(dir) end, "holds both 'transformer.wpe.weight' and 'wpe.weight'")
  end)

  it("refuses a foreign safetensors file, a missing path, a bad config.json, by name", function()
    C.fails(function() GPTModel.from_pretrained("spec/fixtures/module_grad.safetensors") end,
      "attn.nn.GPTModel.from_pretrained: spec/fixtures/module_grad.safetensors is not a Hugging Face GPT-2 file",
      "'wte.weight' is missing")
    C.fails(function() GPTModel.from_pretrained("/nonexistent/gpt2") end, "attn.nn.GPTModel.from_pretrained",
      "/nonexistent/gpt2")
    C.fails(function() GPTModel.from_pretrained(42) end, "bad argument #1 'path'", "got number")
    local empty = tmpdir()
    C.fails(function() GPTModel.from_pretrained(empty) end, empty .. " is a folder without a model.safetensors file")
    C.fails(function() GPTModel:from_pretrained(DIR) end, "call it with '.', not ':'")
    local dir = tmpdir()
    write(dir .. "/model.safetensors", read(FILE))
    local config = read(DIR .. "/config.json")
    write(dir .. "/config.json", config:gsub('"n_head": 4', '"n_head": 5'))
    C.fails(function() GPTModel.from_pretrained(dir) end, "n_embd = 64 is not divisible by n_head = 5")
    write(dir .. "/config.json", config:gsub('"n_layer": 2', '"n_layer": 3'))
    C.fails(function() GPTModel.from_pretrained(dir) end, "says n_layer = 3 but", "has 2")
    write(dir .. "/config.json", config:gsub('"gelu_new"', '"relu"'))
    C.fails(function() GPTModel.from_pretrained(dir) end, "activation_function = relu is not GPT-2's")
    write(dir .. "/config.json", config:sub(1, 40))
    C.fails(function() GPTModel.from_pretrained(dir) end, dir .. "/config.json is not valid JSON")
  end)
end)

describe("GPTModel:save_pretrained", function()
  it("writes Hugging Face's layout: the fixture's tensors less the mask buffers, and a config.json", function()
    local dir = tmpdir()
    GPTModel.from_pretrained(DIR):save_pretrained(dir)
    local got, meta = attn.load_safetensors(dir .. "/model.safetensors")
    assert.are.same({format = "pt"}, meta)
    local want = variant(function(n, x) if not n:match("^h%.%d+%.attn%.bias$") then return n, x end end)
    local names = {}
    for n in pairs(want) do names[#names + 1] = n end
    for n in pairs(got) do assert.is_not_nil(want[n], n) end
    for _, n in ipairs(names) do C.same_bits(got[n], want[n], n) end
    local config = read(dir .. "/config.json")
    for _, field in ipairs({'"n_head": 4', '"n_embd": 64', '"n_layer": 2', '"n_positions": 16', '"vocab_size": 64',
                            '"layer_norm_epsilon": 1e-05', '"activation_function": "gelu_new"',
                            '"tie_word_embeddings": true'}) do
      assert.is_truthy(config:find(field, 1, true), field)
    end
  end)

  it("round trip: from_pretrained(save_pretrained(m)) saves the same bytes", function()
    local a, b = tmpdir(), tmpdir()
    GPTModel.from_pretrained(DIR):save_pretrained(a)
    GPTModel.from_pretrained(a):save_pretrained(b)
    assert.are.equal(read(a .. "/model.safetensors"), read(b .. "/model.safetensors"))
    assert.are.equal(read(a .. "/config.json"), read(b .. "/config.json"))
  end)

  it("a book model with qkv_bias and an untied out_head round-trips with lm_head.weight", function()
    attn.manual_seed(3)
    local m = GPTModel({vocab_size = 50, context_length = 8, emb_dim = 64, n_heads = 2, n_layers = 1, drop_rate = 0,
                        qkv_bias = true})
    m:eval()
    local dir = tmpdir()
    m:save_pretrained(dir)
    local back = GPTModel.from_pretrained(dir)
    assert.are.equal(2, back.cfg.n_heads)
    local ids = attn.tensor({{1, 7, 50, 3}})
    C.same_bits(back(ids), m(ids))
  end)

  it("refuses a model without qkv biases and a folder that does not exist", function()
    local m = GPTModel({vocab_size = 10, context_length = 4, emb_dim = 8, n_heads = 2, n_layers = 1})
    C.fails(function() m:save_pretrained(tmpdir()) end, "GPTModel:save_pretrained", "qkv_bias = false")
    C.fails(function() GPTModel.from_pretrained(DIR):save_pretrained("/nonexistent/dir") end,
      "GPTModel:save_pretrained", "/nonexistent/dir/model.safetensors")
  end)
end)

describe("attn.generate with a pretrained GPT-2", function()
  local m = GPTModel.from_pretrained(DIR)
  local prompt = T(FX.prompt)

  it("greedy decoding as the book's generate on GPT2LMHeadModel, cached and uncached", function()
    C.exact(attn.generate(m, prompt, 20), FX.greedy)
    C.exact(attn.generate(m, prompt, 20, {use_cache = false}), FX.greedy)
  end)

  it("eos_id stops before appending it, as the book's chapter 5 generate", function()
    C.exact(attn.generate(m, prompt, 20, {eos_id = FX.eos_id}), FX.greedy_eos)
    C.exact(attn.generate(m, prompt, 20, {eos_id = FX.eos_id, use_cache = false}), FX.greedy_eos)
  end)

  it("samples torch 1.13's tokens after the same seed with temperature, top_k and top_p", function()
    for _, c in ipairs(FX.sampled) do
      attn.manual_seed(c.seed)
      local out = attn.generate(m, prompt, c.max_new, {temperature = c.temperature, top_k = c.top_k, top_p = c.top_p})
      C.exact(out, c.out, "seed " .. c.seed)
    end
  end)
end)

describe("attn.generate top_p (nucleus sampling)", function()
  local fixed = T(FX.fixed_logits)
  local V = fixed:size(2)
  -- a model whose last logits are always `fixed` (rows of the batch)
  local fake = setmetatable({cfg = {context_length = 1000, vocab_size = V}}, {__call = function(_, idx)
    return fixed:view(2, 1, V):expand(2, idx:size(2), V)
  end})

  it("draws torch 1.13's tokens after the same seed (sorted cumulative sum reaching top_p, then multinomial)", function()
    for _, c in ipairs(FX.fixed) do
      attn.manual_seed(c.seed)
      local out = attn.generate(fake, attn.ones(2, 1), 30,
        {temperature = c.temperature, top_k = c.top_k, top_p = c.top_p, use_cache = false})
      C.exact(out:narrow(2, 2, 30), c.draws, "seed " .. c.seed)
      C.exact(attn.rand(2), c.after, "draws after seed " .. c.seed)
    end
  end)

  it("keeps only the tokens of the nucleus; a tiny top_p keeps the most likely token alone", function()
    local probs = attn.softmax(fixed, 2):totable()
    for row = 1, 2 do
      local order = {}
      for i = 1, V do order[i] = i end
      table.sort(order, function(a, b) return probs[row][a] > probs[row][b] end)
      local kept, cum = {}, 0
      for _, i in ipairs(order) do
        if cum >= 0.5 then break end
        kept[i], cum = true, cum + probs[row][i]
      end
      attn.manual_seed(1)
      local out = attn.generate(fake, attn.ones(2, 1), 200, {temperature = 1, top_p = 0.5, use_cache = false})
      for j = 2, 201 do assert.is_true(kept[out[row][j]] ~= nil, "token outside the nucleus") end
      attn.manual_seed(1)
      out = attn.generate(fake, attn.ones(2, 1), 20, {temperature = 1, top_p = 1e-6, use_cache = false})
      for j = 2, 21 do assert.are.equal(order[1], out[row][j]) end
    end
  end)

  it("top_p = 1 draws as no top_p", function()
    attn.manual_seed(8)
    local a = attn.generate(fake, attn.ones(2, 1), 20, {temperature = 1, use_cache = false})
    attn.manual_seed(8)
    C.same_bits(attn.generate(fake, attn.ones(2, 1), 20, {temperature = 1, top_p = 1, use_cache = false}), a)
  end)

  it("refuses top_p outside (0, 1] and eos_id outside 1..vocab_size", function()
    local p = attn.ones(1, 1)
    C.fails(function() attn.generate(fake, p, 3, {top_p = 0}) end, "attn.generate: bad option 'top_p'", "(0, 1]")
    C.fails(function() attn.generate(fake, p, 3, {top_p = 1.5}) end, "bad option 'top_p'", "got 1.5")
    C.fails(function() attn.generate(fake, p, 3, {top_p = 0 / 0}) end, "bad option 'top_p'")
    C.fails(function() attn.generate(fake, p, 3, {top_p = "0.9"}) end, "'top_p'")
    C.fails(function() attn.generate(fake, p, 3, {eos_id = 0}) end, "attn.generate: bad option 'eos_id'")
    C.fails(function() attn.generate(fake, p, 3, {eos_id = 2.5}) end, "bad option 'eos_id'")
    C.fails(function() attn.generate(fake, p, 3, {eos_id = V + 1}) end, "bad option 'eos_id'",
      "1..vocab_size = " .. V)
  end)
end)

describe("attn.generate eos_id with a batch", function()
  -- row r's logits favour the token script[r][step]: a model that follows a script
  local function scripted(script, V)
    return setmetatable({cfg = {context_length = 100, vocab_size = V}}, {__call = function(_, idx)
      local b, n = idx:size(1), idx:size(2)
      local rows = {}
      for r = 1, b do
        rows[r] = {}
        for j = 1, n do
          local logits = {}
          for k = 1, V do logits[k] = 0 end
          logits[script[r][math.min(j, #script[r])]] = 1
          rows[r][j] = logits
        end
      end
      return attn.tensor(rows)
    end})
  end

  it("finished rows get eos_id; generation ends at the step where every row's token is eos_id", function()
    local eos = 9
    local m = scripted({{2, 9, 3, 3, 3}, {4, 5, 6, 9, 7}}, 10)
    local out = attn.generate(m, attn.tensor({{1}, {1}}), 8, {eos_id = eos, use_cache = false})
    -- step 1 reads position 1: row 1 -> 2, row 2 -> 4; step 2: 9 (row 1 finished), 5; step 3: row 1 padded, 6;
    -- step 4: row 1 padded, 9: every row done, not appended
    C.same_bits(out, attn.tensor({{1, 2, 9, 9}, {1, 4, 5, 6}}))
    -- batch 1 of row 1: stops before its eos
    C.same_bits(attn.generate(scripted({{2, 9, 3}}, 10), attn.tensor({{1}}), 8, {eos_id = eos, use_cache = false}),
      attn.tensor({{1, 2}}))
  end)
end)

describe("attn.generate ids out of range", function()
  it("names the argument, the range and the position", function()
    local m = GPTModel.from_pretrained(DIR)
    C.fails(function() attn.generate(m, attn.tensor({{3, 65}}), 2) end,
      "attn.generate: bad argument #2 'idx' (expected integer token ids in 1..vocab_size = 64, got 65 at [1, 2])")
    C.fails(function() attn.generate(m, attn.tensor({{3, 2}, {0, 1}}), 2) end, "got 0 at [2, 1]")
    C.fails(function() attn.generate(m, attn.tensor({{1.5}}), 2) end, "got 1.5 at [1, 1]")
  end)
end)

describe("scripts/examples/gpt2_generate.lua", function()
  local function run(args)
    local p = io.popen("scripts/attn-lua scripts/examples/gpt2_generate.lua " .. args .. " 2>&1")
    local out = p:read("a")
    local ok, _, code = p:close()
    return out, ok and 0 or code
  end

  it("generates from a folder as the book's generate (token ids with --ids: the tiny model's vocabulary is not GPT-2's)",
    function()
      local out, code = run(DIR .. " '6,18,43,9' --ids --max-new 20")
      assert.are.equal(0, code, out)
      local want = {}
      for j, v in ipairs(FX.greedy.data) do want[j] = ("%d"):format(v) end
      assert.are.equal(table.concat(want, " ") .. "\n", out)
      out, code = run(DIR .. " '6,18,43,9' --ids --max-new 20 --temperature 1 --top-p 0.9 --seed 11")
      assert.are.equal(0, code, out)
      want = {}
      for j, v in ipairs(FX.sampled[1].out.data) do want[j] = ("%d"):format(v) end
      assert.are.equal(table.concat(want, " ") .. "\n", out)
    end)

  it("a text prompt needs GPT-2's vocabulary; bad arguments are named", function()
    local out, code = run(DIR .. " 'Every effort moves you'")
    assert.are.equal(1, code)
    assert.is_truthy(out:find("vocab_size = 64, not GPT-2's 50257", 1, true), out)
    out, code = run(DIR)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("expected DIR and PROMPT", 1, true), out)
    out = run("spec/fixtures/module_grad.safetensors '1'")
    assert.is_truthy(out:find("module_grad.safetensors is not a Hugging Face GPT-2 file", 1, true), out)
  end)
end)
