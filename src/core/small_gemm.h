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

/* One loop nest per transpose pair (A_AT, B_AT: the element reads), so that
 * the compiler sees plain strides instead of a choice per multiply-add. */
#define ATTN_SMALL_GEMM_LOOPS(A_AT, B_AT)                                      \
  for (int64_t i = 0; i < m; i++)                                              \
    for (int64_t j = 0; j < n; j++) {                                          \
      float acc = 0.0f;                                                        \
      for (int64_t l = 0; l < k; l++) acc += (A_AT) * (B_AT);                  \
      float *cij = c + i * ldc + j;                                            \
      *cij = beta == 0.0f ? alpha * acc : alpha * acc + beta * *cij;           \
    }

/* c [m, n] (row stride ldc) = alpha op(a) op(b) + beta c, row-major, op =
 * transpose when trans_*, as cblas_sgemm (beta = 0: c is not read). Each sum
 * runs in increasing k, one rounding per product and per addition. */
static inline void attn_small_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                   int64_t ldc) {
  if (!trans_a && !trans_b) ATTN_SMALL_GEMM_LOOPS(a[i * lda + l], b[l * ldb + j])
  else if (!trans_a) ATTN_SMALL_GEMM_LOOPS(a[i * lda + l], b[j * ldb + l])
  else if (!trans_b) ATTN_SMALL_GEMM_LOOPS(a[l * lda + i], b[l * ldb + j])
  else ATTN_SMALL_GEMM_LOOPS(a[l * lda + i], b[j * ldb + l])
}

#undef ATTN_SMALL_GEMM_LOOPS

#endif
