--- Batches of token windows, as the book's chapter 2: `GPTDataset` is its
-- GPTDatasetV1 (input and next-token target windows over a text's ids) and
-- `DataLoader` is PyTorch's torch.utils.data.DataLoader (single process):
-- the same batches in the same order, shuffled ones included, after the
-- same seed.
--
--   local tok = attn.tokenizer.gpt2()
--   local ds = attn.data.GPTDataset(tok:encode(text), 256, 128)
--   attn.manual_seed(123)
--   local loader = attn.data.DataLoader(ds, {batch_size = 8, shuffle = true, drop_last = true})
--   for x, y in loader:iter() do ... end      -- x, y [8, 256]
--
-- Token ids are 1-based (tok:encode's), held in float32 tensors as every
-- index tensor here (nn.Embedding, cross_entropy's targets).
-- @module attn.data
local core = require "attn.core"
local caller = require "attn.caller"
local argcheck = require "attn.argcheck"
local generator = require "attn.generator"

local M = {}

-- the largest id a float32 holds exactly (as attn.randperm's and randint's bound)
local MAX_ID = 1 << 24

local describe = argcheck.describe

local function check_count(fname, argn, what, v)
  local n = type(v) == "number" and math.tointeger(v)
  if not n or n < 1 then
    argcheck.arg_error(fname, argn, what, "an integer >= 1", describe(v, {strings = true}))
  end
  return n
end

-- ids: a Lua table of integer ids >= 1 or a 1-D tensor of them -> a contiguous [N] float tensor
local function ids_tensor(fname, ids)
  local expected = "1-based token ids (integers from 1 to 2^24, as tok:encode gives)"
  if argcheck.is_tensor(ids) then
    if ids:dim() ~= 1 or ids.dtype ~= "float32" then
      argcheck.arg_error(fname, 1, "ids", "a Lua table or a 1-D float32 tensor of " .. expected,
        ("attn.Tensor of shape %s%s"):format(argcheck.shape(ids), ids.dtype ~= "float32" and (", " .. ids.dtype) or ""))
    end
    local t = ids:clone()
    if t:numel() > 0 then
      -- every element an integer in range (NaN fails the equality)
      local bad = t:floor():ne(t):float():add_(t:lt(1):float()):add_(t:gt(MAX_ID):float())
      if bad:max():item() > 0 then
        local flags, values = bad:totable(), t:totable()
        for i = 1, #flags do
          if flags[i] > 0 then
            argcheck.arg_error(fname, 1, "ids", expected, ("%s at position %d"):format(describe(values[i]), i))
          end
        end
      end
    end
    return t
  end
  if type(ids) ~= "table" then
    argcheck.arg_error(fname, 1, "ids", "a Lua table or a 1-D tensor of " .. expected, argcheck.typename(ids))
  end
  local n = #ids
  for i = 1, n do
    local v = ids[i]
    local iv = type(v) == "number" and math.tointeger(v)
    if not iv or iv < 1 or iv > MAX_ID then
      argcheck.arg_error(fname, 1, "ids", expected, ("%s at position %d"):format(describe(v), i))
    end
  end
  return core.tensor(n > 0 and ids or {})
end

-- ---- GPTDataset ---------------------------------------------------------------

local GPTDataset = {}
GPTDataset.__name = "attn.data.GPTDataset"
local dataset_methods = {}

local function window_count(ds) return ds.n end

-- the k-th (1-based) pair of windows, k checked
local function window(ds, k, fname)
  local i = type(k) == "number" and math.tointeger(k)
  if not i or i < 1 or i > ds.n then
    caller.error(("%s: index %s out of range (expected an integer from 1 to %d)"):format(fname, describe(k), ds.n))
  end
  -- the book's i = (k - 1) * stride, 0-based: input ids[i : i + L], target ids[i + 1 : i + L + 1]
  local start = (i - 1) * ds.stride + 1
  return ds.ids:narrow(1, start, ds.max_length):clone(), ds.ids:narrow(1, start + 1, ds.max_length):clone()
end

GPTDataset.__len = window_count
GPTDataset.__index = function(ds, k)
  if type(k) == "number" then
    local input, target = window(ds, k, "attn.data.GPTDataset")
    return {input, target}
  end
  return dataset_methods[k]
end

--- The k-th input and target windows (two [max_length] tensors), as
-- `ds[k]` without the pair table.
-- @param k 1 to #ds
function dataset_methods.get(...)
  local ds, k = ...
  argcheck.check_nargs("GPTDataset:get", 2, select("#", ...))
  if getmetatable(ds) ~= GPTDataset then
    argcheck.arg_error("GPTDataset:get", 1, "self", "attn.data.GPTDataset", argcheck.typename(ds))
  end
  return window(ds, k, "GPTDataset:get")
end

function GPTDataset.__tostring(ds)
  return ("attn.data.GPTDataset(%d windows of max_length %d, stride %d, over %d ids)"):format(ds.n, ds.max_length,
    ds.stride, ds.ids:numel())
end

--- The book's GPTDatasetV1: for i = 0, stride, 2 stride, ... while
-- i < #ids - max_length, the input window ids[i + 1 .. i + max_length] and
-- the target window one token further. `#ds` windows; `ds[k]` ->
-- `{input, target}`, `ds:get(k)` -> input, target ([max_length] float32
-- tensors of ids). A text shorter than max_length + 1 ids is an error (the
-- book's code would give an empty dataset).
-- @param ids a Lua table (tok:encode's) or a 1-D tensor of 1-based token ids
-- @param max_length the window length
-- @param stride how far each window starts after the previous one
function M.GPTDataset(...)
  local ids, max_length, stride = ...
  local fname = "attn.data.GPTDataset"
  argcheck.check_nargs(fname, 3, select("#", ...))
  max_length = check_count(fname, 2, "max_length", max_length)
  stride = check_count(fname, 3, "stride", stride)
  local t = ids_tensor(fname, ids)
  local n_ids = t:numel()
  if n_ids - 1 < max_length then -- (max_length + 1 would wrap around at math.maxinteger)
    caller.error(("%s: bad argument #1 'ids' (expected at least max_length + 1 = %.0f token ids for one input and "
      .. "target window, got %d)"):format(fname, max_length + 1.0, n_ids))
  end
  local ds = {ids = t, max_length = max_length, stride = stride, n = (n_ids - max_length - 1) // stride + 1}
  return setmetatable(ds, GPTDataset)
end

-- ---- DataLoader ---------------------------------------------------------------

local DataLoader = {}
DataLoader.__index = DataLoader
DataLoader.__name = "attn.data.DataLoader"

-- #ds, checked
local function dataset_len(ds, fname)
  local ok, n = pcall(function() return #ds end)
  local count = ok and type(n) == "number" and math.tointeger(n)
  if not count or count < 0 then
    caller.error(("%s: bad argument #1 'dataset' (expected a dataset with #dataset, a count >= 0, and "
      .. "dataset[i], got %s)"):format(fname, ok and ("#dataset = " .. describe(n)) or argcheck.typename(ds)))
  end
  return count
end

local function batch_count(n, batch_size, drop_last)
  if drop_last then return n // batch_size end
  return n // batch_size + (n % batch_size > 0 and 1 or 0) -- ceil, without n + batch_size overflowing
end

--- The number of batches: ceil(#dataset / batch_size), or floor with
-- drop_last, as len(DataLoader).
function DataLoader.__len(loader)
  return batch_count(dataset_len(loader.dataset, "#DataLoader"), loader.batch_size, loader.drop_last)
end

function DataLoader.__tostring(loader)
  return ("attn.data.DataLoader(batch_size = %d, shuffle = %s, drop_last = %s)"):format(loader.batch_size,
    tostring(loader.shuffle), tostring(loader.drop_last))
end

-- the items of one batch stacked on a new first dim, as default_collate: a
-- tensor item gives a tensor, a number item a [batch] tensor, a table item
-- (a pair such as GPTDataset's) one stacked value per entry
local function collate(items, indices, fname)
  local function stack(values, where)
    local first = values[1]
    if argcheck.is_tensor(first) then
      local shape = argcheck.shape(first)
      for b = 2, #values do
        if not argcheck.is_tensor(values[b]) or argcheck.shape(values[b]) ~= shape then
          caller.error(("%s: dataset[%d]%s is %s where dataset[%d]%s is an attn.Tensor of shape %s (a batch "
            .. "stacks items of one shape)"):format(fname, indices[b], where, describe(values[b], {shape = " of shape "}),
            indices[1], where, shape))
        end
      end
      return core.stack(values, 1)
    elseif type(first) == "number" then
      for b = 2, #values do
        if type(values[b]) ~= "number" then
          caller.error(("%s: dataset[%d]%s is %s where dataset[%d]%s is a number"):format(fname, indices[b], where,
            argcheck.typename(values[b]), indices[1], where))
        end
      end
      return core.tensor(values)
    end
    caller.error(("%s: dataset[%d]%s is %s (expected an attn.Tensor, a number, or a table of them such as "
      .. "{input, target})"):format(fname, indices[1], where, argcheck.typename(first)))
  end
  local first = items[1]
  if type(first) ~= "table" then return stack(items, "") end
  local out = {}
  for j = 1, #first do
    local values = {}
    for b = 1, #items do
      if type(items[b]) ~= "table" then
        caller.error(("%s: dataset[%d] is %s where dataset[%d] is a table"):format(fname, indices[b],
          argcheck.typename(items[b]), indices[1]))
      end
      values[b] = items[b][j]
    end
    out[j] = stack(values, "[" .. j .. "]")
  end
  if #first == 0 then
    caller.error(("%s: dataset[%d] is an empty table (expected an attn.Tensor, a number, or a table of them such as "
      .. "{input, target})"):format(fname, indices[1]))
  end
  return table.unpack(out)
end

--- An iterator over the batches of one epoch: `for x, y in loader:iter()`
-- (as `for x, y in loader` in PyTorch). Each call, as torch's iter(), draws
-- the worker base seed (one 64-bit draw) from the loader's generator or the
-- global one; with shuffle, the first batch draws the epoch's RandomSampler
-- order: torch.randperm(#dataset) from the loader's generator, or without
-- one from a new generator seeded by another 64-bit draw of the global one.
-- The batch that finds the order used up (the last one when it is short, or
-- the call after the last) draws a second randperm, unused, as torch's
-- RandomSampler does on running out. So the batches and the generators'
-- states afterwards are PyTorch's.
function DataLoader.iter(...)
  local loader = ...
  local fname = "DataLoader:iter"
  argcheck.check_nargs(fname, 1, select("#", ...))
  if getmetatable(loader) ~= DataLoader then
    argcheck.arg_error(fname, 1, "self", "attn.data.DataLoader", argcheck.typename(loader))
  end
  local ds, batch_size, drop_last = loader.dataset, loader.batch_size, loader.drop_last
  local n = dataset_len(ds, fname)
  -- _BaseDataLoaderIter.__init__'s _base_seed: drawn, unused with no workers
  generator.random_int64(loader.generator)
  local order, pos, exhausted, sampler_g = nil, 0, false, nil
  return function()
    if exhausted and pos >= n then return nil end
    if not order then
      if loader.shuffle then
        sampler_g = loader.generator
        if sampler_g == nil then sampler_g = generator.new():manual_seed(generator.random_int64(nil)) end
        order = generator.randperm(sampler_g, n)
      else
        order = {}
        for i = 1, n do order[i] = i end
      end
    end
    local count = math.min(batch_size, n - pos)
    if count < batch_size and not exhausted then
      -- the batch sampler asks for one index past the end: RandomSampler's
      -- last line then runs torch.randperm(n)[:0], which draws n - 1 numbers
      -- from the generator for nothing (seen only on the loader's own one,
      -- so skipped on the epoch's throwaway generator)
      exhausted = true
      if loader.shuffle and loader.generator then generator.randperm(sampler_g, n) end
    end
    if count <= 0 or (drop_last and count < batch_size) then
      pos = n
      return nil
    end
    local items, indices = {}, {}
    for b = 1, count do
      local idx = order[pos + b]
      indices[b], items[b] = idx, ds[idx]
      if items[b] == nil then caller.error(("%s: dataset[%d] is nil (#dataset = %d)"):format(fname, idx, n)) end
    end
    pos = pos + count
    return collate(items, indices, fname)
  end
end

--- PyTorch's DataLoader (single process): batches of `batch_size` items of
-- `dataset` (anything with `#dataset` and `dataset[i]`, i = 1..#dataset, an
-- item being a tensor, a number or a table of them such as GPTDataset's
-- {input, target}), stacked on a new first dim. `#loader` batches;
-- `loader:iter()` iterates over one epoch. shuffle = true takes the order of
-- torch's RandomSampler, drawn exactly as torch 1.13 draws it (see iter).
-- @param dataset a GPTDataset or any dataset as above
-- @param[opt] opts {batch_size = 1, shuffle = false, drop_last = false, generator = an attn.Generator}
function M.DataLoader(...)
  local ds, opts = ...
  local fname = "attn.data.DataLoader"
  argcheck.check_nargs(fname, 2, select("#", ...))
  if type(ds) ~= "table" and type(ds) ~= "userdata" then
    argcheck.arg_error(fname, 1, "dataset", "a dataset (with #dataset and dataset[i])", argcheck.typename(ds))
  end
  local n = dataset_len(ds, fname)
  -- the generator first, so that any non-generator gets the message that names what it must be
  local g = type(opts) == "table" and opts.generator or nil
  if g ~= nil and not generator.is_generator(g) then
    caller.error(("%s: bad option 'generator' (expected an attn.Generator, got %s)"):format(fname,
      argcheck.typename(g)))
  end
  opts = argcheck.check_options(fname, opts, 2, {batch_size = "number", shuffle = "boolean", drop_last = "boolean",
                                                 generator = "table"}, argcheck.typename)
  local batch_size = 1
  if opts.batch_size ~= nil then
    batch_size = math.tointeger(opts.batch_size)
    if not batch_size or batch_size < 1 then
      caller.error(("%s: bad option 'batch_size' (expected an integer >= 1, got %s)"):format(fname,
        describe(opts.batch_size)))
    end
  end
  -- as RandomSampler's check at construction
  if opts.shuffle and n == 0 then
    caller.error(("%s: bad argument #1 'dataset' (shuffle = true needs a dataset of at least one item, got an "
      .. "empty one)"):format(fname))
  end
  return setmetatable({dataset = ds, batch_size = batch_size, shuffle = opts.shuffle or false,
                       drop_last = opts.drop_last or false, generator = opts.generator}, DataLoader)
end

return M
