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
 * threads = n (OpenMP's maximum), arch = "x86_64"} */
static int l_cpu_info(lua_State *L) {
  if (lua_gettop(L) > 0) return attnL_error(L, "attn.cpu_info", "expected no arguments, got %d", lua_gettop(L));
  lua_createtable(L, 0, 6);
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
}
