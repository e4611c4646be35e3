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

-- Merges (o, l) into (out, lse) and checks both against the reference
-- computed from the inputs first (rows of o's last size).
local function merge_matches_reference(out, lse, o, l)
  local eo, el = reference(C.flat(out), C.flat(lse), C.flat(o), C.flat(l), o:size(-1))
  attn._lse_merge(out, lse, o, l)
  C.close(out, { shape = o:size(), data = eo }, 1e-6, 1e-6, "out")
  C.close(lse, { shape = l:size(), data = el }, 1e-6, 1e-6, "lse")
end

-- What scripts/attn-lua prints with OMP_NUM_THREADS 1 and 2 (runs[1], runs[2])
-- for a script of `setup` (attn loaded; it leaves out and lse) that then
-- prints every element of out and lse as a hex float.
local function out_lse_bits_by_threads(setup)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write('local attn = require "attn"\n', setup, [[
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
  return runs
end

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
    merge_matches_reference(draw(1, 2, 3, 7, 5))
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
    merge_matches_reference(big_o:narrow(2, 4, 4), big_l:narrow(2, 4, 4), o, l)
    assert.is_true(big_o:narrow(2, 1, 3):equal(before_o:narrow(2, 1, 3)))
    assert.is_true(big_o:narrow(2, 8, 3):equal(before_o:narrow(2, 8, 3)))
    assert.is_true(big_l:narrow(2, 1, 3):equal(before_l:narrow(2, 1, 3)))
    assert.is_true(big_l:narrow(2, 8, 3):equal(before_l:narrow(2, 8, 3)))
  end)

  it("gives the same bits with 1 and 2 threads", function()
    local runs = out_lse_bits_by_threads([[
attn.manual_seed(7)
local out, lse, o, l = attn.randn(4, 600, 64), attn.randn(4, 600), attn.randn(4, 600, 64), attn.randn(4, 600)
attn._lse_merge(out, lse, o, l)
]])
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

-- attn._sdpa_resume (src/core/lse_merge.c, the fused kernel's
-- attn_flash_tiles_resume): an attention call merged into a running result
-- by the kernel's online softmax. Expected values: the attention over all the
-- keys by its definition, in Lua doubles.
describe("attn._sdpa_resume", function()
  -- softmax(scale q k^T) v and its log-sum-exp over keys [k0, k1) (1-based, inclusive), rows of q [n, E]
  -- (tables of rows); causal: query i (0-based, at position pos0 + i) sees keys at positions <= its own
  local function attention(q, k, v, scale, k0, k1, causal, pos0)
    local out, lse = {}, {}
    for i = 1, #q do
      local s, m = {}, -math.huge
      for j = k0, k1 do
        if not causal or j - 1 <= pos0 + i - 1 then
          local x = 0
          for d = 1, #q[i] do x = x + q[i][d] * k[j][d] end
          s[j] = x * scale
          m = math.max(m, s[j])
        end
      end
      local sum, row = 0, {}
      for d = 1, #v[1] do row[d] = 0 end
      for j, x in pairs(s) do
        local w = math.exp(x - m)
        sum = sum + w
        for d = 1, #v[j] do row[d] = row[d] + w * v[j][d] end
      end
      for d = 1, #row do row[d] = sum > 0 and row[d] / sum or 0 end
      out[i], lse[i] = row, sum > 0 and m + math.log(sum) or -math.huge
    end
    return out, lse
  end

  local function max_diff(t, rows)
    local got, worst = t:totable(), 0
    for i = 1, #rows do
      if type(rows[i]) == "table" then
        for d = 1, #rows[i] do worst = math.max(worst, math.abs(got[i][d] - rows[i][d])) end
      elseif rows[i] == -math.huge then
        assert.equal(-math.huge, got[i])
      else
        worst = math.max(worst, math.abs(got[i] - rows[i]))
      end
    end
    return worst
  end

  it("continues a partial result over the first keys into the attention over all of them (E ~= Ev, a scale, "
    .. "strided rows of a larger running result, the rest untouched)", function()
    attn.manual_seed(11)
    local q, k, v = attn.randn(70, 12), attn.randn(150, 12), attn.randn(150, 5)
    local scale = 0.4
    local want, want_lse = attention(q:totable(), k:totable(), v:totable(), scale, 1, 150, false, 0)
    local o1, l1 = attn.scaled_dot_product_attention(q, k:narrow(1, 1, 90), v:narrow(1, 1, 90),
      { return_lse = true, scale = scale })
    local big, big_lse = attn.full({ 100, 5 }, 7), attn.full({ 100 }, 7)
    local out, lse = big:narrow(1, 21, 70), big_lse:narrow(1, 21, 70)
    out:copy_(o1)
    lse:copy_(l1)
    attn._sdpa_resume(q, k:narrow(1, 91, 60), v:narrow(1, 91, 60), out, lse, false, scale)
    assert.is_true(max_diff(out, want) < 1e-6)
    assert.is_true(max_diff(lse, want_lse) < 1e-5)
    local function all_sevens(t) return (t - 7):abs():max():item() == 0 end
    assert.is_true(all_sevens(big:narrow(1, 1, 20)) and all_sevens(big:narrow(1, 91, 10)))
    assert.is_true(all_sevens(big_lse:narrow(1, 1, 20)) and all_sevens(big_lse:narrow(1, 91, 10)))
  end)

  it("is_causal over [batch, head] slices, and rows that saw no key before (lse -inf) start from nothing",
    function()
      attn.manual_seed(12)
      local q, k, v = attn.randn(2, 3, 80, 8), attn.randn(2, 3, 80, 8), attn.randn(2, 3, 80, 8)
      -- rows 41..80 saw keys 1..40 (all of them in their past); the diagonal block 41..80 comes now
      local rows, keys = q:narrow(-2, 41, 40), k:narrow(-2, 41, 40)
      local o, l = attn.scaled_dot_product_attention(rows, k:narrow(-2, 1, 40), v:narrow(-2, 1, 40),
        { return_lse = true })
      l:select(1, 2):select(1, 3):fill_(-math.huge) -- slice [2, 3]: as if it had seen nothing
      o:select(1, 2):select(1, 3):zero_()
      attn._sdpa_resume(rows, keys, v:narrow(-2, 41, 40), o, l, true, nil)
      for b = 1, 2 do
        for h = 1, 3 do
          local qt, kt, vt = q[b][h]:totable(), k[b][h]:totable(), v[b][h]:totable()
          local first = (b == 2 and h == 3) and 41 or 1
          local want, want_lse = attention({ table.unpack(qt, 41, 80) }, kt, vt, 1 / math.sqrt(8), first, 80, true,
            40)
          assert.is_true(max_diff(o[b][h], want) < 1e-6, ("slice %d %d"):format(b, h))
          assert.is_true(max_diff(l[b][h], want_lse) < 1e-5, ("slice %d %d lse"):format(b, h))
        end
      end
    end)

  it("gives the same bits with 1 and 2 threads", function()
    local runs = out_lse_bits_by_threads([[
attn.manual_seed(8)
local q, k, v = attn.randn(4, 300, 32), attn.randn(4, 500, 32), attn.randn(4, 500, 32)
local out, lse = attn.scaled_dot_product_attention(q, k:narrow(2, 1, 200), v:narrow(2, 1, 200), { return_lse = true })
attn._sdpa_resume(q, k:narrow(2, 201, 300), v:narrow(2, 201, 300), out, lse, false, nil)
]])
    assert.truthy(#runs[1] > 4 * 300 * 33, runs[1]:sub(1, 200))
    assert.is_true(runs[1] == runs[2], "the bits differ between 1 and 2 threads")
  end)

  it("refuses what it cannot merge into, naming the function and what came", function()
    local function err(pattern, ...)
      local ok, e = pcall(attn._sdpa_resume, ...)
      assert.is_false(ok)
      assert.truthy(tostring(e):find(pattern, 1, true), tostring(e))
    end
    local q, k, v = attn.zeros(2, 3, 4), attn.zeros(2, 5, 4), attn.zeros(2, 5, 6)
    local out, lse = attn.zeros(2, 3, 6), attn.zeros(2, 3)
    err("attn._sdpa_resume: bad argument #5 'lse' (expected attn.Tensor, got no value)", q, k, v, out)
    err("attn._sdpa_resume: expected out [..., 3, 6] and lse [..., 3] over the batch of q, k, v, got out [2, 3, 4], "
      .. "lse [2, 3]", q, k, v, attn.zeros(2, 3, 4), lse, false, nil)
    err("got out [2, 3, 6], lse [2, 4]", q, k, v, out, attn.zeros(2, 4), false, nil)
    err("out's last dim must have stride 1, got 3", q, k, v, attn.zeros(2, 6, 3):transpose(2, 3), lse, false, nil)
    local shared = attn.zeros(2, 5, 6)
    err("out must not share memory with v", q, k, shared, shared:narrow(2, 1, 3), lse, false, nil)
    err("lse must not share memory with q", q, k, v, out, q:select(3, 1), false, nil)
    err("attn._sdpa_resume: bad argument #7 'scale'", q, k, v, out, lse, false, "x")
  end)
end)
