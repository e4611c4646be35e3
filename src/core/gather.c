/* Index ops along a dim: index_select, gather, scatter_add_, and where.
 *
 * Shapes (d = 1 shown; any dim works alike):
 *   index_select: a (n, C), index (m)            -> out (m, C),  out[i][j] = a[index[i]][j]
 *   gather:       a (n, C), index (m, C' <= C)   -> out (m, C'), out[i][j] = a[index[i][j]][j]
 *   scatter_add_: self (n, C), index (m, C' <= C), src (>= m, >= C'):
 *                 self[index[i][j]][j] += src[i][j], i ascending
 *   where:        cond, a, b broadcast          -> out,  out = cond != 0 ? a : b
 *
 * Contract: every index is checked (an integer in [base, base + n - 1]) in
 * one serial pass before anything is written, so a bad index leaves the
 * output untouched and the message names the first bad one in row-major
 * order. The kernels copy values (no arithmetic) except scatter_add_, which
 * adds in float in index order along d, as PyTorch's CPU kernel does.
 *
 * Threads: the walk over line starts (every position but d) is split across
 * threads; each line is handled by one thread, and two lines of scatter_add_
 * write two different lines of self, so bits do not depend on the count. */
#include "gather.h"

#include <math.h>
#include <stdio.h>

#include "iter.h"
#include "ops.h"

/* "[2, 1]" for the multi-index idx (0-based) shown from base */
static const char *position_str(int ndim, const int64_t *idx, int64_t base, char *buf, size_t len) {
  int64_t shown[ATTN_MAX_DIMS];
  for (int k = 0; k < ndim; k++) shown[k] = idx[k] + base;
  return attn_sizes_str(ndim, shown, buf, len);
}

attn_status attn_check_indices(const attn_tensor *index, int64_t n, int d, int64_t base) {
  if (attn_numel(index) == 0) return ATTN_OK;
  int64_t idx[ATTN_MAX_DIMS] = {0};
  const float hi = (float)(base + n - 1);
  for (;;) {
    float v = *attn_at(index, idx);
    if (!(v >= (float)base && v <= hi && v == floorf(v))) {
      char pos[200];
      position_str(index->ndim, idx, base, pos, sizeof pos);
      if (n == 0)
        return attn_fail(ATTN_EARG, "index %.9g at %s is out of range: dim %d has size 0", (double)v, pos, d + 1);
      return attn_fail(ATTN_EARG, "index %.9g at %s is %s: expected an integer in [%lld, %lld] (dim %d has size %lld)",
                       (double)v, pos, v == floorf(v) ? "out of range" : "not an integer", (long long)base,
                       (long long)(base + n - 1), d + 1, (long long)n);
    }
    int k = index->ndim - 1;
    for (; k >= 0; k--) {
      if (++idx[k] < index->size[k]) break;
      idx[k] = 0;
    }
    if (k < 0) return ATTN_OK;
  }
}

static attn_status check_dim(const attn_tensor *a, int d) {
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim %d out of range for %d dims", d + 1, a->ndim);
  if (a->size[d] > (int64_t)1 << 24)
    return attn_fail(ATTN_EARG, "dim %d has %lld elements: float32 indices are exact only up to 2^24", d + 1,
                     (long long)a->size[d]);
  return ATTN_OK;
}

attn_status attn_index_select(const attn_tensor *a, int d, const attn_tensor *index, int64_t base, attn_tensor *out) {
  attn_status st = check_dim(a, d);
  if (st != ATTN_OK) return st;
  if (index->ndim > 1) return attn_fail(ATTN_ESHAPE, "index must be 1-D, got %d dims", index->ndim);
  int64_t m = index->ndim ? index->size[0] : 1;
  if (out->ndim != a->ndim) return attn_fail(ATTN_ESHAPE, "output rank differs from the input's");
  for (int k = 0; k < a->ndim; k++)
    if (out->size[k] != (k == d ? m : a->size[k])) return attn_fail(ATTN_ESHAPE, "output shape does not fit");
  if ((st = attn_check_indices(index, a->size[d], d, base)) != ATTN_OK) return st;
  int64_t istride = index->ndim ? index->stride[0] : 0;
  for (int64_t i = 0; i < m; i++) { /* one slice copy per index: parallel inside when large */
    attn_tensor from, to;
    int64_t at = (int64_t)index->data[i * istride] - base;
    if ((st = attn_view_select(a, d, at, &from)) != ATTN_OK) return st;
    if ((st = attn_view_select(out, d, i, &to)) != ATTN_OK) return st;
    if ((st = attn_unary(ATTN_COPY, &from, &to)) != ATTN_OK) return st;
  }
  return ATTN_OK;
}

typedef struct line_ctx {
  int64_t len;         /* index entries per line */
  int64_t base;
  int64_t stride[3];   /* along d: operands 0, 1 (the index), 2 */
} line_ctx;

/* operands: out, index, a (line starts) */
static void gather_lines(int64_t count, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  for (int64_t line = 0; line < count; line++) {
    float *o = p[0] + line * s[0];
    const float *ix = p[1] + line * s[1], *x = p[2] + line * s[2];
    for (int64_t j = 0; j < c->len; j++)
      o[j * c->stride[0]] = x[((int64_t)ix[j * c->stride[1]] - c->base) * c->stride[2]];
  }
}

/* operands: self, index, src (line starts) */
static void scatter_add_lines(int64_t count, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  for (int64_t line = 0; line < count; line++) {
    float *o = p[0] + line * s[0];
    const float *ix = p[1] + line * s[1], *x = p[2] + line * s[2];
    for (int64_t j = 0; j < c->len; j++)
      o[((int64_t)ix[j * c->stride[1]] - c->base) * c->stride[0]] += x[j * c->stride[2]];
  }
}

/* t restricted to the first shape[k] positions of every dim k, with dim d of size 1 (a line start view) */
static attn_tensor line_starts_within(const attn_tensor *t, const attn_tensor *shape, int d) {
  attn_tensor r = *t;
  for (int k = 0; k < t->ndim; k++) r.size[k] = k == d ? 1 : shape->size[k];
  return r;
}

/* index's dims and sizes against t: the same rank, no larger anywhere (but at d when skip_d) */
static attn_status check_within(const attn_tensor *index, const attn_tensor *t, int d, int skip_d, const char *what) {
  char b1[200], b2[200];
  if (index->ndim != t->ndim)
    return attn_fail(ATTN_ESHAPE, "index %s must have as many dims as %s %s (%d), got %d",
                     attn_shape_str(index, b1, sizeof b1), what, attn_shape_str(t, b2, sizeof b2), t->ndim, index->ndim);
  for (int k = 0; k < t->ndim; k++)
    if ((k != d || !skip_d) && index->size[k] > t->size[k])
      return attn_fail(ATTN_ESHAPE, "index %s is larger than %s %s at dim %d (%lld > %lld)",
                       attn_shape_str(index, b1, sizeof b1), what, attn_shape_str(t, b2, sizeof b2), k + 1,
                       (long long)index->size[k], (long long)t->size[k]);
  return ATTN_OK;
}

attn_status attn_gather(const attn_tensor *a, int d, const attn_tensor *index, int64_t base, attn_tensor *out) {
  attn_status st = check_dim(a, d);
  if (st != ATTN_OK) return st;
  if ((st = check_within(index, a, d, 1, "self")) != ATTN_OK) return st;
  if (!attn_same_shape(out, index)) return attn_fail(ATTN_ESHAPE, "output shape differs from the index's");
  if ((st = attn_check_indices(index, a->size[d], d, base)) != ATTN_OK) return st;
  if (attn_numel(index) == 0) return ATTN_OK;
  attn_tensor os = line_starts_within(out, index, d), is = line_starts_within(index, index, d),
              as = line_starts_within(a, index, d);
  line_ctx c = {index->size[d], base, {out->stride[d], index->stride[d], a->stride[d]}};
  const attn_tensor *ops[3] = {&os, &is, &as};
  attn_foreach(3, ops, gather_lines, &c);
  return ATTN_OK;
}

/* lowest and highest address of a non-empty t */
static void address_range(const attn_tensor *t, const float **lo, const float **hi) {
  int64_t min_off = 0, max_off = 0;
  for (int k = 0; k < t->ndim; k++) {
    int64_t reach = t->stride[k] * (t->size[k] - 1);
    if (reach < 0) min_off += reach;
    else max_off += reach;
  }
  *lo = t->data + min_off;
  *hi = t->data + max_off;
}

/* conservative: whether the address ranges of a and b meet */
static int ranges_meet(const attn_tensor *a, const attn_tensor *b) {
  if (attn_numel(a) == 0 || attn_numel(b) == 0) return 0;
  const float *alo, *ahi, *blo, *bhi;
  address_range(a, &alo, &ahi);
  address_range(b, &blo, &bhi);
  return !(ahi < blo || bhi < alo);
}

attn_status attn_scatter_add(attn_tensor *self, int d, const attn_tensor *index, int64_t base, const attn_tensor *src) {
  attn_status st = check_dim(self, d);
  if (st != ATTN_OK) return st;
  if ((st = check_within(index, self, d, 1, "self")) != ATTN_OK) return st;
  if ((st = check_within(index, src, d, 0, "src")) != ATTN_OK) return st;
  if (attn_has_internal_overlap(self))
    return attn_fail(ATTN_EARG, "unsupported operation: more than one element of the written-to tensor refers to a "
                     "single memory location. Please clone() the tensor before performing the operation.");
  if (ranges_meet(self, src) || ranges_meet(self, index))
    return attn_fail(ATTN_EARG, "unsupported operation: some elements of the input tensor and the written-to tensor "
                     "refer to a single memory location (%s overlaps self). Please clone() it before performing "
                     "the operation.", ranges_meet(self, src) ? "src" : "index");
  if ((st = attn_check_indices(index, self->size[d], d, base)) != ATTN_OK) return st;
  if (attn_numel(index) == 0) return ATTN_OK;
  attn_tensor ss = line_starts_within(self, index, d), is = line_starts_within(index, index, d),
              xs = line_starts_within(src, index, d);
  line_ctx c = {index->size[d], base, {self->stride[d], index->stride[d], src->stride[d]}};
  const attn_tensor *ops[3] = {&ss, &is, &xs};
  attn_foreach(3, ops, scatter_add_lines, &c);
  return ATTN_OK;
}

/* operands: out, cond, a: out = a where cond != 0 (out already holds b) */
static void where_row(int64_t n, float *const *p, const int64_t *s, const void *ctx) {
  (void)ctx;
  float *o = p[0];
  const float *c = p[1], *a = p[2];
  for (int64_t i = 0; i < n; i++)
    if (c[i * s[1]] != 0.0f) o[i * s[0]] = a[i * s[2]];
}

attn_status attn_where(const attn_tensor *cond, const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  attn_tensor ce, ae, be;
  attn_status st;
  if ((st = attn_expand(cond, out->ndim, out->size, &ce)) != ATTN_OK) return st;
  if ((st = attn_expand(a, out->ndim, out->size, &ae)) != ATTN_OK) return st;
  if ((st = attn_expand(b, out->ndim, out->size, &be)) != ATTN_OK) return st;
  if ((st = attn_unary(ATTN_COPY, &be, out)) != ATTN_OK) return st;
  const attn_tensor *ops[3] = {out, &ce, &ae};
  attn_foreach(3, ops, where_row, NULL);
  return ATTN_OK;
}
