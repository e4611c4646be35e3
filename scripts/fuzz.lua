-- The API fuzzer's command line; the fuzzer itself is scripts/lib/fuzz.lua
-- (a library the specs import too):
--   scripts/attn-lua scripts/fuzz.lua --iterations N --seed S [--kinds a,b|all] [--verbose]
--   scripts/attn-lua scripts/fuzz.lua --mode autograd --iterations N --seed S [--with-known] [--emit-torch F.py]
--     (gradients of random in-place / view chains against an out-of-place replay: scripts/lib/fuzz_autograd.lua)
require("fuzz").main(arg)
