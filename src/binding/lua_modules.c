/* attn.core.modules.attention_forward: the fused forward of attn.nn's
 * CausalAttention and MultiHeadAttention (src/core/modules.c), one C call per
 * forward. It takes only calls it can run exactly as the module-by-module Lua
 * path would, and returns nil for anything else (a bad x, too many tokens,
 * parameters replaced by something unusual): the module then runs its Lua
 * path, whose checks raise the errors that name the class and argument. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "attention.h"
#include "attn_lua.h"
#include "modules.h"
#include "modules_backward.h"
#include "rng.h"

static const char *const FN = "attn.core.modules.attention_forward";
static const char *const BWD = "attn.core.modules.attention_backward";

/* The tensor at arg, NULL for nil; *ok = 0 when it is something else. */
static const attn_tensor *opt_tensor(lua_State *L, int arg, const void *mt, int *ok) {
  if (lua_isnoneornil(L, arg)) return NULL;
  const attn_tensor *t = attnL_test_mt(L, arg, mt);
  if (!t) *ok = 0;
  return t;
}

/* The top-left [n, n] corner of the 2-D tensor t (a view, same storage). */
static attn_tensor corner(const attn_tensor *t, int64_t n) {
  attn_tensor c = *t;
  c.size[0] = n, c.size[1] = n;
  return c;
}

/* attention_forward(x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv[, wo, bo[, mask]])
 *   x          [..., n, d_in], with exactly `rank` dims (rank 0: 2 to 8 dims), n <= context_length
 *   heads      head count (d_out / heads = head size); scale of the scores
 *   p          dropout on the attention weights, in [0, 1) (0 in eval mode)
 *   w*, b*     the Linear weights [d_out, d_in] and biases (nil: none); wo, bo the out_proj
 *   mask       the module's `mask` buffer (nil: causal): as torch's modules, its [n, n]
 *              corner hides where nonzero; the causal triangle takes the causal path
 * -> [..., n, d_out], or nil when the call is not one for the fused path.
 * attention_forward(..., mask, true) also returns the call's dropout draw (0
 * without dropout), which attention_backward takes.
 * attention_forward(..., mask, true, true) (the training forward) also
 * returns what the backward would otherwise recompute: qkv [3, B n, d_out],
 * o [B, heads, n, head_dim], c [B n, d_out] (nil without out_proj), saved
 * (the softmax [B, heads, n, n] or the log-sum-exp [B, heads, n]) and the
 * kernel (1 math, 2 flash); all nil for a call whose backward is tiny (that
 * backward recomputes them in its direct loops). */

/* The module of the arguments 1 to 16 into m (mask_corner holds the
 * mask's [n, n] corner when m->mask points to it); 0 when the call is not
 * one for the fused path. */
/* Whether the [n, n] corner of the 2-D mask (at least [n, n]) is triu(ones,
 * 1): attn_mask_is_causal's answer, with each row's visible part and hidden
 * part as loops of their own (no per-element test of which part it is). */
static int corner_is_causal(const attn_tensor *mask, int64_t n) {
  int64_t s0 = mask->stride[0], s1 = mask->stride[1];
  for (int64_t i = 0; i < n; i++) {
    const float *row = mask->data + i * s0;
    int ok = 1;
    for (int64_t j = 0; j <= i; j++) ok &= row[j * s1] == 0.0f;
    for (int64_t j = i + 1; j < n; j++) ok &= row[j * s1] == 1.0f;
    if (!ok) return 0;
  }
  return 1;
}

static int read_module(lua_State *L, attn_self_attention *m, attn_tensor *mask_corner) {
  /* the tensor metatable: upvalue 1 of attention_forward and attention_backward */
  const void *mt = lua_topointer(L, lua_upvalueindex(1));
  attn_tensor *x = attnL_test_mt(L, 1, mt);
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
  if (!(fabs((double)scale) <= (double)FLT_MAX) || heads < 1) return 0; /* NaN, or not finite in float32 */

  int ok = 1;
  m->wq = opt_tensor(L, 8, mt, &ok), m->bq = opt_tensor(L, 9, mt, &ok);
  m->wk = opt_tensor(L, 10, mt, &ok), m->bk = opt_tensor(L, 11, mt, &ok);
  m->wv = opt_tensor(L, 12, mt, &ok), m->bv = opt_tensor(L, 13, mt, &ok);
  m->wo = opt_tensor(L, 14, mt, &ok), m->bo = opt_tensor(L, 15, mt, &ok);
  m->heads = (int64_t)heads;
  m->scale = (float)scale;
  m->dropout_p = (double)p;
  m->dropout_draw = (attn_dropout_draw){0, NULL};
  m->mask = NULL;
  if (!ok || (!m->wo && m->bo) || attn_self_attention_check(m, (int64_t)d_in) != ATTN_OK) return 0;
  const attn_tensor *mask = opt_tensor(L, 16, mt, &ok);
  if (!ok) return 0;
  if (mask) { /* anything but a 2-D 0/1 buffer of >= n x n: the module path words the error */
    int64_t n = x->size[x->ndim - 2], at[ATTN_MAX_DIMS];
    float bad;
    if (mask->ndim != 2 || mask->size[0] < n || mask->size[1] < n) return 0;
    if (!corner_is_causal(mask, n)) { /* the causal triangle (the default buffer) is 0/1: one pass */
      *mask_corner = corner(mask, n);
      if (attn_mask_find_non_binary(mask_corner, at, &bad)) return 0;
      m->mask = mask_corner;
    }
  }
  return 1;
}

/* The tensors of a forward call that read_module took: x contiguous (x or
 * its copy pushed), out [x's leading shape..., d_out] pushed (at out_at),
 * their [B, n, *] views, and with dropout the draw over the weights [B,
 * heads, n, n], where the Lua path's scaled_dot_product_attention draws it
 * (its holder pushed at holder; 0 without dropout). */
typedef struct forward_call {
  attn_tensor x3, out3;
  int out_at, holder;
} forward_call;

static void push_forward_call(lua_State *L, attn_self_attention *m, forward_call *fc) {
  attn_tensor *x = lua_touserdata(L, 1); /* a tensor: read_module checked */
  if (attn_is_contiguous(x)) lua_pushvalue(L, 1);
  else x = attnL_push_contiguous(L, 1, FN);
  int nd = x->ndim;
  int64_t size[ATTN_MAX_DIMS];
  for (int d = 0; d < nd; d++) size[d] = x->size[d];
  size[nd - 1] = m->wq->size[0];
  attn_tensor *out = attnL_push_uninit(L, nd, size, FN);
  fc->out_at = lua_gettop(L);
  int64_t nb = 1, n = size[nd - 2];
  for (int d = 0; d < nd - 2; d++) nb *= size[d];
  int64_t s3[3] = {nb, n, x->size[nd - 1]}, o3[3] = {nb, n, size[nd - 1]};
  fc->x3 = attn_make(x->data, 3, s3);
  fc->out3 = attn_make(out->data, 3, o3);
  fc->holder = 0;
  if (m->dropout_p > 0.0) {
    int64_t numel; /* -1: more than int64 counts */
    if (__builtin_mul_overflow(nb * n, m->heads * n, &numel)) numel = -1;
    m->dropout_draw = attnL_draw_dropout(L, m->dropout_p, numel, FN);
    fc->holder = lua_gettop(L);
  }
}

/* attention_forward, as described above */
static int l_attention_forward(lua_State *L) {
  attn_self_attention m;
  attn_tensor mask_corner;
  if (!read_module(L, &m, &mask_corner)) return 0;
  int return_draw = lua_toboolean(L, 17), keep = return_draw && lua_toboolean(L, 18);
  forward_call fc;
  push_forward_call(L, &m, &fc);
  int64_t nb = fc.out3.size[0], n = fc.out3.size[1], d_out = fc.out3.size[2], d_in = fc.x3.size[2];
  int kernel;
  int64_t saved_floats;
  keep = keep && attn_self_attention_keeps(&m, nb, n, d_in, &kernel, &saved_floats);
  attn_self_attention_saved sv = {NULL, NULL, NULL, NULL, 0};
  int state_at = lua_gettop(L) + 1; /* qkv, o, c (or nil), saved */
  if (keep) {
    int64_t h = m.heads, rows = nb * n;
    int64_t qkv_size[3] = {3, rows, d_out}, o_size[4] = {nb, h, n, d_out / h}, c_size[2] = {rows, d_out};
    int64_t s_size[4] = {nb, h, n, n};
    sv.kernel = kernel;
    sv.qkv = attnL_push_uninit(L, 3, qkv_size, FN)->data;
    sv.o = attnL_push_uninit(L, 4, o_size, FN)->data;
    if (m.wo) sv.c = attnL_push_uninit(L, 2, c_size, FN)->data;
    else lua_pushnil(L);
    sv.saved = attnL_push_uninit(L, kernel == ATTN_SDPA_MATH ? 4 : 3, s_size, FN)->data;
  }
  attn_status st = keep ? attn_self_attention_forward_saving(&m, &fc.x3, &fc.out3, &sv)
                        : attn_self_attention_forward(&m, &fc.x3, &fc.out3);
  if (st != ATTN_OK) attnL_core_error(L, FN);
  if (!return_draw) {
    lua_settop(L, fc.out_at);
    return 1;
  }
  /* out, draw (for attention_backward): the MKL draw, or the holder of the keep flags */
  lua_pushvalue(L, fc.out_at);
  attnL_push_dropout_draw(L, m.dropout_draw, fc.holder);
  if (!lua_toboolean(L, 18)) return 2;
  for (int i = 0; i < 4; i++) {
    if (keep) lua_pushvalue(L, state_at + i);
    else lua_pushnil(L);
  }
  if (keep) lua_pushinteger(L, kernel);
  else lua_pushnil(L);
  return 7;
}

/* attention_record(history, Node, def, x, d_in, ..., mask): the recorded
 * forward of attn.autograd.sdpa's fused_attention (an attn.autograd.Function
 * whose definition is def) for a call whose backward recomputes (a tiny
 * call, attn_self_attention_keeps 0), in one C call: the output, and its node
 * (lua/attn/autograd/init.lua: a table of metatable Node with the fields the
 * walk reads, _name, _def, _edges, _nout, _shapes, _saved, node and slot; the
 * output's history entry is the node). _saved is what ctx:save_for_backward
 * keeps (every argument, then the versions of the tensors), and after those
 * the forward's draw. Its backward is attention_node_backward's: no
 * needs_input_grad (an edge is false where no gradient is needed), eight
 * fields (the smallest hash part that holds them). Returns nothing when it
 * leaves the call to that Function: a call the fused path does not take, one
 * that keeps state, a stale input (the Function rebuilds its history or
 * refuses it), or no input that requires grad. */
#define RECORD_ARGS 16

/* The node's field names, in the order of the upvalues 2 .. of attention_record
 * (interned once: lua_setfield would look each name up on every call). */
static const char *const NODE_FIELDS[] = {"_edges", "_name", "_def", "_nout", "_shapes", "_saved", "node", "slot"};
#define NODE_FIELD_COUNT ((int)(sizeof NODE_FIELDS / sizeof NODE_FIELDS[0]))

/* node[NODE_FIELDS[k]] = the value on top (popped) */
static void set_node_field(lua_State *L, int node, int k) {
  lua_pushvalue(L, lua_upvalueindex(2 + k));
  lua_insert(L, -2);
  lua_rawset(L, node);
}

/* Whether argument i (1 .. 16) of a call read_module took is a tensor: x, and
 * any of the parameters and the mask given (read_module refused anything else). */
static int is_tensor_arg(lua_State *L, int i) { return i == 1 || (i >= 8 && !lua_isnil(L, i)); }

static int l_attention_record(lua_State *L) {
  lua_settop(L, 3 + RECORD_ARGS);
  lua_rotate(L, 1, -3); /* the forward's arguments at 1 .. 16, then history, Node, def */
  const int history = RECORD_ARGS + 1, node_mt = RECORD_ARGS + 2, def = RECORD_ARGS + 3;
  static const char *const names[3] = {"history", "Node", "def"};
  for (int i = 0; i < 3; i++)
    if (lua_type(L, history + i) != LUA_TTABLE)
      attnL_error(L, "attn.core.modules.attention_record", "bad argument #%d '%s' (expected a table, got %s)", i + 1,
                  names[i], luaL_typename(L, history + i));
  attn_self_attention m;
  attn_tensor mask_corner;
  if (!read_module(L, &m, &mask_corner)) return 0;
  attn_tensor *x = lua_touserdata(L, 1); /* a tensor: read_module checked */
  int nd = x->ndim;
  int64_t nb = 1;
  for (int d = 0; d < nd - 2; d++) nb *= x->size[d];
  int kernel;
  int64_t saved_floats;
  if (attn_self_attention_keeps(&m, nb, x->size[nd - 2], x->size[nd - 1], &kernel, &saved_floats)) return 0;
  /* the tensor inputs in argument order, each one's history entry pushed in turn */
  int idx[RECORD_ARGS], count = 0, requires = 0;
  int entries = lua_gettop(L) + 1;
  for (int i = 1; i <= RECORD_ARGS; i++) {
    if (!is_tensor_arg(L, i)) continue;
    if (attnL_history_stale(L, i)) return 0;
    idx[count++] = i;
    lua_pushvalue(L, i);
    if (lua_rawget(L, history) != LUA_TNIL && lua_toboolean(L, -1)) requires = 1;
  }
  if (!requires) return 0;

  /* the forward (attention_forward's, returning the draw) */
  forward_call fc;
  push_forward_call(L, &m, &fc);
  if (attn_self_attention_forward(&m, &fc.x3, &fc.out3) != ATTN_OK) attnL_core_error(L, FN);
  attn_tensor *out = lua_touserdata(L, fc.out_at);
  int out_at = fc.out_at, holder = fc.holder;

  /* the node */
  lua_createtable(L, 0, NODE_FIELD_COUNT);
  int node = lua_gettop(L);
  lua_pushvalue(L, node_mt);
  lua_setmetatable(L, node);
  lua_createtable(L, count, 0); /* _edges */
  for (int k = 0; k < count; k++) {
    int h = entries + k;
    if (lua_type(L, h) == LUA_TTABLE) lua_pushvalue(L, h); /* the edge to the node that made it */
    else if (lua_toboolean(L, h)) lua_pushvalue(L, idx[k]); /* a leaf: the edge is the tensor itself */
    else lua_pushboolean(L, 0);
    lua_rawseti(L, node + 1, k + 1);
  }
  set_node_field(L, node, 0); /* _edges */
  const char *name = m.wo ? "ViewBackward0" : nd == 2 ? "MmBackward0" : "UnsafeViewBackward0";
  lua_pushstring(L, name);
  set_node_field(L, node, 1); /* _name */
  lua_pushvalue(L, def);
  set_node_field(L, node, 2); /* _def */
  lua_pushinteger(L, 1);
  set_node_field(L, node, 3); /* _nout */
  lua_pushlstring(L, (const char *)out->size, (size_t)nd * sizeof out->size[0]); /* the shape key */
  set_node_field(L, node, 4); /* _shapes */
  /* _saved: {n, the n arguments, then the version of each tensor (false
   * otherwise), then the draw} */
  lua_createtable(L, 2 * RECORD_ARGS + 2, 0);
  lua_pushinteger(L, RECORD_ARGS);
  lua_rawseti(L, -2, 1);
  for (int i = 1; i <= RECORD_ARGS; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, -2, 1 + i);
    if (is_tensor_arg(L, i)) lua_pushinteger(L, attnL_version(L, i));
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, 1 + RECORD_ARGS + i);
  }
  attnL_push_dropout_draw(L, m.dropout_draw, holder);
  lua_rawseti(L, -2, 2 * RECORD_ARGS + 2);
  set_node_field(L, node, 5); /* _saved */
  lua_pushvalue(L, node);
  set_node_field(L, node, 6); /* node */
  lua_pushinteger(L, 1);
  set_node_field(L, node, 7); /* slot */
  /* history[out] = node: the node is its one output's history entry */
  lua_pushvalue(L, out_at);
  lua_pushvalue(L, node);
  lua_rawset(L, history);
  lua_pushvalue(L, out_at);
  return 1;
}

/* The training forward's state at arguments at .. at + 4 (qkv, o, c, saved,
 * kernel) into sv; 0 when argument at is nil (the backward recomputes). */
static int read_state(lua_State *L, int at, const attn_self_attention *m, int64_t nb, int64_t n, int64_t d_in,
                      attn_self_attention_saved *sv) {
  if (lua_isnoneornil(L, at)) return 0;
  int kernel;
  int64_t saved_floats;
  if (!attn_self_attention_keeps(m, nb, n, d_in, &kernel, &saved_floats))
    attnL_error(L, BWD, "bad argument #%d 'qkv' (a call whose backward is tiny keeps no state: expected nil)", at);
  int64_t d_out = m->wq->size[0], rows = nb * n;
  int64_t want[4] = {3 * rows * d_out, rows * d_out, m->wo ? rows * d_out : 0, saved_floats};
  static const char *const names[4] = {"qkv", "o", "c", "saved"};
  float **slots[4] = {&sv->qkv, &sv->o, &sv->c, &sv->saved};
  for (int i = 0; i < 4; i++) {
    *slots[i] = NULL;
    if (want[i] == 0 && lua_isnil(L, at + i)) continue;
    attn_tensor *t = attnL_test(L, at + i);
    if (!t || !attn_is_contiguous(t) || attn_numel(t) != want[i])
      attnL_error(L, BWD, "bad argument #%d '%s' (expected the contiguous tensor of %I floats attention_forward "
                  "kept for these sizes)", at + i, names[i], (lua_Integer)want[i]);
    *slots[i] = t->data;
  }
  if (lua_tointeger(L, at + 4) != kernel)
    attnL_error(L, BWD, "bad argument #%d 'kernel' (expected %d, the kernel of these sizes)", at + 4, kernel);
  sv->kernel = kernel;
  return 1;
}

/* attention_backward(x, d_in, context_length, rank, heads, scale, p, wq, bq, wk, bk, wv, bv, wo, bo, mask,
 *                    dout, draw[, qkv, o, c, saved, kernel[, want_dx]])
 *   the arguments of an attention_forward call that ran (draw: the second result of
 *   attention_forward(..., mask, true), 0 without dropout), and dout of out's shape;
 *   qkv .. kernel: what attention_forward(..., mask, true, true) kept (nothing is recomputed);
 *   want_dx false: x's gradient is neither computed nor returned (x does not require grad)
 *   edges, grads: the recorded node's edges (one per tensor argument, in
 *   argument order: the tensor itself for a leaf that requires grad) and
 *   autograd's table of the leaves' .grad (lua/attn/autograd/init.lua), given
 *   when the backward walk accumulates into .grad (see push_into_grad)
 * -> dx, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo: the gradients of x and of each
 *    parameter (nil for a parameter the module lacks, and dx nil when not wanted;
 *    false for one already added into its leaf's .grad). */

/* Parameter gradients of up to this many floats in all are added into the
 * leaves' .grad from the stack, without a tensor of their own. */
#define INTO_GRAD_FLOATS 1024

/* Whether the tensor at stack slot arg is the node's edge `input` (the edges
 * at argument 25): a leaf that requires grad, whose gradient the walk adds
 * into its .grad. */
static int is_leaf_edge(lua_State *L, int arg, int input) {
  lua_rawgeti(L, 25, input);
  int leaf = lua_rawequal(L, -1, arg);
  lua_pop(L, 1);
  return leaf;
}

/* The .grad of parameter p (at stack slot arg, tensor argument `input` of
 * the call) pushed, when the walk may add p's gradient into it in place (1):
 * p's edge is p itself (a leaf that requires grad) and its .grad (grads[p])
 * is a contiguous float tensor of p's shape. raw add_ into it is what the
 * walk would do with the returned gradient (old:add_(g), the same bits),
 * without the gradient's tensor. Otherwise pushes nothing (0). */
static int push_into_grad(lua_State *L, int arg, int input, const attn_tensor *p, const void *mt) {
  if (!is_leaf_edge(L, arg, input)) return 0;
  lua_pushvalue(L, arg);
  lua_rawget(L, 26);
  const attn_tensor *g = attnL_test_mt(L, -1, mt);
  if (g && !g->is_bool && attn_same_shape(g, p) && attn_is_contiguous(g)) return 1;
  lua_pop(L, 1);
  return 0;
}

static int attention_backward_at(lua_State *L);

static int l_attention_backward(lua_State *L) {
  attnL_check_nargs(L, 26, BWD);
  return attention_backward_at(L);
}

/* attention_backward on its arguments at 1 .. 26, whatever lies above them;
 * its 9 results on top. */
static int attention_backward_at(lua_State *L) {
  attn_self_attention m;
  attn_tensor mask_corner;
  int with_state = !lua_isnoneornil(L, 19);
  int want_dx = lua_isnoneornil(L, 24) || lua_toboolean(L, 24);
  if (!read_module(L, &m, &mask_corner))
    attnL_error(L, BWD, "arguments 1 to 16 are not those of a call attention_forward runs");
  attn_tensor *dout = attnL_check(L, 17, BWD, "dout");
  attn_tensor *x = lua_touserdata(L, 1); /* a tensor: read_module checked */
  if (m.dropout_p > 0.0) { /* the forward's draw over the weights [B, heads, n, n] */
    int64_t nbn = attn_sizes_product(x->ndim - 1, x->size), n_ = x->size[x->ndim - 2], numel;
    if (__builtin_mul_overflow(nbn, m.heads * n_, &numel)) numel = -1;
    m.dropout_draw = attnL_check_dropout_draw(L, 18, numel, BWD, "argument #18 'draw'");
  }
  char b1[200], b2[200];
  int nd = x->ndim, shape_ok = dout->ndim == nd;
  for (int d = 0; shape_ok && d < nd; d++) shape_ok = dout->size[d] == (d == nd - 1 ? m.wq->size[0] : x->size[d]);
  if (!shape_ok) {
    int64_t want[ATTN_MAX_DIMS];
    for (int d = 0; d < nd; d++) want[d] = x->size[d];
    want[nd - 1] = m.wq->size[0];
    attnL_error(L, BWD, "bad argument #17 'dout' (expected the shape of out %s, got %s)",
                attn_sizes_str(nd, want, b1, sizeof b1), attnL_shape(dout, b2, sizeof b2));
  }
  x = attnL_push_contiguous(L, 1, BWD);
  dout = attnL_push_contiguous(L, 17, BWD);
  int64_t nb = 1;
  for (int d = 0; d < nd - 2; d++) nb *= x->size[d];
  int64_t n = x->size[nd - 2], d_in = x->size[nd - 1], d_out = m.wq->size[0];
  int64_t s3[3] = {nb, n, d_in}, o3[3] = {nb, n, d_out};
  attn_tensor x3 = attn_make(x->data, 3, s3), dout3 = attn_make(dout->data, 3, o3);
  attn_self_attention_grads g;
  attn_tensor dx3;
  g.dx = NULL;
  /* one result per parameter, in the order wq, bq, wk, bk, wv, bv, wo, bo */
  const attn_tensor *params[8] = {m.wq, m.bq, m.wk, m.bk, m.wv, m.bv, m.wo, m.bo};
  static const int param_args[8] = {8, 9, 10, 11, 12, 13, 14, 15};
  attn_tensor **slots[8] = {&g.dwq, &g.dbq, &g.dwk, &g.dbk, &g.dwv, &g.dbv, &g.dwo, &g.dbo};
  /* into_grad: the parameters whose gradient goes into their leaf's .grad
   * (push_into_grad, each .grad pushed in turn below x and dout), computed
   * into grad_floats first. Not when x is a leaf that requires grad: the walk
   * adds x's gradient first (its edge comes first), which matters when x's
   * .grad is a parameter's too. */
  float grad_floats[INTO_GRAD_FLOATS];
  attn_tensor into[8];
  int into_at[8] = {0}, into_floats = 0;
  if (lua_type(L, 25) == LUA_TTABLE && lua_type(L, 26) == LUA_TTABLE) {
    const void *mt = lua_topointer(L, lua_upvalueindex(1));
    int input = 1, x_leaf = is_leaf_edge(L, 1, 1); /* input: the tensor argument's position, x's first */
    for (int i = 0; !x_leaf && i < 8; i++) {
      if (!params[i]) continue;
      input++;
      if (into_floats + attn_numel(params[i]) > INTO_GRAD_FLOATS) continue;
      if (!push_into_grad(L, param_args[i], input, params[i], mt)) continue;
      into_at[i] = lua_gettop(L);
      into[i] = attn_make(grad_floats + into_floats, params[i]->ndim, params[i]->size);
      into_floats += (int)attn_numel(params[i]);
    }
  }
  if (want_dx) {
    attn_tensor *dx = attnL_push_uninit(L, nd, x->size, BWD);
    dx3 = attn_make(dx->data, 3, s3);
    g.dx = &dx3;
  } else {
    lua_pushnil(L);
  }
  for (int i = 0; i < 8; i++) {
    if (into_at[i]) {
      *slots[i] = &into[i];
      lua_pushboolean(L, 0);
    } else if (params[i]) {
      *slots[i] = attnL_push_uninit(L, params[i]->ndim, params[i]->size, BWD);
    } else {
      *slots[i] = NULL;
      lua_pushnil(L);
    }
  }
  attn_self_attention_saved sv;
  int kept = with_state && read_state(L, 19, &m, nb, n, d_in, &sv);
  attn_status st = kept ? attn_self_attention_backward_saved(&m, &x3, &dout3, &sv, &g)
                        : attn_self_attention_backward(&m, &x3, &dout3, &g);
  if (st != ATTN_OK) attnL_core_error(L, BWD);
  for (int i = 0; i < 8; i++) { /* in the walk's order of the edges: .grad = .grad + gradient */
    if (!into_at[i]) continue;
    attn_tensor *t = lua_touserdata(L, into_at[i]);
    const float *d = into[i].data;
    int64_t e = attn_numel(t);
    for (int64_t k = 0; k < e; k++) t->data[k] = t->data[k] + d[k];
    attnL_bump_version(L, into_at[i], "Tensor:add_");
  }
  return 9;
}

/* attention_node_backward(node, g[, grads]): the backward of a node
 * attention_record made (its definition's backward; the walk passes grads,
 * its table of the leaves' .grad, when it accumulates into them): the
 * saved arguments read back from node._saved with their versions checked
 * (Node:saved raises the error when one was written in place, or when the
 * graph was freed), then attention_backward on them with the node's draw,
 * x's gradient only when x needs one, and the parameters' gradients added
 * into their leaves' .grad where push_into_grad allows. Returns one gradient
 * per tensor input but the mask, in input order (nil where none is needed,
 * or where it was added into .grad), as the Lua backward of the same node,
 * without the trailing nils. */
static const char *const NODE_BWD = "attn.core.modules.attention_node_backward";

static int l_attention_node_backward(lua_State *L) {
  lua_settop(L, 3);
  if (lua_type(L, 1) != LUA_TTABLE)
    attnL_error(L, NODE_BWD, "bad argument #1 'node' (expected a table, got %s)", luaL_typename(L, 1));
  lua_getfield(L, 1, "_saved"); /* 4 */
  lua_getfield(L, 1, "_edges"); /* 5: false where no gradient is needed */
  int ok = lua_type(L, 4) == LUA_TTABLE && lua_type(L, 5) == LUA_TTABLE &&
           lua_rawgeti(L, 4, 1) == LUA_TNUMBER && lua_tointeger(L, -1) == RECORD_ARGS;
  lua_settop(L, 5);
  luaL_checkstack(L, RECORD_ARGS + 24, NODE_BWD);
  /* attention_backward's 26 arguments from 6: the saved ones, then dout .. grads */
  for (int i = 1; ok && i <= RECORD_ARGS; i++) {
    /* a userdata there is a tensor attention_record saved (read_module checks them again) */
    if (lua_rawgeti(L, 4, 1 + i) == LUA_TUSERDATA) {
      lua_rawgeti(L, 4, 1 + RECORD_ARGS + i);
      ok = lua_isinteger(L, -1) && lua_tointeger(L, -1) == attnL_version(L, -2);
      lua_pop(L, 1);
    }
  }
  if (!ok) {
    if (lua_getfield(L, 1, "saved") == LUA_TFUNCTION) { /* Node:saved, which raises the error */
      lua_pushvalue(L, 1);
      lua_call(L, 1, 0);
    }
    attnL_error(L, NODE_BWD, "bad argument #1 'node' (expected a node attention_record made)");
  }
  lua_pushvalue(L, 2); /* dout */
  lua_rawgeti(L, 4, 2 * RECORD_ARGS + 2); /* the draw */
  for (int i = 0; i < 5; i++) lua_pushnil(L); /* no kept state: the backward recomputes */
  lua_rawgeti(L, 5, 1);                       /* want_dx: x needs a gradient (its edge) */
  int into = lua_type(L, 3) == LUA_TTABLE;
  if (into) lua_pushvalue(L, 5);
  else lua_pushnil(L);
  lua_pushvalue(L, 3);
  lua_rotate(L, 1, -5); /* the arguments at 1 .. 26, then node, g, grads, saved, edges */
  const int edges = 31;
  attention_backward_at(L); /* dx, dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo on top */
  int first = lua_gettop(L) - 8;
  /* one gradient per tensor input (x, then the parameters present), nil where not needed */
  int k = 0;
  for (int r = first; r <= first + 8; r++) {
    if (r > first && lua_isnil(L, r)) continue; /* a parameter the module lacks */
    k++;
    lua_rawgeti(L, edges, k);
    int need = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (need && lua_type(L, r) == LUA_TUSERDATA) lua_pushvalue(L, r);
    else lua_pushnil(L);
  }
  /* trailing nils left off: none at all (nothing for the walk to unpack) when
   * every gradient went into .grad */
  while (k > 0 && lua_isnil(L, -1)) lua_pop(L, 1), k--;
  return k;
}

/* mask_kind(mask[, n]): how a mask applies. With n, mask is a module's 2-D
 * `mask` buffer (at least [n, n]) and its [n, n] corner is judged: "causal"
 * when it is the causal triangle, "mask" when it is another pattern of 0
 * and 1. Without n the whole mask (any shape) is judged: "mask". nil and
 * "<value> at [i, j, ...]" (1-based) when it holds anything but 0 and 1. */
static int l_mask_kind(lua_State *L) {
  static const char *const KIND = "attn.core.modules.mask_kind";
  attn_tensor *mask = attnL_check(L, 1, KIND, "mask");
  attn_tensor judged = *mask;
  int has_n = !lua_isnoneornil(L, 2);
  lua_Integer n = has_n ? luaL_checkinteger(L, 2) : 0;
  if (has_n) {
    if (mask->ndim != 2 || n < 0 || mask->size[0] < n || mask->size[1] < n)
      attnL_error(L, KIND, "bad argument #1 'mask' (expected at least [%lld, %lld])", (long long)n, (long long)n);
    judged = corner(mask, (int64_t)n);
  }
  int64_t at[ATTN_MAX_DIMS];
  float bad;
  if (attn_mask_find_non_binary(&judged, at, &bad)) {
    char where[200], msg[260];
    snprintf(msg, sizeof msg, "%.9g at %s", (double)bad, attn_sizes_str(judged.ndim, at, where, sizeof where));
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
  }
  lua_pushstring(L, has_n && attn_mask_is_causal(mask, (int64_t)n) ? "causal" : "mask");
  return 1;
}

static const luaL_Reg funcs[] = {
    {"attention_forward", l_attention_forward},
    {"attention_backward", l_attention_backward},
    {"mask_kind", l_mask_kind},
    {NULL, NULL},
};

void attnL_open_modules(lua_State *L) {
  lua_newtable(L);
  lua_pushvalue(L, -2); /* the tensor metatable: upvalue 1 (read_module's tensor test) */
  luaL_setfuncs(L, funcs, 1);
  lua_pushvalue(L, -2); /* attention_record: the metatable and the node's field names */
  for (int k = 0; k < NODE_FIELD_COUNT; k++) lua_pushstring(L, NODE_FIELDS[k]);
  lua_pushcclosure(L, l_attention_record, 1 + NODE_FIELD_COUNT);
  lua_setfield(L, -2, "attention_record");
  lua_pushvalue(L, -2); /* attention_node_backward: the metatable */
  lua_pushcclosure(L, l_attention_node_backward, 1);
  lua_setfield(L, -2, "attention_node_backward");
  lua_setfield(L, -4, "modules"); /* module, methods, metatable, this */
}
