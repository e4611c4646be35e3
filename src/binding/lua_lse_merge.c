/* attn.core._lse_merge(out, lse, o, l): the log-sum-exp merge of a partial
 * attention result (o [..., n, E], l [..., n]) into a running one (out, lse),
 * both in place (src/core/lse_merge.h); attn.core._sdpa_resume: an attention
 * call merged the same way by the fused kernel itself. Internal: ring
 * attention's merge (lua/attn/dist/ring.lua). */
#include <math.h>

#include "attn_lua.h"
#include "lse_merge.h"

static const char *const MERGE = "attn._lse_merge";
static const char *const RESUME = "attn._sdpa_resume";

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

/* attn.core._sdpa_resume(q, k, v, out, lse, is_causal, scale): the
 * attention of q to k, v merged into the running (out, lse) in place by the
 * fused kernel (attn_sdpa_resume); scale nil: 1/sqrt(E), as
 * scaled_dot_product_attention's default (src/binding/lua_sdpa_options.c). */
static int l_sdpa_resume(lua_State *L) {
  attnL_check_nargs(L, 7, RESUME);
  attn_tensor *q = attnL_check(L, 1, RESUME, "q");
  attn_tensor *k = attnL_check(L, 2, RESUME, "k");
  attn_tensor *v = attnL_check(L, 3, RESUME, "v");
  attn_tensor *out = attnL_check(L, 4, RESUME, "out");
  attn_tensor *lse = attnL_check(L, 5, RESUME, "lse");
  int is_causal = lua_toboolean(L, 6);
  float scale = q->ndim >= 1 ? (float)(1.0 / sqrt((double)q->size[q->ndim - 1])) : 1.0f;
  if (!lua_isnoneornil(L, 7)) scale = (float)attnL_checknumber(L, 7, RESUME, "scale");
  attnL_check_writable(L, out, RESUME);
  attnL_check_writable(L, lse, RESUME);
  if (attn_sdpa_resume(q, k, v, scale, is_causal, out, lse) != ATTN_OK) attnL_core_error(L, RESUME);
  attnL_bump_version(L, 4, RESUME);
  attnL_bump_version(L, 5, RESUME);
  return 0;
}

static const luaL_Reg funcs[] = {
    {"_lse_merge", l_lse_merge},
    {"_sdpa_resume", l_sdpa_resume},
    {NULL, NULL},
};

void attnL_open_lse_merge(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
