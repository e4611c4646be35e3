/* GELU, forward and backward, elementwise over x [*] (torch 1.13's
 * GeluKernelImpl / GeluBackwardKernelImpl formulas, in float):
 *   "none": y = x * 0.5 * (1 + erf(x / sqrt(2)))
 *           dx = dy * (cdf + x * pdf), cdf = 0.5 (1 + erf(x / sqrt(2))),
 *                pdf = exp(-x^2 / 2) / sqrt(2 pi)
 *   "tanh": y = 0.5 x (1 + t),  t = tanh(u),  u = k (x + 0.044715 x^3),  k = sqrt(2 / pi)
 *           dx = dy * (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2))
 *   erf, tanh and exp come from attn_exp_nonpos (exp_nonpos.h, no libm call):
 *   t = sign(u) (1 - e) / (1 + e), e = exp(-2 min(|u|, 9)) (tanh(9) is 1 in
 *   float); 1 + erf(z) from Numerical Recipes' erfc (one_plus_erf), so every
 *   loop vectorises (8 lanes in the AVX2 clone; the same bits in every clone).
 * Contract: contiguous float32, one element count for every operand.
 * Error against torch 1.13 (spec/train_kernels_spec.lua fixtures, max |error| over
 * max |value|, x in [-8, 8]): y 6e-8 (both), dx 9.4e-8 ("none"), 8.5e-7 ("tanh":
 * torch's formula takes 1 - t^2 from a rounded t, at |x| ~ 8 either rounding
 * shows; the spec allows 2e-6).
 * Threads: elements are independent (chunks of CHUNK), so bits do not depend
 * on the count. */
#include <math.h>

#include "exp_nonpos.h"
#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 16384
#define CHUNK 4096

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

/* tanh(u) from one exponential of a non-positive argument */
ATTN_VECTOR_MATH static inline float tanh_from_exp(float u) {
  float a = u < 0.0f ? -u : u;
  a = a > 9.0f ? 9.0f : a; /* NaN passes */
  float e = attn_exp_nonpos(-2.0f * a);
  float t = (1.0f - e) / (1.0f + e);
  return u < 0.0f ? -t : t;
}

/* x: (n) -> y: (n) */
ATTN_VECTOR_CLONES static void gelu_tanh_chunk(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float t = tanh_from_exp(TANH_BETA * (v + TANH_KAPPA * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

/* dy, x: (n) -> dx: (n) */
ATTN_VECTOR_CLONES static void gelu_tanh_backward_chunk(const float *g, const float *x, float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float v2 = v * v;
    float t = tanh_from_exp(TANH_BETA * (v + TANH_KAPPA * v2 * v));
    float left = 0.5f * v, right = 1.0f + t;
    float left_derivative = 0.5f * right;
    float right_derivative = left * (1.0f - t * t) * (TANH_BETA * (1.0f + 3.0f * TANH_KAPPA * v2));
    dx[i] = g[i] * (left_derivative + right_derivative);
  }
}

/* 1 + erf(z) = 2 - erfc(z) for z >= 0, erfc(-z) otherwise, with erfc from
 * Numerical Recipes' erfcc (Chebyshev fit, fractional error < 1.2e-7) and
 * attn_exp_nonpos: no libm call, so the loops vectorise. */
ATTN_VECTOR_MATH static inline float one_plus_erf(float z) {
  float a = z < 0.0f ? -z : z;
  float t = 1.0f / (1.0f + 0.5f * a);
  float q = -0.82215223f + t * 0.17087277f;
  q = 1.48851587f + t * q;
  q = -1.13520398f + t * q;
  q = 0.27886807f + t * q;
  q = -0.18628806f + t * q;
  q = 0.09678418f + t * q;
  q = 0.37409196f + t * q;
  q = 1.00002368f + t * q;
  q = -1.26551223f + t * q;
  float arg = q - a * a;
  arg = arg > 0.0f ? 0.0f : arg; /* within 3e-8 of 0 at z = 0 */
  float erfc_a = t * attn_exp_nonpos(arg);
  return z < 0.0f ? erfc_a : 2.0f - erfc_a;
}

/* x: (n) -> y: (n) */
ATTN_VECTOR_CLONES static void gelu_erf_chunk(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = v * 0.5f * one_plus_erf(v * SQRT1_2);
  }
}

/* dy, x: (n) -> dx: (n) */
ATTN_VECTOR_CLONES static void gelu_erf_backward_chunk(const float *g, const float *x, float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float cdf = 0.5f * one_plus_erf(v * SQRT1_2);
    float pdf = PDF_SCALE * attn_exp_nonpos(-0.5f * v * v);
    dx[i] = g[i] * (cdf + v * pdf);
  }
}

attn_status attn_gelu_forward(const attn_tensor *x, attn_tensor *y, attn_gelu_approximate approximate) {
  attn_status st = check_counts(x, y, "y");
  if (st) return st;
  const int64_t n = attn_numel(x), chunks = (n + CHUNK - 1) / CHUNK;
  const float *xs = x->data;
  float *ys = y->data;
  /* x: (*) -> y: (*), in chunks of CHUNK elements */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(chunks)) if (n > PARALLEL_ELEMS)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
    if (approximate == ATTN_GELU_TANH) gelu_tanh_chunk(xs + i0, ys + i0, len);
    else gelu_erf_chunk(xs + i0, ys + i0, len);
  }
  return ATTN_OK;
}

attn_status attn_gelu_backward(const attn_tensor *dy, const attn_tensor *x, attn_tensor *dx,
                               attn_gelu_approximate approximate) {
  attn_status st;
  if ((st = check_counts(x, dy, "grad")) || (st = check_counts(x, dx, "dx"))) return st;
  const int64_t n = attn_numel(x), chunks = (n + CHUNK - 1) / CHUNK;
  const float *g = dy->data, *xs = x->data;
  float *out = dx->data;
  /* dy, x: (*) -> dx: (*), in chunks of CHUNK elements */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(chunks)) if (n > PARALLEL_ELEMS)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
    if (approximate == ATTN_GELU_TANH) gelu_tanh_backward_chunk(g + i0, xs + i0, out + i0, len);
    else gelu_erf_backward_chunk(g + i0, xs + i0, out + i0, len);
  }
  return ATTN_OK;
}
