/* Process facts for benchmarks and the REPL: a monotonic clock, the peak
 * RSS, and whether a file descriptor is a terminal. */
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "attn_lua.h"

/* attn.clock() -> seconds (float) of CLOCK_MONOTONIC */
static int l_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* attn.peak_rss_mb() -> the process's peak resident set, MiB */
static int l_peak_rss_mb(lua_State *L) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return attnL_error(L, "attn.peak_rss_mb", "getrusage failed");
  lua_pushnumber(L, (lua_Number)ru.ru_maxrss / 1024.0);
  return 1;
}

/* attn.isatty(fd) -> true when file descriptor fd (0 stdin, 1 stdout, 2 stderr)
 * is a terminal: progress lines and REPL prompts are only drawn on one. */
static int l_isatty(lua_State *L) {
  const char *fn = "attn.isatty";
  int64_t fd = attnL_checkinteger(L, 1, fn, "fd");
  if (fd < 0 || fd > 1 << 20)
    return attnL_error(L, fn, "bad argument #1 'fd' (expected 0 <= fd <= 1048576, got %I)", (lua_Integer)fd);
  lua_pushboolean(L, isatty((int)fd) == 1);
  return 1;
}

static const luaL_Reg funcs[] = {
  {"clock", l_clock}, {"peak_rss_mb", l_peak_rss_mb}, {"isatty", l_isatty}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top. */
void attnL_open_sys(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
