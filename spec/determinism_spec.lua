-- Determinism across thread counts: the same inputs give the same bits with
-- OMP_NUM_THREADS=1 and 2, for both attention kernels (plain, causal, masked,
-- with weights), matmul (tiled across threads, batched) and every module's
-- forward. Each thread count runs in a child lua5.4 (OpenMP reads the variable
-- at start) that saves every result with attn.save; the .npy files are
-- compared byte for byte. (spec/attention_spec.lua checks the same for a few
-- attention calls through hex dumps.)
local CHILD = [[
local attn = require "attn"
local nn = attn.nn
local dir = arg[1]
local function gen(seed, ...)
  local shape, n, s, d = {...}, 1, seed, {}
  for _, x in ipairs(shape) do n = n * x end
  for i = 1, n do s = (s * 1103515245 + 12345) % 2147483648; d[i] = s / 1073741824 - 1 end
  return attn.tensor(d):view(shape)
end
local function save(name, t) attn.save(t, dir .. "/" .. name .. ".npy") end
local sdpa = attn.scaled_dot_product_attention
local q, k, v = gen(1, 2, 3, 300, 32), gen(2, 2, 3, 300, 32), gen(3, 2, 3, 300, 16)
local mask = gen(4, 300, 300):gt(0.6)
for _, kernel in ipairs({"math", "flash"}) do
  save(kernel, sdpa(q, k, v, {kernel = kernel}))
  save(kernel .. "_causal", sdpa(q, k, v, {kernel = kernel, is_causal = true}))
  save(kernel .. "_mask", sdpa(q, k, v, {kernel = kernel, mask = mask}))
end
local out, w = sdpa(q, k, v, {kernel = "math", need_weights = true})
save("math_weights", w)
save("matmul", gen(5, 600, 700):matmul(gen(6, 700, 600)))
save("matmul_batched", gen(7, 4, 100, 90):matmul(gen(8, 90, 80):t():t()))
save("matmul_transposed", gen(9, 700, 300):t():matmul(gen(10, 700, 520)))
save("matmul_long_k", gen(12, 2048, 130):t():matmul(gen(13, 2048, 200))) -- a weight gradient: small tiles
attn.manual_seed(5)
local x = gen(11, 2, 150, 128)
save("SelfAttentionV1", nn.SelfAttentionV1(128, 96)(x[1]))
save("SelfAttentionV2", nn.SelfAttentionV2(128, 96)(x))
save("CausalAttention", nn.CausalAttention(128, 96, 150, 0.0)(x))
save("MultiHeadAttentionWrapper", nn.MultiHeadAttentionWrapper(128, 32, 150, 0.0, 4)(x))
save("MultiHeadAttention", nn.MultiHeadAttention(128, 128, 150, 0.0, 4)(x))
save("Attention", nn.Attention(128)(x[1], x[2], x[2]))
attn.manual_seed(6)
save("MultiHeadAttention_dropout", nn.MultiHeadAttention(128, 128, 150, 0.3, 4):train()(x))
io.write("END\n")
]]

local NAMES = {"math", "math_causal", "math_mask", "flash", "flash_causal", "flash_mask", "math_weights", "matmul",
               "matmul_batched", "matmul_transposed", "matmul_long_k", "SelfAttentionV1", "SelfAttentionV2", "CausalAttention",
               "MultiHeadAttentionWrapper", "MultiHeadAttention", "Attention", "MultiHeadAttention_dropout"}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("a")
  f:close()
  return data
end

describe("determinism across thread counts", function()
  it("OMP_NUM_THREADS=1 and 2 give the same bits: both kernels, matmul, every module", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local dirs = {}
    for _, threads in ipairs({1, 2}) do
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir " .. dir))
      dirs[threads] = dir
      local p = assert(io.popen(("OMP_NUM_THREADS=%d scripts/attn-lua %s %s 2>&1"):format(threads, script, dir)))
      local text = p:read("a")
      p:close()
      assert(text:find("END\n", 1, true), "child with " .. threads .. " threads failed: " .. text)
    end
    os.remove(script)
    local differ = {}
    for _, name in ipairs(NAMES) do
      local one, two = read(dirs[1] .. "/" .. name .. ".npy"), read(dirs[2] .. "/" .. name .. ".npy")
      assert(#one > 128, name .. " is empty")
      if one ~= two then differ[#differ + 1] = name end
    end
    for _, threads in ipairs({1, 2}) do os.execute("rm -rf " .. dirs[threads]) end
    assert.same({}, differ)
  end)
end)
