/* Reductions along a dim, full reductions, softmax/log_softmax, cat. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "exp_nonpos.h"
#include "iter.h"
#include "ops.h"
#include "row_max.h"
#include "threads.h"

/* Each reduction's family and comparison, from op_table.h. */
typedef enum reduce_family { FAMILY_TOTAL, FAMILY_AVERAGE, FAMILY_EXTREME } reduce_family;
static const reduce_family family_of[ATTN_REDUCEOP_COUNT] = {
#define FAMILY_ENTRY(ID, name, family, ...) [ATTN_##ID] = FAMILY_##family,
  ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, FAMILY_ENTRY)
#undef FAMILY_ENTRY
};

/* EXTREME ops: v replaces best (a NaN is handled by the callers); the switch
 * is on a loop invariant, the comparison inlined */
static inline int is_better(attn_reduceop op, float v, float best) {
  switch (op) {
#define BETTER_CASE(ID, name, family, better, ...) \
  case ATTN_##ID: return (better);
    ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, BETTER_CASE)
#undef BETTER_CASE
    case ATTN_REDUCEOP_COUNT: break;
  }
  return 0;
}

/* the name of a reduction, for messages */
static const char *reduce_name(attn_reduceop op) {
  switch (op) {
#define NAME_CASE(ID, name, ...) \
  case ATTN_##ID: return name;
    ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, NAME_CASE)
#undef NAME_CASE
    case ATTN_REDUCEOP_COUNT: break;
  }
  return "?";
}

/* One line along the reduced dim: length and stride per operand. */
typedef struct line_ctx {
  int op;            /* attn_reduceop, or log flag for softmax */
  int has_indices;   /* max/min: operand 2 receives the argmax/argmin */
  int constant;      /* the reduced dim is expanded (stride 0): every line holds one value */
  int64_t len;
  int64_t in_stride, out_stride;
} line_ctx;

/* a view of t whose dim d has size 1: the walk then visits one line start per position */
static attn_tensor line_starts(const attn_tensor *t, int d) {
  attn_tensor r = *t;
  r.size[d] = 1;
  r.stride[d] = 0;
  return r;
}

static void reduce_row(int64_t n, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  attn_reduceop op = (attn_reduceop)c->op;
  reduce_family family = family_of[op];
  for (int64_t i = 0; i < n; i++) {
    const float *x = p[1] + i * s[1];
    float *o = p[0] + i * s[0];
    if (c->constant) { /* in O(1): the double sum of len copies of x is x * len, exactly below 2^29 copies */
      double x0 = (double)x[0];
      *o = family == FAMILY_TOTAL ? (float)(x0 * (double)c->len) : x[0];
      if (c->has_indices) p[2][i * s[2]] = 0.0f;
    } else if (family != FAMILY_EXTREME) {
      double acc = 0.0;
      for (int64_t j = 0; j < c->len; j++) acc += (double)x[j * c->in_stride];
      if (family == FAMILY_AVERAGE) acc /= (double)c->len;
      *o = (float)acc;
    } else {
      float best = x[0];
      int64_t at = 0;
      switch (op) { /* one loop per op, its comparison inlined */
#define EXTREME_LINE_CASE(ID, name, family, better, ...)              \
  case ATTN_##ID:                                                     \
    for (int64_t j = 1; j < c->len && best == best; j++) {            \
      float v = x[j * c->in_stride];                                  \
      if (v != v || (better)) {                                       \
        best = v;                                                     \
        at = j;                                                       \
      }                                                               \
    }                                                                 \
    break;
        ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, EXTREME_LINE_CASE)
#undef EXTREME_LINE_CASE
        case ATTN_REDUCEOP_COUNT: break;
      }
      *o = best;
      if (c->has_indices) p[2][i * s[2]] = (float)at;
    }
  }
}

/* Columns of one block of the sum below: its double accumulators stay in L1. */
#define COLUMN_BLOCK 512
#define MIN_COLUMN_BLOCK 64

/* A sum or mean over a dim that is not the last, of a contiguous tensor into
 * a contiguous output (the bias gradient of a Linear, g:sum(1) over [rows,
 * out]): row after row added into double accumulators across the contiguous
 * columns, where the line walk strides down each column a cache line per
 * element. Each column still adds its elements in order in double: the bits
 * of the line walk, for any thread count (threads split the columns). */
/* acc[j] = sum over r of src[r * inner + j] (j < w), in double, r in order:
 * the rows go across the vector lanes (8 doubles in the AVX-512 clone), so
 * each column's sum keeps its order. */
ATTN_VECTOR_CLONES static void column_block_sums(const float *restrict src, int64_t len, int64_t inner, int64_t w,
                                                 double *restrict acc) {
  for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
  for (int64_t r = 0; r < len; r++) {
    const float *row = src + r * inner;
#pragma omp simd
    for (int64_t j = 0; j < w; j++) acc[j] += (double)row[j];
  }
}

static void reduce_columns(reduce_family family, const float *x, int64_t outer, int64_t len, int64_t inner,
                           float *out) {
  /* blocks narrower than COLUMN_BLOCK (down to MIN_COLUMN_BLOCK) until every
   * thread has one: a Linear's bias gradient is one block of 512 columns or
   * fewer. Each column's sum is the same whatever block it falls in. */
  int64_t cb = COLUMN_BLOCK, threads = attn_threads_for(outer * inner);
  while (cb > MIN_COLUMN_BLOCK && outer * ((inner + cb - 1) / cb) < threads) cb /= 2;
  int64_t nblk = (inner + cb - 1) / cb;
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(outer * nblk)) \
    if (outer * len * inner > (1 << 16))
  for (int64_t item = 0; item < outer * nblk; item++) {
    double acc[COLUMN_BLOCK];
    int64_t o = item / nblk, c0 = item % nblk * cb;
    int64_t w = inner - c0 < cb ? inner - c0 : cb;
    const float *src = x + o * len * inner + c0;
    column_block_sums(src, len, inner, w, acc);
    float *dst = out + o * inner + c0;
    for (int64_t j = 0; j < w; j++) dst[j] = (float)(family == FAMILY_AVERAGE ? acc[j] / (double)len : acc[j]);
  }
}

attn_status attn_reduce_dim(attn_reduceop op, const attn_tensor *a, int d, attn_tensor *out,
                            attn_tensor *indices) {
  if ((unsigned)op >= ATTN_REDUCEOP_COUNT) return attn_fail(ATTN_EARG, "unknown reduction %d", (int)op);
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim out of range");
  if (out->ndim != a->ndim) return attn_fail(ATTN_ESHAPE, "output rank differs");
  for (int k = 0; k < a->ndim; k++)
    if (out->size[k] != (k == d ? 1 : a->size[k]))
      return attn_fail(ATTN_ESHAPE, "output shape does not fit the reduction");
  int64_t len = a->size[d];
  if (len == 0 && family_of[op] == FAMILY_EXTREME)
    return attn_fail(ATTN_EARG, "cannot take %s of an empty dim", reduce_name(op));
  if (len == 0) return attn_fill(out, family_of[op] == FAMILY_AVERAGE ? NAN : 0.0f);
  if (family_of[op] != FAMILY_EXTREME && d < a->ndim - 1 && attn_is_contiguous(a) && attn_is_contiguous(out)) {
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < d; k++) outer *= a->size[k];
    for (int k = d + 1; k < a->ndim; k++) inner *= a->size[k];
    if (inner > 1) {
      reduce_columns(family_of[op], a->data, outer, len, inner, out->data);
      return ATTN_OK;
    }
  }
  /* Expanded dims other than d give the same line at every position: reduce
   * at position 0 only, then copy the results along them (the same bits, and
   * O(real elements) rather than O(numel) for a huge expanded view). */
  attn_tensor src = *a, dst = *out, dst_idx = indices ? *indices : *out;
  int spread[ATTN_MAX_DIMS], nspread = 0;
  for (int k = 0; k < a->ndim; k++)
    if (k != d && a->stride[k] == 0 && a->size[k] > 1) {
      spread[nspread++] = k;
      src.size[k] = dst.size[k] = dst_idx.size[k] = 1;
    }
  attn_tensor starts = line_starts(&src, d);
  line_ctx c = {(int)op, indices != NULL, a->stride[d] == 0 && len > 1, len, a->stride[d], 0};
  const attn_tensor *ops[3] = {&dst, &starts, indices ? &dst_idx : NULL};
  attn_foreach(indices ? 3 : 2, ops, reduce_row, &c);
  for (int i = 0; i < nspread; i++) { /* position 0 of dim k into positions 1.. */
    int k = spread[i];
    for (int which = 0; which < (indices ? 2 : 1); which++) {
      attn_tensor *t = which ? &dst_idx : &dst;
      attn_tensor from = *t, to = *t;
      t->size[k] = a->size[k];
      from.size[k] = to.size[k] = a->size[k] - 1;
      from.stride[k] = 0;
      to.data += to.stride[k];
      attn_status st = attn_unary(ATTN_COPY, &from, &to);
      if (st != ATTN_OK) return st;
    }
  }
  return ATTN_OK;
}

/* The serial walk of every element of a (n > 0) in row-major order. */
static void reduce_walk(attn_reduceop op, const attn_tensor *a, int64_t n, double *acc_out, float *best_out,
                        int64_t *at_out) {
  int64_t idx[ATTN_MAX_DIMS] = {0};
  double acc = 0.0;
  float best = 0.0f;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = *attn_at(a, idx);
    if (family_of[op] != FAMILY_EXTREME) {
      acc += (double)v;
    } else if (i == 0 || (best == best && (v != v || is_better(op, v, best)))) {
      best = v;
      at = i;
    }
    for (int d = a->ndim - 1; d >= 0; d--) {
      if (++idx[d] < a->size[d]) break;
      idx[d] = 0;
    }
  }
  *acc_out = acc;
  *best_out = best;
  *at_out = at;
}

/* From this many elements on, a full reduction of an expanded view walks its
 * distinct elements once: sum = (sum of them) x copies, which may differ from
 * the element-by-element sum in the last bits. Smaller tensors keep the walk. */
#define ATTN_REDUCE_SHORTCUT_MIN ((int64_t)1 << 24)

attn_status attn_reduce_all(attn_reduceop op, const attn_tensor *a, float *out, int64_t *index) {
  if ((unsigned)op >= ATTN_REDUCEOP_COUNT) return attn_fail(ATTN_EARG, "unknown reduction %d", (int)op);
  int64_t n = attn_numel(a);
  if (n == 0) {
    if (family_of[op] == FAMILY_EXTREME)
      return attn_fail(ATTN_EARG, "cannot take %s of an empty tensor", reduce_name(op));
    *out = family_of[op] == FAMILY_AVERAGE ? NAN : 0.0f;
    return ATTN_OK;
  }
  attn_tensor distinct = *a;
  if (n >= ATTN_REDUCE_SHORTCUT_MIN)
    for (int d = 0; d < a->ndim; d++)
      if (a->stride[d] == 0) distinct.size[d] = 1;
  int64_t m = attn_numel(&distinct);
  double acc;
  float best;
  int64_t at;
  reduce_walk(op, &distinct, m, &acc, &best, &at);
  /* the first extreme of the full walk is the first of the distinct walk, at
   * position 0 of every expanded dim: its flat index in a's shape */
  int64_t full_at = 0, rem = at, scale = 1;
  for (int d = a->ndim - 1; d >= 0; d--) {
    full_at += rem % distinct.size[d] * scale;
    rem /= distinct.size[d];
    scale *= a->size[d];
  }
  double copies = (double)n / (double)m;
  if (family_of[op] == FAMILY_TOTAL) *out = (float)(acc * copies);
  else if (family_of[op] == FAMILY_AVERAGE) *out = (float)(acc / (double)m);
  else *out = best;
  if (index) *index = full_at;
  return ATTN_OK;
}

/* a == b elementwise (same shapes), NaN unequal; dims expanded in both are
 * compared once, and the walk stops at the first difference. */
int attn_equal(const attn_tensor *a, const attn_tensor *b) {
  int64_t size[ATTN_MAX_DIMS], sa[ATTN_MAX_DIMS], sb[ATTN_MAX_DIMS], idx[ATTN_MAX_DIMS] = {0};
  int n = 0;
  if (attn_numel(a) == 0) return 1;
  for (int d = 0; d < a->ndim; d++)
    if (a->size[d] > 1 && (a->stride[d] != 0 || b->stride[d] != 0)) {
      size[n] = a->size[d];
      sa[n] = a->stride[d];
      sb[n++] = b->stride[d];
    }
  const float *pa = a->data, *pb = b->data;
  for (;;) {
    if (!(*pa == *pb)) return 0;
    int d = n - 1;
    for (; d >= 0; d--) {
      pa += sa[d];
      pb += sb[d];
      if (++idx[d] < size[d]) break;
      pa -= sa[d] * size[d];
      pb -= sb[d] * size[d];
      idx[d] = 0;
    }
    if (d < 0) return 1;
  }
}

/* The first NaN of a line of len values (stride si), else its maximum
 * (attn_row_max where the line is contiguous). */
static float line_max(const float *x, int64_t len, int64_t si) {
  if (si == 1) return attn_row_max(x, len);
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; j++) {
    float v = x[j * si];
    if (v > mx || v != v) mx = v;
    if (mx != mx) break;
  }
  return mx;
}

/* expf(x - max), glibc's bits, EXP_CHUNK values at a time (src/core/cpu.h:
 * libm_exp_minus) */
#define EXP_CHUNK 256

static void softmax_row(int64_t n, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  void (*exp_minus)(float *, int64_t, float) = attn_cpu_kernels()->libm_exp_minus;
  int64_t len = c->len, si = c->in_stride, so = c->out_stride;
  for (int64_t i = 0; i < n; i++) {
    const float *x = p[1] + i * s[1];
    float *o = p[0] + i * s[0];
    float mx = line_max(x, len, si);
    if (c->op) { /* log_softmax: x - max - log(sum(exp(x - max))) */
      double sum = 0.0;
      for (int64_t j0 = 0; j0 < len; j0 += EXP_CHUNK) { /* expf(x - max) a chunk at a time */
        int64_t cnt = len - j0 < EXP_CHUNK ? len - j0 : EXP_CHUNK;
        float e[EXP_CHUNK];
        for (int64_t j = 0; j < cnt; j++) e[j] = x[(j0 + j) * si];
        exp_minus(e, cnt, mx);
        for (int64_t j = 0; j < cnt; j++) sum += (double)e[j];
      }
      float lse = logf((float)sum);
      for (int64_t j = 0; j < len; j++) o[j * so] = x[j * si] - mx - lse;
    } else { /* exp(x - max) * (1 / sum), as PyTorch's CPU kernel */
      float sum = 0.0f;
      for (int64_t j0 = 0; j0 < len; j0 += EXP_CHUNK) {
        int64_t cnt = len - j0 < EXP_CHUNK ? len - j0 : EXP_CHUNK;
        float e[EXP_CHUNK];
        for (int64_t j = 0; j < cnt; j++) e[j] = x[(j0 + j) * si];
        exp_minus(e, cnt, mx);
        for (int64_t j = 0; j < cnt; j++) {
          o[(j0 + j) * so] = e[j];
          sum += e[j];
        }
      }
      float inv = 1.0f / sum;
      for (int64_t j = 0; j < len; j++) o[j * so] *= inv;
    }
  }
}

attn_status attn_softmax(const attn_tensor *a, int d, attn_tensor *out, int log) {
  if (!attn_same_shape(a, out)) return attn_fail(ATTN_ESHAPE, "output shape differs from input");
  if (a->ndim == 0) { /* softmax of a scalar is 1 (log: 0), unless NaN */
    float v = a->data[0];
    out->data[0] = v != v ? v : (log ? 0.0f : 1.0f);
    return ATTN_OK;
  }
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim out of range");
  if (a->size[d] == 0) return ATTN_OK;
  attn_tensor in_starts = line_starts(a, d), out_starts = line_starts(out, d);
  line_ctx c = {log, 0, 0, a->size[d], a->stride[d], out->stride[d]};
  const attn_tensor *ops[2] = {&out_starts, &in_starts};
  attn_foreach(2, ops, softmax_row, &c);
  return ATTN_OK;
}

attn_status attn_cat(const attn_tensor *const *parts, int n, int d, attn_tensor *out) {
  int64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const attn_tensor *p = parts[i];
    if (p->ndim != out->ndim) return attn_fail(ATTN_ESHAPE, "part %d has %d dims, expected %d", i + 1, p->ndim, out->ndim);
    for (int k = 0; k < out->ndim; k++)
      if (k != d && p->size[k] != out->size[k]) {
        char b1[200], b2[200];
        return attn_fail(ATTN_ESHAPE, "part %d has shape %s, which does not fit %s outside dim %d", i + 1,
                         attn_shape_str(p, b1, sizeof b1), attn_shape_str(out, b2, sizeof b2), d + 1);
      }
    offset += p->size[d];
  }
  if (offset != out->size[d]) return attn_fail(ATTN_ESHAPE, "parts do not add up to the output size");
  offset = 0;
  for (int i = 0; i < n; i++) {
    attn_tensor slot = *out;
    slot.data = out->data + offset * out->stride[d];
    slot.size[d] = parts[i]->size[d];
    offset += parts[i]->size[d];
    if (slot.size[d] == 0) continue;
    attn_status st = attn_unary(ATTN_COPY, parts[i], &slot);
    if (st != ATTN_OK) return st;
  }
  return ATTN_OK;
}
