--- attn.dist.DistributedDataParallel: data-parallel training (PyTorch's
-- torch.nn.parallel.DistributedDataParallel, find_unused_parameters
-- semantics). Each rank runs the model on its share of the batch; at the end
-- of every backward that follows a forward through the wrapper, each
-- parameter's `.grad` becomes the average of the ranks' gradients.
--
--   local ddp = dist.DistributedDataParallel(model[, {bucket_mb = 25}])
--   local loss = loss_fn(ddp(x), y)   -- forward: the model's
--   loss:backward()                   -- gradients averaged across the ranks
--   ddp:no_sync(function() ... end)   -- backwards in fn accumulate locally
--
-- The parameters (and buffers) are broadcast from rank 1 at construction.
-- Gradients travel in buckets of about bucket_mb MiB: the parameters in
-- reverse registration order (as PyTorch: roughly the order backward makes
-- them), packed one after another; the buckets and the order are the same on
-- every rank and every step, and sums are reduced in an order fixed by the
-- bucket's size, so two runs give the same bits. A parameter that got no
-- gradient on a rank counts zeros there; one that got none on any rank keeps
-- its `.grad` untouched (nil stays nil), as PyTorch's reducer does.
-- Every other call and field passes through to the model (`ddp.module`).
local attn = require "attn"
local argcheck = require "attn.argcheck"
local autograd = require "attn.autograd"

local FNAME = "dist.DistributedDataParallel"

return function(dist)
  local DDP = {}
  local methods = {}

  local function buckets_of(params, bucket_mb)
    local cap = math.max(1, math.floor(bucket_mb * 1024 * 1024 / 4))
    local buckets, cur = {}, nil
    for i = #params, 1, -1 do
      local p = params[i]
      local n = p:numel()
      if not cur or (cur.numel > 0 and cur.numel + n > cap) then
        cur = {entries = {}, numel = 0}
        buckets[#buckets + 1] = cur
      end
      cur.entries[#cur.entries + 1] = {param = p, index = i, offset = cur.numel, numel = n}
      cur.numel = cur.numel + n
    end
    for _, b in ipairs(buckets) do b.buf = attn.empty(math.max(b.numel, 1)) end
    return buckets
  end

  -- Average the gradients across the ranks (the post-backward hook).
  local function reduce(self)
    local params = self._params
    if #params == 0 then return end
    -- which parameters got a gradient on some rank
    local used = attn.zeros(#params)
    for i, p in ipairs(params) do
      if p.grad ~= nil then used[i] = 1 end
    end
    dist.all_reduce(used, "max")
    local any = used:totable()
    attn.no_grad(function()
      for _, b in ipairs(self._buckets) do
        local needed = false
        for _, e in ipairs(b.entries) do if any[e.index] > 0 then needed = true end end
        if needed then
          local buf = b.buf
          for _, e in ipairs(b.entries) do
            local slot = buf:narrow(1, e.offset + 1, e.numel)
            local g = e.param.grad
            if g ~= nil then slot:copy_(g:reshape(e.numel)) else slot:zero_() end
          end
          dist.all_reduce(buf, "avg")
          for _, e in ipairs(b.entries) do
            if any[e.index] > 0 then
              local p = e.param
              local avg = buf:narrow(1, e.offset + 1, e.numel):view(p:size())
              if p.grad ~= nil then p.grad:copy_(avg) else p.grad = avg:clone() end
            end
          end
        end
      end
    end)
  end

  --- Run fn(...) with gradient averaging off: the backwards in it accumulate
  -- into `.grad` locally; the first backward after it (of a forward outside
  -- no_sync) averages what accumulated (PyTorch's ddp.no_sync()).
  function methods.no_sync(self, fn, ...)
    if getmetatable(self) ~= DDP then
      argcheck.arg_error("DistributedDataParallel:no_sync", 1, "self", "a DistributedDataParallel", argcheck.typename(self))
    end
    if type(fn) ~= "function" then
      argcheck.arg_error("DistributedDataParallel:no_sync", 1, "fn", "a function", argcheck.typename(fn))
    end
    local was = rawget(self, "_sync")
    rawset(self, "_sync", false)
    local r = table.pack(pcall(fn, ...))
    rawset(self, "_sync", was)
    if not r[1] then error(r[2], 0) end
    return table.unpack(r, 2, r.n)
  end

  DDP.__name = "attn.dist.DistributedDataParallel"

  function DDP.__index(self, k)
    local m = methods[k]
    if m then return m end
    local module = rawget(self, "module")
    local v = module[k]
    if type(v) == "function" then
      -- a method called on the wrapper runs on the model
      return function(s, ...)
        if s == self then s = module end
        return v(s, ...)
      end
    end
    return v
  end

  function DDP.__newindex(self, k, v) rawget(self, "module")[k] = v end

  function DDP.__call(self, ...)
    if rawget(self, "_sync") and attn.is_grad_enabled() then rawset(self, "_pending", true) end
    return rawget(self, "module")(...)
  end

  function DDP.__tostring(self)
    return "DistributedDataParallel(\n  (module): " .. tostring(rawget(self, "module")):gsub("\n", "\n  ") .. "\n)"
  end

  return function(model, opts)
    if not dist.is_initialized() then argcheck.fail(FNAME, "call dist.init() first") end
    if type(model) ~= "table" or type(model.parameters) ~= "function" then
      argcheck.arg_error(FNAME, 1, "model", "an attn.nn module", argcheck.typename(model))
    end
    opts = argcheck.check_options(FNAME, opts, 2, {bucket_mb = "number"})
    local bucket_mb = opts.bucket_mb or 25
    if not (bucket_mb > 0) then
      argcheck.fail(FNAME, "bad option 'bucket_mb' (expected a number > 0, got %s)", tostring(bucket_mb))
    end
    local params = {}
    for _, p in ipairs(model:parameters()) do
      if p.requires_grad then params[#params + 1] = p end
    end
    -- every rank starts from rank 1's parameters and buffers
    attn.no_grad(function()
      for _, p in ipairs(model:parameters()) do dist.broadcast(p, 1) end
      if type(model.named_modules) == "function" then
        for _, nm in ipairs(model:named_modules()) do
          local m = nm[2]
          for _, b in ipairs(m._buffers or {}) do
            if argcheck.is_tensor(m[b.name]) then dist.broadcast(m[b.name], 1) end
          end
        end
      end
    end)
    local self = setmetatable({module = model, _params = params, _buckets = buckets_of(params, bucket_mb),
                               _sync = true, _pending = false}, DDP)
    -- the hook holds the wrapper weakly: a dropped wrapper unregisters itself
    local ref = setmetatable({self}, {__mode = "v"})
    local hook
    hook = autograd.register_post_backward(function()
      local s = ref[1]
      if s == nil then hook.remove() return end
      if rawget(s, "_pending") then
        rawset(s, "_pending", false)
        reduce(s)
      end
    end)
    return self
  end
end
