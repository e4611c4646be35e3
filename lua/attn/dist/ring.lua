--- Ring attention (context parallelism): every rank holds its chunk of the
-- sequence (dim -2) of q, k and v; the K/V chunks travel around the ring
-- (rank r sends to r + 1 and receives from r - 1) while each rank attends its
-- queries to the chunk it holds, and the partial results are merged by their
-- log-sum-exp. The backward sends K/V around again, with the dK/dV of each
-- chunk travelling beside it until they reach its owner.
--
-- The ring logic is written against a communicator, so that it runs over MPI
-- (`attn.dist`) and over a simulated ring in one process (the specs):
--   comm.rank() (1-based), comm.world_size(),
--   comm.isend(t, dst, tag) -> req, comm.irecv(t, src, tag) -> req,
--   req:wait(), comm.all_gather(t) -> [world, ...].
-- K, V, dK and dV travel on tags of their own; on one tag, messages between
-- two ranks are matched in the order they are posted (MPI's non-overtaking
-- rule), which is the order of the steps.
-- @module attn.dist.ring
local attn = require "attn"
local core = require "attn.core"
local autograd = require "attn.autograd"
local caller = require "attn.caller"
local is_tensor = require("attn.argcheck").is_tensor

local sdpa_backward = core.autograd.sdpa_backward
local NEG_INF = -math.huge

local M = {}

local FN = "dist.ring_attention"

local function shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

-- ------------------------------------------------------------- the plan ----

-- What every rank must agree on, packed into a fixed-length float tensor for
-- one all_gather: each size as two exact float32 halves (sizes up to 2^44).
local SLOTS = 1 + 2 * 8
local LAYOUTS = { contiguous = 1, zigzag = 2 }
local LAYOUT_NAMES = { "contiguous", "zigzag" }

local function pack_shape(out, base, s)
  out[base] = #s
  for d = 1, 8 do
    local n = s[d] or 0
    out[base + 2 * d - 1], out[base + 2 * d] = n // 2 ^ 20, n % 2 ^ 20
  end
end

local function unpack_shape(row, base)
  local s = {}
  for d = 1, math.floor(row[base]) do
    s[d] = math.floor(row[base + 2 * d - 1]) * 2 ^ 20 + math.floor(row[base + 2 * d])
    s[d] = math.tointeger(s[d])
  end
  return s
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- Sizes with dim -2 left out: what must match across ranks.
local function without_seq(s)
  local t = {}
  for i = 1, #s do t[i] = (i == #s - 1) and "n" or s[i] end
  return t
end

-- The chunks a rank holds, as {index, len, at = local offset, pos = global
-- offset} (0-based offsets), for sequence lengths lens[1..P] per rank.
local function chunks_of(layout, lens, r, P)
  if layout == "contiguous" then
    local pos = 0
    for j = 1, r - 1 do pos = pos + lens[j] end
    return { { index = r, len = lens[r], at = 0, pos = pos } }
  end
  local c = lens[r] // 2
  return { { index = r, len = c, at = 0, pos = (r - 1) * c },
           { index = 2 * P + 1 - r, len = c, at = c, pos = (2 * P - r) * c } }
end

-- Agree on the call across ranks (one all_gather of a small tensor) and make
-- the plan: every rank reaches the same verdict from the same gathered rows,
-- so a mismatch is the same error everywhere, never a hang.
local function make_plan(comm, pool, q, k, v, causal, scale, layout)
  local P, r = comm.world_size(), comm.rank()
  local row = {}
  pack_shape(row, 1, q:size())
  pack_shape(row, 1 + SLOTS, k:size())
  pack_shape(row, 1 + 2 * SLOTS, v:size())
  local tail = 3 * SLOTS
  row[tail + 1] = causal and 1 or 0
  row[tail + 2] = LAYOUTS[layout]
  row[tail + 3], row[tail + 5] = scale or 0, scale == nil and 1 or 0
  -- a recorded call's backward is a ring of its own: every rank must record it
  local records = attn.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
  row[tail + 4] = records and 1 or 0
  local rows = comm.all_gather(attn.tensor(row)):totable()
  local qs, ks, vs = {}, {}, {}
  for j = 1, P do
    local row_j = rows[j]
    qs[j], ks[j], vs[j] = unpack_shape(row_j, 1), unpack_shape(row_j, 1 + SLOTS), unpack_shape(row_j, 1 + 2 * SLOTS)
  end
  local function fail(fmt, ...) caller.error(FN .. ": " .. fmt:format(...)) end
  for j = 1, P do
    local o = rows[j]
    if o[tail + 1] ~= row[tail + 1] then
      fail("ranks disagree on is_causal (rank %d: %s, rank %d: %s)", r, tostring(causal), j,
        tostring(o[tail + 1] == 1))
    end
    if o[tail + 2] ~= row[tail + 2] then
      fail("ranks disagree on layout (rank %d: %q, rank %d: %q)", r, layout, j, LAYOUT_NAMES[o[tail + 2]])
    end
    if o[tail + 5] ~= row[tail + 5] or o[tail + 3] ~= attn.tensor{ row[tail + 3] }:totable()[1] then
      fail("ranks disagree on scale (rank %d: %s, rank %d: %s)", r, tostring(scale), j,
        o[tail + 5] == 1 and "nil" or ("%.9g"):format(o[tail + 3]))
    end
    if o[tail + 4] ~= row[tail + 4] then
      local function says(x) return x == 1 and "records it for backward" or "does not record it" end
      fail("ranks disagree on autograd: rank %d %s, rank %d %s (every rank's backward takes part in the ring: "
        .. "grad mode and requires_grad of q, k, v must agree)", r, says(row[tail + 4]), j, says(o[tail + 4]))
    end
    for _, t in ipairs{ { "q", qs }, { "k", ks }, { "v", vs } } do
      local name, s = t[1], t[2]
      if not same(without_seq(s[j]), without_seq(s[r])) then
        fail("bad argument '%s' (expected the same sizes on every rank but in dim -2 (the sequence), got %s on rank %d "
          .. "and %s on rank %d)", name, shape_str(s[r]), r, shape_str(s[j]), j)
      end
    end
  end
  local qlens, klens = {}, {}
  for j = 1, P do qlens[j], klens[j] = qs[j][#qs[j] - 1], ks[j][#ks[j] - 1] end
  if causal or layout == "zigzag" then
    -- positions matter: each rank's query and key chunks cover the same positions
    for j = 1, P do
      if qlens[j] ~= klens[j] then
        fail("bad arguments 'q', 'k' (with is_causal or layout \"zigzag\", each rank's q and k chunks must cover the "
          .. "same positions: equal sizes in dim -2, got %d and %d on rank %d)", qlens[j], klens[j], j)
      end
    end
  end
  if layout == "zigzag" then
    for j = 1, P do
      if qlens[j] ~= qlens[1] or qlens[j] % 2 ~= 0 then
        fail("bad argument 'q' (layout \"zigzag\": every rank holds two chunks of n / (2 * %d), so dim -2 must be the "
          .. "same even size on every rank; got %s)", P, table.concat(qlens, ", "))
      end
    end
  end
  return { comm = comm, pool = pool, P = P, r = r, causal = causal, scale = scale, layout = layout, qlens = qlens,
           klens = klens, kshapes = ks, vshapes = vs }
end

-- The attention blocks of rank r's queries (default: this rank's) against
-- rank j's keys, as {qa, ql, ka, kl, causal} (local 0-based offsets and
-- lengths): causal blocks wholly in the future are left out, wholly past
-- ones are full, the diagonal one is causal; neighbouring full blocks are
-- joined into one call.
local compute_blocks

local function blocks(plan, j, r)
  r = r or plan.r
  -- a call asks for some pairs more than once (its own steps, and what the ranks ahead use): made once per plan
  local cache = plan.block_cache
  if not cache then
    cache = {}
    plan.block_cache = cache
  end
  local key = r * (plan.P + 1) + j
  local list = cache[key]
  if not list then
    list = compute_blocks(plan, j, r)
    cache[key] = list
  end
  return list
end

function compute_blocks(plan, j, r)
  if plan.causal and j == r and plan.qlens[j] > 0 then
    -- the rank's own keys: its chunks are in sequence order in both layouts, so what its rows see of them
    -- is causal attention over the local sequence itself, one block (zigzag's chunk pairs would be two
    -- diagonal blocks and a full one: three calls, and in the forward their merge)
    return { { qa = 0, ql = plan.qlens[j], ka = 0, kl = plan.klens[j], causal = true } }
  end
  local qc = chunks_of(plan.layout, plan.qlens, r, plan.P)
  local kc = chunks_of(plan.layout, plan.klens, j, plan.P)
  local list = {}
  for _, a in ipairs(qc) do
    for _, b in ipairs(kc) do
      local kind = "full"
      if plan.causal then
        if b.pos + b.len - 1 <= a.pos then kind = "full"
        elseif b.pos > a.pos + a.len - 1 then kind = nil
        else kind = "diag" end -- the same chunk: the plan's causal checks make it square
      end
      if kind and a.len > 0 and b.len > 0 then
        list[#list + 1] = { qa = a.at, ql = a.len, ka = b.at, kl = b.len, causal = kind == "diag" }
      end
    end
  end
  -- join full blocks of the same rows over adjacent keys, then of the same keys over adjacent rows
  for _, pass in ipairs{ { "qa", "ql", "ka", "kl" }, { "ka", "kl", "qa", "ql" } } do
    local sa, sl, ja, jl = pass[1], pass[2], pass[3], pass[4]
    local joined = true
    while joined do
      joined = false
      for x = 1, #list do
        for y = 1, #list do
          local A, B = list[x], list[y]
          local both_full = not A.causal and not B.causal
          if x ~= y and both_full and A[sa] == B[sa] and A[sl] == B[sl] and A[ja] + A[jl] == B[ja] then
            A[jl] = A[jl] + B[jl]
            table.remove(list, y)
            joined = true
            break
          end
        end
        if joined then break end
      end
    end
  end
  return list
end

-- ---------------------------------------------------------- the rotation ----

local TAG_K, TAG_V, TAG_DK, TAG_DV = 1, 2, 3, 4

local function wait_all(reqs)
  for i = 1, #reqs do reqs[i]:wait() end
end

-- The rows (dim -2, a prefix) of rank j's K/V chunk that rank r's queries
-- use: 0 when no block of theirs sees it.
local function rows_used(plan, j, r)
  local n = 0
  for _, b in ipairs(blocks(plan, j, r)) do
    if b.ka + b.kl > n then n = b.ka + b.kl end
  end
  return n
end

-- The rows of rank j's chunk that the rank holding it (at) passes on: the
-- most that a rank still ahead on its way (at + 1, ..., j - 1, cyclically)
-- uses. Along the way the rows used never go down and then up: with
-- contiguous chunks and is_causal the ranks after j use all of it and those
-- before it none; with zigzag the ranks after j use its first half (the
-- second is the sequence's last positions but theirs) and those before it
-- all of it; without is_causal everyone uses all of it. So the most is the
-- first or the last rank's (spec/ring_attention_spec.lua checks every rank
-- for P up to 6). Rank 1's zigzag chunk thus travels as its first half only,
-- and a contiguous chunk stops at the last rank.
local function rows_sent(plan, j, at)
  local P = plan.P
  local first, last = at % P + 1, (j - 2) % P + 1
  if first == j then return 0 end -- it has been everywhere
  local a, b = rows_used(plan, j, first), rows_used(plan, j, last)
  return a > b and a or b
end

-- The rows of rank j's chunk that rank `at` holds once it has come there.
local function rows_held(plan, j, at)
  if at == j then return plan.klens[j] end
  return rows_sent(plan, j, (at - 2) % plan.P + 1)
end

-- s with dim -2 set to n.
local function with_rows(s, n)
  local t = { table.unpack(s) }
  t[#t - 1] = n
  return t
end

-- The messages of a hop of `rows` rows of a chunk of which the sender holds
-- `held`: t is the sender's tensor (held rows) or the receiver's (rows
-- rows), contiguous. All of what is held goes as one message; a prefix of
-- it (the part the ranks ahead use) as one message per leading index, each
-- a contiguous [rows, E] run sent from where it lies and received into its
-- place (no packing copy on either side), unless they are many (more than
-- MAX_PIECES) or small (under MIN_PIECE floats, where a message costs more
-- than its copy): then packed into one (a copy by the sender).
local MAX_PIECES, MIN_PIECE = 64, 4096

local function hop_pieces(t, rows, held, sending)
  if rows == held then return { t } end
  local e = t:size(-1)
  local n = t:size(-2)
  local g = n * e > 0 and t:numel() // (n * e) or 0
  if g > MAX_PIECES or g == 0 or rows * e < MIN_PIECE then
    return { sending and t:narrow(-2, 1, rows):contiguous() or t }
  end
  local v = t:view(g, n, e)
  local list = {}
  for i = 1, g do list[i] = v:select(1, i):narrow(1, 1, rows) end
  return list
end

-- The receiving tensors of a hop, kept between calls (per ring, that is per
-- communicator: plan.pool): K and V land in memory that is already mapped,
-- instead of tensors zeroed and paged in on every call (for B_causal's 2 x 4
-- MiB, 0.8 ms of a rank's 72 here). Three slots in turn: the chunk computed
-- on, the next one arriving, and the one before, whose send may be under way;
-- a K and a V tensor per slot, for the forward and for the backward.
local function recv_buffer(plan, slot, shape)
  local t = plan.pool[slot]
  if t == nil or not same(t:size(), shape) then
    t = attn.empty(shape)
    plan.pool[slot] = t
  end
  return t
end

-- The K/V rotation of one call: rot.held_slot is the slot of the chunk held
-- (0: the rank's own k and v), rot.sends[slot] the sends still reading it;
-- rot.trim: hops carry only the rows the ranks ahead use (the forward),
-- else whole chunks (the backward, whose dK/dV follow the whole chunk).
local function new_rotation(trim)
  return { held_slot = 0, sends = {}, trim = trim }
end

local function post_all(list, op, pieces, peer, tag)
  for i = 1, #pieces do list[#list + 1] = op(pieces[i], peer, tag) end
end

-- Post step s's hop of the chunk (kc, vc) held (rank j's) to the next rank
-- and of the next one (rank j - 1's) from the previous rank; returns the
-- receives and their tensors (nil when nothing of it comes: nobody on its
-- way uses it). The receives are posted first and only they are waited for
-- before the next step: a send completes once the next rank has taken the
-- data (over shared memory the receiver copies it inside its own MPI call),
-- so waiting for it there would tie this rank to the next one's progress;
-- sends are waited for when their buffer is to be reused and at the end of
-- the call (finish_rotation).
local function rotate(plan, rot, s, j, kc, vc)
  local P, r, comm = plan.P, plan.r, plan.comm
  local nxt, prv = r % P + 1, (r - 2) % P + 1
  local src = (j - 2) % P + 1
  local slot = s % 3 + 1
  local busy = rot.sends[slot]
  if busy then
    wait_all(busy)
    rot.sends[slot] = nil
  end
  local recvs, nk, nv = {}, nil, nil
  local n_in = rot.trim and rows_sent(plan, src, prv) or plan.klens[src]
  if n_in > 0 or not rot.trim then
    local held_in = rot.trim and rows_held(plan, src, prv) or n_in
    -- the backward's buffers apart from the forward's (whose hops may be trimmed): neither reshapes the other's
    local base = rot.trim and 0 or 6
    nk = recv_buffer(plan, base + 2 * slot - 1, with_rows(plan.kshapes[src], n_in))
    nv = recv_buffer(plan, base + 2 * slot, with_rows(plan.vshapes[src], n_in))
    post_all(recvs, comm.irecv, hop_pieces(nk, n_in, held_in, false), prv, TAG_K)
    post_all(recvs, comm.irecv, hop_pieces(nv, n_in, held_in, false), prv, TAG_V)
  end
  local n_out = rot.trim and rows_sent(plan, j, r) or plan.klens[j]
  if n_out > 0 or not rot.trim then
    local held = rot.trim and rows_held(plan, j, r) or n_out
    local sends = rot.sends[rot.held_slot] or {}
    rot.sends[rot.held_slot] = sends
    post_all(sends, comm.isend, hop_pieces(kc, n_out, held, true), nxt, TAG_K)
    post_all(sends, comm.isend, hop_pieces(vc, n_out, held, true), nxt, TAG_V)
  end
  rot.held_slot = slot
  return recvs, nk, nv
end

-- Wait for every send of the rotation (the caller's k and v among them).
local function finish_rotation(rot)
  for slot = 0, 3 do
    if rot.sends[slot] then wait_all(rot.sends[slot]) end
    rot.sends[slot] = nil
  end
end

-- Merge a partial result (o, l) into the running one (acc_o, acc_l), rows
-- in place: lse = logsumexp(acc_l, l), out = (e^(acc_l - lse) acc_o + e^(l -
-- lse) o). Rows with no visible key on either side stay zero with lse -inf
-- (the max is taken as 0 there, so no -inf - -inf). One pass in C
-- (src/core/lse_merge.c): the same arithmetic as the tensor ops it stands
-- for, without their dozen temporaries. The forward has the kernel do this
-- merge instead (core._sdpa_resume); this pass is the merge's definition
-- the specs check (M._merge_into).
local function merge_into(acc_o, acc_l, o, l)
  core._lse_merge(acc_o, acc_l, o, l)
end

-- The forward on this rank: its output chunk and log-sum-exp.
local function forward(plan, q, k, v)
  local P, r = plan.P, plan.r
  local kc, vc = k:contiguous(), v:contiguous()
  local out, lse
  local written = {} -- the row ranges {a, b} (local, 0-based, [a, b)) that hold a partial result
  local opts = { return_lse = true, scale = plan.scale }
  local rot = new_rotation(true)
  for s = 0, P - 1 do
    local j = (r - 1 - s) % P + 1
    local reqs, nk, nv
    if s < P - 1 then reqs, nk, nv = rotate(plan, rot, s, j, kc, vc) end
    for _, b in ipairs(blocks(plan, j)) do
      local qb, kb, vb = q:narrow(-2, b.qa + 1, b.ql), kc:narrow(-2, b.ka + 1, b.kl), vc:narrow(-2, b.ka + 1, b.kl)
      local fresh = true
      for _, w in ipairs(written) do
        if w[1] < b.qa + b.ql and b.qa < w[2] then fresh = false end
      end
      written[#written + 1] = { b.qa, b.qa + b.ql }
      if not fresh then
        -- the fused kernel merges the block into the rows' running result itself: its online softmax starts
        -- from them (the merge of src/core/lse_merge.h without the block's own out and lse)
        core._sdpa_resume(qb, kb, vb, out:narrow(-2, b.qa + 1, b.ql), lse:narrow(-1, b.qa + 1, b.ql), b.causal,
          plan.scale)
      else
        opts.is_causal = b.causal
        local o, l = attn.scaled_dot_product_attention(qb, kb, vb, opts)
        if out == nil and b.ql == plan.qlens[r] then
          -- the first partial covers every row: it is the result so far (fresh tensors of the call's own)
          out, lse = o, l
        else
          if out == nil then
            local os = o:size()
            os[#os - 1] = plan.qlens[r]
            out = attn.zeros(os)
            local ls = { table.unpack(os, 1, #os - 1) }
            lse = attn.full(ls, NEG_INF)
          end
          -- the rows' first partial is their result so far
          out:narrow(-2, b.qa + 1, b.ql):copy_(o)
          lse:narrow(-1, b.qa + 1, b.ql):copy_(l)
        end
      end
    end
    if reqs then wait_all(reqs); kc, vc = nk, nv end
  end
  finish_rotation(rot)
  if out == nil then
    -- no visible block at all (an empty chunk): zeros of sdpa's result shape
    local o = attn.scaled_dot_product_attention(q, k, v, { scale = plan.scale })
    out = attn.zeros(o:size())
    lse = attn.full({ table.unpack(o:size(), 1, o:dim() - 1) }, NEG_INF)
  end
  return out, lse
end

-- The backward on this rank, given the global out and lse of its rows
-- (FlashAttention-2's backward per block: P = exp(S - lse), D = rowsum(dout *
-- out), each block's share of dq, dk, dv exactly as the whole call's).
local function backward(plan, q, k, v, out, lse, dout)
  local P, r = plan.P, plan.r
  local comm = plan.comm
  local nxt, prv = r % P + 1, (r - 2) % P + 1
  local kc, vc = k:contiguous(), v:contiguous()
  local lse_c = lse:contiguous()
  local dq = attn.zeros(q:size())
  local sends = {}
  local opts = { kernel = "flash", scale = plan.scale }
  local dk_own, dv_own
  local rot = new_rotation(false)
  for s = 0, P - 1 do
    local j = (r - 1 - s) % P + 1
    -- the dK/dV of chunk j so far, from the previous rank
    local acc_reqs, dk_in, dv_in
    if s > 0 then
      dk_in, dv_in = attn.empty(plan.kshapes[j]), attn.empty(plan.vshapes[j])
      acc_reqs = { comm.irecv(dk_in, prv, TAG_DK), comm.irecv(dv_in, prv, TAG_DV) }
    end
    local reqs, nk, nv
    if s < P - 1 then reqs, nk, nv = rotate(plan, rot, s, j, kc, vc) end
    local dk, dv = attn.zeros(plan.kshapes[j]), attn.zeros(plan.vshapes[j])
    for _, b in ipairs(blocks(plan, j)) do
      opts.is_causal = b.causal
      local rows = function(t) return t:narrow(-2, b.qa + 1, b.ql) end
      local cols = function(t) return t:narrow(-2, b.ka + 1, b.kl) end
      local bl = lse_c:narrow(-1, b.qa + 1, b.ql):contiguous()
      local dqb, dkb, dvb = sdpa_backward(rows(dout), rows(q), cols(kc), cols(vc), rows(out), bl, opts)
      rows(dq):add_(dqb)
      cols(dk):add_(dkb)
      cols(dv):add_(dvb)
    end
    if acc_reqs then
      wait_all(acc_reqs)
      dk:add_(dk_in)
      dv:add_(dv_in)
    end
    wait_all(sends) -- the previous step's accumulators have left: their buffers may go
    sends = { comm.isend(dk, nxt, TAG_DK), comm.isend(dv, nxt, TAG_DV) }
    if reqs then wait_all(reqs); kc, vc = nk, nv end
  end
  -- the last hop brings each chunk's finished dK/dV home
  dk_own, dv_own = attn.empty(plan.kshapes[r]), attn.empty(plan.vshapes[r])
  wait_all{ comm.irecv(dk_own, prv, TAG_DK), comm.irecv(dv_own, prv, TAG_DV) }
  wait_all(sends)
  finish_rotation(rot)
  return dq, dk_own, dv_own
end

-- --------------------------------------------------------- the public API ----

local OPTIONS = { is_causal = true, scale = true, layout = true }

local function check_args(q, k, v, opts)
  for i, t in ipairs{ { "q", q }, { "k", k }, { "v", v } } do
    if not is_tensor(t[2]) then
      caller.error(("%s: bad argument #%d '%s' (expected attn.Tensor, got %s)"):format(FN, i, t[1], type(t[2])))
    end
    if t[2]:dim() < 2 then
      caller.error(("%s: bad argument #%d '%s' (expected [..., n, E] with at least 2 dims, got %s)"):format(FN, i,
        t[1], shape_str(t[2]:size())))
    end
    if t[2]:dim() > 8 then
      caller.error(("%s: bad argument #%d '%s' (expected at most 8 dims, got %d)"):format(FN, i, t[1], t[2]:dim()))
    end
  end
  if q:size(-1) ~= k:size(-1) then
    caller.error(("%s: bad arguments 'q', 'k' (expected the same size in dim -1 (E), got %s and %s)"):format(FN,
      shape_str(q:size()), shape_str(k:size())))
  end
  if k:size(-2) ~= v:size(-2) then
    caller.error(("%s: bad arguments 'k', 'v' (expected the same size in dim -2 (the sequence), got %s and %s)")
      :format(FN, shape_str(k:size()), shape_str(v:size())))
  end
  if opts ~= nil and (type(opts) ~= "table" or is_tensor(opts)) then
    caller.error(("%s: bad argument #4 'opts' (expected a table of options or nil, got %s)"):format(FN,
      is_tensor(opts) and "attn.Tensor" or type(opts)))
  end
  opts = opts or {}
  for key in pairs(opts) do
    if not OPTIONS[key] then
      caller.error(("%s: bad option '%s' (expected is_causal, scale or layout)"):format(FN, tostring(key)))
    end
  end
  if opts.is_causal ~= nil and type(opts.is_causal) ~= "boolean" then
    caller.error(("%s: bad option 'is_causal' (expected a boolean, got %s)"):format(FN, type(opts.is_causal)))
  end
  if opts.scale ~= nil and (type(opts.scale) ~= "number" or opts.scale ~= opts.scale) then
    caller.error(("%s: bad option 'scale' (expected a number, got %s)"):format(FN, tostring(opts.scale)))
  end
  local layout = opts.layout or "contiguous"
  if not LAYOUTS[layout] then
    caller.error(("%s: bad option 'layout' (expected \"contiguous\" or \"zigzag\", got %s)"):format(FN,
      type(layout) == "string" and ("%q"):format(layout) or type(layout)))
  end
  return opts.is_causal == true, opts.scale, layout
end

--- The ring functions over one communicator.
-- @param comm the communicator (see the module's description)
-- @return table with ring_attention, zigzag_split, zigzag_merge
function M.new(comm)
  local R = {}
  local pool = {} -- the receiving tensors kept between calls (recv_buffer)

  local recorded = autograd.Function{
    name = "RingAttentionBackward",
    fname = FN,
    raw = function(q, k, v, plan) return (forward(plan, q, k, v)) end,
    forward = function(ctx, q, k, v, plan)
      local out, lse = forward(plan, q, k, v)
      ctx:save_for_backward(q, k, v, out, lse)
      ctx.plan = plan
      return out
    end,
    backward = function(ctx, g)
      local q, k, v, out, lse = ctx:saved()
      local dq, dk, dv = backward(ctx.plan, q, k, v, out, lse, g)
      -- every rank runs the whole backward (its neighbours need its part of
      -- the ring); the gradients it was not asked for are dropped here
      local need = ctx.needs_input_grad
      return need[1] and dq or nil, need[2] and dk or nil, need[3] and dv or nil
    end,
  }

  -- dist.ring_attention (documented at the end of the file)
  function R.ring_attention(q, k, v, opts)
    local causal, scale, layout = check_args(q, k, v, opts)
    local plan = make_plan(comm, pool, q, k, v, causal, scale, layout)
    return recorded(q, k, v, plan)
  end

  local function split_dim(x, dim, fname, what)
    if not is_tensor(x) then
      caller.error(("%s: bad argument #1 '%s' (expected attn.Tensor, got %s)"):format(fname, what, type(x)))
    end
    if math.type(dim) ~= "integer" or dim == 0 or dim > x:dim() or dim < -x:dim() then
      caller.error(("%s: bad argument #2 'dim' (expected an integer dim of a %d-dim tensor, got %s)"):format(fname,
        x:dim(), tostring(dim)))
    end
    return dim < 0 and dim + x:dim() + 1 or dim
  end

  -- dist.zigzag_split
  function R.zigzag_split(x, dim)
    local fname = "dist.zigzag_split"
    dim = split_dim(x, dim, fname, "x")
    local P, r = comm.world_size(), comm.rank()
    local n = x:size(dim)
    if n % (2 * P) ~= 0 then
      caller.error(("%s: bad argument #1 'x' (expected dim %d divisible by 2 * world size = %d, got %d)"):format(fname,
        dim, 2 * P, n))
    end
    local c = n // (2 * P)
    return attn.cat({ x:narrow(dim, (r - 1) * c + 1, c), x:narrow(dim, (2 * P - r) * c + 1, c) }, dim)
  end

  -- dist.zigzag_merge: parts is a tensor [P, ...] or a list of P tensors; dim is a dim of a part
  function R.zigzag_merge(parts, dim)
    local fname = "dist.zigzag_merge"
    local P = comm.world_size()
    local list
    if is_tensor(parts) then
      if parts:dim() < 2 or parts:size(1) ~= P then
        caller.error(("%s: bad argument #1 'parts' (expected [world size = %d, ...], got %s)"):format(fname, P,
          shape_str(parts:size())))
      end
      list = {}
      for i = 1, P do list[i] = parts:select(1, i) end
    elseif type(parts) == "table" and #parts == P then
      list = parts
    else
      caller.error(("%s: bad argument #1 'parts' (expected a tensor [%d, ...] or a list of %d tensors, got %s)")
        :format(fname, P, P, type(parts) == "table" and ("a list of " .. #parts) or type(parts)))
    end
    dim = split_dim(list[1], dim, fname, "parts")
    local n2 = list[1]:size(dim)
    for i = 1, P do
      if not is_tensor(list[i]) or not same(list[i]:size(), list[1]:size()) or n2 % 2 ~= 0 then
        caller.error(("%s: bad argument #1 'parts' (expected %d parts of one shape, even in dim %d; part %d is %s)")
          :format(fname, P, dim, i, is_tensor(list[i]) and shape_str(list[i]:size()) or type(list[i])))
      end
    end
    local c = n2 // 2
    local pieces = {}
    for i = 1, P do pieces[i] = list[i]:narrow(dim, 1, c) end
    for i = 1, P do pieces[P + i] = list[P + 1 - i]:narrow(dim, c + 1, c) end
    return attn.cat(pieces, dim)
  end

  return R
end

--- Put ring_attention, zigzag_split and zigzag_merge into the module table
-- `dist` (attn.dist), which is their communicator.
-- @param dist the attn.dist table
function M.install(dist)
  local R = M.new(dist)
  dist.ring_attention, dist.zigzag_split, dist.zigzag_merge = R.ring_attention, R.zigzag_split, R.zigzag_merge
end

-- for the specs: the schedule of a plan, and the merge
M._blocks, M._merge_into, M._rows_used, M._rows_sent = blocks, merge_into, rows_used, rows_sent

--- @submodule attn.dist

--- Attention over a sequence held in chunks by the ranks: each rank passes
-- its chunk of dim -2 of q, k and v and gets its chunk of the output, equal to
-- attn.scaled_dot_product_attention on the whole sequence; differentiable
-- (every rank must run the backward). Every rank makes the same call (sizes
-- but dim -2, options, autograd), else every rank raises the same error.
-- layout "zigzag": rank r holds chunks r and 2P + 1 - r of 2P
-- (dist.zigzag_split), which balances causal work across the ranks.
-- @param q [..., n_r, E] this rank's queries
-- @param k [..., n_r, E] this rank's keys
-- @param v [..., n_r, Ev] this rank's values
-- @param[opt] opts {is_causal = false, scale = 1/sqrt(E), layout = "contiguous" or "zigzag"}
-- @return this rank's chunk of the output [..., n_r, Ev]
-- @function ring_attention

--- This rank's part of a whole tensor in the zigzag layout: chunks r and
-- 2P + 1 - r of 2P along dim, concatenated.
-- @param x the whole tensor (its size in dim a multiple of 2P)
-- @param dim the dim to split
-- @function zigzag_split

--- The whole tensor from every rank's zigzag part, in order.
-- @param parts a tensor [P, ...] (as dist.all_gather gives) or a list of P parts
-- @param dim the split dim, as a dim of a part
-- @function zigzag_merge

return M
