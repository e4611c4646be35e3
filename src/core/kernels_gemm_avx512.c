/* The GEMMs for AVX-512F: the attention backward's products
 * (src/core/kernels_bwd.h) and the training GEMM (src/core/sgemm.h,
 * its driver src/core/sgemm_driver.h); this file alone of them is compiled
 * with -mavx512f (and -mfma).
 * Micro-tile: 6 rows x 4 vectors (64 columns, E = 64 in one tile): 24
 * accumulators of the 32 registers, 24 FMAs per 4 loads of B and 6
 * broadcasts of A, enough independent chains to cover the FMA latency on
 * two ports. Each sum as the AVX2 set's (src/core/kernel_gemm.h), so the
 * two sets give the same bits. */
#include <immintrin.h>

#include "kernels_bwd.h"
#include "sgemm.h"

#define VEC __m512
#define VW 16
#define MR 6
#define NV 4
static inline __m512 vzero(void) { return _mm512_setzero_ps(); }
static inline __m512 vset1(float x) { return _mm512_set1_ps(x); }
static inline __m512 vload(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 vload_n(const float *p, int64_t n) {
  return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vstore(float *p, __m512 x) { _mm512_storeu_ps(p, x); }
static inline void vstore_n(float *p, __m512 x, int64_t n) {
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), x);
}
static inline __m512 vfma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
static inline __m512 vadd(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
static inline __m512 vmul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
static inline __m512 vsub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
static inline __m512 vmul_nz(__m512 p, __m512 x) {
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ), p, x);
}
#include "exp_avx512.h"
/* e^x for x <= 0, -inf or NaN: the flash forward's exp16, so the backward's fused P has the bits of its exp_minus */
static inline __m512 vexp(__m512 x) { return exp16(x); }
/* x in the lanes [lo, hi), +0 in the others (src/core/kernel_bwd_tile.h) */
static inline __m512 vkeep(__m512 x, int lo, int hi) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 m =
      _mm512_cmpge_epi32_mask(lane, _mm512_set1_epi32(lo)) & _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(hi));
  return _mm512_maskz_mov_ps(m, x);
}
#include "kernel_gemm.h"
#include "kernel_bwd_tile.h"

const attn_bwd_kernels attn_bwd_kernels_avx512 = {"avx512", bwd_gemm, bwd_ds_rows, bwd_p_ds};

#define SGEMM_NAME attn_sgemm_avx512
#define SGEMM_SET attn_sgemm_set_avx512
#include "sgemm_driver.h"
