-- The README's "first session" REPL transcript, run through the REPL as typed:
-- every line works (no "error:"), the tensor prints, the SVG is written.
local X = dofile("spec/fixtures/xml_check.lua")

local function first_session()
  local f = assert(io.open("README.md"))
  local text = f:read("a")
  f:close()
  local block = text:match("### A first session.-```sh.-```%s*```\n(.-)```")
  assert(block, "README.md has no first-session transcript")
  local input = {}
  for line in block:gmatch("([^\n]*)\n") do
    local typed = line:match("^>> (.*)$") or line:match("^> (.*)$")
    if typed then input[#input + 1] = typed end
  end
  return input
end

describe("README first session", function()
  it("runs in the REPL as written and writes the heatmap", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local input = first_session()
    assert.is_true(#input >= 8)
    local script = dir .. "/input.txt"
    local f = assert(io.open(script, "w"))
    f:write(table.concat(input, "\n"), "\n")
    f:close()
    local here = io.popen("pwd"):read("l")
    local p = io.popen("cd " .. dir .. " && " .. here .. "/scripts/attn-lua < input.txt 2>&1")
    local out = p:read("a")
    p:close()
    assert.is_nil(out:find("error:", 1, true), out)
    assert.truthy(out:find("tensor([[[", 1, true), out)
    assert.truthy(out:find("journey", 1, true), out)
    local svgf = assert(io.open(dir .. "/mha.svg"))
    local root = X.parse(svgf:read("a"))
    svgf:close()
    assert.are.equal("svg", root.name)
    os.execute("rm -rf " .. dir)
  end)
end)
