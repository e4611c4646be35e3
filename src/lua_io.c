/* attn.save / attn.load: NumPy .npy files (the format is src/npy.c's). */
#include "attn_lua.h"
#include "npy.h"

/* attn.save(t, path): t as a float32 C-order .npy file; returns nothing. */
static int l_save(lua_State *L) {
  const char *fn = "attn.save";
  attn_tensor *t = attnL_check(L, 1, fn, "t");
  if (lua_type(L, 2) != LUA_TSTRING)
    return attnL_error(L, fn, "bad argument #2 'path' (expected a string, got %s)", luaL_typename(L, 2));
  const char *path = lua_tostring(L, 2);
  if (attn_npy_write(path, t) != ATTN_OK) return attnL_core_error(L, fn);
  return 0;
}

/* attn.load(path): the float32 tensor held in a .npy file ('<f4' or '<f8'). */
static int l_load(lua_State *L) {
  const char *fn = "attn.load";
  if (lua_type(L, 1) != LUA_TSTRING)
    return attnL_error(L, fn, "bad argument #1 'path' (expected a string, got %s)", luaL_typename(L, 1));
  const char *path = lua_tostring(L, 1);
  attn_npy_info info;
  if (attn_npy_read_header(path, &info) != ATTN_OK) return attnL_core_error(L, fn);
  attn_tensor *t = attnL_push_uninit(L, info.ndim, info.size, fn);
  if (attn_npy_read_data(path, &info, t->data) != ATTN_OK) return attnL_core_error(L, fn);
  return 1;
}

static const luaL_Reg funcs[] = {
  {"save", l_save},
  {"load", l_load},
  {NULL, NULL},
};

void attnL_open_io(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
