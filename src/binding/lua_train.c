/* attn.core.train: the raw training kernels of src/core/train.h (LayerNorm,
 * GELU, cross entropy, embedding: forward and backward; SGD / Adam / AdamW
 * steps; clip_grad_norm_'s factor), for the Lua layer (lua/attn/autograd/
 * train_ops.lua, lua/attn/nn/, lua/attn/optim/). Not public in `attn`.
 *
 * Every function takes an optional last argument `fname`, the public name its
 * errors are raised under (default "attn.core.train.NAME"), so that a user of
 * nn.functional.cross_entropy reads that name. Strided inputs are copied to
 * contiguous ones here; the in-place optimizer operands must be contiguous. */
#include <stdarg.h>
#include <string.h>

#include "attn_lua.h"
#include "ops.h"
#include "train.h"

/* The optional fname at arg (a string), else the default. */
static const char *fname_at(lua_State *L, int arg, const char *dflt) {
  return lua_type(L, arg) == LUA_TSTRING ? lua_tostring(L, arg) : dflt;
}

/* Raise "fname: message" at the user's call, as attnL_error: called by the
 * Lua layer (with a public fname) or directly (the raw "attn.core.train.*"
 * name), the position is the user's line, never one inside attn's Lua files. */
static int train_error(lua_State *L, const char *fname, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  attnL_where(L);
  lua_pushfstring(L, "%s: ", fname);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 3);
  return lua_error(L);
}

/* A contiguous tensor for the tensor argument arg (pushed on the stack, which keeps it alive). */
static const attn_tensor *input(lua_State *L, int arg, const char *fname, const char *what) {
  attnL_check(L, arg, fname, what);
  return attnL_push_contiguous(L, arg, fname);
}

/* The tensor at arg, or NULL for nil. */
static const attn_tensor *opt_input(lua_State *L, int arg, const char *fname, const char *what) {
  if (lua_isnoneornil(L, arg)) return NULL;
  return input(L, arg, fname, what);
}

/* A 2-D view [rows, last] of a contiguous tensor (rows: the product of the other dims). */
static attn_tensor as_rows(const attn_tensor *t) {
  int64_t last = t->ndim > 0 ? t->size[t->ndim - 1] : 1;
  int64_t rows = 1;
  for (int d = 0; d + 1 < t->ndim; d++) rows *= t->size[d];
  int64_t size[2] = {rows, last};
  return attn_make(t->data, 2, size);
}

/* A 1-D view [numel] of a contiguous tensor. */
static attn_tensor as_flat(const attn_tensor *t) {
  int64_t n = attn_numel(t);
  return attn_make(t->data, 1, &n);
}

static void check_status(lua_State *L, attn_status st, const char *fname) {
  if (st != ATTN_OK) train_error(L, fname, "%s", attn_error_message());
}

/* Whether shape a equals shape b with its last dim dropped. */
static int is_leading_shape(const attn_tensor *a, const attn_tensor *b) {
  if (a->ndim != b->ndim - 1) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->size[d] != b->size[d]) return 0;
  return 1;
}

static attn_gelu_approximate check_approximate(lua_State *L, int arg, const char *fname) {
  const char *s = lua_tostring(L, arg);
  if (lua_type(L, arg) != LUA_TSTRING || (strcmp(s, "none") && strcmp(s, "tanh")))
    train_error(L, fname, "bad option 'approximate' (expected \"none\" or \"tanh\", got %s)",
                lua_type(L, arg) == LUA_TSTRING ? s : luaL_typename(L, arg));
  return strcmp(s, "tanh") == 0 ? ATTN_GELU_TANH : ATTN_GELU_ERF;
}

static attn_reduction check_reduction(lua_State *L, int arg, const char *fname) {
  const char *s = lua_tostring(L, arg);
  if (lua_type(L, arg) == LUA_TSTRING) {
    if (!strcmp(s, "mean")) return ATTN_REDUCTION_MEAN;
    if (!strcmp(s, "sum")) return ATTN_REDUCTION_SUM;
    if (!strcmp(s, "none")) return ATTN_REDUCTION_NONE;
  }
  train_error(L, fname, "bad option 'reduction' (expected \"mean\", \"sum\" or \"none\", got %s)",
              lua_type(L, arg) == LUA_TSTRING ? s : luaL_typename(L, arg));
  return ATTN_REDUCTION_MEAN;
}

/* ------------------------------------------------------------------ Linear */

/* linear(x, weight, bias[, fname]) -> x @ weight^T + bias, the bits of
 * attn.matmul(x, weight:t()) followed by + bias (the bias added in the
 * product's stores): x [..., in], weight [out, in], bias [out]. */
static int l_linear(lua_State *L) {
  const char *fname = fname_at(L, 4, "attn.core.train.linear");
  attn_tensor *x = attnL_check(L, 1, fname, "input");
  attn_tensor *w = attnL_check(L, 2, fname, "weight");
  const attn_tensor *b = input(L, 3, fname, "bias");
  char s1[128], s2[128];
  if (w->ndim != 2) train_error(L, fname, "'weight' must be 2-D [out, in], got %s", attnL_shape(w, s1, sizeof s1));
  if (b->ndim != 1 || b->size[0] != w->size[0])
    train_error(L, fname, "'bias' of shape %s does not fit weight %s (expected [%I])", attnL_shape(b, s1, sizeof s1),
                attnL_shape(w, s2, sizeof s2), (lua_Integer)w->size[0]);
  attn_tensor wt = *w; /* weight^T: a view */
  wt.size[0] = w->size[1], wt.size[1] = w->size[0];
  wt.stride[0] = w->stride[1], wt.stride[1] = w->stride[0];
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_matmul_shape(x, &wt, &ndim, size) != ATTN_OK) attnL_core_error(L, fname);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fname);
  if (attn_matmul_add_bias(x, &wt, b, out) != ATTN_OK) attnL_core_error(L, fname);
  return 1;
}

/* ------------------------------------------------------------------ LayerNorm */

/* layer_norm(x, weight, bias, eps[, fname]) -> y, mean, rstd
 *   x [..., D]; weight, bias [D] or nil -> y [..., D]; mean, rstd [N] (N = rows of x) */
static int l_layer_norm(lua_State *L) {
  const char *fname = fname_at(L, 5, "attn.core.train.layer_norm");
  const attn_tensor *x = input(L, 1, fname, "input");
  const attn_tensor *w = opt_input(L, 2, fname, "weight");
  const attn_tensor *b = opt_input(L, 3, fname, "bias");
  double eps = attnL_checknumber(L, 4, fname, "eps");
  char s1[128], s2[128];
  if (x->ndim < 1) train_error(L, fname, "'input' must have at least 1 dim, got a 0-dim tensor");
  int64_t d = x->size[x->ndim - 1];
  if (w && (w->ndim != 1 || w->size[0] != d))
    train_error(L, fname, "'weight' of shape %s does not fit input %s (expected [%I])", attnL_shape(w, s1, sizeof s1),
                attnL_shape(x, s2, sizeof s2), (lua_Integer)d);
  if (b && (b->ndim != 1 || b->size[0] != d))
    train_error(L, fname, "'bias' of shape %s does not fit input %s (expected [%I])", attnL_shape(b, s1, sizeof s1),
                attnL_shape(x, s2, sizeof s2), (lua_Integer)d);
  if (!(eps >= 0.0)) train_error(L, fname, "bad option 'eps' (expected a number >= 0, got %f)", eps);
  attn_tensor x2 = as_rows(x);
  attn_tensor *y = attnL_push_uninit(L, x->ndim, x->size, fname);
  attn_tensor *mean = attnL_push_uninit(L, 1, &x2.size[0], fname);
  attn_tensor *rstd = attnL_push_uninit(L, 1, &x2.size[0], fname);
  attn_tensor y2 = as_rows(y);
  check_status(L, attn_layer_norm_forward(&x2, w, b, eps, &y2, mean, rstd), fname);
  return 3;
}

/* layer_norm_backward(grad, x, mean, rstd, weight, want_dx, want_dweight, want_dbias[, fname])
 *   -> dx [..., D] or nil, dweight [D] or nil, dbias [D] or nil */
static int l_layer_norm_backward(lua_State *L) {
  const char *fname = fname_at(L, 9, "attn.core.train.layer_norm_backward");
  const attn_tensor *g = input(L, 1, fname, "grad");
  const attn_tensor *x = input(L, 2, fname, "x");
  const attn_tensor *mean = input(L, 3, fname, "mean");
  const attn_tensor *rstd = input(L, 4, fname, "rstd");
  const attn_tensor *w = opt_input(L, 5, fname, "weight");
  int want_dx = lua_toboolean(L, 6), want_dw = lua_toboolean(L, 7), want_db = lua_toboolean(L, 8);
  char s1[128], s2[128];
  if (x->ndim < 1 || !attn_same_shape(g, x))
    train_error(L, fname, "'grad' of shape %s does not match x %s", attnL_shape(g, s1, sizeof s1),
                attnL_shape(x, s2, sizeof s2));
  int64_t d = x->size[x->ndim - 1];
  attn_tensor x2 = as_rows(x), g2 = as_rows(g);
  int at_dx = 0, at_dw = 0, at_db = 0;
  attn_tensor *dx = NULL, *dw = NULL, *db = NULL;
  if (want_dx) dx = attnL_push_uninit(L, x->ndim, x->size, fname), at_dx = lua_gettop(L);
  if (want_dw) dw = attnL_push_uninit(L, 1, &d, fname), at_dw = lua_gettop(L);
  if (want_db) db = attnL_push_uninit(L, 1, &d, fname), at_db = lua_gettop(L);
  attn_tensor dx2 = dx ? as_rows(dx) : x2;
  attn_tensor mean1 = as_flat(mean), rstd1 = as_flat(rstd);
  check_status(L, attn_layer_norm_backward(&g2, &x2, &mean1, &rstd1, w, dx ? &dx2 : NULL, dw, db), fname);
  const int at[3] = {at_dx, at_dw, at_db};
  for (int k = 0; k < 3; k++) {
    if (at[k]) lua_pushvalue(L, at[k]);
    else lua_pushnil(L);
  }
  return 3;
}

/* ------------------------------------------------------------------ GELU */

/* gelu(x, approximate[, fname]) -> y of x's shape; approximate "none" or "tanh" */
static int l_gelu(lua_State *L) {
  const char *fname = fname_at(L, 3, "attn.core.train.gelu");
  const attn_tensor *x = input(L, 1, fname, "input");
  attn_gelu_approximate a = check_approximate(L, 2, fname);
  attn_tensor *y = attnL_push_uninit(L, x->ndim, x->size, fname);
  check_status(L, attn_gelu_forward(x, y, a), fname);
  return 1;
}

/* gelu_backward(grad, x, approximate[, fname]) -> dx of x's shape */
static int l_gelu_backward(lua_State *L) {
  const char *fname = fname_at(L, 4, "attn.core.train.gelu_backward");
  const attn_tensor *g = input(L, 1, fname, "grad");
  const attn_tensor *x = input(L, 2, fname, "x");
  attn_gelu_approximate a = check_approximate(L, 3, fname);
  char s1[128], s2[128];
  if (!attn_same_shape(g, x))
    train_error(L, fname, "'grad' of shape %s does not match x %s", attnL_shape(g, s1, sizeof s1),
                attnL_shape(x, s2, sizeof s2));
  attn_tensor *dx = attnL_push_uninit(L, x->ndim, x->size, fname);
  check_status(L, attn_gelu_backward(g, x, dx, a), fname);
  return 1;
}

/* ------------------------------------------------------------------ cross entropy */

/* The shared checks of cross_entropy and its backward: logits [..., C], target [...]. */
static void check_logits_target(lua_State *L, const attn_tensor *logits, const attn_tensor *target, const char *fname) {
  char s1[128], s2[128];
  if (logits->ndim < 1) train_error(L, fname, "'input' must have at least 1 dim ([..., C]), got a 0-dim tensor");
  if (!is_leading_shape(target, logits)) {
    attn_tensor want = *logits;
    want.ndim--;
    char s3[128];
    train_error(L, fname, "'target' of shape %s does not fit input %s (expected %s: one class id per row)",
                attnL_shape(target, s1, sizeof s1), attnL_shape(logits, s2, sizeof s2), attnL_shape(&want, s3, sizeof s3));
  }
}

/* cross_entropy(logits, target, ignore_index, reduction, label_smoothing[, fname]) -> loss, lse, counted
 *   logits [..., C], target [...] (1-based ids) -> loss [...] (none) or [] (mean, sum), lse [N] */
static int l_cross_entropy(lua_State *L) {
  const char *fname = fname_at(L, 6, "attn.core.train.cross_entropy");
  const attn_tensor *logits = input(L, 1, fname, "input");
  const attn_tensor *target = input(L, 2, fname, "target");
  double ignore_index = attnL_checknumber(L, 3, fname, "ignore_index");
  attn_reduction red = check_reduction(L, 4, fname);
  double ls = attnL_checknumber(L, 5, fname, "label_smoothing");
  if (!(ls >= 0.0 && ls <= 1.0))
    train_error(L, fname, "bad option 'label_smoothing' (expected a number in [0, 1], got %f)", ls);
  check_logits_target(L, logits, target, fname);
  attn_tensor l2 = as_rows(logits), t1 = as_flat(target);
  attn_tensor *loss = red == ATTN_REDUCTION_NONE ? attnL_push_uninit(L, target->ndim, target->size, fname)
                                                 : attnL_push_uninit(L, 0, NULL, fname);
  attn_tensor *lse = attnL_push_uninit(L, 1, &l2.size[0], fname);
  attn_tensor loss1 = as_flat(loss);
  int64_t counted = 0;
  check_status(L, attn_cross_entropy_forward(&l2, &t1, ignore_index, red, ls, &loss1, lse, &counted), fname);
  lua_pushinteger(L, (lua_Integer)counted);
  return 3;
}

/* cross_entropy_backward(grad, logits, target, lse, ignore_index, reduction, label_smoothing[, fname])
 *   -> dlogits of logits' shape; grad has the loss's shape */
static int l_cross_entropy_backward(lua_State *L) {
  const char *fname = fname_at(L, 8, "attn.core.train.cross_entropy_backward");
  const attn_tensor *g = input(L, 1, fname, "grad");
  const attn_tensor *logits = input(L, 2, fname, "logits");
  const attn_tensor *target = input(L, 3, fname, "target");
  const attn_tensor *lse = input(L, 4, fname, "lse");
  double ignore_index = attnL_checknumber(L, 5, fname, "ignore_index");
  attn_reduction red = check_reduction(L, 6, fname);
  double ls = attnL_checknumber(L, 7, fname, "label_smoothing");
  check_logits_target(L, logits, target, fname);
  char s1[128], s2[128];
  if (red == ATTN_REDUCTION_NONE ? !attn_same_shape(g, target) : attn_numel(g) != 1)
    train_error(L, fname, "'grad' of shape %s does not fit the loss (target %s, reduction %s)",
                attnL_shape(g, s1, sizeof s1), attnL_shape(target, s2, sizeof s2), lua_tostring(L, 6));
  attn_tensor l2 = as_rows(logits), t1 = as_flat(target), g1 = as_flat(g), lse1 = as_flat(lse);
  attn_tensor *dl = attnL_push_uninit(L, logits->ndim, logits->size, fname);
  attn_tensor dl2 = as_rows(dl);
  check_status(L, attn_cross_entropy_backward(&g1, &l2, &t1, &lse1, ignore_index, red, ls, &dl2), fname);
  return 1;
}

/* ------------------------------------------------------------------ embedding */

/* embedding(weight, ids[, fname]) -> out [ids..., D]; weight [V, D], ids 1-based */
static int l_embedding(lua_State *L) {
  const char *fname = fname_at(L, 3, "attn.core.train.embedding");
  const attn_tensor *w = input(L, 1, fname, "weight");
  const attn_tensor *ids = input(L, 2, fname, "input");
  char s1[128];
  if (w->ndim != 2) train_error(L, fname, "'weight' must be 2-D [num_embeddings, embedding_dim], got %s", attnL_shape(w, s1, sizeof s1));
  if (ids->ndim >= ATTN_MAX_DIMS)
    train_error(L, fname, "'input' has %d dims; the result would have more than %d", ids->ndim, ATTN_MAX_DIMS);
  check_status(L, attn_embedding_check_ids(ids, w->size[0]), fname); /* before allocating the output */
  int64_t size[ATTN_MAX_DIMS];
  for (int d = 0; d < ids->ndim; d++) size[d] = ids->size[d];
  size[ids->ndim] = w->size[1];
  attn_tensor *out = attnL_push_uninit(L, ids->ndim + 1, size, fname);
  attn_tensor ids1 = as_flat(ids), out2 = as_rows(out);
  check_status(L, attn_embedding_forward(w, &ids1, &out2), fname);
  return 1;
}

/* embedding_backward(grad, ids, num_embeddings[, fname]) -> dweight [V, D]; grad [ids..., D] */
static int l_embedding_backward(lua_State *L) {
  const char *fname = fname_at(L, 4, "attn.core.train.embedding_backward");
  const attn_tensor *g = input(L, 1, fname, "grad");
  const attn_tensor *ids = input(L, 2, fname, "ids");
  int64_t v = attnL_checkinteger(L, 3, fname, "num_embeddings");
  char s1[128], s2[128];
  if (!is_leading_shape(ids, g))
    train_error(L, fname, "'grad' of shape %s does not fit ids %s", attnL_shape(g, s1, sizeof s1),
                attnL_shape(ids, s2, sizeof s2));
  if (v < 0) train_error(L, fname, "bad argument #3 'num_embeddings' (expected >= 0, got %I)", (lua_Integer)v);
  int64_t size[2] = {v, g->size[g->ndim - 1]};
  attn_tensor *dw = attnL_push_uninit(L, 2, size, fname);
  attn_tensor ids1 = as_flat(ids), g2 = as_rows(g);
  check_status(L, attn_embedding_backward(&g2, &ids1, dw), fname);
  return 1;
}

/* ------------------------------------------------------------------ optimizers */

/* An in-place operand: a contiguous tensor of the parameter's element count. */
static attn_tensor *state_tensor(lua_State *L, int arg, const char *fname, const char *what, const attn_tensor *param) {
  attn_tensor *t = attnL_check(L, arg, fname, what);
  char s1[128];
  if (!attn_is_contiguous(t))
    train_error(L, fname, "'%s' must be a contiguous tensor (got a strided view of shape %s)", what,
                attnL_shape(t, s1, sizeof s1));
  if (param && !attn_same_shape(t, param)) {
    char s2[128];
    train_error(L, fname, "'%s' of shape %s does not match the parameter %s", what, attnL_shape(t, s1, sizeof s1),
                attnL_shape(param, s2, sizeof s2));
  }
  return t;
}

static const attn_tensor *grad_of(lua_State *L, int arg, const char *fname, const attn_tensor *param) {
  const attn_tensor *g = input(L, arg, fname, "grad");
  char s1[128], s2[128];
  if (!attn_same_shape(g, param))
    train_error(L, fname, "'grad' of shape %s does not match the parameter %s", attnL_shape(g, s1, sizeof s1),
                attnL_shape(param, s2, sizeof s2));
  return g;
}

/* sgd_step(param, grad, momentum_buffer|nil, first_step, lr, momentum, dampening, weight_decay, nesterov[, fname]) */
static int l_sgd_step(lua_State *L) {
  const char *fname = fname_at(L, 10, "attn.core.train.sgd_step");
  attn_tensor *p = state_tensor(L, 1, fname, "param", NULL);
  const attn_tensor *g = grad_of(L, 2, fname, p);
  attn_tensor *buf = lua_isnoneornil(L, 3) ? NULL : state_tensor(L, 3, fname, "momentum_buffer", p);
  attn_sgd_options o;
  int first = lua_toboolean(L, 4);
  o.lr = attnL_checknumber(L, 5, fname, "lr");
  o.momentum = attnL_checknumber(L, 6, fname, "momentum");
  o.dampening = attnL_checknumber(L, 7, fname, "dampening");
  o.weight_decay = attnL_checknumber(L, 8, fname, "weight_decay");
  o.nesterov = lua_toboolean(L, 9);
  check_status(L, attn_sgd_step(p, g, buf, first, &o), fname);
  attnL_bump_version(L, 1, fname); /* in-place writes: autograd's version counter */
  if (buf) attnL_bump_version(L, 3, fname);
  return 0;
}

/* adam_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, decoupled[, fname]) */
static int l_adam_step(lua_State *L) {
  const char *fname = fname_at(L, 12, "attn.core.train.adam_step");
  attn_tensor *p = state_tensor(L, 1, fname, "param", NULL);
  const attn_tensor *g = grad_of(L, 2, fname, p);
  attn_tensor *m = state_tensor(L, 3, fname, "exp_avg", p);
  attn_tensor *v = state_tensor(L, 4, fname, "exp_avg_sq", p);
  attn_adam_options o;
  int64_t step = attnL_checkinteger(L, 5, fname, "step");
  o.lr = attnL_checknumber(L, 6, fname, "lr");
  o.beta1 = attnL_checknumber(L, 7, fname, "beta1");
  o.beta2 = attnL_checknumber(L, 8, fname, "beta2");
  o.eps = attnL_checknumber(L, 9, fname, "eps");
  o.weight_decay = attnL_checknumber(L, 10, fname, "weight_decay");
  o.decoupled_weight_decay = lua_toboolean(L, 11);
  check_status(L, attn_adam_step(p, g, m, v, step, &o), fname);
  attnL_bump_version(L, 1, fname); /* in-place writes: autograd's version counter */
  attnL_bump_version(L, 3, fname);
  attnL_bump_version(L, 4, fname);
  return 0;
}

/* clip_grad_norm_coef({grad, ...}, max_norm[, fname]) -> total_norm, clip_coef (numbers, float32 values) */
static int l_clip_grad_norm_coef(lua_State *L) {
  const char *fname = fname_at(L, 3, "attn.core.train.clip_grad_norm_coef");
  if (!lua_istable(L, 1)) {
    char buf[64];
    train_error(L, fname, "bad argument #1 'grads' (expected a list of attn.Tensor, got %s)",
                attnL_typename(L, 1, buf, sizeof buf));
  }
  double max_norm = attnL_checknumber(L, 2, fname, "max_norm");
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  if (n > 1000000) train_error(L, fname, "too many gradients (%I)", (lua_Integer)n);
  /* the contiguous gradients stay on the stack; their descriptors in a userdata array */
  luaL_checkstack(L, 8, fname);
  const attn_tensor **list = lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *list, 0);
  lua_newtable(L); /* keeps the contiguous copies alive */
  int keep = lua_gettop(L);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    if (!attnL_test(L, -1)) {
      char buf[64];
      train_error(L, fname, "gradient #%I is not an attn.Tensor (got %s)", (lua_Integer)i,
                  attnL_typename(L, -1, buf, sizeof buf));
    }
    list[i - 1] = attnL_push_contiguous(L, lua_gettop(L), fname);
    lua_rawseti(L, keep, i);
    lua_pop(L, 1);
  }
  float total, coef;
  check_status(L, attn_clip_grad_norm_coef(list, (int)n, max_norm, &total, &coef), fname);
  lua_pushnumber(L, (lua_Number)total);
  lua_pushnumber(L, (lua_Number)coef);
  return 2;
}

static const luaL_Reg funcs[] = {
    {"linear", l_linear},
    {"layer_norm", l_layer_norm},
    {"layer_norm_backward", l_layer_norm_backward},
    {"gelu", l_gelu},
    {"gelu_backward", l_gelu_backward},
    {"cross_entropy", l_cross_entropy},
    {"cross_entropy_backward", l_cross_entropy_backward},
    {"embedding", l_embedding},
    {"embedding_backward", l_embedding_backward},
    {"sgd_step", l_sgd_step},
    {"adam_step", l_adam_step},
    {"clip_grad_norm_coef", l_clip_grad_norm_coef},
    {NULL, NULL},
};

void attnL_open_train(lua_State *L) {
  lua_newtable(L);
  luaL_setfuncs(L, funcs, 0);
  lua_setfield(L, -4, "train"); /* module, methods, metatable, this */
}
