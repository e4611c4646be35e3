/* Tensor ops from Lua beyond the elementwise table: clamp, var/std, where, cumsum, index_select,
 * gather, scatter_add_, chunk, split, repeat_interleave, topk, sort, argsort.
 * PyTorch's semantics with 1-based dims and indices: indices come in as Lua
 * tables or integer-valued tensors (1-based) and go out as float tensors
 * (1-based), as argmax's. */
#include <stdio.h>
#include <string.h>

#include "attn_lua.h"
#include "gather.h"
#include "moments.h"
#include "ops.h"
#include "sort.h"

/* registry key of attn.tensor, which turns index tables into tensors */
static const char TENSOR_CTOR_KEY[] = "attn.ops.tensor";

/* A tensor or number operand; a number becomes a 0-dim tensor over *scalar. */
static attn_tensor operand(lua_State *L, int arg, float *scalar, const char *fn, const char *what) {
  attn_tensor *t = attnL_test(L, arg);
  if (t) return *t;
  if (lua_type(L, arg) != LUA_TNUMBER) {
    char buf[64];
    attnL_error(L, fn, "bad argument #%d '%s' (expected attn.Tensor or number, got %s)", arg, what,
                attnL_typename(L, arg, buf, sizeof buf));
  }
  *scalar = (float)lua_tonumber(L, arg);
  return attn_make(scalar, 0, NULL);
}

/* An index argument: a tensor, or a (nested) Lua table of numbers made into
 * one in its stack slot. Its values are checked later, against the dim. */
static attn_tensor *check_index_arg(lua_State *L, int arg, const char *fn, const char *what) {
  attn_tensor *t = attnL_test(L, arg);
  if (t) return t;
  if (lua_type(L, arg) != LUA_TTABLE) {
    char buf[64];
    attnL_error(L, fn, "bad argument #%d '%s' (expected attn.Tensor or a table of integers, got %s)", arg, what,
                attnL_typename(L, arg, buf, sizeof buf));
  }
  lua_getfield(L, LUA_REGISTRYINDEX, TENSOR_CTOR_KEY);
  lua_pushvalue(L, arg);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    const char *cut = msg ? strstr(msg, "attn.tensor: ") : NULL;
    attnL_error(L, fn, "bad argument #%d '%s' (%s)", arg, what,
                cut ? cut + strlen("attn.tensor: ") : (msg ? msg : "not a table of numbers"));
  }
  lua_replace(L, arg);
  return attnL_test(L, arg);
}

/* The values of index checked against dim d of size n: a bad one raises
 * "fn: bad argument #arg 'what' (index 5 at [2] is out of range: ...)". */
static void check_index_values(lua_State *L, const attn_tensor *index, int64_t n, int d, int arg, const char *fn,
                               const char *what) {
  if (attn_check_indices(index, n, d, 1) != ATTN_OK)
    attnL_error(L, fn, "bad argument #%d '%s' (%s)", arg, what, attn_error_message());
}

/* a 0-dim tensor seen as [1], so that dim-wise kernels take it (PyTorch
 * accepts dim 1 or -1 there) */
static attn_tensor as_1d(const attn_tensor *t) {
  attn_tensor r = *t;
  if (r.ndim == 0) {
    r.ndim = 1;
    r.size[0] = 1;
    r.stride[0] = 1;
  }
  return r;
}

/* ---- clamp ------------------------------------------------------------- */

/* clamp(self, min, max): min and max numbers, tensors (broadcast) or nil;
 * min(max(x, min), max) with NaN propagated, as PyTorch. */
static int clamp(lua_State *L, int inplace, const char *fn) {
  attnL_check_nargs(L, 3, fn);
  attn_tensor *self = attnL_check(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2) && lua_isnoneornil(L, 3))
    attnL_error(L, fn, "at least one of 'min' (argument #2) and 'max' (argument #3) must not be nil");
  float slo = 0.0f, shi = 0.0f;
  int has_lo = !lua_isnoneornil(L, 2), has_hi = !lua_isnoneornil(L, 3);
  attn_tensor lo = has_lo ? operand(L, 2, &slo, fn, "min") : *self;
  attn_tensor hi = has_hi ? operand(L, 3, &shi, fn, "max") : *self;
  int ndim = self->ndim;
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, self->size, sizeof size);
  char b1[200], b2[200];
  for (int k = 0; k < 2; k++) {
    const attn_tensor *bound = k ? &hi : &lo;
    if (!(k ? has_hi : has_lo)) continue;
    attn_tensor e;
    if (inplace) {
      if (attn_expand(bound, self->ndim, self->size, &e) != ATTN_OK)
        attnL_error(L, fn, "%s of shape %s does not broadcast to self's shape %s", k ? "max" : "min",
                    attnL_shape(bound, b1, sizeof b1), attnL_shape(self, b2, sizeof b2));
    } else {
      int64_t prev[ATTN_MAX_DIMS]; /* attn_broadcast_shape's input and output must not alias */
      memcpy(prev, size, sizeof prev);
      if (attn_broadcast_shape(ndim, prev, bound->ndim, bound->size, &ndim, size) != ATTN_OK) attnL_core_error(L, fn);
    }
  }
  attn_tensor *out = self;
  if (inplace) {
    attnL_check_writable(L, self, fn);
    lua_pushvalue(L, 1);
  } else {
    out = attnL_push_uninit(L, ndim, size, fn);
    if (attn_unary(ATTN_COPY, self, out) != ATTN_OK) attnL_core_error(L, fn);
  }
  if (has_lo && attn_binary(ATTN_MAXIMUM, out, &lo, out) != ATTN_OK) attnL_core_error(L, fn);
  if (has_hi && attn_binary(ATTN_MINIMUM, out, &hi, out) != ATTN_OK) attnL_core_error(L, fn);
  if (inplace) attnL_bump_version(L, 1, fn);
  return 1;
}

static int m_clamp(lua_State *L) { return clamp(L, 0, "attn.clamp"); }
static int m_clamp_(lua_State *L) { return clamp(L, 1, "Tensor:clamp_"); }

/* ---- var, std ---------------------------------------------------------- */

/* The options table at arg: {unbiased = boolean}; returns the correction. */
static int64_t var_options(lua_State *L, int arg, const char *fn) {
  int64_t correction = 1;
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "unbiased") != 0) {
      char buf[64];
      const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : attnL_typename(L, -1, buf, sizeof buf);
      attnL_error(L, fn, "bad argument #%d 'options' (unknown option '%s'; expected unbiased)", arg, key);
    }
  }
  lua_getfield(L, arg, "unbiased");
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TBOOLEAN)
      attnL_error(L, fn, "bad argument #%d 'options' (unbiased must be a boolean, got %s)", arg, luaL_typename(L, -1));
    correction = lua_toboolean(L, -1) ? 1 : 0;
  }
  lua_pop(L, 1);
  return correction;
}

/* var(self[, dim[, keepdim]][, {unbiased = true}]) */
static int variance(lua_State *L, int take_sqrt, const char *fn) {
  attnL_check_nargs(L, 4, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  int top = lua_gettop(L);
  int64_t correction = 1;
  if (top >= 2 && lua_type(L, top) == LUA_TTABLE && !attnL_test(L, top)) {
    correction = var_options(L, top, fn);
    lua_settop(L, --top);
  }
  if (top > 3) attnL_error(L, fn, "bad argument #4 (expected an options table, got %s)", luaL_typename(L, 4));
  if (lua_isnoneornil(L, 2)) {
    if (!lua_isnoneornil(L, 3)) attnL_error(L, fn, "bad argument #3 'keepdim' (keepdim needs a dim)");
    float v;
    if (attn_var_all(a, correction, take_sqrt, &v) != ATTN_OK) attnL_core_error(L, fn);
    attn_tensor *out = attnL_push_uninit(L, 0, NULL, fn);
    out->data[0] = v;
    return 1;
  }
  if (lua_type(L, 2) != LUA_TNUMBER) {
    char buf[64];
    attnL_error(L, fn, "bad argument #2 'dim' (expected a dim or an options table, got %s)",
                attnL_typename(L, 2, buf, sizeof buf));
  }
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  int keepdim = attnL_checkboolean_opt(L, 3, fn, "keepdim");
  attn_tensor a1 = as_1d(a);
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, a1.size, sizeof size);
  size[d] = 1;
  attn_tensor *out = attnL_push_uninit(L, a1.ndim, size, fn);
  if (attn_var_dim(&a1, d, correction, take_sqrt, out) != ATTN_OK) attnL_core_error(L, fn);
  if (!keepdim || a->ndim == 0) { /* drop dim d (a 0-dim input gives a 0-dim result) */
    for (int k = d; k < out->ndim - 1; k++) {
      out->size[k] = out->size[k + 1];
      out->stride[k] = out->stride[k + 1];
    }
    out->ndim--;
  }
  return 1;
}

static int m_var(lua_State *L) { return variance(L, 0, "attn.var"); }
static int m_std(lua_State *L) { return variance(L, 1, "attn.std"); }

/* ---- where, cumsum ----------------------------------------------------- */

/* where(cond, a, b): a where cond is nonzero, else b; all three broadcast */
static int m_where(lua_State *L) {
  const char *fn = "attn.where";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *cond = attnL_check(L, 1, fn, "condition");
  float sa, sb;
  attn_tensor a = operand(L, 2, &sa, fn, "input"), b = operand(L, 3, &sb, fn, "other");
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  int64_t ca[ATTN_MAX_DIMS];
  if (attn_broadcast_shape(cond->ndim, cond->size, a.ndim, a.size, &ndim, ca) != ATTN_OK ||
      attn_broadcast_shape(ndim, ca, b.ndim, b.size, &ndim, size) != ATTN_OK)
    attnL_core_error(L, fn);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fn);
  if (attn_where(cond, &a, &b, out) != ATTN_OK) attnL_core_error(L, fn);
  out->is_bool = a.is_bool && b.is_bool; /* a number or a float tensor makes it float, as PyTorch's promotion */
  return 1;
}

/* t:where(cond, other) is attn.where(cond, t, other), as PyTorch's method */
static int m_where_method(lua_State *L) {
  const char *fn = "Tensor:where";
  attnL_check_nargs(L, 3, fn);
  attnL_check(L, 1, fn, "self");
  attnL_check(L, 2, fn, "condition");
  lua_settop(L, 3);
  lua_pushvalue(L, 2); /* self, cond, other, cond */
  lua_remove(L, 2);    /* self, other, cond */
  lua_insert(L, 1);    /* cond, self, other */
  return m_where(L);
}

static int m_cumsum(lua_State *L) {
  const char *fn = "attn.cumsum";
  attnL_check_nargs(L, 2, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2)) attnL_error(L, fn, "bad argument #2 'dim' (a dim is required)");
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  attn_tensor *out = attnL_push_uninit(L, a->ndim, a->size, fn);
  attn_tensor a1 = as_1d(a), o1 = as_1d(out);
  if (attn_cumsum(&a1, d, &o1) != ATTN_OK) attnL_core_error(L, fn);
  return 1;
}

/* ---- index_select, gather, scatter_add --------------------------------- */

static void need_dims(lua_State *L, const attn_tensor *t, const char *fn) {
  if (t->ndim == 0) attnL_error(L, fn, "bad argument #1 'self' (expected a tensor with at least 1 dim, got a 0-dim tensor)");
}

static int m_index_select(lua_State *L) {
  const char *fn = "attn.index_select";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  need_dims(L, a, fn);
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  attn_tensor *index = check_index_arg(L, 3, fn, "index");
  char b1[200];
  if (index->ndim > 1)
    attnL_error(L, fn, "bad argument #3 'index' (expected a 1-D index, got shape %s)", attnL_shape(index, b1, sizeof b1));
  check_index_values(L, index, a->size[d], d, 3, fn, "index");
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, a->size, sizeof size);
  size[d] = index->ndim ? index->size[0] : 1;
  attn_tensor *out = attnL_push_uninit(L, a->ndim, size, fn);
  if (attn_index_select(a, d, index, 1, out) != ATTN_OK) attnL_core_error(L, fn);
  out->is_bool = a->is_bool; /* a copy of some of a's elements keeps its kind */
  return 1;
}

static int m_gather(lua_State *L) {
  const char *fn = "attn.gather";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  need_dims(L, a, fn);
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  attn_tensor *index = check_index_arg(L, 3, fn, "index");
  attn_tensor *out = attnL_push_uninit(L, index->ndim, index->size, fn);
  if (index->ndim == a->ndim) check_index_values(L, index, a->size[d], d, 3, fn, "index");
  if (attn_gather(a, d, index, 1, out) != ATTN_OK) attnL_core_error(L, fn);
  out->is_bool = a->is_bool; /* a copy of some of a's elements keeps its kind */
  return 1;
}

/* self:scatter_add_(dim, index, src) and the copy-making attn.scatter_add */
static int scatter_add(lua_State *L, int inplace, const char *fn) {
  attnL_check_nargs(L, 4, fn);
  attn_tensor *self = attnL_check(L, 1, fn, "self");
  need_dims(L, self, fn);
  int d = attnL_checkdim(L, 2, self->ndim, fn);
  attn_tensor *index = check_index_arg(L, 3, fn, "index");
  attn_tensor *src = attnL_check(L, 4, fn, "src");
  if (index->ndim == self->ndim) check_index_values(L, index, self->size[d], d, 3, fn, "index");
  attn_tensor *out = self;
  if (inplace) {
    attnL_check_writable(L, self, fn);
    lua_pushvalue(L, 1);
  } else {
    out = attnL_push_uninit(L, self->ndim, self->size, fn);
    attn_unary(ATTN_COPY, self, out);
  }
  if (attn_scatter_add(out, d, index, 1, src) != ATTN_OK) attnL_core_error(L, fn);
  if (inplace) attnL_bump_version(L, 1, fn);
  return 1;
}

static int m_scatter_add_(lua_State *L) { return scatter_add(L, 1, "Tensor:scatter_add_"); }
static int m_scatter_add(lua_State *L) { return scatter_add(L, 0, "attn.scatter_add"); }

/* ---- chunk, split ------------------------------------------------------ */

/* Push the views of the tensor t at stack index base along d: count pieces
 * of len (the last of last_len), or of lens[i]; returns their count. */
static int push_pieces(lua_State *L, int base, const attn_tensor *t, int d, int64_t count, int64_t len,
                       int64_t last_len, const int64_t *lens, const char *fn) {
  if (count > 1000000 || !lua_checkstack(L, (int)count + 8))
    attnL_error(L, fn, "would return %I views, more than a Lua call can return (at most about a million): "
                "use narrow", (lua_Integer)count);
  int64_t start = 0;
  for (int64_t i = 0; i < count; i++) {
    int64_t n = lens ? lens[i] : (i == count - 1 ? last_len : len);
    attn_tensor v;
    if (attn_view_narrow(t, d, start, n, &v) != ATTN_OK) attnL_core_error(L, fn);
    attnL_push_view(L, base, &v);
    start += n;
  }
  return (int)count;
}

/* chunk(self, chunks[, dim = 1]): PyTorch's: pieces of ceil(n / chunks) along dim, fewer when n is small */
static int m_chunk(lua_State *L) {
  const char *fn = "attn.chunk";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  need_dims(L, t, fn);
  int64_t chunks = attnL_checkinteger(L, 2, fn, "chunks");
  if (chunks < 1) attnL_error(L, fn, "bad argument #2 'chunks' (expected an integer >= 1, got %I)", (lua_Integer)chunks);
  int d = lua_isnoneornil(L, 3) ? 0 : attnL_checkdim(L, 3, t->ndim, fn);
  int64_t n = t->size[d];
  lua_settop(L, 1);
  if (n == 0) return push_pieces(L, 1, t, d, chunks, 0, 0, NULL, fn); /* PyTorch: `chunks` empty pieces */
  int64_t len = n / chunks + (n % chunks != 0);
  int64_t count = n / len + (n % len != 0);
  return push_pieces(L, 1, t, d, count, len, n - len * (count - 1), NULL, fn);
}

/* split(self, size_or_sizes[, dim = 1]) */
static int m_split(lua_State *L) {
  const char *fn = "attn.split";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  need_dims(L, t, fn);
  int d = lua_isnoneornil(L, 3) ? 0 : attnL_checkdim(L, 3, t->ndim, fn);
  int64_t n = t->size[d];
  if (lua_type(L, 2) == LUA_TTABLE && !attnL_test(L, 2)) {
    lua_Integer count = (lua_Integer)luaL_len(L, 2);
    if (count > 1000000) attnL_error(L, fn, "bad argument #2 'split_sizes' (more than a million sizes)");
    int64_t *lens = lua_newuserdatauv(L, (size_t)(count ? count : 1) * sizeof(int64_t), 0); /* stack 4 */
    int64_t total = 0;
    for (lua_Integer i = 1; i <= count; i++) {
      lua_geti(L, 2, i);
      int64_t v = lua_isinteger(L, -1) ? (int64_t)lua_tointeger(L, -1) : -1;
      if (lua_type(L, -1) == LUA_TNUMBER && !lua_isinteger(L, -1)) {
        double f = (double)lua_tonumber(L, -1);
        if (f == (double)(int64_t)f) v = (int64_t)f;
      }
      if (v < 0) {
        char buf[64];
        lua_Number num = lua_tonumber(L, -1);
        if (lua_type(L, -1) == LUA_TNUMBER) snprintf(buf, sizeof buf, "%.14g", (double)num);
        attnL_error(L, fn, "bad argument #2 'split_sizes' (size %I must be a non-negative integer, got %s)", i,
                    lua_type(L, -1) == LUA_TNUMBER ? buf : luaL_typename(L, -1));
      }
      lua_pop(L, 1);
      lens[i - 1] = v;
      total = total + v > n ? n + 1 : total + v; /* saturates past n: no overflow */
    }
    if (total != n)
      attnL_error(L, fn, "bad argument #2 'split_sizes' (sizes summing to the size of dim %d, %I, expected; "
                  "they sum to %s%I)", d + 1, (lua_Integer)n, total > n ? "more than " : "",
                  (lua_Integer)(total > n ? n : total));
    return push_pieces(L, 1, t, d, count, 0, 0, lens, fn); /* lens stays below the views */
  }
  int64_t len = attnL_checkinteger(L, 2, fn, "split_size");
  if (len < 0) attnL_error(L, fn, "bad argument #2 'split_size' (expected an integer >= 0, got %I)", (lua_Integer)len);
  if (len == 0 && n > 0)
    attnL_error(L, fn, "bad argument #2 'split_size' (split_size can only be 0 if dim %d has size 0, it has %I)",
                d + 1, (lua_Integer)n);
  lua_settop(L, 1);
  if (n == 0) return push_pieces(L, 1, t, d, 1, 0, 0, NULL, fn);
  int64_t count = n / len + (n % len != 0);
  return push_pieces(L, 1, t, d, count, len, n - len * (count - 1), NULL, fn);
}

/* ---- repeat_interleave ------------------------------------------------- */

/* repeat_interleave(self, repeats[, dim]): each element (or slice along dim)
 * repeated; repeats a number or a 1-D tensor (or table) of one count per
 * slice; without dim, self is flattened first (as PyTorch). */
static int m_repeat_interleave(lua_State *L) {
  const char *fn = "attn.repeat_interleave";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  attn_tensor flat;
  int d;
  if (lua_isnoneornil(L, 3)) { /* flattened: a contiguous copy when needed, viewed 1-D */
    attnL_push_contiguous(L, 1, fn);
    lua_replace(L, 1);
    t = attnL_test(L, 1);
    int64_t n = attn_numel(t);
    flat = attn_make(t->data, 1, &n);
    d = 0;
  } else {
    need_dims(L, t, fn);
    d = attnL_checkdim(L, 3, t->ndim, fn);
    flat = *t;
  }
  int64_t n = flat.size[d];
  if (n > (int64_t)1 << 24)
    attnL_error(L, fn, "dim %d has %I elements: float32 indices are exact only up to 2^24", d + 1, (lua_Integer)n);
  const attn_tensor *reps = NULL;
  int64_t scalar_reps = 0;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    scalar_reps = attnL_checkinteger(L, 2, fn, "repeats");
    if (scalar_reps < 0)
      attnL_error(L, fn, "bad argument #2 'repeats' (expected a non-negative integer, got %I)", (lua_Integer)scalar_reps);
  } else {
    reps = check_index_arg(L, 2, fn, "repeats");
    char b1[200];
    int64_t rn = attn_numel(reps);
    if (reps->ndim > 1 || (rn != n && rn != 1))
      attnL_error(L, fn, "bad argument #2 'repeats' (expected one count per slice: shape [%I] or [1], got %s)",
                  (lua_Integer)n, attnL_shape(reps, b1, sizeof b1));
    attn_tensor r1 = as_1d(reps);
    for (int64_t i = 0; i < rn; i++) {
      float v = r1.data[i * r1.stride[0]];
      if (!(v >= 0.0f && v <= 16777216.0f && v == (float)(int64_t)v)) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.9g", (double)v);
        attnL_error(L, fn, "bad argument #2 'repeats' (count %s at [%I] is not a non-negative integer)", buf,
                    (lua_Integer)(i + 1));
      }
    }
    if (rn == 1) {
      scalar_reps = (int64_t)r1.data[0];
      reps = NULL;
    }
  }
  /* the index of every output slice, 0-based, in a float scratch tensor */
  int64_t total = 0;
  attn_tensor r1 = reps ? as_1d(reps) : flat;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = reps ? (int64_t)r1.data[i * r1.stride[0]] : scalar_reps;
    if (r > ((int64_t)1 << 40) - total) attnL_error(L, fn, "the repeated size overflows");
    total += r;
  }
  attn_tensor *index = attnL_push_uninit(L, 1, &total, fn);
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = reps ? (int64_t)r1.data[i * r1.stride[0]] : scalar_reps;
    for (int64_t j = 0; j < r; j++) index->data[at++] = (float)i;
  }
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, flat.size, sizeof size);
  size[d] = total;
  attn_tensor *out = attnL_push_uninit(L, flat.ndim, size, fn);
  if (attn_index_select(&flat, d, index, 0, out) != ATTN_OK) attnL_core_error(L, fn);
  return 1;
}

/* ---- topk, sort, argsort ----------------------------------------------- */

/* values and indices pushed (shape of a with k at d); a 0-dim a gives 0-dim results */
static void push_ordered(lua_State *L, const attn_tensor *a, int d, int64_t k, attn_tensor **vals, attn_tensor **idx,
                         const char *fn) {
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, a->size, sizeof size);
  if (a->ndim) size[d] = k;
  int64_t one = 1;
  *vals = attnL_push_uninit(L, a->ndim, a->ndim || k ? size : &one, fn);
  *idx = attnL_push_uninit(L, a->ndim, a->ndim || k ? size : &one, fn);
  if (a->ndim == 0 && k == 0) { /* topk(0) of a 0-dim tensor: [0]-shaped, as PyTorch */
    (*vals)->ndim = (*idx)->ndim = 1;
    (*vals)->size[0] = (*idx)->size[0] = 0;
  }
}

static void indices_to_lua(attn_tensor *idx) {
  int64_t n = attn_numel(idx);
  for (int64_t i = 0; i < n; i++) idx->data[i] += 1.0f; /* contiguous, fresh */
}

/* topk(self, k[, dim = -1[, largest = true[, sorted = true]]]) -> values, indices */
static int m_topk(lua_State *L) {
  const char *fn = "attn.topk";
  attnL_check_nargs(L, 5, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  int64_t k = attnL_checkinteger(L, 2, fn, "k");
  int d = lua_isnoneornil(L, 3) ? (a->ndim ? a->ndim - 1 : 0) : attnL_checkdim(L, 3, a->ndim, fn);
  int largest = lua_isnoneornil(L, 4) ? 1 : attnL_checkboolean_opt(L, 4, fn, "largest");
  int sorted = lua_isnoneornil(L, 5) ? 1 : attnL_checkboolean_opt(L, 5, fn, "sorted");
  attn_tensor a1 = as_1d(a);
  int64_t n = a1.size[d];
  if (k < 0 || k > n)
    attnL_error(L, fn, "bad argument #2 'k' (k = %I is out of range: expected an integer in [0, %I], the size of "
                "dim %d)", (lua_Integer)k, (lua_Integer)n, d + 1);
  attn_tensor *vals, *idx;
  push_ordered(L, a, d, k, &vals, &idx, fn);
  attn_tensor v1 = as_1d(vals), i1 = as_1d(idx);
  if (attn_topk(&a1, d, k, largest, sorted, &v1, &i1) != ATTN_OK) attnL_core_error(L, fn);
  indices_to_lua(idx);
  return 2;
}

/* sort(self[, dim = -1[, descending = false]]) -> values, indices; argsort: the indices */
static int sort(lua_State *L, int want_values, const char *fn) {
  attnL_check_nargs(L, 3, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  int d = lua_isnoneornil(L, 2) ? (a->ndim ? a->ndim - 1 : 0) : attnL_checkdim(L, 2, a->ndim, fn);
  int descending = attnL_checkboolean_opt(L, 3, fn, "descending");
  attn_tensor a1 = as_1d(a);
  attn_tensor *vals, *idx;
  push_ordered(L, a, d, a1.size[d], &vals, &idx, fn);
  attn_tensor v1 = as_1d(vals), i1 = as_1d(idx);
  if (attn_sort(&a1, d, descending, &v1, &i1) != ATTN_OK) attnL_core_error(L, fn);
  indices_to_lua(idx);
  return want_values ? 2 : 1;
}

static int m_sort(lua_State *L) { return sort(L, 1, "attn.sort"); }
static int m_argsort(lua_State *L) { return sort(L, 0, "attn.argsort"); }

static const luaL_Reg funcs[] = {
  {"clamp", m_clamp}, {"var", m_var}, {"std", m_std}, {"cumsum", m_cumsum},
  {"index_select", m_index_select}, {"gather", m_gather}, {"scatter_add", m_scatter_add},
  {"chunk", m_chunk}, {"split", m_split}, {"repeat_interleave", m_repeat_interleave},
  {"topk", m_topk}, {"sort", m_sort}, {"argsort", m_argsort}, {NULL, NULL}};

static const luaL_Reg methods_only[] = {
  {"clamp_", m_clamp_}, {"scatter_add_", m_scatter_add_}, {"where", m_where_method}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top. */
void attnL_open_ops(lua_State *L) {
  lua_getfield(L, -3, "tensor");
  lua_setfield(L, LUA_REGISTRYINDEX, TENSOR_CTOR_KEY);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, funcs, 0);
  luaL_setfuncs(L, methods_only, 0);
  lua_pop(L, 1);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pushcfunction(L, m_where);
  lua_setfield(L, -2, "where");
  lua_pop(L, 1);
}
