/* Rotary position embedding from Lua: attn.rope (forward) and
 * attn._rope_backward (the raw backward for the autograd engine) over
 * src/core/rope.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attn_lua.h"
#include "rope.h"

static const char *const ROPE = "attn.rope";
static const char *const ROPE_BWD = "attn._rope_backward";

/* The options of a rope call, read from the table at arg (nil: defaults)
 * for x with n rows: positions (1-based, default 1..n) into a userdata
 * buffer of n doubles left on the stack, base and style. */
typedef struct rope_opts {
  const double *positions;
  double base;
  attn_rope_style style;
} rope_opts;

static void read_positions(lua_State *L, const char *fname, int64_t n, double *pos) {
  /* the value on top: a tensor [n] or a list of n numbers */
  attn_tensor *t = attnL_test(L, -1);
  char b1[200];
  if (t) {
    if (t->ndim != 1 || t->size[0] != n)
      attnL_error(L, fname, "bad option 'positions' (expected a tensor [%I] (one per row of x), got %s)",
                  (LUA_INTEGER)n, attnL_shape(t, b1, sizeof b1));
    for (int64_t r = 0; r < n; r++) pos[r] = (double)t->data[r * t->stride[0]];
  } else if (lua_istable(L, -1)) {
    lua_Integer len = luaL_len(L, -1);
    if (len != n)
      attnL_error(L, fname, "bad option 'positions' (expected %I numbers, one per row of x, got %I)", (LUA_INTEGER)n,
                  len);
    for (int64_t r = 0; r < n; r++) {
      if (lua_geti(L, -1, r + 1) != LUA_TNUMBER)
        attnL_error(L, fname, "bad option 'positions' (expected numbers, got %s at %I)", luaL_typename(L, -1),
                    (LUA_INTEGER)(r + 1));
      pos[r] = (double)lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
  } else {
    char buf[64];
    attnL_error(L, fname, "bad option 'positions' (expected a tensor [n] or a list of numbers, got %s)",
                attnL_typename(L, -1, buf, sizeof buf));
  }
  for (int64_t r = 0; r < n; r++)
    if (!isfinite(pos[r])) {
      char got[64];
      snprintf(got, sizeof got, "%g", pos[r]);
      attnL_error(L, fname, "bad option 'positions' (expected finite numbers, got %s at %I)", got,
                  (LUA_INTEGER)(r + 1));
    }
}

static rope_opts check_opts(lua_State *L, int arg, const char *fname, int64_t n) {
  rope_opts o = {NULL, 10000.0, ATTN_ROPE_HALF};
  /* the positions buffer, owned by Lua (no malloc held across an error) */
  double *pos = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof(double), 0);
  int buf = lua_gettop(L);
  for (int64_t r = 0; r < n; r++) pos[r] = (double)(r + 1);
  o.positions = pos;
  if (lua_isnoneornil(L, arg)) return o;
  if (!lua_istable(L, arg) || attnL_test(L, arg)) {
    char b[64];
    attnL_error(L, fname, "bad argument #%d 'opts' (expected a table {positions, base = 10000, style = \"half\"}, got %s)",
                arg, attnL_typename(L, arg, b, sizeof b));
  }
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1);
    int ok = lua_type(L, -1) == LUA_TSTRING
                 ? (strcmp(lua_tostring(L, -1), "positions") == 0 || strcmp(lua_tostring(L, -1), "base") == 0 ||
                    strcmp(lua_tostring(L, -1), "style") == 0)
                 : lua_isinteger(L, -1) && lua_tointeger(L, -1) == 1;
    if (!ok) {
      lua_pushfstring(L, "%s", lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1));
      attnL_error(L, fname, "unknown option '%s' (expected positions (or opts[1]), base, style)", lua_tostring(L, -1));
    }
  }
  lua_getfield(L, arg, "positions");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_geti(L, arg, 1);
  }
  if (!lua_isnil(L, -1)) read_positions(L, fname, n, pos);
  lua_settop(L, buf);
  lua_getfield(L, arg, "base");
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      attnL_error(L, fname, "bad option 'base' (expected a number > 0, got %s)", luaL_typename(L, -1));
    o.base = (double)lua_tonumber(L, -1);
    if (!(o.base > 0.0) || !isfinite(o.base)) {
      char got[64];
      snprintf(got, sizeof got, "%g", o.base);
      attnL_error(L, fname, "bad option 'base' (expected a finite number > 0, got %s)", got);
    }
  }
  lua_settop(L, buf);
  lua_getfield(L, arg, "style");
  if (!lua_isnil(L, -1)) {
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (s && strcmp(s, "half") == 0)
      o.style = ATTN_ROPE_HALF;
    else if (s && strcmp(s, "interleaved") == 0)
      o.style = ATTN_ROPE_INTERLEAVED;
    else
      attnL_error(L, fname, "bad option 'style' (expected \"half\" or \"interleaved\", got %s%s%s)", s ? "\"" : "",
                  s ? s : luaL_typename(L, -1), s ? "\"" : "");
  }
  lua_settop(L, buf);
  return o;
}

static int rope(lua_State *L, const char *fname, const char *xname, int inverse) {
  attnL_check_nargs(L, 2, fname);
  lua_settop(L, 2); /* the options' buffer goes at 3 */
  attn_tensor *x = attnL_check(L, 1, fname, xname);
  char b1[200];
  if (x->ndim < 2)
    attnL_error(L, fname, "bad argument #1 '%s' (expected [..., n, E] with E even, got %s)", xname,
                attnL_shape(x, b1, sizeof b1));
  if (x->size[x->ndim - 1] % 2 != 0)
    attnL_error(L, fname, "bad argument #1 '%s' (expected [..., n, E] with E even, got %s)", xname,
                attnL_shape(x, b1, sizeof b1));
  rope_opts o = check_opts(L, 2, fname, x->size[x->ndim - 2]);
  attn_tensor *out = attnL_push_uninit(L, x->ndim, x->size, fname);
  if (attn_rope(x, o.positions, o.base, o.style, inverse, out) != ATTN_OK) attnL_core_error(L, fname);
  return 1;
}

static int l_rope(lua_State *L) { return rope(L, ROPE, "x", 0); }
static int l_rope_backward(lua_State *L) { return rope(L, ROPE_BWD, "grad", 1); }

static const luaL_Reg funcs[] = {
    {"rope", l_rope},
    {"_rope_backward", l_rope_backward},
    {NULL, NULL},
};

void attnL_open_rope(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
