-- The notebook-size module calls of bench.lua's tiny and tiny_train cases, N
-- times after a warm-up, for counting instructions per call under callgrind
-- (run it for N and 2N calls; the difference over N is one call's cost,
-- without the start-up):
--   scripts/attn-lua scripts/tiny_calls.lua MODULE MODE N
--   MODULE: ca (CausalAttention(3, 2, 6, 0.0)) or mha (MultiHeadAttention(3, 2, 6, 0.0, 2))
--   MODE:   fwd (m(x) under no_grad), rfwd (m(x) recorded) or train (m(x):sum():backward())
-- e.g. for n in 2000 4000; do OMP_NUM_THREADS=1 valgrind --tool=callgrind --trace-children=yes \
--        scripts/attn-lua scripts/tiny_calls.lua ca train $n 2>&1 | grep Collected; done
local attn = require "attn"

local function usage(msg)
  io.stderr:write("tiny_calls.lua: " .. msg .. "\nusage: scripts/attn-lua scripts/tiny_calls.lua ca|mha fwd|rfwd|train N\n")
  os.exit(2)
end

local which, mode, n = arg[1], arg[2], tonumber(arg[3])
if which ~= "ca" and which ~= "mha" then usage("MODULE must be ca or mha, got " .. tostring(which)) end
if mode ~= "fwd" and mode ~= "rfwd" and mode ~= "train" then usage("MODE must be fwd, rfwd or train, got " .. tostring(mode)) end
if not n or n < 0 or n ~= math.floor(n) then usage("N must be a non-negative integer, got " .. tostring(arg[3])) end

-- the modules and input of bench.lua's tiny cases
attn.manual_seed(123)
local ca = attn.nn.CausalAttention(3, 2, 6, 0.0)
local mha = attn.nn.MultiHeadAttention(3, 2, 6, 0.0, 2)
local x = attn.stack({ attn.rand(6, 3), attn.rand(6, 3) }, 1)
local m = which == "ca" and ca or mha

for _ = 1, 50 do m(x):sum():backward() end
attn.no_grad(function() for _ = 1, 50 do m(x) end end)
collectgarbage("collect")
if mode == "fwd" then
  attn.no_grad(function() for _ = 1, n do m(x) end end)
elseif mode == "rfwd" then
  for _ = 1, n do m(x) end
else
  for _ = 1, n do m(x):sum():backward() end
end
