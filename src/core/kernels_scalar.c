/* The flash kernel's inner loops in plain C (src/core/cpu.h): the set every CPU
 * runs, and the only one off x86-64. Compiled without -m flags and with
 * -ffp-contract=off, so no product is fused: the bits are the same with any
 * compiler target of the architecture.
 *
 * Micro-kernel: C[c][r] (+)= sum_k A[k][r] * B[k * bsk + c * bsc] for 16 rows
 * and up to 6 columns, each sum in increasing k, one rounding per product and
 * per addition (GCC vectorises the row loop where the target has vectors).
 *
 * Exponential: glibc's expf (correctly rounded in practice: < 1 ulp). The
 * AVX2 and AVX-512 sets use a polynomial with fused steps instead, so their
 * results differ from these in the last bits (within 2e-6 relative,
 * spec/cpu_dispatch_spec.lua). */
#include <math.h>
#include <string.h>

#include "cpu.h"

#define MR ATTN_KERNEL_ROWS
#define NR 6

static inline void tile(const float *a, int64_t lda, int64_t kn, const float *b, int64_t bsk, int64_t bsc, int nc,
                        float *c, int64_t ldc, int accumulate, const float *rs) {
  float acc[NR][MR];
  memset(acc, 0, sizeof acc);
  for (int64_t k = 0; k < kn; k++)
    for (int j = 0; j < nc; j++) {
      float bv = b[k * bsk + j * bsc];
      for (int r = 0; r < MR; r++) acc[j][r] += a[k * lda + r] * bv;
    }
  for (int j = 0; j < nc; j++)
    for (int r = 0; r < MR; r++)
      c[j * ldc + r] = rs ? c[j * ldc + r] * rs[r] + acc[j][r] : accumulate ? c[j * ldc + r] + acc[j][r] : acc[j][r];
}

#include "kernel_gemm16.h"

static void softmax_step16(float *st, int64_t ld, int64_t bk, float *m, float *l, float *rescale) {
  for (int r = 0; r < MR; r++) {
    float bm = -INFINITY;
    int bad = m[r] != m[r];
    for (int64_t j = 0; j < bk; j++) {
      float s = st[j * ld + r];
      if (s != s) bad = 1;
      if (s > bm) bm = s;
    }
    float mnew = bad ? NAN : (bm > m[r] ? bm : m[r]);
    float msub = mnew == -INFINITY ? 0.0f : mnew; /* nothing visible yet: exp(-inf - 0) = 0, not NaN */
    float sum = 0.0f;
    for (int64_t j = 0; j < bk; j++) {
      float p = expf(st[j * ld + r] - msub);
      st[j * ld + r] = p;
      sum += p;
    }
    float kept = l[r] * expf(m[r] - msub); /* 0 where m = -inf */
    float lnew = kept + sum;
    float inv = lnew == 0.0f ? 0.0f : 1.0f / lnew;
    for (int64_t j = 0; j < bk; j++) st[j * ld + r] *= inv;
    rescale[r] = kept * inv;
    l[r] = lnew;
    m[r] = mnew;
  }
}

/* rows_p rows: one group of 16 after the other */
static void softmax_step(float *st, int64_t ld, int64_t bk, int64_t rows_p, float *m, float *l, float *rescale) {
  for (int64_t r = 0; r < rows_p; r += MR) softmax_step16(st + r, ld, bk, m + r, l + r, rescale + r);
}

static void exp_minus(float *x, int64_t n, float m) {
  for (int64_t j = 0; j < n; j++) x[j] = expf(x[j] - m);
}

/* Decoding: one float per "vector", products and sums rounded one by one. */
#define VEC float
#define VW 1
#define DOT_ROWS 4
#define AXPY_ROWS 4
#define AXPY_VECS 8
static inline float vzero(void) { return 0.0f; }
static inline float vload(const float *p) { return *p; }
static inline float vload_n(const float *p, int64_t n) { return n > 0 ? *p : 0.0f; }
static inline void vstore(float *p, float x) { *p = x; }
static inline void vstore_n(float *p, float x, int64_t n) { if (n > 0) *p = x; }
static inline float vset1(float x) { return x; }
static inline float vload_fill(const float *p, int64_t n, float f) { return n > 0 ? *p : f; }
static inline float vadd(float a, float b) { return a + b; }
static inline float vsub(float a, float b) { return a - b; }
static inline float vmul(float a, float b) { return a * b; }
static inline float vmax(float a, float b) { return a > b ? a : b; }
static inline float vexp(float x) { return expf(x); }
static inline float vhmax(float x) { return x; }
static inline float vfma(float a, float b, float c) { return a * b + c; }
static inline float vsum(float x) { return x; }
#include "kernel_decode.h"

/* FMA throughput (cpu.h): 32 independent chains, each step a product and a
 * sum rounded one by one (this file is built with -ffp-contract=off, so the
 * set has no fused step); the compiler may run the chains in SSE vectors. */
#define FMA_LANES 32
static void fma_chains(float *x, int64_t n, float a, float b) {
  float v[FMA_LANES];
  memcpy(v, x, sizeof v);
  for (int64_t i = 0; i < n; i++)
    for (int j = 0; j < FMA_LANES; j++) v[j] = v[j] * a + b;
  memcpy(x, v, sizeof v);
}

/* Bands: vector by vector (src/core/kernel_band.h). */
#define ATTN_BAND_BY_VECTOR
#include "kernel_band.h"

const attn_flash_kernels attn_kernels_scalar = {"scalar",    gemm_t,      gemm_t_rescale, softmax_step16, softmax_step, exp_minus,
                                                rows_dot,    softmax_row, rows_axpy,      FMA_LANES,      fma_chains,
  gemm_t_band, softmax_band, gemm_t_rescale_band, transpose, exp_minus};
