-- The API fuzzer's command line; the fuzzer itself is scripts/lib/fuzz.lua
-- (a library the specs import too):
--   scripts/attn-lua scripts/fuzz.lua --iterations N --seed S [--kinds a,b|all] [--verbose]
require("fuzz").main(arg)
