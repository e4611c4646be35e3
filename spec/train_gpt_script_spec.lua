-- scripts/train_gpt.lua end to end at a tiny size on a small text written
-- here: its report lines, the loss-curve SVG, checkpoints, a resumed run
-- ending in the bits of the straight one, and bad options (exit status 2,
-- a message naming the option).
local attn = require "attn"
local X = dofile("spec/fixtures/xml_check.lua")

local function run(args)
  local p = assert(io.popen("scripts/attn-lua scripts/train_gpt.lua " .. args .. " 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

local function make_dir()
  local p = assert(io.popen("mktemp -d"))
  local dir = p:read("l")
  p:close()
  return dir
end

local TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
  .. "of foolishness, it was the epoch of belief, it was the epoch of incredulity. "):rep(12)

describe("scripts/train_gpt.lua", function()
  local dir, text
  setup(function()
    dir = make_dir()
    text = dir .. "/text.txt"
    local f = assert(io.open(text, "wb"))
    f:write(TEXT)
    f:close()
  end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function tiny(extra)
    return ("--text %s --config tiny,context_length=16,emb_dim=16,n_layers=1 --batch 4 --eval-every 2 %s"):format(
      text, extra)
  end

  it("trains, evaluates, plots, samples and checkpoints", function()
    local code, out = run(tiny(("--steps 4 --sample 12 --plot %s/loss.svg --checkpoint %s/ck.safetensors"):format(
      dir, dir)))
    assert.are.equal(0, code, out)
    for _, piece in ipairs({"text: " .. text, "GPTModel{context_length = 16, emb_dim = 16", "step     2  train loss",
                            "step     4  train loss", "unigram entropy of the text:", "final validation loss:",
                            "sample (temperature 0.8, top_k 40):\nThe ", "loss curve: " .. dir .. "/loss.svg"}) do
      assert.is_truthy(out:find(piece, 1, true), piece .. " in:\n" .. out)
    end
    local f = assert(io.open(dir .. "/loss.svg", "rb"))
    local root = X.parse(f:read("a"))
    f:close()
    assert.are.equal("svg", root.name)
    local tensors, meta = attn.load_safetensors(dir .. "/ck.safetensors")
    assert.are.equal("4", meta["extra.step"])
    assert.are.same({256, 16}, tensors["model.tok_emb.weight"]:size())
  end)

  it("--report-memory: the need counted from the config, against the peak RSS", function()
    local code, out = run(tiny("--steps 2 --sample 0 --report-memory"))
    assert.are.equal(0, code, out)
    local params = tonumber(out:match("n_layers = 1, drop_rate = 0}, (%d+) parameters"))
    assert.is_not_nil(params, out)
    -- the tensors a step's backward keeps at this size (rows = 4 x 16 tokens, D = 16, 2 heads, vocab 256), in floats
    local rows, D = 4 * 16, 16
    local kept = {
      ids = rows,
      norm1_in = rows * D, norm1_stats = 2 * rows, att_in = rows * D, qkv = 3 * rows * D,
      softmax = 4 * 2 * 16 * 16, att_out = rows * D, norm2_in = rows * D, norm2_stats = 2 * rows,
      ff_in = rows * D, gelu_in = rows * 4 * D, gelu_out = rows * 4 * D,
      final_in = rows * D, final_stats = 2 * rows, head_in = rows * D, logits = rows * 256, lse = rows,
    }
    local floats = 0
    for _, n in pairs(kept) do floats = floats + n end
    local mib = 1024 * 1024
    local need, state, acts, peak, ratio = out:match(
      "memory: need ([%d.]+) MiB %(parameters, gradients and AdamW state ([%d.]+) MiB, activations ([%d.]+) MiB%); "
      .. "peak RSS ([%d.]+) MiB = ([%d.]+)x the need")
    assert.is_not_nil(need, out)
    assert.are.equal(("%.1f"):format(16 * params / mib), state)
    assert.are.equal(("%.1f"):format(4 * floats / mib), acts)
    -- the ratio of the unrounded figures (the printed need is rounded to 0.1 MiB)
    local exact_need = (16 * params + 4 * floats) / mib
    assert.is_true(math.abs(tonumber(peak) / exact_need - tonumber(ratio)) < 0.01 * tonumber(ratio), out)
    assert.is_truthy(out:find("MiB of it before training (interpreter, libraries, text), the ", 1, true), out)
    -- under --threads the script runs again with OMP_NUM_THREADS set: the flag goes along
    code, out = run(tiny("--steps 1 --sample 0 --threads 1 --report-memory"))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("training: 1 steps of 4 x 16 tokens, AdamW lr 0.003, seed 123, 1 thread(s)", 1, true), out)
    assert.is_truthy(out:find("\nmemory: need [%d.]+ MiB"), out)
  end)

  it("resumed from its step-2 checkpoint, ends with the straight run's bits", function()
    local straight, resumed = dir .. "/straight.safetensors", dir .. "/resumed.safetensors"
    local code, out = run(tiny("--steps 4 --sample 0 --checkpoint " .. straight))
    assert.are.equal(0, code, out)
    code, out = run(tiny("--steps 2 --sample 0 --checkpoint " .. resumed))
    assert.are.equal(0, code, out)
    code, out = run(tiny("--steps 4 --sample 0 --resume --checkpoint " .. resumed))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("resumed from " .. resumed .. " after step 2", 1, true), out)
    local a, am = attn.load_safetensors(straight)
    local b, bm = attn.load_safetensors(resumed)
    assert.are.equal(am["extra.train"], bm["extra.train"])   -- every step's loss, both halves
    local names = 0
    for name, t in pairs(a) do
      names = names + 1
      assert.is_true(attn.equal(t, b[name]), name)
    end
    assert.is_true(names > 10)
  end)

  it("--tokenizer gpt2 trains on GPT-2's BPE tokens through attn.data's dataset and loader", function()
    local function bpe(extra)
      return ("--text %s --tokenizer gpt2 --config tiny,context_length=16,emb_dim=16,n_layers=1 --batch 8 "
        .. "--eval-every 2 %s"):format(text, extra)
    end
    -- the windows and batches the script reports, counted here from the text's tokens
    local n = #attn.tokenizer.gpt2():encode(TEXT)
    local n_val = math.max(18, n // 10)
    local windows = (n - n_val - 16 - 1) // 16 + 1
    local path = dir .. "/bpe.safetensors"
    local code, out = run(bpe("--steps 6 --sample 8 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    for _, piece in ipairs({
      ("GPT-2 BPE tokens (%d train, %d held out)"):format(n - n_val, n_val),
      ("data: attn.data.GPTDataset, %d windows of 16 tokens (stride 16); attn.data.DataLoader, %d batches of 8 an "
        .. "epoch (shuffle, drop_last)"):format(windows, windows // 8),
      "step     6  train loss", "nats/token; final validation loss:", "sample (temperature 0.8, top_k 40):\nThe"}) do
      assert.is_truthy(out:find(piece, 1, true), piece .. " in:\n" .. out)
    end
    local tensors = attn.load_safetensors(path)
    assert.are.same({50257, 16}, tensors["model.tok_emb.weight"]:size())
    -- resumed at step 4 (in the loader's second epoch: 3 batches each), it ends in the straight run's bits
    assert.are.equal(3, windows // 8)
    local resumed = dir .. "/bpe_resumed.safetensors"
    code, out = run(bpe("--steps 4 --sample 0 --checkpoint " .. resumed))
    assert.are.equal(0, code, out)
    code, out = run(bpe("--steps 6 --sample 0 --resume --checkpoint " .. resumed))
    assert.are.equal(0, code, out)
    local a, am = attn.load_safetensors(path)
    local b, bm = attn.load_safetensors(resumed)
    assert.are.equal(am["extra.train"], bm["extra.train"])
    for name, t in pairs(a) do assert.is_true(attn.equal(t, b[name]), name) end
    -- a checkpoint of bytes is one of another config for it
    local bytes_path = dir .. "/bytes_for_bpe.safetensors"
    code, out = run(tiny("--steps 2 --sample 0 --checkpoint " .. bytes_path))
    assert.are.equal(0, code, out)
    code, out = run(bpe("--steps 5 --sample 0 --resume --checkpoint " .. bytes_path))
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("vocab_size = 256 there, 50257 here", 1, true), out)
  end)

  it("refuses a checkpoint of another config", function()
    local path = dir .. "/other.safetensors"
    local code, out = run(tiny("--steps 2 --sample 0 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    code, out = run(("--text %s --config tiny,context_length=16,emb_dim=32,n_layers=1 --steps 3 --resume --checkpoint %s"):format(
      text, path))
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("saved from another config: emb_dim = 16 there, 32 here", 1, true), out)
  end)

  it("--resume with --lr applies the new rate and says so; without --lr the checkpoint's rate goes on", function()
    local path = dir .. "/lr.safetensors"
    local code, out = run(tiny("--steps 2 --sample 0 --lr 0.002 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    local _, meta = attn.load_safetensors(path)
    assert.are.equal(0.002, tonumber(meta["optim.group.1.lr"]))
    -- no --lr: the checkpoint's 0.002, not the default 0.003
    code, out = run(tiny("--steps 3 --sample 0 --resume --checkpoint " .. path))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("AdamW lr 0.002, seed 123", 1, true), out)
    assert.is_falsy(out:find("replaces", 1, true), out)
    _, meta = attn.load_safetensors(path)
    assert.are.equal(0.002, tonumber(meta["optim.group.1.lr"]))
    -- --lr given: applied from the resumed step on, and the checkpoint then holds it
    code, out = run(tiny("--steps 4 --sample 0 --lr 0.0005 --resume --checkpoint " .. path))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("lr 0.0005 from --lr replaces the checkpoint's 0.002", 1, true), out)
    assert.is_truthy(out:find("AdamW lr 0.0005, seed 123", 1, true), out)
    _, meta = attn.load_safetensors(path)
    assert.are.equal(0.0005, tonumber(meta["optim.group.1.lr"]))
    assert.are.equal("4", meta["extra.step"])
  end)

  it("--resume refuses model sizes other than the checkpoint's, naming both values", function()
    local path = dir .. "/sizes.safetensors"
    local code, out = run(tiny("--steps 2 --sample 0 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    for _, case in ipairs({
      {"context_length=32,emb_dim=16,n_layers=1", "context_length = 16 there, 32 here"},
      {"context_length=16,emb_dim=16,n_layers=2", "n_layers = 1 there, 2 here"},
      {"context_length=16,emb_dim=16,n_layers=1,n_heads=4", "n_heads = 2 there, 4 here"},
      {"context_length=16,emb_dim=32,n_layers=3", "emb_dim = 16 there, 32 here; n_layers = 1 there, 3 here"},
    }) do
      code, out = run(("--text %s --config tiny,%s --steps 4 --sample 0 --resume --checkpoint %s"):format(text,
        case[1], path))
      assert.are.equal(2, code, out)
      assert.is_truthy(out:find("--resume: " .. path .. " was saved from another config: " .. case[2], 1, true), out)
    end
    local _, meta = attn.load_safetensors(path)
    assert.are.equal("2", meta["extra.step"]) -- untouched
  end)

  it("--resume refuses a --seed other than the checkpoint's run's (its generator state is restored)", function()
    local path = dir .. "/seed.safetensors"
    local code, out = run(tiny("--steps 2 --sample 0 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    code, out = run(tiny("--steps 4 --sample 0 --seed 7 --resume --checkpoint " .. path))
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("--seed 7: a resumed run continues the generator state saved in " .. path
      .. " (its run was seeded with 123), so a seed would change nothing", 1, true), out)
    code, out = run(tiny("--steps 3 --sample 0 --seed 123 --resume --checkpoint " .. path)) -- its own seed: fine
    assert.are.equal(0, code, out)
  end)

  it("--resume with --steps at or below the checkpoint's step says so and exits with status 0", function()
    local path = dir .. "/steps.safetensors"
    local code, out = run(tiny("--steps 4 --sample 0 --checkpoint " .. path))
    assert.are.equal(0, code, out)
    code, out = run(tiny("--steps 2 --sample 0 --resume --checkpoint " .. path))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find(path .. " is after step 4, past --steps 2: nothing to train (give --steps above 4 to go on)",
      1, true), out)
    assert.is_falsy(out:find("training:", 1, true), out)
    code, out = run(tiny("--steps 4 --sample 0 --resume --checkpoint " .. path))
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("is after step 4, which is --steps 4: nothing to train", 1, true), out)
    local _, meta = attn.load_safetensors(path)
    assert.are.equal("4", meta["extra.step"])
  end)

  it("rejects bad options with exit status 2, naming them", function()
    for _, case in ipairs({
      {"--steps 0", "--steps: expected at least 1"},
      {"--lr -0.1", "--lr: expected a learning rate >= 0"},
      {"--lr x", "--lr: expected a number, got 'x'"},
      {"--batch 1.5", "--batch: expected an integer"},
      {"--config huge", "unknown config 'huge'"},
      {"--config tiny,emb_dim=31", "emb_dim = 31 must be divisible by n_heads = 2"},
      {"--config tiny,vocab_size=300", "vocab_size must be 256"},
      {"--config tiny,heads=2", "bad entry 'heads=2'"},
      {"--resume", "--resume needs --checkpoint"},
      {"--frobnicate", "unknown option --frobnicate"},
      {"--steps", "option --steps needs a value"},
      {"--text /nonexistent/text.txt", "cannot read the text"},
      {"--tokenizer words", "--tokenizer: expected bytes or gpt2, got 'words'"},
      {"--tokenizer gpt2 --config tiny,vocab_size=256", "vocab_size must be 50257 (GPT-2's BPE tokens"},
      {"--config gpt2", "vocab_size must be 256 (byte-level tokens; --tokenizer gpt2 for GPT-2's 50257), got 50257"},
      {"--tokenizer gpt2 --text spec/fixtures/xml_check.lua --config tiny,context_length=16 --batch 1000",
       "windows of context_length 16: fewer than one batch of 1000"},
    }) do
      local code, out = run(case[1])
      assert.are.equal(2, code, case[1] .. ": " .. out)
      assert.is_truthy(out:find(case[2], 1, true), case[1] .. ": " .. out)
    end
  end)
end)
