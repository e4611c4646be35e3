/* The register-blocked GEMM of the vector sets: the backward's products
 * (src/core/kernels_bwd.h) and, per block of k, the training GEMM
 * (src/core/sgemm_driver.h). Included by kernels_gemm_avx2.c and
 * kernels_gemm_avx512.c after they define
 *   VEC, VW (floats per vector), MR (rows of a micro-tile), NV (vectors of
 *   columns of a micro-tile), vzero(), vset1(x), vload(p), vload_n(p, n)
 *   (the first n lanes, 0 in the others), vstore(p, x), vstore_n(p, x, n),
 *   vfma(a, b, c) = a * b + c rounded once, vadd, vsub, vmul, vmul_nz(p, x) =
 *   p * x where p != 0, else 0.
 * A micro-tile is MR rows x NV vectors of C in registers: per step l, NV
 * vectors of B's row l and one broadcast of A per row. Every element's sum
 * runs in increasing l from 0, one vfma per product, whatever the tile
 * (a tail tile only has fewer rows or columns): the bits depend on k alone.
 * With load_c the accumulators start from C instead of 0 (alpha 1, no
 * accumulate): a product cut along k continues each element's one chain of
 * fused steps, so it gives the bits of the uncut one.
 * With bias (the training GEMM's last block of k), each stored element is
 * then (sum) + bias[column], one rounded add: the bits of the product
 * followed by a separate + bias.
 * Not a public header. */
#ifndef ATTN_KERNEL_GEMM_H
#define ATTN_KERNEL_GEMM_H

/* mr rows x nv vectors (the last one nlast lanes when tail), constant mr,
 * nv, tail and unit (sai == 1) after inlining, so the accumulators stay in
 * registers and A's broadcasts use constant offsets where they can. */
static inline __attribute__((always_inline)) void gemm_tile(const int unit, const int load_c, const int mr, const int nv,
                                                            const int tail, int64_t nlast, int64_t k, const float *a,
                                                            int64_t sai, int64_t sal, const float *b, int64_t ldb,
                                                            float alpha, float *c, int64_t ldc, int accumulate,
                                                            const float *bias) {
  VEC acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (load_c && r < mr && v < nv)
        acc[r][v] = tail && v == nv - 1 ? vload_n(c + r * ldc + v * VW, nlast) : vload(c + r * ldc + v * VW);
      else
        acc[r][v] = vzero();
    }
  const int64_t si = unit ? 1 : sai;
  for (int64_t l = 0; l < k; l++) {
    const float *bl = b + l * ldb;
    VEC bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (v >= nv) break;
      bv[v] = tail && v == nv - 1 ? vload_n(bl + v * VW, nlast) : vload(bl + v * VW);
    }
    const float *al = a + l * sal;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      if (r >= mr) break;
      VEC ar = vset1(al[r * si]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) {
        if (v >= nv) break;
        acc[r][v] = vfma(ar, bv[v], acc[r][v]);
      }
    }
  }
  VEC al = vset1(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    if (r >= mr) break;
    float *cr = c + r * ldc;
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (v >= nv) break;
      VEC x = load_c ? acc[r][v] : vmul(al, acc[r][v]);
      if (tail && v == nv - 1) {
        if (accumulate) x = vadd(vload_n(cr + v * VW, nlast), x);
        if (bias) x = vadd(x, vload_n(bias + v * VW, nlast));
        vstore_n(cr + v * VW, x, nlast);
      } else {
        if (accumulate) x = vadd(vload(cr + v * VW), x);
        if (bias) x = vadd(x, vload(bias + v * VW));
        vstore(cr + v * VW, x);
      }
    }
  }
}

/* Every row of one column block: MR rows at a time, then the rest. */
static inline __attribute__((always_inline)) void gemm_rows(const int unit, const int load_c, const int nv,
                                                            const int tail, int64_t nlast, int64_t m, int64_t k,
                                                            const float *a, int64_t sai, int64_t sal, const float *b,
                                                            int64_t ldb, float alpha, float *c, int64_t ldc,
                                                            int accumulate, const float *bias) {
  int64_t i = 0;
  for (; i + MR <= m; i += MR)
    gemm_tile(unit, load_c, MR, nv, tail, nlast, k, a + i * sai, sai, sal, b, ldb, alpha, c + i * ldc, ldc, accumulate,
              bias);
  if (i == m) return;
  const float *ai = a + i * sai;
  float *ci = c + i * ldc;
  switch ((int)(m - i)) { /* a constant mr for each tail height */
#define ROWS(h) \
  case h: gemm_tile(unit, load_c, h, nv, tail, nlast, k, ai, sai, sal, b, ldb, alpha, ci, ldc, accumulate, bias); break;
    ROWS(1)
#if MR > 2
    ROWS(2)
#endif
#if MR > 3
    ROWS(3)
#endif
#if MR > 4
    ROWS(4)
#endif
#if MR > 5
    ROWS(5)
#endif
#if MR > 6
    ROWS(6)
#endif
#if MR > 7
    ROWS(7)
#endif
  default: break;
#undef ROWS
  }
}

/* Column blocks of NV vectors, then one block of the columns left (its last
 * vector partial unless they fill it). */
static inline __attribute__((always_inline)) void gemm_blocks(const int unit, const int load_c, int64_t m, int64_t n,
                                                              int64_t k, const float *a, int64_t sai, int64_t sal,
                                                              const float *b, int64_t ldb, float alpha, float *c,
                                                              int64_t ldc, int accumulate, const float *bias) {
  int64_t j = 0;
  for (; j + NV * VW <= n; j += NV * VW)
    gemm_rows(unit, load_c, NV, 0, VW, m, k, a, sai, sal, b + j, ldb, alpha, c + j, ldc, accumulate,
              bias ? bias + j : NULL);
  if (j == n) return;
  int64_t rest = n - j;
  int nv = (int)((rest + VW - 1) / VW);
  int64_t nlast = rest - (int64_t)(nv - 1) * VW;
  switch (nv) { /* a constant nv for each tail width */
#define COLS(w) \
  case w: \
    gemm_rows(unit, load_c, w, 1, nlast, m, k, a, sai, sal, b + j, ldb, alpha, c + j, ldc, accumulate, \
              bias ? bias + j : NULL); \
    break;
    COLS(1)
#if NV > 1
    COLS(2)
#endif
#if NV > 2
    COLS(3)
#endif
#if NV > 3
    COLS(4)
#endif
  default: break;
#undef COLS
  }
}

static void bwd_gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t sai, int64_t sal, const float *b,
                     int64_t ldb, float alpha, float *c, int64_t ldc, int accumulate) {
  if (m <= 0 || n <= 0) return;
  if (sai == 1)
    gemm_blocks(1, 0, m, n, k, a, sai, sal, b, ldb, alpha, c, ldc, accumulate, NULL);
  else
    gemm_blocks(0, 0, m, n, k, a, sai, sal, b, ldb, alpha, c, ldc, accumulate, NULL);
}

/* dS = P * (dW - D) row by row, 0 where P is (src/core/kernels_bwd.h). */
static void bwd_ds_rows(const float *p, int64_t ldp, float *dw, int64_t ld, int64_t rows, int64_t n,
                        const float *d) {
  for (int64_t r = 0; r < rows; r++) {
    const float *pr = p + r * ldp;
    float *dr = dw + r * ld;
    VEC dv = vset1(d[r]);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
      VEC pv = vload(pr + j);
      vstore(dr + j, vmul_nz(pv, vsub(vload(dr + j), dv)));
    }
    if (j < n) {
      VEC pv = vload_n(pr + j, n - j);
      vstore_n(dr + j, vmul_nz(pv, vsub(vload_n(dr + j, n - j), dv)), n - j);
    }
  }
}

#endif
