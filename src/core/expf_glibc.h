/* glibc's expf, eight floats at a time, bit for bit (AVX2 + FMA; included by
 * src/core/kernels_avx2.c and src/core/kernels_avx512.c, the files compiled
 * with those instruction sets). The math kernel's softmax rows
 * (src/core/attention.c), the tiny module paths (src/core/modules_tiny.h),
 * attn.softmax (src/core/reduce.c), t:exp() and t:sigmoid()
 * (src/core/elementwise.c) and score_mod's exp and sigmoid
 * (src/core/score_mod.c) take their exponentials from it through the
 * chosen set's libm_exp_minus: the bits they had with one expf call per
 * score, without the call.
 *
 * Algorithm: glibc's expf since 2.27 (sysdeps/ieee754/flt-32/e_expf.c, from
 * Arm's optimized-routines), as its FMA build (__expf_fma, the one glibc's
 * ifunc runs on every CPU with AVX2 and FMA, i.e. wherever these sets run)
 * computes it, operation for operation, in double:
 *   z  = fma(N/ln2, x, 2^52 * 1.5)        k = the low bits of z (round to int)
 *   kd = z - 2^52 * 1.5                    r = fma(N/ln2, x, -kd), |r| <= 1/2
 *   y  = fma(fma(r, C0, C1), r * r, fma(r, C2, 1))
 *   s  = T[k mod N] + k << 47 (2^(k/N) as the bits of a double; N = 32)
 *   expf(x) = (float)(y * s)
 * and its special inputs: x = -inf -> 0; NaN and +inf -> x + x; x > 88.72
 * (log 2^128) -> +inf; x < -103.97 (log 2^-150) -> 0; x < -103.28 (log
 * 2^-149) -> 2^-149 (its __math_may_uflowf). The constants are glibc's
 * (__exp2f_data: T[i] = bits(2^(i/32)) - (i << 47), the polynomial scaled
 * by 1/N^3, 1/N^2, 1/N). Each double operation is IEEE-rounded the same way
 * in a lane as in glibc's scalar registers, so each lane gives expf's bits:
 * tests/core_test.c compares the two on a stride of every float bit pattern
 * and every special input, and `make test-expf-all` (tests/expf_all.c) on
 * all 2^32 patterns under every set (0 differ, about a minute a set).
 *
 * Cost: about 15 double-vector operations and one 4-lane gather per 4
 * floats, against a call of about 30 instructions per float. Measured, one
 * thread, against the scalar calls in the same window (Sapphire Rapids VM):
 * the math kernel's forward of [1, 12, 1024, 64] 86-102 ms -> 67-68 ms;
 * the tiny CausalAttention forward 14.7k -> 14.2k instructions (callgrind,
 * the AVX2 set: its rows of 1 to 6 scores pay a call each).
 */
#ifndef ATTN_EXPF_GLIBC_H
#define ATTN_EXPF_GLIBC_H

#include <immintrin.h>
#include <stdint.h>

static const uint64_t expf_glibc_tab[32] = {
  0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
  0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
  0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
  0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
  0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
  0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
  0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

/* four lanes of the main path (x finite, |x| < 88.73; other lanes give
 * values the special cases replace) */
static inline __m128 expf_glibc4(__m128 x) {
  const __m256d inv_ln2_n = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p+52);
  __m256d xd = _mm256_cvtps_pd(x);
  __m256d z = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
  __m256i ki = _mm256_castpd_si256(z);
  __m256d kd = _mm256_sub_pd(z, shift);
  __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
  __m256d p = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.c6af84b912394p-20), _mm256_set1_pd(0x1.ebfce50fac4f3p-13));
  __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.62e42ff0c52d6p-6), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(p, r2, y);
  __m256i t = _mm256_i64gather_epi64((const long long *)expf_glibc_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

/* expf of eight lanes */
static inline __m256 expf_glibc8(__m256 x) {
  __m256 y = _mm256_set_m128(expf_glibc4(_mm256_extractf128_ps(x, 1)), expf_glibc4(_mm256_castps256_ps128(x)));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(0x1p-149f), _mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9d1d9ep6f), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* x[j] = expf(x[j] - m) for j < n, the difference rounded to float first */
static void libm_exp_minus(float *x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, expf_glibc8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
  if (j < n) { /* the tail through a lane mask */
    __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(x + j, k, expf_glibc8(_mm256_sub_ps(_mm256_maskload_ps(x + j, k), mv)));
  }
}

#endif
