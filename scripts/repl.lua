-- The interactive REPL of scripts/attn-lua: attn loaded as a global.
attn = require "attn"
nn = attn.nn
print("attn REPL (Lua 5.4) -- attn and nn are loaded; Ctrl-D quits")
local function readline(prompt)
  io.write(prompt)
  io.flush()
  return io.read("l")
end
local buffer = ""
while true do
  local line = readline(buffer == "" and "> " or ">> ")
  if not line then io.write("\n") break end
  buffer = buffer == "" and line or buffer .. "\n" .. line
  local chunk, err = load("return " .. buffer, "=stdin")
  if not chunk then chunk, err = load(buffer, "=stdin") end
  if chunk then
    buffer = ""
    local results = table.pack(pcall(chunk))
    if not results[1] then
      print(tostring(results[2]))
    elseif results.n > 1 then
      for i = 2, results.n do print(results[i]) end
    end
  elseif not err:find("<eof>$") then
    buffer = ""
    print(err)
  end
end
