-- A Linear layer's forward with a bias (attn.core.train.linear, which
-- nn.Linear records): the bias is added in the product's stores, and the
-- result is the same bits as attn.matmul(x, w:t()) followed by + b, under
-- every kernel set (ATTN_CPU: the own GEMM of AVX2 / AVX-512, OpenBLAS for
-- scalar) and thread count. Each (set, threads) runs in a child process.
local attn = require "attn"

local info = attn.cpu_info()

-- The child prints one line per case: its name and whether the two ways agree bit for bit.
local CHILD = [[
local attn = require "attn"
local T = require("attn.core").train
local function lcg(seed, ...)
  local shape, n = {...}, 1
  for _, s in ipairs(shape) do n = n * s end
  local state, data = seed, {}
  for i = 1, n do
    state = (state * 1103515245 + 12345) % 2147483648
    data[i] = state / 1073741824 - 1
  end
  return attn.tensor(data):view(shape)
end
local function same(p, q)
  if p:dim() ~= q:dim() then return false end
  for d = 1, p:dim() do if p:size(d) ~= q:size(d) then return false end end
  local a, b = p:contiguous():view(-1):totable(), q:contiguous():view(-1):totable()
  for i = 1, #a do
    if string.pack("<f", a[i]) ~= string.pack("<f", b[i]) then return false end
  end
  return true
end
local cases = {
  -- name, x, w, b: tails of 6-row micro-tiles and 16-lane vectors, k over blocks of 128
  {"train shape", lcg(1, 2048, 128), lcg(2, 512, 128), lcg(3, 512)},
  {"tails", lcg(4, 19, 300), lcg(5, 70, 300), lcg(6, 70)},
  {"batched", lcg(7, 3, 20, 33), lcg(8, 17, 33), lcg(9, 17)},
  {"strided x", lcg(10, 40, 64):t(), lcg(11, 24, 40), lcg(12, 24)},
  {"small (OpenBLAS in every set)", lcg(13, 5, 7), lcg(14, 3, 7), lcg(15, 3)},
  {"one row", lcg(16, 48), lcg(17, 20, 48), lcg(18, 20)},
  {"strided bias", lcg(19, 30, 40), lcg(20, 36, 40), lcg(21, 36, 2):select(2, 1)},
}
for _, c in ipairs(cases) do
  local name, x, w, b = c[1], c[2], c[3], c[4]
  local want = attn.matmul(x, w:t()) + b
  print(name .. ": " .. tostring(same(T.linear(x, w, b), want)))
end
-- nn.Linear records it; its gradients are those of the separate product and sum
attn.manual_seed(5)
local lin = attn.nn.Linear(40, 24)
local x = lcg(22, 2, 30, 40):requires_grad_(true)
local y = lin(x)
print("nn.Linear: " .. tostring(same(y, attn.matmul(x:detach(), lin.weight:detach():t()) + lin.bias:detach())))
print(attn.cpu_info().kernel)
print("END")
]]

local function run(choice, threads)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "w"))
  f:write(CHILD)
  f:close()
  local p = assert(io.popen(("ATTN_CPU=%s OMP_NUM_THREADS=%d scripts/attn-lua %s 2>&1"):format(choice, threads, tmp)))
  local text = p:read("a")
  p:close()
  os.remove(tmp)
  assert(text:find("\nEND\n", 1, true), ("child ATTN_CPU=%s failed: %s"):format(choice, text:sub(1, 400)))
  return text
end

describe("attn.core.train.linear (a Linear layer's forward with a bias)", function()
  for _, choice in ipairs(info.available) do
    for _, threads in ipairs({1, 2}) do
      it(("is the bits of matmul then + bias (ATTN_CPU=%s, %d threads)"):format(choice, threads), function()
        local text = run(choice, threads)
        assert.are.equal(choice, text:match("\n([^\n]*)\nEND\n"), "the child ran another kernel set")
        local n = 0
        for name, ok in text:gmatch("([^\n]-): (%a+)\n") do
          n = n + 1
          assert.are.equal("true", ok, ("ATTN_CPU=%s, %d threads: %s"):format(choice, threads, name))
        end
        assert.are.equal(8, n, text)
      end)
    end
  end

  it("refuses a bias that does not fit the weight, naming the function", function()
    local T = require("attn.core").train
    local ok, err = pcall(T.linear, attn.ones(4, 3), attn.ones(5, 3), attn.ones(4), "attn.nn.functional.linear")
    assert.is_false(ok)
    assert.matches("attn.nn.functional.linear: 'bias' of shape [4] does not fit weight [5, 3] (expected [5])", err,
      1, true)
    ok, err = pcall(T.linear, attn.ones(4, 3), attn.ones(5, 2), attn.ones(5))
    assert.is_false(ok)
    assert.matches("attn.core.train.linear: shapes [4, 3] and [2, 5] cannot be multiplied", err, 1, true)
  end)
end)
