--- attn.generate(model, idx, max_new_tokens[, {temperature, top_k, top_p, eos_id, use_cache = true}]):
-- the book's text generation loop for a GPTModel (or any model with
-- `cfg.context_length` whose forward takes [b, n] ids and returns logits
-- [b, n, vocab]). idx [b, n] of 1-based token ids -> [b, n + max_new_tokens]:
-- each step reads the logits of the last position given at most the last
-- context_length tokens, keeps the top_k largest (the others to -inf, as the
-- book: logits < k-th largest), and picks greedily (argmax; the first of
-- ties, as torch) when temperature is nil or 0, else samples from
-- softmax(logits / temperature); a temperature so small that a finite
-- logit / temperature is not finite in float32 is refused at that step by
-- name (torch's multinomial would refuse the NaN probabilities that follow),
-- and so are the model's own NaN / +inf logits when sampling. Runs under
-- attn.no_grad; the model's training flag is left as it is (call
-- model:eval() first, as the book).
--
-- top_p (in (0, 1]; nucleus sampling, used only when sampling): after top_k
-- and the temperature, as Hugging Face's logits warpers order them, the
-- probabilities softmax(logits / temperature) sorted descending keep the
-- smallest prefix whose cumulative sum (float32, as torch's cumsum) reaches
-- top_p (the token that crosses it is kept; top_p compared as a float32, as
-- torch compares a tensor with a Python float); the others become -inf and
-- the rest is renormalised by softmax before the draw. top_p = 1 filters
-- nothing (as Hugging Face's TopPLogitsWarper).
--
-- eos_id (a token id in 1..vocab_size): as the book's chapter 5 generate,
-- generation stops at the first step whose token is eos_id, and that token is
-- not appended (so with batch 1 the result is the book's). With a batch the
-- step ends generation when every row's token is eos_id; until then a row
-- that has produced eos_id is finished: it gets eos_id at every later step
-- (its drawn token is replaced), so the rows stay of one length.
--
-- use_cache (default true when the model has reset_cache): the prompt runs
-- once through the KV cache and each step feeds only the new token; when the
-- cache is full (context_length tokens) it is refilled with the last
-- context_length tokens, which is what the uncached loop feeds then, so the
-- tokens are the uncached loop's.
--
-- Sampling is attn.multinomial(probs, 1): after the same attn.manual_seed,
-- torch.multinomial's draws, so the book's generate gives the same tokens
-- as long as the probabilities agree to the bit where it matters.
-- @module attn.generate
local attn = require "attn"
local argcheck = require "attn.argcheck"
local caller = require "attn.caller"

local FNAME = "attn.generate"

-- what came, in messages: numbers by value, tensors with their shape
local describe = argcheck.describer{shape = " "}

local function bad(argn, what, expected, v)
  argcheck.arg_error(FNAME, argn, what, expected, describe(v))
end

local OPTIONS = {temperature = "number", top_k = "number", top_p = "number", eos_id = "number", use_cache = "boolean"}

local function check_options(opts)
  opts = argcheck.check_options(FNAME, opts, 4, OPTIONS, describe)
  if opts.temperature ~= nil and not (opts.temperature >= 0 and opts.temperature < math.huge) then
    caller.error(("%s: bad option 'temperature' (expected a finite number >= 0, got %s)"):format(FNAME,
      tostring(opts.temperature)))
  end
  if opts.top_k ~= nil and not (math.tointeger(opts.top_k) and opts.top_k >= 1) then
    caller.error(("%s: bad option 'top_k' (expected a positive integer, got %s)"):format(FNAME, tostring(opts.top_k)))
  end
  if opts.top_p ~= nil and not (opts.top_p > 0 and opts.top_p <= 1) then
    caller.error(("%s: bad option 'top_p' (expected a probability in (0, 1], got %s)"):format(FNAME, tostring(opts.top_p)))
  end
  if opts.eos_id ~= nil and not (math.tointeger(opts.eos_id) and opts.eos_id >= 1) then
    caller.error(("%s: bad option 'eos_id' (expected a token id: an integer >= 1, got %s)"):format(FNAME,
      tostring(opts.eos_id)))
  end
  return opts
end

-- x rounded to float32 (how torch compares a float32 tensor with a Python float)
local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- nucleus filter of scaled logits [b, V]: see the module's comment
local function top_p_filter(scaled, top_p)
  local b, V = scaled:size(1), scaled:size(2)
  if top_p >= 1 or V < 2 then return scaled end
  local sorted, order = attn.softmax(scaled, 2):sort(2, true)
  local cum = sorted:cumsum(2)
  -- a token goes when the cumulative sum before it already reaches top_p (never the first)
  local before = attn.cat({attn.zeros(b, 1), cum:narrow(2, 1, V - 1)}, 2)
  local drop_sorted = attn.ge(before, f32(top_p)):float()
  local drop = attn.zeros(b, V):scatter_add_(2, order, drop_sorted)
  return scaled:masked_fill(drop:ne(0), -math.huge)
end

-- the number of elements of t that are NaN or +-inf (x - x is 0 only for finite x)
local function count_nonfinite(t)
  return (t - t):ne(0):sum():item()
end

-- last: [b, V] logits of the last position -> next ids [b, 1]
local function pick(last, temperature, top_k, top_p, step)
  if top_k then
    -- the book: logits below the k-th largest (torch.topk's last) become -inf
    local threshold = last:topk(top_k, 2):narrow(2, top_k, 1)   -- [b, 1]
    last = last:masked_fill(attn.lt(last, threshold), -math.huge)
  end
  if not temperature or temperature == 0 then
    return attn.argmax(last, 2, true)             -- [b, 1]
  end
  -- torch: probs = softmax(logits / temperature); multinomial(probs, 1) -> [b, 1]
  local scaled = last / temperature
  -- a finite logit made inf (or 0 / tiny made NaN once the temperature is a
  -- float32 0) by a too small temperature: torch's multinomial refuses the
  -- NaN probabilities that follow; here the message names the cause
  if count_nonfinite(scaled) > count_nonfinite(last) then
    error(("%s: bad option 'temperature' (expected a temperature large enough that logits / temperature stay finite, "
      .. "got %s: at step %d the logits (largest magnitude %s) overflow float32 when divided by it; "
      .. "use temperature = 0 for greedy decoding)"):format(FNAME, tostring(temperature), step,
      tostring(last:masked_fill((last - last):ne(0), 0):abs():max():item())), 0)
  end
  if top_p then scaled = top_p_filter(scaled, top_p) end
  local probs = attn.softmax(scaled, 2)
  if count_nonfinite(probs) > 0 then
    error(("%s: the model's logits at step %d are not finite (NaN or +inf), so softmax(logits / temperature) "
      .. "is not a probability distribution"):format(FNAME, step), 0)
  end
  return attn.multinomial(probs, 1)
end

-- idx [b, n] holds integer ids in 1..vocab (else an error naming the first bad one)
local function check_ids(idx, vocab)
  local lo, hi = idx:min():item(), idx:max():item()
  if lo >= 1 and hi <= vocab and (idx - idx:floor()):abs():max():item() == 0 then return end
  local flat = idx:reshape(idx:numel()):totable()
  for i, v in ipairs(flat) do
    if not (v >= 1 and v <= vocab and v == math.floor(v)) then
      local n = idx:size(2)
      caller.error(("%s: bad argument #2 'idx' (expected integer token ids in 1..vocab_size = %d, got %s at [%d, %d])")
        :format(FNAME, vocab, tostring(math.tointeger(v) or v), (i - 1) // n + 1, (i - 1) % n + 1))
    end
  end
end

-- eos_id bookkeeping of one step: next_ids [b, 1]; finished[i] marks the rows
-- done before this step. Returns true when the step's tokens must change
-- (finished.ids: the step's tokens with eos_id for the finished rows) or
-- generation must end (finished.all: every row's token is eos_id).
local function finish_rows(next_ids, eos_id, finished)
  local ids = next_ids:totable()
  local changed, all = false, true
  for i, row in ipairs(ids) do
    if finished[i] then
      changed = changed or row[1] ~= eos_id
      row[1] = eos_id
    elseif row[1] == eos_id then
      finished[i] = true
    else
      all = false
    end
  end
  finished.ids, finished.all = ids, all
  return changed or all
end

-- the last at most n columns of idx [b, L]
local function last_tokens(idx, n)
  local len = idx:size(2)
  if len <= n then return idx end
  return idx:narrow(2, len - n + 1, n)
end

return function(model, idx, max_new_tokens, opts)
  if type(model) ~= "table" or getmetatable(model) == nil or type(model.cfg) ~= "table"
      or not math.tointeger(model.cfg.context_length) then
    bad(1, "model", "an attn.nn.GPTModel (a module with cfg.context_length)", model)
  end
  if not attn.is_tensor(idx) or idx:dim() ~= 2 or idx:size(1) < 1 or idx:size(2) < 1 then
    bad(2, "idx", "an attn.Tensor [batch, tokens] of 1-based token ids with both >= 1", idx)
  end
  if not (math.tointeger(max_new_tokens) and max_new_tokens >= 0) then
    bad(3, "max_new_tokens", "an integer >= 0", max_new_tokens)
  end
  opts = check_options(opts)
  local vocab = model.cfg.vocab_size
  if opts.top_k and vocab and opts.top_k > vocab then
    caller.error(("%s: bad option 'top_k' (expected at most vocab_size = %d, got %d)"):format(FNAME, vocab, opts.top_k))
  end
  if opts.eos_id and vocab and opts.eos_id > vocab then
    caller.error(("%s: bad option 'eos_id' (expected a token id in 1..vocab_size = %d, got %d)"):format(FNAME, vocab,
      opts.eos_id))
  end
  if math.tointeger(vocab) then check_ids(idx, vocab) end
  local eos_id = opts.eos_id and math.tointeger(opts.eos_id)
  local ctx = math.tointeger(model.cfg.context_length)
  local use_cache = opts.use_cache
  if use_cache == nil then use_cache = type(model.reset_cache) == "function" end
  if use_cache and type(model.reset_cache) ~= "function" then
    caller.error(FNAME .. ": bad option 'use_cache' (the model has no KV cache: no reset_cache method)")
  end
  local finished = {}
  return attn.no_grad(function()
    local logits
    local function refill()
      model:reset_cache()
      logits = model(last_tokens(idx, ctx), {use_cache = true})
    end
    if use_cache and max_new_tokens > 0 then refill() end
    for step = 1, max_new_tokens do
      if not use_cache then logits = model(last_tokens(idx, ctx)) end
      -- logits: [b, n, V] -> the last position [b, V]
      local last = logits:select(2, logits:size(2))
      local next_ids = pick(last, opts.temperature, opts.top_k, opts.top_p, step)
      if eos_id and finish_rows(next_ids, eos_id, finished) then
        if finished.all then break end
        next_ids = attn.tensor(finished.ids)
      end
      idx = attn.cat({idx, next_ids}, 2)
      if use_cache and step < max_new_tokens then
        if model.cache_len >= ctx then refill() else logits = model(next_ids, {use_cache = true}) end
      end
    end
    if use_cache then model:reset_cache() end
    return idx
  end)
end
