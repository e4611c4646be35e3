/* Variance, standard deviation and cumulative sum along a dim.
 *
 * Shapes: var/std a (.., n, ..) -> out (.., 1, ..) (or a float for every
 * element); cumsum a (.., n, ..) -> out (.., n, ..).
 *
 * var: two passes over each line in double: mean = sum(x) / n, then
 * m2 = sum((x - mean)^2); var = m2 / max(n - correction, 0) (0/0 = NaN for
 * n <= correction, as PyTorch), std = sqrt(var), rounded once to float.
 * PyTorch 1.13 accumulates in double too (Welford along a dim, two passes
 * over every element), so results agree to the last float bit but for
 * rounding ties (spec/indexing_stats_ops_spec.lua checks within 1 ulp).
 * cumsum: a double running sum, each prefix rounded to float: PyTorch's CPU
 * cumsum for float does the same (acc_type double), so bits agree.
 *
 * Expanded (stride-0) dims are summed once and weighted by their size, so a
 * huge expanded view takes the time of its real elements.
 *
 * Threads: each line is summed by one thread in index order; lines are split
 * across threads by the shared walk; the full var is one serial pass. Bits do
 * not depend on the thread count. */
#include "moments.h"

#include <math.h>

#include "iter.h"

typedef struct line_ctx {
  int64_t len, in_stride, out_stride;
  int64_t correction;
  int take_sqrt;
} line_ctx;

static double line_var(const float *x, int64_t len, int64_t stride, int64_t correction) {
  double divisor = len > correction ? (double)(len - correction) : 0.0;
  if (stride == 0 && len > 0) { /* an expanded line, in O(1): len copies of one value */
    double dev = (double)x[0] - (double)x[0]; /* 0, or NaN for inf and NaN */
    return dev * dev * (double)len / divisor;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < len; j++) sum += (double)x[j * stride];
  double mean = sum / (double)len, m2 = 0.0;
  for (int64_t j = 0; j < len; j++) {
    double dev = (double)x[j * stride] - mean;
    m2 += dev * dev;
  }
  return m2 / divisor;
}

/* operands: out, a (line starts) */
static void var_lines(int64_t count, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  for (int64_t line = 0; line < count; line++) {
    double v = line_var(p[1] + line * s[1], c->len, c->in_stride, c->correction);
    p[0][line * s[0]] = (float)(c->take_sqrt ? sqrt(v) : v);
  }
}

attn_status attn_var_dim(const attn_tensor *a, int d, int64_t correction, int take_sqrt, attn_tensor *out) {
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim %d out of range for %d dims", d + 1, a->ndim);
  if (correction < 0) return attn_fail(ATTN_EARG, "correction %lld is negative", (long long)correction);
  if (out->ndim != a->ndim) return attn_fail(ATTN_ESHAPE, "output rank differs from the input's");
  for (int k = 0; k < a->ndim; k++)
    if (out->size[k] != (k == d ? 1 : a->size[k])) return attn_fail(ATTN_ESHAPE, "output shape does not fit");
  attn_tensor starts = *a;
  starts.size[d] = 1;
  line_ctx c = {a->size[d], a->stride[d], 0, correction, take_sqrt};
  const attn_tensor *ops[2] = {out, &starts};
  attn_foreach(2, ops, var_lines, &c);
  return ATTN_OK;
}

/* the row-major walk of a's elements: sum of f(x) in double */
static double sum_all(const attn_tensor *a, double mean, int squared_deviation) {
  int64_t idx[ATTN_MAX_DIMS] = {0};
  double acc = 0.0;
  if (attn_numel(a) == 0) return 0.0;
  int inner = a->ndim - 1;
  int64_t n_inner = a->ndim ? a->size[inner] : 1, st = a->ndim ? a->stride[inner] : 0;
  for (;;) {
    const float *x = attn_at(a, idx);
    for (int64_t j = 0; j < n_inner; j++) {
      double v = (double)x[j * st];
      if (squared_deviation) {
        v -= mean;
        v *= v;
      }
      acc += v;
    }
    int k = inner - 1;
    for (; k >= 0; k--) {
      if (++idx[k] < a->size[k]) break;
      idx[k] = 0;
    }
    if (k < 0) return acc;
  }
}

attn_status attn_var_all(const attn_tensor *a, int64_t correction, int take_sqrt, float *out) {
  if (correction < 0) return attn_fail(ATTN_EARG, "correction %lld is negative", (long long)correction);
  int64_t n = attn_numel(a);
  /* expanded dims repeat the same elements: walk them once, weighted by the repeat count */
  attn_tensor distinct = *a;
  double repeats = 1.0;
  for (int k = 0; k < a->ndim; k++)
    if (a->stride[k] == 0 && a->size[k] > 1) {
      repeats *= (double)a->size[k];
      distinct.size[k] = 1;
    }
  double mean = sum_all(&distinct, 0.0, 0) * repeats / (double)n;
  double m2 = sum_all(&distinct, mean, 1) * repeats;
  double v = m2 / (n > correction ? (double)(n - correction) : 0.0);
  *out = (float)(take_sqrt ? sqrt(v) : v);
  return ATTN_OK;
}

/* operands: out, a (line starts) */
static void cumsum_lines(int64_t count, float *const *p, const int64_t *s, const void *vctx) {
  const line_ctx *c = vctx;
  for (int64_t line = 0; line < count; line++) {
    float *o = p[0] + line * s[0];
    const float *x = p[1] + line * s[1];
    double acc = 0.0;
    for (int64_t j = 0; j < c->len; j++) {
      acc += (double)x[j * c->in_stride];
      o[j * c->out_stride] = (float)acc;
    }
  }
}

attn_status attn_cumsum(const attn_tensor *a, int d, attn_tensor *out) {
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim %d out of range for %d dims", d + 1, a->ndim);
  if (!attn_same_shape(a, out)) return attn_fail(ATTN_ESHAPE, "output shape differs from the input's");
  if (attn_numel(a) == 0) return ATTN_OK;
  attn_tensor as = *a, os = *out;
  as.size[d] = os.size[d] = 1;
  line_ctx c = {a->size[d], a->stride[d], out->stride[d], 0, 0};
  const attn_tensor *ops[2] = {&os, &as};
  attn_foreach(2, ops, cumsum_lines, &c);
  return ATTN_OK;
}
