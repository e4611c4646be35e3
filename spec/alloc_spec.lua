-- Allocation failure: sizes whose byte count overflows are refused with an
-- error naming the bytes; sizes that are valid but more than the machine can
-- give (a child lua5.4 under `ulimit -v`) are a Lua error naming the bytes,
-- after which the process computes normally. The ulimit child is skipped
-- under `make asan` (the sanitizer runtimes reserve terabytes of address
-- space, so any ulimit -v breaks them).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention
local SDPA = "attn.scaled_dot_product_attention"

local under_asan = (os.getenv("ATTN_BUILD") or ""):find("build-asan", 1, true) or os.getenv("LD_PRELOAD")

describe("sizes whose byte count overflows", function()
  it("creation names the shape and the bytes requested", function()
    C.fails(function() attn.zeros(2 ^ 40, 2 ^ 40) end, "attn.zeros", "[1099511627776, 1099511627776]",
      "4.836e+24 bytes requested", "the byte count overflows")
    -- the element count itself overflows int64: 2^31 * 2^31 * 2^31 = 2^93
    C.fails(function() attn.ones(2 ^ 31, 2 ^ 31, 2 ^ 31) end, "attn.ones", "3.961e+28 bytes requested")
    C.fails(function() attn.empty(math.maxinteger, 3) end, "attn.empty", "bytes requested")
  end)

  it("a matmul whose output overflows (expanded operands, no storage behind them)", function()
    local a = attn.ones(1, 1):expand(2 ^ 40, 1)
    local b = attn.ones(1, 1):expand(1, 2 ^ 40)
    C.fails(function() return a:matmul(b) end, "matmul", "[1099511627776, 1099511627776]", "bytes requested")
  end)

  it("attention weights whose byte count overflows", function()
    -- Ev = 0: the output is empty, the weights [2^32, 2^32] are 2^66 bytes
    local x, v = attn.ones(1, 1):expand(2 ^ 32, 1), attn.ones(1, 0):expand(2 ^ 32, 0)
    C.fails(function() return sdpa(x, x, v, {need_weights = true}) end, SDPA, "[4294967296, 4294967296]",
      "7.379e+19 bytes requested",
      "the byte count overflows")
  end)

  it("an empty tensor may have other huge sizes, and ops on it stay empty", function()
    local z = attn.zeros(0, 2 ^ 62, 2 ^ 62)
    assert.equal(0, z:numel())
    assert.equal(0, (z + 1):numel())
    assert.equal(0, z:sum():item())
    local m = attn.zeros(2 ^ 40, 2 ^ 40, 0, 3):matmul(attn.ones(3, 4))
    assert.same({2 ^ 40, 2 ^ 40, 0, 4}, m:size())
  end)
end)

-- The child: every request is valid but larger than 600 MB of address space.
local CHILD = [[
local attn = require "attn"
local sdpa = attn.scaled_dot_product_attention
local function refused(what, needle, f)
  local ok, err = pcall(f)
  if ok then error(what .. ": no error") end
  err = tostring(err)
  if not err:find(needle, 1, true) then error(what .. ": unexpected message " .. err) end
  -- and the process still works: a fresh tensor and a product
  local s = attn.ones(100, 100):matmul(attn.ones(100, 100)):sum():item()
  if s ~= 1e6 then error(what .. ": later matmul gave " .. s) end
  io.write(what, " ok: ", err, "\n")
end
refused("zeros 4 GiB", "attn.zeros: cannot allocate 4294967296 bytes",
  function() return attn.zeros(1024, 1024, 1024) end)
refused("matmul output", "matmul: cannot allocate 4294967296 bytes",
  function() return attn.ones(32768, 1):matmul(attn.ones(1, 32768)) end)
refused("matmul packing scratch", "bytes of scratch",
  function() return attn.ones(1, 1):expand(16384, 65536):matmul(attn.ones(65536, 1)) end)
refused("attention output", "scaled_dot_product_attention: cannot allocate 4294967296 bytes",
  function() return sdpa(attn.ones(1, 1, 1), attn.ones(1, 1), attn.ones(1, 1):expand(1, 1024 * 1024 * 1024)) end)
refused("attention weights", "scaled_dot_product_attention: cannot allocate 4294967296 bytes",
  function() local x = attn.ones(32768, 1); return sdpa(x, x, x, {need_weights = true}) end)
local q, k = attn.ones(1, 1):expand(64, 2 ^ 24), attn.ones(1, 1):expand(256, 2 ^ 24)
refused("flash scratch", "bytes of attention scratch",
  function() return sdpa(q, k, attn.ones(256, 1), {kernel = "flash"}) end)
refused("math scratch", "bytes of attention scratch",
  function() return sdpa(q, k, attn.ones(256, 1), {kernel = "math"}) end)
-- both kernels still give the right answer afterwards
local x = attn.tensor({{1, 0}, {0, 1}, {1, 1}})
for _, kernel in ipairs({"math", "flash"}) do
  local o = sdpa(x, x, attn.tensor({{1}, {2}, {3}}), {kernel = kernel, scale = 0})
  if math.abs(o[1][1] - 2) > 1e-6 or math.abs(o[3][1] - 2) > 1e-6 then error(kernel .. " after failures: " .. tostring(o)) end
end
io.write("END\n")
]]

describe("sizes the machine cannot provide (child under ulimit -v 600000)", function()
  it("each is a Lua error naming the bytes; later calls still work; exit status 0", function()
    if under_asan then
      pending("skipped under ASan (ulimit -v and the sanitizer's shadow memory do not mix)")
      return
    end
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(CHILD)
    f:close()
    local p = assert(io.popen("sh -c 'ulimit -v 600000; exec scripts/attn-lua " .. path .. "' 2>&1; echo \"rc=$?\""))
    local text = p:read("a")
    p:close()
    os.remove(path)
    assert(text:find("\nEND\nrc=0\n", 1, true), "child failed:\n" .. text)
    for _, what in ipairs({"zeros 4 GiB", "matmul output", "matmul packing scratch", "attention output",
                           "attention weights", "flash scratch", "math scratch"}) do
      assert(text:find(what .. " ok: ", 1, true), what .. " missing in:\n" .. text)
    end
  end)
end)

describe("the binding holds no malloc'ed memory across a call that can raise", function()
  it("src/binding/lua_*.c call no malloc/calloc/realloc (Lua-owned userdata only)", function()
    local p = assert(io.popen("grep -l -E '\\b(malloc|calloc|realloc|aligned_alloc|strdup)\\(' src/binding/lua_*.c"))
    local found = p:read("a")
    p:close()
    assert.equal("", found)
  end)
end)
