--- A single updating progress line on stderr: count, rate and ETA.
--
--    local p = attn.progress(#cases, "bench")
--    for _, c in ipairs(cases) do run(c); p:step() end
--    p:done()
--
-- It draws only when stderr is a terminal (so logs and pipes stay clean) and
-- at most 10 times a second (so a fast loop does not spend its time drawing).
-- `opts` replace the clock, the writer and the terminal test, for tests.
-- @module attn.tools.progress
local caller = require "attn.caller"
local M = {}

local Progress = {}
Progress.__index = Progress

--- "0:07", "12:34" or "1:02:03" for a number of seconds; "?" when unknown.
function M.format_duration(s)
  if s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  local h, m, sec = s // 3600, s % 3600 // 60, s % 60
  if h > 0 then return string.format("%d:%02d:%02d", h, m, sec) end
  return string.format("%d:%02d", m, sec)
end

--- A rate in steps per second, with 3 significant digits ("0.412/s", "41.2/s",
-- "4120/s"), or per minute below 0.1/s ("2.40/min").
function M.format_rate(r)
  if r ~= r or r == math.huge then return "?/s" end
  if r < 0.1 then return string.format("%.2f/min", r * 60) end
  if r < 1 then return string.format("%.3f/s", r) end
  if r < 10 then return string.format("%.2f/s", r) end
  if r < 100 then return string.format("%.1f/s", r) end
  return string.format("%.0f/s", r)
end

--- The text of the line: "label 3/10 (30%) 1.50/s ETA 0:05".
-- @param label text or nil
-- @param count steps done
-- @param total steps in all
-- @param elapsed seconds since the start
function M.format_line(label, count, total, elapsed)
  local parts = {}
  if label and label ~= "" then parts[#parts + 1] = label end
  local pct = total > 0 and math.floor(100 * count / total) or 100
  parts[#parts + 1] = string.format("%d/%d (%d%%)", count, total, pct)
  if count > 0 and elapsed > 0 then
    local rate = count / elapsed
    parts[#parts + 1] = M.format_rate(rate)
    parts[#parts + 1] = "ETA " .. M.format_duration((total - count) / rate)
  else
    parts[#parts + 1] = "?/s ETA ?"
  end
  return table.concat(parts, " ")
end

-- Counts are integers in [0, 2^53]: beyond, floats lose whole steps and
-- math.tointeger gives nil (inf, 1e308).
local MAX_COUNT = 2 ^ 53

local function check_count(v, fn, argn, what)
  if type(v) ~= "number" or math.tointeger(v) == nil or v < 0 or v > MAX_COUNT then
    local too_big = type(v) == "number" and v > MAX_COUNT
    caller.error(string.format("%s: bad argument #%d '%s' (expected a non-negative integer%s, got %s)", fn, argn, what,
      too_big and " up to 2^53" or "", type(v) == "number" and tostring(v) or type(v)))
  end
end

--- A new progress line of `total` steps (`attn.progress`).
-- @param total the number of steps (a non-negative integer)
-- @param[opt] label text in front of the count
-- @param[opt] opts table: `clock` (seconds, default attn.clock), `write`
-- (function(text), default writes to stderr), `tty` (draw or not; default
-- attn.isatty(2) and TERM not "dumb"), `interval` (least seconds between
-- redraws, default 0.1)
function M.new(total, label, opts)
  check_count(total, "attn.progress", 1, "total")
  if label ~= nil and type(label) ~= "string" then
    caller.error("attn.progress: bad argument #2 'label' (expected a string or nil, got " .. type(label) .. ")")
  end
  if opts ~= nil and type(opts) ~= "table" then
    caller.error("attn.progress: bad argument #3 'opts' (expected a table or nil, got " .. type(opts) .. ")")
  end
  opts = opts or {}
  local attn = require "attn"
  local tty = opts.tty
  if tty == nil then tty = attn.isatty(2) and os.getenv("TERM") ~= "dumb" end
  local clock = opts.clock or attn.clock
  local self = setmetatable({
    total = math.tointeger(total), label = label, count = 0, tty = tty, clock = clock,
    write = opts.write or function(s) io.stderr:write(s) io.stderr:flush() end,
    interval = opts.interval or 0.1, drawn_at = nil,
  }, Progress)
  self.start = clock()
  if tty then self:draw() end -- "0/N" at once: the first step may be slow
  return self
end

-- Draw the line now ("\r" back to column 1, "\27[K" clears what is left).
function Progress:draw()
  local now = self.clock()
  self.drawn_at = now
  self.write("\r" .. M.format_line(self.label, self.count, self.total, now - self.start) .. "\27[K")
end

--- Advance by n steps (default 1) and redraw if the last redraw is at least
-- `interval` (0.1 s) old. Returns self.
-- @param[opt=1] n steps done since the last call
function Progress:step(n)
  if n == nil then n = 1 end
  check_count(n, "Progress:step", 1, "n")
  self.count = math.min(self.total, self.count + math.tointeger(n)) -- both <= 2^53: no overflow
  if self.tty and (self.drawn_at == nil or self.clock() - self.drawn_at >= self.interval) then self:draw() end
  return self
end

--- Finish: clear the line (the caller prints its own results). Returns self.
function Progress:done()
  if self.tty and self.drawn_at ~= nil then self.write("\r\27[K") end
  self.drawn_at = nil
  return self
end

return M
