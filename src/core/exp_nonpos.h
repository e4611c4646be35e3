/* e^x for x <= 0 (or -inf, NaN) in plain float arithmetic that GCC vectorises
 * under `#pragma omp simd` (no libm call): the Cephes polynomial of
 * src/core/kernels_avx2.c's exp8, written without FMA so that every compiled
 * width (the scalar loop, SSE2, an AVX2 clone) gives the same bits.
 * n = round(x log2e) comes out of the 1.5 * 2^23 shifter add, whose low
 * mantissa bits then hold n + 127, the biased exponent of 2^n. Below
 * ln(2^-126) the result is 0 (as -inf gives); NaN stays NaN. Max relative
 * error 1.2e-7 over [-87.3, 0] (measured against double exp at 10^7 points).
 * For the training kernels (gelu.c, cross_entropy.c). */
#ifndef ATTN_EXP_NONPOS_H
#define ATTN_EXP_NONPOS_H

#include <stdint.h>
#include <string.h>

/* For the functions of the vectorised loops: GCC if-converts selects
 * (x < lo ? ...) only without -ftrapping-math (no FP exception is ever
 * tested in attn; values and rounding are unchanged), and an AVX-512 or AVX2
 * clone is chosen at load by cpuid where the CPU has it (16 or 8 lanes; the
 * same bits as the default clone, the core being built with
 * -ffp-contract=off). x86-64
 * GCC only (see ATTN_FMA_CLONES in cpu.h for clang). ATTN_VECTOR_MATH marks the inline helpers the same way (GCC inlines only
 * between functions of the same options). */
#if defined(__GNUC__) && !defined(__clang__)
#define ATTN_VECTOR_MATH __attribute__((optimize("no-trapping-math")))
#else
#define ATTN_VECTOR_MATH
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default"))) ATTN_VECTOR_MATH
#else
#define ATTN_VECTOR_CLONES ATTN_VECTOR_MATH
#endif

ATTN_VECTOR_MATH static inline float attn_exp_nonpos(float x) {
  const float lo = -87.33654f;       /* ln(2^-126) */
  const float shifter = 12583039.0f; /* 1.5 * 2^23 + 127 */
  const float log2e = 1.44269504088896341f;
  const float c1 = 0.693359375f;     /* ln2, high part (exact in n * c1) */
  const float c2 = -2.12194440e-4f;  /* ln2 - c1 */
  float xc = x < lo ? lo : x;        /* keeps the exponent bits in range (NaN passes) */
  float t = xc * log2e + shifter;
  float n = t - shifter;
  float r = xc - n * c1;
  r = r - n * c2;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.0f);
  uint32_t bits;
  memcpy(&bits, &t, sizeof bits);
  bits <<= 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  return x < lo ? 0.0f : y;
}


#endif
