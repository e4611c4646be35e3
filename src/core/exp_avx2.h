/* The AVX2 sets' exponential (compiled with -mavx2 -mfma): included by
 * src/core/kernels_avx2.c (the flash forward's softmax) and
 * src/core/kernels_gemm_avx2.c (the backward's fused P), so both give P the
 * same bits. */
#ifndef ATTN_EXP_AVX2_H
#define ATTN_EXP_AVX2_H

#include <immintrin.h>

/* e^x for x <= 0, -inf or NaN (a score minus its row's running max).
 * n = round(x log2e) comes out of one FMA with the 1.5 * 2^23 shifter, whose
 * low mantissa bits then hold n + 127, the biased exponent of 2^n. */
static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);      /* ln(2^-126) */
  const __m256 shifter = _mm256_set1_ps(12583039.0f); /* 1.5 * 2^23 + 127 */
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f);    /* ln2, high part (exact in n * c1) */
  const __m256 c2 = _mm256_set1_ps(-2.12194440e-4f); /* ln2 - c1 */
  __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);    /* false for NaN; -inf too -> 0 */
  __m256 t = _mm256_fmadd_ps(x, log2e, shifter);
  __m256 n = _mm256_sub_ps(t, shifter);
  __m256 r = _mm256_fnmadd_ps(n, c1, x);
  r = _mm256_fnmadd_ps(n, c2, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, e));
}

#endif
