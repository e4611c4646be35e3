/* attn.core.modules.attention_forward: the fused forward of attn.nn's
 * CausalAttention and MultiHeadAttention (src/modules.c), one C call per
 * forward. It takes only calls it can run exactly as the module-by-module Lua
 * path would, and returns nil for anything else (a bad x, too many tokens,
 * parameters replaced by something unusual): the module then runs its Lua
 * path, whose checks raise the errors that name the class and argument. */
#include "attn_lua.h"
#include "modules.h"
#include "rng.h"

static const char *const FN = "attn.core.modules.attention_forward";

/* The tensor at arg, NULL for nil; *ok = 0 when it is something else. */
static const attn_tensor *opt_tensor(lua_State *L, int arg, int *ok) {
  if (lua_isnoneornil(L, arg)) return NULL;
  const attn_tensor *t = attnL_test(L, arg);
  if (!t) *ok = 0;
  return t;
}

/* attention_forward(x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv[, wo, bo])
 *   x          [..., n, d_in], with exactly `rank` dims (rank 0: 2 to 8 dims), n <= context_length
 *   heads      head count (d_out / heads = head size); scale of the scores
 *   p          dropout on the attention weights, in [0, 1) (0 in eval mode)
 *   w*, b*     the Linear weights [d_out, d_in] and biases (nil: none); wo, bo the out_proj
 * -> [..., n, d_out], or nil when the call is not one for the fused path. */
static int l_attention_forward(lua_State *L) {
  attn_tensor *x = attnL_test(L, 1);
  int isnum[5];
  lua_Integer d_in = lua_tointegerx(L, 2, &isnum[0]);
  lua_Integer context_length = lua_tointegerx(L, 3, &isnum[1]);
  lua_Integer rank = lua_tointegerx(L, 4, &isnum[2]);
  lua_Integer heads = lua_tointegerx(L, 5, &isnum[3]);
  lua_Number scale = lua_tonumberx(L, 6, &isnum[4]);
  int p_isnum;
  lua_Number p = lua_tonumberx(L, 7, &p_isnum);
  if (!x || !isnum[0] || !isnum[1] || !isnum[2] || !isnum[3] || !isnum[4] || !p_isnum) return 0;
  if (rank ? x->ndim != rank : (x->ndim < 2 || x->ndim > ATTN_MAX_DIMS)) return 0;
  if (x->size[x->ndim - 1] != d_in || x->size[x->ndim - 2] > context_length) return 0;
  if (!((double)scale == (double)scale) || heads < 1) return 0;

  int ok = 1;
  attn_self_attention m;
  m.wq = opt_tensor(L, 8, &ok), m.bq = opt_tensor(L, 9, &ok);
  m.wk = opt_tensor(L, 10, &ok), m.bk = opt_tensor(L, 11, &ok);
  m.wv = opt_tensor(L, 12, &ok), m.bv = opt_tensor(L, 13, &ok);
  m.wo = opt_tensor(L, 14, &ok), m.bo = opt_tensor(L, 15, &ok);
  m.heads = (int64_t)heads;
  m.scale = (float)scale;
  m.dropout_p = (double)p;
  m.dropout_draw = 0;
  if (!ok || (!m.wo && m.bo) || attn_self_attention_check(&m, (int64_t)d_in) != ATTN_OK) return 0;

  /* x as [B, n, d_in] (contiguous), out as [B, n, d_out] in x's leading shape */
  x = attnL_push_contiguous(L, 1, FN);
  int nd = x->ndim;
  int64_t size[ATTN_MAX_DIMS];
  for (int d = 0; d < nd; d++) size[d] = x->size[d];
  size[nd - 1] = m.wq->size[0];
  attn_tensor *out = attnL_push_uninit(L, nd, size, FN);
  int64_t nb = 1;
  for (int d = 0; d < nd - 2; d++) nb *= size[d];
  int64_t s3[3] = {nb, size[nd - 2], d_in}, o3[3] = {nb, size[nd - 2], size[nd - 1]};
  attn_tensor x3 = attn_make(x->data, 3, s3), out3 = attn_make(out->data, 3, o3);
  if (m.dropout_p > 0.0) {
    /* one 32-bit draw per call, where the Lua path's scaled_dot_product_attention draws it */
    m.dropout_draw = attn_rng_u32(attnL_generator(L));
  }
  if (attn_self_attention_forward(&m, &x3, &out3) != ATTN_OK) attnL_core_error(L, FN);
  return 1;
}

static const luaL_Reg funcs[] = {
    {"attention_forward", l_attention_forward},
    {NULL, NULL},
};

void attnL_open_modules(lua_State *L) {
  lua_newtable(L);
  luaL_setfuncs(L, funcs, 0);
  lua_setfield(L, -4, "modules"); /* module, methods, metatable, this */
}
