/* Tensor creation, inspection, indexing and views. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "attn_lua.h"
#include "ops.h"

#define CHECK(arg, fname) attnL_check(L, arg, fname, "self")

/* ---- creation ---------------------------------------------------------- */

static int t_zeros(lua_State *L) {
  int64_t size[ATTN_MAX_DIMS];
  int n = attnL_checksizes(L, 1, size, 0, "attn.zeros");
  attnL_push_new(L, n, size, "attn.zeros");
  return 1;
}

static int t_empty(lua_State *L) {
  int64_t size[ATTN_MAX_DIMS];
  int n = attnL_checksizes(L, 1, size, 0, "attn.empty");
  attnL_push_new(L, n, size, "attn.empty"); /* zeroed anyway: no garbage to surprise anyone */
  return 1;
}

static int t_ones(lua_State *L) {
  int64_t size[ATTN_MAX_DIMS];
  int n = attnL_checksizes(L, 1, size, 0, "attn.ones");
  attn_fill(attnL_push_uninit(L, n, size, "attn.ones"), 1.0f);
  return 1;
}

/* full(size, v): size is a table or one number */
static int t_full(lua_State *L) {
  int64_t size[ATTN_MAX_DIMS];
  if (lua_gettop(L) != 2) attnL_error(L, "attn.full", "expected (size, value), got %d arguments", lua_gettop(L));
  float v = (float)attnL_checknumber(L, 2, "attn.full", "value");
  lua_settop(L, 1);
  int n = attnL_checksizes(L, 1, size, 0, "attn.full");
  attn_fill(attnL_push_uninit(L, n, size, "attn.full"), v);
  return 1;
}

static int t_eye(lua_State *L) {
  attnL_check_nargs(L, 2, "attn.eye");
  int64_t n = attnL_checkinteger(L, 1, "attn.eye", "n");
  int64_t m = lua_isnoneornil(L, 2) ? n : attnL_checkinteger(L, 2, "attn.eye", "m");
  if (n < 0 || m < 0) attnL_error(L, "attn.eye", "sizes must be non-negative, got %I and %I", (lua_Integer)n, (lua_Integer)m);
  int64_t size[2] = {n, m};
  attn_tensor *t = attnL_push_new(L, 2, size, "attn.eye");
  for (int64_t i = 0; i < n && i < m; i++) t->data[i * m + i] = 1.0f;
  return 1;
}

/* arange([start,] stop[, step]) as torch.arange: [start, stop) */
static int t_arange(lua_State *L) {
  const char *fn = "attn.arange";
  double start = 0, stop, step = 1;
  int nargs = lua_gettop(L);
  if (nargs == 1) {
    stop = attnL_checknumber(L, 1, fn, "stop");
  } else if (nargs == 2 || nargs == 3) {
    start = attnL_checknumber(L, 1, fn, "start");
    stop = attnL_checknumber(L, 2, fn, "stop");
    if (nargs == 3) step = attnL_checknumber(L, 3, fn, "step");
  } else {
    return attnL_error(L, fn, "expected ([start,] stop[, step]), got %d arguments", nargs);
  }
  if (!isfinite(start) || !isfinite(stop) || !isfinite(step)) attnL_error(L, fn, "start, stop and step must be finite");
  if (step == 0) attnL_error(L, fn, "step must be nonzero");
  if ((stop - start) / step < 0)
    attnL_error(L, fn, "upper bound and lower bound are inconsistent with the sign of step");
  double count = ceil((stop - start) / step);
  if (count > 9e15) attnL_error(L, fn, "too many elements (%f)", count);
  int64_t size[1] = {(int64_t)count};
  attn_arange(attnL_push_uninit(L, 1, size, fn), start, step);
  return 1;
}

/* attn.tensor(nested table | number | tensor) */
static void nested_shape(lua_State *L, int idx, int depth, int *ndim, int64_t *size) {
  if (lua_type(L, idx) == LUA_TTABLE && !attnL_test(L, idx)) {
    if (depth >= ATTN_MAX_DIMS) attnL_error(L, "attn.tensor", "nested deeper than %d levels", ATTN_MAX_DIMS);
    lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
    size[depth] = len;
    *ndim = depth + 1;
    if (len > 0) {
      lua_rawgeti(L, idx, 1);
      nested_shape(L, lua_gettop(L), depth + 1, ndim, size);
      lua_pop(L, 1);
    }
  }
}

/* *numbers counts the number elements: without any, booleans make a bool tensor */
static float *nested_fill(lua_State *L, int idx, int depth, int ndim, const int64_t *size, float *out, char *path,
                          size_t pathlen, int64_t *numbers) {
  int t = lua_type(L, idx);
  if (depth == ndim) {
    if (t == LUA_TNUMBER) {
      *out = (float)lua_tonumber(L, idx);
      (*numbers)++;
    } else if (t == LUA_TBOOLEAN) *out = lua_toboolean(L, idx) ? 1.0f : 0.0f;
    else
      attnL_error(L, "attn.tensor", "element %s is a %s, expected a number", depth ? path : "[]",
                  t == LUA_TTABLE ? "table (the nesting is ragged)" : luaL_typename(L, idx));
    return out + 1;
  }
  if (t != LUA_TTABLE || attnL_test(L, idx))
    attnL_error(L, "attn.tensor", "element %s is a %s, expected a table of %d (the nesting is ragged)",
                depth ? path : "[]", luaL_typename(L, idx), (int)size[depth]);
  lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
  if (len != size[depth])
    attnL_error(L, "attn.tensor", "ragged nested table: %s has %I elements, expected %I", depth ? path : "the table",
                len, (lua_Integer)size[depth]);
  size_t used = strlen(path);
  for (lua_Integer i = 1; i <= len; i++) {
    snprintf(path + used, pathlen - used, "[%lld]", (long long)i);
    lua_rawgeti(L, idx, i);
    out = nested_fill(L, lua_gettop(L), depth + 1, ndim, size, out, path, pathlen, numbers);
    lua_pop(L, 1);
  }
  path[used] = '\0';
  return out;
}

static int t_tensor(lua_State *L) {
  attnL_check_nargs(L, 1, "attn.tensor");
  int64_t size[ATTN_MAX_DIMS];
  int ndim = 0;
  attn_tensor *src = attnL_test(L, 1);
  if (src) {
    attn_tensor *dst = attnL_push_uninit(L, src->ndim, src->size, "attn.tensor");
    attn_unary(ATTN_COPY, src, dst);
    dst->is_bool = src->is_bool;
    return 1;
  }
  int t = lua_type(L, 1);
  if (t != LUA_TTABLE && t != LUA_TNUMBER && t != LUA_TBOOLEAN)
    attnL_error(L, "attn.tensor", "bad argument #1 'data' (expected a number or a nested table of numbers, got %s)",
                luaL_typename(L, 1));
  lua_settop(L, 1);
  nested_shape(L, 1, 0, &ndim, size);
  attn_tensor *dst = attnL_push_uninit(L, ndim, size, "attn.tensor");
  char path[8 * 24] = "";
  int64_t numbers = 0;
  nested_fill(L, 1, 0, ndim, size, dst->data, path, sizeof path, &numbers);
  dst->is_bool = numbers == 0 && attn_numel(dst) > 0; /* as torch.tensor([True, False]); a number makes it float */
  return 1;
}

/* cat(list, dim) / stack(list, dim). The list may be of any length: the parts
 * are anchored in a table of their own (not on the Lua stack, which holds only
 * LUA_MINSTACK values unless grown, and less in a coroutine), so that a
 * finalizer that empties the caller's list during an allocation below cannot
 * free a part, and their views live in a garbage-collected scratch userdata. */
static int join(lua_State *L, int stack, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  if (!lua_istable(L, 1) || attnL_test(L, 1))
    attnL_error(L, fn, "bad argument #1 'tensors' (expected a list of tensors, got %s)", luaL_typename(L, 1));
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  if (n == 0) attnL_error(L, fn, "expected a non-empty list of tensors");
  if (n > INT_MAX / 2) attnL_error(L, fn, "at most %d tensors can be joined at once, got %I", INT_MAX / 2, n);
  lua_settop(L, 2);
  lua_createtable(L, (int)n, 0); /* 3: the anchor */
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    if (!attnL_test(L, -1))
      attnL_error(L, fn, "element %I of the list is a %s, expected attn.Tensor", i, luaL_typename(L, -1));
    lua_rawseti(L, 3, i);
  }
  /* scratch: n views, then n pointers to them */
  attn_tensor *views = lua_newuserdatauv(L, (size_t)n * (sizeof(attn_tensor) + sizeof(attn_tensor *)), 0); /* 4 */
  const attn_tensor **parts = (const attn_tensor **)(void *)(views + n);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 3, i);
    parts[i - 1] = attnL_test(L, -1);
    lua_pop(L, 1);
  }
  /* legacy PyTorch rule: 1-D empty tensors are skipped in cat */
  const attn_tensor *ref = parts[0];
  for (lua_Integer i = 0; i < n; i++)
    if (!(parts[i]->ndim == 1 && parts[i]->size[0] == 0)) { ref = parts[i]; break; }
  int ndim = ref->ndim + (stack ? 1 : 0);
  if (ndim == 0) attnL_error(L, fn, "cannot concatenate 0-dim tensors (use attn.stack)");
  if (ndim > ATTN_MAX_DIMS)
    attnL_error(L, fn, "at most %d dims are supported, stacking %d-dim tensors gives %d", ATTN_MAX_DIMS, ref->ndim, ndim);
  int d = lua_isnoneornil(L, 2) ? 0 : attnL_checkdim(L, 2, ndim, fn);
  int m = 0;
  int64_t size[ATTN_MAX_DIMS];
  char b1[200], b2[200];
  for (lua_Integer i = 0; i < n; i++) {
    const attn_tensor *p = parts[i];
    if (!stack && p->ndim == 1 && p->size[0] == 0 && ref->ndim != 1) continue;
    if (p->ndim != ref->ndim || (stack && !attn_same_shape(p, ref)))
      attnL_error(L, fn, "tensor %I has shape %s, expected %s%s", i + 1, attnL_shape(p, b1, sizeof b1),
                  stack ? "" : "the same rank as ", attnL_shape(ref, b2, sizeof b2));
    attn_tensor v = *p;
    if (stack) { /* a size-1 dim at d */
      for (int k = ndim - 1; k > d; k--) {
        v.size[k] = p->size[k - 1];
        v.stride[k] = p->stride[k - 1];
      }
      v.size[d] = 1;
      v.stride[d] = 0;
      v.ndim = ndim;
    }
    views[m] = v; /* parts[m] was read already: m <= i */
    parts[m] = &views[m];
    m++;
  }
  int64_t total = 0;
  for (int k = 0; k < ndim; k++) size[k] = views[0].size[k];
  for (int i = 0; i < m; i++) {
    for (int k = 0; k < ndim; k++)
      if (k != d && views[i].size[k] != size[k])
        attnL_error(L, fn, "tensor %d has shape %s, which does not match %s except in dim %d", i + 1,
                    attnL_shape(&views[i], b1, sizeof b1), attnL_shape(&views[0], b2, sizeof b2), d + 1);
    if (views[i].size[d] > INT64_MAX - total) attnL_error(L, fn, "the joined size overflows");
    total += views[i].size[d];
  }
  size[d] = total;
  int all_bool = 1; /* bool parts join into a bool, any float part makes it float (PyTorch's promotion) */
  for (int i = 0; i < m; i++) all_bool &= views[i].is_bool;
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fn);
  if (attn_cat(parts, m, d, out) != ATTN_OK) attnL_core_error(L, fn);
  out->is_bool = all_bool;
  return 1;
}

static int t_cat(lua_State *L) { return join(L, 0, "attn.cat"); }
static int t_stack(lua_State *L) { return join(L, 1, "attn.stack"); }

/* ---- inspection -------------------------------------------------------- */

void attnL_push_sizes(lua_State *L, const attn_tensor *t) {
  lua_createtable(L, t->ndim, 0);
  for (int d = 0; d < t->ndim; d++) {
    lua_pushinteger(L, (lua_Integer)t->size[d]);
    lua_rawseti(L, -2, d + 1);
  }
}

static int m_size(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:size");
  attn_tensor *t = CHECK(1, "Tensor:size");
  if (lua_isnoneornil(L, 2)) {
    attnL_push_sizes(L, t);
    return 1;
  }
  if (t->ndim == 0) attnL_error(L, "Tensor:size", "a 0-dim tensor has no dims");
  lua_pushinteger(L, (lua_Integer)t->size[attnL_checkdim(L, 2, t->ndim, "Tensor:size")]);
  return 1;
}

static int m_stride(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:stride");
  attn_tensor *t = CHECK(1, "Tensor:stride");
  if (lua_isnoneornil(L, 2)) {
    lua_createtable(L, t->ndim, 0);
    for (int d = 0; d < t->ndim; d++) {
      lua_pushinteger(L, (lua_Integer)t->stride[d]);
      lua_rawseti(L, -2, d + 1);
    }
    return 1;
  }
  if (t->ndim == 0) attnL_error(L, "Tensor:stride", "a 0-dim tensor has no dims");
  lua_pushinteger(L, (lua_Integer)t->stride[attnL_checkdim(L, 2, t->ndim, "Tensor:stride")]);
  return 1;
}

static int m_dim(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:dim");
  lua_pushinteger(L, CHECK(1, "Tensor:dim")->ndim);
  return 1;
}

static int m_numel(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:numel");
  lua_pushinteger(L, (lua_Integer)attn_numel(CHECK(1, "Tensor:numel")));
  return 1;
}

static int m_is_contiguous(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:is_contiguous");
  lua_pushboolean(L, attn_is_contiguous(CHECK(1, "Tensor:is_contiguous")));
  return 1;
}

/* Whether elements share memory (an expanded view): in-place writes refuse
 * such a tensor, so a load can check its destinations before the first copy. */
static int m_has_internal_overlap(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:has_internal_overlap");
  lua_pushboolean(L, attn_has_internal_overlap(CHECK(1, "Tensor:has_internal_overlap")));
  return 1;
}

static int m_item(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:item");
  attn_tensor *t = CHECK(1, "Tensor:item");
  char b[200];
  if (attn_numel(t) != 1)
    attnL_error(L, "Tensor:item", "a tensor with %I elements (shape %s) cannot be converted to a number",
                (lua_Integer)attn_numel(t), attnL_shape(t, b, sizeof b));
  int64_t zero[ATTN_MAX_DIMS] = {0};
  lua_pushnumber(L, (lua_Number)*attn_at(t, zero));
  return 1;
}

static void push_table(lua_State *L, const attn_tensor *t, int d, const float *p) {
  if (d == t->ndim) {
    lua_pushnumber(L, (lua_Number)*p);
    return;
  }
  luaL_checkstack(L, 4, "tensor too deep");
  lua_createtable(L, (int)(t->size[d] < 1 << 30 ? t->size[d] : 0), 0);
  for (int64_t i = 0; i < t->size[d]; i++) {
    push_table(L, t, d + 1, p + i * t->stride[d]);
    lua_rawseti(L, -2, (lua_Integer)(i + 1));
  }
}

/* The most Lua values (numbers and inner tables) totable builds: 2^26, about a
 * GiB of Lua memory. A huge expanded view (no memory behind it) or a shape
 * such as [2^40, 0] is refused instead of building billions of values. */
#define TOTABLE_MAX_VALUES ((int64_t)1 << 26)

static int m_totable(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:totable");
  const char *fn = "Tensor:totable";
  attn_tensor *t = CHECK(1, fn);
  int64_t values = 0, rows = 1; /* tables at each depth, then the numbers */
  for (int d = 0; d < t->ndim && values <= TOTABLE_MAX_VALUES; d++) {
    rows = t->size[d] != 0 && rows > TOTABLE_MAX_VALUES / t->size[d] ? TOTABLE_MAX_VALUES + 1 : rows * t->size[d];
    values += rows;
  }
  if (values > TOTABLE_MAX_VALUES) {
    char b[200];
    attnL_error(L, fn, "a tensor of shape %s is too large to convert to a Lua table (more than %I numbers and "
                "tables; narrow it or work on it as a tensor)", attnL_shape(t, b, sizeof b),
                (lua_Integer)TOTABLE_MAX_VALUES);
  }
  push_table(L, t, 0, t->data);
  return 1;
}

/* ---- views ------------------------------------------------------------- */

static attn_tensor select_view(lua_State *L, const attn_tensor *t, int d, int64_t i, const char *fn) {
  int64_t n = t->size[d];
  int64_t k = i > 0 ? i - 1 : i + n;
  if (i == 0 || k < 0 || k >= n)
    attnL_error(L, fn, "index %I is out of range for dim %d of size %I (valid: 1..%I or -%I..-1)", (lua_Integer)i,
                d + 1, (lua_Integer)n, (lua_Integer)n, (lua_Integer)n);
  attn_tensor v;
  if (attn_view_select(t, d, k, &v) != ATTN_OK) attnL_core_error(L, fn);
  return v;
}

static int m_select(lua_State *L) {
  attnL_check_nargs(L, 3, "Tensor:select");
  const char *fn = "Tensor:select";
  attn_tensor *t = CHECK(1, fn);
  if (t->ndim == 0) attnL_error(L, fn, "cannot select from a 0-dim tensor");
  int d = attnL_checkdim(L, 2, t->ndim, fn);
  attn_tensor v = select_view(L, t, d, attnL_checkinteger(L, 3, fn, "index"), fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_narrow(lua_State *L) {
  attnL_check_nargs(L, 4, "Tensor:narrow");
  const char *fn = "Tensor:narrow";
  attn_tensor *t = CHECK(1, fn);
  if (t->ndim == 0) attnL_error(L, fn, "cannot narrow a 0-dim tensor");
  int d = attnL_checkdim(L, 2, t->ndim, fn);
  int64_t start = attnL_checkinteger(L, 3, fn, "start"), len = attnL_checkinteger(L, 4, fn, "length");
  int64_t n = t->size[d];
  int64_t s0 = start > 0 ? start - 1 : start + n;
  if (start == 0 || s0 < 0 || s0 > n || (start > 0 && start > n + 1))
    attnL_error(L, fn, "start %I is out of range for dim %d of size %I", (lua_Integer)start, d + 1, (lua_Integer)n);
  if (len < 0 || len > n - s0)
    attnL_error(L, fn, "start %I + length %I exceeds dim %d of size %I", (lua_Integer)start, (lua_Integer)len, d + 1,
                (lua_Integer)n);
  attn_tensor v;
  if (attn_view_narrow(t, d, s0, len, &v) != ATTN_OK) attnL_core_error(L, fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

/* sizes for view/reshape, -1 inferred; numel must match */
static int view_sizes(lua_State *L, const attn_tensor *t, int64_t *size, const char *fn) {
  int n = attnL_checksizes(L, 2, size, 1, fn);
  int64_t known = 1, numel = attn_numel(t);
  int infer = -1;
  for (int i = 0; i < n; i++) {
    if (size[i] == -1) infer = i;
    else if (known != 0 && size[i] > INT64_MAX / (known ? known : 1)) known = -1;
    else known *= size[i];
  }
  char b1[200], b2[200];
  if (infer >= 0) {
    if (known <= 0 || numel % known != 0)
      attnL_error(L, fn, "shape %s is invalid for input of size %I", attn_sizes_str(n, size, b1, sizeof b1),
                  (lua_Integer)numel);
    size[infer] = numel / known;
  } else if (known != numel) {
    attnL_error(L, fn, "shape %s is invalid for input of size %I (shape %s)", attn_sizes_str(n, size, b1, sizeof b1),
                (lua_Integer)numel, attnL_shape(t, b2, sizeof b2));
  }
  return n;
}

static int m_view(lua_State *L) {
  const char *fn = "Tensor:view";
  attn_tensor *t = CHECK(1, fn);
  attn_tensor v = *t;
  v.ndim = view_sizes(L, t, v.size, fn);
  if (!attn_view_strides(t, v.ndim, v.size, v.stride)) {
    char b[200];
    attnL_error(L, fn, "view size is not compatible with the input's size %s and stride (at least one dim spans "
                "two contiguous subspaces); use :reshape(...) instead", attnL_shape(t, b, sizeof b));
  }
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_reshape(lua_State *L) {
  const char *fn = "Tensor:reshape";
  attn_tensor *t = CHECK(1, fn);
  attn_tensor v = *t;
  v.ndim = view_sizes(L, t, v.size, fn);
  if (attn_view_strides(t, v.ndim, v.size, v.stride)) {
    attnL_push_view(L, 1, &v);
    return 1;
  }
  attn_tensor *dst = attnL_push_uninit(L, t->ndim, t->size, fn);
  attn_unary(ATTN_COPY, t, dst);
  dst->is_bool = t->is_bool;
  dst->ndim = v.ndim;
  memcpy(dst->size, v.size, sizeof v.size);
  attn_contiguous_strides(v.ndim, v.size, dst->stride);
  return 1;
}

static int m_transpose(lua_State *L) {
  attnL_check_nargs(L, 3, "Tensor:transpose");
  const char *fn = "Tensor:transpose";
  attn_tensor *t = CHECK(1, fn);
  int a = attnL_checkdim(L, 2, t->ndim, fn), b = attnL_checkdim(L, 3, t->ndim, fn);
  attn_tensor v;
  if (attn_view_transpose(t, a, b, &v) != ATTN_OK) attnL_core_error(L, fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_t(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:t");
  attn_tensor *t = CHECK(1, "Tensor:t");
  if (t->ndim > 2) attnL_error(L, "Tensor:t", "expects a tensor with <= 2 dims, got %d (use :transpose)", t->ndim);
  attn_tensor v = *t;
  if (t->ndim == 2 && attn_view_transpose(t, 0, 1, &v) != ATTN_OK) attnL_core_error(L, "Tensor:t");
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_permute(lua_State *L) {
  const char *fn = "Tensor:permute";
  attn_tensor *t = CHECK(1, fn);
  int dims[ATTN_MAX_DIMS];
  int n = 0, seen[ATTN_MAX_DIMS] = {0};
  if (lua_istable(L, 2)) {
    lua_Integer len = luaL_len(L, 2);
    if (len != t->ndim) attnL_error(L, fn, "expected %d dims, got %I", t->ndim, len);
    for (lua_Integer i = 1; i <= len; i++) {
      lua_geti(L, 2, i);
      dims[n++] = attnL_checkdim(L, lua_gettop(L), t->ndim, fn);
      lua_pop(L, 1);
    }
  } else {
    if (lua_gettop(L) - 1 != t->ndim) attnL_error(L, fn, "expected %d dims, got %d", t->ndim, lua_gettop(L) - 1);
    for (int i = 2; i <= lua_gettop(L); i++) dims[n++] = attnL_checkdim(L, i, t->ndim, fn);
  }
  for (int i = 0; i < n; i++)
    if (seen[dims[i]]++) attnL_error(L, fn, "dim %d is repeated", dims[i] + 1);
  attn_tensor v;
  if (attn_view_permute(t, dims, &v) != ATTN_OK) attnL_core_error(L, fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_unsqueeze(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:unsqueeze");
  const char *fn = "Tensor:unsqueeze";
  attn_tensor *t = CHECK(1, fn);
  if (t->ndim >= ATTN_MAX_DIMS) attnL_error(L, fn, "at most %d dims are supported", ATTN_MAX_DIMS);
  int d = attnL_checkdim(L, 2, t->ndim + 1, fn);
  attn_tensor v;
  if (attn_view_unsqueeze(t, d, &v) != ATTN_OK) attnL_core_error(L, fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_squeeze(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:squeeze");
  const char *fn = "Tensor:squeeze";
  attn_tensor *t = CHECK(1, fn);
  int only = -1;
  if (!lua_isnoneornil(L, 2)) {
    if (t->ndim == 0) {
      attnL_checkdim(L, 2, 0, fn);
      lua_settop(L, 1);
      return 1;
    }
    only = attnL_checkdim(L, 2, t->ndim, fn);
  }
  attn_tensor v;
  if (attn_view_squeeze(t, only, &v) != ATTN_OK) attnL_core_error(L, fn);
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_expand(lua_State *L) {
  const char *fn = "Tensor:expand";
  attn_tensor *t = CHECK(1, fn);
  int64_t size[ATTN_MAX_DIMS];
  int n = attnL_checksizes(L, 2, size, 1, fn);
  char b1[200], b2[200];
  if (n < t->ndim)
    attnL_error(L, fn, "the number of sizes (%d) must be at least the number of dims (%d) of %s", n, t->ndim,
                attnL_shape(t, b1, sizeof b1));
  for (int i = 0; i < n; i++) {
    int it = t->ndim - n + i;
    if (size[i] == -1) {
      if (it < 0) attnL_error(L, fn, "-1 is not allowed for a new leading dim (size #%d)", i + 1);
      size[i] = t->size[it];
    }
  }
  attn_tensor v;
  int64_t numel;
  if (attn_numel_checked(n, size, &numel) != ATTN_OK) attnL_core_error(L, fn);
  if (attn_expand(t, n, size, &v) != ATTN_OK)
    attnL_error(L, fn, "cannot expand %s to %s", attnL_shape(t, b1, sizeof b1), attn_sizes_str(n, size, b2, sizeof b2));
  attnL_push_view(L, 1, &v);
  return 1;
}

static int m_contiguous(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:contiguous");
  CHECK(1, "Tensor:contiguous");
  attnL_push_contiguous(L, 1, "Tensor:contiguous");
  return 1;
}

static int m_clone(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:clone");
  attn_tensor *t = CHECK(1, "Tensor:clone");
  attn_tensor *dst = attnL_push_uninit(L, t->ndim, t->size, "Tensor:clone");
  attn_unary(ATTN_COPY, t, dst);
  dst->is_bool = t->is_bool;
  return 1;
}

/* ---- indexing metamethods ---------------------------------------------- */

/* The view t[key] names: key an integer (dim 1), or a table of integers
 * {i, j, ...} indexing dims 1, 2, ... as PyTorch's x[i-1, j-1] ({} is t itself).
 * Raises for any other key. */
static attn_tensor index_view(lua_State *L, const attn_tensor *t, int key, const char *fn) {
  if (lua_type(L, key) == LUA_TNUMBER) {
    int64_t i = attnL_checkinteger(L, key, fn, "index");
    if (t->ndim == 0) attnL_error(L, fn, "a 0-dim tensor cannot be indexed");
    return select_view(L, t, 0, i, fn);
  }
  if (lua_type(L, key) != LUA_TTABLE || attnL_test(L, key))
    attnL_error(L, fn, "expected an integer or a table of integers {i, j, ...} as the index, got %s",
                attnL_test(L, key) ? "attn.Tensor (indexing by a mask or a tensor is not supported; see masked_fill)"
                                   : luaL_typename(L, key));
  lua_Integer n = (lua_Integer)lua_rawlen(L, key);
  if (n > t->ndim)
    attnL_error(L, fn, "too many indices for a tensor of %d dims: got %I", t->ndim, n);
  int64_t index[ATTN_MAX_DIMS];
  for (lua_Integer k = 1; k <= n; k++) {
    lua_rawgeti(L, key, k);
    int exact = 0;
    lua_Integer i = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &exact) : 0;
    if (!exact)
      attnL_error(L, fn, "index %I of the table must be an integer, got %s", k,
                  lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
    lua_pop(L, 1);
    index[k - 1] = (int64_t)i;
  }
  attn_tensor v = *t;
  for (int d = (int)n - 1; d >= 0; d--) v = select_view(L, &v, d, index[d], fn); /* the last first: dims keep their numbers */
  return v;
}

/* Metamethods check self as every method does: anyone can call
 * getmetatable(t).__index(anything, key) directly. */
/* t[k] for a non-string key: a view selected along the leading dims (a number
 * when it selects every dim). attn.core._index is this, without the Lua
 * layer's hook. */
static int raw_index(lua_State *L) {
  attn_tensor *t = attnL_check(L, 1, "attn.Tensor index", "self");
  attn_tensor v = index_view(L, t, 2, "attn.Tensor index");
  if (v.ndim == 0) lua_pushnumber(L, (lua_Number)v.data[0]);
  else attnL_push_view(L, 1, &v);
  return 1;
}

static int mt_index(lua_State *L) {
  /* a method (t:size()) first: one lookup in the methods table, before the
   * self check and the field names (no method has a field's name), which
   * cost more than the lookup */
  int is_string = lua_type(L, 2) == LUA_TSTRING;
  if (is_string) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    lua_pop(L, 1);
  }
  attnL_check(L, 1, "attn.Tensor index", "self");
  if (is_string) {
    const char *key = lua_tostring(L, 2);
    if (strcmp(key, "shape") == 0) {
      attnL_push_sizes(L, attnL_test(L, 1));
      return 1;
    }
    if (strcmp(key, "_version") == 0) {
      attnL_push_version(L, 1);
      lua_pop(L, 1);
      return 1;
    }
    lua_pushnil(L); /* what a key that is nothing gives */
    /* the first byte first: autograd field lookups pay next to nothing */
    if (key[0] == 'd' && strcmp(key, "dtype") == 0) {
      lua_pushstring(L, attnL_test(L, 1)->is_bool ? "bool" : "float32");
      return 1;
    }
    if (lua_type(L, lua_upvalueindex(2)) != LUA_TFUNCTION) return 1;
  } else if (lua_type(L, lua_upvalueindex(2)) != LUA_TFUNCTION) {
    return raw_index(L);
  }
  /* the Lua layer's fields (autograd's requires_grad, grad, grad_fn, is_leaf)
   * and its recorded indexing */
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

/* t[k] = x without the Lua layer's hook (attn.core._newindex). */
static int raw_newindex(lua_State *L) {
  const char *fn = "attn.Tensor index assignment";
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  if (lua_type(L, 2) != LUA_TNUMBER && (lua_type(L, 2) != LUA_TTABLE || attnL_test(L, 2)))
    attnL_error(L, fn, "only integer indices or tables of them {i, j, ...} can be assigned, got %s",
                luaL_typename(L, 2));
  attn_tensor v = index_view(L, t, 2, fn);
  if (lua_type(L, 3) == LUA_TNUMBER) {
    float x = (float)lua_tonumber(L, 3);
    attn_fill(&v, v.is_bool ? (float)(x != 0.0f) : x); /* into a bool: nonzero is true, as in PyTorch */
    attnL_bump_version(L, 1, fn);
    return 0;
  }
  attn_tensor *src = attnL_test(L, 3);
  if (!src) attnL_error(L, fn, "expected a number or an attn.Tensor as the value, got %s", luaL_typename(L, 3));
  attnL_copy_into(L, &v, src, fn); /* as copy_ */
  attnL_bump_version(L, 1, fn);
  return 0;
}

static int mt_newindex(lua_State *L) {
  attnL_check(L, 1, "attn.Tensor index assignment", "self");
  if (lua_type(L, lua_upvalueindex(1)) == LUA_TFUNCTION) {
    /* t.grad = g, and assignments the autograd layer checks first */
    lua_settop(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 3, 0);
    return 0;
  }
  return raw_newindex(L);
}

static int mt_len(lua_State *L) {
  attn_tensor *t = attnL_check(L, 1, "attn.Tensor length", "self");
  if (t->ndim == 0) attnL_error(L, "attn.Tensor length", "a 0-dim tensor has no length");
  lua_pushinteger(L, (lua_Integer)t->size[0]);
  return 1;
}

/* attn.core._set_field_handlers(get, set): get(t, key) answers string keys
 * that are neither "shape" nor a method; set(t, key, value) takes string-keyed
 * assignments. The autograd layer keeps requires_grad, grad, ... this way. */
static int set_field_handlers(lua_State *L) {
  attnL_check_nargs(L, 2, "attn.core._set_field_handlers");
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_getmetatable(L, ATTN_TENSOR_NAME);
  lua_getfield(L, -1, "__index");
  lua_pushvalue(L, 1);
  lua_setupvalue(L, -2, 2);
  lua_pop(L, 1);
  lua_getfield(L, -1, "__newindex");
  lua_pushvalue(L, 2);
  lua_setupvalue(L, -2, 1);
  lua_pop(L, 2);
  return 0;
}

/* attn.core._version(t): the version of t's storage and its last in-place writer's name. */
static int t_version(lua_State *L) {
  attnL_check(L, 1, "attn.core._version", "t");
  return attnL_push_version(L, 1);
}

/* attn.core._alias(t): a new tensor object over t's elements (t:detach()). */
static int t_alias(lua_State *L) {
  attnL_check_nargs(L, 1, "attn.core._alias");
  attn_tensor *t = attnL_check(L, 1, "attn.core._alias", "t");
  attnL_push_view(L, 1, t);
  attnL_history_new_family(L, -1); /* detach() shares memory, not history */
  return 1;
}

static const luaL_Reg module_funcs[] = {
  {"_set_field_handlers", set_field_handlers}, {"_version", t_version}, {"_alias", t_alias},
  {"_index", raw_index}, {"_newindex", raw_newindex},
  {"tensor", t_tensor}, {"zeros", t_zeros}, {"ones", t_ones}, {"empty", t_empty}, {"full", t_full},
  {"eye", t_eye}, {"arange", t_arange}, {"cat", t_cat}, {"stack", t_stack}, {NULL, NULL}};

static const luaL_Reg methods[] = {
  {"size", m_size}, {"stride", m_stride}, {"dim", m_dim}, {"numel", m_numel},
  {"is_contiguous", m_is_contiguous}, {"has_internal_overlap", m_has_internal_overlap}, {"item", m_item},
  {"totable", m_totable}, {"select", m_select},
  {"narrow", m_narrow}, {"view", m_view}, {"reshape", m_reshape}, {"transpose", m_transpose}, {"t", m_t},
  {"permute", m_permute}, {"unsqueeze", m_unsqueeze}, {"squeeze", m_squeeze}, {"expand", m_expand},
  {"contiguous", m_contiguous}, {"clone", m_clone}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top; registers into them. */
void attnL_open_tensor(lua_State *L) {
  lua_pushvalue(L, -2); /* methods as upvalue of __index */
  lua_pushnil(L);       /* the Lua layer's field getter, set by attn.core._set_field_handlers */
  lua_pushcclosure(L, mt_index, 2);
  lua_setfield(L, -2, "__index");
  lua_pushnil(L); /* the field setter */
  lua_pushcclosure(L, mt_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pushcfunction(L, mt_len);
  lua_setfield(L, -2, "__len");
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, methods, 0);
  lua_pop(L, 1);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, module_funcs, 0);
  lua_pop(L, 1);
  attnL_open_autograd(L);
}
