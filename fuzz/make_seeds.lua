-- Writes the seed corpus of fuzz/core_fuzz.c into fuzz/seeds/: for every
-- operation selector (the first byte) a few inputs from a fixed LCG, and the
-- .npy fixtures of spec/fixtures/npy/ behind the .npy selector (11).
-- Run: lua5.4 fuzz/make_seeds.lua  (the output is committed; rerun after
-- changing how the harness decodes its input).
local OPS, NPY = 15, 11
local state = 12345
local function byte()
  state = (state * 1103515245 + 12345) % 2147483648
  return state >> 16 & 0xff
end
local function write(name, bytes)
  local f = assert(io.open("fuzz/seeds/" .. name, "wb"))
  f:write(bytes)
  f:close()
end
for op = 0, OPS - 1 do
  for variant = 1, 3 do
    local b = {string.char(op)}
    for _ = 1, 64 * variant do b[#b + 1] = string.char(byte()) end
    write(string.format("op%02d_%d", op, variant), table.concat(b))
  end
end
local list = assert(io.popen("ls spec/fixtures/npy"))
for name in list:lines() do
  local f = assert(io.open("spec/fixtures/npy/" .. name, "rb"))
  local data = f:read("a")
  f:close()
  if #data <= 4096 then write("npy_" .. name:gsub("%.npy$", ""), string.char(NPY, 0) .. data) end
end
list:close()
