/* attn.cpu_info() and the kernel choice at require time (src/core/cpu.h). */
#include <omp.h>
#include <stdlib.h>

#include "attn_lua.h"
#include "cpu.h"
#include "ops.h"

/* the architecture this build was compiled for (under qemu-user, or on a
 * machine whose /proc/cpuinfo describes another one, this is the truth) */
#if defined(__x86_64__)
#define ATTN_ARCH "x86_64"
#elif defined(__aarch64__)
#define ATTN_ARCH "aarch64"
#elif defined(__i386__)
#define ATTN_ARCH "i386"
#elif defined(__riscv) && __riscv_xlen == 64
#define ATTN_ARCH "riscv64"
#else
#define ATTN_ARCH "other"
#endif

/* attn.cpu_info() -> {kernel = "avx2", available = {"scalar", "avx2", ...},
 * forced = "avx2" (the ATTN_CPU value) or false, openblas_core = "Haswell",
 * threads = n (OpenMP's maximum), arch = "x86_64", avx512_full_width = true
 * (inferred from cpuid: attn_cpu_avx512_full_width)} */
static int l_cpu_info(lua_State *L) {
  if (lua_gettop(L) > 0) return attnL_error(L, "attn.cpu_info", "expected no arguments, got %d", lua_gettop(L));
  lua_createtable(L, 0, 7);
  lua_pushstring(L, attn_cpu_kernels()->name);
  lua_setfield(L, -2, "kernel");
  lua_newtable(L);
  const char *const *names = attn_cpu_available();
  for (int i = 0; names[i]; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "available");
  const char *forced = attn_cpu_forced();
  if (forced)
    lua_pushstring(L, forced);
  else
    lua_pushboolean(L, 0);
  lua_setfield(L, -2, "forced");
  lua_pushstring(L, attn_blas_corename());
  lua_setfield(L, -2, "openblas_core");
  lua_pushinteger(L, omp_get_max_threads());
  lua_setfield(L, -2, "threads");
  lua_pushstring(L, ATTN_ARCH);
  lua_setfield(L, -2, "arch");
  lua_pushboolean(L, attn_cpu_avx512_full_width());
  lua_setfield(L, -2, "avx512_full_width");
  return 1;
}

/* attn.core._fma_peak(round_seconds, rounds) -> {gflops, ms, steps, threads,
 * lanes, kernel, checksum}: the chosen kernel set's FP32 multiply-add
 * throughput on OpenMP's maximum of threads (attn_cpu_fma_peak; ms: the best
 * round's), for scripts/bench.lua's fma_peak. */
static int l_fma_peak(lua_State *L) {
  static const char *const F = "attn.core._fma_peak";
  attnL_check_nargs(L, 2, F);
  double seconds = attnL_checknumber(L, 1, F, "round_seconds");
  if (!(seconds > 0.0 && seconds <= 10.0))
    return attnL_error(L, F, "round_seconds: expected a number in (0, 10], got %f", seconds);
  int64_t rounds = attnL_checkinteger(L, 2, F, "rounds");
  if (rounds < 1 || rounds > 100)
    return attnL_error(L, F, "rounds: expected an integer in [1, 100], got %I", (lua_Integer)rounds);
  attn_fma_peak r = attn_cpu_fma_peak(seconds, (int)rounds, 0);
  lua_createtable(L, 0, 7);
  lua_pushnumber(L, r.gflops);
  lua_setfield(L, -2, "gflops");
  lua_pushnumber(L, r.seconds * 1000.0);
  lua_setfield(L, -2, "ms");
  lua_pushinteger(L, r.steps);
  lua_setfield(L, -2, "steps");
  lua_pushinteger(L, r.threads);
  lua_setfield(L, -2, "threads");
  lua_pushinteger(L, r.lanes);
  lua_setfield(L, -2, "lanes");
  lua_pushstring(L, attn_cpu_kernels()->name);
  lua_setfield(L, -2, "kernel");
  lua_pushnumber(L, r.checksum);
  lua_setfield(L, -2, "checksum");
  return 1;
}

/* The named set's kernels, or a Lua error naming the sets this CPU runs. */
static const attn_flash_kernels *check_set(lua_State *L, int arg, const char *fname) {
  const char *name = lua_type(L, arg) == LUA_TSTRING ? lua_tostring(L, arg) : NULL;
  const attn_flash_kernels *k = name ? attn_cpu_kernels_named(name) : NULL;
  if (k) return k;
  const char *const *names = attn_cpu_available();
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; names[i]; i++) {
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, names[i]);
  }
  luaL_pushresult(&b);
  if (name) return attnL_error(L, fname, "set: expected one of %s, got \"%s\"", lua_tostring(L, -1), name), NULL;
  return attnL_error(L, fname, "set: expected one of %s, got a %s", lua_tostring(L, -1), luaL_typename(L, arg)), NULL;
}

/* attn.core._fma_lanes(set) -> the lanes of that set's FMA throughput loop. */
static int l_fma_lanes(lua_State *L) {
  attnL_check_nargs(L, 1, "attn.core._fma_lanes");
  lua_pushinteger(L, check_set(L, 1, "attn.core._fma_lanes")->fma_lanes);
  return 1;
}

/* attn.core._fma_chains(set, steps, a, b, x) -> y: the named set's FMA
 * throughput loop itself, on one thread: y[i] is x[i] after `steps` steps of
 * x = x * a + b in float32 (x: a table of _fma_lanes(set) numbers). For the
 * specs: they check the loop computes what it claims. */
static int l_fma_chains(lua_State *L) {
  static const char *const F = "attn.core._fma_chains";
  attnL_check_nargs(L, 5, F);
  const attn_flash_kernels *k = check_set(L, 1, F);
  int64_t steps = attnL_checkinteger(L, 2, F, "steps");
  if (steps < 0 || steps > 100000000)
    return attnL_error(L, F, "steps: expected an integer in [0, 1e8], got %I", (lua_Integer)steps);
  float a = (float)attnL_checknumber(L, 3, F, "a");
  float b = (float)attnL_checknumber(L, 4, F, "b");
  if (!lua_istable(L, 5)) return attnL_error(L, F, "x: expected a table of %d numbers, got a %s", k->fma_lanes,
                                             luaL_typename(L, 5));
  float x[512];
  if (k->fma_lanes > (int)(sizeof x / sizeof x[0]) || (int64_t)luaL_len(L, 5) != k->fma_lanes)
    return attnL_error(L, F, "x: expected a table of %d numbers (the %s set's lanes), got %I", k->fma_lanes,
                       k->name, (lua_Integer)luaL_len(L, 5));
  for (int i = 0; i < k->fma_lanes; i++) {
    lua_rawgeti(L, 5, i + 1);
    int ok;
    lua_Number v = lua_tonumberx(L, -1, &ok);
    if (!ok) return attnL_error(L, F, "x[%d]: expected a number, got a %s", i + 1, luaL_typename(L, -1));
    x[i] = (float)v;
    lua_pop(L, 1);
  }
  k->fma_chains(x, steps, a, b);
  lua_createtable(L, k->fma_lanes, 0);
  for (int i = 0; i < k->fma_lanes; i++) {
    lua_pushnumber(L, (lua_Number)x[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* Expects [module, methods, metatable] on top. Chooses the kernel set from
 * ATTN_CPU: an unknown or unavailable choice fails the require with the
 * choices this CPU has (a silent fallback would make a forced run, such as
 * CI's ATTN_CPU=avx512 step, test something else). */
void attnL_open_cpu(lua_State *L) {
  if (attn_cpu_select(getenv("ATTN_CPU")) != ATTN_OK) luaL_error(L, "attn: %s", attn_error_message());
  lua_pushcfunction(L, l_cpu_info);
  lua_setfield(L, -4, "cpu_info");
  lua_pushcfunction(L, l_fma_peak);
  lua_setfield(L, -4, "_fma_peak");
  lua_pushcfunction(L, l_fma_lanes);
  lua_setfield(L, -4, "_fma_lanes");
  lua_pushcfunction(L, l_fma_chains);
  lua_setfield(L, -4, "_fma_chains");
}
