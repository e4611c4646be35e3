-- The REPL (scripts/attn-lua with no arguments), driven through a pipe: stdin
-- is not a terminal, so there are no prompts and the output is the banner,
-- then one result (or error) per input. Expected texts are written by hand
-- (tensors in PyTorch 1.13's print format).
local repl = require "attn.tools.repl"

local function run_repl(input)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(input)
  f:close()
  local p = assert(io.popen("scripts/attn-lua < " .. path .. " 2>&1"))
  local out = p:read("a")
  local ok, how, code = p:close()
  os.remove(path)
  return out, ok, how, code
end

-- feed the lines to repl.loop and collect what it writes
local function loop(lines, env)
  local out, i = {}, 0
  repl.loop {
    read = function() i = i + 1 return lines[i] end,
    write = function(s) out[#out + 1] = s end,
    env = env or setmetatable({}, { __index = _G }),
  }
  return table.concat(out)
end

describe("the REPL through a pipe", function()
  it("prints the banner, values of expressions, a multi-line function's result, errors, and goes on", function()
    local out, ok = run_repl(table.concat({
      "x = attn.eye(2)",
      "x * 2",
      "function double(t)",
      "  return t + t",
      "end",
      "double(attn.ones(3))",
      "attn.matmul(attn.ones(2, 3), attn.ones(4, 5))",
      "x:size()",
      "nn.Linear",
      "1 + 1, 'two'",
    }, "\n") .. "\n")
    assert.is_true(ok)
    local want = table.concat({
      repl.BANNER,
      "tensor([[2., 0.],",
      "        [0., 2.]])",
      "tensor([2., 2., 2.])",
      "error: attn.matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 ~= 4)",
      "{2, 2}",
      "class attn.nn.Linear",
      "2\ttwo",
    }, "\n") .. "\n"
    assert.are.equal(want, out)
    assert.is_nil(out:find("stack traceback", 1, true))
  end)

  it("says attn.help exists in its banner, and attn.help works in it", function()
    local out = run_repl('attn.help("softmax")\n')
    assert.is_truthy(out:find("attn.help()", 1, true))
    assert.is_truthy(out:find("\nattn.softmax\nsoftmax along dim", 1, true), out)
  end)

  it("prints attn.get_printoptions() readably, and attn.help of an unknown name goes on", function()
    local out, ok = run_repl(table.concat({
      "attn.get_printoptions()",
      "attn.set_printoptions { profile = 'full', precision = 2, sci_mode = false }",
      "o = attn.get_printoptions()",
      "o",
      "o.precision, o.threshold",
      "attn.set_printoptions { profile = 'default' }",
      "attn.help('tranpose')",
      "attn.help('transpose')",
      "print('after')",
    }, "\n") .. "\n")
    assert.is_true(ok)
    local want = table.concat({
      repl.BANNER,
      "{precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = nil (automatic)}",
      "{precision = 2, threshold = math.huge, edgeitems = 3, linewidth = 80, sci_mode = false}",
      "2\tinf",
      "attn.help: no doc for 'tranpose'; did you mean Tensor.transpose?",
      "attn.Tensor.transpose",
      "A view with dims d1 and d2 swapped.",
      "  d1 a dim",
      "  d2 a dim",
      "after",
    }, "\n") .. "\n"
    assert.are.equal(want, out)
  end)

  it("ends at the end of input (Ctrl-D) in the middle of a chunk, with status 0", function()
    local out, ok = run_repl("for i = 1, 3 do\n")
    assert.is_true(ok)
    assert.are.equal(repl.BANNER .. "\n", out)
  end)

  it("reports a syntax error by its message alone", function()
    local out = run_repl("x = )\nprint('after')\n")
    assert.are.equal(repl.BANNER .. "\nerror: unexpected symbol near ')'\nafter\n", out)
  end)
end)

describe("attn.repl.loop", function()
  it("keeps globals between chunks and runs statements without printing", function()
    assert.are.equal("6\n", loop({ "a = 2", "b = a * 3", "b" }))
  end)

  it("continues an unfinished expression or table on the next lines", function()
    assert.are.equal("3\n", loop({ "1 +", "2" }))
    assert.are.equal("{1, 2, 3}\n", loop({ "t = {1,", "2,", "3}", "t" }))
  end)

  it("strips the chunk's position from errors raised in Lua code, and shows non-string errors", function()
    assert.are.equal("error: boom\nerror: (error object is a table value)\nok\n",
      loop({ "error('boom')", "error({})", "'ok'" }))
  end)

  it("prints nothing for a call that returns nothing, and nil when nil is returned", function()
    assert.are.equal("nil\n", loop({ "(function() end)()", "nil" }))
  end)
end)

describe("attn.repl.compile", function()
  it("tells complete, incomplete and wrong chunks apart", function()
    assert.is_function(repl.compile("1 + 2", {}))
    assert.is_function(repl.compile("local x = 1", {}))
    local fn, why = repl.compile("function f()", {})
    assert.is_nil(fn)
    assert.are.equal("incomplete", why)
    fn, why = repl.compile("x = = 1", {})
    assert.is_nil(fn)
    assert.are.equal("stdin:1: unexpected symbol near '='", why)
  end)
end)
