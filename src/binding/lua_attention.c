/* Attention from Lua: attn.scaled_dot_product_attention and
 * attn.simple_attention over the core's kernels: "math" (src/core/attention.c,
 * scores materialised) and "flash" (src/core/flash.c, fused and tiled). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "sdpa_dispatch.h"
#include "rng.h"
#include "attn_lua.h"

static const char *const SDPA = "attn.scaled_dot_product_attention";
static const char *const SIMPLE = "attn.simple_attention";

static const char *const option_names[] = {"mask",         "bias",       "is_causal",  "scale",
                                           "dropout_p",    "need_weights", "kernel",   "return_lse",
                                           "enable_gqa",   "window",     "alibi_slopes", "softcap", "block_mask", NULL};
#define OPTION_LIST                                                                                     \
  "mask, bias, is_causal, scale, dropout_p, need_weights, kernel, return_lse, enable_gqa, window, " \
  "alibi_slopes, softcap, block_mask"

/* Every key of the opts table at arg must be a known option name. */
static void check_option_keys(lua_State *L, int arg) {
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1); /* value */
    int known = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
      const char *key = lua_tostring(L, -1);
      for (int i = 0; option_names[i]; i++)
        if (strcmp(key, option_names[i]) == 0) known = 1;
      if (!known) attnL_error(L, SDPA, "unknown option '%s' (expected one of " OPTION_LIST ")", key);
    } else {
      attnL_error(L, SDPA, "bad option key of type %s (expected one of " OPTION_LIST ")", luaL_typename(L, -1));
    }
  }
}

/* opts[name] pushed; a tensor option (or NULL when absent). */
static attn_tensor *tensor_option(lua_State *L, int arg, const char *name) {
  lua_getfield(L, arg, name);
  if (lua_isnil(L, -1)) return NULL;
  attn_tensor *t = attnL_test(L, -1);
  if (!t) {
    char buf[64];
    attnL_error(L, SDPA, "bad option '%s' (expected attn.Tensor, got %s)", name, attnL_typename(L, -1, buf, sizeof buf));
  }
  return t;
}

static int bool_option(lua_State *L, int arg, const char *name) {
  lua_getfield(L, arg, name);
  int r = 0;
  if (lua_isboolean(L, -1))
    r = lua_toboolean(L, -1);
  else if (!lua_isnil(L, -1))
    attnL_error(L, SDPA, "bad option '%s' (expected a boolean, got %s)", name, luaL_typename(L, -1));
  lua_pop(L, 1);
  return r;
}

/* opts[name] as a number; *present = 0 when absent. */
static double number_option(lua_State *L, int arg, const char *name, int *present) {
  lua_getfield(L, arg, name);
  double r = 0.0;
  *present = 0;
  if (lua_type(L, -1) == LUA_TNUMBER) {
    r = (double)lua_tonumber(L, -1);
    *present = 1;
  } else if (!lua_isnil(L, -1)) {
    attnL_error(L, SDPA, "bad option '%s' (expected a number, got %s)", name, luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return r;
}

/* One side of opts.window: an integer >= -1 at index idx of the table on top. */
static int64_t window_side(lua_State *L, int idx, const char *side, const char *fname) {
  lua_geti(L, -1, idx);
  int isint = 0;
  lua_Integer n = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
  if (!isint) {
    if (lua_type(L, -1) == LUA_TNUMBER)
      attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s = %s)", side,
                  lua_tostring(L, -1));
    attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s of type %s)", side,
                luaL_typename(L, -1));
  }
  if (n < -1)
    attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s = %I)", side,
                (LUA_INTEGER)n);
  lua_pop(L, 1);
  return (int64_t)n;
}

/* opts.window = {left, right} into o. */
static void window_option(lua_State *L, int arg, const char *fname, attn_sdpa_opts *o) {
  lua_getfield(L, arg, "window");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1) || attnL_test(L, -1)) {
      char buf[64];
      attnL_error(L, fname, "bad option 'window' (expected a table {left, right}, got %s)",
                  attnL_typename(L, -1, buf, sizeof buf));
    }
    if (luaL_len(L, -1) != 2)
      attnL_error(L, fname, "bad option 'window' (expected a table {left, right} of 2 integers, got %I entries)",
                  (LUA_INTEGER)luaL_len(L, -1));
    o->has_window = 1;
    o->window_left = window_side(L, 1, "left", fname);
    o->window_right = window_side(L, 2, "right", fname);
  }
  lua_pop(L, 1);
}

void attnL_sdpa_variant_options(lua_State *L, int arg, const char *fname, attn_sdpa_opts *o) {
  lua_getfield(L, arg, "enable_gqa");
  if (lua_isboolean(L, -1))
    o->enable_gqa = lua_toboolean(L, -1);
  else if (!lua_isnil(L, -1))
    attnL_error(L, fname, "bad option 'enable_gqa' (expected a boolean, got %s)", luaL_typename(L, -1));
  lua_pop(L, 1);
  window_option(L, arg, fname, o);
  lua_getfield(L, arg, "alibi_slopes"); /* stays on the stack */
  if (!lua_isnil(L, -1)) {
    o->alibi_slopes = attnL_test(L, -1);
    if (!o->alibi_slopes) {
      char buf[64];
      attnL_error(L, fname, "bad option 'alibi_slopes' (expected attn.Tensor, got %s)",
                  attnL_typename(L, -1, buf, sizeof buf));
    }
  }
  lua_getfield(L, arg, "softcap");
  if (lua_type(L, -1) == LUA_TNUMBER) {
    double cap = (double)lua_tonumber(L, -1);
    if (!(cap > 0.0 && cap <= (double)FLT_MAX) || !((float)cap > 0.0f)) {
      char got[64];
      snprintf(got, sizeof got, "%.9g", cap);
      attnL_error(L, fname, "bad option 'softcap' (expected a number > 0, finite in float32, got %s)", got);
    }
    o->softcap = (float)cap;
  } else if (!lua_isnil(L, -1)) {
    attnL_error(L, fname, "bad option 'softcap' (expected a number, got %s)", luaL_typename(L, -1));
  }
  lua_pop(L, 1);
}

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

static int l_sdpa(lua_State *L) {
  attnL_check_nargs(L, 4, SDPA);
  attn_tensor *q = attnL_check(L, 1, SDPA, "q");
  attn_tensor *k = attnL_check(L, 2, SDPA, "k");
  attn_tensor *v = attnL_check(L, 3, SDPA, "v");
  attn_sdpa_opts o = attn_sdpa_defaults();
  int need_weights = 0, return_lse = 0, have_scale = 0, have_p = 0;
  attn_sdpa_kernel kernel = ATTN_SDPA_AUTO;
  double scale = 0.0;
  if (!lua_isnoneornil(L, 4)) {
    if (!lua_istable(L, 4) || attnL_test(L, 4))
      attnL_error(L, SDPA, "bad argument #4 'opts' (expected a table of options, got %s)", luaL_typename(L, 4));
    lua_settop(L, 4);
    check_option_keys(L, 4);
    o.mask = tensor_option(L, 4, "mask");   /* stays on the stack */
    o.bias = tensor_option(L, 4, "bias");   /* stays on the stack */
    o.is_causal = bool_option(L, 4, "is_causal");
    need_weights = bool_option(L, 4, "need_weights");
    return_lse = bool_option(L, 4, "return_lse");
    attnL_sdpa_variant_options(L, 4, SDPA, &o); /* alibi_slopes stays on the stack */
    o.block_mask = attnL_block_mask_option(L, 4, SDPA); /* stays on the stack */
    scale = number_option(L, 4, "scale", &have_scale);
    /* checked as the float32 the kernels use: 1e39 is a finite double but inf in float32 */
    if (have_scale && !(fabs(scale) <= (double)FLT_MAX)) {
      char got[64]; /* lua_pushfstring has no %g */
      snprintf(got, sizeof got, "|scale| <= %.9g, got %.9g", (double)FLT_MAX, scale);
      attnL_error(L, SDPA, "bad option 'scale' (expected a number finite in float32, %s)", got);
    }
    o.dropout_p = number_option(L, 4, "dropout_p", &have_p);
    if (have_p && !(o.dropout_p >= 0.0 && o.dropout_p < 1.0))
      attnL_error(L, SDPA, "bad option 'dropout_p' (expected a number in [0, 1), got %f)", o.dropout_p);
    lua_getfield(L, 4, "kernel");
    if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TSTRING)
        attnL_error(L, SDPA, "bad option 'kernel' (expected \"auto\", \"math\" or \"flash\", got %s)",
                    luaL_typename(L, -1));
      const char *kn = lua_tostring(L, -1);
      if (strcmp(kn, "flash") == 0)
        kernel = ATTN_SDPA_FLASH;
      else if (strcmp(kn, "math") == 0)
        kernel = ATTN_SDPA_MATH;
      else if (strcmp(kn, "auto") != 0)
        attnL_error(L, SDPA, "unknown kernel \"%s\" (expected \"auto\", \"math\" or \"flash\")", kn);
    }
    lua_pop(L, 1);
    /* checked before the shapes, as the other options are */
    const char *why = attn_sdpa_kernel_refuses(kernel, need_weights);
    if (why) attnL_error(L, SDPA, "%s; use kernel = \"math\" or \"auto\"", why);
  }
  if (q->ndim >= 1) {
    int64_t e = q->size[q->ndim - 1];
    o.scale = have_scale ? (float)scale : (float)(1.0 / sqrt((double)e));
  }
  return run(L, SDPA, q, k, v, &o, need_weights, return_lse, kernel);
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
