-- attn.viz.lines: SVG line plots (loss curves), checked with the pure-Lua
-- XML parser of spec/fixtures/xml_check.lua; expected coordinates are
-- computed here from the documented layout (plot box from the <rect
-- class="plot">, the data range spanning it exactly).
local attn = require "attn"
local X = dofile("spec/fixtures/xml_check.lua")
local C = dofile("spec/fixtures/tensor_check.lua")

-- every element under root satisfying pred, in document order
local function collect(root, pred, out)
  out = out or {}
  if pred(root) then out[#out + 1] = root end
  for _, c in ipairs(root.children or {}) do
    if type(c) == "table" then collect(c, pred, out) end
  end
  return out
end

local function points(el)
  local out = {}
  for x, y in el.attrs.points:gmatch("([%-%d.]+),([%-%d.]+)") do out[#out + 1] = {tonumber(x), tonumber(y)} end
  return out
end

describe("attn.viz.lines", function()
  local series = {
    {label = "train <bytes>", y = {4, 3, 2.5, 0 / 0, 2}},
    {label = "val", x = {1, 3, 5}, y = {4.5, 3, 1}},
  }

  it("draws one polyline per run of finite points, placed on the data range, with a legend", function()
    local svg = attn.viz.lines(series, {title = "loss & more", xlabel = "step", ylabel = "nats"})
    local root = X.parse(svg)
    assert.are.equal("svg", root.name)
    local box = collect(root, function(e) return e.name == "rect" and e.attrs.class == "plot" end)[1]
    local left, top = tonumber(box.attrs.x), tonumber(box.attrs.y)
    local right, bottom = left + tonumber(box.attrs.width), top + tonumber(box.attrs.height)
    -- x spans 1..5, y spans 1..4.5 (the finite values)
    local function px(x) return left + (x - 1) / 4 * (right - left) end
    local function py(y) return bottom - (y - 1) / 3.5 * (bottom - top) end
    local lines = collect(root, function(e) return e.name == "polyline" end)
    assert.are.equal(3, #lines)   -- train split by its NaN, then val
    local want = {
      {{1, 4}, {2, 3}, {3, 2.5}},
      {{5, 2}},
      {{1, 4.5}, {3, 3}, {5, 1}},
    }
    for i, line in ipairs(lines) do
      local got = points(line)
      assert.are.equal(#want[i], #got, "polyline " .. i)
      for j, p in ipairs(want[i]) do
        assert.is_true(math.abs(got[j][1] - px(p[1])) <= 0.006, ("polyline %d point %d x"):format(i, j))
        assert.is_true(math.abs(got[j][2] - py(p[2])) <= 0.006, ("polyline %d point %d y"):format(i, j))
      end
    end
    assert.are.equal(lines[1].attrs.stroke, lines[2].attrs.stroke)
    assert.are_not.equal(lines[1].attrs.stroke, lines[3].attrs.stroke)
    local texts = {}
    for _, e in ipairs(collect(root, function(e) return e.name == "text" end)) do
      texts[#texts + 1] = (e.text or "")
    end
    local joined = table.concat(texts, "|")
    for _, piece in ipairs({"train <bytes>", "val", "step", "nats", "loss & more", "4.5", "|1|"}) do
      assert.is_truthy(joined:find(piece, 1, true), piece .. " in " .. joined)
    end
  end)

  it("writes the file and returns its path", function()
    local path = os.tmpname()
    assert.are.equal(path, attn.viz.lines({{y = {1, 2}}}, {file = path}))
    local f = assert(io.open(path, "rb")); local text = f:read("a"); f:close(); os.remove(path)
    assert.are.equal(attn.viz.lines({{y = {1, 2}}}), text)
    assert.is_truthy(text:find("series 1", 1, true))
  end)

  it("draws a constant series in the middle of the plot", function()
    local root = X.parse(attn.viz.lines({{y = {2, 2, 2}}}))
    local box = collect(root, function(e) return e.name == "rect" and e.attrs.class == "plot" end)[1]
    local mid = tonumber(box.attrs.y) + tonumber(box.attrs.height) / 2
    for _, p in ipairs(points(collect(root, function(e) return e.name == "polyline" end)[1])) do
      assert.is_true(math.abs(p[2] - mid) <= 0.006)
    end
  end)

  it("rejects bad series and options by name", function()
    C.fails(function() attn.viz.lines({}) end, "attn.viz.lines: bad argument #1 'series'", "an empty table")
    C.fails(function() attn.viz.lines(attn.ones(3)) end, "got attn.Tensor")
    C.fails(function() attn.viz.lines({{y = {1, "2"}}}) end, "series 1: y[2] must be a number, got string")
    C.fails(function() attn.viz.lines({{y = {1}}, {x = {1, 2}, y = {1}}}) end, "series 2: 'x' must be a list as long")
    C.fails(function() attn.viz.lines({{x = {0 / 0}, y = {1}}}) end, "x[1] must be a finite number")
    C.fails(function() attn.viz.lines({{y = {1}, label = 3}}) end, "'label' must be a string")
    C.fails(function() attn.viz.lines({{y = {1}}}, 5) end, "bad argument #2 'opts'")
    C.fails(function() attn.viz.lines({{y = {1}}}, {width = 50}) end, "option 'width'")
    C.fails(function() attn.viz.lines({{y = {1}}}, {title = 1}) end, "option 'title' must be a string")
    C.fails(function() attn.viz.lines({{y = {1}}}, {file = "/nonexistent/dir/x.svg"}) end, "cannot write")
  end)
end)
