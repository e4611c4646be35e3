-- A hostile environment: children run
-- spec/fixtures/hostile_env_child.lua (every parallel region of the core at a
-- size where it splits: elementwise, matmul, softmax, both attention kernels,
-- module forwards, dropout) under one variable each. None may crash or hang,
-- and the .npy files they save must be byte-identical to a 1-thread run's.
-- OMP_NUM_THREADS=100000 crashed inside attn_foreach and 20000 made an add
-- hundreds of times slower before every region took its team size from
-- attn_threads_for.
local attn = require "attn"
require "attn.assert"

local CHILD = "spec/fixtures/hostile_env_child.lua"

local dirs = {}
local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir " .. d))
  dirs[#dirs + 1] = d
  return d
end

-- Runs the child with `env` (shell assignments) into a fresh directory;
-- returns the directory, the child's output and its wall time in seconds.
local function run_child(env)
  local d = tmpdir()
  local cmd = ("s=$(date +%%s%%N); env %s timeout 120 scripts/attn-lua %s %s 2>&1; echo \"rc=$?\"; "
    .. "echo \"ms=$(( ($(date +%%s%%N) - s) / 1000000 ))\""):format(env, CHILD, d)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return d, out, tonumber(out:match("ms=(%d+)")) / 1000
end

local NAMES = { "add", "add_broadcast", "long_row", "inplace", "softmax", "sum", "matmul", "matmul_batched", "math",
  "math_causal", "flash", "flash_causal", "sdpa_dropout", "dropout", "randn", "CausalAttention",
  "MultiHeadAttentionWrapper", "MultiHeadAttention", "MultiHeadAttention_train" }

local function read_file(path)
  local f = assert(io.open(path, "rb"), "missing " .. path)
  local s = f:read("a")
  f:close()
  return s
end

-- Variables that must change no bit (each alone, or a few together).
local SAME_BITS = {
  "OMP_NUM_THREADS=100000", "OMP_NUM_THREADS=20000", "OMP_NUM_THREADS=0", "OMP_NUM_THREADS=-1",
  "OMP_NUM_THREADS=garbage", "OMP_NUM_THREADS=", "OMP_NUM_THREADS=100000,4", "OMP_NUM_THREADS=2",
  "OMP_STACKSIZE=1", "OMP_STACKSIZE=garbage", "OPENBLAS_NUM_THREADS=100000", "OMP_DYNAMIC=true",
  "OMP_PROC_BIND=spread", "OMP_PROC_BIND=garbage", "GOMP_SPINCOUNT=infinite", "GOMP_SPINCOUNT=0",
  "MALLOC_ARENA_MAX=1", "ATTN_NO_MALLOC_TUNING=1", "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1",
  "OMP_THREAD_LIMIT=1", "OMP_WAIT_POLICY=active", "OMP_MAX_ACTIVE_LEVELS=100", "GOMP_CPU_AFFINITY=garbage",
  "OMP_NUM_THREADS=100000 OMP_DYNAMIC=true OPENBLAS_NUM_THREADS=20000",
}

describe("a hostile environment", function()
  local ref, ref_seconds
  setup(function()
    local out
    ref, out, ref_seconds = run_child("OMP_NUM_THREADS=1")
    assert(out:find("END\n", 1, true), "the 1-thread child failed: " .. out)
  end)
  teardown(function()
    for _, d in ipairs(dirs) do os.execute("rm -rf " .. d) end
  end)

  for _, env in ipairs(SAME_BITS) do
    it(env .. ": no crash, no hang, the bits of 1 thread", function()
      local d, out, seconds = run_child(env)
      assert(out:find("END\n", 1, true) and out:find("rc=0", 1, true), env .. ": the child failed: " .. out)
      -- thread start-up must stay small next to the work (20000 threads per add took seconds)
      assert(seconds < 10 * ref_seconds + 5, ("%s: %.2f s, 1 thread %.2f s"):format(env, seconds, ref_seconds))
      for _, name in ipairs(NAMES) do
        assert(read_file(ref .. "/" .. name .. ".npy") == read_file(d .. "/" .. name .. ".npy"),
          env .. ": " .. name .. " differs from the 1-thread result")
      end
    end)
  end

  -- Another OpenBLAS core (or an unknown name: OpenBLAS falls back to a
  -- generic one) rounds sgemm sums in another order: close, not bit-equal.
  it("OPENBLAS_CORETYPE=garbage: a working fallback core, results within float rounding", function()
    local d, out = run_child("OPENBLAS_CORETYPE=garbage OMP_NUM_THREADS=100000")
    assert(out:find("END\n", 1, true), "the child failed: " .. out)
    for _, name in ipairs(NAMES) do
      assert.tensor_near(attn.load(d .. "/" .. name .. ".npy"), attn.load(ref .. "/" .. name .. ".npy"), 1e-4)
    end
  end)
end)
