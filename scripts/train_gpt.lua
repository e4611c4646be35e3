-- Train the book's GPTModel (attn.nn.GPTModel) on English text, byte by byte.
--
--   scripts/attn-lua scripts/train_gpt.lua [--config NAME[,key=value...]] [--steps N] [--batch N]
--       [--lr X] [--seed N] [--threads N] [--text FILE] [--checkpoint PATH [--resume]]
--       [--plot FILE.svg] [--eval-every N] [--sample N] [--report-memory]
--
-- The text: by default the licence texts of Debian's base-files
-- (/usr/share/common-licenses: GPL-3, GPL-2, LGPL-2.1, Apache-2.0, MPL-2.0,
-- GFDL-1.3, Artistic; about 150 KB of English prose). base-files is
-- Essential, so they are on every Debian machine, CI's included, with no
-- install step; each licence permits verbatim copies of its text. --text FILE
-- trains on any other file. Tokens are bytes (vocab 256, id = byte + 1); the
-- last 10% is held out for the validation loss.
--
-- Each step: a batch of `batch` windows of context_length bytes at offsets
-- drawn from attn's generator, cross entropy of the next byte, backward,
-- clip_grad_norm_(1.0), AdamW (weight_decay 0.1). Every --eval-every steps:
-- the validation loss over fixed windows (no random draws, so a resumed run
-- draws what the straight run draws). A progress line shows the loss and
-- tokens/s on a terminal; a log line is printed at each evaluation. At the
-- end: the unigram entropy of the text (what a model of byte frequencies
-- alone would score), the final validation loss, and sampled text.
-- --checkpoint PATH saves model + optimizer + generator (attn.checkpoint) at
-- each evaluation and at the end; with --resume the run continues from it
-- up to --steps in all. On --resume the checkpoint decides what it holds: a
-- --config whose model differs from the checkpoint's is refused, naming both
-- values, and so is a --seed other than the checkpoint's (its generator state
-- is restored, so a seed would change nothing); --lr, when given, replaces
-- the checkpoint's learning rate, and the output says so (as setting
-- param_groups' lr after loading a PyTorch optimizer); without --lr the
-- checkpoint's rate goes on. --steps at or below the checkpoint's step says
-- so and exits with status 0. --batch, --text and the other options apply.
-- --report-memory prints, at the end, the bytes the training needs
-- (memory_need below: parameters, gradients, AdamW's two moments, and the
-- activations a step's backward must keep, counted from the config) against
-- the process's peak RSS.
--
-- Data parallel: under mpirun (mpirun -np P scripts/attn-lua scripts/train_gpt.lua ...)
-- every rank draws the same global batch of --batch windows and trains on
-- its share (--batch must divide by P), through
-- attn.dist.DistributedDataParallel, which averages the gradients: the
-- gradient of the global batch's mean loss, so the losses are the
-- single-process run's. The loss shown is the global batch's (the ranks'
-- mean losses averaged, their shares being equal). Rank 1 alone prints,
-- evaluates, checkpoints and samples. Threads per rank come from
-- OMP_NUM_THREADS (mpirun -x OMP_NUM_THREADS=N); --threads cannot re-run
-- a rank.
local attn = require "attn"
local checkpoint = require "attn.checkpoint"

local CONFIGS = {
  -- the bench model at context 64: 1000 steps of batch 16 take about a minute
  -- on 2 threads here (60 ms each); its 0.87 M parameters make the training's
  -- own memory, not the interpreter's fixed few MiB, the bulk of the process
  default = {vocab_size = 256, context_length = 64, emb_dim = 128, n_heads = 4, n_layers = 4, drop_rate = 0,
             qkv_bias = false},
  tiny = {vocab_size = 256, context_length = 32, emb_dim = 32, n_heads = 2, n_layers = 2, drop_rate = 0,
          qkv_bias = false},
  -- the bench case train_gpt (api.md section 5)
  bench = {vocab_size = 256, context_length = 128, emb_dim = 128, n_heads = 4, n_layers = 4, drop_rate = 0,
           qkv_bias = false},
}
local DEFAULT_TEXTS = {"GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic"}

-- under mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE): data parallel
local dist, rank, world = nil, 1, 1
if os.getenv("OMPI_COMM_WORLD_SIZE") then
  dist = require "attn.dist"
  dist.init()
  rank, world = dist.rank(), dist.world_size()
  -- one rank speaks for the job
  if rank > 1 then print = function() end end -- luacheck: ignore
end

local function die(msg)
  io.stderr:write("train_gpt.lua: " .. msg .. "\n")
  os.exit(2)
end

-- ---- options ----------------------------------------------------------------
local opts = {config = "default", steps = 1000, batch = 16, lr = 3e-3, seed = 123, threads = nil, text = nil,
              checkpoint = nil, resume = false, plot = nil, eval_every = 100, sample = 300}
local raw_args = {}
local given = {} -- the options given on the command line, by key (lr, seed, ...)
do
  local numeric = {steps = "int", batch = "int", lr = "num", seed = "int", threads = "int", ["eval-every"] = "int",
                   sample = "int"}
  local i = 1
  while i <= #arg do
    local a = arg[i]
    local name = a:match("^%-%-([%w-]+)$")
    if not name then die("unexpected argument '" .. a .. "' (options start with --; see the head of this file)") end
    if name == "resume" then
      opts.resume = true
    elseif name == "report-memory" then
      opts.report_memory = true
    elseif name == "config" or name == "text" or name == "checkpoint" or name == "plot" or numeric[name] then
      local v = arg[i + 1]
      if v == nil then die("option --" .. name .. " needs a value") end
      raw_args[#raw_args + 1] = a
      raw_args[#raw_args + 1] = v
      i = i + 1
      local key = name:gsub("-", "_")
      given[key] = true
      if numeric[name] then
        local n = tonumber(v)
        if not n or (numeric[name] == "int" and not math.tointeger(n)) then
          die(("--%s: expected %s, got '%s'"):format(name, numeric[name] == "int" and "an integer" or "a number", v))
        end
        opts[key] = numeric[name] == "int" and math.tointeger(n) or n
      else
        opts[key] = v
      end
    else
      die("unknown option --" .. name)
    end
    i = i + 1
  end
  -- the flags, for the run again under --threads
  if opts.resume then raw_args[#raw_args + 1] = "--resume" end
  if opts.report_memory then raw_args[#raw_args + 1] = "--report-memory" end
end
if opts.steps < 1 then die("--steps: expected at least 1, got " .. opts.steps) end
if opts.batch < 1 then die("--batch: expected at least 1, got " .. opts.batch) end
if not (opts.lr >= 0) then die("--lr: expected a learning rate >= 0, got " .. tostring(opts.lr)) end
if opts.eval_every < 1 then die("--eval-every: expected at least 1, got " .. opts.eval_every) end
if opts.sample < 0 then die("--sample: expected at least 0, got " .. opts.sample) end
if opts.resume and not opts.checkpoint then die("--resume needs --checkpoint PATH") end
if opts.batch % world ~= 0 then
  die(("--batch %d: the global batch must divide by the %d ranks (each trains on an equal share)"):format(
    opts.batch, world))
end

-- threads: OpenMP and OpenBLAS read them at start, so run again with OMP_NUM_THREADS set
if opts.threads then
  if opts.threads < 1 then die("--threads: expected at least 1, got " .. opts.threads) end
  if os.getenv("OMP_NUM_THREADS") ~= tostring(opts.threads) then
    if dist then
      die(("--threads %d under mpirun: set the threads of every rank with mpirun -x OMP_NUM_THREADS=%d"):format(
        opts.threads, opts.threads))
    end
    local quoted = {}
    for i, v in ipairs(raw_args) do quoted[i] = "'" .. v:gsub("'", "'\\''") .. "'" end
    local launcher = arg[0]:gsub("train_gpt%.lua$", "attn-lua")
    local ok = os.execute(("OMP_NUM_THREADS=%d %s %s %s"):format(opts.threads, launcher, arg[0],
      table.concat(quoted, " ")))
    os.exit(ok and 0 or 1)
  end
end
local threads = tonumber(os.getenv("OMP_NUM_THREADS") or "") or attn.blas_info().threads

-- --config NAME[,key=value...]
local cfg = {}
do
  local parts = {}
  for p in (opts.config .. ","):gmatch("([^,]*),") do parts[#parts + 1] = p end
  local base = CONFIGS.default
  if parts[1] ~= "" and not parts[1]:find("=", 1, true) then
    base = CONFIGS[parts[1]]
    if not base then die("--config: unknown config '" .. parts[1] .. "' (known: bench, default, tiny)") end
    table.remove(parts, 1)
  end
  for k, v in pairs(base) do cfg[k] = v end
  for _, p in ipairs(parts) do
    local k, v = p:match("^([%w_]+)=(.+)$")
    if not k or cfg[k] == nil then die("--config: bad entry '" .. p .. "' (expected key=value with a key of the GPT config)") end
    if type(cfg[k]) == "boolean" then
      if v ~= "true" and v ~= "false" then die("--config: " .. k .. " must be true or false, got '" .. v .. "'") end
      cfg[k] = v == "true"
    else
      cfg[k] = tonumber(v) or die("--config: " .. k .. " must be a number, got '" .. v .. "'")
    end
  end
  if cfg.vocab_size ~= 256 then die("--config: vocab_size must be 256 (byte-level tokens), got " .. cfg.vocab_size) end
end

-- ---- the text ---------------------------------------------------------------
local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then die("cannot read the text: " .. tostring(err)) end
  local s = f:read("a")
  f:close()
  return s
end

local text, source
if opts.text then
  text, source = read_file(opts.text), opts.text
else
  local pieces = {}
  for _, name in ipairs(DEFAULT_TEXTS) do pieces[#pieces + 1] = read_file("/usr/share/common-licenses/" .. name) end
  text = table.concat(pieces, "\n")
  source = "/usr/share/common-licenses/{" .. table.concat(DEFAULT_TEXTS, ",") .. "}"
end
local T = cfg.context_length
local n_val = math.max(T + 2, #text // 10)
if #text - n_val < T + 2 then
  die(("the text has %d bytes: too short for context_length %d plus a held-out tenth"):format(#text, T))
end
local train_text, val_text = text:sub(1, #text - n_val), text:sub(#text - n_val + 1)

-- entropy in nats of the byte frequencies of s: the loss of the best model that ignores context
local function unigram_entropy(s)
  local counts = {}
  for i = 1, #s do local b = s:byte(i); counts[b] = (counts[b] or 0) + 1 end
  local h = 0
  for _, c in pairs(counts) do local p = c / #s; h = h - p * math.log(p) end
  return h
end

-- windows of T bytes at 0-based offsets of s: inputs x [B, T] and next bytes y [B, T], ids = byte + 1
local function windows(s, offsets)
  local xs, ys = {}, {}
  for i, o in ipairs(offsets) do
    local x, y = {}, {}
    for j = 1, T do x[j] = s:byte(o + j) + 1; y[j] = s:byte(o + j + 1) + 1 end
    xs[i], ys[i] = x, y
  end
  return attn.tensor(xs), attn.tensor(ys)
end

local function random_batch(s, batch)
  local span = #s - T - 1
  local offsets = {}
  for i, u in ipairs(attn.rand(batch):totable()) do offsets[i] = math.min(span - 1, math.floor(u * span)) end
  return windows(s, offsets)
end

-- ---- model, optimizer, loss ---------------------------------------------------
-- the process before training: the interpreter, the libraries and the text
-- (--report-memory reports the peak RSS above it as the training's own)
local baseline_rss_mb = attn.peak_rss_mb()
attn.manual_seed(opts.seed)
local ok_model, model = pcall(attn.nn.GPTModel, cfg)
if not ok_model then die(tostring(model)) end
local ok_opt, opt = pcall(attn.optim.AdamW, model:parameters(), {lr = opts.lr, weight_decay = 0.1})
if not ok_opt then die(tostring(opt)) end
local F = attn.nn.functional
-- the training forward: through the data-parallel wrapper under mpirun
local train_model = dist and dist.DistributedDataParallel(model) or model

local function loss_of(x, y, net)
  local logits = (net or model)(x)
  local n = x:size(1) * x:size(2)
  return F.cross_entropy(logits:view(n, cfg.vocab_size), y:reshape(n))
end

-- validation: up to 16 windows of batch rows at evenly spaced offsets of the held-out text
local function validation_loss()
  local span = #val_text - T - 1
  local count = math.max(1, math.min(16, span // T))
  local offsets = {}
  for i = 1, count do offsets[i] = (i - 1) * span // count end
  model:eval()
  local total = 0
  attn.no_grad(function()
    for first = 1, count, opts.batch do
      local chunk = table.move(offsets, first, math.min(count, first + opts.batch - 1), 1, {})
      total = total + loss_of(windows(val_text, chunk)):item() * #chunk
      collectgarbage() -- the chunk's activations (nothing records them) before the next chunk's
    end
  end)
  model:train()
  return total / count
end

local n_params = 0
for _, p in ipairs(model:parameters()) do n_params = n_params + p:numel() end
print(("text: %s, %d bytes (%d train, %d held out)"):format(source, #text, #train_text, #val_text))
print(("model: GPTModel{context_length = %d, emb_dim = %d, n_heads = %d, n_layers = %d, drop_rate = %s}, %d parameters"):format(
  cfg.context_length, cfg.emb_dim, cfg.n_heads, cfg.n_layers, tostring(cfg.drop_rate), n_params))

-- ---- history and resume ---------------------------------------------------------
local history = {train = {}, val_steps = {}, val = {}}
local function encode_list(t)
  local out = {}
  for i, v in ipairs(t) do out[i] = ("%.9g"):format(v) end
  return table.concat(out, ",")
end
local function decode_list(s)
  local out = {}
  for v in tostring(s or ""):gmatch("[^,]+") do out[#out + 1] = tonumber(v) end
  return out
end

-- The checkpoint's model config against the run's: every difference, named
-- with both values; nil when they agree.
local function config_differences(meta)
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  local diffs = {}
  for _, k in ipairs(keys) do
    local there = meta["cfg." .. k]
    local same = there == nil or (type(cfg[k]) == "number" and tonumber(there) == cfg[k])
      or there == tostring(cfg[k])
    if not same then diffs[#diffs + 1] = ("%s = %s there, %s here"):format(k, there, tostring(cfg[k])) end
  end
  return #diffs > 0 and table.concat(diffs, "; ") or nil
end

local start = 1
if opts.resume then
  local f = io.open(opts.checkpoint, "rb")
  if f then
    f:close()
    -- what the checkpoint holds decides which options may differ from it (see the head of this file)
    local okm, err, meta = pcall(attn.load_safetensors, opts.checkpoint)
    if not okm then die(tostring(err)) end
    meta = meta or {}
    local diffs = config_differences(meta)
    if diffs then
      die(("--resume: %s was saved from another config: %s (here is --config %s); resume with the checkpoint's "
        .. "config, or start a new run without --resume"):format(opts.checkpoint, diffs, opts.config))
    end
    local saved_seed = math.tointeger(tonumber(meta["extra.seed"]))
    if given.seed and opts.seed ~= saved_seed then
      die(("--seed %d: a resumed run continues the generator state saved in %s%s, so a seed would change nothing; "
        .. "drop --seed, or start a new run without --resume"):format(opts.seed, opts.checkpoint,
        saved_seed and (" (its run was seeded with " .. saved_seed .. ")") or ""))
    end
    local saved_step = math.tointeger(tonumber(meta["extra.step"]))
    if saved_step and saved_step >= opts.steps then
      print(("%s is after step %d, %s --steps %d: nothing to train (give --steps above %d to go on)"):format(
        opts.checkpoint, saved_step, saved_step == opts.steps and "which is" or "past", opts.steps, saved_step))
      os.exit(0, true)
    end
    local ok, extra = pcall(checkpoint.load, opts.checkpoint, model, opt)
    if not ok then die(tostring(extra)) end
    opts.seed = saved_seed or opts.seed
    local saved_lr = opt.param_groups[1].lr
    if given.lr and opts.lr ~= saved_lr then
      for _, group in ipairs(opt.param_groups) do group.lr = opts.lr end
      print(("lr %g from --lr replaces the checkpoint's %g"):format(opts.lr, saved_lr))
    end
    opts.lr = opt.param_groups[1].lr
    start = math.tointeger(extra.step) + 1
    history.train, history.val_steps, history.val = decode_list(extra.train), decode_list(extra.val_steps),
      decode_list(extra.val)
    print(("resumed from %s after step %d"):format(opts.checkpoint, start - 1))
  else
    print(("no checkpoint at %s yet: starting from step 1"):format(opts.checkpoint))
  end
end
print(("training: %d steps of %d x %d tokens, AdamW lr %g, seed %d, %d thread(s)%s"):format(opts.steps, opts.batch, T,
  opts.lr, opts.seed, threads, dist and (" on each of %d ranks (data parallel, %d windows each)"):format(world,
  opts.batch // world) or ""))

local function save(step)
  if not opts.checkpoint or rank > 1 then return end
  checkpoint.save(opts.checkpoint, model, opt, {step = step, seed = opts.seed,
    train = encode_list(history.train), val_steps = encode_list(history.val_steps), val = encode_list(history.val)})
end

-- The bytes a training step needs, from the config alone (float32): the
-- parameters, their gradients, AdamW's exp_avg and exp_avg_sq, and the
-- activations the backward must keep, with rows = batch * T tokens of width D,
-- H heads and the feed-forward width 4 D:
--   ids (the embedding's backward);
--   per block: norm1's input and its mean and rstd, the attention's input,
--   its Q, K, V, the softmax [batch, H, T, T], its output; norm2's input and
--   statistics, FeedForward's input, the GELU's input and output;
--   final_norm's input and statistics, out_head's input, the logits and the
--   cross entropy's log-sum-exp (dropout masks besides when drop_rate > 0).
local function memory_need(batch)
  local rows, D, H, V, L = batch * T, cfg.emb_dim, cfg.n_heads, cfg.vocab_size, cfg.n_layers
  local per_block = rows * D + 2 * rows + rows * D + 3 * rows * D + batch * H * T * T + rows * D
                  + rows * D + 2 * rows + rows * D + 4 * rows * D + 4 * rows * D
  if cfg.drop_rate > 0 then per_block = per_block + batch * H * T * T + 2 * rows * D end
  local activations = rows + L * per_block + rows * D + 2 * rows + rows * D + rows * V + rows
  if cfg.drop_rate > 0 then activations = activations + rows * D end
  return {state = 4 * 4 * n_params, activations = 4 * activations}
end

-- ---- training ------------------------------------------------------------------
local entropy = unigram_entropy(text)
local progress = attn.progress(math.max(1, opts.steps - start + 1), "train")
if rank > 1 then progress = {step = function() end, done = function() end} end
local share = opts.batch // world
local t0 = attn.clock()
local tokens = 0
for step = start, opts.steps do
  local x, y = random_batch(train_text, opts.batch)
  if dist then x, y = x:narrow(1, (rank - 1) * share + 1, share), y:narrow(1, (rank - 1) * share + 1, share) end
  local loss = loss_of(x, y, train_model)
  -- a full collection (about 0.1 ms: the Lua heap holds few objects, the
  -- tensors' bytes are userdata) before the backward and after the step frees
  -- the forward's temporaries and the backward's spent gradients, which the
  -- incremental collector would free only after they had piled up for a few
  -- steps (peak RSS of the earlier default run, emb 64 and 2 layers: 45 -> 30 MiB)
  collectgarbage()
  opt:zero_grad()
  loss:backward()
  attn.nn.utils.clip_grad_norm_(model:parameters(), 1.0)
  opt:step()
  collectgarbage()
  local l = loss:item()
  if dist then l = dist.all_reduce(attn.tensor({l}), "avg"):item() end
  history.train[step] = l
  tokens = tokens + opts.batch * T
  local rate = tokens / math.max(1e-9, attn.clock() - t0)
  progress.label = ("step %d loss %.3f %.0f tok/s"):format(step, l, rate)
  progress:step()
  if (step % opts.eval_every == 0 or step == opts.steps) and rank == 1 then
    local v = validation_loss()
    history.val_steps[#history.val_steps + 1], history.val[#history.val + 1] = step, v
    save(step)
    progress:done()
    print(("step %5d  train loss %.4f  val loss %.4f  %.0f tokens/s"):format(step, l, v, rate))
  end
end
progress:done()
local seconds = attn.clock() - t0

local final_val = history.val[#history.val]
print(("unigram entropy of the text: %.4f nats/byte; final validation loss: %.4f nats/byte (%.0f%% of it)"):format(
  entropy, final_val or 0 / 0, 100 * (final_val or 0 / 0) / entropy))
if start <= opts.steps then
  print(("%d steps in %.1f s: %.0f tokens/s"):format(opts.steps - start + 1, seconds, tokens / seconds))
end

if opts.report_memory then
  local need = memory_need(opts.batch)
  local mib = 1024 * 1024
  local total = (need.state + need.activations) / mib
  local peak = attn.peak_rss_mb()
  print(("memory: need %.1f MiB (parameters, gradients and AdamW state %.1f MiB, activations %.1f MiB); "
    .. "peak RSS %.1f MiB = %.2fx the need; %.1f MiB of it before training (interpreter, libraries, text), "
    .. "the %.1f MiB above = %.2fx the need"):format(total, need.state / mib, need.activations / mib, peak,
    peak / total, baseline_rss_mb, peak - baseline_rss_mb, (peak - baseline_rss_mb) / total))
end

if opts.plot and rank == 1 then
  local train_x = {}
  local train_y = {}
  for step = 1, opts.steps do
    if history.train[step] then train_x[#train_x + 1] = step; train_y[#train_y + 1] = history.train[step] end
  end
  attn.viz.lines({
    {label = "train loss", x = train_x, y = train_y},
    {label = "validation loss", x = history.val_steps, y = history.val},
    {label = "unigram entropy", x = {1, opts.steps}, y = {entropy, entropy}},
  }, {file = opts.plot, title = ("GPTModel on %d bytes of English, byte tokens"):format(#text),
      xlabel = "step", ylabel = "cross entropy (nats/byte)"})
  print("loss curve: " .. opts.plot)
end

if opts.sample > 0 and rank == 1 then
  model:eval()
  local prompt_text = "The "
  local prompt = {}
  for i = 1, #prompt_text do prompt[i] = prompt_text:byte(i) + 1 end
  local out = attn.generate(model, attn.tensor({prompt}), opts.sample, {temperature = 0.8, top_k = 40})
  local bytes = {}
  for i, id in ipairs(out:totable()[1]) do bytes[i] = string.char(math.tointeger(id) - 1) end
  print("sample (temperature 0.8, top_k 40):")
  print(table.concat(bytes))
end
