--- The autograd mode of the fuzzer (scripts/fuzz.lua --mode autograd): random
-- chains of in-place and out-of-place ops on leaves that require grad, on
-- constants and on views and detached aliases of them, then a backward; the
-- gradients are compared with an independent replay of the same chain.
--
-- The replay computes the same function of the leaves out of place only, on
-- fresh leaves: every storage is a "root" whose current value is a tensor,
-- every slot a path of view steps (narrow, select, transpose, view, reshape) from its
-- root, read from the root's current value when used. An in-place op on a
-- slot computes the slot's new value out of place and writes it back into the
-- root: through the path's inverse (zeros elsewhere, plus the root masked to
-- 0 where the slot lies); through a detached alias as a constant offset
-- (root + (new - old):detach()), which is what PyTorch's autograd sees of a
-- write it does not record. So the replay's gradient is the one PyTorch 1.13
-- computes for the chain (or the chain is one PyTorch refuses).
--
-- Outcomes per chain: the loss and every leaf's gradient agree (within float
-- rounding of a different order of operations), or the library raised an
-- attn error (a message naming the function) -- a legal outcome, counted by
-- kind. A finding: a wrong value or gradient, a lost history (the replay's
-- loss depends on a leaf the library's does not), a raw or unnamed error, or
-- a refused in-place op that changed its target anyway.
--
-- Known gaps of attn's autograd would be left out unless o.with_known; there
-- are none at present (an in-place write into storage another live slot
-- views, and an in-place op whose operand shares the target's storage, are
-- generated: attn rebuilds the view's history or refuses with an attn error),
-- so --with-known runs the same chains.

local attn = require "attn"

local M = {}

-- the same splitmix64 stream as the careless-call fuzzer
local new_rng = require("fuzz_rng")

local function shape_str(s) return "{" .. table.concat(s, ", ") .. "}" end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function numel(s)
  local n = 1
  for _, x in ipairs(s) do n = n * x end
  return n
end

-- a constant tensor from a flat list and a shape (exactly these floats in both runs)
local function from_data(data, shape)
  if #shape == 0 then return attn.tensor(data[1]) end
  return attn.tensor(data):view(shape)
end

local function random_data(r, n, scale, positive)
  local d = {}
  for i = 1, n do d[i] = positive and 0.5 + r.float() * 1.5 or (r.float() * 2 - 1) * (scale or 2) end
  return d
end

local function flat(t) return t:contiguous():view(-1):totable() end

-- ---- the interpreter: one chain, in the library's way or the replay's ----

-- the out-of-place form of each op: f(x, arg) with arg a number, a tensor or params
local OOP = {
  add = function(x, a) return x:add(a) end,
  sub = function(x, a) return x:sub(a) end,
  mul = function(x, a) return x:mul(a) end,
  div = function(x, a) return x:div(a) end,
  pow = function(x, a) return x:pow(a) end,
  exp = function(x) return x:exp() end,
  tanh = function(x) return x:tanh() end,
  sigmoid = function(x) return x:sigmoid() end,
  relu = function(x) return x:relu() end,
  clamp = function(x, a) return x:clamp(a[1], a[2]) end,
  masked_fill = function(x, a) return x:masked_fill(a[1], a[2]) end,
  zero = function(x) return attn.zeros(x:size()) end,
  sum = function(x, a) if a then return x:sum(a[1], a[2]) end return x:sum() end,
  mean = function(x, a) if a then return x:mean(a[1], a[2]) end return x:mean() end,
  softmax = function(x, a) return x:softmax(a) end,
  matmul = function(x, a) return x:matmul(a) end,
  clone = function(x) return x:clone() end,
}
-- the library's in-place form of an op
local INPLACE = { add = "add_", sub = "sub_", mul = "mul_", div = "div_", masked_fill = "masked_fill_",
  zero = "zero_", clamp = "clamp_" }

-- one view step on t (the same call in both runs)
local function view_step(t, st)
  if st.op == "narrow" then return t:narrow(st.d, st.s, st.l) end
  if st.op == "select" then return t:select(st.d, st.i) end
  if st.op == "transpose" then return t:transpose(st.d1, st.d2) end
  if st.op == "reshape" then return t:reshape(st.sizes) end
  return t:view(st.sizes)
end

-- g (shaped as the step's result) placed where the step reads from a tensor
-- of the step's input shape, zeros elsewhere
local function embed_step(g, st)
  local before = st.before
  if st.op == "transpose" then return g:transpose(st.d1, st.d2) end
  if st.op == "view" or st.op == "reshape" then return g:reshape(before) end
  local d, s, l = st.d, st.s, st.l
  if st.op == "select" then g, s, l = g:unsqueeze(d), st.i, 1 end
  local parts = {}
  local function zeros(n)
    local sz = table.move(before, 1, #before, 1, {})
    sz[d] = n
    return attn.zeros(sz)
  end
  if s > 1 then parts[#parts + 1] = zeros(s - 1) end
  parts[#parts + 1] = g
  if s + l - 1 < before[d] then parts[#parts + 1] = zeros(before[d] - (s + l - 1)) end
  if #parts == 1 then return g end
  return attn.cat(parts, d)
end

local function embed(g, path)
  for i = #path, 1, -1 do g = embed_step(g, path[i]) end
  return g
end

-- The replay's environment: roots[r] = the current value of storage r;
-- slots[i] = {root, path, detached}.
local Replay = {}
Replay.__index = Replay

local function new_replay() return setmetatable({ roots = {}, slots = {}, leaves = {} }, Replay) end

function Replay:value(i)
  local s = self.slots[i]
  local t = self.roots[s.root]
  for _, st in ipairs(s.path) do t = view_step(t, st) end
  if s.detached then t = t:detach() end
  return t
end

function Replay:new_root(i, t)
  local r = #self.roots + 1
  self.roots[r] = t
  self.slots[i] = { root = r, path = {}, detached = false }
end

-- slot i's new value is x (computed out of place): write it into its root
function Replay:write(i, x)
  local s = self.slots[i]
  local root = self.roots[s.root]
  if s.detached then
    -- the storage changes by a constant for autograd; the written alias
    -- itself takes x's history (PyTorch: an in-place op on a detached
    -- tensor records on it), from now on a value of its own
    local old = self:value(i)
    self.roots[s.root] = root + embed((x - old):detach(), s.path)
    self:new_root(i, x)
  elseif #s.path == 0 then
    self.roots[s.root] = x
  else
    local where = embed(attn.ones(x:size()), s.path):gt(0.5)
    self.roots[s.root] = root:masked_fill(where, 0) + embed(x, s.path)
  end
end

-- an operand: a slot's value in either run, a number, or a {mask, value} pair
local function operand(env, lib, a)
  if type(a) == "table" and a.slot then
    if lib then return env[a.slot] end
    return env:value(a.slot)
  end
  if type(a) == "table" and a.const then return a.const end
  if type(a) == "table" and a.pair then
    return { operand(env, lib, a.pair[1]), operand(env, lib, a.pair[2]) }
  end
  return a
end

-- Run one instruction. lib: env is a list of the library's tensors; else a Replay.
local function exec(ins, env, lib)
  local k = ins.k
  if k == "leaf" then
    local t = from_data(ins.data, ins.shape)
    if ins.grad then t:requires_grad_() end
    if lib then env[ins.out] = t else env:new_root(ins.out, t) end
    return t
  elseif k == "oop" then
    local x = operand(env, lib, { slot = ins.src })
    local y = OOP[ins.op](x, operand(env, lib, ins.arg))
    if lib then env[ins.out] = y else env:new_root(ins.out, y) end
  elseif k == "cat" then
    local list = {}
    for j, s in ipairs(ins.srcs) do list[j] = operand(env, lib, { slot = s }) end
    local y = attn.cat(list, ins.d)
    if lib then env[ins.out] = y else env:new_root(ins.out, y) end
  elseif k == "view" then
    if lib then env[ins.out] = view_step(env[ins.src], ins.step)
    else
      local s = env.slots[ins.src]
      local path = table.move(s.path, 1, #s.path, 1, {})
      path[#path + 1] = ins.step
      env.slots[ins.out] = { root = s.root, path = path, detached = s.detached }
    end
  elseif k == "detach" then
    if lib then env[ins.out] = env[ins.src]:detach()
    else
      local s = env.slots[ins.src]
      env.slots[ins.out] = { root = s.root, path = s.path, detached = true }
    end
  elseif k == "inplace" then
    local arg = operand(env, lib, ins.arg)
    if lib then
      local t = env[ins.dst]
      local m = t[INPLACE[ins.op]]
      if ins.op == "zero" then m(t)
      elseif ins.op == "clamp" or ins.op == "masked_fill" then m(t, arg[1], arg[2])
      else m(t, arg) end
    else
      env:write(ins.dst, OOP[ins.op](env:value(ins.dst), arg))
    end
  end
end

-- ---- generating a chain ---------------------------------------------------

local POINTWISE = { "exp", "tanh", "sigmoid", "relu" }
local BINARY = { "add", "sub", "mul", "div" }

-- slot facts from the library's run, for choosing the next instruction
local function max_abs(t)
  if t:numel() == 0 then return 0 end
  return t:detach():abs():max():item()
end
local function min_abs(t)
  if t:numel() == 0 then return 1 end
  return t:detach():abs():min():item()
end

-- Generate and run one chain in the library, each instruction as it is made,
-- under pcall. An instruction the library refuses with an attn error is left
-- out (counted in counts) and the chain goes on. Returns the program, the
-- library's slots and their count, or nil and a finding.
local function gen_chain(r, o, st, counts)
  local prog, env = {}, {}
  -- group[slot]: the slot whose storage it shares
  local group, detached = {}, {}
  -- frozen[group]: a detached alias of it was written, which the replay then
  -- holds as a value of its own: no more writes to that storage
  local frozen = {}
  local nslots = 0
  local function track(ins)
    local out = ins.out
    nslots = out
    if ins.k == "view" or ins.k == "detach" then
      group[out] = group[ins.src]
      detached[out] = ins.k == "detach" or detached[ins.src]
    else
      group[out], detached[out] = out, false
    end
  end
  local function add_leaf(shape, grad, positive)
    local ins = { k = "leaf", out = nslots + 1, shape = shape, data = random_data(r, numel(shape), 2, positive),
      grad = grad }
    exec(ins, env, true)
    prog[#prog + 1] = ins
    track(ins)
    return ins.out
  end
  local function random_shape()
    local s = {}
    for i = 1, r.int(1, 3) do s[i] = r.int(1, 4) end
    return s
  end
  for _ = 1, r.int(1, 3) do add_leaf(random_shape(), r.chance(0.85)) end
  for _ = 1, r.int(2, o.max_len or 12) do
    local src = r.int(1, nslots)
    local x = env[src]
    local shape = x:size()
    -- a second operand: a number, a slot of the same shape, or a new leaf broadcastable to shape
    local function other(nonzero)
      if r.chance(0.3) then
        local v = (r.float() * 2 - 1) * 2
        if nonzero and math.abs(v) < 0.2 then v = 0.5 end
        return v
      end
      for _ = 1, 4 do
        local j = r.int(1, nslots)
        if same_shape(env[j]:size(), shape) and (not nonzero or min_abs(env[j]) > 0.2) then return { slot = j } end
      end
      local s = table.move(shape, 1, #shape, 1, {})
      for i = 1, #s do if r.chance(0.3) then s[i] = 1 end end
      while #s > 0 and r.chance(0.2) do table.remove(s, 1) end
      return { slot = add_leaf(s, r.chance(0.6), nonzero) }
    end
    local c = r.int(1, 20)
    -- a 0-dim slot (a full sum or mean): only what needs no dim
    if #shape == 0 and (c == 9 or c == 10 or c == 11 or c == 14 or c == 15 or c == 16) then c = r.pick({ 1, 5, 7, 12, 17 }) end
    local ins
    if c <= 4 then -- binary, out of place
      local op = r.pick(BINARY)
      ins = { k = "oop", op = op, src = src, arg = other(op == "div") }
    elseif c == 5 then
      local op = r.pick(POINTWISE)
      if op == "exp" and max_abs(x) > 8 then op = "tanh" end
      ins = { k = "oop", op = op, src = src }
    elseif c == 6 then
      local e = r.pick({ 2, 3, 0.5, -1 })
      if e == -1 and min_abs(x) < 0.2 then e = 2 end
      if e == 0.5 and (x:numel() == 0 or x:detach():min():item() < 0.2) then e = 2 end
      if e == 3 and max_abs(x) > 20 then e = 2 end
      ins = { k = "oop", op = "pow", src = src, arg = e }
    elseif c == 7 then
      local lo = r.float() - 0.8
      ins = { k = "oop", op = "clamp", src = src, arg = { pair = { { const = lo }, { const = lo + r.float() * 2 } } } }
    elseif c == 8 then
      ins = { k = "oop", op = "masked_fill", src = src,
        arg = { pair = { { const = attn.rand(shape):gt(0.5) }, { const = r.pick({ 0, -1, 2.5 }) } } } }
    elseif c == 9 then
      local arg = nil
      if #shape > 1 or r.chance(0.5) then arg = { r.int(1, #shape), r.chance(0.5) } end
      ins = { k = "oop", op = r.pick({ "sum", "mean" }), src = src, arg = arg }
    elseif c == 10 then
      ins = { k = "oop", op = "softmax", src = src, arg = r.int(1, #shape) }
    elseif c == 11 then -- matmul with a slot or a new leaf of a fitting shape
      local kdim, b = shape[#shape], nil
      for _ = 1, 4 do
        local j = r.int(1, nslots)
        local s2 = env[j]:size()
        if #s2 == 2 and s2[1] == kdim then b = j break end
      end
      b = b or add_leaf({ kdim, r.int(1, 4) }, r.chance(0.7))
      ins = { k = "oop", op = "matmul", src = src, arg = { slot = b } }
    elseif c == 12 then
      ins = { k = "oop", op = "clone", src = src }
    elseif c == 13 then
      ins = { k = "detach", src = src }
    elseif c == 14 then
      local d = r.int(1, #shape)
      local srcs = { src }
      for _ = 1, r.int(1, 2) do
        local j = r.int(1, nslots)
        local s2 = env[j]:size()
        local fits = #s2 == #shape
        for i = 1, #shape do if i ~= d and s2[i] ~= shape[i] then fits = false end end
        srcs[#srcs + 1] = fits and j or src
      end
      ins = { k = "cat", op = "cat", srcs = srcs, d = d }
    elseif c <= 16 then -- a view step
      local step
      local v = r.int(1, 4)
      if v == 1 then
        local d = r.int(1, #shape)
        local s = r.int(1, shape[d])
        step = { op = "narrow", d = d, s = s, l = r.int(1, shape[d] - s + 1) }
      elseif v == 2 and #shape > 1 then
        local d = r.int(1, #shape)
        step = { op = "select", d = d, i = r.int(1, shape[d]) }
      elseif v == 3 and #shape > 1 then
        step = { op = "transpose", d1 = r.int(1, #shape), d2 = r.int(1, #shape) }
      elseif x:is_contiguous() then -- (reshape only here: of a contiguous tensor it is always a view)
        local n = x:numel()
        step = { op = r.pick({ "view", "reshape" }), sizes = r.chance(0.5) and { n } or (n % 2 == 0 and { 2, n // 2 } or { 1, n }) }
      else
        step = { op = "transpose", d1 = 1, d2 = #shape }
      end
      step.before = shape
      ins = { k = "view", op = step.op, src = src, step = step }
    else -- in place, mostly on a slot that is not a leaf requiring grad (refused, as PyTorch)
      for _ = 1, 4 do
        if not (env[src].requires_grad and env[src].is_leaf) then break end
        src = r.int(1, nslots)
      end
      x = env[src]
      shape = x:size()
      local op = r.pick({ "add", "sub", "mul", "div", "masked_fill", "zero", "clamp" })
      local arg
      if op == "masked_fill" then
        arg = { pair = { { const = attn.rand(shape):gt(0.5) }, { const = r.pick({ 0, 1.5 }) } } }
      elseif op == "clamp" then
        local lo = r.float() - 0.8
        arg = { pair = { { const = lo }, { const = lo + 1 } } }
      elseif op ~= "zero" then
        arg = other(op == "div")
      end
      ins = { k = "inplace", op = op, dst = src, arg = arg }
      if frozen[group[src]] then ins = nil end
    end
    if ins then
      if ins.k ~= "inplace" then ins.out = nslots + 1 end
      local before = ins.k == "inplace" and env[ins.dst]:detach():clone() or nil
      local ok, err = pcall(exec, ins, env, true)
      if ok then
        prog[#prog + 1] = ins
        if ins.out then track(ins) end
        if ins.k == "inplace" and detached[ins.dst] then frozen[group[ins.dst]] = true end
      else
        local name = ins.k == "inplace" and INPLACE[ins.op] or ins.op
        local why = st.bad_message(err, { name })
        if why then return nil, ("%s (%s): %s"):format(why, name, tostring(err)), prog, ins end
        if before and not attn.equal(before, env[ins.dst]:detach()) then
          return nil, ("a refused %s changed its target anyway: %s"):format(name, tostring(err)), prog, ins
        end
        local key = name .. ": " .. ((tostring(err):match("^[^:]*:%d+: (.*)") or tostring(err)):gsub("^[%w_.:]+: ", "")
          :sub(1, 50))
        counts[key] = (counts[key] or 0) + 1
      end
    end
  end
  return prog, env, nslots
end

-- ---- comparing ---------------------------------------------------------------

local function close(a, b, rtol, atol)
  if a ~= a or b ~= b then return (a ~= a) == (b ~= b) end
  if a == b then return true end
  return math.abs(a - b) <= atol + rtol * math.abs(b)
end

-- program text for a reproduction
local function ins_text(ins)
  local function v(x)
    if type(x) == "table" then
      if x.slot then return "s" .. x.slot end
      if x.const then return attn.is_tensor(x.const) and ("mask" .. shape_str(x.const:size())) or tostring(x.const) end
      if x.pair then return v(x.pair[1]) .. ", " .. v(x.pair[2]) end
      local p = {}
      for i, y in ipairs(x) do p[i] = tostring(y) end
      return "{" .. table.concat(p, ", ") .. "}"
    end
    return tostring(x)
  end
  if ins.k == "leaf" then
    return ("s%d = leaf%s%s"):format(ins.out, shape_str(ins.shape), ins.grad and " requires_grad" or "")
  elseif ins.k == "oop" then
    return ("s%d = s%d:%s(%s)"):format(ins.out, ins.src, ins.op, ins.arg ~= nil and v(ins.arg) or "")
  elseif ins.k == "cat" then
    local s = {}
    for i, j in ipairs(ins.srcs) do s[i] = "s" .. j end
    return ("s%d = attn.cat({%s}, %d)"):format(ins.out, table.concat(s, ", "), ins.d)
  elseif ins.k == "view" then
    local st = ins.step
    local a = st.op == "narrow" and (st.d .. ", " .. st.s .. ", " .. st.l) or st.op == "select" and (st.d .. ", " .. st.i)
      or st.op == "transpose" and (st.d1 .. ", " .. st.d2) or shape_str(st.sizes)
    return ("s%d = s%d:%s(%s)"):format(ins.out, ins.src, st.op, a)
  elseif ins.k == "detach" then
    return ("s%d = s%d:detach()"):format(ins.out, ins.src)
  else
    return ("s%d:%s(%s)"):format(ins.dst, INPLACE[ins.op], ins.arg ~= nil and v(ins.arg) or "")
  end
end

local function prog_text(prog, extra)
  local lines = {}
  for i, ins in ipairs(prog) do lines[i] = "    " .. ins_text(ins) end
  if extra then lines[#lines + 1] = "    " .. ins_text(extra) .. "   -- the failing step" end
  return table.concat(lines, "\n")
end

-- One chain: returns "o" (agreed) or "e" (the backward raised an attn error), or nil and a finding.
local function chain(r, o, st, counts)
  local prog, env, nslots, ins = gen_chain(r, o, st, counts)
  if not prog then return nil, env .. "\n  chain:\n" .. prog_text(nslots, ins) end
  -- the loss: a weighted sum over the last slot and another, by weights drawn now
  local picks = { nslots, r.int(1, nslots) }
  local weights = {}
  for i, j in ipairs(picks) do
    local s = env[j]:size()
    weights[i] = from_data(random_data(r, numel(s), 1), s)
  end
  local function loss_of(value)
    local total
    for i, j in ipairs(picks) do
      local term = (value(j) * weights[i]):sum()
      total = total and total + term or term
    end
    return total
  end
  -- the library may refuse the loss itself (a slot whose history it cannot
  -- rebuild after an in-place write): a legal outcome, as a refused backward
  local lok, lib_loss = pcall(loss_of, function(j) return env[j] end)
  if not lok then
    local err = tostring(lib_loss)
    local why = st.bad_message(err, { "mul", "add", "sum" })
    if why then return nil, why .. ": " .. err .. "\n  chain:\n" .. prog_text(prog) end
    local key = "loss: " .. ((err:match("^[^:]*:%d+: (.*)") or err):gsub("^[%w_.:]+: ", ""):sub(1, 50))
    counts[key] = (counts[key] or 0) + 1
    if o.on_backward_error then o.on_backward_error(prog, picks, weights, err) end
    return "e"
  end
  local rp = new_replay()
  local leaves_lib, leaves_ref = {}, {}
  for _, ins in ipairs(prog) do
    local t = exec(ins, rp, false)
    if ins.k == "leaf" and ins.grad then
      leaves_ref[#leaves_ref + 1] = t
      leaves_lib[#leaves_lib + 1] = env[ins.out]
    end
  end
  local ref_loss = loss_of(function(j) return rp:value(j) end)
  local text = "\n  chain:\n" .. prog_text(prog) .. ("\n    loss = sum of s%d * w1 and s%d * w2"):format(picks[1], picks[2])
  local lv, rv = lib_loss:item(), ref_loss:item()
  local scale = 0
  for j = 1, nslots do scale = math.max(scale, max_abs(env[j])) end
  if not close(lv, rv, 1e-3, 1e-4 * (1 + scale) * 10) then
    return nil, ("the loss differs from the replay's: %.9g, replay %.9g"):format(lv, rv) .. text
  end
  if not ref_loss.requires_grad then
    -- no leaf reaches the replay's loss: the library's gradients, if any, must be 0
    if lib_loss.requires_grad and pcall(lib_loss.backward, lib_loss) then
      for i, leaf in ipairs(leaves_lib) do
        if leaf.grad and leaf.grad:abs():max():item() ~= 0 then
          return nil, ("gained history: leaf %d has a nonzero gradient, the replay's loss depends on no leaf"):format(i)
            .. text
        end
      end
    end
    return "o"
  end
  if not lib_loss.requires_grad then
    return nil, "lost history: the replay's loss depends on a leaf, the library's has no grad_fn" .. text
  end
  local ok, err = pcall(lib_loss.backward, lib_loss)
  if not ok then
    local why = st.bad_message(err, { "backward" })
    if why then return nil, why .. ": " .. tostring(err) .. text end
    local key = "backward: " .. ((tostring(err):match("modified by an inplace") or tostring(err):match("modified in place")) and
      "modified in place" or tostring(err):sub(1, 60))
    counts[key] = (counts[key] or 0) + 1
    if o.on_backward_error then o.on_backward_error(prog, picks, weights, tostring(err)) end
    return "e"
  end
  ref_loss:backward()
  for i, leaf in ipairs(leaves_lib) do
    local want = leaves_ref[i].grad
    local got = leaf.grad
    if want or got then
      local w = want and flat(want) or nil
      local g = got and flat(got) or nil
      local n = #(w or g)
      local gscale = 0
      for k = 1, n do gscale = math.max(gscale, math.abs(w and w[k] or 0)) end
      for k = 1, n do
        local a, b = g and g[k] or 0, w and w[k] or 0
        if b == b and math.abs(b) < math.huge and not close(a, b, 2e-3, 1e-4 * (1 + gscale)) then
          return nil, ("leaf %d (shape %s): gradient element %d is %.9g, the replay's %.9g"):format(i,
            shape_str(leaf:size()), k, a, b) .. text
        end
      end
    end
  end
  if o.on_agreed then o.on_agreed(prog, picks, weights, leaves_lib) end
  return "o"
end

-- ---- a PyTorch twin of the chains (o.emit_torch) ------------------------------
-- A Python script that runs each compared chain in PyTorch 1.13 and checks
-- its gradients against the library's, and each chain whose backward raised
-- an attn error for whether PyTorch raises too: the replay's independent
-- check, and the answer to "would PyTorch refuse this?" (needs torch; no
-- spec runs it).

local function py_list(t)
  local p = {}
  for i, v in ipairs(t) do p[i] = string.format("%.9g", v) end
  return "[" .. table.concat(p, ",") .. "]"
end

local function py_tensor(t)
  local s = t:size()
  return ("T(%s).view(%s)"):format(py_list(flat(t)), py_list(s))
end

local function py_arg(a)
  if type(a) == "number" then return string.format("%.17g", a) end
  if a.slot then return "s[" .. a.slot .. "]" end
  if attn.is_tensor(a.const) then return py_tensor(a.const) .. ".bool()" end
  return string.format("%.17g", a.const)
end

local function py_ins(ins)
  local k = ins.k
  if k == "leaf" then
    -- cloned: a leaf that is a view of the list's tensor would have that as
    -- its views' base, and PyTorch regenerates a view's history from its base
    return ("s[%d]=T(%s).view(%s).clone().requires_grad_(%s)"):format(ins.out, py_list(ins.data), py_list(ins.shape),
      ins.grad and "True" or "False")
  end
  if k == "detach" then return ("s[%d]=s[%d].detach()"):format(ins.out, ins.src) end
  if k == "cat" then
    local p = {}
    for i, j in ipairs(ins.srcs) do p[i] = "s[" .. j .. "]" end
    return ("s[%d]=torch.cat([%s],%d)"):format(ins.out, table.concat(p, ","), ins.d - 1)
  end
  if k == "view" then
    local st = ins.step
    local e
    if st.op == "narrow" then e = ("narrow(%d,%d,%d)"):format(st.d - 1, st.s - 1, st.l)
    elseif st.op == "select" then e = ("select(%d,%d)"):format(st.d - 1, st.i - 1)
    elseif st.op == "transpose" then e = ("transpose(%d,%d)"):format(st.d1 - 1, st.d2 - 1)
    else e = st.op .. "(" .. py_list(st.sizes) .. ")" end
    return ("s[%d]=s[%d].%s"):format(ins.out, ins.src, e)
  end
  local op, a = ins.op, ins.arg
  local name = k == "inplace" and op .. "_" or op
  local args
  if op == "clamp" or op == "masked_fill" then args = py_arg(a.pair[1]) .. "," .. py_arg(a.pair[2])
  elseif (op == "sum" or op == "mean") and a then args = ("%d,keepdim=%s"):format(a[1] - 1, a[2] and "True" or "False")
  elseif op == "softmax" then args = tostring(a - 1)
  elseif a ~= nil then args = py_arg(a)
  else args = "" end
  if k == "inplace" then return ("s[%d].%s(%s)"):format(ins.dst, name, args) end
  return ("s[%d]=s[%d].%s(%s)"):format(ins.out, ins.src, name, args)
end

local function py_chain(f, n, prog, picks, weights)
  f:write(("def chain%d():\n  s, L = {}, []\n"):format(n))
  for _, ins in ipairs(prog) do
    f:write("  ", py_ins(ins), "\n")
    if ins.k == "leaf" and ins.grad then f:write(("  L.append(s[%d])\n"):format(ins.out)) end
  end
  f:write(("  loss = (s[%d]*%s).sum() + (s[%d]*%s).sum()\n"):format(picks[1], py_tensor(weights[1]), picks[2],
    py_tensor(weights[2])))
  f:write("  loss.backward()\n  return L\n")
end

local PY_HEAD = [[
# Written by scripts/fuzz.lua --mode autograd --emit-torch: the chains in PyTorch 1.13.
import torch, collections
T = lambda x: torch.tensor(x, dtype=torch.float32)
tally = collections.Counter()
def compare(n, fn, want):
    try:
        L = fn()
    except RuntimeError as e:
        tally["attn gave gradients, torch raises"] += 1
        print("chain %d: torch raises: %s" % (n, str(e)[:200])); return
    for i, (l, w) in enumerate(zip(L, want)):
        g = l.grad.reshape(-1) if l.grad is not None else None
        if g is None and w is None: continue
        g = g if g is not None else torch.zeros_like(w)
        w = w if w is not None else torch.zeros_like(g)
        if not torch.allclose(g, w, rtol=2e-3, atol=1e-3):
            tally["gradients differ"] += 1
            print("chain %d: leaf %d: torch %s, attn %s" % (n, i + 1, g.tolist(), w.tolist())); return
    tally["same gradients"] += 1
def refused(n, fn, msg):
    try:
        fn()
    except RuntimeError:
        tally["both raise"] += 1; return
    tally["attn raises, torch does not"] += 1
    print("chain %d: torch computes; attn: %s" % (n, msg))
]]

--- Run the autograd fuzzer: o = {iterations, seed, max_len = 12, with_known = false, out,
-- emit_torch = a path for the PyTorch twin of the chains}.
-- Returns {chains, agreed, errors, errors_by_kind = {message start = count}, failure = text or nil}.
function M.run(o, bad_message)
  local seed = math.tointeger(o.seed) or 7
  local r = new_rng(seed)
  local saved = attn.get_rng_state()
  attn.manual_seed(seed)
  local st = { bad_message = bad_message }
  local py, npy = nil, 0
  if o.emit_torch then
    py = assert(io.open(o.emit_torch, "w"))
    py:write(PY_HEAD)
    o.on_agreed = function(prog, picks, weights, leaves)
      npy = npy + 1
      py_chain(py, npy, prog, picks, weights)
      local want = {}
      for i, l in ipairs(leaves) do want[i] = l.grad and ("T(" .. py_list(flat(l.grad)) .. ")") or "None" end
      py:write(("compare(%d, chain%d, [%s])\n"):format(npy, npy, table.concat(want, ", ")))
    end
    o.on_backward_error = function(prog, picks, weights, msg)
      npy = npy + 1
      py_chain(py, npy, prog, picks, weights)
      py:write(("refused(%d, chain%d, %q)\n"):format(npy, npy, msg:gsub("\n", " ")))
    end
  end
  local stats = { chains = 0, agreed = 0, errors = 0, errors_by_kind = {}, seed = seed }
  local outcomes = {}
  for it = 1, o.iterations or 1000 do
    if o.verbose and o.out then o.out(("-- chain %d"):format(it)) end
    local ok, outcome, finding = pcall(chain, r, o, st, stats.errors_by_kind)
    stats.chains = stats.chains + 1
    if not ok then finding = "the fuzzer's replay raised: " .. tostring(outcome) end
    if not ok or not outcome then
      stats.failure = ("autograd fuzz failure: seed %d, chain %d: %s\nreproduce: scripts/attn-lua scripts/fuzz.lua "
        .. "--mode autograd --seed %d --iterations %d%s"):format(seed, it, finding, seed, it,
        o.with_known and " --with-known" or "")
      break
    end
    outcomes[#outcomes + 1] = outcome
    if outcome == "o" then stats.agreed = stats.agreed + 1 else stats.errors = stats.errors + 1 end
  end
  stats.outcomes = table.concat(outcomes)
  if py then
    py:write("print(dict(tally))\n")
    py:close()
  end
  attn.set_rng_state(saved)
  return stats
end

return M
