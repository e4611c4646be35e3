-- The user docs (README.md and docs/*.md) name only files that are in the
-- repository, and carry no lab-notebook history: no commit hashes, issue
-- numbers or dates.
local DOCS = { "README.md", "docs/architecture.md", "docs/architecture-core.md", "docs/benchmarks.md", "docs/guarantees.md", "docs/reference.md", "docs/distributed.md", "docs/porting.md" }

local function read(path)
  local f = assert(io.open(path))
  local text = f:read("a")
  f:close()
  return text
end

local function exists(path)
  return os.execute("test -e '" .. path .. "'") == true
end

local function placeholder(p)
  return p:find("NNN", 1, true) or p:find("NAME", 1, true) or p:find("Name%.lua") or p:find("GGML_DIR", 1, true)
    or p:find("^build") or p:find("^doc/") or p:find("^%$") or p:find("PREFIX", 1, true) or p:find("^plots/")
    or p:find("^/") or p:find("^%.%./") or p:find("*", 1, true)
end

-- the repository paths a doc names: link targets, and the words of `code`
-- spans that start with one of the repository's directories (or shared/,
-- which is not in it)
local function named_paths(text, doc)
  local dir = doc:match("^(.*)/") -- links are relative to the doc's directory
  local found = {}
  local function consider(p, relative_to)
    p = p:gsub("#.*$", ""):gsub("[,.:;]$", "")
    if p == "" or p:find("://", 1, true) or placeholder(p) then return end
    local looks = p:match("^[%w_.-]+/[%w_./-]*$") or p:match("^[%w_-]+%.md$") or p:match("^LICENSE$")
    if not looks then return end
    local top = p:match("^([^/]+)/")
    if not relative_to and top and not (top == "src" or top == "lua" or top == "scripts" or top == "spec"
        or top == "docs" or top == "tests" or top == "fuzz" or top == "shared") then return end
    found[#found + 1] = relative_to and (relative_to .. "/" .. p) or p
  end
  for p in text:gmatch("%]%(([^)%s]+)%)") do consider(p, dir) end
  for span in text:gmatch("`([^`\n]+)`") do
    for p in span:gmatch("[^%s`'\"(){}=,]+") do consider(p) end
  end
  return found
end

describe("the user docs", function()
  it("name only files that exist in the repository", function()
    local missing = {}
    for _, doc in ipairs(DOCS) do
      for _, p in ipairs(named_paths(read(doc), doc)) do
        if not exists(p) then missing[#missing + 1] = doc .. ": " .. p end
      end
    end
    assert.are.equal("", table.concat(missing, "\n"))
  end)

  it("finds the paths a doc names: code spans and links (relative to the doc)", function()
    local text = "Run `scripts/attn-lua scripts/no_such.lua --x` and see [the notes](other.md#part), "
      .. "`lua/attn/nn/NAME.lua`, [a site](https://example.org/x.md) and `attn.help()`."
    assert.are.same({ "docs/other.md", "scripts/attn-lua", "scripts/no_such.lua" }, named_paths(text, "docs/x.md"))
    assert.is_false(exists("scripts/no_such.lua"))
  end)

  it("carry no commit hashes, issue numbers, dates or paths outside the repository", function()
    local found = {}
    for _, doc in ipairs(DOCS) do
      local text = read(doc)
      for _, pat in ipairs { "issue #%d+", "#%d%d%f[^%w]", "commit %x%x%x%x%x%x%x", "%f[%w]20%d%d%-%d%d%-%d%d%f[^%w]",
                             "shared/design", "shared/seeds", "api%.md" } do
        local at = text:find(pat)
        if at then found[#found + 1] = doc .. ": " .. text:sub(at, at + 30) end
      end
    end
    assert.are.equal("", table.concat(found, "\n"))
  end)
end)
