/* attn.save / attn.load: NumPy .npy files (the format is src/core/npy.c's). */
#include "attn_lua.h"
#include "npy.h"

/* attn.save(t, path): t as a C-order .npy file, float32 ('<f4') or bool ('|b1'); returns nothing. */
static int l_save(lua_State *L) {
  const char *fn = "attn.save";
  attn_tensor *t = attnL_check(L, 1, fn, "t");
  const char *path = attnL_checkpath(L, 2, fn, "path");
  if (attn_npy_write(path, t) != ATTN_OK) return attnL_core_error(L, fn);
  return 0;
}

/* attn.load(path): the float32 tensor held in a .npy file ('<f4' or '<f8'). */
static int l_load(lua_State *L) {
  const char *fn = "attn.load";
  lua_settop(L, 1);
  const char *path = attnL_checkpath(L, 1, fn, "path");
  /* one descriptor for the header and the data; closed by the guard (2) if
   * the allocation of the tensor raises */
  int *fd = attnL_push_fd_guard(L);
  int64_t file_size;
  if (attn_npy_open(path, fd, &file_size) != ATTN_OK) return attnL_core_error(L, fn);
  attn_npy_info info;
  if (attn_npy_read_header(path, *fd, file_size, &info) != ATTN_OK) return attnL_core_error(L, fn);
  attn_tensor *t = attnL_push_uninit(L, info.ndim, info.size, fn);
  t->is_bool = info.dtype == ATTN_ELEM_BOOL; /* '|b1' loads as a bool tensor, as numpy's bool in PyTorch */
  attn_status st = attn_npy_read_data(path, *fd, &info, t->data);
  attnL_close_fd(L, 2);
  if (st != ATTN_OK) return attnL_core_error(L, fn);
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
