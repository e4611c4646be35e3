-- attn.dist under Open MPI: the scripts of spec/dist/ run under
-- `mpirun -np 2` and `-np 3` (oversubscribed: this may be a 2-core machine),
-- each printing "rank R ok NAME" or "rank R FAIL NAME: detail" per check.
-- Needs Debian's openmpi-bin and libopenmpi-dev (make deps installs them)
-- and attn built with them (build/attn/dist_core.so): without them every
-- spec here fails, saying so.
local attn = require "attn"

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local build = os.getenv("ATTN_BUILD") or "build"
local have_mpirun = os.execute("command -v mpirun >/dev/null 2>&1")
local have_module = io.open(build .. "/attn/dist_core.so") ~= nil
local function need_mpi()
  assert(have_mpirun, "mpirun is missing: install Debian's openmpi-bin and libopenmpi-dev ('make deps' does)")
  assert(have_module, build .. "/attn/dist_core.so is missing: install Debian's libopenmpi-dev and openmpi-bin "
    .. "('make deps' does), then run 'make'")
end

-- Shared memory only (no network probing; no cross-memory attach, which
-- containers often forbid), no binding to the 2 cores, one thread per rank. make asan's preload stays away from mpirun itself and goes
-- to the ranks (-x), without the leak check there, which would report Open
-- MPI's own allocations.
local preload = os.getenv("LD_PRELOAD")
local SANITIZED_RANKS = ""
if preload and preload ~= "" then
  SANITIZED_RANKS = (" -x LD_PRELOAD=%s -x ASAN_OPTIONS=%s -x UBSAN_OPTIONS=%s"):format(sh_quote(preload),
    sh_quote((os.getenv("ASAN_OPTIONS") or "") .. ":detect_leaks=0"), sh_quote(os.getenv("UBSAN_OPTIONS") or ""))
end
local MPIRUN = "env -u LD_PRELOAD OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none "
  .. "timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none" .. SANITIZED_RANKS .. " -np "

-- exit status, combined output and seconds of an mpirun of the script with args
local function mpirun(np, script, args)
  local t0 = attn.clock()
  local p = assert(io.popen(MPIRUN .. np .. " scripts/attn-lua " .. script .. " " .. (args or "") .. " 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out, attn.clock() - t0
end

-- Every rank printed at least `min` ok lines, and no FAIL line, and the run ended with status 0
local function expect_all_ok(np, script, min)
  local code, out = mpirun(np, script)
  local fails = {}
  for line in out:gmatch("[^\n]+") do
    if line:find("^rank %d+ FAIL ") then fails[#fails + 1] = line end
  end
  assert(#fails == 0, table.concat(fails, "\n") .. "\n--- output:\n" .. out)
  assert.are.equal(0, code, out)
  for q = 1, np do
    local n = 0
    for _ in out:gmatch("rank " .. q .. " ok [^\n]*") do n = n + 1 end
    assert(n >= min, ("rank %d reported %d checks, expected at least %d:\n%s"):format(q, n, min, out))
  end
  return out
end

describe("attn.dist under mpirun", function()
  for _, np in ipairs({2, 3}) do
    it(("every collective, send/recv and isend/irecv against a local computation, -np %d"):format(np), function()
      need_mpi()
      local out = expect_all_ok(np, "spec/dist/collectives.lua", 21)
      -- the sum's bits: the same on every rank, and the same in a second run
      local bits = {}
      for q, b in out:gmatch("rank (%d+) bits ([^\n]+)") do bits[tonumber(q)] = b end
      for q = 1, np do assert.are.equal(bits[1], bits[q]) end
      local again = expect_all_ok(np, "spec/dist/collectives.lua", 21)
      assert.are.equal(bits[1], again:match("rank 1 bits ([^\n]+)"))
    end)

    it(("shapes and calls that differ across ranks raise on every rank; bad arguments name dist.<fn>, -np %d")
      :format(np), function()
      need_mpi()
      expect_all_ok(np, "spec/dist/errors.lua", 20)
    end)

    it(("DistributedDataParallel: the single process's gradients and losses, no_sync, unused parameters, -np %d")
      :format(np), function()
      need_mpi()
      expect_all_ok(np, "spec/dist/ddp.lua", 40)
    end)

    it(("an error on one rank ends the whole job quickly with its message and a non-zero exit, -np %d"):format(np),
      function()
      need_mpi()
      local code, out, seconds = mpirun(np, "spec/dist/fail.lua", tostring(np))
      assert.are_not.equal(0, code, out)
      assert.is_not_nil(out:find("rank " .. np .. " of " .. np .. ": spec/dist/fail.lua:", 1, true), out)
      assert.is_not_nil(out:find("spec failure on purpose", 1, true), out)
      assert.is_nil(out:find("passed the all_reduce", 1, true), out)
      assert(seconds < 30, ("the job took %.1f s to end"):format(seconds))
    end)
  end

  it("scripts/train_gpt.lua: 20 steps on 2 and 3 ranks give the single process's losses within 1e-5", function()
    need_mpi()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. sh_quote(dir)))
    local common = " --config tiny --steps 20 --batch 6 --eval-every 20 --sample 0 --checkpoint "
    local function losses(path)
      local _, meta = attn.load_safetensors(path)
      local out = {}
      for v in meta["extra.train"]:gmatch("[^,]+") do out[#out + 1] = tonumber(v) end
      return out
    end
    local ok = os.execute("OMP_NUM_THREADS=1 scripts/attn-lua scripts/train_gpt.lua" .. common
      .. sh_quote(dir .. "/one.safetensors") .. " >/dev/null 2>&1")
    assert(ok, "the single-process run failed")
    local want = losses(dir .. "/one.safetensors")
    assert.are.equal(20, #want)
    for _, np in ipairs({2, 3}) do
      local path = dir .. "/np" .. np .. ".safetensors"
      local code, out = mpirun(np, "scripts/train_gpt.lua", common .. sh_quote(path))
      assert.are.equal(0, code, out)
      assert.is_not_nil(out:find("on each of " .. np .. " ranks", 1, true), out)
      local got = losses(path)
      assert.are.equal(20, #got)
      for s = 1, 20 do
        assert(math.abs(got[s] - want[s]) <= 1e-5 * math.abs(want[s]),
          ("-np %d step %d: loss %.9g, the single process's %.9g"):format(np, s, got[s], want[s]))
      end
    end
    os.execute("rm -rf " .. sh_quote(dir))
  end)

  it("scripts/train_gpt.lua under mpirun refuses a batch that does not divide by the ranks", function()
    need_mpi()
    local code, out = mpirun(2, "scripts/train_gpt.lua", "--config tiny --steps 1 --batch 5 --sample 0")
    assert.are_not.equal(0, code, out)
    assert.is_not_nil(out:find("--batch 5: the global batch must divide by the 2 ranks", 1, true), out)
  end)
end)

describe("attn.dist without mpirun", function()
  it("require 'attn.dist' without the Open MPI module names the Debian packages", function()
    local p = assert(io.popen("scripts/attn-lua -e " .. sh_quote(
      'require "attn"; package.cpath = ""; package.loaded["attn.dist_core"] = nil; '
      .. 'local ok, err = pcall(require, "attn.dist"); print(ok, err)') .. " 2>&1"))
    local out = p:read("a")
    p:close()
    assert.is_not_nil(out:find("false\tattn.dist needs Open MPI", 1, true), out)
    assert.is_not_nil(out:find("libopenmpi-dev", 1, true), out)
    assert.is_not_nil(out:find("openmpi-bin", 1, true), out)
  end)

  it("make without Open MPI plans everything but dist_core.so; with it, dist_core.so too", function()
    local function plan(vars)
      local p = assert(io.popen("env -u LD_PRELOAD make -n BUILD=/nonexistent/attn-plan " .. vars .. " all 2>&1"))
      local out = p:read("a")
      p:close()
      return out
    end
    local without = plan("MPI_LIBS= MPI_CFLAGS=")
    assert.is_truthy(without:find("/nonexistent/attn-plan/attn/core.so", 1, true), without)
    assert.is_falsy(without:find("dist_core", 1, true), without)
    need_mpi()
    local with = plan("")
    assert.is_truthy(with:find("-o /nonexistent/attn-plan/attn/dist_core.so", 1, true), with)
  end)

  it("scripts/bench_dist.lua refuses an unknown case or a bad --np, naming them, before running anything", function()
    local p = assert(io.popen("scripts/attn-lua scripts/bench_dist.lua --cases train_gpt,nope 2>&1"))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("bench_dist.lua: unknown case nope (known: train_gpt", 1, true), out)
    p = assert(io.popen("scripts/attn-lua scripts/bench_dist.lua --np 0 2>&1"))
    out = p:read("a")
    _, _, code = p:close()
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("--np expects an integer >= 1", 1, true), out)
  end)

  it("dist_core.so exports luaopen_attn_dist_core alone", function()
    need_mpi()
    local p = assert(io.popen("env -u LD_PRELOAD nm -D --defined-only " .. sh_quote(build .. "/attn/dist_core.so")
      .. " 2>&1"))
    local out = p:read("a")
    p:close()
    local names = {}
    for name in out:gmatch("%x+ [A-Z] ([%w_]+)") do names[#names + 1] = name end
    assert.are.same({"luaopen_attn_dist_core"}, names)
  end)

  it("a call before dist.init() says to call it", function()
    need_mpi()
    local p = assert(io.popen("scripts/attn-lua -e " .. sh_quote(
      'local dist = require "attn.dist"; print(pcall(dist.all_reduce, require("attn").zeros(2)))') .. " 2>&1"))
    local out = p:read("a")
    p:close()
    assert.is_not_nil(out:find("false\t[^\n]*dist.all_reduce: call dist.init%(%) first"), out)
  end)
end)
