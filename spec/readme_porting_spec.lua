-- docs/porting.md's transcript, run through the REPL as
-- typed: the output must be its lines exactly (the values were
-- checked against PyTorch 1.13 when written: see the comments there).
local repl = require "attn.tools.repl"

local function transcript()
  local f = assert(io.open("docs/porting.md"))
  local text = f:read("a")
  f:close()
  local block = text:match("# Porting from PyTorch, by example.-```\n(.-)```")
  assert(block, "docs/porting.md has no porting transcript")
  local input, output = {}, {}
  for line in block:gmatch("([^\n]*)\n") do
    local typed = line:match("^>> (.*)$") or line:match("^> (.*)$")
    if typed then input[#input + 1] = typed else output[#output + 1] = line end
  end
  return input, output
end

describe("README porting transcript", function()
  it("prints, line for line, what the README shows", function()
    local input, output = transcript()
    assert.is_true(#input >= 20 and #output >= 14)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(table.concat(input, "\n"), "\n")
    f:close()
    local p = assert(io.popen("scripts/attn-lua < " .. path .. " 2>&1"))
    local out = p:read("a")
    p:close()
    os.remove(path)
    assert.are.equal(repl.BANNER .. "\n" .. table.concat(output, "\n") .. "\n", out)
  end)
end)
