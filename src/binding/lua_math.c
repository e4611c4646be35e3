/* Tensor maths from Lua: operators, elementwise methods, reductions,
 * softmax, masks, comparisons, matmul. */
#include <math.h>
#include <string.h>

#include "attn_lua.h"
#include "ops.h"

/* A tensor or number operand; numbers become 0-dim tensors over `scalar`. */
static attn_tensor operand(lua_State *L, int arg, float *scalar, const char *fn, const char *what) {
  attn_tensor *t = attnL_test(L, arg);
  if (t) return *t;
  if (lua_type(L, arg) == LUA_TNUMBER) {
    *scalar = (float)lua_tonumber(L, arg);
    return attn_make(scalar, 0, NULL);
  }
  attnL_error(L, fn, "bad argument #%d '%s' (expected attn.Tensor or number, got %s)", arg, what, luaL_typename(L, arg));
  return *t; /* not reached */
}

/* Arithmetic on two bool tensors, as PyTorch's type promotion: + is logical or
 * (max of 0/1), *, maximum and minimum keep 0/1, and all four give a bool;
 * - is refused as PyTorch refuses it; the rest give float. Returns the op to
 * run; *is_bool tells the result's kind. */
static attn_binop bool_arithmetic(lua_State *L, attn_binop op, int *is_bool, const char *fn) {
  *is_bool = 1;
  switch (op) {
    case ATTN_ADD: return ATTN_MAXIMUM;
    case ATTN_MUL:
    case ATTN_MAXIMUM:
    case ATTN_MINIMUM: return op;
    case ATTN_SUB:
      attnL_error(L, fn, "subtraction of two bool tensors is not supported, as in PyTorch (use logical_xor, "
                  "or logical_not to invert a mask)");
      break;
    default: break;
  }
  *is_bool = 0;
  return op;
}

static int binary(lua_State *L, attn_binop op, int compare, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  float sa, sb;
  /* Lua calls the arithmetic metamethods with a tensor on one side; a direct
   * call with two numbers (getmetatable(t).__add(1, 2)) is not a tensor op */
  if (!attnL_test(L, 1) && !attnL_test(L, 2) && lua_type(L, 1) == LUA_TNUMBER && lua_type(L, 2) == LUA_TNUMBER)
    attnL_error(L, fn, "expected at least one attn.Tensor operand, got number and number");
  attn_tensor a = operand(L, 1, &sa, fn, "self"), b = operand(L, 2, &sb, fn, "other");
  int is_bool = compare;
  if (!compare && a.is_bool && b.is_bool) op = bool_arithmetic(L, op, &is_bool, fn);
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_broadcast_shape(a.ndim, a.size, b.ndim, b.size, &ndim, size) != ATTN_OK) attnL_core_error(L, fn);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fn);
  if (attn_binary(op, &a, &b, out) != ATTN_OK) attnL_core_error(L, fn);
  out->is_bool = is_bool;
  return 1;
}

/* self op= other, in place; other must broadcast to self's shape. */
static int binary_(lua_State *L, attn_binop op, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  attn_tensor *self = attnL_check(L, 1, fn, "self");
  float sb;
  attn_tensor b = operand(L, 2, &sb, fn, "other");
  attn_tensor e;
  if (!attn_same_shape(&b, self) && attn_expand(&b, self->ndim, self->size, &e) != ATTN_OK) {
    char b1[200], b2[200];
    attnL_error(L, fn, "other of shape %s does not broadcast to self's shape %s", attnL_shape(&b, b1, sizeof b1),
                attnL_shape(self, b2, sizeof b2));
  }
  if (self->is_bool) { /* the result must stay 0/1: PyTorch refuses a float result into a bool self */
    int is_bool = 0;
    if (b.is_bool) op = bool_arithmetic(L, op, &is_bool, fn);
    if (!is_bool)
      attnL_error(L, fn, "the result is float, which cannot be written into a bool self, as in PyTorch "
                  "(convert self with :float() first)");
  }
  attnL_check_writable(L, self, fn);
  if (attn_binary(op, self, &b, self) != ATTN_OK) attnL_core_error(L, fn);
  attnL_bump_version(L, 1, fn);
  lua_settop(L, 1);
  return 1;
}

static int unary(lua_State *L, attn_unop op, const char *fn) {
  attnL_check_nargs(L, 1, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  if (op == ATTN_NEG && a->is_bool)
    attnL_error(L, fn, "negation of a bool tensor is not supported, as in PyTorch (use logical_not to invert a mask)");
  attn_tensor *out = attnL_push_uninit(L, a->ndim, a->size, fn);
  attn_unary(op, a, out);
  out->is_bool = op == ATTN_NONZERO || op == ATTN_LOGICAL_NOT;
  return 1;
}

/* A value written into a bool tensor becomes 0 or 1 (nonzero, NaN included, is true), as in PyTorch. */
static float bool_value(const attn_tensor *t, float v) { return t->is_bool ? (v != 0.0f ? 1.0f : 0.0f) : v; }

/* fill_ and zero_ write one value into every element, so an expanded self
 * (elements sharing memory) is fine, as in PyTorch: no writability check. */
static int m_fill_(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:fill_");
  attn_tensor *t = attnL_check(L, 1, "Tensor:fill_", "self");
  attn_fill(t, bool_value(t, (float)attnL_checknumber(L, 2, "Tensor:fill_", "value")));
  attnL_bump_version(L, 1, "Tensor:fill_");
  lua_settop(L, 1);
  return 1;
}

static int m_zero_(lua_State *L) {
  attnL_check_nargs(L, 1, "Tensor:zero_");
  attn_tensor *t = attnL_check(L, 1, "Tensor:zero_", "self");
  attn_fill(t, 0.0f);
  attnL_bump_version(L, 1, "Tensor:zero_");
  lua_settop(L, 1);
  return 1;
}

static int m_copy_(lua_State *L) {
  const char *fn = "Tensor:copy_";
  attnL_check_nargs(L, 2, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  attn_tensor *src = attnL_check(L, 2, fn, "src");
  char b1[200], b2[200];
  attn_tensor e;
  if (attn_expand(src, t->ndim, t->size, &e) != ATTN_OK)
    attnL_error(L, fn, "src of shape %s does not broadcast to self's shape %s", attnL_shape(src, b1, sizeof b1),
                attnL_shape(t, b2, sizeof b2));
  attnL_copy_into(L, t, src, fn);
  attnL_bump_version(L, 1, fn);
  lua_settop(L, 1);
  return 1;
}

/* masked_fill(mask, value) and masked_fill_ */
static int masked_fill(lua_State *L, int inplace, const char *fn) {
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  attn_tensor *mask = attnL_check(L, 2, fn, "mask");
  float v = bool_value(t, (float)attnL_checknumber(L, 3, fn, "value"));
  attn_tensor e;
  char b1[200], b2[200];
  attn_tensor *out = t;
  if (!inplace) { /* as torch.masked_fill: self and mask broadcast together */
    int ndim;
    int64_t size[ATTN_MAX_DIMS];
    if (attn_broadcast_shape(t->ndim, t->size, mask->ndim, mask->size, &ndim, size) != ATTN_OK)
      attnL_error(L, fn, "mask of shape %s does not broadcast with the shape %s", attnL_shape(mask, b1, sizeof b1),
                  attnL_shape(t, b2, sizeof b2));
    out = attnL_push_uninit(L, ndim, size, fn);
    attn_unary(ATTN_COPY, t, out);
    out->is_bool = t->is_bool;
  } else {
    if (attn_expand(mask, t->ndim, t->size, &e) != ATTN_OK)
      attnL_error(L, fn, "mask of shape %s does not broadcast to the shape %s", attnL_shape(mask, b1, sizeof b1),
                  attnL_shape(t, b2, sizeof b2));
    attnL_check_writable(L, t, fn); /* the mask may differ between elements that share memory */
    lua_settop(L, 1);
  }
  if (attn_masked_fill(out, mask, v) != ATTN_OK) attnL_core_error(L, fn);
  if (inplace) attnL_bump_version(L, 1, fn);
  return 1;
}

static int m_masked_fill(lua_State *L) { return masked_fill(L, 0, "attn.masked_fill"); }
static int m_masked_fill_(lua_State *L) { return masked_fill(L, 1, "Tensor:masked_fill_"); }

static int triangle(lua_State *L, int upper, int inplace, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  int64_t k = lua_isnoneornil(L, 2) ? 0 : attnL_checkinteger(L, 2, fn, "diagonal");
  if (t->ndim < 2) attnL_error(L, fn, "expected a tensor with at least 2 dims, got %d", t->ndim);
  attn_tensor *out = t;
  if (!inplace) {
    out = attnL_push_uninit(L, t->ndim, t->size, fn);
    out->is_bool = t->is_bool;
  } else {
    attnL_check_writable(L, t, fn); /* zeroes some elements and keeps others: order-dependent when shared */
    lua_settop(L, 1);
  }
  if (attn_triangle(t, out, k, upper) != ATTN_OK) attnL_core_error(L, fn);
  if (inplace) attnL_bump_version(L, 1, fn);
  return 1;
}

static int m_triu(lua_State *L) { return triangle(L, 1, 0, "attn.triu"); }
static int m_tril(lua_State *L) { return triangle(L, 0, 0, "attn.tril"); }
static int m_triu_(lua_State *L) { return triangle(L, 1, 1, "Tensor:triu_"); }
static int m_tril_(lua_State *L) { return triangle(L, 0, 1, "Tensor:tril_"); }

/* ---- reductions -------------------------------------------------------- */

/* the output of a reduction along d: a's shape with d kept as 1 */
static attn_tensor *push_reduced(lua_State *L, const attn_tensor *a, int d, const char *fn) {
  int64_t size[ATTN_MAX_DIMS];
  memcpy(size, a->size, sizeof size);
  size[d] = 1;
  return attnL_push_uninit(L, a->ndim, size, fn);
}

/* drop dim d of a tensor (in place on its descriptor) */
static void drop_dim(attn_tensor *t, int d) {
  for (int k = d; k < t->ndim - 1; k++) {
    t->size[k] = t->size[k + 1];
    t->stride[k] = t->stride[k + 1];
  }
  t->ndim--;
}

static int reduce(lua_State *L, attn_reduceop op, int want_indices, const char *fn) {
  attnL_check_nargs(L, 3, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2)) {
    if (!lua_isnoneornil(L, 3)) attnL_error(L, fn, "bad argument #3 'keepdim' (keepdim needs a dim)");
    float v;
    int64_t at;
    if (attn_reduce_all(op, a, &v, &at) != ATTN_OK) attnL_core_error(L, fn);
    attn_tensor *out = attnL_push_uninit(L, 0, NULL, fn);
    out->data[0] = want_indices == 2 ? (float)(at + 1) : v;
    return 1;
  }
  if (a->ndim == 0) attnL_error(L, fn, "a 0-dim tensor has no dim to reduce");
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  int keepdim = attnL_checkboolean_opt(L, 3, fn, "keepdim");
  attn_tensor *vals = push_reduced(L, a, d, fn);
  attn_tensor *idx = want_indices ? push_reduced(L, a, d, fn) : NULL;
  if (attn_reduce_dim(op, a, d, vals, idx) != ATTN_OK) attnL_core_error(L, fn);
  if (idx) {
    int64_t n = attn_numel(idx);
    for (int64_t i = 0; i < n; i++) idx->data[i] += 1.0f; /* 1-based, as every index in Lua */
  }
  if (!keepdim) {
    drop_dim(vals, d);
    if (idx) drop_dim(idx, d);
  }
  if (want_indices == 2) { /* argmax/argmin: the indices alone */
    lua_remove(L, -2);
    return 1;
  }
  return want_indices ? 2 : 1;
}

static int softmax(lua_State *L, int log, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2)) attnL_error(L, fn, "bad argument #2 'dim' (a dim is required)");
  int d = attnL_checkdim(L, 2, a->ndim, fn);
  attn_tensor *out = attnL_push_uninit(L, a->ndim, a->size, fn);
  if (attn_softmax(a, d, out, log) != ATTN_OK) attnL_core_error(L, fn);
  return 1;
}

static int m_softmax(lua_State *L) { return softmax(L, 0, "attn.softmax"); }
static int m_log_softmax(lua_State *L) { return softmax(L, 1, "attn.log_softmax"); }

static int m_equal(lua_State *L) {
  attnL_check_nargs(L, 2, "Tensor:equal");
  attn_tensor *a = attnL_check(L, 1, "Tensor:equal", "self");
  attn_tensor *b = attnL_check(L, 2, "Tensor:equal", "other");
  if (!attn_same_shape(a, b)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, attn_equal(a, b));
  return 1;
}

/* ---- matmul ------------------------------------------------------------ */

static int matmul(lua_State *L, const char *fn) {
  attnL_check_nargs(L, 2, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  attn_tensor *b = attnL_check(L, 2, fn, "other");
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  if (attn_matmul_shape(a, b, &ndim, size) != ATTN_OK) attnL_core_error(L, fn);
  attn_tensor *out = attnL_push_uninit(L, ndim, size, fn);
  if (attn_matmul(a, b, out) != ATTN_OK) attnL_core_error(L, fn);
  return 1;
}

static int m_matmul(lua_State *L) { return matmul(L, "attn.matmul"); }

static int m_dot(lua_State *L) {
  const char *fn = "attn.dot";
  attnL_check_nargs(L, 2, fn);
  attn_tensor *a = attnL_check(L, 1, fn, "self");
  attn_tensor *b = attnL_check(L, 2, fn, "other");
  char b1[200], b2[200];
  if (a->ndim != 1 || b->ndim != 1 || a->size[0] != b->size[0])
    attnL_error(L, fn, "expected two 1-D tensors of the same size, got %s and %s", attnL_shape(a, b1, sizeof b1),
                attnL_shape(b, b2, sizeof b2));
  return matmul(L, fn); /* its errors (out of memory) name dot */
}

static int m_blas_info(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, attn_blas_corename());
  lua_setfield(L, -2, "core");
  lua_pushinteger(L, attn_blas_threads());
  lua_setfield(L, -2, "threads");
  return 1;
}

/* ---- the ops of op_table.h ---------------------------------------------
 * One closure per op over the generic checks and calls above; upvalues: the
 * op's descriptor and the name its errors give ("attn.add", "Tensor:add_"). */

static const attn_op_info *op_info(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }
static const char *op_fname(lua_State *L) { return lua_tostring(L, lua_upvalueindex(2)); }

static int op_call(lua_State *L) {
  const attn_op_info *e = op_info(L);
  const char *fn = op_fname(L);
  switch (e->kind) {
    case ATTN_KIND_UNARY: return unary(L, (attn_unop)e->op, fn);
    case ATTN_KIND_BINARY:
    case ATTN_KIND_COMPARE: return binary(L, (attn_binop)e->op, e->kind == ATTN_KIND_COMPARE, fn);
    case ATTN_KIND_REDUCE: /* with a dim, max and min also return the indices */
      return reduce(L, (attn_reduceop)e->op, e->index_name && !lua_isnoneornil(L, 2), fn);
  }
  return 0;
}

/* t:add_(other) */
static int op_call_inplace(lua_State *L) { return binary_(L, (attn_binop)op_info(L)->op, op_fname(L)); }

/* argmax, argmin: the indices alone */
static int op_call_indices(lua_State *L) { return reduce(L, (attn_reduceop)op_info(L)->op, 2, op_fname(L)); }

/* -t: Lua passes the operand twice */
static int op_call_unm(lua_State *L) {
  lua_settop(L, 1);
  return unary(L, (attn_unop)op_info(L)->op, op_fname(L));
}

static void push_op_closure(lua_State *L, const attn_op_info *e, lua_CFunction f, const char *fname_fmt,
                            const char *name) {
  lua_pushlightuserdata(L, (void *)e);
  lua_pushfstring(L, fname_fmt, name);
  lua_pushcclosure(L, f, 2);
}

/* With [module, methods, metatable] on top: attn.name and t:name for every
 * public op, t:name_ for the in-place ones, the indices variant of max and
 * min, and the operators' metamethods. */
static void register_ops(lua_State *L) {
  for (int i = 0; i < attn_op_count; i++) {
    const attn_op_info *e = &attn_ops[i];
    if (e->flags & ATTN_OPF_INTERNAL) continue;
    push_op_closure(L, e, op_call, "attn.%s", e->name);
    if (e->lua_operator && e->kind != ATTN_KIND_UNARY) {
      lua_pushvalue(L, -1);
      lua_setfield(L, -3, e->lua_operator);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, e->name);
    lua_setfield(L, -4, e->name);
    if (e->lua_operator && e->kind == ATTN_KIND_UNARY) {
      push_op_closure(L, e, op_call_unm, "attn.%s", e->name);
      lua_setfield(L, -2, e->lua_operator);
    }
    if (e->flags & ATTN_OPF_INPLACE) {
      push_op_closure(L, e, op_call_inplace, "Tensor:%s_", e->name);
      lua_pushfstring(L, "%s_", e->name);
      lua_insert(L, -2);
      lua_settable(L, -4);
    }
    if (e->index_name) {
      push_op_closure(L, e, op_call_indices, "attn.%s", e->index_name);
      lua_pushvalue(L, -1);
      lua_setfield(L, -4, e->index_name);
      lua_setfield(L, -4, e->index_name);
    }
  }
}

static const char *const kind_names[] = {"unary", "binary", "comparison", "reduction"};

static void push_op_entry(lua_State *L, const char *name, const char *kind, int arity, int differentiable) {
  lua_createtable(L, 0, 8);
  lua_pushstring(L, name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, kind);
  lua_setfield(L, -2, "kind");
  lua_pushinteger(L, arity);
  lua_setfield(L, -2, "arity");
  lua_pushboolean(L, differentiable);
  lua_setfield(L, -2, "differentiable");
}

static void set_string_field(lua_State *L, const char *key, const char *value) {
  if (!value) return;
  lua_pushstring(L, value);
  lua_setfield(L, -2, key);
}

/* attn.ops_table(): a new list of the public ops, from op_table.h (a fresh
 * copy each call, so a caller cannot change what the next one sees) */
static int m_ops_table(lua_State *L) {
  attnL_check_nargs(L, 0, "attn.ops_table");
  lua_newtable(L);
  int n = 0;
  for (int i = 0; i < attn_op_count; i++) {
    const attn_op_info *e = &attn_ops[i];
    if (e->flags & ATTN_OPF_INTERNAL) continue;
    push_op_entry(L, e->name, kind_names[e->kind], e->arity, (e->flags & ATTN_OPF_DIFF) != 0);
    set_string_field(L, "forward", e->forward);
    set_string_field(L, "backward", e->flags & ATTN_OPF_DIFF ? e->backward : NULL);
    set_string_field(L, "operator", e->lua_operator);
    set_string_field(L, "index_name", e->index_name);
    if (e->flags & ATTN_OPF_INPLACE) {
      lua_pushfstring(L, "%s_", e->name);
      lua_setfield(L, -2, "inplace");
    }
    lua_rawseti(L, -2, ++n);
    if (e->index_name) { /* argmax: max's 1-based indices, not differentiable */
      push_op_entry(L, e->index_name, kind_names[e->kind], e->arity, 0);
      set_string_field(L, "indices_of", e->name);
      lua_rawseti(L, -2, ++n);
    }
  }
  return 1;
}

static const luaL_Reg funcs[] = {
  {"masked_fill", m_masked_fill}, {"triu", m_triu}, {"tril", m_tril},
  {"softmax", m_softmax}, {"log_softmax", m_log_softmax}, {"equal", m_equal},
  {"matmul", m_matmul}, {"dot", m_dot}, {NULL, NULL}};

static const luaL_Reg methods_only[] = {
  {"fill_", m_fill_}, {"zero_", m_zero_}, {"copy_", m_copy_}, {"masked_fill_", m_masked_fill_},
  {"triu_", m_triu_}, {"tril_", m_tril_}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top. */
void attnL_open_math(lua_State *L) {
  register_ops(L);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, funcs, 0);
  luaL_setfuncs(L, methods_only, 0);
  lua_pop(L, 1);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pushcfunction(L, m_blas_info);
  lua_setfield(L, -2, "blas_info");
  lua_pushcfunction(L, m_ops_table);
  lua_setfield(L, -2, "ops_table");
  lua_pop(L, 1);
}
