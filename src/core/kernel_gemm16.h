/* The gemm_t driver of the 16-row kernel sets (scalar and AVX2), included
 * by their files after they define
 *   tile(a, lda, kn, b, bsk, bsc, nc, c, ldc, accumulate, rs)
 * for one micro-tile of 16 rows x nc (<= NR) columns (rs: NULL, or the
 * tile's 16 row scales of C: C = rs C + sum). Not a public header. */
#ifndef ATTN_KERNEL_GEMM16_H
#define ATTN_KERNEL_GEMM16_H

/* The whole product in micro-tiles: NR columns at a time, each nc a constant
 * so the accumulators stay in registers. */
static void gemm_rows(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk,
                      int64_t bsc, int64_t n, float *c, int64_t ldc, int accumulate, const float *rs) {
  int64_t j = 0;
  for (; j + NR <= n; j += NR)
    for (int64_t r = 0; r < rows_p; r += MR)
      tile(a + r, lda, kn, b + j * bsc, bsk, bsc, NR, c + j * ldc + r, ldc, accumulate, rs ? rs + r : NULL);
  int rest = (int)(n - j);
  for (int64_t r = 0; rest > 0 && r < rows_p; r += MR) {
    const float *bj = b + j * bsc;
    float *cj = c + j * ldc + r;
    switch (rest) { /* a constant nc for each tail width */
    case 1: tile(a + r, lda, kn, bj, bsk, bsc, 1, cj, ldc, accumulate, rs ? rs + r : NULL); break;
    case 2: tile(a + r, lda, kn, bj, bsk, bsc, 2, cj, ldc, accumulate, rs ? rs + r : NULL); break;
    case 3: tile(a + r, lda, kn, bj, bsk, bsc, 3, cj, ldc, accumulate, rs ? rs + r : NULL); break;
    case 4: tile(a + r, lda, kn, bj, bsk, bsc, 4, cj, ldc, accumulate, rs ? rs + r : NULL); break;
    default: tile(a + r, lda, kn, bj, bsk, bsc, 5, cj, ldc, accumulate, rs ? rs + r : NULL); break;
    }
  }
}

static void gemm_t(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk, int64_t bsc,
                   int64_t n, float *c, int64_t ldc, int accumulate) {
  gemm_rows(a, lda, kn, rows_p, b, bsk, bsc, n, c, ldc, accumulate, NULL);
}

static void gemm_t_rescale(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk,
                           int64_t bsc, int64_t n, float *c, int64_t ldc, const float *rs) {
  gemm_rows(a, lda, kn, rows_p, b, bsk, bsc, n, c, ldc, 1, rs);
}

#endif
