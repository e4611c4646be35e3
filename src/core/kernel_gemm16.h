/* The gemm_t driver of the 16-row kernel sets (scalar and AVX2), included
 * by their files after they define
 *   tile(a, lda, kn, b, bsk, bsc, nc, c, ldc, accumulate)
 * for one micro-tile of 16 rows x nc (<= NR) columns. Not a public header. */
#ifndef ATTN_KERNEL_GEMM16_H
#define ATTN_KERNEL_GEMM16_H

/* The whole product in micro-tiles: NR columns at a time, each nc a constant
 * so the accumulators stay in registers. */
static void gemm_t(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk, int64_t bsc,
                   int64_t n, float *c, int64_t ldc, int accumulate) {
  int64_t j = 0;
  for (; j + NR <= n; j += NR)
    for (int64_t r = 0; r < rows_p; r += MR)
      tile(a + r, lda, kn, b + j * bsc, bsk, bsc, NR, c + j * ldc + r, ldc, accumulate);
  int rest = (int)(n - j);
  for (int64_t r = 0; rest > 0 && r < rows_p; r += MR) {
    const float *bj = b + j * bsc;
    float *cj = c + j * ldc + r;
    switch (rest) { /* a constant nc for each tail width */
    case 1: tile(a + r, lda, kn, bj, bsk, bsc, 1, cj, ldc, accumulate); break;
    case 2: tile(a + r, lda, kn, bj, bsk, bsc, 2, cj, ldc, accumulate); break;
    case 3: tile(a + r, lda, kn, bj, bsk, bsc, 3, cj, ldc, accumulate); break;
    case 4: tile(a + r, lda, kn, bj, bsk, bsc, 4, cj, ldc, accumulate); break;
    default: tile(a + r, lda, kn, bj, bsk, bsc, 5, cj, ldc, accumulate); break;
    }
  }
}

#endif
