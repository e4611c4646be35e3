/* attn.core.autograd: the raw forward and backward of scaled dot-product
 * attention that the autograd engine records (src/core/sdpa_backward.h). Not
 * in the public `attn` table (attn copies only core's functions).
 *
 *   out, saved, kernel, draw[, weights][, lse] = sdpa_forward(q, k, v[, opts[, fname]])
 *     opts: mask, bias, is_causal, scale, dropout_p, need_weights, kernel, return_lse and
 *     the variants (enable_gqa, window, alibi_slopes, softcap, block_mask) as
 *     attn.scaled_dot_product_attention's; kernel is the one that ran ("math"
 *     or "flash"); saved is what its backward needs: the softmax before
 *     dropout [B..., Lq, Lk] (math) or the log-sum-exp [B..., Lq] (flash);
 *     draw is the dropout draw of the call (0 without dropout); weights
 *     (need_weights) are the weights after dropout, as the public function's.
 *     fname (a string) names the function in error messages.
 *   dq, dk, dv, dbias = sdpa_backward(dout, q, k, v, out, saved, opts)
 *     opts: the forward's mask, bias, is_causal, scale, dropout_p and variants (block_mask too), plus
 *     kernel (required: what sdpa_forward returned), dropout_draw (its draw)
 *     bias_grad (default true: false skips dbias) and dweights (math only:
 *     the gradient of the weights output, [B..., Lq, Lk]). dq, dk, dv have the
 *     shapes of q, k, v (summed over the dims they were broadcast along; with
 *     enable_gqa, dk and dv sum each kv head's query heads in the core);
 *     dbias the shape of bias, or nil. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "attn_lua.h"
#include "sdpa_dispatch.h"
#include "rng.h"
#include "sdpa_backward.h"

static const char *const FWD = "attn.core.autograd.sdpa_forward";
static const char *const BWD = "attn.core.autograd.sdpa_backward";

void attnL_push_dropout_draw(lua_State *L, attn_dropout_draw d, int holder) {
  if (d.keep && holder)
    lua_pushvalue(L, holder);
  else
    lua_pushinteger(L, (lua_Integer)d.mkl);
}

attn_dropout_draw attnL_check_dropout_draw(lua_State *L, int idx, int64_t numel, const char *fname, const char *what) {
  attn_dropout_draw d = {0, NULL};
  if (lua_isinteger(L, idx) && lua_tointeger(L, idx) >= 0 && lua_tointeger(L, idx) <= (lua_Integer)UINT32_MAX) {
    d.mkl = (uint32_t)lua_tointeger(L, idx);
    return d;
  }
  int64_t words = numel < 0 ? -1 : attn_dropout_keep_words(ATTN_DROPOUT_DEFAULT, numel);
  if (lua_type(L, idx) == LUA_TUSERDATA && !lua_getmetatable(L, idx) && words >= 0 &&
      lua_rawlen(L, idx) == (size_t)words * sizeof(uint64_t)) {
    d.keep = lua_touserdata(L, idx);
    return d;
  }
  return (attnL_error(L, fname, "bad %s (expected the forward's dropout draw: an integer in [0, 2^32), or its keep "
                      "flags for %I elements, got %s)", what, (LUAI_UACINT)numel, luaL_typename(L, idx)), d);
}

typedef struct parsed_opts {
  attn_sdpa_opts o;
  const attn_tensor *dweights; /* backward: the gradient of the weights output, or NULL */
  attn_sdpa_kernel kernel;
  int need_weights, return_lse, bias_grad, draw_idx; /* draw_idx: the dropout_draw option's stack slot, or 0 */
} parsed_opts;

static const char *const fwd_names[] = {"mask",       "bias",         "is_causal", "scale",      "dropout_p",
                                        "need_weights", "kernel",     "return_lse", "enable_gqa", "window",
                                        "alibi_slopes", "softcap",    "block_mask", NULL};
static const char *const bwd_names[] = {"mask",       "bias",       "is_causal", "scale",        "dropout_p",
                                        "kernel",     "dropout_draw", "bias_grad", "dweights",   "enable_gqa",
                                        "window",     "alibi_slopes", "softcap",   "block_mask", NULL};

static void check_keys(lua_State *L, int arg, const char *fname, const char *const *names) {
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1);
    int known = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; names[i]; i++) known |= strcmp(lua_tostring(L, -1), names[i]) == 0;
    if (!known) {
      char list[400] = "";
      for (int i = 0; names[i]; i++) {
        if (i) strcat(list, ", ");
        strcat(list, names[i]);
      }
      if (lua_type(L, -1) == LUA_TSTRING)
        attnL_error(L, fname, "unknown option '%s' (expected one of %s)", lua_tostring(L, -1), list);
      attnL_error(L, fname, "bad option key of type %s (expected one of %s)", luaL_typename(L, -1), list);
    }
  }
}

/* opts[name], left on the stack: a tensor or NULL. */
static attn_tensor *tensor_field(lua_State *L, int arg, const char *fname, const char *name) {
  lua_getfield(L, arg, name);
  if (lua_isnil(L, -1)) return NULL;
  attn_tensor *t = attnL_test(L, -1);
  if (!t) {
    char buf[64];
    attnL_error(L, fname, "bad option '%s' (expected attn.Tensor, got %s)", name, attnL_typename(L, -1, buf, sizeof buf));
  }
  return t;
}

static int bool_field(lua_State *L, int arg, const char *fname, const char *name, int dflt) {
  lua_getfield(L, arg, name);
  int r = dflt;
  if (lua_isboolean(L, -1))
    r = lua_toboolean(L, -1);
  else if (!lua_isnil(L, -1))
    attnL_error(L, fname, "bad option '%s' (expected a boolean, got %s)", name, luaL_typename(L, -1));
  lua_pop(L, 1);
  return r;
}

static double number_field(lua_State *L, int arg, const char *fname, const char *name, int *present) {
  lua_getfield(L, arg, name);
  double r = 0.0;
  *present = lua_type(L, -1) == LUA_TNUMBER;
  if (*present)
    r = (double)lua_tonumber(L, -1);
  else if (!lua_isnil(L, -1))
    attnL_error(L, fname, "bad option '%s' (expected a number, got %s)", name, luaL_typename(L, -1));
  lua_pop(L, 1);
  return r;
}

/* The options table at arg (nil: defaults) into po; mask and bias stay on the
 * stack. q gives the default scale 1/sqrt(E). */
static void parse_opts(lua_State *L, int arg, const char *fname, int backward, const attn_tensor *q, parsed_opts *po) {
  memset(po, 0, sizeof *po);
  po->o = attn_sdpa_defaults();
  po->kernel = ATTN_SDPA_AUTO;
  po->bias_grad = 1;
  int have_scale = 0;
  double scale = 0.0;
  if (!lua_isnoneornil(L, arg)) {
    if (!lua_istable(L, arg) || attnL_test(L, arg))
      attnL_error(L, fname, "bad argument #%d 'opts' (expected a table of options, got %s)", arg,
                  luaL_typename(L, arg));
    check_keys(L, arg, fname, backward ? bwd_names : fwd_names);
    po->o.mask = tensor_field(L, arg, fname, "mask");
    po->o.bias = tensor_field(L, arg, fname, "bias");
    po->o.is_causal = bool_field(L, arg, fname, "is_causal", 0);
    po->o.block_mask = attnL_block_mask_option(L, arg, fname); /* stays on the stack */
    scale = number_field(L, arg, fname, "scale", &have_scale);
    if (have_scale && !(fabs(scale) <= (double)FLT_MAX)) {
      char got[80];
      snprintf(got, sizeof got, "%.9g", scale);
      attnL_error(L, fname, "bad option 'scale' (expected a number finite in float32, got %s)", got);
    }
    attnL_sdpa_variant_options(L, arg, fname, &po->o); /* alibi_slopes stays on the stack */
    int have_p;
    po->o.dropout_p = number_field(L, arg, fname, "dropout_p", &have_p);
    if (have_p && !(po->o.dropout_p >= 0.0 && po->o.dropout_p < 1.0))
      attnL_error(L, fname, "bad option 'dropout_p' (expected a number in [0, 1), got %f)", po->o.dropout_p);
    if (backward) {
      po->dweights = tensor_field(L, arg, fname, "dweights"); /* stays on the stack */
      po->bias_grad = bool_field(L, arg, fname, "bias_grad", 1);
      lua_getfield(L, arg, "dropout_draw"); /* stays on the stack: decoded once the shapes are known */
      if (!lua_isnil(L, -1)) po->draw_idx = lua_gettop(L);
    } else {
      po->need_weights = bool_field(L, arg, fname, "need_weights", 0);
      po->return_lse = bool_field(L, arg, fname, "return_lse", 0);
    }
    lua_getfield(L, arg, "kernel");
    if (!lua_isnil(L, -1)) {
      const char *kn = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
      if (kn && strcmp(kn, "math") == 0)
        po->kernel = ATTN_SDPA_MATH;
      else if (kn && strcmp(kn, "flash") == 0)
        po->kernel = ATTN_SDPA_FLASH;
      else if (!(kn && strcmp(kn, "auto") == 0 && !backward))
        attnL_error(L, fname, "bad option 'kernel' (expected %s, got %s)",
                    backward ? "\"math\" or \"flash\", the kernel the forward ran" : "\"auto\", \"math\" or \"flash\"",
                    luaL_tolstring(L, -1, NULL));
    }
    lua_pop(L, 1);
  }
  if (backward && po->kernel == ATTN_SDPA_AUTO)
    attnL_error(L, fname, "bad argument #7 'opts' (expected option kernel = \"math\" or \"flash\", the kernel the "
                "forward ran)");
  if (backward && po->o.dropout_p > 0.0 && !po->draw_idx)
    attnL_error(L, fname, "bad argument #7 'opts' (dropout_p > 0 needs dropout_draw, the forward's draw)");
  if (q->ndim >= 1) po->o.scale = have_scale ? (float)scale : (float)(1.0 / sqrt((double)q->size[q->ndim - 1]));
}

static int l_sdpa_forward(lua_State *L) {
  attnL_check_nargs(L, 5, FWD);
  /* errors name the caller's function when it passes its name (the recording
   * attn.scaled_dot_product_attention): the user called that, not this */
  const char *FN = lua_type(L, 5) == LUA_TSTRING ? lua_tostring(L, 5) : FWD;
  attn_tensor *q = attnL_check(L, 1, FN, "q");
  attn_tensor *k = attnL_check(L, 2, FN, "k");
  attn_tensor *v = attnL_check(L, 3, FN, "v");
  lua_settop(L, 5);
  parsed_opts po;
  parse_opts(L, 4, FN, 0, q, &po);
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_sdpa_out_shape(q, k, v, &po.o, &ndim, size) != ATTN_OK) attnL_core_error(L, FN);
  int64_t nb = attn_sizes_product(ndim - 2, size), lk = k->size[k->ndim - 2];
  const char *why;
  /* the choice the unrecorded call makes (attn_sdpa_run), so both give the same bits */
  attn_sdpa_kernel kernel = attn_sdpa_choose_kernel_for(po.kernel, nb, size[ndim - 2], lk, q->size[q->ndim - 1],
                                                        size[ndim - 1], po.need_weights,
                                                        attn_sdpa_gqa_group_of(q, k, &po.o), &po.o, &why);
  if (kernel == ATTN_SDPA_AUTO) attnL_error(L, FN, "%s; use kernel = \"math\" or \"auto\"", why);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, FN);
  size[ndim - 1] = lk;
  if (kernel == ATTN_SDPA_MATH)
    po.o.probs = attnL_push_uninit(L, ndim, size, FN);
  else
    po.o.lse = attnL_push_uninit(L, ndim - 1, size, FN);
  int saved_idx = lua_gettop(L);
  attn_tensor *weights = po.need_weights ? attnL_push_uninit(L, ndim, size, FN) : NULL;
  /* the lse asked for: the math kernel's own, a copy of flash's saved one */
  attn_tensor *lse = po.return_lse ? attnL_push_uninit(L, ndim - 1, size, FN) : NULL;
  if (lse && kernel == ATTN_SDPA_MATH) po.o.lse = lse;
  int holder = 0;
  if (po.o.dropout_p > 0.0) { /* over the weights [B..., Lq, Lk], as the public function */
    int64_t numel;
    if (__builtin_mul_overflow(attn_sizes_product(ndim - 1, size), lk, &numel)) numel = -1;
    po.o.dropout_draw = attnL_draw_dropout(L, po.o.dropout_p, numel, FN);
    holder = lua_gettop(L);
  }
  attn_status st = kernel == ATTN_SDPA_MATH ? attn_sdpa_math(q, k, v, &po.o, out, weights)
                                            : attn_sdpa_flash(q, k, v, &po.o, out);
  if (st != ATTN_OK) attnL_core_error(L, FN);
  if (lse && kernel == ATTN_SDPA_FLASH) memcpy(lse->data, po.o.lse->data, (size_t)attn_numel(lse) * sizeof(float));
  /* out, saved, kernel, draw[, weights][, lse] */
  lua_pushstring(L, kernel == ATTN_SDPA_MATH ? "math" : "flash");
  attnL_push_dropout_draw(L, po.o.dropout_draw, holder);
  if (holder) lua_remove(L, holder);
  lua_rotate(L, saved_idx + 1, 2);
  return 4 + (weights != NULL) + (lse != NULL);
}

/* Does t have exactly the sizes (ndim, size)? */
static int same_sizes(const attn_tensor *t, int ndim, const int64_t *size) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++)
    if (t->size[d] != size[d]) return 0;
  return 1;
}

/* A gradient in the expanded shape (ndim, size): pushed as the result when
 * the operand t has that shape, else pushed as scratch with the result (t's
 * shape) pushed above it at sum time. Returns the expanded tensor. */
static attn_tensor *push_grad(lua_State *L, const attn_tensor *t, int ndim, const int64_t *size) {
  return same_sizes(t, ndim, size) ? attnL_push_uninit(L, t->ndim, t->size, BWD) : attnL_push_uninit(L, ndim, size, BWD);
}

/* Replace the expanded gradient at idx by its sum to t's shape (when t was broadcast). */
static void sum_back(lua_State *L, int idx, const attn_tensor *t) {
  attn_tensor *full = lua_touserdata(L, idx);
  if (same_sizes(t, full->ndim, full->size)) return;
  attn_tensor *g = attnL_push_uninit(L, t->ndim, t->size, BWD);
  if (attn_sdpa_sum_to(full, g) != ATTN_OK) attnL_core_error(L, BWD);
  lua_replace(L, idx);
}

static int l_sdpa_backward(lua_State *L) {
  attnL_check_nargs(L, 7, BWD);
  attn_tensor *dout = attnL_check(L, 1, BWD, "dout");
  attn_tensor *q = attnL_check(L, 2, BWD, "q");
  attn_tensor *k = attnL_check(L, 3, BWD, "k");
  attn_tensor *v = attnL_check(L, 4, BWD, "v");
  attn_tensor *out = attnL_check(L, 5, BWD, "out");
  attn_tensor *saved = attnL_check(L, 6, BWD, "saved");
  lua_settop(L, 7);
  parsed_opts po;
  parse_opts(L, 7, BWD, 1, q, &po);
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_sdpa_out_shape(q, k, v, &po.o, &ndim, size) != ATTN_OK) attnL_core_error(L, BWD);
  char b1[200], b2[200];
  if (!same_sizes(dout, ndim, size))
    attnL_error(L, BWD, "bad argument #1 'dout' (expected the shape of out %s, got %s)",
                attn_sizes_str(ndim, size, b1, sizeof b1), attnL_shape(dout, b2, sizeof b2));
  if (!same_sizes(out, ndim, size))
    attnL_error(L, BWD, "bad argument #5 'out' (expected the forward's out %s, got %s)",
                attn_sizes_str(ndim, size, b1, sizeof b1), attnL_shape(out, b2, sizeof b2));
  int64_t lq = size[ndim - 2], lk = k->size[k->ndim - 2], e = q->size[q->ndim - 1], ev = size[ndim - 1];
  int64_t want[ATTN_MAX_DIMS];
  memcpy(want, size, sizeof want);
  want[ndim - 1] = lk;
  int saved_ok = po.kernel == ATTN_SDPA_MATH ? same_sizes(saved, ndim, want) : same_sizes(saved, ndim - 1, want);
  if (!saved_ok || !attn_is_contiguous(saved))
    attnL_error(L, BWD, "bad argument #6 'saved' (expected the %s forward's contiguous %s %s, got %s%s)",
                po.kernel == ATTN_SDPA_MATH ? "math" : "flash", po.kernel == ATTN_SDPA_MATH ? "probs" : "lse",
                attn_sizes_str(po.kernel == ATTN_SDPA_MATH ? ndim : ndim - 1, want, b1, sizeof b1),
                attnL_shape(saved, b2, sizeof b2), saved_ok ? ", not contiguous" : "");

  if (po.dweights) {
    if (po.kernel != ATTN_SDPA_MATH)
      attnL_error(L, BWD, "bad option 'dweights' (the weights are the math kernel's; the forward ran \"flash\")");
    if (!same_sizes(po.dweights, ndim, want))
      attnL_error(L, BWD, "bad option 'dweights' (expected the weights' shape %s, got %s)",
                  attn_sizes_str(ndim, want, b1, sizeof b1), attnL_shape(po.dweights, b2, sizeof b2));
  }
  if (po.o.dropout_p > 0.0) {
    int64_t numel;
    if (__builtin_mul_overflow(attn_sizes_product(ndim - 1, size), lk, &numel)) numel = -1;
    po.o.dropout_draw = attnL_check_dropout_draw(L, po.draw_idx, numel, BWD, "option 'dropout_draw'");
  }
  int base = lua_gettop(L);
  attn_sdpa_grads g = {NULL, NULL, NULL, NULL};
  want[ndim - 2] = lq, want[ndim - 1] = e;
  g.dq = push_grad(L, q, ndim, want);
  /* dk, dv: one per kv head (enable_gqa: the group's query heads summed in the
   * core; a group of 1 is plain attention, its gradients broadcast as q's) */
  int gqa = po.o.enable_gqa && q->size[q->ndim - 3] > k->size[k->ndim - 3];
  if (gqa) want[ndim - 3] = k->size[k->ndim - 3];
  want[ndim - 2] = lk;
  g.dk = push_grad(L, k, ndim, want);
  want[ndim - 1] = ev;
  g.dv = push_grad(L, v, ndim, want);
  if (gqa) want[ndim - 3] = size[ndim - 3];
  if (po.o.bias && po.bias_grad) {
    want[ndim - 2] = lq, want[ndim - 1] = lk;
    g.dbias = push_grad(L, po.o.bias, ndim, want);
  }
  if (attn_sdpa_backward(po.kernel, q, k, v, &po.o, out, dout, saved, po.dweights, &g) != ATTN_OK) attnL_core_error(L, BWD);
  sum_back(L, base + 1, q);
  sum_back(L, base + 2, k);
  sum_back(L, base + 3, v);
  if (g.dbias)
    sum_back(L, base + 4, po.o.bias);
  else
    lua_pushnil(L);
  return 4;
}

static const luaL_Reg funcs[] = {
    {"sdpa_forward", l_sdpa_forward},
    {"sdpa_backward", l_sdpa_backward},
    {NULL, NULL},
};

void attnL_open_sdpa_autograd(lua_State *L) {
  lua_newtable(L);
  luaL_setfuncs(L, funcs, 0);
  lua_setfield(L, -4, "autograd"); /* module, methods, metatable, this */
}
