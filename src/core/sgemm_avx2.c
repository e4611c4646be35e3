/* The GEMM driver (src/core/sgemm_driver.h) for AVX2 with FMA: micro-tiles
 * of 6 rows x 16 columns (2 vectors), 12 of the 16 registers accumulating.
 * This file alone is compiled with -mavx2 -mfma and runs only where the AVX2
 * kernel set was chosen (src/core/cpu.c). */
#include <immintrin.h>

#define VW 8
#define NV 2
#define VEC __m256
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VBCAST(p) _mm256_broadcast_ss(p)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define SGEMM_NAME attn_sgemm_avx2

#include "sgemm_driver.h"
