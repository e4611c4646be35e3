-- The fuzzer (scripts/fuzz.lua) in-process: random careless call sequences
-- for a few seeds must each end without a fuzz failure (every error a
-- non-empty message naming its function), and the message check itself must
-- reject what it is there to catch. Every call kind runs by
-- default (coroutines, long lists, finalizers, wrong selves, overlapping
-- in-place views; FIFOs, swapped files, failed saves and hostile
-- environments in child processes).
local fuzz = require "fuzz"
local attn = require "attn"

describe("scripts/fuzz.lua", function()
  for _, seed in ipairs { 7, 42, 1234 } do
    it("seed " .. seed .. ": 1000 calls, every error names its function", function()
      local lines = {}
      local s = fuzz.run { iterations = 1000, seed = seed, out = function(l) lines[#lines + 1] = l end }
      assert.is_nil(s.failure, s.failure)
      assert.are.equal(1000, s.calls)
      assert.are.equal(s.calls, s.ok + s.errors)
      -- a careless user hits both outcomes often
      assert.is_true(s.ok > 200 and s.errors > 200, ("ok %d, errors %d"):format(s.ok, s.errors))
    end)
  end

  it("is deterministic for a seed", function()
    local a = fuzz.run { iterations = 300, seed = 99 }
    local b = fuzz.run { iterations = 300, seed = 99 }
    local c = fuzz.run { iterations = 300, seed = 100 }
    assert.are.equal(300, #a.outcomes)
    assert.are.equal(a.outcomes, b.outcomes)
    assert.are_not.equal(a.outcomes, c.outcomes)
  end)

  it("flags messages that are not strings, empty, raw Lua errors or lacking the function's name", function()
    local ctx = { "view" }
    assert.truthy(fuzz.bad_message(nil, ctx))
    assert.truthy(fuzz.bad_message({}, ctx))
    assert.truthy(fuzz.bad_message("", ctx))
    assert.truthy(fuzz.bad_message("init.lua:3: attempt to index a nil value (local 'view')", ctx))
    assert.truthy(fuzz.bad_message("x.lua:1: bad argument #1 to 'view' (number expected)", ctx))
    assert.truthy(fuzz.bad_message("attn.reshape: shape [2] is invalid", ctx))
    assert.is_nil(fuzz.bad_message("x.lua:1: Tensor:view: shape [2] is invalid for input of size 5", ctx))
  end)

  it("coroutine kind: 1000 calls inside coroutines below deep Lua stacks, every error names its function", function()
    for _, seed in ipairs { 7, 42 } do
      local s = fuzz.run { iterations = 1000, seed = seed, kinds = "coroutine" }
      assert.is_nil(s.failure, s.failure)
      assert.are.equal(1000, s.by_kind.coroutine)
      assert.is_true(s.ok > 200 and s.errors > 200, ("ok %d, errors %d"):format(s.ok, s.errors))
    end
  end)

  it("env kind: children under hostile environments compute this process's bits", function()
    local s = fuzz.run { iterations = 4, seed = 3, kinds = { "env" }, child_every = 1 }
    assert.is_nil(s.failure, s.failure)
    assert.are.same({ env = 4 }, s.by_kind)
  end)

  it("the default run mixes every kind: in-process kinds each call, child kinds in turn every 150th", function()
    local s = fuzz.run { iterations = 600, seed = 5 }
    assert.is_nil(s.failure, s.failure)
    -- 600 / 150 = 4 child runs, one of each child kind in turn
    for _, k in ipairs { "fifo", "swap", "failsave", "env" } do assert.are.equal(1, s.by_kind[k], k) end
    for _, k in ipairs { "calls", "coroutine", "longlist", "finalizer", "wrongself", "overlap" } do
      assert.is_true((s.by_kind[k] or 0) > 5, k)
    end
  end)

  it("kinds: a list, a comma-separated string or all; an unknown kind is refused by name", function()
    assert.are.same({ env = true, calls = true }, fuzz.parse_kinds("env,calls"))
    assert.are.same({ overlap = true }, fuzz.parse_kinds({ "overlap" }))
    local all = fuzz.parse_kinds("all")
    for _, k in ipairs(fuzz.KINDS) do assert.is_true(all[k], k) end
    assert.are.equal(10, #fuzz.KINDS)
    local set, err = fuzz.parse_kinds("calls,bogus")
    assert.is_nil(set)
    assert.truthy(err:find("unknown kind 'bogus'", 1, true))
    local p = io.popen("scripts/attn-lua scripts/fuzz.lua --iterations 1 --kinds bogus 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("unknown kind 'bogus'", 1, true), out)
    assert.truthy(out:find("rc=2", 1, true), out)
  end)
end)

-- The autograd mode (scripts/lib/fuzz_autograd.lua): random chains of in-place
-- and out-of-place ops on leaves, views and detached aliases must give the
-- loss and gradients of their out-of-place replay, or an attn error.
describe("scripts/fuzz.lua --mode autograd", function()
  for _, seed in ipairs { 7, 42 } do
    it("seed " .. seed .. ": 250 chains, every gradient the replay's or an attn error", function()
      local s = fuzz.run_autograd { iterations = 250, seed = seed }
      assert.is_nil(s.failure, s.failure)
      assert.are.equal(250, s.chains)
      assert.are.equal(s.chains, s.agreed + s.errors)
      -- most chains reach a compared backward; some end in PyTorch's own refusals
      assert.is_true(s.agreed > 150, ("agreed %d of %d"):format(s.agreed, s.chains))
      local refused = 0
      for _, n in pairs(s.errors_by_kind) do refused = refused + n end
      assert.is_true(refused > 20, "in-place steps refused: " .. refused)
    end)
  end

  it("is deterministic for a seed", function()
    local a = fuzz.run_autograd { iterations = 80, seed = 3 }
    local b = fuzz.run_autograd { iterations = 80, seed = 3 }
    local c = fuzz.run_autograd { iterations = 80, seed = 4 }
    assert.are.equal(80, #a.outcomes)
    assert.are.equal(a.outcomes, b.outcomes)
    assert.are.same(a.errors_by_kind, b.errors_by_kind)
    assert.are_not.same({ a.outcomes, a.errors_by_kind }, { c.outcomes, c.errors_by_kind })
  end)

  it("reports a wrong gradient: mul_ with a backward that forgets the factor", function()
    local orig = attn.Tensor.mul_
    attn.Tensor.mul_ = attn.autograd.Function { name = "MulBackward0", fname = "Tensor:mul_", dirty = true,
      forward = function(_, t, o) return orig(t, o) end,
      backward = function(_, g) return g, nil end }
    local ok, s = pcall(fuzz.run_autograd, { iterations = 400, seed = 7 })
    attn.Tensor.mul_ = orig
    assert.is_true(ok, s)
    assert.truthy(s.failure, "no finding")
    assert.truthy(s.failure:find("gradient element", 1, true), s.failure)
    assert.truthy(s.failure:find(":mul_(", 1, true), s.failure)
    assert.truthy(s.failure:find("--mode autograd --seed 7 --iterations", 1, true), s.failure)
  end)

  it("reports a raw Lua error from a step as a finding", function()
    local orig = attn.Tensor.tanh
    attn.Tensor.tanh = function() local t = nil; return t.x end
    local ok, s = pcall(fuzz.run_autograd, { iterations = 200, seed = 7 })
    attn.Tensor.tanh = orig
    assert.is_true(ok, s)
    assert.truthy(s.failure and s.failure:find("raw Lua error", 1, true), s.failure)
  end)

  it("emit_torch writes the chains as a PyTorch script (compared chains and refused backwards)", function()
    local path = os.tmpname()
    local s = fuzz.run_autograd { iterations = 60, seed = 7, emit_torch = path }
    assert.is_nil(s.failure, s.failure)
    local f = assert(io.open(path))
    local py = f:read("a")
    f:close()
    os.remove(path)
    assert.truthy(py:find("^# Written by scripts/fuzz.lua %-%-mode autograd %-%-emit%-torch"), py:sub(1, 200))
    local defs, compares, refusals = 0, 0, 0
    for _ in py:gmatch("\ndef chain%d+%(%):") do defs = defs + 1 end
    for _ in py:gmatch("\ncompare%(%d+, chain%d+, %[") do compares = compares + 1 end
    for _ in py:gmatch("\nrefused%(%d+, chain%d+, \"") do refusals = refusals + 1 end
    assert.are.equal(defs, compares + refusals)
    assert.are.equal(s.errors, refusals)
    assert.is_true(compares > 20, "compared chains: " .. compares)
    assert.truthy(py:find("print%(dict%(tally%)%)\n$"))
  end)

  it("the command line: --mode autograd prints the summary and exits 0", function()
    local p = io.popen("scripts/attn-lua scripts/fuzz.lua --mode autograd --seed 5 --iterations 40 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("fuzz --mode autograd: 40 chains", 1, true), out)
    assert.truthy(out:find("rc=0", 1, true), out)
  end)
end)
