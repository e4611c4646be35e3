/* luaopen_attn_core: the module table of attn.core, the attn.Tensor
 * metatable and its methods table. */
#include "attn_lua.h"

#define ATTN_EXPORT __attribute__((visibility("default")))

ATTN_EXPORT int luaopen_attn_core(lua_State *L);

int luaopen_attn_core(lua_State *L) {
  lua_newtable(L);                       /* module */
  lua_newtable(L);                       /* methods */
  luaL_newmetatable(L, ATTN_TENSOR_NAME); /* metatable, with __name */
  attnL_open_tensor(L);
  attnL_open_math(L);
  attnL_open_attention(L);
  attnL_open_rng(L);
  attnL_open_io(L);
  attnL_open_safetensors(L);
  attnL_open_sys(L);
  attnL_open_modules(L);
  lua_setfield(L, -3, "Tensor_mt");
  lua_setfield(L, -2, "Tensor");
  return 1;
}
