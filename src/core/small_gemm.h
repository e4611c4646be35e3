/* The products of tiny problems (the notebooks' [2, 6, 3] batches) as direct
 * loops: below a few thousand multiply-adds, a cblas_sgemm call's fixed cost
 * is the whole product. Used by the backward drivers (src/core/sdpa_backward.c,
 * src/core/modules_backward.c) where the sizes, never the thread count,
 * choose between this and BLAS, so the bits depend on the shapes alone. */
#ifndef ATTN_SMALL_GEMM_H
#define ATTN_SMALL_GEMM_H

#include <stdint.h>

/* Multiply-adds up to which a product is computed by attn_small_gemm. */
#define ATTN_SMALL_GEMM_MACS 4096

/* c [m, n] (row stride ldc) = alpha op(a) op(b) + beta c, row-major, op =
 * transpose when trans_*, as cblas_sgemm (beta = 0: c is not read). Each sum
 * runs in increasing k, one rounding per product and per addition. */
static inline void attn_small_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                   int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int64_t l = 0; l < k; l++)
        acc += (trans_a ? a[l * lda + i] : a[i * lda + l]) * (trans_b ? b[j * ldb + l] : b[l * ldb + j]);
      float *cij = c + i * ldc + j;
      *cij = beta == 0.0f ? alpha * acc : alpha * acc + beta * *cij;
    }
}

#endif
