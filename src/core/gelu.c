/* GELU, forward and backward, elementwise over x [*] (torch 1.13's
 * GeluKernelImpl / GeluBackwardKernelImpl formulas, in float as torch's
 * float path computes them, with glibc's erff / tanhf / expf):
 *   "none": y = x * 0.5 * (1 + erf(x / sqrt(2)))
 *           dx = dy * (cdf + x * pdf), cdf = 0.5 (1 + erf(x / sqrt(2))),
 *                pdf = exp(-x^2 / 2) / sqrt(2 pi)
 *   "tanh": y = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi)
 *           dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2)),
 *                t = tanh(k (x + 0.044715 x^3))
 * Contract: contiguous float32, one element count for every operand.
 * Error against torch 1.13 (spec/train_kernels_spec.lua fixtures, max |error| over
 * max |value|, x in [-8, 8]): y 6e-8 ("none"), 7e-9 ("tanh"), dx 9.4e-8 (torch's
 * vectorised erf/tanh differ from glibc's in the last bits; the spec allows 2e-6).
 * Threads: each element is independent, so bits do not depend on the count. */
#include <math.h>

#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 16384

static const float SQRT1_2 = 0.70710678118654752440f;       /* 1 / sqrt(2) */
static const float PDF_SCALE = 0.39894228040143267794f;     /* 1 / sqrt(2 pi) */
static const float TANH_BETA = 0.79788456080286535588f;     /* sqrt(2 / pi) */
static const float TANH_KAPPA = 0.044715f;

static attn_status check_counts(const attn_tensor *a, const attn_tensor *b, const char *what) {
  if (attn_numel(a) != attn_numel(b))
    return attn_fail(ATTN_ESHAPE, "'%s' has %lld elements, expected %lld", what, (long long)attn_numel(b),
                     (long long)attn_numel(a));
  return ATTN_OK;
}

attn_status attn_gelu_forward(const attn_tensor *x, attn_tensor *y, attn_gelu_approximate approximate) {
  attn_status st = check_counts(x, y, "y");
  if (st) return st;
  const int64_t n = attn_numel(x);
  const float *xs = x->data;
  float *ys = y->data;
  /* x: (*) -> y: (*) */
  if (approximate == ATTN_GELU_TANH) {
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
    for (int64_t i = 0; i < n; i++) {
      float v = xs[i];
      float inner = TANH_BETA * (v + TANH_KAPPA * v * v * v);
      ys[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
  } else {
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
    for (int64_t i = 0; i < n; i++) {
      float v = xs[i];
      ys[i] = v * 0.5f * (1.0f + erff(v * SQRT1_2));
    }
  }
  return ATTN_OK;
}

attn_status attn_gelu_backward(const attn_tensor *dy, const attn_tensor *x, attn_tensor *dx,
                               attn_gelu_approximate approximate) {
  attn_status st;
  if ((st = check_counts(x, dy, "grad")) || (st = check_counts(x, dx, "dx"))) return st;
  const int64_t n = attn_numel(x);
  const float *g = dy->data, *xs = x->data;
  float *out = dx->data;
  /* dy, x: (*) -> dx: (*) */
  if (approximate == ATTN_GELU_TANH) {
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
    for (int64_t i = 0; i < n; i++) {
      float v = xs[i];
      float v2 = v * v;
      float inner = TANH_BETA * (v + TANH_KAPPA * v2 * v);
      float t = tanhf(inner);
      float left = 0.5f * v, right = 1.0f + t;
      float left_derivative = 0.5f * right;
      float right_derivative = left * (1.0f - t * t) * (TANH_BETA * (1.0f + 3.0f * TANH_KAPPA * v2));
      out[i] = g[i] * (left_derivative + right_derivative);
    }
  } else {
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
    for (int64_t i = 0; i < n; i++) {
      float v = xs[i];
      float cdf = 0.5f * (1.0f + erff(v * SQRT1_2));
      float pdf = PDF_SCALE * expf(-0.5f * v * v);
      out[i] = g[i] * (cdf + v * pdf);
    }
  }
  return ATTN_OK;
}
