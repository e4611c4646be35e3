-- attn._lse_merge (src/core/lse_merge.c): ring attention's merge of a partial
-- attention result (o, l) into a running one (out, lse) by their
-- log-sum-exp, in place. Expected values come from an independent Lua
-- computation in double precision of the definition (lse = log(e^lse +
-- e^l), out = e^(lse_old - lse) out + e^(l - lse) o); rows where a side saw
-- no key (lse -inf) are checked exactly.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local NEG_INF = -math.huge

-- The merge by its definition, in Lua doubles over flat lists: out rows of e
-- elements. A row where neither side saw a key stays out * 0 with lse -inf.
local function reference(out, lse, o, l, e)
  local ro, rl = {}, {}
  for r = 1, #lse do
    local la, lb = lse[r], l[r]
    local wa, wb
    if la == NEG_INF and lb == NEG_INF then
      rl[r], wa, wb = NEG_INF, 0, 0
    else
      local m = math.max(la, lb)
      rl[r] = m + math.log(math.exp(la - m) + math.exp(lb - m))
      wa, wb = math.exp(la - rl[r]), math.exp(lb - rl[r])
    end
    for i = (r - 1) * e + 1, r * e do ro[i] = out[i] * wa + o[i] * wb end
  end
  return ro, rl
end

local function sizes_of(t) return t:size() end

-- out, lse, o, l of shape [..., n, E] with some rows -inf on one side or both
local function draw(seed, ...)
  attn.manual_seed(seed)
  local shape = { ... }
  local lead = { table.unpack(shape, 1, #shape - 1) }
  local out, o = attn.randn(table.unpack(shape)), attn.randn(table.unpack(shape))
  local lse, l = attn.randn(table.unpack(lead)) * 4, attn.randn(table.unpack(lead)) * 4
  local fl, fo = lse:view(-1), l:view(-1)
  fl[1] = NEG_INF              -- only the partial saw keys
  fo[2] = NEG_INF              -- only the running result did
  fl[3], fo[3] = NEG_INF, NEG_INF -- neither
  return out, lse, o, l
end

describe("attn._lse_merge", function()
  it("equals the log-sum-exp merge computed independently, with rows where one side or both saw no key", function()
    local out, lse, o, l = draw(1, 2, 3, 7, 5)
    local eo, el = reference(C.flat(out), C.flat(lse), C.flat(o), C.flat(l), 5)
    attn._lse_merge(out, lse, o, l)
    C.close(out, { shape = sizes_of(o), data = eo }, 1e-6, 1e-6, "out")
    C.close(lse, { shape = sizes_of(l), data = el }, 1e-6, 1e-6, "lse")
  end)

  it("a side that saw no key (lse -inf) gives the other side's row and lse exactly; neither gives zeros and -inf",
    function()
      local out, lse, o, l = draw(2, 4, 6)
      local out0, lse0 = out:clone(), lse:clone()
      attn._lse_merge(out, lse, o, l)
      assert.is_true(out[1]:equal(o[1]))     -- running row had no key: the partial's row
      assert.equal(l[1], lse[1])
      assert.is_true(out[2]:equal(out0[2]))  -- the partial had no key: unchanged
      assert.equal(lse0[2], lse[2])
      assert.same({ 0, 0, 0, 0, 0, 0 }, out[3]:totable()) -- neither: zeros, never NaN
      assert.equal(NEG_INF, lse[3])
    end)

  it("a NaN in either lse makes the row NaN (as the tensor ops it replaces)", function()
    local out, lse, o, l = draw(3, 5, 4)
    lse[4], l[5] = 0 / 0, 0 / 0
    attn._lse_merge(out, lse, o, l)
    for _, r in ipairs{ 4, 5 } do
      assert.is_true(lse[r] ~= lse[r], "lse row " .. r)
      for _, x in ipairs(out[r]:totable()) do assert.is_true(x ~= x, "out row " .. r) end
    end
    assert.is_true(lse[1] == lse[1])
  end)

  it("merges into strided views (rows of a larger tensor) from strided partials, touching nothing else", function()
    local big_o, big_l = attn.randn(3, 10, 8), attn.randn(3, 10)
    local before_o, before_l = big_o:clone(), big_l:clone()
    local o = attn.randn(3, 8, 4):transpose(-1, -2) -- [3, 4, 8], not contiguous
    local l = attn.randn(4, 3):t()                   -- [3, 4]
    local out, lse = big_o:narrow(2, 4, 4), big_l:narrow(2, 4, 4)
    local eo, el = reference(C.flat(out), C.flat(lse), C.flat(o), C.flat(l), 8)
    attn._lse_merge(out, lse, o, l)
    C.close(out, { shape = { 3, 4, 8 }, data = eo }, 1e-6, 1e-6, "out")
    C.close(lse, { shape = { 3, 4 }, data = el }, 1e-6, 1e-6, "lse")
    assert.is_true(big_o:narrow(2, 1, 3):equal(before_o:narrow(2, 1, 3)))
    assert.is_true(big_o:narrow(2, 8, 3):equal(before_o:narrow(2, 8, 3)))
    assert.is_true(big_l:narrow(2, 1, 3):equal(before_l:narrow(2, 1, 3)))
    assert.is_true(big_l:narrow(2, 8, 3):equal(before_l:narrow(2, 8, 3)))
  end)

  it("gives the same bits with 1 and 2 threads", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
local attn = require "attn"
attn.manual_seed(7)
local out, lse, o, l = attn.randn(4, 600, 64), attn.randn(4, 600), attn.randn(4, 600, 64), attn.randn(4, 600)
attn._lse_merge(out, lse, o, l)
local parts = {}
for _, t in ipairs{ out, lse } do
  for _, x in ipairs(t:view(-1):totable()) do parts[#parts + 1] = ("%a"):format(x) end
end
io.write(table.concat(parts, " "))
]])
    f:close()
    local runs = {}
    for _, threads in ipairs{ 1, 2 } do
      local p = assert(io.popen(("OMP_NUM_THREADS=%d scripts/attn-lua %s 2>&1"):format(threads, script)))
      runs[threads] = p:read("a")
      p:close()
    end
    os.remove(script)
    assert.truthy(#runs[1] > 4 * 600 * 65, runs[1]:sub(1, 200))
    assert.is_true(runs[1] == runs[2], "the bits differ between 1 and 2 threads")
  end)

  it("refuses what it cannot merge, naming the function and what came", function()
    local function err(pattern, ...)
      local ok, e = pcall(attn._lse_merge, ...)
      assert.is_false(ok)
      assert.truthy(tostring(e):find(pattern, 1, true), tostring(e))
    end
    local out, lse, o, l = attn.zeros(2, 3, 4), attn.zeros(2, 3), attn.zeros(2, 3, 4), attn.zeros(2, 3)
    err("attn._lse_merge: bad argument #4 'l' (expected attn.Tensor, got no value)", out, lse, o)
    err("attn._lse_merge: expected out, o [..., n, E] and lse, l [..., n] of the same sizes, got out [2, 3, 4], "
      .. "lse [2, 3], o [2, 3, 5], l [2, 3]", out, lse, attn.zeros(2, 3, 5), l)
    err("got out [2, 3, 4], lse [3, 2], o [2, 3, 4], l [3, 2]", out, attn.zeros(3, 2), o, attn.zeros(3, 2))
    err("out must not share memory with o", out, lse, out, l)
    err("lse must not share memory with l", out, lse, o, lse)
    -- an expanded out
    err("attn._lse_merge: unsupported operation: more than one element of the written-to tensor",
      attn.zeros(4):expand(2, 3, 4), lse, o, l)
  end)
end)
