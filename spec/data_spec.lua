-- attn.data: GPTDataset's windows against a computation written here from the
-- book's GPTDatasetV1 loop; DataLoader's batches, shapes and length; its
-- shuffled orders and the generators' positions afterwards against PyTorch
-- 1.13's DataLoader (spec/fixtures/data_cases.lua, written by
-- scripts/fixtures/make_data_fixtures.py from torch itself); attn.Generator;
-- bad input.
local attn = require "attn"
local D = dofile("spec/fixtures/data_cases.lua")
local bits = require "support.bits"
local flat, assert_bits, error_matching = bits.flat, bits.assert_bits, bits.error_matching

-- the book's loop, written out: for i in range(0, len(ids) - L, stride)
local function book_windows(ids, L, stride)
  local inputs, targets = {}, {}
  local i = 0
  while i < #ids - L do
    local x, y = {}, {}
    for j = 1, L do x[j] = ids[i + j]; y[j] = ids[i + j + 1] end
    inputs[#inputs + 1], targets[#targets + 1] = x, y
    i = i + stride
  end
  return inputs, targets
end

local function ids_from(n, seed)
  local ids, x = {}, seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    ids[i] = x % 50257 + 1
  end
  return ids
end

-- a dataset whose item i is the tensor {i - 1} (the fixture's torch.tensor([i]), 0-based)
local function indices_dataset(n)
  local ds = {}
  for i = 1, n do ds[i] = attn.tensor({i - 1}) end
  return ds
end

describe("attn.data.GPTDataset", function()
  for _, c in ipairs({{n = 20, L = 4, stride = 1}, {n = 20, L = 4, stride = 4}, {n = 21, L = 4, stride = 4},
                      {n = 5, L = 4, stride = 1}, {n = 50, L = 7, stride = 3}, {n = 9, L = 3, stride = 10}}) do
    it(("gives the book's GPTDatasetV1 windows (%d ids, max_length %d, stride %d)"):format(c.n, c.L, c.stride),
      function()
        local ids = ids_from(c.n, c.n * 7 + c.stride)
        local inputs, targets = book_windows(ids, c.L, c.stride)
        local ds = attn.data.GPTDataset(ids, c.L, c.stride)
        assert.are.equal(#inputs, #ds)
        for k = 1, #ds do
          local pair = ds[k]
          assert.are.equal(2, #pair)
          assert.are.same({c.L}, pair[1]:size())
          assert.are.same(inputs[k], pair[1]:totable())
          assert.are.same(targets[k], pair[2]:totable())
          local x, y = ds:get(k)
          assert.are.same(inputs[k], x:totable())
          assert.are.same(targets[k], y:totable())
        end
      end)
  end

  it("takes a 1-D tensor of ids as a table of them", function()
    local ids = ids_from(30, 3)
    local a, b = attn.data.GPTDataset(ids, 5, 2), attn.data.GPTDataset(attn.tensor(ids), 5, 2)
    assert.are.equal(#a, #b)
    for k = 1, #a do assert.are.same(a[k][1]:totable(), b[k][1]:totable()) end
  end)

  it("gives windows of its own: changing one leaves the dataset and the ids as they were", function()
    local ids = ids_from(10, 1)
    local t = attn.tensor(ids)
    local ds = attn.data.GPTDataset(t, 4, 1)
    ds[1][1]:fill_(0)
    t:fill_(0)
    assert.are.same({ids[1], ids[2], ids[3], ids[4]}, ds[1][1]:totable())
  end)

  it("holds ids as float32 integers that nn.Embedding and cross_entropy take", function()
    local ds = attn.data.GPTDataset(ids_from(12, 4), 4, 2)
    local x, y = ds:get(1)
    assert.are.equal("float32", x.dtype)
    local emb = attn.nn.Embedding(50257, 3)
    assert.are.same({4, 3}, emb(x):size())
    local loss = attn.nn.functional.cross_entropy(attn.zeros(4, 50257), y)
    assert.is_true(math.abs(loss:item() - math.log(50257)) < 1e-4)
  end)

  it("refuses an index out of range, naming it and the range", function()
    local ds = attn.data.GPTDataset(ids_from(10, 2), 4, 2)
    error_matching(function() return ds[0] end, "attn.data.GPTDataset: index 0 out of range (expected an integer from 1 to 3)")
    error_matching(function() return ds[4] end, "index 4 out of range")
    error_matching(function() return ds[1.5] end, "index 1.5 out of range")
    error_matching(function() ds:get(9) end, "GPTDataset:get: index 9 out of range")
    error_matching(function() ds.get({}, 1) end, "GPTDataset:get: bad argument #1 'self' (expected attn.data.GPTDataset")
  end)

  it("refuses a text shorter than max_length + 1 ids, naming the argument (the book's code gives an empty dataset)",
    function()
      error_matching(function() attn.data.GPTDataset({1, 2, 3, 4}, 4, 1) end,
        "attn.data.GPTDataset: bad argument #1 'ids' (expected at least max_length + 1 = 5 token ids for one input "
        .. "and target window, got 4)")
      error_matching(function() attn.data.GPTDataset({}, 1, 1) end, "got 0)")
      error_matching(function() attn.data.GPTDataset(attn.tensor({1, 2}), 2, 1) end, "= 3 token ids")
      error_matching(function() attn.data.GPTDataset({1, 2}, math.maxinteger, 1) end,
        "expected at least max_length + 1 = 9223372036854775808 token ids")
      local huge_stride = attn.data.GPTDataset({1, 2, 3}, 1, math.maxinteger)
      assert.are.equal(1, #huge_stride)
    end)

  it("refuses a bad max_length or stride, naming it and what came", function()
    local ids = ids_from(10, 1)
    for _, bad in ipairs({0, -1, 2.5, "4"}) do
      local shown = type(bad) == "string" and ("%q"):format(bad) or tostring(bad)
      error_matching(function() attn.data.GPTDataset(ids, bad, 1) end,
        "attn.data.GPTDataset: bad argument #2 'max_length' (expected an integer >= 1, got " .. shown .. ")")
      error_matching(function() attn.data.GPTDataset(ids, 4, bad) end,
        "attn.data.GPTDataset: bad argument #3 'stride' (expected an integer >= 1, got " .. shown .. ")")
    end
    error_matching(function() attn.data.GPTDataset(ids, nil, 1) end, "'max_length' (expected an integer >= 1, got nil)")
    error_matching(function() attn.data.GPTDataset(ids, 4, 1, 5) end, "bad argument #4 (no more than 3 arguments")
  end)

  it("refuses ids that are not 1-based integer token ids, naming the position", function()
    local function with(pos, v)
      local ids = ids_from(10, 1)
      ids[pos] = v
      return ids
    end
    error_matching(function() attn.data.GPTDataset(with(3, 2.5), 4, 1) end,
      "attn.data.GPTDataset: bad argument #1 'ids' (expected 1-based token ids (integers from 1 to 2^24, as "
      .. "tok:encode gives), got 2.5 at position 3)")
    error_matching(function() attn.data.GPTDataset(with(1, 0), 4, 1) end, "got 0 at position 1)")
    error_matching(function() attn.data.GPTDataset(with(2, -3), 4, 1) end, "got -3 at position 2)")
    error_matching(function() attn.data.GPTDataset(with(5, "7"), 4, 1) end, "got string at position 5)")
    error_matching(function() attn.data.GPTDataset(with(6, (1 << 24) + 1), 4, 1) end, "got 16777217 at position 6)")
    local t = attn.tensor(ids_from(10, 1))
    t[7] = 0 / 0
    error_matching(function() attn.data.GPTDataset(t, 4, 1) end, "at position 7)")
    local u = attn.tensor(ids_from(10, 1))
    u[8] = 0.5
    error_matching(function() attn.data.GPTDataset(u, 4, 1) end, "got 0.5 at position 8)")
    error_matching(function() attn.data.GPTDataset(attn.ones(2, 5), 1, 1) end,
      "bad argument #1 'ids' (expected a Lua table or a 1-D float32 tensor of 1-based token ids (integers from 1 to "
      .. "2^24, as tok:encode gives), got attn.Tensor of shape [2, 5])")
    error_matching(function() attn.data.GPTDataset(attn.ones(5):gt(0), 1, 1) end,
      "got attn.Tensor of shape [5], bool)")
    error_matching(function() attn.data.GPTDataset("some text", 1, 1) end, "got string)")
  end)
end)

describe("attn.data.DataLoader", function()
  it("stacks GPTDataset's pairs in order into [batch, max_length] inputs and targets", function()
    local ids = ids_from(40, 9)
    local inputs, targets = book_windows(ids, 6, 3)
    local ds = attn.data.GPTDataset(ids, 6, 3)
    local loader = attn.data.DataLoader(ds, {batch_size = 4})
    assert.are.equal(#inputs, #ds)
    assert.are.equal(math.ceil(#ds / 4), #loader)
    local k, batches = 0, 0
    for x, y in loader:iter() do
      batches = batches + 1
      local rows = math.min(4, #ds - k)
      assert.are.same({rows, 6}, x:size())
      assert.are.same({rows, 6}, y:size())
      for r = 1, rows do
        assert.are.same(inputs[k + r], x:totable()[r])
        assert.are.same(targets[k + r], y:totable()[r])
      end
      k = k + rows
    end
    assert.are.equal(#loader, batches)
    assert.are.equal(#ds, k)
  end)

  it("has ceil(n / batch_size) batches, floor with drop_last, as len(DataLoader)", function()
    for _, c in ipairs({{10, 3}, {9, 3}, {1, 5}, {0, 2}, {7, 1}}) do
      local n, bs = c[1], c[2]
      local ds = indices_dataset(n)
      local count = 0
      for _ in attn.data.DataLoader(ds, {batch_size = bs}):iter() do count = count + 1 end
      assert.are.equal(math.ceil(n / bs), #attn.data.DataLoader(ds, {batch_size = bs}))
      assert.are.equal(math.ceil(n / bs), count)
      assert.are.equal(n // bs, #attn.data.DataLoader(ds, {batch_size = bs, drop_last = true}))
      count = 0
      for _ in attn.data.DataLoader(ds, {batch_size = bs, drop_last = true}):iter() do count = count + 1 end
      assert.are.equal(n // bs, count)
    end
  end)

  it("takes a batch_size past the dataset: one short batch, or none with drop_last", function()
    local ds = indices_dataset(3)
    assert.are.equal(1, #attn.data.DataLoader(ds, {batch_size = math.maxinteger}))
    assert.are.equal(0, #attn.data.DataLoader(ds, {batch_size = math.maxinteger, drop_last = true}))
    local got = {}
    for x in attn.data.DataLoader(ds, {batch_size = math.maxinteger}):iter() do got[#got + 1] = flat(x) end
    assert.are.same({{0, 1, 2}}, got)
  end)

  it("takes any dataset with # and [i]: single tensors stack, numbers become a [batch] tensor", function()
    local loader = attn.data.DataLoader({attn.tensor({1, 2}), attn.tensor({3, 4}), attn.tensor({5, 6})},
      {batch_size = 2})
    local got = {}
    for x in loader:iter() do got[#got + 1] = x:totable() end
    assert.are.same({{{1, 2}, {3, 4}}, {{5, 6}}}, got)
    local n = {}
    for x in attn.data.DataLoader({7, 8, 9}, {batch_size = 3}):iter() do n[#n + 1] = x:totable() end
    assert.are.same({{7, 8, 9}}, n)
    local proxy = setmetatable({}, {__len = function() return 2 end,
                                    __index = function(_, i) return {attn.tensor({i}), i * 10} end})
    local xs, ys = {}, {}
    for x, y in attn.data.DataLoader(proxy, {batch_size = 2}):iter() do xs, ys = x:totable(), y:totable() end
    assert.are.same({{1}, {2}}, xs)
    assert.are.same({10, 20}, ys)
  end)

  describe("shuffle draws PyTorch 1.13's RandomSampler order (torch fixtures)", function()
    for _, c in ipairs(D.loader) do
      local name = ("as PyTorch 1.13: n %d, batch_size %d, drop_last %s, shuffle %s, manual_seed(%d), %s%s%s"):format(
        c.n, c.batch_size, tostring(c.drop_last), tostring(c.shuffle), c.seed,
        c.generator_seed and ("generator seeded " .. c.generator_seed) or "global generator",
        c.draw_between and ", a draw between iter() and the first batch" or "",
        c.take and (", " .. c.take .. " batches taken of each epoch") or ", every batch of each epoch")
      it(name, function()
        attn.manual_seed(c.seed)
        local g = c.generator_seed and attn.Generator():manual_seed(c.generator_seed) or nil
        local loader = attn.data.DataLoader(indices_dataset(c.n), {batch_size = c.batch_size, shuffle = c.shuffle,
          drop_last = c.drop_last, generator = g})
        assert.are.equal(c.len, #loader)
        for e, want in ipairs(c.epochs) do
          local it_ = loader:iter()
          if c.draw_between then assert_bits(attn.rand(1), c.between[e], "the draw between, epoch " .. e) end
          local got = {}
          local function add(x)
            assert.are.same({#flat(x), 1}, x:size())
            got[#got + 1] = flat(x)
          end
          if c.take then
            for _ = 1, c.take do add(it_()) end
          else
            for x in it_ do add(x) end
          end
          assert.are.same(want, got, "epoch " .. e)
        end
        assert_bits(attn.rand(2), c.after, "the global generator after the epochs")
        if g then
          attn.set_rng_state(g:get_state())
          assert_bits(attn.rand(2), c.generator_after, "the loader's generator after the epochs")
        end
      end)
    end
  end)

  it("gives the batches of the book's GPTDatasetV1 through torch's shuffled DataLoader, as PyTorch 1.13", function()
    local ids = {}
    for i, v in ipairs(D.book_ids) do ids[i] = v + 1 end
    local function plus1(rows)
      local out = {}
      for r, row in ipairs(rows) do
        out[r] = {}
        for j, v in ipairs(row) do out[r][j] = v + 1 end
      end
      return out
    end
    for _, c in ipairs(D.book) do
      attn.manual_seed(123)
      local ds = attn.data.GPTDataset(ids, c.max_length, c.stride)
      assert.are.equal(c.n_windows, #ds)
      local loader = attn.data.DataLoader(ds, {batch_size = c.batch_size, shuffle = true, drop_last = true})
      assert.are.equal(c.len, #loader)
      local b = 0
      for x, y in loader:iter() do
        b = b + 1
        assert.are.same(plus1(c.inputs[b]), x:totable())
        assert.are.same(plus1(c.targets[b]), y:totable())
      end
      assert.are.equal(c.len, b)
    end
  end)

  it("leaves the global generator alone when the loader has its own, apart from nothing", function()
    attn.manual_seed(42)
    local want = flat(attn.rand(3))
    attn.manual_seed(42)
    local g = attn.Generator():manual_seed(1)
    for _ in attn.data.DataLoader(indices_dataset(5), {shuffle = true, generator = g}):iter() do end
    assert.are.same(want, flat(attn.rand(3)))
  end)

  it("refuses bad datasets and options, naming them", function()
    local ds = indices_dataset(4)
    error_matching(function() attn.data.DataLoader(nil) end,
      "attn.data.DataLoader: bad argument #1 'dataset' (expected a dataset (with #dataset and dataset[i]), got nil)")
    error_matching(function() attn.data.DataLoader(io.stdout) end,
      "attn.data.DataLoader: bad argument #1 'dataset' (expected a dataset with #dataset, a count >= 0, and dataset[i], "
      .. "got FILE*)")
    error_matching(function() attn.data.DataLoader(ds, {batch_size = 0}) end,
      "attn.data.DataLoader: bad option 'batch_size' (expected an integer >= 1, got 0)")
    error_matching(function() attn.data.DataLoader(ds, {batch_size = 2.5}) end, "got 2.5)")
    error_matching(function() attn.data.DataLoader(ds, {batch_size = "2"}) end,
      "bad option 'batch_size' (expected number, got string)")
    error_matching(function() attn.data.DataLoader(ds, {shuffle = 1}) end,
      "bad option 'shuffle' (expected boolean, got number)")
    error_matching(function() attn.data.DataLoader(ds, {generator = {}}) end,
      "bad option 'generator' (expected an attn.Generator, got table)")
    error_matching(function() attn.data.DataLoader(ds, {generator = 5}) end,
      "attn.data.DataLoader: bad option 'generator' (expected an attn.Generator, got number)")
    local forged = setmetatable({}, getmetatable(attn.Generator()))
    error_matching(function() attn.data.DataLoader(ds, {generator = forged}) end,
      "bad option 'generator' (expected an attn.Generator")
    error_matching(function() attn.data.DataLoader(ds, {batchsize = 2}) end,
      "attn.data.DataLoader: unknown option 'batchsize' (known: batch_size, drop_last, generator, shuffle)")
    error_matching(function() attn.data.DataLoader({}, {shuffle = true}) end,
      "shuffle = true needs a dataset of at least one item")
    error_matching(function() attn.data.DataLoader(ds, {}, 3) end, "bad argument #3")
    error_matching(function() attn.data.DataLoader(ds).iter({}) end,
      "DataLoader:iter: bad argument #1 'self' (expected attn.data.DataLoader")
  end)

  it("refuses items it cannot stack, naming the dataset indices", function()
    local function drain(ds, bs)
      for _ in attn.data.DataLoader(ds, {batch_size = bs}):iter() do end
    end
    error_matching(function() drain({attn.tensor({1, 2}), attn.tensor({1, 2, 3})}, 2) end,
      "DataLoader:iter: dataset[2] is attn.Tensor of shape [3] where dataset[1] is an attn.Tensor of shape [2]")
    error_matching(function() drain({"a", "b"}, 2) end,
      "DataLoader:iter: dataset[1] is string (expected an attn.Tensor, a number, or a table of them")
    error_matching(function() drain({{attn.ones(2)}, attn.ones(2)}, 2) end,
      "dataset[2] is attn.Tensor where dataset[1] is a table")
    error_matching(function() drain({{}}, 1) end, "dataset[1] is an empty table")
    error_matching(function() drain(setmetatable({}, {__len = function() return 2 end}), 1) end,
      "DataLoader:iter: dataset[1] is nil (#dataset = 2)")
  end)
end)

describe("attn.Generator", function()
  it("draws as torch.Generator().manual_seed(s): the same stream as the global generator after manual_seed(s)",
    function()
      attn.manual_seed(7)
      local want = attn.rand(4)
      attn.manual_seed(99)
      local g = attn.Generator():manual_seed(7)
      assert.are.equal(7, g:initial_seed())
      attn.set_rng_state(g:get_state())
      assert.are.same(flat(want), flat(attn.rand(4)))
    end)

  it("starts at torch.Generator()'s default seed 67280421310721", function()
    assert.are.equal(67280421310721, attn.Generator():initial_seed())
  end)

  it("keeps its state to itself: a field set on it changes nothing", function()
    local g = attn.Generator():manual_seed(3)
    local state = g:get_state()
    g.state = "x"
    assert.are.equal(state, g:get_state())
    assert.are.equal(3, g:initial_seed())
  end)

  it("refuses bad seeds and states, naming them", function()
    local g = attn.Generator()
    error_matching(function() g:manual_seed(1.5) end,
      "Generator:manual_seed: bad argument #2 'seed' (expected an integer, got 1.5)")
    error_matching(function() g:manual_seed() end, "(expected an integer, got nil)")
    error_matching(function() g:set_state("x") end, "Generator:set_state: bad argument #2 'state' (expected a state of")
    error_matching(function() g:set_state(3) end,
      "Generator:set_state: bad argument #2 'state' (expected a string from get_state, got number)")
    error_matching(function() attn.Generator(1) end, "attn.Generator: bad argument #1 (no more than 0 arguments")
    error_matching(function() g.manual_seed({}, 1) end,
      "Generator:manual_seed: bad argument #1 'self' (expected attn.Generator, got table)")
  end)
end)
