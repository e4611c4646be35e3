/* attn.core._lse_merge(out, lse, o, l): the log-sum-exp merge of a partial
 * attention result (o [..., n, E], l [..., n]) into a running one (out, lse),
 * both in place (src/core/lse_merge.h). Internal: ring attention's merge
 * (lua/attn/dist/ring.lua). */
#include "attn_lua.h"
#include "lse_merge.h"

static const char *const MERGE = "attn._lse_merge";

static int l_lse_merge(lua_State *L) {
  attnL_check_nargs(L, 4, MERGE);
  attn_tensor *out = attnL_check(L, 1, MERGE, "out");
  attn_tensor *lse = attnL_check(L, 2, MERGE, "lse");
  attn_tensor *o = attnL_check(L, 3, MERGE, "o");
  attn_tensor *l = attnL_check(L, 4, MERGE, "l");
  attnL_check_writable(L, out, MERGE);
  attnL_check_writable(L, lse, MERGE);
  if (attn_lse_merge(out, lse, o, l) != ATTN_OK) attnL_core_error(L, MERGE);
  attnL_bump_version(L, 1, MERGE);
  attnL_bump_version(L, 2, MERGE);
  return 0;
}

static const luaL_Reg funcs[] = {
    {"_lse_merge", l_lse_merge},
    {NULL, NULL},
};

void attnL_open_lse_merge(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
