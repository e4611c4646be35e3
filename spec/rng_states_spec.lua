-- The random generator belongs to the Lua state: a C host
-- that opens two lua_States in one process and requires attn in each gets
-- two independent streams, also when the states run on two OS threads at
-- once; coroutines of one state share its stream (as torch's one generator
-- per process). The host is compiled here with cc against liblua5.4 (both in
-- the packages `make` installs); the expected draws come from this process's
-- own state, replaying each state's calls alone.
local attn = require "attn"

local HOST_C = [[
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static const char *g_path, *g_cpath;

static lua_State *open_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_pushstring(L, g_path);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, g_cpath);
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  if (luaL_dostring(L, "attn = require 'attn'")) {
    fprintf(stderr, "require: %s\n", lua_tostring(L, -1));
    exit(2);
  }
  return L;
}

/* Runs chunk in L; its one result, a string, is kept in out. */
static void run(lua_State *L, const char *chunk, char *out, size_t cap) {
  if (luaL_loadstring(L, chunk) || lua_pcall(L, 0, 1, 0)) {
    fprintf(stderr, "chunk failed: %s\n", lua_tostring(L, -1));
    exit(2);
  }
  snprintf(out, cap, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
}

typedef struct job { lua_State *L; const char *chunk; char out[4096]; } job;
static pthread_barrier_t start; /* both threads begin their chunks together */
static void *run_job(void *p) {
  job *j = p;
  pthread_barrier_wait(&start);
  run(j->L, j->chunk, j->out, sizeof j->out);
  return NULL;
}

/* argv: path cpath, then steps "0:chunk" / "1:chunk" (run in state 0 or 1,
 * print "<state> <result>") or "T:chunk0" "chunk1" (both at once on two
 * threads, print "T0 <result>" and "T1 <result>"). */
int main(int argc, char **argv) {
  g_path = argv[1];
  g_cpath = argv[2];
  lua_State *st[2] = {open_state(), open_state()};
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] == 'T' && a[1] == ':' && i + 1 < argc) {
      job j[2] = {{st[0], a + 2, {0}}, {st[1], argv[i + 1], {0}}};
      pthread_t th[2];
      pthread_barrier_init(&start, NULL, 2);
      for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, run_job, &j[k]);
      for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
      pthread_barrier_destroy(&start);
      printf("T0 %s\nT1 %s\n", j[0].out, j[1].out);
      i++;
    } else {
      char out[4096];
      run(st[a[0] == '1'], a + 2, out, sizeof out);
      printf("%c %s\n", a[0], out);
    }
  }
  lua_close(st[0]);
  lua_close(st[1]);
  return 0;
}
]]

-- Lua snippets run in either state (host) or here (reference); each returns a string.
local function raw(n) return ("return table.concat(attn.rng_raw_u32(%d), ',')"):format(n) end
local function seed(s) return ("attn.manual_seed(%d) return 'seeded'"):format(s) end
local RANDN = "return table.concat(attn.randn(20):totable(), ',')"
local UNIFORM = "return table.concat(attn.empty(3, 5):t():uniform_():totable()[1], ',')"
-- many small draws (about 0.2 s), so that two threads sharing one generator would interleave
local HASH = [[
local h = 0
for _ = 1, 1000 do
  for _, v in ipairs(attn.rng_raw_u32(500)) do h = (h * 31 + v) & 0xffffffff end
end
return tostring(h) .. ' ' .. table.concat(attn.rand(4):totable(), ',')]]
local function seeded_hash(s) return ("attn.manual_seed(%d) "):format(s) .. HASH end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local build = os.getenv("ATTN_BUILD") or "build"
local dir

local function compile_host()
  dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir " .. dir))
  local f = assert(io.open(dir .. "/host.c", "w"))
  f:write(HOST_C)
  f:close()
  local cflags = io.popen("pkg-config --cflags --libs lua5.4 2>/dev/null"):read("a"):gsub("\n", "")
  if cflags == "" then cflags = "-I/usr/include/lua5.4 -llua5.4" end
  -- the compiler itself runs without `make asan`'s sanitizer preload (its own leaks would fail it)
  -- CC and ATTN_SPEC_RUN (a prefix that runs the host, e.g. qemu-aarch64): a
  -- cross-built tree's host (scripts/check-arm64.sh) is built and run as its module is
  local cc = ("env -u LD_PRELOAD %s -O1 -o %s/host %s/host.c %s -lpthread 2>&1"):format(os.getenv("CC") or "cc",
    dir, dir, cflags)
  local p = io.popen(cc)
  local msg = p:read("a")
  assert(p:close(), "compiling the two-state host failed: " .. msg)
end

-- Runs the host with these steps; returns its output lines.
local function host(steps)
  local args = {}
  for i, s in ipairs(steps) do args[i] = shell_quote(s) end
  local cmd = ("%s %s/host %s %s %s 2>&1"):format(os.getenv("ATTN_SPEC_RUN") or "", dir,
    shell_quote(build .. "/?.lua;" .. build .. "/?/init.lua"),
    shell_quote(build .. "/?.so"), table.concat(args, " "))
  local p = io.popen(cmd)
  local out = p:read("a")
  assert(p:close(), "host failed: " .. out)
  local lines = {}
  for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
  return lines
end

-- The same snippets run alone in this state: what each state must print.
local function reference(snippets)
  local saved = attn.get_rng_state()
  local out = {}
  for i, s in ipairs(snippets) do out[i] = assert(load(s, "ref", "t", { attn = attn, table = table, ipairs = ipairs, tostring = tostring }))() end
  attn.set_rng_state(saved)
  return out
end

describe("the random generator is per Lua state", function()
  setup(compile_host)
  teardown(function() if dir then os.execute("rm -rf " .. dir) end end)

  it("two states seeded alike, drawing in turns, each draw the single-state stream", function()
    local a = { seed(42), raw(3), raw(7), RANDN, UNIFORM, raw(2) }
    local b = { seed(42), raw(5), RANDN, raw(1), UNIFORM, raw(4) }
    local steps = {}
    for i = 1, #a do
      steps[#steps + 1] = "0:" .. a[i]
      steps[#steps + 1] = "1:" .. b[i]
    end
    local lines = host(steps)
    local want_a, want_b = reference(a), reference(b)
    assert.are.equal(2 * #a, #lines)
    for i = 1, #a do
      assert.are.equal("0 " .. want_a[i], lines[2 * i - 1])
      assert.are.equal("1 " .. want_b[i], lines[2 * i])
    end
  end)

  it("manual_seed, set_rng_state and dropout in one state leave the other's stream alone", function()
    local a = { seed(7), raw(4), seed(99), raw(4), "attn.set_rng_state(attn.get_rng_state()) return 'x'",
      "return tostring(attn.initial_seed())" }
    local b = { seed(7), raw(4), raw(4), "attn.dropout(attn.ones(100), 0.5) return 'd'", raw(4),
      "return tostring(attn.initial_seed())" }
    local steps = {}
    for i = 1, #a do
      steps[#steps + 1] = "0:" .. a[i]
      steps[#steps + 1] = "1:" .. b[i]
    end
    local lines = host(steps)
    local want_a, want_b = reference(a), reference(b)
    for i = 1, #a do
      assert.are.equal("0 " .. want_a[i], lines[2 * i - 1])
      assert.are.equal("1 " .. want_b[i], lines[2 * i])
    end
    assert.are.equal("0 99", lines[#lines - 1])
    assert.are.equal("1 7", lines[#lines])
  end)

  it("two states on two OS threads at once draw their own streams", function()
    for round = 1, 3 do
      local lines = host { "T:" .. seeded_hash(round), seeded_hash(1000 + round) }
      assert.are.same({ "T0 " .. reference({ seeded_hash(round) })[1], "T1 " .. reference({ seeded_hash(1000 + round) })[1] },
        lines)
    end
  end)

  it("coroutines of one state share its stream", function()
    attn.manual_seed(5)
    local want = attn.rng_raw_u32(6)
    attn.manual_seed(5)
    local co = coroutine.wrap(function()
      local x = attn.rng_raw_u32(2)
      coroutine.yield(x)
      return attn.rng_raw_u32(2)
    end)
    local got = {}
    for _, part in ipairs { co(), attn.rng_raw_u32(2), co() } do
      for _, v in ipairs(part) do got[#got + 1] = v end
    end
    assert.are.same(want, got)
  end)

  it("re-requiring attn.core in the same state keeps its generator", function()
    attn.manual_seed(11)
    local first = attn.rng_raw_u32(1)[1]
    local core = package.loaded["attn.core"]
    package.loaded["attn.core"] = nil
    local again = require "attn.core"
    package.loaded["attn.core"] = core
    attn.manual_seed(11)
    attn.rng_raw_u32(1)
    local second = again.rng_raw_u32(1)[1]
    attn.manual_seed(11)
    local want = attn.rng_raw_u32(2)
    assert.are.equal(first, want[1])
    assert.are.equal(want[2], second)
  end)
end)
