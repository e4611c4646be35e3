-- Block masks (attn.block_mask, the block_mask option of
-- scaled_dot_product_attention): against PyTorch 1.13 dense masked attention
-- (spec/fixtures/block_mask_cases.lua from
-- scripts/fixtures/make_block_mask_fixtures.py: forward out and lse, and
-- q/k/v/bias gradients), against the equivalent dense `mask` in attn's own
-- kernels, the block structure (one fn call per block, classification,
-- drawing), skipping in the flash kernel, thread independence and bad input.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local FIX = dofile("spec/fixtures/block_mask_cases.lua")

local sdpa = attn.scaled_dot_product_attention
local BM = attn.block_mask
local NAME, BNAME = "attn.scaled_dot_product_attention", "attn.block_mask"
local ATOL, RTOL = 3e-5, 1e-5

-- The fixture's Lua mask function (make_block_mask_fixtures.py's "lua"): a
-- band that moves with b and h; q, k are 1-based, so with i = q - 1, j = k - 1:
-- j <= i + 3h - b and j >= i - 40 + 5b.
local function lua_fn(b, h, q, k)
  return k:le(q + (3 * h - b)) * k:ge(q + (-40 + 5 * b))
end

-- The mask function of a fixture tree ({"causal"}, {"sliding", w}, {"document", n}, {"lua"}, {"and"/"or", ...}).
local function mask_fn(fn, L)
  local kind = fn[1]
  if kind == "causal" then return BM.causal end
  if kind == "sliding" then return BM.sliding_window(fn[2]) end
  if kind == "document" then
    local ids = {}
    for i = 0, L - 1 do ids[#ids + 1] = i // fn[2] end
    return BM.document(attn.tensor(ids))
  end
  if kind == "lua" then return lua_fn end
  local parts = {}
  for x = 2, #fn do parts[#parts + 1] = mask_fn(fn[x], L) end
  return (kind == "and" and BM.and_ or BM.or_)(table.unpack(parts))
end

-- The same tree as plain Lua on 0-based (i, j), b, h: visible?
local function visible(fn, b, h, i, j)
  local kind = fn[1]
  if kind == "causal" then return j <= i end
  if kind == "sliding" then return j <= i and i - j < fn[2] end
  if kind == "document" then return i // fn[2] == j // fn[2] end
  if kind == "lua" then return j <= i + 3 * h - b and j >= i - 40 + 5 * b end
  for x = 2, #fn do
    local v = visible(fn[x], b, h, i, j)
    if kind == "and" and not v then return false end
    if kind == "or" and v then return true end
  end
  return kind == "and"
end

-- attn's `mask` (1 = hidden) [B, H, Lq, Lk] equivalent to tree fn, built
-- element by element here (no block code).
local function dense_hidden(fn, B, H, lq, lk)
  local d = {}
  for b = 1, B do
    for h = 1, H do
      for i = 0, lq - 1 do
        for j = 0, lk - 1 do d[#d + 1] = visible(fn, b, h, i, j) and 0 or 1 end
      end
    end
  end
  return attn.tensor(d):view(B, H, lq, lk)
end

-- The fixture's `mask` formula (make_block_mask_fixtures.py), 1 = hidden.
local function mask_formula(lq, lk)
  local d = {}
  for i = 0, lq - 1 do
    for j = 0, lk - 1 do d[#d + 1] = ((i * 7 + j * 3) % 5 == 0 or i % 6 == 5) and 1 or 0 end
  end
  return attn.tensor(d):view(lq, lk)
end

local function build(c)
  local bopts = c.block and {block = c.block} or nil
  return BM(mask_fn(c.fn, math.max(c.lq, c.lk)), c.b, c.hq, c.lq, c.lk, bopts)
end

local function inputs(c)
  attn.manual_seed(c.seed)
  local q = attn.randn(c.b, c.hq, c.lq, c.e)
  local k = attn.randn(c.b, c.hkv, c.lk, c.e)
  local v = attn.randn(c.b, c.hkv, c.lk, c.ev)
  local o = {return_lse = true, block_mask = build(c), enable_gqa = c.gqa, window = c.window, softcap = c.softcap,
             scale = c.scale, is_causal = c.causal}
  if c.bias then o.bias = attn.randn(c.hq, c.lq, c.lk) end
  if c.alibi then o.alibi_slopes = attn.alibi_slopes(c.hq) end
  if c.mask then o.mask = mask_formula(c.lq, c.lk) end
  return q, k, v, o
end

local function pick_rows(out, lse, c)
  local o, l = out:totable(), lse:totable()
  local od, ld = {}, {}
  for b = 1, c.b do
    for h = 1, c.hq do
      for _, r in ipairs(c.rows) do
        for d = 1, c.ev do od[#od + 1] = o[b][h][r + 1][d] end
        ld[#ld + 1] = l[b][h][r + 1]
      end
    end
  end
  return attn.tensor(od):view(c.b, c.hq, #c.rows, c.ev), attn.tensor(ld):view(c.b, c.hq, #c.rows)
end

local function describe_case(c)
  local parts = {}
  for _, key in ipairs {"gqa", "causal", "bias", "alibi", "softcap", "scale", "mask"} do
    if c[key] ~= nil and c[key] ~= false then parts[#parts + 1] = key .. "=" .. tostring(c[key]) end
  end
  if c.window then parts[#parts + 1] = ("window={%d, %d}"):format(c.window[1], c.window[2]) end
  return ("%s: B %d, Hq %d, Lq %d, Lk %d, block %s (%s)"):format(c.name, c.b, c.hq, c.lq, c.lk,
    tostring(c.block or "default"), table.concat(parts, " "))
end

describe("block_mask against PyTorch 1.13 dense masks", function()
  for _, c in ipairs(FIX.cases) do
    for _, kernel in ipairs {"math", "flash"} do
      it(kernel .. ": " .. describe_case(c), function()
        local q, k, v, o = inputs(c)
        o.kernel = kernel
        local out, lse = sdpa(q, k, v, o)
        local po, pl = pick_rows(out, lse, c)
        C.close(po, c.out, RTOL, ATOL, "out")
        C.close(pl, c.lse, RTOL, ATOL, "lse")
      end)
    end
  end
  for _, c in ipairs(FIX.grads) do
    for _, kernel in ipairs {"math", "flash"} do
      it(kernel .. " gradients: " .. describe_case(c), function()
        local q, k, v, o = inputs(c)
        local g = attn.randn(c.b, c.hq, c.lq, c.ev)
        for _, t in ipairs {q, k, v, o.bias} do attn.autograd.requires_grad_(t, true) end
        o.kernel, o.return_lse = kernel, nil
        sdpa(q, k, v, o):backward(g)
        C.close(q.grad, c.dq, RTOL, ATOL, "dq")
        C.close(k.grad, c.dk, RTOL, ATOL, "dk")
        C.close(v.grad, c.dv, RTOL, ATOL, "dv")
        if c.dbias then C.close(o.bias.grad, c.dbias, RTOL, ATOL, "dbias") end
      end)
    end
  end
end)

describe("block_mask equals the equivalent dense mask in attn's kernels", function()
  for _, c in ipairs {
    {fn = {"lua"}, B = 2, H = 3, lq = 130, lk = 300, block = 32},
    {fn = {"and", {"document", 100}, {"causal"}}, B = 1, H = 2, lq = 700, lk = 700},
    {fn = {"or", {"sliding", 50}, {"document", 64}}, B = 1, H = 2, lq = 300, lk = 260, block = 48,
     opts = {dropout_p = 0.3, is_causal = true}},
    {fn = {"sliding", 33}, B = 2, H = 1, lq = 1030, lk = 1030, opts = {bias = true, scale = 0.2}},
    {fn = {"or", {"document", 700}, {"lua"}}, B = 1, H = 2, lq = 3, lk = 2100}, -- flash's split-K decoding
  } do
    for _, kernel in ipairs {"math", "flash"} do
      it(("%s: %s, B %d, H %d, Lq %d, Lk %d, block %s%s"):format(kernel, c.fn[1], c.B, c.H, c.lq, c.lk,
        tostring(c.block or "default"), c.opts and ", dropout/bias/causal" or ""), function()
        local bm = BM(mask_fn(c.fn, math.max(c.lq, c.lk)), c.B, c.H, c.lq, c.lk, c.block and {block = c.block})
        local hidden = dense_hidden(c.fn, c.B, c.H, c.lq, c.lk)
        attn.manual_seed(4)
        local q, k, v = attn.randn(c.B, c.H, c.lq, 16), attn.randn(c.B, c.H, c.lk, 16), attn.randn(c.B, c.H, c.lk, 8)
        local o1 = {kernel = kernel, block_mask = bm, return_lse = true}
        local o2 = {kernel = kernel, mask = hidden, return_lse = true}
        for key, val in pairs(c.opts or {}) do
          if key == "bias" then val = attn.randn(c.H, c.lq, c.lk) end
          o1[key], o2[key] = val, val
        end
        for _, t in ipairs {q, k, v} do attn.autograd.requires_grad_(t, true) end
        local g = attn.randn(c.B, c.H, c.lq, 8)
        attn.manual_seed(9)
        local out1, lse1 = sdpa(q, k, v, o1)
        local d1 = attn.autograd.grad({out1}, {q, k, v}, {g})
        attn.manual_seed(9)
        local out2, lse2 = sdpa(q, k, v, o2)
        local d2 = attn.autograd.grad({out2}, {q, k, v}, {g})
        -- both kernels skip the empty blocks' products (their sums may round differently)
        assert.is_true(attn.allclose(out1, out2, 1e-5, 1e-6), "out")
        assert.is_true(attn.allclose(lse1, lse2, 1e-6, 1e-6), "lse")
        for x, name in ipairs {"dq", "dk", "dv"} do
          assert.is_true(attn.allclose(d1[x], d2[x], 1e-5, 1e-6), name)
        end
      end)
    end
  end

  it("k and v transposed or strided (each BLAS layout of the math kernel's cut products)", function()
    local fn = {"or", {"document", 50}, {"lua"}}
    local bm = BM(mask_fn(fn, 200), 1, 2, 150, 200, {block = 32})
    local hidden = dense_hidden(fn, 1, 2, 150, 200)
    attn.manual_seed(8)
    local q = attn.randn(1, 2, 150, 16)
    local layouts = {
      {attn.randn(1, 2, 16, 200):transpose(3, 4), attn.randn(1, 2, 8, 200):transpose(3, 4)},
      {attn.randn(1, 2, 200, 16, 2):select(5, 2), attn.randn(1, 2, 200, 8, 3):select(5, 1)},
      {attn.randn(1, 2, 200, 16), attn.randn(1, 2, 200, 8)},
    }
    for x, kv in ipairs(layouts) do
      for _, kernel in ipairs {"math", "flash"} do
        local out1, lse1 = sdpa(q, kv[1], kv[2], {kernel = kernel, block_mask = bm, return_lse = true})
        local out2, lse2 = sdpa(q, kv[1], kv[2], {kernel = kernel, mask = hidden, return_lse = true})
        assert.is_true(attn.allclose(out1, out2, 1e-5, 1e-6), kernel .. " out, layout " .. x)
        assert.is_true(attn.allclose(lse1, lse2, 1e-6, 1e-6), kernel .. " lse, layout " .. x)
      end
    end
  end)

  it("flash never reads keys and values of empty blocks (NaN there leaves the result finite)", function()
    -- 4 documents of 64: keys 65..128 are hidden from every query of documents 1, 3, 4
    local ids = {}
    for i = 0, 255 do ids[#ids + 1] = i // 64 end
    local bm = BM(BM.document(attn.tensor(ids)), 1, 1, 256, 256, {block = 64})
    attn.manual_seed(5)
    local q, k, v = attn.randn(1, 1, 256, 16), attn.randn(1, 1, 256, 16), attn.randn(1, 1, 256, 16)
    local qs = q:narrow(3, 1, 64) -- the first document's queries only
    local kn, vn = k:clone(), v:clone()
    kn:narrow(3, 65, 64):fill_(0 / 0)
    vn:narrow(3, 65, 64):fill_(0 / 0)
    local bm1 = BM(BM.document(attn.tensor(ids)), 1, 1, 64, 256, {block = 64})
    local out = sdpa(qs, kn, vn, {kernel = "flash", block_mask = bm1})
    C.same_bits(out, sdpa(qs, k, v, {kernel = "flash", block_mask = bm1}))
    -- the dense mask visits every key: NaN * 0 reaches the output (the test can fail)
    local dense = bm1:to_dense():eq(0)
    local dn = sdpa(qs, kn, vn, {kernel = "flash", mask = dense})
    assert.is_true(dn:ne(dn):sum():item() > 0)
    assert.equal(256, bm.Lk)
  end)
end)

describe("block_mask structure", function()
  it("calls a Lua fn once per block and per (b, h), with the block's 1-based index tensors", function()
    local calls, seen = 0, {}
    local bm = BM(function(b, h, q, k)
      calls = calls + 1
      seen[#seen + 1] = {b, h, q:size(), k:size(), q:view(-1):totable()[1], k:view(-1):totable()[1]}
      return attn.ones(1)
    end, 2, 3, 70, 45, {block = 16})
    -- ceil(70 / 16) = 5 query blocks, ceil(45 / 16) = 3 key blocks, B 2, H 3
    assert.equal(2 * 3 * 5 * 3, calls)
    assert.are.same({1, 1, {16, 1}, {1, 16}, 1, 1}, seen[1])
    assert.are.same({1, 1, {16, 1}, {1, 13}, 1, 33}, seen[3]) -- the last key block: keys 33..45
    assert.are.same({1, 1, {6, 1}, {1, 16}, 65, 1}, seen[13]) -- the last query block: rows 65..70
    assert.are.same({2, 3, {6, 1}, {1, 13}, 65, 33}, seen[calls])
    assert.equal(0, bm:sparsity())
    assert.are.same({2, 3, 70, 45, 16}, {bm.B, bm.H, bm.Lq, bm.Lk, bm.block})
  end)

  it("classifies blocks: causal 512 x 512 in blocks of 64 skips 28 of 64", function()
    local bm = BM(BM.causal, 4, 8, 512, 512, {block = 64})
    assert.equal(28 / 64, bm:sparsity())
    local d = bm:to_dense()
    assert.are.same({4, 8, 512, 512}, d:size())
    C.same_bits(d:select(1, 3):select(1, 5), attn.tril(attn.ones(512, 512)))
  end)

  it("default block: 128 from L 1024 on, else the multiple of 16 at or above L / 8", function()
    assert.equal(128, BM(BM.causal, 1, 1, 4096, 1030).block)
    assert.equal(128, BM(BM.causal, 1, 1, 1023, 7).block)
    assert.equal(48, BM(BM.causal, 1, 1, 300, 300).block)
    assert.equal(16, BM(BM.causal, 1, 1, 7, 65).block)
    assert.equal(16, BM(BM.causal, 1, 1, 1, 1).block)
  end)

  it("draws the pattern: full, partial, empty", function()
    local ids = {}
    for i = 0, 95 do ids[#ids + 1] = i // 48 end
    local bm = BM(BM.and_(BM.document(attn.tensor(ids)), BM.causal), 1, 1, 96, 96, {block = 16})
    assert.equal(table.concat({
      "attn.BlockMask(B=1, H=1, Lq=96, Lk=96, block=16): 6 x 6 blocks, sparsity 0.6667",
      "░·····", "█░····", "██░···", "···░··", "···█░·", "···██░",
      "█ full  ░ partial  · empty (rows: query blocks, columns: key blocks)"}, "\n"), tostring(bm))
    assert.equal("attn.block_mask.and_(document([96] ids), causal)", tostring(BM.and_(BM.document(attn.tensor(ids)),
      BM.causal)))
    assert.equal("attn.block_mask.or_(sliding_window(4), <Lua function>)", tostring(BM.or_(BM.sliding_window(4),
      lua_fn)))
    local big = tostring(BM(BM.causal, 1, 1, 100 * 16, 100 * 16, {block = 16}))
    assert.truthy(big:find("(68 more query blocks)", 1, true))
  end)

  it("built-ins are callable as fn(b, h, q, k), also from a Lua fn", function()
    local q, k = attn.tensor({{1}, {2}, {5}}), attn.tensor({{1, 2, 3, 4, 5, 6}})
    C.same_bits(BM.causal(1, 1, q, k), k:le(q))
    C.same_bits(BM.sliding_window(2)(1, 1, q, k), k:le(q) * k:gt(q - 2))
    local ids = attn.tensor({0, 0, 1, 1, 1, 2})
    C.same_bits(BM.document(ids)(1, 1, q, k), attn.tensor({{1, 1, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {0, 0, 1, 1, 1, 0}}))
    C.same_bits(BM.or_(BM.causal, function(_, _, qq, kk) return kk:eq(qq + 1) end)(1, 1, q, k),
      attn.tensor({{1, 1, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 1}}))
    -- a Lua fn built on a built-in gives the same blocks as the C combinator
    local doc = {}
    for i = 0, 199 do doc[#doc + 1] = i // 37 end
    local document = BM.document(attn.tensor(doc))
    local via_lua = BM(function(b, h, qq, kk) return document(b, h, qq, kk) * kk:le(qq) end, 1, 1, 200, 200)
    local in_c = BM(BM.and_(document, BM.causal), 1, 1, 200, 200)
    C.same_bits(via_lua:to_dense(), in_c:to_dense())
    assert.equal(in_c:sparsity(), via_lua:sparsity())
    C.fails(function() BM.document(ids)(1, 1, attn.tensor({{7}}), k) end, "attn.block_mask.document",
      "position 7 is not an integer in [1, 6]")
    C.fails(function() BM.causal(1, 1, attn.ones(3), k) end, "expected positions q [n, 1] and k [1, m]", "[3]")
  end)

  it("a B or H of 1 broadcasts over the call's batch and heads", function()
    local bm = BM(function(_, _, q, k) return k:le(q) end, 1, 1, 20, 20, {block = 8})
    attn.manual_seed(6)
    local q, k, v = attn.randn(3, 2, 20, 8), attn.randn(3, 2, 20, 8), attn.randn(3, 2, 20, 8)
    for _, kernel in ipairs {"math", "flash"} do
      C.same_bits(sdpa(q, k, v, {kernel = kernel, block_mask = bm}), sdpa(q, k, v, {kernel = kernel, is_causal = true}))
    end
    -- H given, B broadcast, q without a batch dim
    local per_head = BM(function(_, h, q, k) return k:le(q + (h - 1)) end, 1, 2, 20, 20, {block = 8})
    local out = sdpa(q:select(1, 1), k:select(1, 1), v:select(1, 1), {block_mask = per_head})
    assert.are.same({2, 20, 8}, out:size())
  end)

  it("the same bits for 1 and 2 threads (forward and backward, both kernels)", function()
    local script = [[
local attn = require "attn"
local ids = {}
for i = 0, 699 do ids[#ids + 1] = i // 90 end
local bm = attn.block_mask(attn.block_mask.or_(attn.block_mask.document(attn.tensor(ids)),
  function(b, h, q, k) return k:le(q + (h - 30)) end), 1, 4, 300, 700, {block = 40})
attn.manual_seed(2)
local q, k, v = attn.randn(1, 4, 300, 32, {requires_grad = true}), attn.randn(1, 4, 700, 32, {requires_grad = true}),
  attn.randn(1, 4, 700, 32, {requires_grad = true})
local h = 0
for _, kernel in ipairs({"math", "flash"}) do
  local out, lse = attn.scaled_dot_product_attention(q, k, v, {kernel = kernel, block_mask = bm, return_lse = true})
  local g = attn.autograd.grad({out:sum()}, {q, k, v})
  for _, t in ipairs({out, lse, g[1], g[2], g[3]}) do
    for _, x in ipairs(t:detach():view(-1):totable()) do
      h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
    end
  end
end
-- one slice: the flash backward splits it into key and query blocks with 2 threads
local q1, k1, v1 = q:narrow(2, 1, 1):detach(), k:narrow(2, 1, 1):detach(), v:narrow(2, 1, 1):detach()
for _, t in ipairs({q1, k1, v1}) do attn.autograd.requires_grad_(t, true) end
local bm1 = attn.block_mask(attn.block_mask.document(attn.tensor(ids)), 1, 1, 300, 700, {block = 40})
local out = attn.scaled_dot_product_attention(q1, k1, v1, {kernel = "flash", block_mask = bm1})
local g = attn.autograd.grad({out:sum()}, {q1, k1, v1})
for _, t in ipairs({out, g[1], g[2], g[3]}) do
  for _, x in ipairs(t:detach():view(-1):totable()) do
    h = (h * 31 + string.unpack("<I4", string.pack("<f", x))) % 4294967296
  end
end
io.write(string.format("%d\nEND\n", h))
]]
    assert.equal(C.run_with_threads(1, script), C.run_with_threads(2, script))
  end)
end)

describe("block_mask: bad input", function()
  it("fn raising an error: attn.block_mask, the block, and fn's message", function()
    C.fails(function() BM(function(b, h, q, k) if b == 2 then error("no second batch") end return k:le(q) end,
      2, 1, 20, 20, {block = 8}) end, BNAME, "fn raised an error at b 2, h 1, query block 1, key block 1",
      "no second batch")
    C.fails(function() BM(function() error({}) end, 1, 1, 4, 4) end, BNAME, "fn raised an error", "table:")
  end)
  it("fn returning the wrong shape or type", function()
    C.fails(function() BM(function() return attn.ones(3, 3) end, 1, 1, 4, 4) end, BNAME,
      "fn must return a tensor broadcastable to the block's [4, 4]", "got [3, 3]")
    C.fails(function() BM(function() return attn.ones(1, 4, 4) end, 1, 1, 4, 4) end, BNAME, "got [1, 4, 4]")
    C.fails(function() BM(function() return true end, 1, 1, 4, 4) end, BNAME, "got boolean")
    C.fails(function() BM(function() end, 1, 1, 4, 4) end, BNAME, "got nil")
    C.fails(function() BM(function() return attn.ones(8, 2) end, 1, 1, 20, 20, {block = 8}) end, BNAME,
      "broadcastable to the block's [8, 8]", "got [8, 2]")
  end)
  it("bad fn, sizes and block", function()
    C.fails(function() BM(42, 1, 1, 4, 4) end, BNAME, "bad argument #1 'fn'", "got number")
    C.fails(function() BM(BM.causal, 0, 1, 4, 4) end, BNAME, "bad argument #2 'B'", "got 0")
    C.fails(function() BM(BM.causal, 1, 1.5, 4, 4) end, BNAME, "bad argument #3 'H'", "got 1.5")
    C.fails(function() BM(BM.causal, 1, 1, -1, 4) end, BNAME, "bad argument #4 'Lq'")
    C.fails(function() BM(BM.causal, 1, 1, 4, "4") end, BNAME, "bad argument #5 'Lk'", "got string")
    for _, bad in ipairs {0, -3, 2.5, 5000} do
      C.fails(function() BM(BM.causal, 1, 1, 4, 4, {block = bad}) end, BNAME, "bad option 'block'",
        "expected an integer in [1, 4096]")
    end
    C.fails(function() BM(BM.causal, 1, 1, 4, 4, {blocks = 2}) end, BNAME, "unknown option 'blocks'")
    C.fails(function() BM(BM.causal, 1, 1, 4, 4, 8) end, BNAME, "bad argument #6 'opts'")
    C.fails(function() BM(BM.causal, 1, 1, 4, 4, nil, 1) end, BNAME, "bad argument #7",
      "no more than 6 arguments expected, got 7")
  end)
  it("built-ins: bad window, ids, combinator operands", function()
    C.fails(function() BM.sliding_window(0) end, "attn.block_mask.sliding_window", "width >= 1", "got 0")
    C.fails(function() BM.sliding_window("3") end, "attn.block_mask.sliding_window", "got string")
    C.fails(function() BM.document(attn.zeros(2, 3)) end, "attn.block_mask.document", "1-D", "[2, 3]")
    C.fails(function() BM.document({1, 2}) end, "attn.block_mask.document", "expected attn.Tensor")
    C.fails(function() BM.document(attn.tensor({1, 0 / 0})) end, "attn.block_mask.document", "finite ids", "at 2")
    C.fails(function() BM(BM.document(attn.zeros(10)), 1, 1, 12, 4) end, BNAME, "document ids has 10 entries",
      "max(Lq, Lk) = 12")
    C.fails(function() BM(BM.and_(BM.causal, BM.document(attn.zeros(3))), 1, 1, 2, 4) end, BNAME,
      "document ids has 3 entries")
    C.fails(function() BM.and_() end, "attn.block_mask.and_", "at least one")
    C.fails(function() BM.or_(BM.causal, 3) end, "attn.block_mask.or_", "bad argument #2", "got number")
  end)
  it("a block mask built for other sizes, or not a block mask", function()
    local q, k, v = attn.randn(2, 3, 10, 8), attn.randn(2, 3, 12, 8), attn.randn(2, 3, 12, 8)
    for _, s in ipairs {{2, 3, 12, 12}, {2, 3, 10, 10}, {2, 4, 10, 12}, {3, 3, 10, 12}} do
      local bm = BM(BM.causal, s[1], s[2], s[3], s[4])
      for _, kernel in ipairs {"math", "flash"} do
        C.fails(function() sdpa(q, k, v, {kernel = kernel, block_mask = bm}) end, NAME,
          ("block_mask was built for B %d, H %d, Lq %d, Lk %d"):format(s[1], s[2], s[3], s[4]),
          "the call has B 2, H 3 (q's dims -4 and -3), Lq 10, Lk 12")
      end
    end
    C.fails(function() sdpa(q, k, v, {block_mask = BM.causal}) end, NAME, "bad option 'block_mask'",
      "expected attn.BlockMask", "attn.MaskFn")
    C.fails(function() sdpa(q, k, v, {block_mask = attn.ones(10, 12)}) end, NAME, "bad option 'block_mask'",
      "got attn.Tensor")
  end)
end)
