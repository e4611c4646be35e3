-- Reliability of attention numerics:
--  - a query row whose keys are all hidden gives zeros (out and weights) in
--      both kernels and the fused module forward, even where v holds NaN/inf;
--  - scale is checked as the float32 the kernels use (1e39 is inf there);
--  - the modules' `mask` buffer takes effect as in the notebooks' torch code
--      (`self.mask.bool()[:n, :n]`): loaded, edited in place, per head;
--  - a float mask holding anything but 0 and 1 is an error suggesting bias.
-- Expected values come from PyTorch 1.13 fixtures
-- (spec/fixtures/mask_buffer_cases.lua, written by
-- scripts/fixtures/make_mask_buffer_fixtures.py) or from double-precision
-- references written here.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/mask_buffer_cases.lua")

local SDPA = attn.scaled_dot_product_attention
local KERNELS = { "math", "flash" }
local NAN, INF = 0 / 0, math.huge

local function is_nan(x) return x ~= x end

-- A [rows, cols] tensor whose element (i, j) (1-based) is f(i, j).
local function from_fn(rows, cols, f)
  local data = {}
  for i = 1, rows do for j = 1, cols do data[#data + 1] = f(i, j) end end
  return attn.tensor(data):view(rows, cols)
end

-- Double-precision attention of one slice: q [Lq][E], k [Lk][E], v [Lk][Ev]
-- (Lua tables), hidden(i, j) true where key j is hidden from query i, scale
-- as a number, bias(i, j) or nil. A row with every key hidden is zeros.
local function ref_attention(q, k, v, hidden, scale, bias)
  local out = {}
  for i = 1, #q do
    local s, mx = {}, -INF
    for j = 1, #k do
      local acc = 0
      for d = 1, #q[i] do acc = acc + q[i][d] * k[j][d] end
      acc = acc * scale + (bias and bias(i, j) or 0)
      if hidden(i, j) then acc = -INF end
      s[j] = acc
      if acc > mx then mx = acc end
    end
    local row = {}
    for d = 1, #v[1] do row[d] = 0 end
    if mx > -INF then
      local sum = 0
      for j = 1, #k do s[j] = math.exp(s[j] - mx); sum = sum + s[j] end
      for j = 1, #k do
        local w = s[j] / sum
        if w ~= 0 then -- PyTorch's 0 * NaN in hidden columns is tested apart
          for d = 1, #v[1] do row[d] = row[d] + w * v[j][d] end
        end
      end
    end
    out[i] = row
  end
  return out
end

-- Double-precision forward of CausalAttention (heads = 1, no out_proj) or
-- MultiHeadAttention (out_proj given) on x [B, n, d_in] with the module's
-- parameters, hiding (i, j) where hidden(i, j). Returns a [B][n][d_out] table.
local function ref_module(m, x, hidden, heads, scale)
  local X = x:totable()
  local function proj(lin, rows)
    local W = lin.weight:totable()
    local b = lin.bias and lin.bias:totable()
    local out = {}
    for i, r in ipairs(rows) do
      out[i] = {}
      for o = 1, #W do
        local acc = b and b[o] or 0
        for c = 1, #r do acc = acc + r[c] * W[o][c] end
        out[i][o] = acc
      end
    end
    return out
  end
  local res = {}
  for b = 1, #X do
    local q, k, v = proj(m.W_query, X[b]), proj(m.W_key, X[b]), proj(m.W_value, X[b])
    local d_out, n = #q[1], #q
    local hd = d_out // heads
    local ctx = {}
    for i = 1, n do ctx[i] = {} end
    for h = 0, heads - 1 do
      local function cut(t)
        local s = {}
        for i = 1, n do s[i] = table.move(t[i], h * hd + 1, (h + 1) * hd, 1, {}) end
        return s
      end
      local o = ref_attention(cut(q), cut(k), cut(v), hidden, scale)
      for i = 1, n do for d = 1, hd do ctx[i][h * hd + d] = o[i][d] end end
    end
    res[b] = m.out_proj and proj(m.out_proj, ctx) or ctx
  end
  return res
end

-- t (any shape) against a nested Lua table of the same layout, within tol.
local function close_to(t, want, tol, what)
  local got, flat = C.flat(t), {}
  local function walk(x)
    if type(x) == "table" then for i = 1, #x do walk(x[i]) end else flat[#flat + 1] = x end
  end
  walk(want)
  assert.are.equal(#flat, #got, what)
  for i = 1, #got do
    if not (math.abs(got[i] - flat[i]) <= tol) then
      error(("%s: element %d is %.9g, expected %.9g"):format(what, i, got[i], flat[i]), 2)
    end
  end
end

local function all_zero(t)
  for _, x in ipairs(C.flat(t)) do if x ~= 0 then return false end end
  return true
end

describe("a fully hidden query row gives zeros", function()
  -- v [Lk = 5, 3]: column 1 holds a NaN (key 2), column 2 an inf (key 3), column 3 is clean
  local lq, lk, e = 4, 5, 3
  local q = C.lcg_tensor(1, 1.0, 1, lq, e)
  local k = C.lcg_tensor(2, 1.0, 1, lk, e)
  local vt = C.lcg_tensor(3, 1.0, lk, 3):totable()
  vt[2][1], vt[3][2] = NAN, INF
  local v = attn.tensor(vt):view(1, lk, 3)
  local scale = 1 / math.sqrt(e)
  -- row 2 sees nothing; the others see every key
  local function hidden(i) return i == 2 end

  -- Rows other than the hidden one: NaN in column 1, +inf in column 2, the
  -- double reference in column 3 (as PyTorch: weights > 0 times NaN / inf).
  local function check_rows(out, hidden_row, what)
    local o = out:view(lq, 3):totable()
    local ref = ref_attention(q:view(lq, e):totable(), k:view(lk, e):totable(), vt,
      function(i) return i == hidden_row end, scale)
    for i = 1, lq do
      if i == hidden_row then
        assert.are.same({ 0, 0, 0 }, o[i], what .. ": hidden row " .. i)
      else
        assert(is_nan(o[i][1]), what .. ": row " .. i .. " column 1 should be NaN")
        assert.are.equal(INF, o[i][2], what .. ": row " .. i .. " column 2")
        assert(math.abs(o[i][3] - ref[i][3]) <= 2e-6, what .. ": row " .. i .. " column 3")
      end
    end
  end

  for _, kernel in ipairs(KERNELS) do
    it("by a mask row of ones, v holding NaN and inf (" .. kernel .. ")", function()
      local mask = from_fn(lq, lk, function(i) return hidden(i) and 1 or 0 end)
      check_rows(SDPA(q, k, v, { mask = mask, kernel = kernel }), 2, kernel .. " mask")
    end)

    it("by a bias row of -inf (" .. kernel .. ")", function()
      local bias = from_fn(lq, lk, function(i) return hidden(i) and -INF or 0 end)
      check_rows(SDPA(q, k, v, { bias = bias, kernel = kernel }), 2, kernel .. " bias")
    end)

    it("by a broadcast mask [Lq, 1] (" .. kernel .. ")", function()
      local mask = from_fn(lq, 1, function(i) return hidden(i) and 1 or 0 end)
      check_rows(SDPA(q, k, v, { mask = mask, kernel = kernel }), 2, kernel .. " broadcast mask")
    end)

    it("by causal masking plus a mask hiding key 1 from row 1 (" .. kernel .. ")", function()
      -- causal alone never hides a whole row (row i sees key 1); with the
      -- mask, row 1 sees nothing and must be zeros, though v[1] is NaN
      local vc = attn.tensor(vt):view(1, lk, 3)
      vc[1][1][1], vc[1][1][2], vc[1][1][3] = NAN, INF, -INF
      local mask = from_fn(lq, lk, function(i, j) return (i == 1 and j == 1) and 1 or 0 end)
      local o = SDPA(q, k, vc, { mask = mask, is_causal = true, kernel = kernel }):view(lq, 3):totable()
      assert.are.same({ 0, 0, 0 }, o[1])
      for i = 2, lq do assert(is_nan(o[i][1]), "row " .. i .. " sees key 1's NaN") end
    end)
  end

  it("weights of a hidden row are zeros too (need_weights)", function()
    local mask = from_fn(lq, lk, function(i) return hidden(i) and 1 or 0 end)
    local out, w = SDPA(q, k, v, { mask = mask, need_weights = true })
    check_rows(out, 2, "math with weights")
    local wt = w:view(lq, lk):totable()
    assert.are.same({ 0, 0, 0, 0, 0 }, wt[2])
  end)

  it("in a batch, over several row blocks of the math kernel (Lq = 150)", function()
    local n = 150
    local qb = C.lcg_tensor(4, 1.0, 2, n, e)
    local kb = C.lcg_tensor(5, 1.0, 2, n, e)
    local vb = C.lcg_tensor(6, 1.0, 2, n, 2)
    vb[1][7][1] = NAN
    vb[2][9][2] = INF
    -- rows 1, 64, 65, 130 hidden in every batch item
    local hide = { [1] = true, [64] = true, [65] = true, [130] = true }
    local mask = from_fn(n, n, function(i) return hide[i] and 1 or 0 end)
    for _, kernel in ipairs(KERNELS) do
      local o = SDPA(qb, kb, vb, { mask = mask, kernel = kernel }):totable()
      for b = 1, 2 do
        for i = 1, n do
          if hide[i] then
            assert.are.same({ 0, 0 }, o[b][i], kernel .. " batch " .. b .. " row " .. i)
          end
        end
      end
      assert(is_nan(o[1][2][1]) and o[2][2][2] == INF, kernel .. ": visible rows keep NaN / inf")
    end
  end)

  it("the fused module forward gives zeros for a row its mask buffer hides, v holding NaN", function()
    -- token 5 is NaN; row 3 is hidden from everything (so from token 5 too)
    for _, size in ipairs { { d_in = 3, d_out = 2, n = 6 }, { d_in = 16, d_out = 32, n = 40 } } do
      attn.manual_seed(7)
      local m = nn.CausalAttention(size.d_in, size.d_out, size.n, 0.0)
      m:eval()
      m.mask:zero_()
      for j = 1, size.n do m.mask[3][j] = 1 end
      for i = 1, size.n do
        if i ~= 3 then m.mask[i][5] = 1 end -- only row 3 would see it, and it sees nothing
      end
      local x = attn.rand(2, size.n, size.d_in)
      for d = 1, size.d_in do x[1][5][d] = NAN end
      for _, y in ipairs { m(x), m:forward_modules(x) } do
        local t = y:totable()
        for b = 1, 2 do
          for d = 1, size.d_out do
            assert.are.equal(0, t[b][3][d], ("n = %d: batch %d row 3"):format(size.n, b))
          end
        end
      end
    end
  end)
end)

describe("scale is checked as float32", function()
  local q, k, v = attn.rand(1, 3, 4), attn.rand(1, 5, 4), attn.rand(1, 5, 2)

  it("scale = 1e39 (inf in float32) is an error in both kernels", function()
    for _, kernel in ipairs(KERNELS) do
      for _, s in ipairs { 1e39, -1e39, 3.5e38, math.huge, 0 / 0 } do
        C.fails(function() return SDPA(q, k, v, { scale = s, kernel = kernel }) end,
          "attn.scaled_dot_product_attention: bad option 'scale'", "finite in float32")
      end
    end
  end)

  it("the largest finite float32, 0 and negative scales are accepted (as by torch)", function()
    for _, kernel in ipairs(KERNELS) do
      local o = SDPA(q, k, v, { scale = 0x1.fffffep+127, kernel = kernel })
      assert.are.same({ 1, 3, 2 }, o:size())
      -- scale 0: every score is 0, the output is the mean of v
      local z = SDPA(q, k, v, { scale = 0, kernel = kernel }):view(3, 2):totable()
      local vt = v:view(5, 2):totable()
      for d = 1, 2 do
        local mean = 0
        for j = 1, 5 do mean = mean + vt[j][d] / 5 end
        for i = 1, 3 do assert(math.abs(z[i][d] - mean) <= 1e-6) end
      end
      local neg = SDPA(q, k, v, { scale = -2, kernel = kernel }):view(3, 2)
      close_to(neg, ref_attention(q:view(3, 4):totable(), k:view(5, 4):totable(), vt, function() return false end, -2),
        2e-6, "scale -2")
    end
  end)

  it("MultiHeadAttention's scale option, and a scale set after construction", function()
    C.fails(function() return nn.MultiHeadAttention(4, 4, 6, 0.0, 2, { scale = 1e39 }) end,
      "attn.nn.MultiHeadAttention: bad option 'scale'", "finite in float32", "1e+39")
    local m = nn.MultiHeadAttention(4, 4, 6, 0.0, 2, { scale = 3e38 })
    m.scale = 1e39
    C.fails(function() return m(attn.rand(1, 6, 4)) end, "scale", "finite in float32")
  end)
end)

describe("the modules' mask buffer takes effect", function()
  local function build(c)
    local a = c.args
    if c.class == "CausalAttention" then return nn.CausalAttention(a[1], a[2], a[3], a[4]) end
    if c.class == "MultiHeadAttentionWrapper" then return nn.MultiHeadAttentionWrapper(a[1], a[2], a[3], a[4], a[5]) end
    return nn.MultiHeadAttention(a[1], a[2], a[3], a[4], a[5])
  end

  for _, c in ipairs(F) do
    it("a loaded mask gives torch's output: " .. c.name, function()
      attn.manual_seed(c.seed)
      local m = build(c)
      local d = {}
      for _, e in ipairs(c.state) do d[e[1]] = C.T(e[2]) end
      assert.are.same({ missing_keys = {}, unexpected_keys = {} }, m:load_state_dict(d))
      m:train(c.train)
      -- torch drew x right after construction: so does attn, with the same bits
      local x = attn.rand(table.unpack(c.x.shape))
      C.exact(x, c.x, "x")
      local y = m(x)
      -- the forward consumed what torch's did
      C.exact(attn.rand(4), c.after, "random numbers after the forward")
      local hidden = {}
      for _, r in ipairs(c.hidden_rows or {}) do hidden[r] = true end
      local want, got = C.flat(C.T(c.out)), C.flat(y)
      local n, width = y:size(-2), y:size(-1)
      local bias = m.out_proj and C.flat(m.out_proj.bias)
      for idx = 1, #got do
        local row = ((idx - 1) // width) % n + 1
        if hidden[row] then
          -- torch: NaN (softmax of -inf); attn: zeros, out_proj's bias after the projection
          local col = (idx - 1) % width + 1
          assert.are.equal(bias and bias[col] or 0, got[idx], "hidden row " .. row)
        else
          assert(math.abs(got[idx] - want[idx]) <= 2e-5,
            ("%s: element %d is %.9g, torch %.9g"):format(c.name, idx, got[idx], want[idx]))
        end
      end
      -- the fused forward and the module-by-module path give the same bits
      if c.class ~= "MultiHeadAttentionWrapper" and not c.train then
        C.same_bits(y, m:forward_modules(x), "fused vs module path")
      end
    end)
  end

  it("in training with dropout, the fused and the module path draw and give the same bits", function()
    for _, size in ipairs { { 4, 4, 6, 2 }, { 16, 32, 40, 4 } } do
      attn.manual_seed(3)
      local m = nn.MultiHeadAttention(size[1], size[2], size[3], 0.5, size[4])
      m.mask:copy_(from_fn(size[3], size[3], function(i, j) return j < i - 1 and 1 or 0 end))
      local x = attn.rand(2, size[3], size[1])
      attn.manual_seed(99)
      local a = m(x)
      attn.manual_seed(99)
      local b = m:forward_modules(x)
      C.same_bits(a, b, "d_in " .. size[1])
    end
  end)

  it("a loaded mask at a size where the fused forward takes the flash kernel (n = 260)", function()
    attn.manual_seed(8)
    local n = 260
    local m = nn.MultiHeadAttention(8, 16, n, 0.0, 2)
    m:eval()
    -- a band of width 3, row 100 hidden entirely
    local function hidden(i, j) return i == 100 or j > i or j < i - 3 end
    m.mask:copy_(from_fn(n, n, function(i, j) return hidden(i, j) and 1 or 0 end))
    local x = attn.rand(1, n, 8)
    local y = m(x)
    C.same_bits(y, m:forward_modules(x), "fused vs module path")
    close_to(y, ref_module(m, x, hidden, 2, 1 / math.sqrt(8)), 1e-5, "double reference")
    C.same_bits(y:select(2, 100), m.out_proj.bias:view(1, 16), "hidden row = out_proj's bias")
  end)

  it("an in-place edit of m.mask takes effect (CausalAttention, MultiHeadAttention, wrapper heads)", function()
    attn.manual_seed(21)
    local ca = nn.CausalAttention(3, 2, 6, 0.0)
    local mha = nn.MultiHeadAttention(4, 6, 6, 0.0, 2)
    local x3, x4 = attn.rand(2, 5, 3), attn.rand(2, 5, 4)
    local none = function() return false end
    local causal = function(i, j) return j > i end
    close_to(ca(x3), ref_module(ca, x3, causal, 1, 1 / math.sqrt(2)), 1e-5, "CausalAttention, causal")
    ca.mask:zero_()
    close_to(ca(x3), ref_module(ca, x3, none, 1, 1 / math.sqrt(2)), 1e-5, "CausalAttention, zeroed mask")
    close_to(mha(x4), ref_module(mha, x4, causal, 2, 1 / math.sqrt(3)), 1e-5, "MultiHeadAttention, causal")
    mha.mask:fill_(0)
    mha.mask[1][6] = 1 -- outside the [5, 5] corner: no effect for 5 tokens
    close_to(mha(x4), ref_module(mha, x4, none, 2, 1 / math.sqrt(3)), 1e-5, "MultiHeadAttention, zeroed mask")
    -- back to the triangle: the causal path again, bit for bit
    mha.mask:copy_(attn.triu(attn.ones(6, 6), 1))
    local fresh = nn.MultiHeadAttention(4, 6, 6, 0.0, 2)
    fresh:load_state_dict(mha:state_dict())
    C.same_bits(mha(x4), fresh(x4), "restored triangle")

    local w = nn.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2)
    local before = w(x3)
    w.heads[2].mask:zero_()
    local after = w(x3)
    -- head 1's half unchanged, head 2's half now attends to every token
    C.same_bits(before:narrow(3, 1, 2), after:narrow(3, 1, 2), "head 1")
    close_to(after:narrow(3, 3, 2), ref_module(w.heads[2], x3, none, 1, 1 / math.sqrt(2)), 1e-5, "head 2")
  end)

  it("need_weights shows the loaded mask", function()
    attn.manual_seed(5)
    local m = nn.CausalAttention(3, 2, 6, 0.0)
    m.mask:copy_(attn.tril(attn.ones(6, 6), -1))
    local _, w = m(attn.rand(1, 6, 3), { need_weights = true })
    local wt = w:view(6, 6):totable()
    for i = 1, 6 do
      for j = 1, 6 do
        if j < i then assert.are.equal(0, wt[i][j]) else assert(wt[i][j] > 0) end
      end
    end
  end)

  it("a buffer that is not a 0/1 [>= n, >= n] tensor is an error naming the class", function()
    attn.manual_seed(1)
    local x = attn.rand(1, 6, 3)
    local m = nn.CausalAttention(3, 2, 6, 0.0)
    m.mask[2][4] = 0.5
    C.fails(function() return m(x) end, "CausalAttention:forward: the 'mask' buffer must hold only 0 and 1",
      "got 0.5 at [2, 4]")
    m.mask[2][4] = 0 / 0
    C.fails(function() return m(x) end, "got nan at [2, 4]")
    m.mask = attn.triu(attn.ones(4, 4), 1)
    C.fails(function() return m(x) end, "the 'mask' buffer must be a tensor of at least [6, 6] for 6 tokens",
      "got [4, 4]")
    m.mask = "none"
    C.fails(function() return m(x) end, "got string")
    local mha = nn.MultiHeadAttention(3, 4, 6, 0.0, 2)
    mha.mask[6][1] = -INF
    C.fails(function() return mha(x) end, "MultiHeadAttention:forward: the 'mask' buffer", "got -inf at [6, 1]")
    -- a non-0/1 value outside the [n, n] corner is not read, as in torch's slice
    assert.are.same({ 1, 5, 4 }, mha(attn.rand(1, 5, 3)):size())
  end)
end)

describe("a float mask must hold only 0 and 1", function()
  local q, k, v = attn.rand(2, 3, 4), attn.rand(2, 5, 4), attn.rand(2, 5, 2)

  it("an ALiBi-like table as mask is an error suggesting bias, in both kernels", function()
    local alibi = from_fn(3, 5, function(i, j) return -0.5 * math.abs(i - j) end)
    for _, kernel in ipairs(KERNELS) do
      C.fails(function() return SDPA(q, k, v, { mask = alibi, kernel = kernel }) end,
        "attn.scaled_dot_product_attention: mask must hold only 0 and 1 (nonzero = hidden), got -0.5 at [1, 2]",
        "pass them as bias")
      for _, bad in ipairs { 2, -1, 0.25, INF, -INF, NAN } do
        local m = attn.zeros(2, 3, 5)
        m[2][3][4] = bad
        C.fails(function() return SDPA(q, k, v, { mask = m, kernel = kernel }) end,
          "mask must hold only 0 and 1", ("got %s at [2, 3, 4]"):format(bad ~= bad and "nan" or ("%.9g"):format(bad)))
      end
    end
    -- the same values as bias are what the table was meant for
    local o = SDPA(q, k, v, { bias = alibi })
    assert.are.same({ 2, 3, 2 }, o:size())
  end)

  it("an expanded mask reports an index inside its own shape", function()
    local row = attn.zeros(1, 5)
    row[1][3] = 0.5
    C.fails(function() return SDPA(q, k, v, { mask = row:expand(3, 5) }) end, "got 0.5 at [1, 3]")
  end)

  it("0/1 masks from comparisons, triu, ones and zeros keep working", function()
    local scores = attn.rand(3, 5)
    local masks = {
      scores:gt(0.5), attn.triu(attn.ones(3, 5), 1), attn.ones(3, 5), attn.zeros(3, 5),
      attn.zeros(1, 1):expand(3, 5), scores:eq(scores), attn.tensor({ -0.0, 0, 1, 0, 1 }),
    }
    for i, m in ipairs(masks) do
      for _, kernel in ipairs(KERNELS) do
        local o = SDPA(q, k, v, { mask = m, kernel = kernel })
        assert.are.same({ 2, 3, 2 }, o:size(), "mask " .. i)
      end
    end
  end)

  it("the check of a huge broadcast mask costs its storage, not its view", function()
    local kind = require("attn.core").modules.mask_kind
    local t0 = os.clock()
    assert.are.equal("mask", kind(attn.zeros(1, 1):expand(2 ^ 30, 2 ^ 30)))
    assert(os.clock() - t0 < 1)
    local bad = attn.zeros(1, 1)
    bad[1][1] = 3
    assert.are.same({ nil, "3 at [1, 1]" }, { kind(bad:expand(2 ^ 30, 2 ^ 30)) })
  end)

  it("nn.Attention's mask is checked the same way", function()
    attn.manual_seed(2)
    local m = nn.Attention(2)
    local x = attn.rand(3, 2)
    local alibi = from_fn(3, 3, function(i, j) return -math.abs(i - j) end)
    C.fails(function() return m(x, x, x, alibi) end,
      "Attention:forward: bad argument 'mask' (must hold only 0 and 1 (nonzero = hidden), got -1 at [1, 2])")
    assert.are.same({ 3, 2 }, m(x, x, x, attn.triu(attn.ones(3, 3), 1)):size())
  end)
end)
