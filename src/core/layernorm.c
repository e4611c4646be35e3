/* LayerNorm over the last dim, forward and backward (torch 1.13's
 * layer_norm_kernel.cpp formulas, moments in double).
 *
 * Forward, per row i of x [N, D]:
 *   mean_i = sum_j x_ij / D,  var_i = sum_j (x_ij - mean_i)^2 / D   (double, biased)
 *   rstd_i = float(1 / sqrt(max(var_i, 0) + eps))
 *   y_ij   = (x_ij * rstd_i + (-rstd_i * mean_i)) * w_j + b_j          (float, as torch)
 * Backward, per row (a = rstd_i, sums over j in double):
 *   ds = sum dy w x,  db = sum dy w
 *   b' = (db mean - ds) a^3 / D,  c' = -b' mean - db a / D
 *   dx_ij = a dy_ij w_j + b' x_ij + c'
 *   dw_j = sum_i dy_ij (x_ij - mean_i) a_i,  dbias_j = sum_i dy_ij
 * Contract: contiguous float32 operands of the shapes of train.h.
 * Error against torch 1.13 (spec/train_kernels_spec.lua fixtures, max |error| over
 * max |value| of each tensor): y 1.2e-7, dx 1.8e-7, dw 1.2e-7, db 2.3e-7 (torch
 * accumulates the moments in float, here in double; the spec allows 2e-6 / 1e-5).
 * Threads: rows are independent for y and dx, and a row's sums run in a
 * fixed order (LANES interleaved accumulators); dw and db are summed per
 * fixed block of ROWS_PER_BLOCK rows (whatever thread runs it), then the
 * blocks in order, so the bits do not depend on the thread count. The row
 * loops vectorise (AVX2 clones, exp_nonpos.h's ATTN_VECTOR_CLONES: the same
 * bits as the default ones). */
#include <math.h>
#include <stdlib.h>

#include "exp_nonpos.h"
#include "threads.h"
#include "train.h"

#define ROWS_PER_BLOCK 64
#define PARALLEL_ELEMS 32768
#define LANES 8

static attn_status check_vector(const attn_tensor *t, int64_t n, const char *what) {
  if (t && (t->ndim != 1 || t->size[0] != n))
    return attn_fail(ATTN_ESHAPE, "'%s' must be of shape [%lld]", what, (long long)n);
  return ATTN_OK;
}

static attn_status check_rows(const attn_tensor *t, int64_t n, int64_t d, const char *what) {
  if (t->ndim != 2 || t->size[0] != n || t->size[1] != d)
    return attn_fail(ATTN_ESHAPE, "'%s' must be of shape [%lld, %lld]", what, (long long)n, (long long)d);
  return ATTN_OK;
}

/* The sums of a row run in LANES interleaved double accumulators (element j
 * into lane j % LANES, the tail into lane 0), combined in a fixed tree: a
 * fixed order, so the same bits for any thread count, without one long
 * chain of dependent adds. */
ATTN_VECTOR_MATH static inline double combine(const double *acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum_j x_j and sum_j (x_j - mu)^2 of x: (d) */
ATTN_VECTOR_CLONES static double row_sum(const float *x, int64_t d) {
  double acc[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= d; j += LANES)
    for (int k = 0; k < LANES; k++) acc[k] += (double)x[j + k];
  for (; j < d; j++) acc[0] += (double)x[j];
  return combine(acc);
}

ATTN_VECTOR_CLONES static double row_sq_dev(const float *x, int64_t d, double mu) {
  double acc[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= d; j += LANES)
    for (int k = 0; k < LANES; k++) acc[k] += ((double)x[j + k] - mu) * ((double)x[j + k] - mu);
  for (; j < d; j++) acc[0] += ((double)x[j] - mu) * ((double)x[j] - mu);
  return combine(acc);
}

/* y = (x * a + shift) * w + b over a row x, y: (d); w, b: (d) or NULL */
ATTN_VECTOR_CLONES static void row_normalise(const float *x, float a, float shift, const float *w, const float *b, float *y,
                                             int64_t d) {
  if (w && b) {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) y[j] = (x[j] * a + shift) * w[j] + b[j];
  } else if (w) {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) y[j] = (x[j] * a + shift) * w[j];
  } else if (b) {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) y[j] = (x[j] * a + shift) + b[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) y[j] = x[j] * a + shift;
  }
}

attn_status attn_layer_norm_forward(const attn_tensor *x, const attn_tensor *weight, const attn_tensor *bias,
                                    double eps, attn_tensor *y, attn_tensor *mean, attn_tensor *rstd) {
  if (x->ndim != 2) return attn_fail(ATTN_ESHAPE, "'x' must be 2-D [N, D]");
  const int64_t n = x->size[0], d = x->size[1];
  attn_status st;
  if ((st = check_vector(weight, d, "weight")) || (st = check_vector(bias, d, "bias")) ||
      (st = check_rows(y, n, d, "y")) || (st = check_vector(mean, n, "mean")) || (st = check_vector(rstd, n, "rstd")))
    return st;
  const float *xs = x->data, *w = weight ? weight->data : NULL, *b = bias ? bias->data : NULL;
  float *ys = y->data, *ms = mean->data, *rs = rstd->data;
  /* x: (N, D) -> y: (N, D), mean, rstd: (N) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n)) if (n * d > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = xs + i * d;
    double mu = d > 0 ? row_sum(xr, d) / (double)d : 0.0;
    double var = d > 0 ? row_sq_dev(xr, d, mu) / (double)d : 0.0;
    float mu_f = (float)mu, a = (float)(1.0 / sqrt(fmax(var, 0.0) + eps));
    row_normalise(xr, a, -a * mu_f, w, b, ys + i * d, d);
    ms[i] = mu_f, rs[i] = a;
  }
  return ATTN_OK;
}

/* ds = sum_j dy_j w_j x_j and db = sum_j dy_j w_j of a row (w NULL: 1) */
ATTN_VECTOR_CLONES static void row_grad_sums(const float *g, const float *x, const float *w, int64_t d, double *ds,
                                             double *db) {
  double as[LANES] = {0}, ab[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= d; j += LANES)
    for (int k = 0; k < LANES; k++) {
      double gw = (double)g[j + k] * (w ? (double)w[j + k] : 1.0);
      as[k] += gw * (double)x[j + k];
      ab[k] += gw;
    }
  for (; j < d; j++) {
    double gw = (double)g[j] * (w ? (double)w[j] : 1.0);
    as[0] += gw * (double)x[j];
    ab[0] += gw;
  }
  *ds = combine(as), *db = combine(ab);
}

/* dx_j = a dy_j w_j + bb x_j + cc over a row */
ATTN_VECTOR_CLONES static void row_dx(const float *g, const float *x, const float *w, double a, double bb, double cc,
                                      float *dx, int64_t d) {
  if (w) {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) dx[j] = (float)(a * (double)g[j] * (double)w[j] + bb * (double)x[j] + cc);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < d; j++) dx[j] = (float)(a * (double)g[j] + bb * (double)x[j] + cc);
  }
}

/* pw_j += dy_j (x_j - mu) a, pb_j += dy_j over a row */
ATTN_VECTOR_CLONES static void row_param_grads(const float *g, const float *x, double mu, double a, double *pw,
                                               double *pb, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; j++) {
    pw[j] += (double)g[j] * ((double)x[j] - mu) * a;
    pb[j] += (double)g[j];
  }
}

attn_status attn_layer_norm_backward(const attn_tensor *dy, const attn_tensor *x, const attn_tensor *mean,
                                     const attn_tensor *rstd, const attn_tensor *weight, attn_tensor *dx,
                                     attn_tensor *dweight, attn_tensor *dbias) {
  if (x->ndim != 2) return attn_fail(ATTN_ESHAPE, "'x' must be 2-D [N, D]");
  const int64_t n = x->size[0], d = x->size[1];
  attn_status st;
  if ((st = check_rows(dy, n, d, "grad")) || (st = check_vector(mean, n, "mean")) ||
      (st = check_vector(rstd, n, "rstd")) || (st = check_vector(weight, d, "weight")) ||
      (dx && (st = check_rows(dx, n, d, "dx"))) || (st = check_vector(dweight, d, "dweight")) ||
      (st = check_vector(dbias, d, "dbias")))
    return st;
  const float *g = dy->data, *xs = x->data, *ms = mean->data, *rs = rstd->data;
  const float *w = weight ? weight->data : NULL;

  /* dy, x: (N, D), mean, rstd: (N) -> dx: (N, D), and dweight, dbias: (D)
   * through per-block partial sums (nblocks, D): one pass over each block of
   * ROWS_PER_BLOCK rows (its dy and x rows still in L1 for the partial sums
   * after dx), the blocks spread over the threads */
  const int64_t nblocks = (n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  const int want_params = dweight || dbias;
  double *part = NULL;
  if (want_params && nblocks > 0 && d > 0) {
    part = malloc((size_t)nblocks * (size_t)d * 2 * sizeof(double));
    if (!part) return attn_fail(ATTN_ENOMEM, "no memory for %lld x %lld partial sums", (long long)nblocks, (long long)d);
  }
  float *dxs = dx ? dx->data : NULL;
  const double inv_d = d > 0 ? 1.0 / (double)d : 0.0;
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(nblocks)) if (n * d > PARALLEL_ELEMS)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t end = (blk + 1) * ROWS_PER_BLOCK < n ? (blk + 1) * ROWS_PER_BLOCK : n;
    double *pw = part ? part + blk * 2 * d : NULL, *pb = pw ? pw + d : NULL;
    if (pw)
      for (int64_t j = 0; j < d; j++) pw[j] = 0.0, pb[j] = 0.0;
    for (int64_t i = blk * ROWS_PER_BLOCK; i < end; i++) {
      const float *gr = g + i * d, *xr = xs + i * d;
      if (dxs) {
        double ds, db;
        row_grad_sums(gr, xr, w, d, &ds, &db);
        const double a = (double)rs[i], mu = (double)ms[i];
        const double bb = (db * mu - ds) * a * a * a * inv_d;
        const double cc = -bb * mu - db * a * inv_d;
        row_dx(gr, xr, w, a, bb, cc, dxs + i * d, d);
      }
      if (pw) row_param_grads(gr, xr, (double)ms[i], (double)rs[i], pw, pb, d);
    }
  }
  if (!want_params) return ATTN_OK;
  for (int64_t j = 0; j < d; j++) {
    double sw = 0.0, sb = 0.0;
    for (int64_t blk = 0; blk < nblocks; blk++) sw += part[blk * 2 * d + j], sb += part[blk * 2 * d + d + j];
    if (dweight) dweight->data[j] = (float)sw;
    if (dbias) dbias->data[j] = (float)sb;
  }
  free(part);
  return ATTN_OK;
}
