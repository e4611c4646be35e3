/* Cross entropy with a fused log-softmax, forward and backward, with torch
 * 1.13's semantics (LossNLL.cpp: cross_entropy, nll_loss,
 * cross_entropy_loss_label_smoothing), class ids counted from 1.
 *
 * Forward, logits [N, C], target [N], ls = label_smoothing; per row i whose
 * target t_i is not ignore_index (sums in double, exponentials from
 * attn_exp_nonpos, vectorised: exp_nonpos.h):
 *   lse_i    = m_i + log(sum_c exp(x_ic - m_i)),  m_i = max_c x_ic
 *   nll_i    = lse_i - x_{i,t_i}                 (-log softmax at the target)
 *   smooth_i = sum_c (lse_i - x_ic) = C lse_i - sum_c x_ic
 *   loss_i   = (1 - ls) nll_i + (ls / C) smooth_i          (0 for ignored rows)
 *   "none": loss [N];  "sum": sum_i loss_i;  "mean": the sum / K, K = counted
 *   rows (torch divides both parts by K: all rows ignored gives 0/0 = NaN).
 * Backward: with w_i = grad_i ("none"), grad ("sum"), grad / K ("mean"):
 *   dlogits_ic = w_i (exp(x_ic - lse_i) - (1 - ls) [c == t_i] - ls / C),
 *   0 on ignored rows.
 * Contract: contiguous float32; every target is ignore_index or an integer
 * value in [1, C] (else ATTN_EARG naming the first bad position, 1-based).
 * Error against torch 1.13 (spec/train_kernels_spec.lua fixtures, max |error| over
 * max |value|): loss 1.1e-7, dlogits 5e-7 (torch sums in float, here in double;
 * the spec allows 2e-6).
 * Threads: rows are independent and a row's sums run in fixed lanes (the
 * same order whatever thread runs the row); the reductions over rows run
 * after the parallel loop, in row order, so bits do not depend on the
 * thread count. The vectorised loops have AVX2 clones with the same bits. */
#include <math.h>
#include <stdlib.h>

#include "exp_nonpos.h"
#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 32768
#define ROW_CHUNK 256

/* e[j] = exp(x[j] - shift) for n <= ROW_CHUNK values x <= shift (vectorised) */
ATTN_VECTOR_CLONES static void exp_shifted(const float *x, float shift, float *e, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) e[j] = attn_exp_nonpos(x[j] - shift);
}

/* The largest of a row of c values, NaN if any is NaN (-inf for c = 0).
 * max is exact, so the lanes' order does not change the result. */
ATTN_VECTOR_CLONES static float row_max(const float *x, int64_t c) {
  float m = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t j = 0; j < c; j++) {
    m = x[j] > m ? x[j] : m;
    nan |= x[j] != x[j];
  }
  return nan ? NAN : m;
}

/* sum_j exp(x_j - m) over a row of c values in double: element j into
 * lane j % 8 of a chunk, the lanes combined in a fixed tree (a fixed order
 * for any thread count); m = the row's max */
static double sum_exp(const float *x, int64_t c, float m) {
  float e[ROW_CHUNK];
  double acc[8] = {0};
  for (int64_t j0 = 0; j0 < c; j0 += ROW_CHUNK) {
    int64_t len = c - j0 < ROW_CHUNK ? c - j0 : ROW_CHUNK, j = 0;
    exp_shifted(x + j0, m, e, len);
    for (; j + 8 <= len; j += 8)
      for (int k = 0; k < 8; k++) acc[k] += (double)e[j + k];
    for (; j < len; j++) acc[0] += (double)e[j];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* dr[j] = w (exp(x_j - lse) - per_class) for a row of c values (vectorised) */
ATTN_VECTOR_CLONES static void softmax_grad_row(const float *x, float lse, float w, float per_class, float *dr,
                                                int64_t c) {
#pragma omp simd
  for (int64_t j = 0; j < c; j++) dr[j] = w * (attn_exp_nonpos(x[j] - lse) - per_class);
}

/* Every target is ignore_index or an integer in [1, c]. */
static attn_status check_targets(const attn_tensor *target, int64_t c, double ignore_index) {
  const int64_t n = attn_numel(target);
  for (int64_t i = 0; i < n; i++) {
    double t = (double)target->data[i];
    if (t == ignore_index) continue;
    if (t != floor(t))
      return attn_fail(ATTN_EARG, "target[%lld] = %.9g is not an integer class id", (long long)(i + 1), t);
    if (!(t >= 1.0 && t <= (double)c))
      return attn_fail(ATTN_EARG, "target[%lld] = %.9g is out of range (class ids are 1 to %lld)", (long long)(i + 1),
                       t, (long long)c);
  }
  return ATTN_OK;
}

static attn_status check_shapes(const attn_tensor *logits, const attn_tensor *target, const attn_tensor *lse) {
  if (logits->ndim != 2) return attn_fail(ATTN_ESHAPE, "'logits' must be 2-D [N, C]");
  const int64_t n = logits->size[0];
  if (target->ndim != 1 || target->size[0] != n)
    return attn_fail(ATTN_ESHAPE, "'target' must be of shape [%lld]", (long long)n);
  if (lse->ndim != 1 || lse->size[0] != n) return attn_fail(ATTN_ESHAPE, "'lse' must be of shape [%lld]", (long long)n);
  if (logits->size[1] < 1 && n > 0) return attn_fail(ATTN_ESHAPE, "'logits' must have at least one class");
  return ATTN_OK;
}

attn_status attn_cross_entropy_forward(const attn_tensor *logits, const attn_tensor *target, double ignore_index,
                                       attn_reduction reduction, double label_smoothing, attn_tensor *loss,
                                       attn_tensor *lse, int64_t *counted) {
  attn_status st = check_shapes(logits, target, lse);
  if (st) return st;
  const int64_t n = logits->size[0], c = logits->size[1];
  if (reduction == ATTN_REDUCTION_NONE ? (loss->ndim != 1 || loss->size[0] != n) : attn_numel(loss) != 1)
    return attn_fail(ATTN_ESHAPE, "'loss' must have %lld element(s)", (long long)(reduction == ATTN_REDUCTION_NONE ? n : 1));
  if ((st = check_targets(target, c, ignore_index))) return st;

  /* per row: nll_i and smooth_i in double (ignored rows: 0) */
  double *rows = n > 0 ? malloc((size_t)n * 2 * sizeof(double)) : NULL;
  if (n > 0 && !rows) return attn_fail(ATTN_ENOMEM, "no memory for %lld row losses", (long long)n);
  const float *xs = logits->data, *ts = target->data;
  float *lses = lse->data;
  const int smoothing = label_smoothing != 0.0;
  /* logits: (N, C), target: (N) -> lse: (N), rows: (N, 2) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n)) if (n * c > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = xs + i * c;
    float m = row_max(xr, c);
    double sx = 0.0;
    double l = (double)m + log(sum_exp(xr, c, m));
    if (smoothing)
      for (int64_t j = 0; j < c; j++) sx += (double)xr[j];
    lses[i] = (float)l;
    double t = (double)ts[i];
    if (t == ignore_index) {
      rows[2 * i] = 0.0, rows[2 * i + 1] = 0.0;
    } else {
      rows[2 * i] = l - (double)xr[(int64_t)t - 1];
      rows[2 * i + 1] = smoothing ? (double)c * l - sx : 0.0;
    }
  }

  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += (double)ts[i] != ignore_index;
  *counted = k;
  const double keep = 1.0 - label_smoothing, per_class = c > 0 ? label_smoothing / (double)c : 0.0;
  if (reduction == ATTN_REDUCTION_NONE) {
    for (int64_t i = 0; i < n; i++) {
      double v = keep * rows[2 * i];
      if (smoothing) v += per_class * rows[2 * i + 1];
      loss->data[i] = (float)v;
    }
  } else {
    double nll = 0.0, smooth = 0.0;
    for (int64_t i = 0; i < n; i++) nll += rows[2 * i], smooth += rows[2 * i + 1];
    if (reduction == ATTN_REDUCTION_MEAN) nll /= (double)k, smooth /= (double)k;
    double v = keep * nll;
    if (smoothing) v += per_class * smooth;
    loss->data[0] = (float)v;
  }
  free(rows);
  return ATTN_OK;
}

attn_status attn_cross_entropy_backward(const attn_tensor *grad, const attn_tensor *logits, const attn_tensor *target,
                                        const attn_tensor *lse, double ignore_index, attn_reduction reduction,
                                        double label_smoothing, attn_tensor *dlogits) {
  attn_status st = check_shapes(logits, target, lse);
  if (st) return st;
  const int64_t n = logits->size[0], c = logits->size[1];
  if (reduction == ATTN_REDUCTION_NONE ? (grad->ndim != 1 || grad->size[0] != n) : attn_numel(grad) != 1)
    return attn_fail(ATTN_ESHAPE, "'grad' must have %lld element(s)", (long long)(reduction == ATTN_REDUCTION_NONE ? n : 1));
  if (dlogits->ndim != 2 || dlogits->size[0] != n || dlogits->size[1] != c)
    return attn_fail(ATTN_ESHAPE, "'dlogits' must be of shape [%lld, %lld]", (long long)n, (long long)c);
  if ((st = check_targets(target, c, ignore_index))) return st;
  const float *xs = logits->data, *ts = target->data, *ls = lse->data, *gs = grad->data;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += (double)ts[i] != ignore_index;
  double scale = reduction == ATTN_REDUCTION_MEAN ? 1.0 / (double)k : 1.0;
  const double keep = 1.0 - label_smoothing, per_class = c > 0 ? label_smoothing / (double)c : 0.0;
  float *out = dlogits->data;
  /* grad: (N) or (1), logits: (N, C), target, lse: (N) -> dlogits: (N, C) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n)) if (n * c > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = xs + i * c;
    float *dr = out + i * c;
    double t = (double)ts[i];
    if (t == ignore_index) {
      for (int64_t j = 0; j < c; j++) dr[j] = 0.0f;
      continue;
    }
    double w = (double)(reduction == ATTN_REDUCTION_NONE ? gs[i] : gs[0]) * scale;
    int64_t ti = (int64_t)t - 1;
    softmax_grad_row(xr, ls[i], (float)w, (float)per_class, dr, c);
    dr[ti] = (float)(w * ((double)attn_exp_nonpos(xr[ti] - ls[i]) - per_class - keep));
  }
  return ATTN_OK;
}
