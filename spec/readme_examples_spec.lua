-- The README's Lua examples, run as written: the first example prints what
-- the README shows (PyTorch 1.13 prints the same text for the same program:
-- checked with torch when written), and the tour, autograd, training and
-- variants blocks run without error, printing what their comments say.
local function readme()
  local f = assert(io.open("README.md"))
  local text = f:read("a")
  f:close()
  return text
end

-- the first ```lua block after `heading`, and the plain ``` block after it
local function blocks(heading)
  local text = readme()
  local at = assert(text:find("\n" .. heading .. "\n", 1, true), "README.md has no " .. heading)
  local code, after = text:match("```lua\n(.-)```()", at)
  assert(code, heading .. " has no lua block")
  local shown = text:match("^%s*```\n(.-)```", after)
  return code, shown
end

-- runs `code` in a fresh directory with attn (and a preamble) loaded; returns its output
local function run(code, preamble)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir))
  local f = assert(io.open(dir .. "/example.lua", "w"))
  f:write(preamble or "", "\n", code)
  f:close()
  local here = io.popen("pwd"):read("l")
  local p = assert(io.popen("cd " .. dir .. " && " .. here .. "/scripts/attn-lua example.lua 2>&1; echo \"exit $?\""))
  local out = p:read("a")
  p:close()
  os.execute("rm -rf " .. dir)
  return out
end

describe("README examples", function()
  it("the first example prints what the README shows, as PyTorch 1.13 prints it", function()
    local code, shown = blocks("## A first example")
    assert.truthy(shown, "no output block after the first example")
    assert.truthy(shown:find("grad_fn=<DivBackward0>", 1, true))
    assert.are.equal(shown .. "exit 0\n", run(code))
  end)

  it("the tour runs and prints what its comments say", function()
    local code = blocks("## A tour")
    -- 16448 = the book's MultiHeadAttention(64, 64, ...): W_query, W_key, W_value 64 x 64, out_proj 64 x 64 + 64
    -- 15496 11 995: tiktoken's gpt2 ids of "Hello, world", + 1
    assert.are.equal(("2\t3\t0.66000002622604\ntensor([0.5500, 0.8700, 0.6600])\n%d\n15497 12 996\nexit 0\n")
      :format(3 * 64 * 64 + 64 * 64 + 64), run(code))
  end)

  it("the autograd example prints PyTorch 1.13's loss", function()
    local code = blocks("## Autograd")
    -- torch 1.13: x = [[1, 2], [3, 4]], manual_seed(0), w = randn(2, 3),
    -- x.matmul(w).softmax(-1).log().mean() prints tensor(-7.3259, grad_fn=<MeanBackward0>)
    assert.truthy(code:find("--> tensor(-7.3259, grad_fn=<MeanBackward0>)", 1, true))
    assert.are.equal("tensor(-7.3259, grad_fn=<MeanBackward0>)\nexit 0\n", run(code, 'local attn = require "attn"'))
  end)

  it("the training and variants examples run", function()
    assert.are.equal("exit 0\n", run((blocks("## Training")), 'local attn = require "attn"; local nn = attn.nn'))
    assert.are.equal("exit 0\n", run((blocks("## Attention variants")), 'local attn = require "attn"; local nn = attn.nn; '
      .. "local n = 64; local q, k, v = attn.randn(1, 8, n, 16), attn.randn(1, 8, n, 16), attn.randn(1, 8, n, 16)"))
  end)
end)
