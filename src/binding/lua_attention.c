/* Attention from Lua: attn.scaled_dot_product_attention, its recorded
 * forward attn.core.autograd.sdpa_forward (the same call, returning what the
 * backward in src/binding/lua_sdpa_backward.c needs), attn.simple_attention
 * and attn.alibi_slopes, over the core's kernels: "math"
 * (src/core/attention.c, scores materialised) and "flash" (src/core/flash.c
 * and flash_decode.c, fused), chosen by src/core/sdpa_dispatch.c. The
 * options of both SDPA calls are parsed from one table
 * (src/binding/lua_sdpa_options.c). */
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "attn_lua.h"
#include "lua_sdpa_options.h"
#include "rng.h"
#include "sdpa_dispatch.h"

static const char *const SDPA = "attn.scaled_dot_product_attention";
static const char *const FWD = "attn.core.autograd.sdpa_forward";
static const char *const SIMPLE = "attn.simple_attention";

/* Run the kernel on tensors q, k, v with opts, pushing out (and weights,
 * and lse). attn_sdpa_run makes the core's one choice for "auto", as for
 * the modules (the fused kernel unless the weights are asked for or the
 * input is small). */
static int run(lua_State *L, const char *fname, attn_tensor *q, attn_tensor *k, attn_tensor *v, attn_sdpa_opts *o,
               int need_weights, int return_lse, attn_sdpa_kernel kernel) {
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_sdpa_out_shape(q, k, v, o, &ndim, size) != ATTN_OK) attnL_core_error(L, fname);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fname);
  attn_tensor *w = NULL;
  if (need_weights) {
    size[ndim - 1] = k->size[k->ndim - 2];
    w = attnL_push_uninit(L, ndim, size, fname);
  }
  o->lse = return_lse ? attnL_push_uninit(L, ndim - 1, size, fname) : NULL;
  int dropout_holder = 0;
  if (o->dropout_p > 0.0) {
    /* as torch's dropout of the weights [B..., Lq, Lk] (-1: more than int64 counts, with an empty v) */
    int64_t numel = k->size[k->ndim - 2];
    for (int d = 0; d < ndim - 1 && numel >= 0; d++)
      if (__builtin_mul_overflow(numel, size[d], &numel)) numel = -1;
    o->dropout_draw = attnL_draw_dropout(L, o->dropout_p, numel, fname);
    dropout_holder = 1;
  }
  if (attn_sdpa_run(kernel, q, k, v, o, out, w) != ATTN_OK) attnL_core_error(L, fname);
  lua_pop(L, dropout_holder);
  return 1 + need_weights + return_lse;
}

/* The arguments q, k, v[, opts] of both forwards (nargs at most, fname in
 * the errors) into t[3] and c. */
static void forward_args(lua_State *L, int nargs, const char *fname, attn_tensor **t, attnL_sdpa_call *c) {
  attnL_check_nargs(L, nargs, fname);
  t[0] = attnL_check(L, 1, fname, "q");
  t[1] = attnL_check(L, 2, fname, "k");
  t[2] = attnL_check(L, 3, fname, "v");
  lua_settop(L, nargs);
  attnL_sdpa_parse_options(L, 4, fname, ATTNL_SDPA_FORWARD, t[0], c);
}

/* q, k, v[, opts] -> out[, weights][, lse] */
static int l_sdpa(lua_State *L) {
  attn_tensor *t[3];
  attnL_sdpa_call c;
  forward_args(L, 4, SDPA, t, &c);
  return run(L, SDPA, t[0], t[1], t[2], &c.o, c.need_weights, c.return_lse, c.kernel);
}

/* attn.core.autograd.sdpa_forward: q, k, v[, opts[, fname]] -> out, saved,
 * kernel, draw[, weights][, lse]: the plain call's result with what its
 * backward needs (src/binding/lua_sdpa_backward.c). */
static int l_sdpa_forward(lua_State *L) {
  attnL_check_nargs(L, 5, FWD); /* (before fname is read from argument 5) */
  /* errors name the caller's function when it passes its name (the recording
   * attn.scaled_dot_product_attention): the user called that, not this */
  const char *FN = lua_type(L, 5) == LUA_TSTRING ? lua_tostring(L, 5) : FWD;
  attn_tensor *t[3];
  attnL_sdpa_call c;
  forward_args(L, 5, FN, t, &c);
  attn_tensor *q = t[0], *k = t[1], *v = t[2];
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_sdpa_out_shape(q, k, v, &c.o, &ndim, size) != ATTN_OK) attnL_core_error(L, FN);
  int64_t nb = attn_sizes_product(ndim - 2, size), lk = k->size[k->ndim - 2];
  const char *why;
  /* the choice the unrecorded call makes (attn_sdpa_run), so both give the same bits */
  attn_sdpa_kernel kernel = attn_sdpa_choose_kernel_for(c.kernel, nb, size[ndim - 2], lk, q->size[q->ndim - 1],
                                                        size[ndim - 1], c.need_weights,
                                                        attn_sdpa_gqa_group_of(q, k, &c.o), &c.o, &why);
  if (kernel == ATTN_SDPA_AUTO) attnL_error(L, FN, "%s; use kernel = \"math\" or \"auto\"", why);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, FN);
  size[ndim - 1] = lk;
  if (kernel == ATTN_SDPA_MATH)
    c.o.probs = attnL_push_uninit(L, ndim, size, FN);
  else
    c.o.lse = attnL_push_uninit(L, ndim - 1, size, FN);
  int saved_idx = lua_gettop(L);
  attn_tensor *weights = c.need_weights ? attnL_push_uninit(L, ndim, size, FN) : NULL;
  /* the lse asked for: the math kernel's own, a copy of flash's saved one */
  attn_tensor *lse = c.return_lse ? attnL_push_uninit(L, ndim - 1, size, FN) : NULL;
  if (lse && kernel == ATTN_SDPA_MATH) c.o.lse = lse;
  int holder = 0;
  if (c.o.dropout_p > 0.0) { /* over the weights [B..., Lq, Lk], as the public function */
    int64_t numel;
    if (__builtin_mul_overflow(attn_sizes_product(ndim - 1, size), lk, &numel)) numel = -1;
    c.o.dropout_draw = attnL_draw_dropout(L, c.o.dropout_p, numel, FN);
    holder = lua_gettop(L);
  }
  if (attn_sdpa_run(kernel, q, k, v, &c.o, out, weights) != ATTN_OK) attnL_core_error(L, FN);
  if (lse && kernel == ATTN_SDPA_FLASH) memcpy(lse->data, c.o.lse->data, (size_t)attn_numel(lse) * sizeof(float));
  /* out, saved, kernel, draw[, weights][, lse] */
  lua_pushstring(L, kernel == ATTN_SDPA_MATH ? "math" : "flash");
  attnL_push_dropout_draw(L, c.o.dropout_draw, holder);
  if (holder) lua_remove(L, holder);
  lua_rotate(L, saved_idx + 1, 2);
  return 4 + (weights != NULL) + (lse != NULL);
}

static int l_simple(lua_State *L) {
  attn_tensor *x = attnL_check(L, 1, SIMPLE, "x");
  if (x->ndim < 2) {
    char buf[200];
    attnL_error(L, SIMPLE, "bad argument #1 'x' (expected [n, d] or [..., n, d], got %s)",
                attnL_shape(x, buf, sizeof buf));
  }
  if (!lua_isnoneornil(L, 2)) attnL_error(L, SIMPLE, "takes one argument, got %d", lua_gettop(L));
  attn_sdpa_opts o = attn_sdpa_defaults();
  o.scale = 1.0f;
  return run(L, SIMPLE, x, x, x, &o, 0, 0, ATTN_SDPA_MATH);
}

static const char *const ALIBI = "attn.alibi_slopes";

/* attn.alibi_slopes(H): the ALiBi paper's head slopes [H]. */
static int l_alibi_slopes(lua_State *L) {
  attnL_check_nargs(L, 1, ALIBI);
  int isint = 0;
  lua_Integer h = lua_type(L, 1) == LUA_TNUMBER ? lua_tointegerx(L, 1, &isint) : 0;
  if (!isint || h < 1 || h > (1 << 24)) {
    char got[64];
    if (lua_type(L, 1) == LUA_TNUMBER)
      snprintf(got, sizeof got, "%s", lua_tostring(L, 1));
    else
      snprintf(got, sizeof got, "%s", luaL_typename(L, 1));
    attnL_error(L, ALIBI, "bad argument #1 'H' (expected an integer head count in [1, 16777216], got %s)", got);
  }
  int64_t size[1] = {(int64_t)h};
  attn_tensor *t = attnL_push_uninit(L, 1, size, ALIBI);
  attn_alibi_slopes((int64_t)h, t->data);
  return 1;
}

static const luaL_Reg funcs[] = {
    {"alibi_slopes", l_alibi_slopes},
    {"scaled_dot_product_attention", l_sdpa},
    {"simple_attention", l_simple},
    {NULL, NULL},
};

void attnL_open_attention(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}

static const luaL_Reg autograd_funcs[] = {
    {"sdpa_forward", l_sdpa_forward},
    {"sdpa_backward", attnL_sdpa_backward},
    {NULL, NULL},
};

void attnL_open_sdpa_autograd(lua_State *L) {
  lua_newtable(L);
  luaL_setfuncs(L, autograd_funcs, 0);
  lua_setfield(L, -4, "autograd"); /* module, methods, metatable, this */
}
