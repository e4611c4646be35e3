-- attn.progress: formatting with an injected clock and writer; silent when
-- stderr is not a terminal; drawn on a real terminal (script(1) from
-- Debian's essential bsdutils gives the child a pseudo-terminal).
local attn = require "attn"
local progress = require "attn.tools.progress"

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "no error")
  return tostring(err)
end

local function fake(t0)
  local now = t0 or 100
  local written = {}
  return {
    clock = function() return now end,
    write = function(s) written[#written + 1] = s end,
    tty = true,
  }, function(dt) now = now + dt end, written
end

describe("attn.progress formatting", function()
  it("durations", function()
    assert.are.equal("0:00", progress.format_duration(0))
    assert.are.equal("0:07", progress.format_duration(7.4))
    assert.are.equal("12:34", progress.format_duration(754))
    assert.are.equal("1:02:03", progress.format_duration(3723))
    assert.are.equal("?", progress.format_duration(math.huge))
    assert.are.equal("?", progress.format_duration(0 / 0))
  end)

  it("rates with 3 significant digits, per minute below 0.1/s", function()
    assert.are.equal("0.412/s", progress.format_rate(0.4123))
    assert.are.equal("4.12/s", progress.format_rate(4.123))
    assert.are.equal("41.2/s", progress.format_rate(41.23))
    assert.are.equal("4123/s", progress.format_rate(4123.4))
    assert.are.equal("3.00/min", progress.format_rate(0.05))
  end)

  it("lines: count, percent, rate and ETA", function()
    assert.are.equal("bench 3/10 (30%) 1.50/s ETA 0:05", progress.format_line("bench", 3, 10, 2))
    assert.are.equal("0/10 (0%) ?/s ETA ?", progress.format_line(nil, 0, 10, 0))
    assert.are.equal("0/0 (100%) ?/s ETA ?", progress.format_line("", 0, 0, 0))
  end)
end)

describe("attn.progress", function()
  -- clock steps are binary fractions (1/16 s), so the sums are exact
  it("draws at once, then at most every 0.1 s, and clears the line when done", function()
    local opts, advance, written = fake(0)
    local p = attn.progress(100, "work", opts)
    assert.are.same({ "\rwork 0/100 (0%) ?/s ETA ?\27[K" }, written)
    advance(0.0625); p:step()         -- 1/16 s after the last draw: skipped
    assert.are.equal(1, #written)
    advance(0.0625); p:step(9)        -- 10 steps in 1/8 s: 80/s, 90 left
    assert.are.equal("\rwork 10/100 (10%) 80.0/s ETA 0:01\27[K", written[2])
    advance(0.0625); p:step(); p:step() -- too soon
    assert.are.equal(2, #written)
    advance(9.8125); p:step(200)      -- clamped to the total, after 10 s
    assert.are.equal("\rwork 100/100 (100%) 10.0/s ETA 0:00\27[K", written[3])
    assert.are.equal(p, p:done())
    assert.are.equal("\r\27[K", written[4])
    assert.are.equal(4, #written)
  end)

  it("takes another redraw interval", function()
    local opts, advance, written = fake(0)
    opts.interval = 2
    local p = attn.progress(4, nil, opts)
    advance(1); p:step()
    advance(1); p:step()
    assert.are.same({ "\r0/4 (0%) ?/s ETA ?\27[K", "\r2/4 (50%) 1.00/s ETA 0:02\27[K" }, written)
  end)

  it("writes nothing when not on a terminal", function()
    local opts, advance, written = fake()
    opts.tty = false
    local p = attn.progress(3, "quiet", opts)
    for _ = 1, 3 do advance(1); p:step() end
    p:done()
    assert.are.same({}, written)
  end)

  it("is silent with stderr redirected to a file, and draws on a terminal", function()
    local code = "local p = require('attn').progress(3, 'job') p:step() p:done() io.stdout:write('end')"
    local path = os.tmpname()
    local ok = os.execute("scripts/attn-lua -e \"" .. code .. "\" >/dev/null 2>" .. path)
    assert.is_true(ok)
    local f = assert(io.open(path))
    assert.are.equal("", f:read("a"))
    f:close()
    os.remove(path)
    -- the same under a pseudo-terminal: the first line is drawn on stderr.
    -- Under `make asan` the sanitizers are preloaded for attn-lua only: script
    -- itself is no part of this project (and leaks a string at exit).
    local preload = os.getenv("LD_PRELOAD")
    local inner = "scripts/attn-lua -e \\\"" .. code .. "\\\""
    local outer = "script -qec \"" .. inner .. "\" /dev/null </dev/null"
    if preload then
      outer = "env -u LD_PRELOAD script -qec \"env LD_PRELOAD='" .. preload .. "' " .. inner .. "\" /dev/null </dev/null"
    end
    local p = assert(io.popen(outer))
    local out = p:read("a")
    p:close()
    assert.is_truthy(out:find("\rjob 0/3 (0%) ?/s ETA ?\27[K", 1, true), out)
  end)

  it("attn.isatty says false for a pipe or a file", function()
    local p = assert(io.popen("scripts/attn-lua -e \"io.write(tostring(require('attn').isatty(0)))\" </dev/null"))
    assert.are.equal("false", p:read("a"))
    p:close()
    assert.are.equal("attn.isatty: bad argument #1 'fd' (expected an integer, got string)", err_of(attn.isatty, "1"))
    assert.are.equal("attn.isatty: bad argument #1 'fd' (expected 0 <= fd <= 1048576, got -1)", err_of(attn.isatty, -1))
  end)

  it("refuses bad arguments with messages naming them", function()
    assert.are.equal("attn.progress: bad argument #1 'total' (expected a non-negative integer, got string)",
      err_of(attn.progress, "10"))
    assert.are.equal("attn.progress: bad argument #1 'total' (expected a non-negative integer, got -1)",
      err_of(attn.progress, -1))
    assert.are.equal("attn.progress: bad argument #2 'label' (expected a string or nil, got number)",
      err_of(attn.progress, 3, 5))
    local p = attn.progress(3, nil, { tty = false })
    assert.are.equal("Progress:step: bad argument #1 'n' (expected a non-negative integer, got 1.5)",
      err_of(p.step, p, 1.5))
  end)
end)
