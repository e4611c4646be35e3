/* The attention backward's products in plain C (src/core/kernels_bwd.h): the
 * set every CPU runs, and the only one off x86-64. Compiled without -m flags
 * and with -ffp-contract=off: one rounding per product and per addition,
 * each sum in increasing l (GCC vectorises the column loop where the target
 * has vectors; the order of each element's sum stays the same). Also the
 * choice of the set that goes with the flash kernel set. */
#include <string.h>

#include "kernels_bwd.h"

/* Rows of C summed together (one pass over B's rows serves them all). */
#define ROWS 4
/* Columns of C held in a local accumulator row. */
#define COLS 64

static void gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t sai, int64_t sal, const float *b,
                 int64_t ldb, float alpha, float *c, int64_t ldc, int accumulate) {
  float acc[ROWS][COLS];
  for (int64_t j0 = 0; j0 < n; j0 += COLS) {
    int64_t nc = n - j0 < COLS ? n - j0 : COLS;
    for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
      int64_t nr = m - i0 < ROWS ? m - i0 : ROWS;
      memset(acc, 0, sizeof acc);
      for (int64_t l = 0; l < k; l++) {
        const float *bl = b + l * ldb + j0;
        for (int64_t r = 0; r < nr; r++) {
          float x = a[(i0 + r) * sai + l * sal];
          for (int64_t j = 0; j < nc; j++) acc[r][j] += x * bl[j];
        }
      }
      for (int64_t r = 0; r < nr; r++) {
        float *cr = c + (i0 + r) * ldc + j0;
        for (int64_t j = 0; j < nc; j++) cr[j] = accumulate ? cr[j] + alpha * acc[r][j] : alpha * acc[r][j];
      }
    }
  }
}

static void ds_rows(const float *p, int64_t ldp, float *dw, int64_t ld, int64_t rows, int64_t n, const float *d) {
  for (int64_t r = 0; r < rows; r++) {
    const float *pr = p + r * ldp;
    float *dr = dw + r * ld;
    float di = d[r];
    for (int64_t j = 0; j < n; j++) dr[j] = pr[j] == 0.0f ? 0.0f : pr[j] * (dr[j] - di);
  }
}

const attn_bwd_kernels attn_bwd_kernels_scalar = {"scalar", gemm, ds_rows, NULL};

const attn_bwd_kernels *attn_bwd_kernels_for(const attn_flash_kernels *kr) {
#if defined(__x86_64__)
  if (kr == &attn_kernels_avx512) return &attn_bwd_kernels_avx512;
  if (kr == &attn_kernels_avx2) return &attn_bwd_kernels_avx2;
#endif
  (void)kr;
  return &attn_bwd_kernels_scalar;
}
