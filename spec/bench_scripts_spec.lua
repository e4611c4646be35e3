-- The peers' bench scripts (scripts/bench_ggml.sh, scripts/bench_llmc.sh,
-- scripts/bench_torch.py): only their argument handling, which needs neither
-- ggml, llm.c, cmake nor torch.
-- Each bad call must end quickly with exit status 2 and a message naming what
-- was wrong, before anything is built or imported.
local attn = require "attn"

-- exit code and combined output of a shell command, and the seconds it took;
-- without make asan's sanitizer preload, which would report the leaks of the
-- shells and Python that run the scripts, not attn's
local function run(cmd)
  local t0 = attn.clock()
  local p = assert(io.popen("env -u LD_PRELOAD " .. cmd .. " 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out, attn.clock() - t0
end

local function make_dir()
  local p = assert(io.popen("mktemp -d"))
  local dir = p:read("l")
  p:close()
  return dir
end

describe("scripts/bench_ggml.sh argument handling", function()
  local dirs = {}
  local function temp_dir()
    dirs[#dirs + 1] = make_dir()
    return dirs[#dirs]
  end
  teardown(function()
    for _, dir in ipairs(dirs) do os.execute("rm -rf '" .. dir .. "'") end
  end)

  -- a directory that passes the checkout test (a ggml.h with the function the
  -- script needs), so that the options after it are what gets checked
  local function fake_checkout()
    local dir = temp_dir()
    assert(os.execute("mkdir -p '" .. dir .. "/include' '" .. dir .. "/src/ggml-cpu'"))
    local h = assert(io.open(dir .. "/include/ggml.h", "w"))
    h:write("void ggml_flash_attn_ext_set_prec(void);\n")
    h:close()
    assert(io.open(dir .. "/CMakeLists.txt", "w")):close()
    return dir
  end

  local function expect_usage(cmd, message)
    local code, out, seconds = run(cmd)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("usage: scripts/bench_ggml.sh", 1, true), out)
    assert.truthy(out:find(message, 1, true), "expected '" .. message .. "' in:\n" .. out)
    assert.is_true(seconds < 5, ("took %.1f s"):format(seconds))
  end

  it("without arguments: usage, GGML_DIR missing, exit 2", function()
    expect_usage("scripts/bench_ggml.sh", "GGML_DIR is missing")
  end)

  it("a path that is no directory", function()
    expect_usage("scripts/bench_ggml.sh /nonexistent/ggml", "GGML_DIR '/nonexistent/ggml' is not a directory")
  end)

  it("a directory that is not a ggml checkout (this repository, an empty one)", function()
    expect_usage("scripts/bench_ggml.sh .", "'.' is not a ggml source checkout")
    local empty = temp_dir()
    expect_usage("scripts/bench_ggml.sh " .. empty, "'" .. empty .. "' is not a ggml source checkout")
  end)

  it("a ggml without ggml_flash_attn_ext_set_prec is too old", function()
    local dir = fake_checkout()
    local h = assert(io.open(dir .. "/include/ggml.h", "w"))
    h:write("void ggml_flash_attn_ext(void);\n")
    h:close()
    expect_usage("scripts/bench_ggml.sh " .. dir, "has no ggml_flash_attn_ext_set_prec (too old)")
  end)

  it("bad options, unknown cases and two directories", function()
    local dir = fake_checkout()
    expect_usage("scripts/bench_ggml.sh --cases A,D " .. dir, "unknown case 'D'")
    expect_usage("scripts/bench_ggml.sh --cases mha " .. dir, "unknown case 'mha'")
    expect_usage("scripts/bench_ggml.sh --reps 0 " .. dir, "--reps expects a positive integer, got '0'")
    expect_usage("scripts/bench_ggml.sh --threads two " .. dir, "--threads expects a positive integer, got 'two'")
    expect_usage("scripts/bench_ggml.sh " .. dir .. " --reps", "--reps needs a value")
    expect_usage("scripts/bench_ggml.sh --fast " .. dir, "unknown option '--fast'")
    expect_usage("scripts/bench_ggml.sh " .. dir .. " /tmp", "one GGML_DIR expected, got '" .. dir .. "' and '/tmp'")
  end)
end)

describe("scripts/bench_llmc.sh argument handling", function()
  local dirs = {}
  local function temp_dir()
    dirs[#dirs + 1] = make_dir()
    return dirs[#dirs]
  end
  teardown(function()
    for _, dir in ipairs(dirs) do os.execute("rm -rf '" .. dir .. "'") end
  end)

  -- a directory that passes the checkout test (train_gpt2.c with its TESTING
  -- guard, llmc/utils.h), so that the options after it are what gets checked
  local function fake_checkout(source)
    local dir = temp_dir()
    assert(os.execute("mkdir -p '" .. dir .. "/llmc'"))
    local f = assert(io.open(dir .. "/train_gpt2.c", "w"))
    f:write(source or "#ifndef TESTING\nint main(void) { return 0; }\n#endif\n")
    f:close()
    assert(io.open(dir .. "/llmc/utils.h", "w")):close()
    return dir
  end

  local function expect_usage(cmd, message)
    local code, out, seconds = run(cmd)
    assert.are.equal(2, code, out)
    assert.truthy(out:find("usage: scripts/bench_llmc.sh", 1, true), out)
    assert.truthy(out:find(message, 1, true), "expected '" .. message .. "' in:\n" .. out)
    assert.is_true(seconds < 5, ("took %.1f s"):format(seconds))
  end

  it("without arguments: usage, LLMC_DIR missing, exit 2", function()
    expect_usage("scripts/bench_llmc.sh", "LLMC_DIR is missing")
  end)

  it("a path that is no directory, a directory that is not an llm.c checkout", function()
    expect_usage("scripts/bench_llmc.sh /nonexistent/llm.c", "LLMC_DIR '/nonexistent/llm.c' is not a directory")
    expect_usage("scripts/bench_llmc.sh .", "'.' is not an llm.c source checkout")
    local empty = temp_dir()
    expect_usage("scripts/bench_llmc.sh " .. empty, "'" .. empty .. "' is not an llm.c source checkout")
  end)

  it("a train_gpt2.c whose main is not behind TESTING", function()
    local dir = fake_checkout("int main(void) { return 0; }\n")
    expect_usage("scripts/bench_llmc.sh " .. dir, "has no #ifndef TESTING around its main")
  end)

  it("bad options and two directories", function()
    local dir = fake_checkout()
    expect_usage("scripts/bench_llmc.sh --reps 0 " .. dir, "--reps expects a positive integer, got '0'")
    expect_usage("scripts/bench_llmc.sh --threads two " .. dir, "--threads expects a positive integer, got 'two'")
    expect_usage("scripts/bench_llmc.sh " .. dir .. " --reps", "--reps needs a value")
    expect_usage("scripts/bench_llmc.sh --cases A " .. dir, "unknown option '--cases'")
    expect_usage("scripts/bench_llmc.sh " .. dir .. " /tmp", "one LLMC_DIR expected, got '" .. dir .. "' and '/tmp'")
  end)
end)

describe("scripts/bench_torch.py argument handling", function()
  -- the python3 the README names, else any on PATH
  local python = (os.execute("test -x /usr/bin/python3") and "/usr/bin/python3")
    or (os.execute("command -v python3 >/dev/null 2>&1") and "python3")
  local test = python and it or pending

  test("--help needs no torch and documents the warm-up and the page-fault flag", function()
    local code, out = run(python .. " scripts/bench_torch.py --help")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("--cases", 1, true), out)
    assert.truthy(out:find("until its time is", 1, true), out)
    assert.truthy(out:find("fault_dominated", 1, true), out)
  end)

  test("unknown cases and bad counts are usage errors (exit 2) before torch is imported", function()
    -- a python path where `import torch` fails, to show that these errors come first
    local blocker = make_dir()
    local f = assert(io.open(blocker .. "/torch.py", "w"))
    f:write("raise ImportError('torch must not be imported here')\n")
    f:close()
    local env = "PYTHONPATH='" .. blocker .. "' " .. python .. " scripts/bench_torch.py "
    local code, out = run(env .. "--cases A,C_causal")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("unknown case(s) C_causal", 1, true), out)
    code, out = run(env .. "--reps 0")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("--reps and --threads expect positive integers", 1, true), out)
    code, out = run(env .. "--cases A --reps 1")
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("torch must not be imported here", 1, true), out)
    os.execute("rm -rf '" .. blocker .. "'")
  end)
end)

describe("scripts/gemm_ab.sh", function()
  it("times HEAD's own GEMM against the working tree's at the step's 15 products, same bits", function()
    local code, out = run("scripts/gemm_ab.sh --rounds 1 HEAD")
    assert.are.equal(0, code, out)
    local products = 0
    for _ in out:gmatch("\n%S+ ?%S*%s+%d+x%d+%s+%[") do products = products + 1 end
    assert.are.equal(15, products, out)
    assert.truthy(out:find("same bits in every output", 1, true), out)
    assert.truthy(out:match("all%s+a [%d.]+%s+b [%d.]+ of the FMA loop"), out)
  end)

  it("usage and exit 2 without a revision or with an unknown option", function()
    local code, out = run("scripts/gemm_ab.sh")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("usage: scripts/gemm_ab.sh", 1, true), out)
    code, out = run("scripts/gemm_ab.sh --fast HEAD")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("unknown option --fast", 1, true), out)
  end)
end)

describe("scripts/lib/bench_lines.lua", function()
  it("reads back what it writes: strings with commas and spaces, numbers, booleans", function()
    local L = dofile("scripts/lib/bench_lines.lua")
    local t = { case = "sgemm_peak", cpu_available = "scalar,avx2,avx512", kernel = "g^T x", b = 1, ms = 150.25,
                gflops = 1.5e-3, causal = false }
    local back = L.parse(L.format(t, { "case" }))
    assert.are.same({ case = "sgemm_peak", cpu_available = "scalar,avx2,avx512", kernel = "g^T x", b = 1,
                      ms = 150.2, gflops = 1.5e-3, causal = false }, back)
  end)
end)

describe("scripts/bench.lua", function()
  it("compiles (a merge that breaks the script's syntax fails here, not in a bench run)", function()
    local chunk, err = loadfile("scripts/bench.lua")
    assert.is_function(chunk, err)
  end)
end)

-- a script run by attn's own launcher, in this process's environment (under
-- make asan the sanitizer preload is what the instrumented module needs)
local function run_script(script, args)
  local p = assert(io.popen("scripts/attn-lua scripts/" .. script .. " " .. args .. " 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

describe("scripts/bench_scaling.lua", function()
  local function run_attn(args) return run_script("bench_scaling.lua", args) end

  it("runs bench.lua per thread count and prints one row per case and kernel", function()
    local code, out = run_attn("--threads 1 --cases tiny --reps 1")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("# OpenBLAS core, attn kernel: ", 1, true), out)
    -- sgemm_peak is always added: the reference of the ratio column
    assert.truthy(out:match("\nsgemm_peak sgemm%s+gflops%s+[%d.]+%s+1%.00x%s+1%.00"), out)
    -- so is fma_peak, the reference of the column after the "|"
    assert.truthy(out:match("\nfma_peak %w+%s+gflops%s+[%d.]+%s+1%.00x%s+[%d.]+ | 1%.00\n"), out)
    assert.truthy(out:match("\nsgemm_peak sgemm%s+gflops%s+[%d.]+%s+1%.00x%s+1%.00 | [%d.]+\n"), out)
    assert.truthy(out:match("\ntiny CausalAttention%s+us_per_call%s+[%d.]+%s+1%.00x"), out)
    assert.truthy(out:match("\ntiny MultiHeadAttention%s+us_per_call%s+[%d.]+"), out)
  end)

  it("refuses bad arguments, naming them", function()
    local code, out = run_attn("--threads 0")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("--threads wants counts like 1,2,4; got 0", 1, true), out)
    code, out = run_attn("--bogus 1")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("unknown or incomplete argument --bogus", 1, true), out)
  end)
end)

describe("scripts/bench_pairs.lua", function()
  local function run_attn(args) return run_script("bench_pairs.lua", args) end
  -- a stand-in for the PyTorch side: prints fixed lines (the appended
  -- "--cases ... --reps ..." become the shell's positional parameters)
  local FAKE_TORCH = [[--torch "sh -c 'echo {\\\"case\\\": \\\"tiny\\\", \\\"kernel\\\": \\\"CausalAttention\\\", \\\"ms\\\": 0.05}; ]]
    .. [[echo {\\\"case\\\": \\\"tiny\\\", \\\"kernel\\\": \\\"MultiHeadAttention\\\", \\\"ms\\\": 0.08}' fake"]]

  it("pairs each case's kernels across the two sides and prints the ratio per pair and its median", function()
    local code, out = run_attn("--cases tiny --pairs 3 --reps 1 " .. FAKE_TORCH)
    assert.are.equal(0, code, out)
    assert.truthy(out:find("# 3 pairs, reps 1", 1, true), out)
    -- the attn side's fma_peak, one figure per pair
    assert.truthy(out:match("\n# fma_peak GFLOP/s per pair %(attn side%): [%d.]+ [%d.]+ [%d.]+\n"), out)
    for kernel, torch_ms in pairs({ CausalAttention = 0.05, MultiHeadAttention = 0.08 }) do
      local line = out:match("\ntiny " .. kernel .. "[^\n]*")
      assert.truthy(line, out)
      local nums = {}
      for x in line:gmatch("[%d.]+x?") do nums[#nums + 1] = x end
      -- 3 attn times, 3 torch times, 3 ratios, the median
      assert.are.equal(10, #nums, line)
      local ratios = {}
      for j = 1, 3 do
        assert.are.equal(torch_ms, tonumber(nums[3 + j]), line)
        local expect = torch_ms / tonumber(nums[j])
        assert.near(expect, tonumber(nums[6 + j]), 0.006 * expect + 0.005, line)
        ratios[j] = tonumber(nums[6 + j])
      end
      table.sort(ratios)
      assert.near(ratios[2], tonumber((nums[10]:gsub("x$", ""))), 0.011, line)
    end
  end)

  it("runs the PyTorch side with attn's allocator settings (GLIBC_TUNABLES = the mallopt values of src/binding/lua_attn.c)", function()
    -- the values attn's binding sets, read from its source
    local f = assert(io.open("src/binding/lua_attn.c"))
    local src = f:read("a")
    f:close()
    local mmap_shift = assert(src:match("mallopt%(M_MMAP_THRESHOLD, 32 << (%d+)%)"), "no M_MMAP_THRESHOLD mallopt")
    local trim_shift = assert(src:match("mallopt%(M_TRIM_THRESHOLD, 64 << (%d+)%)"), "no M_TRIM_THRESHOLD mallopt")
    local want = ("glibc.malloc.mmap_threshold=%d:glibc.malloc.trim_threshold=%d"):format(32 << tonumber(mmap_shift),
      64 << tonumber(trim_shift))
    -- a stand-in PyTorch side that reports its GLIBC_TUNABLES as the kernel name of a tiny line
    local fake = os.tmpname()
    local fh = assert(io.open(fake, "w"))
    fh:write([[printf '{"case": "tiny", "kernel": "%s", "ms": 0.05}\n' "$GLIBC_TUNABLES"]], "\n")
    fh:close()
    local code, out = run_attn("--cases tiny --pairs 1 --reps 1 --raw /dev/stdout --torch 'sh " .. fake .. "'")
    os.remove(fake)
    assert.are.equal(0, code, out)
    assert.truthy(out:find('torch {"case": "tiny", "kernel": "' .. want .. '"', 1, true), out)
  end)

  it("refuses bad arguments and a failing side, naming them", function()
    local code, out = run_attn("--pairs 0")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("--pairs wants a positive integer, got 0", 1, true), out)
    code, out = run_attn("--bogus 1")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("unknown or incomplete argument --bogus", 1, true), out)
    code, out = run_attn("--cases 'tiny;rm'")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("--cases wants names like", 1, true), out)
    code, out = run_attn("--cases tiny --pairs 1 --reps 1 --torch false")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("the torch side failed", 1, true), out)
    code, out = run_attn("--cases tiny --pairs 1 --reps 1 --torch true")
    assert.are.equal(1, code, out)
    assert.truthy(out:find("no case was timed by both sides", 1, true), out)
  end)
end)
