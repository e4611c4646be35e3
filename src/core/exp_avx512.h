/* The AVX-512 sets' exponential (compiled with -mavx512f -mfma): included by
 * src/core/kernels_avx512.c (the flash forward's softmax) and
 * src/core/kernels_gemm_avx512.c (the backward's fused P), so both give P
 * the same bits. */
#ifndef ATTN_EXP_AVX512_H
#define ATTN_EXP_AVX512_H

#include <immintrin.h>

/* e^x for x <= 0, -inf or NaN: src/core/exp_avx2.h's exp8 on 16 lanes, its bits. */
static inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);      /* ln(2^-126) */
  const __m512 shifter = _mm512_set1_ps(12583039.0f); /* 1.5 * 2^23 + 127 */
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 c1 = _mm512_set1_ps(0.693359375f);
  const __m512 c2 = _mm512_set1_ps(-2.12194440e-4f);
  __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ); /* false for NaN; -inf too -> 0 */
  __m512 t = _mm512_fmadd_ps(x, log2e, shifter);
  __m512 n = _mm512_sub_ps(t, shifter);
  __m512 r = _mm512_fnmadd_ps(n, c1, x);
  r = _mm512_fnmadd_ps(n, c2, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  /* p 2^n: scalef's one rounding is the product by the float 2^n that
   * exp8's shift of t builds (n >= -126 where the mask lets p through), one
   * operation fewer */
  return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

#endif
