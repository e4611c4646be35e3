-- The fused ("flash") kernel's partly visible key blocks (src/core/flash.c:
-- a window's two ends, the causal diagonal, a block mask's partial blocks),
-- which run as bands: each 16-row group of a query block over its own keys.
-- Windows and causal masking at many row and key offsets (Lq ~= Lk, both
-- ends of a window, groups that see nothing of a block, a last query block
-- of fewer than 64 rows, Ev tails) against the math kernel (whole score
-- rows: an independent computation); and, in child processes, the same bits
-- for 1 and 2 threads and for the AVX2 and AVX-512 sets (whose bands run
-- group by group and as 64-row tiles respectively).
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local sdpa = attn.scaled_dot_product_attention
local ATOL, RTOL = 1e-5, 5e-6
local lcg_tensor = C.lcg_tensor

-- flash within ATOL + RTOL |math| of math (rows that see no key: zeros in both)
local function same_as_math(q, k, v, opts, what)
  local o = { return_lse = true }
  for key, x in pairs(opts) do o[key] = x end
  o.kernel = "math"
  local ref, ref_lse = sdpa(q, k, v, o)
  o.kernel = "flash"
  local got, got_lse = sdpa(q, k, v, o)
  assert.same(ref:size(), got:size(), what)
  for _, pair in ipairs { { C.flat(got), C.flat(ref), "out" }, { C.flat(got_lse), C.flat(ref_lse), "lse" } } do
    local a, b = pair[1], pair[2]
    for i = 1, #b do
      local x, y = a[i], b[i]
      if y == -math.huge or x == -math.huge then
        assert(x == y, ("%s: %s element %d: flash %s, math %s"):format(what, pair[3], i, x, y))
      elseif math.abs(x - y) > ATOL + RTOL * math.abs(y) then
        error(("%s: %s element %d: flash %.9g, math %.9g"):format(what, pair[3], i, x, y), 2)
      end
    end
  end
end

local SHAPES = { { 64, 64 }, { 100, 100 }, { 130, 200 }, { 200, 130 }, { 257, 257 }, { 47, 300 }, { 300, 47 } }
local WINDOWS = { { 0, 0 }, { 5, 0 }, { 17, 3 }, { 63, 0 }, { 64, 64 }, { 100, -1 }, { -1, 20 }, { 31, 31 },
  { 255, 0 }, { 15, 16 } }
local DIMS = { { 16, 13 }, { 64, 64 }, { 3, 70 }, { 32, 40 } }

describe("flash bands against the math kernel", function()
  for si, s in ipairs(SHAPES) do
    local lq, lk = s[1], s[2]
    it(("Lq %d, Lk %d: every window and causal masking"):format(lq, lk), function()
      local n = 0
      local function check(opts, what)
        n = n + 1
        local d = DIMS[(si + n) % #DIMS + 1]
        local q = lcg_tensor(si * 100 + n, 1, 1, 2, lq, d[1])
        local k = lcg_tensor(si * 100 + n + 50, 1, 1, 2, lk, d[1])
        local v = lcg_tensor(si * 100 + n + 70, 1, 1, 2, lk, d[2])
        same_as_math(q, k, v, opts, ("Lq %d Lk %d E %d Ev %d %s"):format(lq, lk, d[1], d[2], what))
      end
      check({ is_causal = true }, "causal")
      for _, w in ipairs(WINDOWS) do
        check({ window = w }, ("window {%d, %d}"):format(w[1], w[2]))
      end
      check({ window = { 40, 0 }, is_causal = true }, "window {40, 0} and causal")
    end)
  end

  it("a block mask's partial blocks with a window: groups whose keys are cut apart", function()
    local L = 300
    -- documents of 37 tokens in blocks of 16: every block of keys is partial for some group
    local ids = {}
    for i = 0, L - 1 do ids[#ids + 1] = i // 37 end
    local bm = attn.block_mask(attn.block_mask.document(attn.tensor(ids)), 1, 1, L, L, { block = 16 })
    local q, k, v = lcg_tensor(5, 1, 1, 1, L, 24), lcg_tensor(6, 1, 1, 1, L, 24), lcg_tensor(7, 1, 1, 1, L, 19)
    same_as_math(q, k, v, { block_mask = bm }, "document block mask")
    same_as_math(q, k, v, { block_mask = bm, window = { 20, 0 } }, "document block mask, window {20, 0}")
    same_as_math(q, k, v, { block_mask = bm, is_causal = true }, "document block mask, causal")
  end)
end)

-- The child: flash on band cases, each output (and lse) saved as DIR/NAME.npy.
local CHILD = [[
local attn = require "attn"
local dir = arg[1]
local C = dofile("spec/fixtures/tensor_check.lua")
local sdpa = attn.scaled_dot_product_attention
local cases = {
  {name = "win_left", lq = 333, lk = 333, e = 64, ev = 64, opts = {window = {255, 0}}},
  {name = "win_both", lq = 300, lk = 420, e = 16, ev = 13, opts = {window = {17, 40}}},
  {name = "win_narrow", lq = 420, lk = 300, e = 5, ev = 70, opts = {window = {3, 2}}},
  {name = "causal_tall", lq = 290, lk = 130, e = 32, ev = 24, opts = {is_causal = true}},
  {name = "causal_wide", lq = 130, lk = 290, e = 64, ev = 11, opts = {is_causal = true}},
  {name = "win_dropout", lq = 200, lk = 200, e = 8, ev = 8, opts = {window = {50, 0}, dropout_p = 0.2}},
  {name = "win_bias", lq = 150, lk = 150, e = 16, ev = 16, bias = true, opts = {window = {30, 30}}},
  {name = "doc_blocks", lq = 300, lk = 300, e = 24, ev = 19, doc = true, opts = {window = {20, 0}}},
}
for ci, c in ipairs(cases) do
  local q = C.lcg_tensor(ci * 3 + 1, 1, 1, 2, c.lq, c.e)
  local k = C.lcg_tensor(ci * 3 + 2, 1, 1, 2, c.lk, c.e)
  local v = C.lcg_tensor(ci * 3 + 3, 1, 1, 2, c.lk, c.ev)
  local opts = {kernel = "flash", return_lse = true}
  for key, x in pairs(c.opts) do opts[key] = x end
  if c.bias then opts.bias = C.lcg_tensor(ci + 200, 2, 1, 1, c.lq, c.lk) end
  if c.doc then
    local ids = {}
    for i = 0, c.lq - 1 do ids[#ids + 1] = i // 37 end
    opts.block_mask = attn.block_mask(attn.block_mask.document(attn.tensor(ids)), 1, 1, c.lq, c.lk, {block = 16})
  end
  attn.manual_seed(11)
  local out, lse = sdpa(q, k, v, opts)
  attn.save(out, dir .. "/" .. c.name .. ".npy")
  attn.save(lse, dir .. "/" .. c.name .. "_lse.npy")
end
print(attn.cpu_info().kernel)
print("END")
]]
local NAMES = { "win_left", "win_both", "win_narrow", "causal_tall", "causal_wide", "win_dropout", "win_bias",
  "doc_blocks" }

local sets = require("support.kernel_sets").new(CHILD)
local info = attn.cpu_info()

describe("flash bands' bits", function()
  it("the same for 1 and 2 threads in every set, and for the AVX2 and AVX-512 sets", function()
    local has, dirs = {}, {}
    for _, choice in ipairs(info.available) do
      has[choice] = true
      local d1, d2 = sets.run(choice, 1), sets.run(choice, 2)
      for _, name in ipairs(NAMES) do
        for _, f in ipairs { name, name .. "_lse" } do
          assert.are.equal(sets.read_bytes(d1 .. "/" .. f .. ".npy"), sets.read_bytes(d2 .. "/" .. f .. ".npy"),
            ("ATTN_CPU=%s: %s differs between 1 and 2 threads"):format(choice, f))
        end
      end
      dirs[choice] = d1
    end
    if not (has.avx2 and has.avx512) then return end
    for _, name in ipairs(NAMES) do
      for _, f in ipairs { name, name .. "_lse" } do
        local a, b = dirs.avx2 .. "/" .. f .. ".npy", dirs.avx512 .. "/" .. f .. ".npy"
        if sets.read_bytes(a) ~= sets.read_bytes(b) then
          local x, y = C.flat(attn.load(a)), C.flat(attn.load(b))
          local first = 1
          for i = 1, #x do if x[i] ~= y[i] then first = i; break end end
          error(("%s: avx2 and avx512 differ, first at element %d: %.9g vs %.9g"):format(f, first, x[first], y[first]))
        end
      end
    end
  end)
end)

teardown(sets.cleanup)
