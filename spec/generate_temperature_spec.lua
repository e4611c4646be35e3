-- attn.generate with temperatures so small that logits / temperature leave
-- float32: PyTorch 1.13's book loop then hands NaN probabilities to
-- torch.multinomial, which raises ("probability tensor contains either inf,
-- nan or element < 0"); attn.generate raises too, naming the option. A model
-- stub gives fixed logits, so each case knows its numbers independently.
local attn = require "attn"

-- a model of vocab 4 whose last position's logits are rows(n) for n tokens given
local function stub(rows)
  return setmetatable({ cfg = { context_length = 8, vocab_size = 4 } }, {
    __call = function(_, idx)
      local n = idx:size(2)
      local logits = attn.zeros(1, n, 4)
      logits:select(2, n):copy_(attn.tensor({ rows(n) }))
      return logits
    end,
  })
end

local function fails_with(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.are.equal("string", type(err))
  for _, s in ipairs({ ... }) do assert.truthy(err:find(s, 1, true), err) end
end

describe("attn.generate temperature", function()
  local steady = stub(function() return { 0.5, 1, -2, 3 } end)
  local p = attn.tensor({ { 1, 2 } })

  it("as PyTorch 1.13 refuses it: 3 / 1e-40 overflows float32, so the probabilities would be NaN", function()
    fails_with(function() attn.generate(steady, p, 3, { temperature = 1e-40 }) end,
      "attn.generate: bad option 'temperature'", "logits / temperature stay finite", "got 1e-40", "at step 1",
      "largest magnitude 3.0", "temperature = 0 for greedy")
  end)

  it("a temperature that is 0 in float32 (1e-50): 0.5 / 0 is inf, refused by name", function()
    fails_with(function() attn.generate(steady, p, 1, { temperature = 1e-50 }) end,
      "attn.generate: bad option 'temperature'", "got 1e-50")
  end)

  it("a logit of 0 over a float32-0 temperature (0 / 0, NaN): refused by name", function()
    local zeros = stub(function() return { 0, 0, 0, 0 } end)
    fails_with(function() attn.generate(zeros, p, 1, { temperature = 1e-60 }) end,
      "attn.generate: bad option 'temperature'")
  end)

  it("with top_k = 1 (the others -inf before scaling): still refused", function()
    fails_with(function() attn.generate(steady, p, 1, { temperature = 1e-40, top_k = 1 }) end,
      "attn.generate: bad option 'temperature'")
  end)

  it("checked at each step: logits that grow past what the temperature allows at step 3", function()
    -- 2 tokens given: steps 1, 2, 3 see 2, 3, 4 tokens; only 4 tokens give 1e30
    local growing = stub(function(n) return { 0, n == 4 and 1e30 or 1, 0, 0 } end)
    attn.manual_seed(1)
    fails_with(function() attn.generate(growing, p, 3, { temperature = 1e-9 }) end,
      "attn.generate: bad option 'temperature'", "at step 3", "got 1e-09")
  end)

  it("small but safe (3 / 1e-30 = 3e30 is finite): samples, and softmax is one-hot on the largest logit", function()
    attn.manual_seed(7)
    local out = attn.generate(steady, p, 3, { temperature = 1e-30 })
    assert.are.same({ { 1, 2, 4, 4, 4 } }, out:totable())
  end)

  it("0 stays greedy (argmax), whatever the logits' size", function()
    local huge = stub(function() return { 3e38, -3e38, 1, 0 } end)
    assert.are.same({ { 1, 2, 1, 1 } }, attn.generate(huge, p, 2, { temperature = 0 }):totable())
  end)

  it("logits the model made NaN: an attn.generate message blaming the logits, not the temperature", function()
    local nan = stub(function() return { 0, 0 / 0, 1, 2 } end)
    fails_with(function() attn.generate(nan, p, 1, { temperature = 1 }) end,
      "attn.generate: the model's logits at step 1 are not finite")
  end)
end)
