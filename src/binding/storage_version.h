/* Autograd's version counter of a tensor's storage, shared by the binding
 * (src/binding/lua_util.c) and attn.dist's module (src/dist/lua_dist.c),
 * which is built apart and cannot call into core.so. The storage is user
 * value 1 of the tensor; its user values: 1 its version (an integer, nil =
 * 0), 2 the name of the last in-place writer (for autograd's messages), 3
 * its history serial (attnL_history_stale). Not a public header. */
#ifndef ATTN_STORAGE_VERSION_H
#define ATTN_STORAGE_VERSION_H

#include <lua.h>

/* One in-place write by fname to the tensor at arg (nothing for a tensor
 * without a storage). */
static inline void attn_storage_bump_version(lua_State *L, int arg, const char *fname) {
  arg = lua_absindex(L, arg);
  if (lua_getiuservalue(L, arg, 1) != LUA_TUSERDATA) {
    lua_pop(L, 1);
    return;
  }
  lua_getiuservalue(L, -1, 1);
  lua_Integer v = lua_tointeger(L, -1);
  lua_pop(L, 1);
  lua_pushinteger(L, v + 1);
  lua_setiuservalue(L, -2, 1);
  lua_pushstring(L, fname);
  lua_setiuservalue(L, -2, 2);
  lua_pop(L, 1);
}

#endif
