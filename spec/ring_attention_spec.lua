-- Ring attention (lua/attn/dist/ring.lua) on a simulated ring of P ranks in
-- one process (spec/dist/sim_ring.lua): forward and backward against the
-- whole sequence's scaled_dot_product_attention, both layouts, causal and
-- not; the errors every rank raises alike; the zigzag helpers; the causal
-- balance of zigzag; the overlap of communication with computation. The same
-- checks run under mpirun in spec/dist/ring_check.lua.
local attn = require "attn"
local ring = require "attn.dist.ring"
local core = require "attn.core"
local S = dofile("spec/dist/sim_ring.lua")
local K = dofile("spec/dist/ring_cases.lua")

-- a communicator that only knows where it is (for the zigzag helpers)
local function at(r, P)
  return ring.new({ rank = function() return r end, world_size = function() return P end })
end

describe("ring attention on a simulated ring", function()
  for _, P in ipairs{ 1, 2, 3, 4 } do
    for _, c in ipairs(K.cases(P)) do
      it(("P = %d, %s: output and gradients of q, k, v equal the whole sequence's within 2e-6"):format(P, c.name),
        function()
          local res = S.run(P, function(comm, r) return K.check(ring.new(comm), r, P, c) end)
          for r = 1, P do
            for _, what in ipairs{ "out", "dq", "dk", "dv" } do
              local e = res[r][1][what]
              assert(e <= K.RTOL, ("rank %d: %s off by %.3g relative"):format(r, what, e))
            end
          end
        end)
    end
  end

  it("a call without grad records nothing and gives the same output", function()
    local res = S.run(2, function(comm)
      local R = ring.new(comm)
      attn.manual_seed(5)
      local q, k, v = attn.randn(2, 6, 4), attn.randn(2, 6, 4), attn.randn(2, 6, 4)
      local a = R.ring_attention(q, k, v, { is_causal = true })
      local b = attn.no_grad(function()
        return R.ring_attention(q:clone():requires_grad_(), k, v, { is_causal = true })
      end)
      return a, b
    end)
    for r = 1, 2 do
      assert.is_nil(res[r][1].grad_fn)
      assert.is_nil(res[r][2].grad_fn)
      assert.is_true(res[r][1]:equal(res[r][2]))
    end
  end)

  it("records one node, RingAttentionBackward, and only the gradients asked for", function()
    local res = S.run(2, function(comm)
      local R = ring.new(comm)
      local q, k, v = attn.randn(1, 4, 4):requires_grad_(), attn.randn(1, 4, 4), attn.randn(1, 4, 4)
      local o = R.ring_attention(q, k, v)
      o:sum():backward()
      return o.grad_fn:name(), q.grad ~= nil, k.grad, v.grad
    end)
    for r = 1, 2 do
      assert.equal("RingAttentionBackward", res[r][1])
      assert.is_true(res[r][2])
      assert.is_nil(res[r][3])
      assert.is_nil(res[r][4])
    end
  end)
end)

describe("ring attention's errors", function()
  local function fails(P, fn, pattern)
    local ok, err = pcall(S.run, P, function(comm, r) return fn(ring.new(comm), r) end)
    assert.is_false(ok, "expected an error")
    assert.truthy(tostring(err):find(pattern, 1, true), tostring(err))
  end

  it("shapes that differ across ranks are the same error on every rank, not a hang", function()
    -- every rank reaches the verdict from the gathered shapes: rank 2 raises
    -- it too (the simulation reports the first rank's error; both are checked)
    for _, bad_rank in ipairs{ 1, 2 } do
      local errs = {}
      pcall(S.run, 2, function(comm, r)
        local R = ring.new(comm)
        local h = r == bad_rank and 3 or 2
        local ok, e = pcall(R.ring_attention, attn.randn(h, 4, 8), attn.randn(h, 4, 8), attn.randn(h, 4, 8))
        errs[r] = not ok and e or false
      end)
      for r = 1, 2 do
        assert.truthy(errs[r] and errs[r]:find("dist.ring_attention: bad argument 'q' (expected the same sizes on "
          .. "every rank but in dim -2", 1, true), tostring(errs[r]))
      end
    end
  end)

  it("options that differ across ranks are refused", function()
    fails(2, function(R, r) return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8),
      { is_causal = r == 1 }) end, "ranks disagree on is_causal")
    fails(2, function(R, r) return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8),
      { layout = r == 1 and "zigzag" or "contiguous" }) end, "ranks disagree on layout")
    fails(2, function(R, r) return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8),
      { scale = r == 1 and 0.5 or nil }) end, "ranks disagree on scale")
    -- a scale of -1 is a scale, not the default
    fails(2, function(R, r) return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8),
      { scale = r == 1 and -1 or nil }) end, "ranks disagree on scale (rank 2: nil, rank 1: -1)")
    fails(2, function(R, r) return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8),
      { scale = r == 1 and 0.5 or 0.25 }) end, "ranks disagree on scale (rank 2: 0.25, rank 1: 0.5)")
  end)

  it("a call recorded for backward on some ranks only is refused (its backward would wait forever)", function()
    fails(2, function(R, r)
      return R.ring_attention(attn.randn(4, 8):requires_grad_(r == 1), attn.randn(4, 8), attn.randn(4, 8))
    end, "ranks disagree on autograd: rank 2 does not record it, rank 1 records it for backward")
    fails(2, function(R, r)
      local q, k, v = attn.randn(4, 8), attn.randn(4, 8):requires_grad_(), attn.randn(4, 8)
      if r == 2 then return attn.no_grad(R.ring_attention, q, k, v) end
      return R.ring_attention(q, k, v)
    end, "ranks disagree on autograd")
  end)

  it("zigzag chunks of unequal or odd sizes are refused", function()
    fails(2, function(R, r)
      local n = r == 1 and 4 or 6
      return R.ring_attention(attn.randn(n, 8), attn.randn(n, 8), attn.randn(n, 8), { layout = "zigzag" })
    end, "layout \"zigzag\": every rank holds two chunks of n / (2 * 2), so dim -2 must be the same even size on "
      .. "every rank; got 4, 6")
    fails(2, function(R)
      return R.ring_attention(attn.randn(3, 8), attn.randn(3, 8), attn.randn(3, 8), { layout = "zigzag" })
    end, "got 3, 3")
  end)

  it("causal q and k chunks of different lengths are refused", function()
    fails(2, function(R)
      return R.ring_attention(attn.randn(4, 8), attn.randn(5, 8), attn.randn(5, 8), { is_causal = true })
    end, "each rank's q and k chunks must cover the same positions: equal sizes in dim -2, got 4 and 5 on rank 1")
  end)

  it("bad arguments name the argument, what was expected and what came", function()
    local R = at(1, 1)
    local t = attn.randn(4, 8)
    local function err(pattern, ...)
      local ok, e = pcall(R.ring_attention, ...)
      assert.is_false(ok)
      assert.truthy(tostring(e):find(pattern, 1, true), tostring(e))
    end
    err("dist.ring_attention: bad argument #2 'k' (expected attn.Tensor, got nil)", t)
    err("bad argument #1 'q' (expected [..., n, E] with at least 2 dims, got [8])", attn.randn(8), t, t)
    err("bad arguments 'q', 'k' (expected the same size in dim -1 (E), got [4, 8] and [4, 7])", t, attn.randn(4, 7), t)
    err("bad arguments 'k', 'v' (expected the same size in dim -2 (the sequence), got [4, 8] and [3, 8])", t, t,
      attn.randn(3, 8))
    err("bad argument #4 'opts' (expected a table of options or nil, got string)", t, t, t, "causal")
    err("bad option 'mask' (expected is_causal, scale or layout)", t, t, t, { mask = t })
    err("bad option 'is_causal' (expected a boolean, got number)", t, t, t, { is_causal = 1 })
    err("bad option 'layout' (expected \"contiguous\" or \"zigzag\", got \"ring\")", t, t, t, { layout = "ring" })
  end)
end)

describe("ring attention's merge by log-sum-exp", function()
  it("rows with no visible key on either side stay zeros with lse -inf, never NaN", function()
    local acc_o, acc_l = attn.zeros(2, 3), attn.full({ 2 }, -math.huge)
    local o, l = attn.tensor{ { 1, 2, 3 }, { 4, 5, 6 } }, attn.tensor{ -math.huge, 0.5 }
    ring._merge_into(acc_o, acc_l, o * 0, l)
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, (acc_o - attn.tensor{ { 0, 0, 0 }, { 0, 0, 0 } }):totable())
    assert.equal(-math.huge, acc_l[1])
    assert.near(0.5, acc_l[2], 1e-7)
    -- a second partial of the same weight: out is the mean, lse grows by log 2
    ring._merge_into(acc_o, acc_l, o, l)
    assert.equal(-math.huge, acc_l[1])
    assert.same({ 0, 0, 0 }, acc_o[1]:totable())
    assert.near(0.5 + math.log(2), acc_l[2], 1e-6)
    assert.near(2, acc_o[2][1], 1e-6)
  end)
end)

describe("zigzag layout", function()
  it("zigzag_split gives rank r chunks r and 2P + 1 - r, zigzag_merge puts the parts back", function()
    local x = attn.arange(1, 13):reshape(1, 12)
    -- P = 3: six chunks of 2: rank 1 holds 1 and 6, rank 2 holds 2 and 5, rank 3 holds 3 and 4
    assert.same({ { 1, 2, 11, 12 } }, at(1, 3).zigzag_split(x, 2):totable())
    assert.same({ { 3, 4, 9, 10 } }, at(2, 3).zigzag_split(x, -1):totable())
    assert.same({ { 5, 6, 7, 8 } }, at(3, 3).zigzag_split(x, 2):totable())
    local parts = {}
    for r = 1, 3 do parts[r] = at(r, 3).zigzag_split(x, 2) end
    assert.is_true(at(1, 3).zigzag_merge(parts, 2):equal(x))
    assert.is_true(at(2, 3).zigzag_merge(attn.stack(parts, 1), -1):equal(x))
  end)

  it("zigzag_split and zigzag_merge refuse what they cannot split or merge", function()
    local ok, e = pcall(at(1, 3).zigzag_split, attn.randn(2, 10), 2)
    assert.is_false(ok)
    assert.truthy(e:find("dist.zigzag_split: bad argument #1 'x' (expected dim 2 divisible by 2 * world size = 6, "
      .. "got 10)", 1, true), e)
    ok, e = pcall(at(1, 3).zigzag_split, attn.randn(2, 12), 3)
    assert.is_false(ok)
    assert.truthy(e:find("bad argument #2 'dim' (expected an integer dim of a 2-dim tensor, got 3)", 1, true), e)
    ok, e = pcall(at(1, 3).zigzag_merge, { attn.randn(4), attn.randn(4) }, 1)
    assert.is_false(ok)
    assert.truthy(e:find("dist.zigzag_merge: bad argument #1 'parts' (expected a tensor [3, ...] or a list of 3 "
      .. "tensors, got a list of 2)", 1, true), e)
    ok, e = pcall(at(1, 2).zigzag_merge, { attn.randn(4), attn.randn(6) }, 1)
    assert.is_false(ok)
    assert.truthy(e:find("part 2 is [6]", 1, true), e)
  end)

  it("balances causal work: every rank attends the same number of (query, key) pairs", function()
    for _, P in ipairs{ 2, 3, 4, 5 } do
      local n = 2 * P * 4
      local function work(layout, r)
        local lens = {}
        for j = 1, P do lens[j] = n // P end
        local plan = { P = P, r = r, causal = true, layout = layout, qlens = lens, klens = lens }
        local pairs_ = 0
        for j = 1, P do
          for _, b in ipairs(ring._blocks(plan, j)) do
            pairs_ = pairs_ + (b.causal and b.ql * (b.ql + 1) // 2 or b.ql * b.kl)
          end
        end
        return pairs_
      end
      local total = 0
      for r = 1, P do
        assert.equal(work("zigzag", 1), work("zigzag", r))
        total = total + work("zigzag", r)
      end
      assert.equal(n * (n + 1) // 2, total) -- every visible pair, once
      assert.is_true(work("contiguous", P) > work("contiguous", 1)) -- what zigzag is for
    end
  end)
end)

describe("ring attention's hops carry what the ranks ahead use", function()
  it("the rows passed on are the most any rank still ahead uses (every rank, P up to 6, both layouts)", function()
    for P = 1, 6 do
      for _, layout in ipairs{ "contiguous", "zigzag" } do
        for _, causal in ipairs{ false, true } do
          local lens = {}
          for j = 1, P do lens[j] = (layout == "zigzag" or causal) and 2 * 4 or 3 + j end
          local plan = { P = P, r = 1, causal = causal, layout = layout, qlens = lens, klens = lens }
          for j = 1, P do
            for hop = 0, P - 2 do
              local at = (j - 1 + hop) % P + 1
              local most = 0
              for ahead = hop + 1, P - 1 do
                most = math.max(most, ring._rows_used(plan, j, (j - 1 + ahead) % P + 1))
              end
              assert.equal(most, ring._rows_sent(plan, j, at),
                ("P %d %s causal %s: chunk %d at rank %d"):format(P, layout, tostring(causal), j, at))
            end
          end
        end
      end
    end
  end)

  -- rank 2's receives (numel of each) in a zigzag causal call on 2 ranks of [2, 3, n, e], and the relative error
  local function zigzag_receives(n, e)
    local got = {}
    local ok, res = pcall(S.run, 2, function(comm, r)
      local logged = setmetatable({}, { __index = comm })
      function logged.irecv(t, src, tag)
        if r == 2 then got[#got + 1] = t:numel() end
        return comm.irecv(t, src, tag)
      end
      attn.manual_seed(3)
      local Q, Kt, V = attn.randn(2, 3, n, e), attn.randn(2, 3, n, e), attn.randn(2, 3, n, e)
      local R = ring.new(logged)
      local function part(x) return R.zigzag_split(x, -2) end
      local o = R.ring_attention(part(Q), part(Kt), part(V), { is_causal = true, layout = "zigzag" })
      local want = part(attn.scaled_dot_product_attention(Q, Kt, V, { is_causal = true }))
      return (o - want):abs():max():item() / want:abs():max():item()
    end)
    assert(ok, res)
    assert.is_true(res[1][1] <= 2e-6 and res[2][1] <= 2e-6)
    return got
  end

  it("zigzag, is_causal, 2 ranks: rank 1's K and V reach rank 2 as their first half only", function()
    -- rank 1 holds chunks 1 and 4 of 4 (2 x 64 rows per [b, h] slice); rank 2's queries see chunk 1 only: 64 rows of
    -- each of the 6 slices, one message per slice for K and for V, each received in place
    local got = zigzag_receives(256, 64)
    assert.equal(12, #got)
    for i = 1, 12 do assert.equal(64 * 64, got[i]) end
    -- small slices (4 rows of 8) go packed: one message for K, one for V
    got = zigzag_receives(16, 8)
    assert.same({ 6 * 4 * 8, 6 * 4 * 8 }, got)
  end)
end)

describe("ring attention overlaps communication with computation", function()
  -- rank who's (default 1) calls on a simulated ring of P ranks, logged: "irecv", "isend", "compute", and
  -- "wait irecv" / "wait isend" when a request is waited for; also the tensors it received into
  local function logged_run(P, fn, who)
    who = who or 1
    local events, received, rank_of = {}, {}, {}
    local sdpa, resume = attn.scaled_dot_product_attention, core._sdpa_resume
    attn.scaled_dot_product_attention = function(...)
      if rank_of[coroutine.running()] == who then events[#events + 1] = "compute" end
      return sdpa(...)
    end
    core._sdpa_resume = function(...) -- a block merged into the rows' running result by the kernel
      if rank_of[coroutine.running()] == who then events[#events + 1] = "compute" end
      return resume(...)
    end
    local ok, res = pcall(S.run, P, function(comm, r)
      rank_of[coroutine.running()] = r
      local logged = setmetatable({}, { __index = comm })
      for _, op in ipairs{ "isend", "irecv" } do
        logged[op] = function(t, peer, tag)
          if r == who then
            events[#events + 1] = op
            if op == "irecv" then received[#received + 1] = t end
          end
          local req = comm[op](t, peer, tag)
          return { wait = function()
            if r == who then events[#events + 1] = "wait " .. op end
            return req.wait()
          end }
        end
      end
      return fn(ring.new(logged), r)
    end)
    attn.scaled_dot_product_attention, core._sdpa_resume = sdpa, resume
    assert(ok, res)
    return events, received, res
  end

  it("posts the next chunk's receive, then the current one's send, before computing on it; waits only for the "
    .. "receive before the next step and for the sends at the end", function()
    local events = logged_run(2, function(R)
      return R.ring_attention(attn.randn(4, 8), attn.randn(4, 8), attn.randn(4, 8))
    end)
    assert.same({ "irecv", "irecv", "isend", "isend", "compute", "wait irecv", "wait irecv", "compute", "wait isend",
                  "wait isend" }, events)
  end)

  it("receives into the same tensors call after call, and a second call still equals the whole sequence's",
    function()
      local P, n = 3, 24
      attn.manual_seed(7)
      local Q, Kt, V = attn.randn(2, n, 8), attn.randn(2, n, 8), attn.randn(2, n, 8)
      local Q2 = attn.randn(2, n, 8)
      local want = attn.scaled_dot_product_attention(Q2, Kt, V, { is_causal = true })
      local _, received, res = logged_run(P, function(R, r)
        local function part(x) return R.zigzag_split(x, -2) end
        R.ring_attention(part(Q), part(Kt), part(V), { is_causal = true, layout = "zigzag" })
        return R.ring_attention(part(Q2), part(Kt), part(V), { is_causal = true, layout = "zigzag" })
      end)
      -- two hops of K and V per call: 4 receives each, into the same 4 tensors the second time
      assert.equal(8, #received)
      for i = 1, 4 do assert.is_true(rawequal(received[i], received[i + 4]), "receive " .. i) end
      local parts = {}
      for r = 1, P do parts[r] = res[r][1] end
      local got = ring.new({ rank = function() return 1 end, world_size = function() return P end })
        .zigzag_merge(parts, -2)
      assert.is_true((got - want):abs():max():item() <= 2e-6 * want:abs():max():item())
    end)

  it("the backward's receives do not take the forward's tensors (whose hops are trimmed)", function()
    -- 2 ranks, zigzag, is_causal: rank 2 receives half of rank 1's chunk in the forward, all of it in the backward
    local _, received = logged_run(2, function(R)
      attn.manual_seed(9)
      local q, k, v = attn.randn(2, 8, 4), attn.randn(2, 8, 4), attn.randn(2, 8, 4)
      local opts = { is_causal = true, layout = "zigzag" }
      local o = R.ring_attention(q:clone():requires_grad_(), k, v, opts)
      o:sum():backward()
      R.ring_attention(q, k, v, opts)
    end, 2)
    -- forward: K and V (half); backward: K, V, and dK, dV twice (each step's and the last hop's); forward again
    local first, last = { received[1], received[2] }, { received[#received - 1], received[#received] }
    assert.equal(2 * 4 * 4, first[1]:numel()) -- [2, 4 of 8 rows, 4]
    assert.is_true(rawequal(first[1], last[1]) and rawequal(first[2], last[2]))
  end)
end)

-- The same checks under Open MPI: spec/dist/ring_check.lua on 2 and 3 ranks
-- (oversubscribed: this may be a 2-core machine), launched as spec/dist_spec.lua
-- launches its scripts: shared memory only, one thread per rank, make asan's
-- preload given to the ranks and not to mpirun. Needs Debian's openmpi-bin and
-- libopenmpi-dev (make deps installs them) and build/attn/dist_core.so:
-- without them these specs fail, saying so.
local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local build = os.getenv("ATTN_BUILD") or "build"
local have_mpirun = os.execute("command -v mpirun >/dev/null 2>&1")
local have_module = io.open(build .. "/attn/dist_core.so") ~= nil
local preload = os.getenv("LD_PRELOAD")
local SANITIZED_RANKS = ""
if preload and preload ~= "" then
  SANITIZED_RANKS = (" -x LD_PRELOAD=%s -x ASAN_OPTIONS=%s -x UBSAN_OPTIONS=%s"):format(sh_quote(preload),
    sh_quote((os.getenv("ASAN_OPTIONS") or "") .. ":detect_leaks=0"), sh_quote(os.getenv("UBSAN_OPTIONS") or ""))
end

local function mpirun(np, args)
  assert(have_mpirun, "mpirun is missing: install Debian's openmpi-bin and libopenmpi-dev ('make deps' does)")
  assert(have_module, build .. "/attn/dist_core.so is missing: install Debian's libopenmpi-dev and openmpi-bin "
    .. "('make deps' does), then run 'make'")
  local cmd = ("env -u LD_PRELOAD OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader "
    .. "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 300 mpirun --allow-run-as-root --oversubscribe "
    .. "--bind-to none%s -np %d scripts/attn-lua spec/dist/ring_check.lua %s 2>&1"):format(SANITIZED_RANKS, np,
    args or "")
  local f = io.popen(cmd)
  local out = f:read("a")
  local ok, _, code = f:close()
  return out, ok and 0 or code
end

describe("ring attention under mpirun", function()
  for _, np in ipairs{ 2, 3 } do
    it(("-np %d: every case, forward and backward, equals the whole sequence's within 2e-6 on every rank"):format(np),
      function()
        local out, code = mpirun(np)
        assert.equal(0, code, out)
        local n_cases = #K.cases(np)
        for r = 1, np do
          local seen = 0
          for line in out:gmatch("[^\n]+") do
            if line:find(("ring rank %d/%d "):format(r, np), 1, true) then
              assert.truthy(line:find(" ok$"), line)
              seen = seen + 1
            end
          end
          assert.equal(n_cases, seen, out)
        end
      end)

    it(("-np %d: calls that differ across ranks are an error on every rank, and the ring goes on"):format(np),
      function()
        local out, code = mpirun(np, "errors")
        assert.equal(0, code, out)
        for r = 1, np do
          local function line(what)
            return out:match(("ring rank %d/%d %s[^\n]*"):format(r, np, what:gsub("%p", "%%%0")))
          end
          assert.truthy((line("error shapes: ") or ""):find("dist.ring_attention: bad argument 'q' (expected the "
            .. "same sizes on every rank but in dim -2", 1, true), out)
          assert.truthy((line("error unequal zigzag: ") or ""):find("dim -2 must be the same even size on every "
            .. "rank", 1, true), out)
          assert.truthy((line("error is_causal: ") or ""):find("ranks disagree on is_causal", 1, true), out)
          assert.equal(("ring rank %d/%d after errors: ok"):format(r, np), line("after errors: "), out)
        end
      end)
  end
end)
