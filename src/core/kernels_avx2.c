/* The flash kernel's inner loops for AVX2 + FMA (src/core/cpu.h); this file alone
 * is compiled with -mavx2 -mfma, and runs only where cpuid reports both.
 *
 * Micro-kernel: C[c][r] (+)= sum_k A[k][r] * B[k * bsk + c * bsc] for 16 rows
 * (two 8-float vectors, A packed with the rows contiguous) and up to 6
 * columns of B read in place with any strides by scalar broadcasts (K rows
 * for the scores, V rows for the output): 12 accumulators, 12 FMAs per 2
 * loads + 6 broadcasts. Each sum runs in increasing k, one fused step per
 * product.
 *
 * Exponential: Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2 (n from one
 * FMA and a shifter), and Cephes' degree-7 minimax polynomial for e^r.
 * Measured against double exp over every float in [-87.33, 0] (the kernel's
 * arguments are <= 0): max relative error 1.18e-7 (about 1 ulp). Arguments
 * below -87.33 (e^x < 2^-126) give 0, -inf gives 0, NaN stays NaN. The
 * AVX-512 set computes the same operations lane by lane, so the two give the
 * same bits. */
#include <immintrin.h>
#include <math.h>

#include "cpu.h"

#define MR ATTN_KERNEL_ROWS
#define NR 6

/* Always inlined with a constant nc, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(const float *a, int64_t lda, int64_t kn, const float *b,
                                                       int64_t bsk, int64_t bsc, int nc, float *c, int64_t ldc,
                                                       int accumulate, const float *rs) {
  __m256 lo[NR], hi[NR];
#pragma GCC unroll 6
  for (int j = 0; j < NR; j++) lo[j] = hi[j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kn; k++) {
    __m256 a0 = _mm256_loadu_ps(a + k * lda), a1 = _mm256_loadu_ps(a + k * lda + 8);
    const float *bk = b + k * bsk;
#pragma GCC unroll 6
    for (int j = 0; j < NR; j++) {
      if (j >= nc) break;
      __m256 bv = _mm256_broadcast_ss(bk + j * bsc);
      lo[j] = _mm256_fmadd_ps(a0, bv, lo[j]);
      hi[j] = _mm256_fmadd_ps(a1, bv, hi[j]);
    }
  }
#pragma GCC unroll 6
  for (int j = 0; j < NR; j++) {
    if (j >= nc) break;
    float *cj = c + j * ldc;
    if (rs) {
      lo[j] = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(cj), _mm256_loadu_ps(rs)), lo[j]);
      hi[j] = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(cj + 8), _mm256_loadu_ps(rs + 8)), hi[j]);
    } else if (accumulate) {
      lo[j] = _mm256_add_ps(_mm256_loadu_ps(cj), lo[j]);
      hi[j] = _mm256_add_ps(_mm256_loadu_ps(cj + 8), hi[j]);
    }
    _mm256_storeu_ps(cj, lo[j]);
    _mm256_storeu_ps(cj + 8, hi[j]);
  }
}

#include "kernel_gemm16.h"

#include "exp_avx2.h"
#include "expf_glibc.h"

/* One online-softmax step of 16 rows (src/core/cpu.h), two vectors of 8. */
static void softmax_step16(float *st, int64_t ld, int64_t bk, float *m, float *l, float *rescale) {
  const __m256 nan = _mm256_set1_ps(NAN), ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
  __m256 bm0 = ninf, bm1 = ninf, bad0 = zero, bad1 = zero;
  for (int64_t j = 0; j < bk; j++) {
    __m256 s0 = _mm256_loadu_ps(st + j * ld), s1 = _mm256_loadu_ps(st + j * ld + 8);
    bm0 = _mm256_max_ps(bm0, s0);
    bm1 = _mm256_max_ps(bm1, s1);
    bad0 = _mm256_or_ps(bad0, _mm256_cmp_ps(s0, s0, _CMP_UNORD_Q));
    bad1 = _mm256_or_ps(bad1, _mm256_cmp_ps(s1, s1, _CMP_UNORD_Q));
  }
  __m256 mold0 = _mm256_loadu_ps(m), mold1 = _mm256_loadu_ps(m + 8);
  bad0 = _mm256_or_ps(bad0, _mm256_cmp_ps(mold0, mold0, _CMP_UNORD_Q));
  bad1 = _mm256_or_ps(bad1, _mm256_cmp_ps(mold1, mold1, _CMP_UNORD_Q));
  __m256 mnew0 = _mm256_blendv_ps(_mm256_max_ps(bm0, mold0), nan, bad0);
  __m256 mnew1 = _mm256_blendv_ps(_mm256_max_ps(bm1, mold1), nan, bad1);
  /* rows with nothing visible yet subtract 0: exp(-inf - 0) = 0, not NaN */
  __m256 msub0 = _mm256_andnot_ps(_mm256_cmp_ps(mnew0, ninf, _CMP_EQ_OQ), mnew0);
  __m256 msub1 = _mm256_andnot_ps(_mm256_cmp_ps(mnew1, ninf, _CMP_EQ_OQ), mnew1);
  __m256 sum0 = zero, sum1 = zero;
  for (int64_t j = 0; j < bk; j++) {
    __m256 p0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(st + j * ld), msub0));
    __m256 p1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(st + j * ld + 8), msub1));
    _mm256_storeu_ps(st + j * ld, p0);
    _mm256_storeu_ps(st + j * ld + 8, p1);
    sum0 = _mm256_add_ps(sum0, p0);
    sum1 = _mm256_add_ps(sum1, p1);
  }
  /* the sum so far, scaled to the new max (0 where mold = -inf) */
  __m256 kept0 = _mm256_mul_ps(_mm256_loadu_ps(l), exp8(_mm256_sub_ps(mold0, msub0)));
  __m256 kept1 = _mm256_mul_ps(_mm256_loadu_ps(l + 8), exp8(_mm256_sub_ps(mold1, msub1)));
  __m256 lnew0 = _mm256_add_ps(kept0, sum0), lnew1 = _mm256_add_ps(kept1, sum1);
  /* 1 / l', 0 where l' = 0 (nothing visible yet) */
  __m256 inv0 = _mm256_andnot_ps(_mm256_cmp_ps(lnew0, zero, _CMP_EQ_OQ), _mm256_div_ps(_mm256_set1_ps(1.0f), lnew0));
  __m256 inv1 = _mm256_andnot_ps(_mm256_cmp_ps(lnew1, zero, _CMP_EQ_OQ), _mm256_div_ps(_mm256_set1_ps(1.0f), lnew1));
  for (int64_t j = 0; j < bk; j++) {
    _mm256_storeu_ps(st + j * ld, _mm256_mul_ps(_mm256_loadu_ps(st + j * ld), inv0));
    _mm256_storeu_ps(st + j * ld + 8, _mm256_mul_ps(_mm256_loadu_ps(st + j * ld + 8), inv1));
  }
  _mm256_storeu_ps(rescale, _mm256_mul_ps(kept0, inv0));
  _mm256_storeu_ps(rescale + 8, _mm256_mul_ps(kept1, inv1));
  _mm256_storeu_ps(l, lnew0);
  _mm256_storeu_ps(l + 8, lnew1);
  _mm256_storeu_ps(m, mnew0);
  _mm256_storeu_ps(m + 8, mnew1);
}

/* rows_p rows: one group of 16 after the other */
static void softmax_step(float *st, int64_t ld, int64_t bk, int64_t rows_p, float *m, float *l, float *rescale) {
  for (int64_t r = 0; r < rows_p; r += MR) softmax_step16(st + r, ld, bk, m + r, l + r, rescale + r);
}

static void exp_minus(float *x, int64_t n, float m) {
  __m256 mv = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
  if (j < n) { /* the tail through a padded copy (-inf pads give 0) */
    float tail[8];
    for (int i = 0; i < 8; i++) tail[i] = j + i < n ? x[j + i] : -INFINITY;
    _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), mv)));
    for (int i = 0; j + i < n; i++) x[j + i] = tail[i];
  }
}

/* Decoding: 16-float vectors as pairs of 8-float registers (lo: lanes 0-7,
 * hi: 8-15), partial ones through lane masks. A dot product over E or a sum
 * over keys keeps lane l's partial sum of the elements l, l + 16, ... and
 * vsum / vhmax reduce the 16 lanes in the AVX-512 set's tree
 * (src/core/kernels_avx512.c), so the two sets give the same bits (8-lane
 * vectors would add other partial sums). 2 rows x 2 vectors of output
 * accumulators (8 of the 16 registers). */
typedef struct v16 {
  __m256 lo, hi;
} v16;
#define VEC v16
#define VW 16
#define DOT_ROWS 4
#define DOT_QREGS 4
#define AXPY_ROWS 2
#define AXPY_VECS 2
static inline __m256i lanes_below(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline v16 vzero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 vload(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline v16 vload_n(const float *p, int64_t n) { /* n < 16: masked lanes are not read */
  return (v16){_mm256_maskload_ps(p, lanes_below(n)), _mm256_maskload_ps(p + 8, lanes_below(n - 8))};
}
static inline void vstore(float *p, v16 x) {
  _mm256_storeu_ps(p, x.lo);
  _mm256_storeu_ps(p + 8, x.hi);
}
static inline void vstore_n(float *p, v16 x, int64_t n) {
  _mm256_maskstore_ps(p, lanes_below(n), x.lo);
  _mm256_maskstore_ps(p + 8, lanes_below(n - 8), x.hi);
}
static inline v16 vset1(float x) { return (v16){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
static inline __m256 load_fill8(const float *p, int64_t n, float f) {
  __m256i in = lanes_below(n);
  return _mm256_blendv_ps(_mm256_set1_ps(f), _mm256_maskload_ps(p, in), _mm256_castsi256_ps(in));
}
static inline v16 vload_fill(const float *p, int64_t n, float f) {
  return (v16){load_fill8(p, n, f), load_fill8(p + 8, n - 8, f)};
}
static inline v16 vadd(v16 a, v16 b) { return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline v16 vsub(v16 a, v16 b) { return (v16){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline v16 vmul(v16 a, v16 b) { return (v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline v16 vmax(v16 a, v16 b) { return (v16){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline v16 vexp(v16 x) { return (v16){exp8(x.lo), exp8(x.hi)}; }
static inline v16 vfma(v16 a, v16 b, v16 c) {
  return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline float vhmax(v16 x) { /* lanes i and i + 8, then 4, 2, 1 apart */
  __m256 h = _mm256_max_ps(x.lo, x.hi);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline float vsum(v16 x) { /* lanes i and i + 8, then 4, 2, 1 apart: a fixed tree */
  __m256 h = _mm256_add_ps(x.lo, x.hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#include "kernel_decode.h"

/* FMA throughput (cpu.h): 12 chains of 8 lanes, one fused step each, kept in
 * registers (FMA latency 4-5 cycles x 2 ports needs 8-10 chains; 12 plus a
 * and b fit the 16 registers). */
#define FMA_CHAINS 12
static void fma_chains(float *x, int64_t n, float a, float b) {
  __m256 v[FMA_CHAINS];
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
#pragma GCC unroll 12
  for (int j = 0; j < FMA_CHAINS; j++) v[j] = _mm256_loadu_ps(x + 8 * j);
  for (int64_t i = 0; i < n; i++) {
#pragma GCC unroll 12
    for (int j = 0; j < FMA_CHAINS; j++) v[j] = _mm256_fmadd_ps(v[j], va, vb);
  }
#pragma GCC unroll 12
  for (int j = 0; j < FMA_CHAINS; j++) _mm256_storeu_ps(x + 8 * j, v[j]);
}

/* Bands: vector by vector (src/core/kernel_band.h). */
#define ATTN_BAND_BY_VECTOR
#include "kernel_band.h"

const attn_flash_kernels attn_kernels_avx2 = {"avx2",      gemm_t,      gemm_t_rescale, softmax_step16, softmax_step, exp_minus,
                                             rows_dot,    softmax_row, rows_axpy,      8 * FMA_CHAINS, fma_chains,
  gemm_t_band, softmax_band, gemm_t_rescale_band, transpose, libm_exp_minus};
