--- attn.generate(model, idx, max_new_tokens[, {temperature, top_k, use_cache = true}]):
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

local OPTIONS = {temperature = "number", top_k = "number", use_cache = "boolean"}

local function check_options(opts)
  opts = argcheck.check_options(FNAME, opts, 4, OPTIONS, describe)
  if opts.temperature ~= nil and not (opts.temperature >= 0 and opts.temperature < math.huge) then
    caller.error(("%s: bad option 'temperature' (expected a finite number >= 0, got %s)"):format(FNAME,
      tostring(opts.temperature)))
  end
  if opts.top_k ~= nil and not (math.tointeger(opts.top_k) and opts.top_k >= 1) then
    caller.error(("%s: bad option 'top_k' (expected a positive integer, got %s)"):format(FNAME, tostring(opts.top_k)))
  end
  return opts
end

-- the k-th largest value of each row of rows (a Lua list of lists)
local function kth_largest(row, k)
  local sorted = table.move(row, 1, #row, 1, {})
  table.sort(sorted, function(a, b) return a > b end)
  return sorted[math.min(k, #sorted)]
end

-- the number of elements of t that are NaN or +-inf (x - x is 0 only for finite x)
local function count_nonfinite(t)
  return (t - t):ne(0):sum():item()
end

-- last: [b, V] logits of the last position -> next ids [b, 1]
local function pick(last, temperature, top_k, step)
  if top_k then
    -- the book: logits below the k-th largest become -inf
    local rows = last:totable()
    local kth = {}
    for i, row in ipairs(rows) do kth[i] = {kth_largest(row, top_k)} end
    local threshold = attn.tensor(kth)            -- [b, 1]
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
  local probs = attn.softmax(scaled, 2)
  if count_nonfinite(probs) > 0 then
    error(("%s: the model's logits at step %d are not finite (NaN or +inf), so softmax(logits / temperature) "
      .. "is not a probability distribution"):format(FNAME, step), 0)
  end
  return attn.multinomial(probs, 1)
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
  local ctx = math.tointeger(model.cfg.context_length)
  local use_cache = opts.use_cache
  if use_cache == nil then use_cache = type(model.reset_cache) == "function" end
  if use_cache and type(model.reset_cache) ~= "function" then
    caller.error(FNAME .. ": bad option 'use_cache' (the model has no KV cache: no reset_cache method)")
  end
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
      local next_ids = pick(last, opts.temperature, opts.top_k, step)
      idx = attn.cat({idx, next_ids}, 2)
      if use_cache and step < max_new_tokens then
        if model.cache_len >= ctx then refill() else logits = model(next_ids, {use_cache = true}) end
      end
    end
    if use_cache then model:reset_cache() end
    return idx
  end)
end
