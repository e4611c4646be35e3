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
 * Threads: rows are independent for y and dx; dw and db are summed per fixed
 * block of ROWS_PER_BLOCK rows (whatever thread runs it), then the blocks in
 * order, so the bits do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>

#include "threads.h"
#include "train.h"

#define ROWS_PER_BLOCK 64
#define PARALLEL_ELEMS 32768

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
    float *yr = ys + i * d;
    double sum = 0.0, sq = 0.0;
    for (int64_t j = 0; j < d; j++) sum += (double)xr[j];
    double mu = d > 0 ? sum / (double)d : 0.0;
    for (int64_t j = 0; j < d; j++) sq += ((double)xr[j] - mu) * ((double)xr[j] - mu);
    double var = d > 0 ? sq / (double)d : 0.0;
    float mu_f = (float)mu, a = (float)(1.0 / sqrt(fmax(var, 0.0) + eps));
    float shift = -a * mu_f;
    for (int64_t j = 0; j < d; j++) {
      float v = xr[j] * a + shift;
      if (w) v *= w[j];
      if (b) v += b[j];
      yr[j] = v;
    }
    ms[i] = mu_f, rs[i] = a;
  }
  return ATTN_OK;
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

  if (dx) {
    float *dxs = dx->data;
    const double inv_d = d > 0 ? 1.0 / (double)d : 0.0;
    /* dy, x: (N, D), mean, rstd: (N) -> dx: (N, D) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n)) if (n * d > PARALLEL_ELEMS)
    for (int64_t i = 0; i < n; i++) {
      const float *gr = g + i * d, *xr = xs + i * d;
      double ds = 0.0, db = 0.0;
      for (int64_t j = 0; j < d; j++) {
        double gw = (double)gr[j] * (w ? (double)w[j] : 1.0);
        ds += gw * (double)xr[j];
        db += gw;
      }
      const double a = (double)rs[i], mu = (double)ms[i];
      const double bb = (db * mu - ds) * a * a * a * inv_d;
      const double cc = -bb * mu - db * a * inv_d;
      float *dr = dxs + i * d;
      for (int64_t j = 0; j < d; j++)
        dr[j] = (float)(a * (double)gr[j] * (w ? (double)w[j] : 1.0) + bb * (double)xr[j] + cc);
    }
  }

  if (!dweight && !dbias) return ATTN_OK;
  /* dy, x: (N, D) -> dweight, dbias: (D), through per-block partial sums (nblocks, D) */
  const int64_t nblocks = (n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  double *part = NULL;
  if (nblocks > 0 && d > 0) {
    part = malloc((size_t)nblocks * (size_t)d * 2 * sizeof(double));
    if (!part) return attn_fail(ATTN_ENOMEM, "no memory for %lld x %lld partial sums", (long long)nblocks, (long long)d);
  }
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(nblocks)) if (n * d > PARALLEL_ELEMS)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    double *pw = part + blk * 2 * d, *pb = pw + d;
    for (int64_t j = 0; j < d; j++) pw[j] = 0.0, pb[j] = 0.0;
    int64_t end = (blk + 1) * ROWS_PER_BLOCK < n ? (blk + 1) * ROWS_PER_BLOCK : n;
    for (int64_t i = blk * ROWS_PER_BLOCK; i < end; i++) {
      const float *gr = g + i * d, *xr = xs + i * d;
      const double a = (double)rs[i], mu = (double)ms[i];
      for (int64_t j = 0; j < d; j++) {
        pw[j] += (double)gr[j] * ((double)xr[j] - mu) * a;
        pb[j] += (double)gr[j];
      }
    }
  }
  for (int64_t j = 0; j < d; j++) {
    double sw = 0.0, sb = 0.0;
    for (int64_t blk = 0; blk < nblocks; blk++) sw += part[blk * 2 * d + j], sb += part[blk * 2 * d + d + j];
    if (dweight) dweight->data[j] = (float)sw;
    if (dbias) dbias->data[j] = (float)sb;
  }
  free(part);
  return ATTN_OK;
}
