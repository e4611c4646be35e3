--- Attention heatmaps: SVG files and terminal pictures.
--
--    local w = attn.softmax(scores, -1)                 -- [Lq, Lk]
--    attn.viz.heatmap(w, {file = "w.svg", rows = q_tokens, cols = k_tokens,
--                         title = "layer 1, head 1"})
--    attn.viz.heads(mha_weights, {file = "heads.svg"})  -- [heads, Lq, Lk] or [b, heads, Lq, Lk]
--    attn.viz.show(w)                                   -- draws it in the terminal
--
-- The SVG is self-contained (no scripts, no external fonts or styles): one
-- rectangle per weight with its value in a `<title>` (shown on hover), token
-- labels on both axes, a colour legend. Colours follow the viridis scale from
-- `vmin` (dark purple) to `vmax` (yellow).
-- @module attn.viz
-- attn's init.lua loads this file while it builds the module: its checks
-- come from attn.argcheck rather than from requiring "attn" (a loop).
local argcheck = require "attn.argcheck"

local viz = {}

local is_tensor = argcheck.is_tensor

-- ---- shared helpers ------------------------------------------------------

local fail = argcheck.fail
local shape_str = argcheck.shape

local function check_opts(fname, opts, arg)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    fail(fname, "bad argument #%d 'opts' (expected a table of options, got %s)", arg, type(opts))
  end
  for _, key in ipairs({ "file", "title" }) do
    if opts[key] ~= nil and type(opts[key]) ~= "string" then
      fail(fname, "option '%s' must be a string, got %s", key, type(opts[key]))
    end
  end
  -- io.open would cut the path at a NUL and write somewhere else
  if opts.file ~= nil and opts.file:find("\0", 1, true) then
    fail(fname, "bad option 'file' (a path with an embedded NUL byte)")
  end
  for _, key in ipairs({ "vmin", "vmax", "cell" }) do
    local v = opts[key]
    if v ~= nil and (type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge) then
      fail(fname, "option '%s' must be a finite number, got %s", key, type(v) == "number" and tostring(v) or type(v))
    end
  end
  if opts.cell and opts.cell <= 0 then fail(fname, "option 'cell' must be positive, got %s", tostring(opts.cell)) end
  return opts
end

local function check_tensor(fname, w, ranks, hint)
  if not is_tensor(w) then
    fail(fname, "bad argument #1 'weights' (expected attn.Tensor, got %s)", type(w))
  end
  for _, r in ipairs(ranks) do if w:dim() == r then return end end
  fail(fname, "bad argument #1 'weights' (expected %s, got shape %s)", hint, shape_str(w))
end

--- The most rows or columns a drawing takes per matrix: 512. Larger inputs
-- are refused with a hint to narrow them first.
viz.MAX_SIDE = 512
--- The most cells a drawing takes in all: 2^20 (an SVG cell is about 200
-- bytes: a 3000 x 3000 expanded view would write 2 GB).
viz.MAX_CELLS = 1048576

local function check_cells(fname, w, panels, nq, nk)
  if nq > viz.MAX_SIDE or nk > viz.MAX_SIDE or panels * nq * nk > viz.MAX_CELLS then
    fail(fname, "a weight tensor of shape %s is too large to draw (at most %d rows and %d columns per matrix and "
      .. "%d cells in all, got %d x %d%s); narrow it first with w:narrow(dim, start, length)", shape_str(w),
      viz.MAX_SIDE, viz.MAX_SIDE, viz.MAX_CELLS, nq, nk,
      panels > 1 and string.format(" in %d panels", panels) or "")
  end
end

-- labels: nil -> "1".."n"; a list of n strings/numbers otherwise
local function labels(fname, list, n, which)
  if list == nil then
    local out = {}
    for i = 1, n do out[i] = tostring(i) end
    return out
  end
  if type(list) ~= "table" then fail(fname, "option '%s' must be a list of labels, got %s", which, type(list)) end
  if #list ~= n then
    fail(fname, "option '%s' has %d labels for %d %s", which, #list, n, which == "rows" and "rows (queries)" or "columns (keys)")
  end
  local out = {}
  for i = 1, n do
    local v = list[i]
    if type(v) ~= "string" and type(v) ~= "number" then
      fail(fname, "label %d of '%s' must be a string or a number, got %s", i, which, type(v))
    end
    out[i] = tostring(v)
  end
  return out
end

-- the value range of a list of matrices: [min(0, data), max(data)] unless given
local function value_range(mats, opts)
  local lo, hi = math.huge, -math.huge
  for _, m in ipairs(mats) do
    for _, row in ipairs(m) do
      for _, v in ipairs(row) do
        if v == v and v > -math.huge and v < math.huge then
          if v < lo then lo = v end
          if v > hi then hi = v end
        end
      end
    end
  end
  if lo > hi then lo, hi = 0, 1 end -- nothing finite
  if lo > 0 then lo = 0 end
  lo, hi = opts.vmin or lo, opts.vmax or hi
  if hi <= lo then hi = lo + 1 end
  return lo, hi
end

-- viridis, sampled at 9 stops
local VIRIDIS = {
  { 68, 1, 84 }, { 71, 44, 122 }, { 59, 81, 139 }, { 44, 113, 142 }, { 33, 144, 141 },
  { 39, 173, 129 }, { 92, 200, 99 }, { 170, 220, 50 }, { 253, 231, 37 },
}

local function colour(v, lo, hi)
  if v ~= v then return 128, 128, 128 end -- NaN: grey
  local x = (v - lo) / (hi - lo)
  if x ~= x then x = 0 end -- a range too narrow for doubles (lo + 1 == lo)
  if x < 0 then x = 0 elseif x > 1 then x = 1 end
  local pos = x * (#VIRIDIS - 1)
  local i = math.floor(pos)
  if i >= #VIRIDIS - 1 then i = #VIRIDIS - 2 end
  local f = pos - i
  local a, b = VIRIDIS[i + 1], VIRIDIS[i + 2]
  return math.floor(a[1] + (b[1] - a[1]) * f + 0.5), math.floor(a[2] + (b[2] - a[2]) * f + 0.5),
         math.floor(a[3] + (b[3] - a[3]) * f + 0.5)
end

local function hex(r, g, b) return string.format("#%02x%02x%02x", r, g, b) end

local function fmtv(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return string.format("%.4g", v)
end

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&apos;" })
    :gsub("[%z\1-\8\11\12\14-\31]", "?"))
end

local function text_width(s, px) return #s * px * 0.6 end

local function max_width(list, px)
  local w = 0
  for _, s in ipairs(list) do w = math.max(w, text_width(s, px)) end
  return w
end

local function write_file(fname, path, text)
  local f, err = io.open(path, "wb")
  if not f then fail(fname, "cannot write '%s': %s", path, tostring(err)) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then fail(fname, "cannot write '%s': %s", path, tostring(werr)) end
end

-- ---- SVG -----------------------------------------------------------------

-- One panel: the cells of matrix m with labels, at (x, y). Returns its width,
-- height and the SVG elements (appended to out).
local function panel(out, m, rows, cols, x, y, cell, lo, hi, caption)
  local px = math.max(9, math.min(13, cell * 0.45))
  local left = max_width(rows, px) + 8
  local top = max_width(cols, px) * 0.75 + 10 + (caption and 20 or 0)
  local nq, nk = #rows, #cols
  out[#out + 1] = string.format('<g transform="translate(%g,%g)">', x, y)
  if caption then
    out[#out + 1] = string.format('<text x="%g" y="14" font-size="13" font-weight="bold">%s</text>', left, esc(caption))
  end
  -- column labels (keys), slanted, above the grid
  for j = 1, nk do
    local cx, cy = left + (j - 0.5) * cell, top - 6
    out[#out + 1] = string.format(
      '<text class="col" x="%g" y="%g" font-size="%g" transform="rotate(-45 %g %g)">%s</text>',
      cx, cy, px, cx, cy, esc(cols[j]))
  end
  -- row labels (queries), right-aligned left of the grid
  for i = 1, nq do
    out[#out + 1] = string.format(
      '<text class="row" x="%g" y="%g" font-size="%g" text-anchor="end" dominant-baseline="middle">%s</text>',
      left - 5, top + (i - 0.5) * cell, px, esc(rows[i]))
  end
  local show_values = cell >= 26
  for i = 1, nq do
    for j = 1, nk do
      local v = m[i][j]
      local r, g, b = colour(v, lo, hi)
      out[#out + 1] = string.format(
        '<rect class="cell" x="%g" y="%g" width="%g" height="%g" fill="%s"><title>%s \226\134\146 %s: %s</title></rect>',
        left + (j - 1) * cell, top + (i - 1) * cell, cell, cell, hex(r, g, b), esc(rows[i]), esc(cols[j]), fmtv(v))
      if show_values then
        local light = (0.299 * r + 0.587 * g + 0.114 * b) < 140
        out[#out + 1] = string.format(
          '<text x="%g" y="%g" font-size="%g" text-anchor="middle" dominant-baseline="middle" fill="%s" pointer-events="none">%s</text>',
          left + (j - 0.5) * cell, top + (i - 0.5) * cell, math.min(11, cell * 0.34), light and "#fff" or "#000",
          (v == v and v > -math.huge and v < math.huge) and string.format("%.2f", v) or fmtv(v))
      end
    end
  end
  out[#out + 1] = string.format('<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444" stroke-width="0.5"/>',
    left, top, nk * cell, nq * cell)
  out[#out + 1] = "</g>"
  return left + nk * cell, top + nq * cell
end

-- The colour legend: a vertical gradient bar with 5 ticks, at (x, y).
local function legend(out, x, y, h, lo, hi)
  out[#out + 1] = '<defs><linearGradient id="attn-viridis" x1="0" y1="1" x2="0" y2="0">'
  for k = 0, 8 do
    local r, g, b = colour(lo + (hi - lo) * k / 8, lo, hi)
    out[#out + 1] = string.format('<stop offset="%g" stop-color="%s"/>', k / 8, hex(r, g, b))
  end
  out[#out + 1] = "</linearGradient></defs>"
  out[#out + 1] = string.format('<g class="legend" transform="translate(%g,%g)">', x, y)
  out[#out + 1] = string.format('<rect width="14" height="%g" fill="url(#attn-viridis)" stroke="#444" stroke-width="0.5"/>', h)
  for k = 0, 4 do
    local ty = h - h * k / 4
    out[#out + 1] = string.format('<line x1="14" x2="18" y1="%g" y2="%g" stroke="#444"/>', ty, ty)
    out[#out + 1] = string.format('<text x="21" y="%g" font-size="10" dominant-baseline="middle">%s</text>', ty,
      fmtv(lo + (hi - lo) * k / 4))
  end
  out[#out + 1] = "</g>"
  return 60
end

local function document(body, width, height, title)
  if title then width = math.max(width, 20 + text_width(title, 16) * 1.1) end
  local out = {
    '<?xml version="1.0" encoding="UTF-8"?>',
    string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
      .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">', math.ceil(width), math.ceil(height),
      math.ceil(width), math.ceil(height)),
  }
  if title then out[#out + 1] = "<title>" .. esc(title) .. "</title>" end
  out[#out + 1] = string.format('<rect width="100%%" height="100%%" fill="#fff"/>')
  if title then
    out[#out + 1] = string.format('<text x="10" y="22" font-size="16" font-weight="bold">%s</text>', esc(title))
  end
  for _, e in ipairs(body) do out[#out + 1] = e end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

--- SVG heatmap of a [Lq, Lk] attention-weight matrix.
-- @param w tensor [Lq, Lk] (rows: queries, columns: keys)
-- @param[opt] opts table: `file` (write the SVG there), `rows` (Lq labels,
-- e.g. the query tokens), `cols` (Lk labels), `title`, `vmin`/`vmax` (colour
-- range; default min(0, smallest) .. largest value), `cell` (pixels, default 32)
-- @return the SVG text, or the path when `file` is given
-- @raise an error for more than `attn.viz.MAX_SIDE` (512) rows or columns:
-- narrow the matrix first (the SVG would run to gigabytes)
function viz.heatmap(w, opts)
  local fname = "attn.viz.heatmap"
  check_tensor(fname, w, { 2 }, "a 2-D [Lq, Lk] weight matrix; use attn.viz.heads for [heads, Lq, Lk]")
  opts = check_opts(fname, opts, 2)
  local nq, nk = w:size(1), w:size(2)
  check_cells(fname, w, 1, nq, nk)
  local rows, cols = labels(fname, opts.rows, nq, "rows"), labels(fname, opts.cols, nk, "cols")
  local m = w:totable()
  local lo, hi = value_range({ m }, opts)
  local cell = opts.cell or 32
  local body = {}
  local top = opts.title and 34 or 8
  local pw, ph = panel(body, m, rows, cols, 8, top, cell, lo, hi, nil)
  local lh = math.max(80, math.min(ph - 40, 300))
  local lw = legend(body, 8 + pw + 16, top + ph - lh, lh, lo, hi)
  local svg = document(body, 8 + pw + 16 + lw, top + ph + 10, opts.title)
  if opts.file then
    write_file(fname, opts.file, svg)
    return opts.file
  end
  return svg
end

--- SVG grid of heatmaps, one per head: [heads, Lq, Lk] (one row of panels)
-- or [b, heads, Lq, Lk] (one row per batch element), with one colour scale.
-- @param w tensor
-- @param[opt] opts as for `heatmap`, with `cell` defaulting to 20
-- @return the SVG text, or the path when `file` is given
-- @raise an error beyond 512 rows or columns per panel or `attn.viz.MAX_CELLS`
-- (2^20) cells in all: narrow the heads or the sequence first
function viz.heads(w, opts)
  local fname = "attn.viz.heads"
  check_tensor(fname, w, { 3, 4 }, "[heads, Lq, Lk] or [b, heads, Lq, Lk]")
  opts = check_opts(fname, opts, 2)
  local shown = w
  if w:dim() == 3 then w = w:unsqueeze(1) end
  local nb, nh, nq, nk = w:size(1), w:size(2), w:size(3), w:size(4)
  check_cells(fname, shown, nb * nh, nq, nk)
  local rows, cols = labels(fname, opts.rows, nq, "rows"), labels(fname, opts.cols, nk, "cols")
  local all = w:totable()
  local mats = {}
  for b = 1, nb do for h = 1, nh do mats[#mats + 1] = all[b][h] end end
  local lo, hi = value_range(mats, opts)
  local cell = opts.cell or 20
  local body = {}
  local top = opts.title and 34 or 8
  local y, width = top, 0
  for b = 1, nb do
    local x, rowh = 8, 0
    for h = 1, nh do
      local caption = nb > 1 and string.format("batch %d, head %d", b, h) or string.format("head %d", h)
      local pw, ph = panel(body, all[b][h], rows, cols, x, y, cell, lo, hi, caption)
      x = x + pw + 24
      rowh = math.max(rowh, ph)
    end
    width = math.max(width, x)
    y = y + rowh + 16
  end
  local lh = math.max(80, math.min(y - top - 40, 300))
  local lw = legend(body, width, y - 16 - lh, lh, lo, hi)
  local svg = document(body, width + lw, y, opts.title)
  if opts.file then
    write_file(fname, opts.file, svg)
    return opts.file
  end
  return svg
end

-- ---- terminal ------------------------------------------------------------

local function stdout_is_terminal()
  -- the shell inherits our stdout: `test -t 1` asks about it
  local ok = os.execute("test -t 1")
  return ok == true or ok == 0
end

-- nearest xterm 256-colour cube entry of an RGB colour
local function xterm256(r, g, b)
  local function q(c) return c < 48 and 0 or c < 115 and 1 or math.floor((c - 35) / 40) end
  return 16 + 36 * q(r) + 6 * q(g) + q(b)
end

local SHADES = { " ", "\226\150\145", "\226\150\146", "\226\150\147", "\226\150\136" } -- ' ░▒▓█'

--- Draws a [Lq, Lk] weight matrix in the terminal (or returns the text).
-- With colour (default: when stdout is a terminal) each weight is two
-- full blocks in a 256-colour viridis shade; without, one of ` ░▒▓█` twice.
-- @param w tensor [Lq, Lk]
-- @param[opt] opts table: `rows`, `cols` (labels), `title`, `vmin`, `vmax`,
-- `color` (true/false: force colour on or off), `print` (false: only return the text)
-- @return the text, when `print = false` (else it prints and returns nothing)
-- @raise an error beyond 512 rows or columns, as `heatmap`
function viz.show(w, opts)
  local fname = "attn.viz.show"
  check_tensor(fname, w, { 2 }, "a 2-D [Lq, Lk] weight matrix")
  opts = check_opts(fname, opts, 2)
  local nq, nk = w:size(1), w:size(2)
  check_cells(fname, w, 1, nq, nk)
  local rows, cols = labels(fname, opts.rows, nq, "rows"), labels(fname, opts.cols, nk, "cols")
  local color = opts.color
  if color == nil then color = stdout_is_terminal() end
  local m = w:totable()
  local lo, hi = value_range({ m }, opts)
  local lw = 0
  for _, s in ipairs(rows) do lw = math.max(lw, utf8.len(s) or #s) end
  local function pad(s, n) return s .. string.rep(" ", n - (utf8.len(s) or #s)) end
  local function glyph(v)
    if color then
      local r, g, b = colour(v, lo, hi)
      return string.format("\27[38;5;%dm\226\150\136\226\150\136\27[0m", xterm256(r, g, b))
    end
    if v ~= v then return "??" end
    local x = (v - lo) / (hi - lo)
    if x ~= x then x = 0 end -- a range too narrow (or wide) for doubles
    if x < 0 then x = 0 elseif x > 1 then x = 1 end
    local s = SHADES[math.floor(x * (#SHADES - 1) + 0.5) + 1]
    return s .. s
  end
  local lines = {}
  if opts.title then lines[#lines + 1] = opts.title end
  for i = 1, nq do
    local cells = {}
    for j = 1, nk do cells[j] = glyph(m[i][j]) end
    lines[#lines + 1] = pad(rows[i], lw) .. " " .. table.concat(cells)
  end
  -- column labels: the key index under each column pair, then the key list
  local keys = {}
  for j = 1, nk do keys[j] = j .. "=" .. cols[j] end
  if opts.cols then lines[#lines + 1] = string.rep(" ", lw + 1) .. "cols: " .. table.concat(keys, " ") end
  local scale = {}
  for k = 0, 4 do scale[#scale + 1] = glyph(lo + (hi - lo) * k / 4) end
  lines[#lines + 1] = string.rep(" ", lw + 1) .. fmtv(lo) .. " " .. table.concat(scale) .. " " .. fmtv(hi)
  local text = table.concat(lines, "\n") .. "\n"
  if opts.print == false then return text end
  io.stdout:write(text)
end

-- ---- line plots (loss curves) ---------------------------------------------

local LINE_COLOURS = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b" }

--- The most points one `lines` plot draws in all (the SVG grows with them).
viz.MAX_POINTS = 1000000

local function check_series(fname, series)
  if type(series) ~= "table" or is_tensor(series) or #series == 0 then
    fail(fname, "bad argument #1 'series' (expected a non-empty list of {label = ..., y = {...}[, x = {...}]}, got %s)",
      is_tensor(series) and "attn.Tensor" or (type(series) == "table" and "an empty table" or type(series)))
  end
  local total = 0
  for i, s in ipairs(series) do
    if type(s) ~= "table" or type(s.y) ~= "table" then
      fail(fname, "series %d must be a table with a list 'y' of numbers, got %s", i,
        type(s) == "table" and ("'y' = " .. type(s.y)) or type(s))
    end
    if s.label ~= nil and type(s.label) ~= "string" then
      fail(fname, "series %d: 'label' must be a string, got %s", i, type(s.label))
    end
    if s.x ~= nil and (type(s.x) ~= "table" or #s.x ~= #s.y) then
      fail(fname, "series %d: 'x' must be a list as long as 'y' (%d), got %s", i, #s.y,
        type(s.x) == "table" and ("%d values"):format(#s.x) or type(s.x))
    end
    for j = 1, #s.y do
      local y, x = s.y[j], s.x and s.x[j] or j
      if type(y) ~= "number" then fail(fname, "series %d: y[%d] must be a number, got %s", i, j, type(y)) end
      if type(x) ~= "number" or x ~= x or math.abs(x) == math.huge then
        fail(fname, "series %d: x[%d] must be a finite number, got %s", i, j, tostring(x))
      end
    end
    total = total + #s.y
  end
  if total > viz.MAX_POINTS then
    fail(fname, "%d points in all, more than attn.viz.MAX_POINTS = %d", total, viz.MAX_POINTS)
  end
end

-- min and max over finite values of field `key` (x defaults to the index)
local function finite_range(series, key)
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(series) do
    for j = 1, #s.y do
      local v = key == "x" and (s.x and s.x[j] or j) or s.y[j]
      if v == v and math.abs(v) ~= math.huge then lo, hi = math.min(lo, v), math.max(hi, v) end
    end
  end
  if lo > hi then return nil end
  if lo == hi then return lo - 0.5, hi + 0.5 end
  return lo, hi
end

--- SVG line plot of one or more series (loss curves): axes with 5 ticks
-- each (at the data range's ends and between: the plot spans exactly the
-- finite values' min..max), one polyline per series (a NaN or infinite y
-- breaks the line there), a legend of the labels.
-- @param series a list of `{label = "train", y = {...}[, x = {...}]}` (x defaults to 1, 2, ...)
-- @param[opt] opts table: `file` (write the SVG there), `title`, `xlabel`, `ylabel`,
-- `width` (default 640), `height` (default 400), pixels
-- @return the SVG text, or the path when `file` is given
function viz.lines(series, opts)
  local fname = "attn.viz.lines"
  check_series(fname, series)
  if opts ~= nil and type(opts) ~= "table" then
    fail(fname, "bad argument #2 'opts' (expected a table of options, got %s)", type(opts))
  end
  opts = opts or {}
  for _, key in ipairs({ "file", "title", "xlabel", "ylabel" }) do
    if opts[key] ~= nil and type(opts[key]) ~= "string" then
      fail(fname, "option '%s' must be a string, got %s", key, type(opts[key]))
    end
  end
  if opts.file ~= nil and opts.file:find("\0", 1, true) then
    fail(fname, "bad option 'file' (a path with an embedded NUL byte)")
  end
  for _, key in ipairs({ "width", "height" }) do
    local v = opts[key]
    if v ~= nil and (type(v) ~= "number" or not (v >= 200 and v <= 10000)) then
      fail(fname, "option '%s' must be a number of pixels in [200, 10000], got %s", key,
        type(v) == "number" and tostring(v) or type(v))
    end
  end
  local width, height = opts.width or 640, opts.height or 400
  -- the plot area: room for tick labels on the left, the x label below, the title above
  local left, right = 70, width - 20
  local top, bottom = opts.title and 40 or 16, height - (opts.xlabel and 50 or 34)
  local xlo, xhi = finite_range(series, "x")
  local ylo, yhi = finite_range(series, "y")
  if not ylo then ylo, yhi = -0.5, 0.5 end
  if not xlo then xlo, xhi = 0.5, 1.5 end
  local function px(x) return left + (x - xlo) / (xhi - xlo) * (right - left) end
  local function py(y) return bottom - (y - ylo) / (yhi - ylo) * (bottom - top) end
  local body = {}
  body[#body + 1] = string.format('<rect class="plot" x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="none" '
    .. 'stroke="#444"/>', left, top, right - left, bottom - top)
  for k = 0, 4 do
    local xv, yv = xlo + (xhi - xlo) * k / 4, ylo + (yhi - ylo) * k / 4
    body[#body + 1] = string.format('<line class="grid" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#ddd"/>',
      left, py(yv), right, py(yv))
    body[#body + 1] = string.format('<text class="ytick" x="%.2f" y="%.2f" font-size="11" text-anchor="end">%s</text>',
      left - 6, py(yv) + 4, esc(fmtv(yv)))
    body[#body + 1] = string.format('<text class="xtick" x="%.2f" y="%.2f" font-size="11" text-anchor="middle">%s</text>',
      px(xv), bottom + 16, esc(fmtv(xv)))
  end
  if opts.xlabel then
    body[#body + 1] = string.format('<text class="xlabel" x="%.2f" y="%.2f" font-size="13" text-anchor="middle">%s</text>',
      (left + right) / 2, height - 12, esc(opts.xlabel))
  end
  if opts.ylabel then
    body[#body + 1] = string.format('<text class="ylabel" x="14" y="%.2f" font-size="13" text-anchor="middle" '
      .. 'transform="rotate(-90 14 %.2f)">%s</text>', (top + bottom) / 2, (top + bottom) / 2, esc(opts.ylabel))
  end
  for i, s in ipairs(series) do
    local colour = LINE_COLOURS[(i - 1) % #LINE_COLOURS + 1]
    -- runs of finite points; a non-finite y ends a run
    local run = {}
    local function flush()
      if #run > 0 then
        body[#body + 1] = string.format('<polyline class="series" data-series="%d" fill="none" stroke="%s" '
          .. 'stroke-width="1.5" points="%s"/>', i, colour, table.concat(run, " "))
      end
      run = {}
    end
    for j = 1, #s.y do
      local y = s.y[j]
      if y == y and math.abs(y) ~= math.huge then
        run[#run + 1] = string.format("%.2f,%.2f", px(s.x and s.x[j] or j), py(y))
      else
        flush()
      end
    end
    flush()
    local ly = top + 10 + 18 * (i - 1)
    body[#body + 1] = string.format('<line x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="%s" stroke-width="2"/>',
      right - 150, ly, right - 128, ly, colour)
    body[#body + 1] = string.format('<text class="legend" x="%.2f" y="%.2f" font-size="12">%s</text>',
      right - 122, ly + 4, esc(s.label or ("series " .. i)))
  end
  local svg = document(body, width, height, opts.title)
  if opts.file then
    write_file(fname, opts.file, svg)
    return opts.file
  end
  return svg
end

return viz
