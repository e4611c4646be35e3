-- `make install PREFIX=<temp>`: the module in the standard Lua 5.4
-- paths, and the launchers in PREFIX/bin working from another directory with
-- the installed module alone: attn-lua (a script, -e, the REPL) and
-- attn-busted (busted on a user's own specs). Under `make asan` the install
-- copies the sanitized build (ATTN_BUILD).

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

describe("make install PREFIX=<temp>", function()
  local prefix, proj
  local repo = assert(run("pwd")):gsub("\n$", "")

  setup(function()
    local tmp = os.tmpname()
    os.remove(tmp)
    prefix = tmp .. "_attn_install"
    proj = prefix .. "/my project"
    local build = os.getenv("ATTN_BUILD")
    -- make runs without the sanitizer preload of `make asan` (only lua5.4 is meant to carry it)
    local out, ok = run("env -u LD_PRELOAD make -s --no-print-directory install PREFIX=" .. sh_quote(prefix)
      .. (build and (" BUILD=" .. sh_quote(build)) or ""))
    assert(ok, "make install failed:\n" .. out)
    assert(run("mkdir -p " .. sh_quote(proj .. "/spec")))
  end)

  teardown(function()
    if prefix and prefix:match("_attn_install$") then run("rm -rf " .. sh_quote(prefix)) end
  end)

  -- cmd run in the user's project directory, without the repository's paths
  local function in_project(cmd)
    return run("cd " .. sh_quote(proj) .. " && env -u LUA_PATH -u LUA_CPATH -u ATTN_BUILD " .. cmd)
  end

  it("installs the module, its Lua files and both launchers", function()
    for _, f in ipairs { "/lib/lua/5.4/attn/core.so", "/share/lua/5.4/attn/init.lua",
      "/share/lua/5.4/attn/nn/TorchMultiheadAttention.lua", "/share/lua/5.4/attn/tools/repl.lua",
      "/bin/attn-lua", "/bin/attn-busted" } do
      local fh = io.open(prefix .. f)
      assert(fh, "missing " .. prefix .. f)
      fh:close()
    end
  end)

  it("attn-lua runs -e code and scripts from another directory with the installed module", function()
    local out, ok = in_project(sh_quote(prefix .. "/bin/attn-lua")
      .. " -e 'local a = require \"attn\"; print(a.ones(2)); print(package.searchpath(\"attn\", package.path))'")
    assert.is_true(ok, out)
    assert.are.equal("tensor([1., 1.])\n" .. prefix .. "/share/lua/5.4/attn/init.lua\n", out)
    assert.is_nil(out:find(repo, 1, true))
    local f = assert(io.open(proj .. "/hello.lua", "w"))
    f:write('local attn = require "attn"\nprint(attn.eye(2):sum(), ...)\n')
    f:close()
    out, ok = in_project(sh_quote(prefix .. "/bin/attn-lua") .. " hello.lua one two")
    assert.is_true(ok, out)
    assert.are.equal("tensor(2.)\tone\ttwo\n", out)
  end)

  it("installs GPT-2's vocabulary: attn.tokenizer.gpt2() with no dir reads the installed copy", function()
    local out, ok = in_project(sh_quote(prefix .. "/bin/attn-lua")
      .. " -e 'local t = require(\"attn\").tokenizer.gpt2(); print(t.n_vocab, table.concat(t:encode(\"Hello, world\", {base = 0}), \" \"))'")
    assert.is_true(ok, out)
    assert.are.equal("50257\t15496 11 995\n", out)
    for _, f in ipairs { "encoder.json", "vocab.bpe", "LICENSE" } do
      local fh = io.open(prefix .. "/share/lua/5.4/attn/data/gpt2/" .. f)
      assert(fh, "missing " .. f)
      fh:close()
    end
  end)

  it("attn-lua with no arguments is the REPL, help included", function()
    local out, ok = in_project("printf 'x = attn.eye(2)\\nx * 2\\nattn.help(\"transpose\")\\n' | "
      .. sh_quote(prefix .. "/bin/attn-lua"))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("^attn REPL"), out)
    assert.is_truthy(out:find("\ntensor([[2., 0.],\n        [0., 2.]])\nattn.Tensor.transpose\n", 1, true), out)
  end)

  it("installs attn.dist's Open MPI module; the installed attn-lua ends an mpirun job when a rank raises", function()
    assert(os.execute("command -v mpicc >/dev/null && command -v mpirun >/dev/null"),
      "Open MPI is missing: install Debian's libopenmpi-dev and openmpi-bin ('make deps' does)")
    local fh = io.open(prefix .. "/lib/lua/5.4/attn/dist_core.so")
    assert(fh, "missing " .. prefix .. "/lib/lua/5.4/attn/dist_core.so")
    fh:close()
    local f = assert(io.open(proj .. "/fails.lua", "w"))
    f:write([[
local dist = require "attn.dist"
dist.init()
if dist.rank() == 2 then error("rank two fails") end
dist.barrier()
print("after the barrier")
]])
    f:close()
    -- make asan's preload goes to the ranks alone, without the leak check
    -- (Open MPI's own allocations), never to mpirun
    local preload, ranks_env = os.getenv("LD_PRELOAD"), ""
    if preload and preload ~= "" then
      ranks_env = (" -x LD_PRELOAD=%s -x ASAN_OPTIONS=%s"):format(sh_quote(preload),
        sh_quote((os.getenv("ASAN_OPTIONS") or "") .. ":detect_leaks=0"))
    end
    local out, ok = in_project("env -u LD_PRELOAD OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none "
      .. "timeout 60 mpirun --allow-run-as-root "
      .. "--oversubscribe --bind-to none" .. ranks_env .. " -np 2 " .. sh_quote(prefix .. "/bin/attn-lua")
      .. " fails.lua")
    assert.is_falsy(ok, out)
    assert.is_truthy(out:find("attn-lua: rank 2 of 2: fails.lua:3: rank two fails", 1, true), out)
    assert.is_falsy(out:find("after the barrier", 1, true), out)
  end)

  it("attn-busted runs the user's own specs (./spec) with attn.assert, and fails when they fail", function()
    local f = assert(io.open(proj .. "/spec/mine_spec.lua", "w"))
    f:write([[
local attn = require "attn"
require "attn.assert"
describe("my model", function()
  it("doubles", function() assert.tensor_near(attn.ones(2) * 2, attn.full({2}, 2), 0) end)
end)
]])
    f:close()
    local out, ok = in_project(sh_quote(prefix .. "/bin/attn-busted") .. " -o TAP")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("ok 1 - my model doubles", 1, true), out)
    f = assert(io.open(proj .. "/spec/broken_spec.lua", "w"))
    f:write([[
local attn = require "attn"
require "attn.assert"
it("is off", function() assert.tensor_near(attn.ones(2), attn.zeros(2), 1e-3) end)
]])
    f:close()
    out, ok = in_project(sh_quote(prefix .. "/bin/attn-busted") .. " -o TAP")
    assert.is_falsy(ok, out)
    assert.is_truthy(out:find("not ok %d+ %- is off"), out)
  end)
end)
