/* The GEMMs for AVX2 + FMA: the attention backward's products
 * (src/core/kernels_bwd.h) and the training GEMM (src/core/sgemm.h,
 * its driver src/core/sgemm_driver.h); this file alone of them is compiled
 * with -mavx2 -mfma.
 * Micro-tile: 6 rows x 2 vectors (16 columns): 12 accumulators, 2 vectors
 * of B and a broadcast fill 15 of the 16 registers; 12 FMAs per 2 loads of
 * B and 6 broadcasts of A. Each sum as the AVX-512
 * set's (src/core/kernel_gemm.h), so the two sets give the same bits. */
#include <immintrin.h>

#include "kernels_bwd.h"
#include "sgemm.h"

#define VEC __m256
#define VW 8
#define MR 6
#define NV 2
static inline __m256i lanes_below(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 vzero(void) { return _mm256_setzero_ps(); }
static inline __m256 vset1(float x) { return _mm256_set1_ps(x); }
static inline __m256 vload(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 vload_n(const float *p, int64_t n) { return _mm256_maskload_ps(p, lanes_below(n)); }
static inline void vstore(float *p, __m256 x) { _mm256_storeu_ps(p, x); }
static inline void vstore_n(float *p, __m256 x, int64_t n) { _mm256_maskstore_ps(p, lanes_below(n), x); }
static inline __m256 vfma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
static inline __m256 vadd(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
static inline __m256 vmul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
static inline __m256 vsub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
static inline __m256 vmul_nz(__m256 p, __m256 x) {
  return _mm256_and_ps(_mm256_cmp_ps(p, _mm256_setzero_ps(), _CMP_NEQ_UQ), _mm256_mul_ps(p, x));
}
#include "exp_avx2.h"
/* e^x for x <= 0, -inf or NaN: the flash forward's exp8, so the backward's fused P has the bits of its exp_minus */
static inline __m256 vexp(__m256 x) { return exp8(x); }
/* x in the lanes [lo, hi), +0 in the others (src/core/kernel_bwd_tile.h) */
static inline __m256 vkeep(__m256 x, int lo, int hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i m = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane));
  return _mm256_and_ps(_mm256_castsi256_ps(m), x);
}
#include "kernel_gemm.h"
#include "kernel_bwd_tile.h"

const attn_bwd_kernels attn_bwd_kernels_avx2 = {"avx2", bwd_gemm, bwd_ds_rows, bwd_p_ds};

#define SGEMM_NAME attn_sgemm_avx2
#define SGEMM_SET attn_sgemm_set_avx2
#include "sgemm_driver.h"
