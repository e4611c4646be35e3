--- The attn REPL (`scripts/attn-lua` with no arguments): Lua 5.4 with `attn`
-- and `nn` loaded. An expression prints its values (tensors as PyTorch prints
-- them); a statement runs; an incomplete chunk continues on a `>>` line; an
-- error prints only its message. On a terminal, lines are edited with GNU
-- readline (Debian's lua-readline) when it is installed, with the history in
-- `~/.attn_history` (or `$ATTN_HISTORY`); otherwise lines are read plainly.
-- Ctrl-D quits.
-- @module attn.tools.repl
local M = {}

M.BANNER = "attn REPL (" .. _VERSION .. "): attn and nn are loaded. attn.help() lists the topics,"
  .. " attn.help(attn.matmul) explains one. Ctrl-D quits."

-- tostring(v) that never raises: the text, or nil and why not (a __tostring
-- that raises, or returns something other than a string).
local function safe_tostring(v)
  local ok, text = pcall(tostring, v)
  if ok then return text end
  return nil, type(text) == "string" and text or "(error object is a " .. type(text) .. " value)"
end

-- "stdin:3: attn.allclose: ..." -> "attn.allclose: ..." (the chunk is what was
-- just typed: its name and line say nothing). Never raises, whatever msg is.
local THIS_FILE = debug.getinfo(1, "S").source:match("^@(.*)$")

local function strip_position(msg)
  msg = msg:gsub("^stdin:%d+: ", "")
  if THIS_FILE and msg:sub(1, #THIS_FILE + 1) == THIS_FILE .. ":" then msg = msg:gsub("^[^\n]-:%d+: ", "", 1) end
  return msg
end

local function clean_message(msg)
  if type(msg) == "string" then return strip_position(msg) end
  local ok, mt = pcall(getmetatable, msg)
  if ok and type(mt) == "table" and rawget(mt, "__tostring") ~= nil then
    local text, why = safe_tostring(msg)
    if text then return text end
    return "(error object is a " .. type(msg) .. " value; its __tostring raised an error: "
      .. strip_position(why) .. ")"
  end
  return "(error object is a " .. type(msg) .. " value)"
end

-- A short rendering of a plain table: sequences of at most 20 numbers,
-- strings or booleans as {2, 3}; anything else as tostring does.
local function show_table(t)
  if getmetatable(t) ~= nil then return tostring(t) end
  local n = #t
  if n == 0 or n > 20 then return tostring(t) end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  if count ~= n then return tostring(t) end
  local parts = {}
  for i = 1, n do
    local v = t[i]
    if type(v) == "string" then parts[i] = string.format("%q", v)
    elseif type(v) == "number" or type(v) == "boolean" then parts[i] = tostring(v)
    else return tostring(t) end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- The text of values[first..last] (see M.show); raises when a __tostring does.
local function show_values(values, first, last)
  if last < first then return nil end
  local parts = {}
  for i = first, last do
    local v = values[i]
    if type(v) == "table" then parts[#parts + 1] = show_table(v) else parts[#parts + 1] = tostring(v) end
  end
  return table.concat(parts, "\t")
end

--- The text a REPL prints for the values of an expression: each value as
-- tostring gives it (tensors in PyTorch's format, short lists as {1, 2}),
-- separated by tabs; nil when there are none.
-- @param n the number of values
-- @param ... the values
function M.show(n, ...)
  return show_values({ ... }, 1, n)
end

--- Compile one chunk of input as lua.c does: first as `return <chunk>` (an
-- expression), else as statements. Returns the function, or nil and
-- "incomplete" (the chunk needs more lines), or nil and the syntax error.
-- @param chunk the lines typed so far, joined by newlines
-- @param env the environment of the chunk
function M.compile(chunk, env)
  local fn, experr = load("return " .. chunk, "=stdin", "t", env)
  if fn then return fn end
  local err
  fn, err = load(chunk, "=stdin", "t", env)
  if fn then return fn end
  -- "x = {1," and also "1 +" (an unfinished expression, which lua.c rejects)
  if err:sub(-5) == "<eof>" or experr:sub(-5) == "<eof>" then return nil, "incomplete" end
  return nil, err
end

--- Read-eval-print until `read` returns nil.
-- @param io_ table: `read(prompt)` (a line without its newline, or nil at the
-- end), `write(text)`, `env` (the globals of the chunks)
function M.loop(io_)
  local read, write, env = io_.read, io_.write, io_.env
  while true do
    local line = read("> ")
    if line == nil then return end
    local chunk = line
    local fn, err = M.compile(chunk, env)
    while not fn and err == "incomplete" do
      local more = read(">> ")
      if more == nil then return end
      chunk = chunk .. "\n" .. more
      fn, err = M.compile(chunk, env)
    end
    if not fn then
      write("error: " .. clean_message(err) .. "\n")
    else
      local res = table.pack(pcall(fn))
      if not res[1] then
        write("error: " .. clean_message(res[2]) .. "\n")
      else
        -- a value whose __tostring raises is an error to print, not the end of the session
        local ok, text = pcall(show_values, res, 2, res.n)
        if not ok then
          write("error: cannot print the value: __tostring raised an error: " .. clean_message(text) .. "\n")
        elseif text then
          write(text .. "\n")
        end
      end
    end
  end
end

-- The line reader: GNU readline with history on a terminal when lua-readline
-- loads, else io.read (prompts only on a terminal, so piped output is just
-- the results). Returns read(prompt) and a function to call at the end.
local function make_reader(interactive)
  if interactive then
    local ok, RL = pcall(require, "readline")
    if ok and type(RL) == "table" and RL.readline then
      local histfile = os.getenv("ATTN_HISTORY") or "~/.attn_history"
      RL.set_options { histfile = histfile, keeplines = 1000, completion = false }
      RL.set_readline_name("attn")
      return function(prompt) return RL.readline(prompt) end, function() RL.save_history() end
    end
  end
  return function(prompt)
    if interactive then io.stdout:write(prompt) io.stdout:flush() end
    return io.read("l")
  end, function() end
end

--- Runs the REPL on stdin/stdout with `attn` and `nn` as globals.
function M.main()
  local attn = require "attn"
  _G.attn, _G.nn = attn, attn.nn
  local interactive = attn.isatty(0)
  local read, finish = make_reader(interactive)
  io.stdout:write(M.BANNER, "\n")
  M.loop {
    read = read,
    write = function(s) io.stdout:write(s) io.stdout:flush() end,
    env = _G,
  }
  if interactive then io.stdout:write("\n") end
  finish()
end

return M
