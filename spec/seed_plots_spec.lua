-- The notebook ports' --plots DIR: one SVG heatmap per printed attention-weight
-- matrix, the printed text unchanged.
local X = dofile("spec/fixtures/xml_check.lua")

local function by_class(node, name, class, out)
  out = out or {}
  if node.name == name and node.attrs.class == class then out[#out + 1] = node end
  for _, c in ipairs(node.children or {}) do by_class(c, name, class, out) end
  return out
end

local function texts(node, out)
  out = out or {}
  if node.name == "text" then out[#out + 1] = node.text end
  for _, c in ipairs(node.children or {}) do texts(c, out) end
  return out
end

local function run(cmd)
  local p = io.popen(cmd:find("2>", 1, true) and cmd or cmd .. " 2>/dev/null")
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

describe("notebook ports with --plots DIR", function()
  local dir = os.tmpname()
  os.remove(dir)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("002 writes one heatmap per printed weight matrix and prints the same text", function()
    local plain, rc1 = run("scripts/attn-lua scripts/examples/seeds/002_attention_chapter.lua")
    local with, rc2 = run("scripts/attn-lua scripts/examples/seeds/002_attention_chapter.lua --plots " .. dir)
    assert.are.equal(0, rc1)
    assert.are.equal(0, rc2)
    assert.are.equal(plain, with)
    local names = {
      "002_01_attn_weights_2", "002_02_attn_weights", "002_03_attn_weights", "002_04_attn_weights",
      "002_05_masked_simple", "002_06_masked_simple_norm", "002_07_causal_attn_weights",
      "002_08_dropped_weights",
    }
    for i, name in ipairs(names) do
      local root = X.parse(read(dir .. "/" .. name .. ".svg"))
      assert.are.equal("svg", root.name)
      -- the query row of "journey" is one row of six cells, the rest 6 x 6
      assert.are.equal(i == 1 and 6 or 36, #by_class(root, "rect", "cell"), name)
      local labels = table.concat(texts(root), " ")
      for _, tok in ipairs({ "Your", "journey", "starts", "with", "one", "step" }) do
        assert.truthy(labels:find(tok, 1, true), name .. " lacks the label " .. tok)
      end
    end
    -- the causal matrix hides the upper triangle: those cells hold 0
    local root = X.parse(read(dir .. "/002_07_causal_attn_weights.svg"))
    local cells = by_class(root, "rect", "cell")
    assert.truthy(cells[2].children[1].text:find(": 0$"), cells[2].children[1].text)
  end)

  it("a port that prints no weight matrix says so; a bad argument is a usage error", function()
    local out, rc = run("scripts/attn-lua scripts/examples/seeds/004_listings_3_1_3_2.lua --plots " .. dir .. " 2>&1 >/dev/null")
    assert.are.equal(0, rc)
    assert.truthy(out:find("prints no attention-weight matrix", 1, true), out)
    local _, rc2 = run("scripts/attn-lua scripts/examples/seeds/004_listings_3_1_3_2.lua --plot " .. dir)
    assert.are.equal(2, rc2)
    local msg = run("scripts/attn-lua scripts/examples/seeds/004_listings_3_1_3_2.lua --plots 2>&1")
    assert.truthy(msg:find("--plots needs a directory", 1, true), msg)
  end)
end)
