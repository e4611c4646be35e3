-- Errors raised in the Lua layer point at the caller, as errors of a C
-- function called directly do: the message starts with this spec file's
-- line (or has no position), never with a file of the library such as
-- ".../attn/autograd/sdpa.lua:28:" or ".../attn/init.lua:154:", however deep
-- the call went before the check failed. The wording after the position is
-- each function's own.
local attn = require "attn"
local checkpoint = require "attn.checkpoint"
local nn = attn.nn

local THIS = debug.getinfo(1, "S").short_src -- what a position in this file looks like

local function tiny_gpt(over)
  local cfg = { vocab_size = 5, context_length = 4, emb_dim = 4, n_heads = 2, n_layers = 1, drop_rate = 0,
                qkv_bias = false }
  for k, v in pairs(over or {}) do cfg[k] = v end
  return cfg
end

-- fn must call the public function from a line of this file (not as a tail
-- call, so that the line is on the stack)
local function message_of(fn)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  return tostring(err)
end

local function assert_at_caller(err, name)
  assert.is_nil(err:match("attn/[%w_/]+%.lua:%d+:"), "a library file in: " .. err)
  assert.are.equal(THIS .. ":", err:sub(1, #THIS + 1), "not at this spec's line: " .. err)
  assert.truthy(err:find(name, 1, true), name .. " is not named in: " .. err)
end

local cases = {
  { "attn.scaled_dot_product_attention", "a number as q", function()
      local out = attn.scaled_dot_product_attention(1, 2, 3) return out end },
  { "attn.scaled_dot_product_attention", "shapes that differ in E", function()
      local out = attn.scaled_dot_product_attention(attn.zeros(2, 3), attn.zeros(2, 4), attn.zeros(2, 4))
      return out end },
  { "attn.tensor", "a string", function() local t = attn.tensor("x") return t end },
  { "attn.tensor", "a ragged table", function() local t = attn.tensor({ { 1 }, { 1, 2 } }) return t end },
  { "attn.zeros", "a negative size", function() local t = attn.zeros(-1) return t end },
  { "attn.zeros", "a bad requires_grad", function() local t = attn.zeros(2, { requires_grad = 1 }) return t end },
  { "attn.arange", "a zero step", function() local t = attn.arange(1, 2, 0) return t end },
  { "attn.randn", "a string size", function() local t = attn.randn("a") return t end },
  { "attn.generate", "a number as model", function() local t = attn.generate(1, 2, 3) return t end },
  { "attn.generate", "top_k over the vocabulary", function()
      local t = attn.generate(nn.GPTModel(tiny_gpt()), attn.tensor { { 1 } }, 1, { top_k = 10 }) return t end },
  { "attn.checkpoint.save", "a number as path", function() local r = checkpoint.save(1, nn.Linear(2, 2)) return r end },
  { "attn.checkpoint.load", "no model", function() local r = checkpoint.load("x.safetensors") return r end },
  { "attn.checkpoint.load", "a missing file", function()
      local r = checkpoint.load("/nonexistent/ckpt.safetensors", nn.Linear(2, 2)) return r end },
  { "attn.allclose", "a number", function() local r = attn.allclose(1, 2) return r end },
  { "Tensor:view_as", "a shape that does not fit", function()
      local r = attn.zeros(2):view_as(attn.zeros(3)) return r end },
  { "attn.nn.Linear", "a negative size", function() local m = nn.Linear(-1, 2) return m end },
  { "Linear:forward", "a wrong width", function() local y = nn.Linear(2, 2)(attn.zeros(3)) return y end },
  { "attn.nn.GPTModel", "emb_dim not divisible by n_heads", function()
      local m = nn.GPTModel(tiny_gpt { n_heads = 3 }) return m end },
  { "GPTModel:forward", "more tokens than context_length", function()
      local y = nn.GPTModel(tiny_gpt())(attn.tensor { { 1, 2, 3, 4, 5 } }) return y end },
  { "MultiHeadAttention:forward", "more tokens than context_length", function()
      local y = nn.MultiHeadAttention(4, 4, 4, 0, 2)(attn.zeros(1, 5, 4)) return y end },
  { "attn.nn.GroupedQueryAttention", "d_out not divisible by num_heads", function()
      local m = nn.GroupedQueryAttention(4, 3, 4, 2, 1) return m end },
  { "Linear:load", "a missing file", function() local r = nn.Linear(2, 2):load("/nonexistent.safetensors") return r end },
  { "Linear:load_state_dict", "an unexpected key", function()
      local r = nn.Linear(2, 2):load_state_dict({ foo = attn.zeros(1) }) return r end },
  { "attn.optim.AdamW", "a negative lr", function() local o = attn.optim.AdamW({}, { lr = -1 }) return o end },
  { "attn.nn.functional.cross_entropy", "a class id out of range", function()
      local l = nn.functional.cross_entropy(attn.zeros(2, 3), attn.tensor { 1, 5 }) return l end },
  { "attn.nn.utils.clip_grad_norm_", "a number", function() local n = nn.utils.clip_grad_norm_(1, 1) return n end },
  { "attn.set_printoptions", "an unknown option", function() local r = attn.set_printoptions { foo = 1 } return r end },
  { "attn.viz.heatmap", "a number", function() local r = attn.viz.heatmap(1) return r end },
  { "attn.progress", "a negative total", function() local p = attn.progress(-1) return p end },
}

-- Recorded calls (an input requires grad) run their forward in the caller's
-- stack (no protected call in between), so their errors point at the caller
-- as the unrecorded calls' do.
local recorded_cases = {
  { "attn.scaled_dot_product_attention", "an unknown option, q requiring grad", function()
      local q = attn.zeros(2, 3, { requires_grad = true })
      local out = attn.scaled_dot_product_attention(q, attn.zeros(2, 3), attn.zeros(2, 3), { foo = 1 })
      return out end },
  { "attn.scaled_dot_product_attention", "shapes that differ in E, q requiring grad", function()
      local q = attn.zeros(2, 3, { requires_grad = true })
      local out = attn.scaled_dot_product_attention(q, attn.zeros(2, 4), attn.zeros(2, 4)) return out end },
  { "attn.softmax", "a dim out of range, input requiring grad", function()
      local y = attn.zeros(2, 3, { requires_grad = true }):softmax(5) return y end },
}

describe("errors of public functions implemented in Lua point at the caller", function()
  for _, c in ipairs(cases) do
    it(c[1] .. " given " .. c[2] .. ": the message starts at this spec's line", function()
      assert_at_caller(message_of(c[3]), c[1])
    end)
  end

  for _, c in ipairs(recorded_cases) do
    it(c[1] .. " given " .. c[2] .. ": the message starts at this spec's line", function()
      assert_at_caller(message_of(c[3]), c[1])
    end)
  end

  it("a script run by attn-lua gets its own file and line, and the REPL the bare message", function()
    local base = os.tmpname()
    os.remove(base)
    local path = base .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write('local attn = require "attn"\n', 'local out = attn.scaled_dot_product_attention(1, 2, 3)\n')
    f:close()
    local p = assert(io.popen("scripts/attn-lua " .. path .. " 2>&1"))
    local out = p:read("a")
    p:close()
    os.remove(path)
    assert.truthy(out:find(path .. ":2: attn.scaled_dot_product_attention: bad argument #1 'q'", 1, true), out)
    local input = os.tmpname()
    f = assert(io.open(input, "w"))
    f:write("attn.zeros(-1)\n", "attn.scaled_dot_product_attention(1, 2, 3)\n")
    f:close()
    p = assert(io.popen("scripts/attn-lua < " .. input .. " 2>&1"))
    out = p:read("a")
    p:close()
    os.remove(input)
    assert.truthy(out:find("\nerror: attn.zeros: size #1 must be a non-negative integer, got -1\n", 1, true), out)
    assert.truthy(out:find("\nerror: attn.scaled_dot_product_attention: bad argument #1 'q'", 1, true), out)
  end)
end)
