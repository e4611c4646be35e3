-- The book's chapter 5 generation with OpenAI's GPT-2 weights:
--
--   scripts/attn-lua scripts/examples/gpt2_generate.lua DIR "Every effort moves you" \
--     [--max-new N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--eos-id ID] [--ids]
--
-- DIR holds Hugging Face's `gpt2` files model.safetensors and config.json
-- (https://huggingface.co/openai-community/gpt2; any GPT-2 size works);
-- nothing is downloaded here. The prompt is encoded with GPT-2's tokenizer
-- (attn.tokenizer.gpt2()), generated from as the book's `generate` (greedy
-- unless --temperature > 0; top_k, then top_p; stops at <|endoftext|>), after
-- attn.manual_seed(S) (default 123, the book's), and printed as text.
-- With --ids the prompt is a comma-separated list of 1-based token ids and
-- the ids are printed (for models whose vocabulary is not GPT-2's, such as
-- the tiny test model in spec/fixtures/gpt2_tiny).
local attn = require "attn"

local USAGE = [==[usage: gpt2_generate.lua DIR PROMPT [--max-new N] [--temperature T] [--top-k K] [--top-p P]
                        [--seed S] [--eos-id ID] [--ids]]==]

local function die(msg)
  io.stderr:write("gpt2_generate.lua: ", msg, "\n", USAGE, "\n")
  os.exit(2)
end

local args = {...}
local opts = {max_new = 25, seed = 123}
local positional = {}
local NUMERIC = {["--max-new"] = "max_new", ["--temperature"] = "temperature", ["--top-k"] = "top_k",
                 ["--top-p"] = "top_p", ["--seed"] = "seed", ["--eos-id"] = "eos_id"}
local i = 1
while i <= #args do
  local a = args[i]
  if NUMERIC[a] then
    local v = tonumber(args[i + 1])
    if not v then die(("%s needs a number, got %s"):format(a, tostring(args[i + 1]))) end
    opts[NUMERIC[a]] = math.tointeger(v) or v
    i = i + 2
  elseif a == "--ids" then
    opts.ids = true
    i = i + 1
  elseif a:sub(1, 2) == "--" then
    die("unknown option " .. a)
  else
    positional[#positional + 1] = a
    i = i + 1
  end
end
if #positional ~= 2 then die("expected DIR and PROMPT") end
local dir, prompt = positional[1], positional[2]

local ok, err = pcall(function()
  local model = attn.nn.GPTModel.from_pretrained(dir)
  local tok, ids
  if opts.ids then
    ids = {}
    for s in prompt:gmatch("[^,%s]+") do
      ids[#ids + 1] = math.tointeger(tonumber(s)) or error("--ids: '" .. s .. "' is not an integer token id", 0)
    end
    if #ids == 0 then error("--ids: the prompt holds no token ids", 0) end
  else
    tok = attn.tokenizer.gpt2()
    if model.cfg.vocab_size ~= tok.n_vocab then
      error(("the model in %s has vocab_size = %d, not GPT-2's %d: its ids are not the tokenizer's "
        .. "(give the prompt as token ids with --ids)"):format(dir, model.cfg.vocab_size, tok.n_vocab), 0)
    end
    ids = tok:encode(prompt)
    if #ids == 0 then error("the prompt is empty", 0) end
    if opts.eos_id == nil then opts.eos_id = tok.eot end
  end
  attn.manual_seed(opts.seed)
  local out = attn.generate(model, attn.tensor({ids}), opts.max_new, {temperature = opts.temperature,
    top_k = opts.top_k, top_p = opts.top_p, eos_id = opts.eos_id})
  local new = {}
  for j = 1, out:size(2) do new[j] = math.tointeger(out[1][j]) end
  if tok then
    print(tok:decode(new))
  else
    print(table.concat(new, " "))
  end
end)
if not ok then
  io.stderr:write("gpt2_generate.lua: ", tostring(err), "\n")
  os.exit(1)
end
