--- Reverse-mode automatic differentiation, as PyTorch's autograd.
-- A differentiable operation is an `autograd.Function{name, forward, backward}`
-- (PyTorch's `torch.autograd.Function` style): called with an input that
-- requires grad while grad mode is on, it records a node holding its context
-- (the tensors its backward needs, saved with their versions) and the edges
-- to the nodes (or leaves) that made its inputs. `t:backward()` walks the
-- recorded graph from t in dependency order and accumulates into `.grad`.
--
-- Where the state lives: three weak-keyed tables keyed by tensor (never
-- fields of the userdata, so tensors that never meet autograd pay nothing):
--   history[t] = true for a leaf that requires grad, or the edge {node, slot}
--                that produced t (for a node's first output, the node itself:
--                its fields node and slot make it one);
--   grads[t]   = t.grad;
--   view_base[t] = the tensor a recorded view was taken of;
--   view_replay[t] = for a recorded view, how to redo it (recorded) from its
--                base (see replay_view), to rebuild its history after the base is
--                written in place (PyTorch regenerates a view's grad_fn); for
--                an output of a call returning several views (or a view of
--                one), the name PyTorch's refusal gives it instead.
-- Versions live in C, on the storage: every in-place write bumps them
-- (PyTorch's version counter), so a saved tensor changed after it was saved
-- is an error at backward, naming the saving node and the writer.
-- @module attn.autograd
local core = require "attn.core"
local Tensor, Tensor_mt = core.Tensor, core.Tensor_mt
local getmetatable = getmetatable
-- the methods themselves: a t:size() goes through the tensor's __index first
local t_numel = Tensor.numel
local version_of = core._version
local raw_zeros = core.zeros
-- Tensor:add_ before attn.autograd.derivatives records it: what the recorded
-- add_ runs with grad mode off, as it is during the backward walk
local raw_add_ = Tensor.add_

local M = {}

local history = setmetatable({}, { __mode = "k" })
local grads = setmetatable({}, { __mode = "k" })
local view_base = setmetatable({}, { __mode = "k" })
local view_replay = setmetatable({}, { __mode = "k" })
local parameters = setmetatable({}, { __mode = "k" })
M._history, M._grads, M._parameters = history, grads, parameters

-- Grad mode belongs to the running coroutine, so that a coroutine that
-- yields inside no_grad (or inside a recorded call's forward or backward,
-- which run with recording off) leaves the code outside it as it was, and an
-- abandoned one leaves nothing switched off. main_mode is the main thread's
-- mode; modes[co] a coroutine's own (set by no_grad, enable_grad,
-- set_grad_enabled or a recorded call running there); a coroutine without
-- one follows the main thread's. any_own is false while no coroutine has its
-- own, so the common case reads main_mode without asking which coroutine runs.
local running, next_ = coroutine.running, next
local main_mode = true
local modes = setmetatable({}, { __mode = "k" })
local any_own = false

local function grad_mode()
  if any_own then
    local co, is_main = running()
    if not is_main then
      local m = modes[co]
      if m ~= nil then return m end
    elseif next_(modes) == nil then
      any_own = false -- the coroutines that had one were collected
    end
  end
  return main_mode
end

-- Set the running coroutine's mode; returns what restore_mode takes back.
local function set_mode(on)
  local co, is_main = running()
  if is_main then
    local prev = main_mode
    main_mode = on
    return co, true, prev
  end
  local prev = modes[co]
  modes[co] = on
  any_own = true
  return co, false, prev
end

local function restore_mode(co, is_main, prev)
  if is_main then
    main_mode = prev
    return
  end
  modes[co] = prev
  if prev == nil and next_(modes) == nil then any_own = false end
end

local is_tensor = require("attn.argcheck").is_tensor

local function shape_str(sizes) return "[" .. table.concat(sizes, ", ") .. "]" end

--- Whether operations record (grad mode) in the running coroutine.
M.is_grad_enabled = grad_mode

--- Turn recording on or off in the running coroutine; returns the previous setting.
-- @param on boolean
function M.set_grad_enabled(on)
  if type(on) ~= "boolean" then
    error("attn.set_grad_enabled: bad argument #1 'on' (expected a boolean, got " .. type(on) .. ")", 2)
  end
  local prev = grad_mode()
  set_mode(on)
  return prev
end

-- Run fn(...) with the running coroutine's grad mode set to `mode`, restoring
-- it on return and on error.
local function with_mode(mode, fname, fn, ...)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    error(fname .. ": bad argument #1 'fn' (expected a function, got " .. type(fn) .. ")", 3)
  end
  local co, is_main, prev = set_mode(mode)
  local r = table.pack(pcall(fn, ...))
  restore_mode(co, is_main, prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

--- Run fn(...) with recording off and return its results (torch.no_grad).
-- Recording is restored when fn returns or raises.
function M.no_grad(fn, ...) return with_mode(false, "attn.no_grad", fn, ...) end
--- Run fn(...) with recording on (torch.enable_grad).
function M.enable_grad(fn, ...) return with_mode(true, "attn.enable_grad", fn, ...) end

-- ---------------------------------------------------------------- nodes ----

-- The per-call bookkeeping in C (src/binding/lua_tensor.c): scanning the
-- inputs, giving the outputs their slots, saving and checking versions.
local autograd_inputs, autograd_outputs = core._autograd_inputs, core._autograd_outputs
local autograd_save, autograd_changed = core._autograd_save, core._autograd_changed
local history_stale, history_wrote, history_fresh = core._autograd_stale, core._autograd_wrote, core._autograd_fresh
local same_size = core._autograd_same_size
local autograd_finish, heap_kb = core._autograd_finish, core._autograd_heap_kb
local shape_sizes = core._autograd_sizes
local ones_like = core._autograd_ones_like

-- the key of the sizes of output slot s of node (a string; shape_sizes
-- gives the list): a node of one output keeps the key itself
local function slot_shape(node, s)
  local shapes = node._shapes
  if type(shapes) == "string" then return shapes end
  return shapes[s]
end

-- the error for input i's gradient g from node's backward when it is no
-- tensor (in_shape false) or not the input's shape (in_shape: its key, or
-- the leaf e itself)
local function gradient_error(node, i, g, e, from_node, in_shape)
  if not in_shape then
    error(("attn.autograd: %s's backward returned a %s for input %d (expected a gradient tensor)")
      :format(node._name, type(g), i), 0)
  end
  error(("attn.autograd: %s's backward returned a gradient of shape %s for input %d of shape %s")
    :format(node._name, shape_str(g:size()), i, shape_str(from_node and shape_sizes(in_shape) or e:size())), 0)
end

-- closed when a recorded call's forward returns or raises in the main
-- thread: recording back on (it was on, or the call would not record)
local RESTORE_MAIN_MODE = setmetatable({}, { __close = function() main_mode = true end })

--- A recorded operation (`t.grad_fn`): `node:name()` is PyTorch 1.13's name of
-- the node for the same computation ("MmBackward0").
-- One table per recorded call: the node is also the context (ctx) its
-- forward and backward get. Its fields: _name, _def, needs_input_grad,
-- _edges (per tensor input: the history entry {node, slot} of the input,
-- the input itself for a leaf, false without history), _nout and _shapes
-- (the sizes of the differentiable outputs as keys (slot_shape): the one
-- key, or a table of them for several), _saved (what save_for_backward
-- kept, with the versions, or false), _nondiff; node and slot: the node is
-- the history entry of its first output (of others, {node, slot}).
local Node = {}
Node.__index = Node
Node.__name = "attn.autograd.Node"
function Node:name() return self._name end
M._Node = Node -- the fused module call's recording in C makes its nodes (attn.autograd.sdpa)
function Node.__tostring(n) return "<" .. n._name .. ">" end
--- The edges to the inputs' nodes: a list of `{node, slot}` pairs (node is
-- "AccumulateGrad" for a leaf, nil for an input without gradient), as PyTorch's next_functions.
function Node:next_functions()
  local out = {}
  for i, e in ipairs(self._edges) do
    if e == false then out[i] = { nil, 0 }
    elseif type(e) ~= "table" then out[i] = { "AccumulateGrad", 0 }
    else out[i] = { e.node, e.slot - 1 } end
  end
  return out
end

local RELEASED = {}

--- Keep tensors for the backward; their versions are checked when read back.
function Node:save_for_backward(...)
  self._saved = autograd_save(...)
end

--- The saved tensors, in the order given. Raises when one was modified in
-- place since it was saved, or when the graph was freed by an earlier backward.
function Node:saved()
  local saved = self._saved
  if saved == RELEASED then
    error("attn.autograd: trying to backward through the graph a second time (or to read saved tensors after "
      .. "they have been freed): " .. self._name .. "'s saved tensors were freed by the first backward; "
      .. "pass {retain_graph = true} to the first backward (or autograd.grad) to keep them", 0)
  end
  if not saved then return end
  local i = autograd_changed(saved)
  if i then
    local t = saved[1 + i]
    local v, writer = version_of(t)
    error(("attn.autograd: a tensor of shape %s saved by %s for its backward was modified in place by %s "
      .. "(it is at version %d; %s expected version %d): clone it before the in-place operation, or do "
      .. "the operation out of place"):format(shape_str(t:size()), self._name, writer or "an in-place operation",
      v, self._name, saved[1 + saved[1] + i]), 0)
  end
  return table.unpack(saved, 2, saved[1] + 1)
end

--- Mark outputs (indices) that have no gradient.
function Node:mark_non_differentiable(...)
  self._nondiff = self._nondiff or {}
  for i = 1, select("#", ...) do self._nondiff[select(i, ...)] = true end
end

-- the shared context of unrecorded calls: saves nothing, keeps nothing
local NOCTX = setmetatable({ needs_input_grad = setmetatable({}, { __index = function() return false end }) }, {
  __index = { save_for_backward = function() end, mark_non_differentiable = function() end,
              saved = function() end },
  __newindex = function() end,
})

-- ------------------------------------------------------------ recording ----

local pack, unpack, select_, type_ = table.pack, table.unpack, select, type

local function leaf_message(fname, what)
  return fname .. ": " .. what .. " that requires grad is used in an in-place operation; autograd could not "
    .. "compute its gradient. Do the update inside attn.no_grad (as optimizers do), or on a detached tensor"
end

local VIEW_REBASE = "in-place operation on a view of a tensor that requires grad; attn's autograd "
  .. "does not rebase views (PyTorch's CopySlices): clone() the view first, or work on the base"

-- A stale tensor (made before an in-place write that autograd recorded on
-- memory it shares; see attnL_history_stale) before it is used with grad
-- mode on: a recorded view whose base was written gets its history rebuilt
-- from the base's new history, as PyTorch 1.13 regenerates a view's grad_fn;
-- any other (a view taken without history, before its base got history; a
-- base whose view was written with history, PyTorch's CopySlices) is
-- refused: the history PyTorch would give it is not tracked.
-- The view that view_replay entry `spec` describes, taken (recorded) of base b.
local function replay_view(spec, b)
  if spec.parent then b = replay_view(spec.parent, b) end
  return (select_(spec.k, spec.fn(b, unpack(spec, 2, spec.n))))
end

local function refresh(fname, t, level)
  local replay, base = view_replay[t], view_base[t]
  if type_(replay) == "string" then
    error(("%s: %s is a view and its base or another view of its base has been modified inplace. This view is "
      .. "the output of a function that returns multiple views. Such functions do not allow the output views to "
      .. "be modified inplace (as PyTorch 1.13): take the views after the in-place operation, or do the operation "
      .. "out of place"):format(fname, replay), level or 3)
  end
  if replay and not history_stale(base) then
    local co, is_main, prev = set_mode(true)
    local ok, r = pcall(replay_view, replay, base)
    restore_mode(co, is_main, prev)
    if not ok then error(r, 0) end
    history[t] = history[r]
    history_fresh(t)
    return
  end
  local _, writer = version_of(t)
  error(("%s: a tensor of shape %s shares memory with a tensor that %s wrote in place with autograd "
    .. "history after this one was made (a view taken before its base was written, or the base of a view "
    .. "that was written); attn does not track the history PyTorch would give it: take views after the "
    .. "in-place operation, and write into a clone() (or build the result with attn.cat) rather than into "
    .. "a view of a tensor without history"):format(fname, shape_str(t:size()), writer or "an in-place operation"),
    level or 3)
end

-- history[t], t's history rebuilt first if it is stale.
local function current_history(fname, t)
  if history_stale(t) then refresh(fname, t, 4) end
  return history[t]
end

--- Make a differentiable function from `{name, forward, backward[, dirty, view]}`.
-- forward(ctx, ...) gets the caller's arguments and returns the outputs;
-- backward(ctx, grad_1, ...) gets one gradient per differentiable output and
-- returns one per tensor input (nil: none). `dirty`: forward modifies its first
-- tensor argument in place and returns it. `view`: the output shares the
-- first input's memory (in-place writes to it are refused while it has history).
-- `into_grad` (a node of one output): when the walk accumulates into `.grad`
-- (backward, not autograd.grad) its backward gets the table of the leaves'
-- gradients as a third argument, and may add a leaf input's gradient into
-- that leaf's existing `.grad` itself (as the walk's add_ would, in the order
-- of its edges) and return nil for it.
-- @param def table
-- @return function
function M.Function(def)
  local forward, name = def.forward, def.name
  assert(type(forward) == "function" and type(def.backward) == "function"
    and (type(name) == "string" or type(name) == "function"),
    "autograd.Function: name, forward and backward are required")
  local dirty, is_view, multi_view = def.dirty, def.view, def.multi_view
  local fname = def.fname or name
  local name_of = type(name) == "function" and name or nil
  -- unrecorded calls: the plain function when given, else forward with a context that keeps nothing
  local plain = def.raw or function(...) return forward(NOCTX, ...) end
  -- neither writes an input in place nor returns a view: its outputs need nothing after autograd_finish
  local simple = not dirty and not is_view
  local recorded
  recorded = function(...)
    local on = main_mode
    if any_own then on = grad_mode() end
    if not on then return plain(...) end
    local inputs, edges, needs = autograd_inputs(history, ...)
    while inputs == false do
      refresh(fname, edges)
      inputs, edges, needs = autograd_inputs(history, ...)
    end
    if not inputs then
      if dirty then
        local self = ...
        if view_base[self] and history[view_base[self]] then error(fname .. ": " .. VIEW_REBASE, 2) end
      end
      return plain(...)
    end
    if dirty then
      local self = inputs[1]
      if history[self] == true then error(leaf_message(fname, "a leaf tensor"), 2) end
      if view_base[self] and history[view_base[self]] then
        if history[view_base[self]] == true then error(leaf_message(fname, "a view of a leaf tensor"), 2) end
        error(fname .. ": " .. VIEW_REBASE, 2)
      end
    end
    -- every field the bookkeeping sets exists from the start, and room for a
    -- few of the forward's own (ctx.shape...): no rehash as they arrive.
    -- node, slot: the node is its own first output's history entry ({node, slot})
    local node = setmetatable({ _name = name, _def = def, needs_input_grad = needs, _edges = edges, _nout = 0,
                                _shapes = false, _saved = false, node = false, slot = 1 }, Node)
    node.node = node
    -- forward runs with recording off in this coroutine (set_mode and
    -- restore_mode inlined: this is every recorded call's path)
    local co, is_main = running()
    if simple and is_main then
      -- the common case, without a pcall and a table of results: the name
      -- first (a name function that raises on these arguments goes the
      -- general way below, where the forward's own error comes first), grad
      -- mode restored by the to-be-closed variable also when forward raises
      if name_of then
        local ok, nm = pcall(name_of, ...)
        if ok then node._name = nm else goto general end
      end
      main_mode = false
      local _ <close> = RESTORE_MAIN_MODE
      return autograd_finish(history, node, inputs, forward(node, ...))
    end
    ::general::
    local prev
    if is_main then main_mode = false else prev = modes[co]; modes[co] = false; any_own = true end
    local r = pack(pcall(forward, node, ...))
    if is_main then main_mode = true else restore_mode(co, false, prev) end
    if not r[1] then error(r[2], 0) end
    if name_of then node._name = name_of(...) end
    autograd_outputs(history, node, inputs, node._nondiff, dirty, r)
    if dirty then history_wrote(inputs[1]) end
    if is_view then
      local src = inputs[1]
      local base, parent = view_base[src] or src, view_replay[src]
      for i = 2, r.n do
        local h = history[r[i]]
        if type_(h) == "table" and h.node == node then
          view_base[r[i]] = base
          if type_(parent) == "string" then
            view_replay[r[i]] = parent
          elseif multi_view then
            view_replay[r[i]] = ("Output %d of %s"):format(i - 2, node._name)
          else
            -- how to take the same view (output i - 1 of this call) of another
            -- base: one table per view, the source left out (not kept alive)
            view_replay[r[i]] = { fn = recorded, k = i - 1, parent = parent, n = select_("#", ...), false,
                                  select_(2, ...) }
          end
        end
      end
    end
    return unpack(r, 2, r.n)
  end
  return recorded
end

--- `g` (a gradient of a broadcast result) summed back to `shape` (a size table).
-- @param g tensor
-- @param shape table of sizes
function M.sum_to(g, shape)
  local gs = g:size()
  local nd, ng = #shape, #gs
  if nd == ng then
    local same = true
    for i = 1, nd do if gs[i] ~= shape[i] then same = false break end end
    if same then return g end
  end
  local lead = ng - nd
  for _ = 1, lead do g = g:sum(1) end
  for d = 1, nd do
    if shape[d] == 1 and gs[lead + d] ~= 1 then g = g:sum(d, true) end
  end
  return g
end

-- ------------------------------------------------------------- backward ----

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- Accumulate g into the leaf x's .grad (a fresh tensor the first time, so
-- that no two leaves share a gradient object).
local function accumulate(x, g)
  local old = grads[x]
  if old == nil then
    grads[x] = g:clone()
  else
    old:add_(g)
  end
end

-- The gradient buffers of the walk: buffers[node] is the gradient summed so
-- far for a node's only output, or a table slot -> gradient for a node of
-- several outputs (no table per node in the common case).
local function add_to(buffers, node, slot, g)
  if node._nout == 1 then
    local old = buffers[node]
    if old == nil then buffers[node] = g else buffers[node] = old + g end
    return
  end
  local b = buffers[node]
  if not b then b = {} buffers[node] = b end
  local old = b[slot]
  if old == nil then b[slot] = g else b[slot] = old + g end
end

-- A gradient reaching leaf x: into x.grad, or for autograd.grad into its
-- result when x is one of its inputs.
local function to_leaf(x, g, capture, results)
  if capture then
    local k = capture.leaves[x]
    if k then results[k] = results[k] and results[k] + g or g end
  else
    accumulate(x, g)
  end
end

-- The gradient flowing into a node's output slot s, as the walk hands it to
-- the node's backward (zeros when nothing flowed into it); captured for
-- autograd.grad when that output is one of its inputs and a gradient reached
-- it (an output that got none, such as an unused chunk, stays unused).
local function slot_grad(g, node, s, capture, results)
  if capture and g ~= nil then
    local cs = capture.slots[node]
    local k = cs and cs[s]
    if k then results[k] = g end
  end
  if g == nil then g = raw_zeros(shape_sizes(slot_shape(node, s))) end
  return g
end

-- The walk over the ready queue (run's second half, under its pcall): each
-- node's backward once every node that feeds it gradient has run.
-- Each node's incoming gradients and (without retain_graph) its saved tensors
-- are garbage once it has run, but Lua's collector lets garbage pile up to its
-- pause (by default until the heap has doubled) before freeing it: a training
-- step's backward would hold every spent gradient at once. So the walk runs a
-- full collection whenever the heap (tensor bytes included: they are
-- userdata) has grown by 25%, and at least 512 KiB, since the walk began or
-- the last collection. scripts/train_gpt.lua's default run: peak RSS above
-- the process's start 1.68x (no collection) -> 1.44x (a tenth, 2 MiB) ->
-- 1.28x the bytes training needs at 3%, which a collection after every node
-- does not lower. Each collection walks every Lua object (0.2 to 1 ms in a
-- GPTModel's backward; under lua5.4's generational mode a full collection
-- first turns every object white, a pointer chase through the whole list):
-- the bench's train_gpt step ran 19 of them at 3% (8% of its one-thread
-- time), 10 at 10% (6.5 ms of CPU a step, serial while the other threads
-- wait) and 3 at 25% (2.5 ms), for a peak RSS of 70.7, 74.1 and 77.3 MiB in
-- that default run (train_gpt.lua --report-memory; 1.51x the 51.3 MiB it
-- needs at 25%).
local GC_GROWTH, GC_MIN_KB = 1.25, 512
local collect = collectgarbage

-- the heap size (KiB) past which the walk collects next: GC_GROWTH of the
-- heap now, at least GC_MIN_KB more
local function next_collect_at()
  local heap = heap_kb()
  return heap + math.max(heap * (GC_GROWTH - 1), GC_MIN_KB)
end

-- a full collection (the walk's, once the heap has passed its threshold);
-- the next threshold
local function collect_now()
  collect()
  return next_collect_at()
end

-- how many values, and the first: a backward's results without a table
local function count_first(...) return select_("#", ...), (...) end

-- an into_grad backward's results as a list, nil for none (every gradient
-- added into .grad, or none needed): no table then
local function pack_some(...)
  if select_("#", ...) == 0 then return nil end
  return pack(...)
end

local function walk(ready, tail, deps, buffers, retain, capture, results)
  local head = 1
  local gc_at = next_collect_at()
  while ready[head] do
    local node = ready[head]
    ready[head] = nil
    head = head + 1
    local def = node._def
    local nout, backward, edges = node._nout, def.backward, node._edges
    local nedges = #edges
    -- r: the backward's results as a list; for a node of one input, its
    -- one gradient g1 and no table (r = nil)
    local r, n1, g1
    if nout == 1 then
      local g = buffers[node]
      if capture or g == nil then g = slot_grad(g, node, 1, capture, results) end
      buffers[node] = nil
      if nedges == 1 then n1, g1 = count_first(backward(node, g))
      elseif def.into_grad and not capture then r = pack_some(backward(node, g, grads))
      else r = pack(backward(node, g)) end
    else
      local b = buffers[node] or {}
      buffers[node] = nil
      local gs = {}
      for s = 1, nout do gs[s] = slot_grad(b[s], node, s, capture, results) end
      r = pack(backward(node, unpack(gs, 1, nout)))
    end
    if r then
      if r.n == 1 and type_(r[1]) == "table" and getmetatable(r[1]) ~= Tensor_mt then r = r[1] end
    elseif n1 == 1 and type_(g1) == "table" and getmetatable(g1) ~= Tensor_mt then
      g1 = g1[1]
    end
    for i = 1, nedges do
      local e, g = edges[i], nil
      if r then g = r[i] else g = g1 end
      local from_node = type_(e) == "table" -- else a leaf (the tensor) or false
      if e and g ~= nil then
        local in_shape = getmetatable(g) == Tensor_mt and (from_node and slot_shape(e.node, e.slot) or e)
        if not (in_shape and same_size(g, in_shape)) then gradient_error(node, i, g, e, from_node, in_shape) end
        if not from_node then
          if capture then
            to_leaf(e, g, capture, results)
          else -- accumulate(e, g) with the add_ it makes (grad mode is off here)
            local old = grads[e]
            if old == nil then grads[e] = g:clone() else raw_add_(old, g) end
          end
        else
          add_to(buffers, e.node, e.slot, g)
        end
      end
      if from_node then
        local to = e.node
        local d = deps[to] - 1
        deps[to] = d
        if d == 0 then
          tail = tail + 1
          ready[tail] = to
        end
      end
    end
    if not retain and node._saved then node._saved = RELEASED end
    if heap_kb() > gc_at then gc_at = collect_now() end
  end
end

-- The walk of a chain (run's choice for backward when every node reached
-- has one output and at most one edge to a node, as a module's output summed
-- has): the general walk's steps in the order it would take them (each node
-- once the one node before it has run), with the gradient handed from node
-- to node in a local instead of the buffers, and no dependency count.
local function walk_chain(node, g, retain)
  local gc_at = next_collect_at()
  while node do
    local def, edges = node._def, node._edges
    local backward, nedges = def.backward, #edges
    if g == nil then g = raw_zeros(shape_sizes(slot_shape(node, 1))) end
    local r, n1, g1
    if nedges == 1 then n1, g1 = count_first(backward(node, g))
    elseif def.into_grad then r = pack_some(backward(node, g, grads))
    else r = pack(backward(node, g)) end
    if r then
      if r.n == 1 and type_(r[1]) == "table" and getmetatable(r[1]) ~= Tensor_mt then r = r[1] end
    elseif n1 == 1 and type_(g1) == "table" and getmetatable(g1) ~= Tensor_mt then
      g1 = g1[1]
    end
    local next_node, next_g = nil, nil
    for i = 1, nedges do
      local e, gi = edges[i], nil
      if r then gi = r[i] else gi = g1 end
      local from_node = type_(e) == "table"
      if e and gi ~= nil then
        local in_shape = getmetatable(gi) == Tensor_mt and (from_node and slot_shape(e.node, e.slot) or e)
        if not (in_shape and same_size(gi, in_shape)) then gradient_error(node, i, gi, e, from_node, in_shape) end
        if not from_node then
          local old = grads[e]
          if old == nil then grads[e] = gi:clone() else raw_add_(old, gi) end
        else
          next_g = gi
        end
      end
      if from_node then next_node = e.node end
    end
    if not retain and node._saved then node._saved = RELEASED end
    if heap_kb() > gc_at then gc_at = collect_now() end
    node, g = next_node, next_g
  end
end

-- Whether the nodes reachable from node form a chain walk_chain takes: each
-- of one output, with at most one edge to a node.
local function is_chain(node)
  while node do
    if node._nout ~= 1 then return false end
    local edges, to = node._edges, nil
    for i = 1, #edges do
      local e = edges[i]
      if type_(e) == "table" then
        if to then return false end
        to = e.node
      end
    end
    node = to
  end
  return true
end

-- fn(...) (a walk) with grad mode off, under pcall; an error that does not name
-- an attn function gets fname's
local function run_protected(fname, fn, ...)
  local co, is_main, prev = set_mode(false)
  local ok, err = pcall(fn, ...)
  restore_mode(co, is_main, prev)
  if not ok then
    if type_(err) == "string" and not err:find("^attn") then err = fname .. ": " .. err end
    error(err, 0)
  end
end

-- The walk shared by backward and autograd.grad. roots: tensors; root_grads:
-- their gradients (or one tensor and its gradient). capture: nil (accumulate into leaves) or a table mapping
-- leaf tensors and "node slot" keys to result positions, filled into results.
local function run(fname, roots, root_grads, retain, capture, results)
  -- one root (backward's): roots is the tensor and root_grads its gradient, no lists
  local single = getmetatable(roots) == Tensor_mt
  if single and not capture then
    local h = history[roots]
    if type_(h) == "table" and is_chain(h.node) then
      run_protected(fname, walk_chain, h.node, root_grads, retain)
      return
    end
  end
  -- discover the nodes reachable from the roots, counting the edges into
  -- each: deps[node] is nil for a node not yet seen (one table for both)
  local deps, stack, top = {}, {}, 0
  local nroots = single and 1 or #roots
  for i = 1, nroots do
    local h = history[single and roots or roots[i]]
    if type_(h) == "table" and not deps[h.node] then
      deps[h.node] = 0
      top = top + 1
      stack[top] = h.node
    end
  end
  local ready, tail = {}, 0
  -- the roots' nodes that no other node feeds, last root first (the order
  -- the walk has always taken them in)
  for i = 1, top do ready[i] = stack[top - i + 1] end
  local nready = top
  while top > 0 do
    local node = stack[top]
    stack[top] = nil
    top = top - 1
    local edges = node._edges
    for i = 1, #edges do
      local e = edges[i]
      if type_(e) == "table" then
        local to = e.node
        local d = deps[to]
        if d == nil then
          top = top + 1
          stack[top] = to
          d = 0
        end
        deps[to] = d + 1
      end
    end
  end
  for i = 1, nready do -- kept in place: tail <= i
    local node = ready[i]
    ready[i] = nil
    if deps[node] == 0 then
      tail = tail + 1
      ready[tail] = node
    end
  end
  local buffers = {}
  for i = 1, nroots do
    local t, g = roots, root_grads
    if not single then t, g = roots[i], root_grads[i] end
    local h = history[t]
    if h == true then
      to_leaf(t, g, capture, results)
    elseif h then
      add_to(buffers, h.node, h.slot, g)
    end
  end
  run_protected(fname, walk, ready, tail, deps, buffers, retain, capture, results)
end

local function check_grad_arg(fname, t, g, i)
  if g == nil then
    if t_numel(t) ~= 1 then
      error(("%s: grad can be implicitly created only for one-element outputs (got shape %s); pass a gradient "
        .. "of that shape"):format(fname, shape_str(t:size())), 3)
    end
    return ones_like(t)
  end
  if not is_tensor(g) then
    error(("%s: bad argument #%d 'gradient' (expected attn.Tensor or nil, got %s)"):format(fname, i, type_(g)), 3)
  end
  if not same_shape(g:size(), t:size()) then
    error(("%s: bad argument #%d 'gradient' (expected shape %s, the output's, got %s)")
      :format(fname, i, shape_str(t:size()), shape_str(g:size())), 3)
  end
  return g
end

-- The options table of backward ({retain_graph}) or autograd.grad
-- ({retain_graph, allow_unused}): retain_graph, allow_unused as booleans.
local function check_opts(fname, opts, argn, allowed)
  if opts == nil then return false, false end
  if type_(opts) ~= "table" then
    error(("%s: bad argument #%d 'opts' (expected a table such as {retain_graph = true}, got %s)")
      :format(fname, argn, type_(opts)), 3)
  end
  for k, v in pairs(opts) do
    if not allowed[k] then
      error(("%s: bad argument #%d 'opts' (unknown option '%s'; expected %s)"):format(fname, argn,
        tostring(k), allowed.names), 3)
    end
    if k == "allow_unused" and type_(v) ~= "boolean" then
      error(("%s: bad argument #%d 'opts' (option 'allow_unused' expected a boolean, got %s)"):format(fname, argn,
        type_(v)), 3)
    end
  end
  return opts.retain_graph and true or false, opts.allow_unused == true
end
local BACKWARD_OPTS = { retain_graph = true, names = "retain_graph" }
local GRAD_OPTS = { retain_graph = true, allow_unused = true, names = "retain_graph or allow_unused" }

-- The post-backward hooks, in registration order (a fixed order: hooks that
-- communicate, as DistributedDataParallel's, must run alike on every process).
local post_backward = {}

local function run_post_backward()
  if #post_backward == 0 then return end
  for _, h in ipairs({ table.unpack(post_backward) }) do
    if not h.removed then h.fn() end
  end
end

--- Call fn() at the end of every `t:backward()`, once every leaf's `.grad`
-- holds its gradient (not after autograd.grad, which writes no `.grad`).
-- Returns a handle whose `:remove()` unregisters it. What
-- attn.dist.DistributedDataParallel averages the gradients in.
function M.register_post_backward(fn)
  if type_(fn) ~= "function" then
    error("attn.autograd.register_post_backward: bad argument #1 'fn' (expected a function, got " .. type_(fn) .. ")", 2)
  end
  local h = { fn = fn }
  function h.remove()
    if h.removed then return end
    h.removed = true
    for i, x in ipairs(post_backward) do
      if x == h then table.remove(post_backward, i) break end
    end
  end
  post_backward[#post_backward + 1] = h
  return h
end

--- Accumulate the gradients of t into the `.grad` of the leaves it depends on.
-- `gradient` defaults to 1 for a one-element t; `{retain_graph = true}` keeps
-- the saved tensors for another backward.
-- @param t tensor
-- @param[opt] gradient tensor of t's shape
-- @param[opt] opts table
function M.backward(...)
  local t, gradient, opts = ...
  local fname = "Tensor:backward"
  if select_("#", ...) > 3 then error(fname .. ": bad argument #4 (no more than 3 arguments expected)", 2) end
  if not is_tensor(t) then error(fname .. ": bad argument #1 'self' (expected attn.Tensor, got " .. type_(t) .. ")", 2) end
  local retain = check_opts(fname, opts, 3, BACKWARD_OPTS)
  if not current_history(fname, t) then
    error(fname .. ": the tensor does not require grad and has no grad_fn (no input of its computation "
      .. "requires grad, or it was computed inside attn.no_grad)", 2)
  end
  gradient = check_grad_arg(fname, t, gradient, 2)
  run(fname, t, gradient, retain)
  run_post_backward()
end

local function as_list(x, fname, argn, what)
  if is_tensor(x) then return { x }, true end
  if type_(x) ~= "table" then
    error(("%s: bad argument #%d '%s' (expected a tensor or a list of tensors, got %s)"):format(fname, argn, what,
      type_(x)), 3)
  end
  for i, y in ipairs(x) do
    if not is_tensor(y) then
      error(("%s: bad argument #%d '%s' (element %d is a %s, expected attn.Tensor)"):format(fname, argn, what, i,
        type_(y)), 3)
    end
  end
  if #x == 0 then error(("%s: bad argument #%d '%s' (an empty list)"):format(fname, argn, what), 3) end
  return x, false
end

--- The gradients of `outputs` w.r.t. `inputs` (tensors or lists), as a list,
-- without touching any `.grad`:
-- `autograd.grad(outputs, inputs[, grad_outputs[, {retain_graph, allow_unused}]])`.
-- An input given twice gets its gradient twice; an input no gradient reached
-- is an error, or nil with allow_unused (torch.autograd.grad).
function M.grad(...)
  local outputs, inputs, grad_outputs, opts = ...
  local fname = "attn.autograd.grad"
  if select_("#", ...) > 4 then error(fname .. ": bad argument #5 (no more than 4 arguments expected)", 2) end
  outputs = as_list(outputs, fname, 1, "outputs")
  inputs = as_list(inputs, fname, 2, "inputs")
  local retain, allow_unused = check_opts(fname, opts, 4, GRAD_OPTS)
  local gos = {}
  if grad_outputs ~= nil then
    if is_tensor(grad_outputs) then grad_outputs = { grad_outputs } end
    if type_(grad_outputs) ~= "table" then
      error(fname .. ": bad argument #3 'grad_outputs' (expected a tensor, a list of tensors or nil, got "
        .. type_(grad_outputs) .. ")", 2)
    end
  end
  for i, t in ipairs(outputs) do
    if not current_history(fname, t) then
      error(("%s: element %d of outputs does not require grad and has no grad_fn"):format(fname, i), 2)
    end
    gos[i] = check_grad_arg(fname, t, grad_outputs and grad_outputs[i], 3)
  end
  -- each distinct input is captured once; a repeat gets the first one's gradient
  local capture, results, first = { leaves = {}, slots = {} }, {}, {}
  for i, x in ipairs(inputs) do
    local h = current_history(fname, x)
    if h == nil then
      error(("%s: element %d of inputs does not require grad (it is not part of a graph)"):format(fname, i), 2)
    end
    if first[x] == nil then
      first[x] = i
      if h == true then capture.leaves[x] = i
      else
        capture.slots[h.node] = capture.slots[h.node] or {}
        capture.slots[h.node][h.slot] = i
      end
    end
  end
  run(fname, outputs, gos, retain, capture, results)
  for i, x in ipairs(inputs) do
    local g = results[first[x]]
    if g == nil and not allow_unused then
      error(("%s: element %d of inputs: One of the differentiated Tensors appears to not have been used in the "
        .. "graph. Set allow_unused=True if this is the desired behavior (pass {allow_unused = true})")
        :format(fname, i), 2)
    end
    results[i] = g
  end
  return results
end

-- ------------------------------------------------------- tensor fields ----

--- Mark a leaf as requiring grad (or not); returns it.
function M.requires_grad_(...)
  local t, on = ...
  local fname = "Tensor:requires_grad_"
  if select_("#", ...) > 2 then error(fname .. ": bad argument #3 (no more than 2 arguments expected)", 2) end
  if not is_tensor(t) then error(fname .. ": bad argument #1 'self' (expected attn.Tensor, got " .. type_(t) .. ")", 2) end
  if on == nil then on = true end
  if type_(on) ~= "boolean" then
    error(fname .. ": bad argument #2 'requires_grad' (expected a boolean, got " .. type_(on) .. ")", 2)
  end
  if on and t.dtype == "bool" then
    error(fname .. ": only float tensors can require gradients, got a bool tensor (as PyTorch; use t:float())", 2)
  end
  local h = history[t]
  if type_(h) == "table" then
    -- as PyTorch 1.13: a computed tensor already requires grad, so asking for it is a no-op
    if on then return t end
    error(fname .. ": you can only change requires_grad flags of leaf tensors; to use a computed tensor "
      .. "without its history, use t:detach()", 2)
  end
  history[t] = on or nil
  return t
end

--- A tensor sharing t's storage, without history (never requires grad).
function M.detach(...)
  local t = ...
  if select_("#", ...) > 1 then error("Tensor:detach: bad argument #2 (no more than 1 argument expected)", 2) end
  if not is_tensor(t) then error("Tensor:detach: bad argument #1 'self' (expected attn.Tensor, got " .. type_(t) .. ")", 2) end
  return core._alias(t)
end

-- history[t] for reading a field: a stale view rebuilt when it can be (a
-- field read does not raise for one that cannot)
local function field_history(t)
  if history_stale(t) and type_(view_replay[t]) == "table" and not history_stale(view_base[t]) then
    refresh("", t)
  end
  return history[t]
end

local fields = {
  requires_grad = function(t) return field_history(t) ~= nil end,
  is_leaf = function(t) return type_(field_history(t)) ~= "table" end,
  grad_fn = function(t)
    local h = field_history(t)
    if type_(h) == "table" then return h.node end
    return nil
  end,
  grad = function(t) return grads[t] end,
}

local raw_index, raw_newindex = core._index, core._newindex

-- t[i] and t[{i, j}]: recorded as selects along the leading dims when t has history
local function recorded_index(t, key)
  local select = Tensor.select
  if type_(key) == "number" then
    if t:dim() <= 1 then return raw_index(t, key) end -- a number (1-D), or the 0-dim error naming the index
    return select(t, 1, key)
  end
  if type_(key) == "table" and not is_tensor(key) then
    local n = #key
    if n >= t:dim() then return raw_index(t, key) end -- a number: no history, as for 1-D t[i]
    for d = n, 1, -1 do t = select(t, d, key[d]) end
    return t
  end
  return raw_index(t, key)
end

-- t[key] where key is a traced value of attn.score_mod / attn.mask_mod, or a
-- table holding one: the tracer's (lua/attn/score_mod.lua), nil for any other key
local traced_index

--- Set the tracer's indexing hook (traced_index above).
function M.set_traced_index(f) traced_index = f end

local function get_field(t, key)
  if type_(key) ~= "string" then
    if traced_index and type_(key) == "table" then
      local r = traced_index(t, key)
      if r ~= nil then return r end
    end
    local on = main_mode
    if any_own then on = grad_mode() end
    -- a stale t goes the recorded way, which rebuilds its history or refuses
    if on and (history[t] or history_stale(t)) then return recorded_index(t, key) end
    return raw_index(t, key)
  end
  local f = fields[key]
  if f then return f(t) end
  return nil
end

local function set_field(t, key, value)
  if type_(key) ~= "string" then
    local on = main_mode
    if any_own then on = grad_mode() end
    if on and (history[t] or history[value] or (view_base[t] and history[view_base[t]])) then
      error("attn.Tensor index assignment: assigning into a tensor that takes part in autograd (it or the "
        .. "value requires grad) is not supported: build the result with attn.cat / attn.stack, or assign "
        .. "inside attn.no_grad", 2)
    end
    return raw_newindex(t, key, value)
  end
  if key == "grad" then
    if value ~= nil then
      if not is_tensor(value) then
        error("attn.Tensor field 'grad': expected an attn.Tensor or nil, got " .. type_(value), 2)
      end
      if not same_shape(value:size(), t:size()) then
        error(("attn.Tensor field 'grad': the gradient's shape %s differs from the tensor's %s")
          :format(shape_str(value:size()), shape_str(t:size())), 2)
      end
    end
    grads[t] = value
    return
  end
  if key == "requires_grad" then
    if type_(value) ~= "boolean" then
      error("attn.Tensor field 'requires_grad': expected a boolean, got " .. type_(value), 2)
    end
    -- as PyTorch 1.13's setter: refused on a computed tensor either way (requires_grad_(true) is a no-op)
    if type_(history[t]) == "table" then
      error("attn.Tensor field 'requires_grad': you can only change requires_grad flags of leaf tensors"
        .. (value and "" or "; to use a computed tensor without its history, use t:detach()"), 2)
    end
    M.requires_grad_(t, value)
    return
  end
  return raw_newindex(t, key, value) -- its error: only integer indices can be assigned
end

core._set_field_handlers(get_field, set_field)

--- Whether t is a module parameter (printed as `Parameter containing:`).
function M.is_parameter(t) return parameters[t] == true end
--- Mark t as a module parameter: it requires grad and prints as PyTorch's Parameter.
function M.mark_parameter(t)
  parameters[t] = true
  if history[t] == nil then history[t] = true end
  return t
end

--- The suffixes PyTorch's print adds for autograd ("grad_fn=<MmBackward0>", "requires_grad=True").
function M.print_suffixes(t)
  local h = history[t]
  if type_(h) == "table" then
    return { "grad_fn=<" .. (h.node._name:match("([^:]+)$")) .. ">" }
  elseif h == true then
    return { "requires_grad=True" }
  end
  return nil
end

return M
