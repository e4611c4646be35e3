/* The GEMM driver (src/core/sgemm_driver.h) for AVX-512F: micro-tiles of
 * 6 rows x 64 columns (4 vectors), 24 of the 32 registers accumulating.
 * This file alone is compiled with -mavx512f -mfma and runs only where the
 * AVX-512 kernel set was chosen (src/core/cpu.c). */
#include <immintrin.h>

#define VW 16
#define NV 4
#define VEC __m512
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VBCAST(p) _mm512_set1_ps(*(p))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define SGEMM_NAME attn_sgemm_avx512

#include "sgemm_driver.h"
