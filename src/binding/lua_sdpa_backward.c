/* attn.core.autograd: the raw forward and backward of scaled dot-product
 * attention that the autograd engine records (src/core/sdpa_backward.h). Not
 * in the public `attn` table (attn copies only core's functions). The
 * forward lives beside the plain call (src/binding/lua_attention.c, which
 * also makes the table); the backward is here. Both parse their options
 * with src/binding/lua_sdpa_options.c.
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
#include <string.h>

#include "attn_lua.h"
#include "lua_sdpa_options.h"
#include "rng.h"
#include "sdpa_backward.h"

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

/* dout, q, k, v, out, saved, opts -> dq, dk, dv, dbias */
int attnL_sdpa_backward(lua_State *L) {
  attnL_check_nargs(L, 7, BWD);
  attn_tensor *dout = attnL_check(L, 1, BWD, "dout");
  attn_tensor *q = attnL_check(L, 2, BWD, "q");
  attn_tensor *k = attnL_check(L, 3, BWD, "k");
  attn_tensor *v = attnL_check(L, 4, BWD, "v");
  attn_tensor *out = attnL_check(L, 5, BWD, "out");
  attn_tensor *saved = attnL_check(L, 6, BWD, "saved");
  lua_settop(L, 7);
  attnL_sdpa_call c;
  attnL_sdpa_parse_options(L, 7, BWD, ATTNL_SDPA_BACKWARD, q, &c);
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_sdpa_out_shape(q, k, v, &c.o, &ndim, size) != ATTN_OK) attnL_core_error(L, BWD);
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
  int saved_ok = c.kernel == ATTN_SDPA_MATH ? same_sizes(saved, ndim, want) : same_sizes(saved, ndim - 1, want);
  if (!saved_ok || !attn_is_contiguous(saved))
    attnL_error(L, BWD, "bad argument #6 'saved' (expected the %s forward's contiguous %s %s, got %s%s)",
                c.kernel == ATTN_SDPA_MATH ? "math" : "flash", c.kernel == ATTN_SDPA_MATH ? "probs" : "lse",
                attn_sizes_str(c.kernel == ATTN_SDPA_MATH ? ndim : ndim - 1, want, b1, sizeof b1),
                attnL_shape(saved, b2, sizeof b2), saved_ok ? ", not contiguous" : "");

  if (c.dweights) {
    if (c.kernel != ATTN_SDPA_MATH)
      attnL_error(L, BWD, "bad option 'dweights' (the weights are the math kernel's; the forward ran \"flash\")");
    if (!same_sizes(c.dweights, ndim, want))
      attnL_error(L, BWD, "bad option 'dweights' (expected the weights' shape %s, got %s)",
                  attn_sizes_str(ndim, want, b1, sizeof b1), attnL_shape(c.dweights, b2, sizeof b2));
  }
  if (c.o.dropout_p > 0.0) {
    int64_t numel;
    if (__builtin_mul_overflow(attn_sizes_product(ndim - 1, size), lk, &numel)) numel = -1;
    c.o.dropout_draw = attnL_check_dropout_draw(L, c.draw_idx, numel, BWD, "option 'dropout_draw'");
  }
  /* the score_mod tables' gradients asked for: zeroed tensors of their shapes, in a list (the 5th result) */
  int tgrads = 0;
  if (c.score_mod && c.table_grads_idx) {
    lua_newtable(L);
    tgrads = lua_gettop(L);
    for (int t = 0; t < c.score_mod->ntables; t++) {
      lua_geti(L, c.table_grads_idx, t + 1);
      int want_grad = lua_toboolean(L, -1);
      lua_pop(L, 1);
      if (!want_grad) continue;
      attn_smod_table *tb = &c.score_mod->tables[t];
      attn_tensor *gt = attnL_push_uninit(L, tb->ndim, tb->size, BWD);
      memset(gt->data, 0, (size_t)attn_numel(gt) * sizeof(float));
      tb->grad = gt->data;
      lua_rawseti(L, tgrads, t + 1);
    }
  }
  attn_sdpa_grads g = {NULL, NULL, NULL, NULL};
  want[ndim - 2] = lq, want[ndim - 1] = e;
  int base = lua_gettop(L);
  g.dq = push_grad(L, q, ndim, want);
  /* dk, dv: one per kv head (enable_gqa: the group's query heads summed in the
   * core; a group of 1 is plain attention, its gradients broadcast as q's) */
  int gqa = c.o.enable_gqa && q->size[q->ndim - 3] > k->size[k->ndim - 3];
  if (gqa) want[ndim - 3] = k->size[k->ndim - 3];
  want[ndim - 2] = lk;
  g.dk = push_grad(L, k, ndim, want);
  want[ndim - 1] = ev;
  g.dv = push_grad(L, v, ndim, want);
  if (gqa) want[ndim - 3] = size[ndim - 3];
  if (c.o.bias && c.bias_grad) {
    want[ndim - 2] = lq, want[ndim - 1] = lk;
    g.dbias = push_grad(L, c.o.bias, ndim, want);
  }
  if (attn_sdpa_backward(c.kernel, q, k, v, &c.o, out, dout, saved, c.dweights, &g) != ATTN_OK) attnL_core_error(L, BWD);
  sum_back(L, base + 1, q);
  sum_back(L, base + 2, k);
  sum_back(L, base + 3, v);
  if (g.dbias)
    sum_back(L, base + 4, c.o.bias);
  else
    lua_pushnil(L);
  if (!tgrads) return 4;
  lua_pushvalue(L, tgrads);
  return 5;
}
