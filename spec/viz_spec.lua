-- attn.viz: SVG heatmaps (checked with a pure-Lua XML parser) and terminal
-- drawings. Expected texts and colours are written by hand from the inputs.
local attn = require "attn"
local X = dofile("spec/fixtures/xml_check.lua")

local function has(msg, piece)
  assert.is_truthy(string.find(msg, piece, 1, true), "expected '" .. piece .. "' in: " .. tostring(msg))
end

local function err_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error")
  return tostring(err)
end

local function by_class(root, name, class)
  return X.find(root, function(e) return e.name == name and (class == nil or e.attrs.class == class) end)
end

describe("the XML checker of these specs", function()
  it("accepts well-formed and refuses malformed documents", function()
    assert.are.equal("a", X.parse('<?xml version="1.0"?>\n<a x="1"><b/>t &amp; &lt;</a>').name)
    for _, bad in ipairs({ "<a><b></a></b>", "<a>", "<a x=1></a>", '<a x="1" x="2"/>', "<a>&nope;</a>",
                           "<a/><b/>", "<a>x & y</a>", '<a x="<"/>', "text<a/>" }) do
      assert.has_error(function() X.parse(bad) end, nil, bad)
    end
  end)
end)

describe("attn.viz.heatmap", function()
  -- rows: queries, cols: keys; labels with characters XML must escape
  local w = attn.tensor({ { 0.25, 0.75 }, { 1, 0 }, { 0.5, 0.5 } })
  local rows, cols = { "<s>", "cat", "R&D" }, { "x", "y\"" }

  it("writes a well-formed SVG with one cell per weight, labels, hover values and a legend", function()
    local path = os.tmpname()
    local ret = attn.viz.heatmap(w, { file = path, rows = rows, cols = cols, title = "Layer 1 <head 2>" })
    local f = assert(io.open(path, "rb")); local svg = f:read("a"); f:close(); os.remove(path)
    assert.are.equal(path, ret)  -- with a file: its path; without: the text
    assert.are.equal(svg, attn.viz.heatmap(w, { rows = rows, cols = cols, title = "Layer 1 <head 2>" }))
    local root = X.parse(svg)
    assert.are.equal("svg", root.name)
    assert.are.equal("http://www.w3.org/2000/svg", root.attrs.xmlns)
    local cells = by_class(root, "rect", "cell")
    assert.are.equal(6, #cells)
    -- row-major, with the value on hover
    local titles = {}
    for i, c in ipairs(cells) do titles[i] = c.children[1].name .. ":" .. c.children[1].text end
    assert.are.same({ "title:<s> \u{2192} x: 0.25", "title:<s> \u{2192} y\": 0.75", "title:cat \u{2192} x: 1",
                      "title:cat \u{2192} y\": 0", "title:R&D \u{2192} x: 0.5", "title:R&D \u{2192} y\": 0.5" }, titles)
    local rl, cl = {}, {}
    for _, t in ipairs(by_class(root, "text", "row")) do rl[#rl + 1] = t.text end
    for _, t in ipairs(by_class(root, "text", "col")) do cl[#cl + 1] = t.text end
    assert.are.same(rows, rl)
    assert.are.same(cols, cl)
    has(svg, "Layer 1 &lt;head 2&gt;")
    assert.are.equal(1, #X.find(root, function(e) return e.name == "linearGradient" end))
    local legend = by_class(root, "g", "legend")[1]
    local ticks = {}
    for _, t in ipairs(X.find(legend, function(e) return e.name == "text" end)) do ticks[#ticks + 1] = t.text end
    assert.are.same({ "0", "0.25", "0.5", "0.75", "1" }, ticks)
  end)

  it("colours the range ends with viridis' ends and defaults labels to 1-based indices", function()
    local root = X.parse(attn.viz.heatmap(w))
    local cells = by_class(root, "rect", "cell")
    assert.are.equal("#fde725", cells[3].attrs.fill)  -- 1, the largest: yellow
    assert.are.equal("#440154", cells[4].attrs.fill)  -- 0: dark purple
    local rl = {}
    for _, t in ipairs(by_class(root, "text", "row")) do rl[#rl + 1] = t.text end
    assert.are.same({ "1", "2", "3" }, rl)
    -- an explicit range moves the colours: 1 is now in the middle of [0, 2]
    root = X.parse(attn.viz.heatmap(w, { vmin = 0, vmax = 2 }))
    assert.are.equal("#21908d", by_class(root, "rect", "cell")[3].attrs.fill)
  end)

  it("draws a 1 x 1 matrix, a constant one and NaN without failing", function()
    assert.are.equal(1, #by_class(X.parse(attn.viz.heatmap(attn.tensor({ { 0.5 } }))), "rect", "cell"))
    assert.are.equal(4, #by_class(X.parse(attn.viz.heatmap(attn.zeros(2, 2))), "rect", "cell"))
    local root = X.parse(attn.viz.heatmap(attn.tensor({ { 0 / 0, 1 } })))
    assert.are.equal("#808080", by_class(root, "rect", "cell")[1].attrs.fill)
  end)

  it("refuses bad input with clear errors", function()
    assert.has_error(function() attn.viz.heatmap({ { 1 } }) end)
    has(err_of(function() attn.viz.heatmap({ { 1 } }) end),
      "attn.viz.heatmap: bad argument #1 'weights' (expected attn.Tensor, got table)")
    has(err_of(function() attn.viz.heatmap(attn.zeros(3)) end),
      "attn.viz.heatmap: bad argument #1 'weights' (expected a 2-D [Lq, Lk] weight matrix; use attn.viz.heads for [heads, Lq, Lk], got shape [3])")
    has(err_of(function() attn.viz.heatmap(attn.zeros(2, 3, 3)) end), "got shape [2, 3, 3]")
    has(err_of(function() attn.viz.heatmap(w, { rows = { "a", "b" } }) end),
      "attn.viz.heatmap: option 'rows' has 2 labels for 3 rows (queries)")
    has(err_of(function() attn.viz.heatmap(w, { cols = { "a", "b", "c" } }) end),
      "attn.viz.heatmap: option 'cols' has 3 labels for 2 columns (keys)")
    has(err_of(function() attn.viz.heatmap(w, { cols = { "a", {} } }) end),
      "attn.viz.heatmap: label 2 of 'cols' must be a string or a number, got table")
    has(err_of(function() attn.viz.heatmap(w, "w.svg") end),
      "attn.viz.heatmap: bad argument #2 'opts' (expected a table of options, got string)")
    has(err_of(function() attn.viz.heatmap(w, { title = 3 }) end), "attn.viz.heatmap: option 'title' must be a string, got number")
    has(err_of(function() attn.viz.heatmap(w, { file = "/nonexistent-dir/w.svg" }) end),
      "attn.viz.heatmap: cannot write '/nonexistent-dir/w.svg'")
  end)
end)

describe("attn.viz.heads", function()
  it("draws one panel per head of [heads, Lq, Lk], with shared labels and one legend", function()
    local w = attn.arange(12):view(2, 2, 3) / 11
    local root = X.parse(attn.viz.heads(w, { rows = { "a", "b" }, cols = { "x", "y", "z" }, title = "heads" }))
    assert.are.equal(12, #by_class(root, "rect", "cell"))
    local caps = X.find(root, function(e) return e.name == "text" and e.attrs["font-weight"] == "bold" end)
    local texts = {}
    for _, t in ipairs(caps) do texts[#texts + 1] = t.text end
    assert.are.same({ "heads", "head 1", "head 2" }, texts)
    assert.are.equal(4, #by_class(root, "text", "row"))
    assert.are.equal(1, #by_class(root, "g", "legend"))
    -- one colour scale over both heads: the last weight (1) is yellow, the first (0) purple
    local cells = by_class(root, "rect", "cell")
    assert.are.equal("#440154", cells[1].attrs.fill)
    assert.are.equal("#fde725", cells[12].attrs.fill)
  end)

  it("draws a grid of [b, heads, Lq, Lk], one row per batch element", function()
    local path = os.tmpname()
    assert.are.equal(path, attn.viz.heads(attn.ones(2, 3, 2, 2) * 0.25, { file = path }))
    local f = assert(io.open(path, "rb")); local svg = f:read("a"); f:close(); os.remove(path)
    local root = X.parse(svg)
    assert.are.equal(24, #by_class(root, "rect", "cell"))
    has(svg, ">batch 2, head 3</text>")
  end)

  it("refuses bad input with clear errors", function()
    assert.has_error(function() attn.viz.heads(attn.zeros(2, 2)) end)
    has(err_of(function() attn.viz.heads(attn.zeros(2, 2)) end),
      "attn.viz.heads: bad argument #1 'weights' (expected [heads, Lq, Lk] or [b, heads, Lq, Lk], got shape [2, 2])")
    has(err_of(function() attn.viz.heads("w") end), "attn.viz.heads: bad argument #1 'weights' (expected attn.Tensor, got string)")
    has(err_of(function() attn.viz.heads(attn.zeros(1, 2, 2, 3), { cols = { "a" } }) end),
      "attn.viz.heads: option 'cols' has 1 labels for 3 columns (keys)")
  end)
end)

describe("attn.viz.show", function()
  local w = attn.tensor({ { 0, 1 }, { 0.5, 0.25 } })

  it("draws plain shading characters without colour, and returns the text", function()
    -- range [0, 1]: 0 -> ' ', 1 -> full block, 0.5 -> medium shade, 0.25 -> light shade
    local text = attn.viz.show(w, { color = false, print = false })
    assert.are.equal("1   \u{2588}\u{2588}\n"
                  .. "2 \u{2592}\u{2592}\u{2591}\u{2591}\n"
                  .. "  0   \u{2591}\u{2591}\u{2592}\u{2592}\u{2593}\u{2593}\u{2588}\u{2588} 1\n", text)
  end)

  it("labels rows, lists the column labels and shows a title", function()
    local text = attn.viz.show(w, { color = false, print = false, rows = { "ab", "c" }, cols = { "x", "y" }, title = "T" })
    assert.are.equal("T\nab   \u{2588}\u{2588}\nc  \u{2592}\u{2592}\u{2591}\u{2591}\n   cols: 1=x 2=y\n"
                  .. "   0   \u{2591}\u{2591}\u{2592}\u{2592}\u{2593}\u{2593}\u{2588}\u{2588} 1\n", text)
  end)

  it("uses 256-colour escapes with colour on: the range ends in viridis' cube colours", function()
    local text = attn.viz.show(w, { color = true, print = false })
    -- cube levels 0, 95, 135, 175, 215, 255: 0 -> #440154 -> nearest (1, 0, 1) = 16 + 36 + 1 = 53;
    -- 1 -> #fde725 -> nearest (5, 4, 0) = 16 + 180 + 24 = 220
    has(text, "1 \27[38;5;53m\u{2588}\u{2588}\27[0m\27[38;5;220m\u{2588}\u{2588}\27[0m\n")
    local _, n = text:gsub("\27%[38;5;%d+m", "")
    assert.are.equal(4 + 5, n)
  end)

  it("has no colour when stdout is not a terminal (as under busted)", function()
    local text = attn.viz.show(w, { print = false })
    assert.is_nil(text:find("\27", 1, true))
  end)

  it("refuses bad input with clear errors", function()
    assert.has_error(function() attn.viz.show(nil) end)
    has(err_of(function() attn.viz.show(nil) end), "attn.viz.show: bad argument #1 'weights' (expected attn.Tensor, got nil)")
    has(err_of(function() attn.viz.show(attn.zeros(2, 2, 2)) end), "attn.viz.show: bad argument #1 'weights' (expected a 2-D [Lq, Lk] weight matrix, got shape [2, 2, 2])")
    has(err_of(function() attn.viz.show(w, { rows = { "a" } }) end), "attn.viz.show: option 'rows' has 1 labels for 2 rows (queries)")
  end)
end)
