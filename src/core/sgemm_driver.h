/* The GEMM driver of src/core/sgemm.h, included by each instruction set's
 * file after it defines
 *   VW            floats per vector
 *   NV            vectors per micro-tile row (NR = NV * VW columns)
 *   VEC           the vector type
 *   VZERO()       a zero vector
 *   VLOAD(p)      an unaligned load of VW floats
 *   VSTORE(p, v)  an unaligned store
 *   VBCAST(p)     *p in every lane
 *   VFMA(a, b, c) a * b + c, rounded once
 *   SGEMM_NAME    the function's name
 * Not a public header.
 *
 * Blocking (BLIS's loops): for each block of KC values of k, one panel of
 * NR columns of B (KC * NR floats, 32 KiB for AVX-512) stays in L1 while
 * every MR-row panel of A passes over it. A micro-tile of MR x NR outputs
 * keeps its accumulators in registers (AVX-512: 6 x 4 vectors, 24 FMAs per
 * 4 loads and 6 broadcasts); after the first block of k it starts from the
 * stored C, which continues each element's one chain of fused steps.
 * A is read in place: its elements are broadcast one by one, so any
 * strides do (a Linear layer's input, or the transposed gradient of its
 * weight product); only its edge panel is packed (zero-padded). B is packed,
 * once per block of k, into contiguous [kc][NR] panels (zero-padded): read
 * in place, rows a power of two of 2 KiB or more apart would all fall in a
 * few L1 sets and evict each other. Edge outputs go through a scratch tile. */
#ifndef ATTN_SGEMM_DRIVER_H
#define ATTN_SGEMM_DRIVER_H

#include <stdlib.h>
#include <string.h>

#include "sgemm.h"

#define MR 6
#define NR (NV * VW)
#define KC 128

/* MR x NR outputs at c (row stride ldc) (+)= op(A) op(B) over kc terms:
 * A's element (r, k) at a[r * ars + k * aks], B's row k at b + k * bks. */
static inline __attribute__((always_inline)) void micro_tile(int64_t kc, const float *a, int64_t ars, int64_t aks,
                                                              const float *b, int64_t bks, float *c, int64_t ldc,
                                                              int load_c) {
  VEC acc[MR][NV];
  const float *ar[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    ar[r] = a + r * ars;
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = load_c ? VLOAD(c + r * ldc + v * VW) : VZERO();
  }
  for (int64_t k = 0; k < kc; k++) {
    VEC bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = VLOAD(b + v * VW);
    b += bks;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      VEC av = VBCAST(ar[r] + k * aks);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = VFMA(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) VSTORE(c + r * ldc + v * VW, acc[r][v]);
}

/* rows i0..m-1 (fewer than MR; zero rows after m) of op(a), columns k0..k0+kc, as [kc][MR] */
static void pack_a_edge(int trans_a, const float *a, int64_t lda, int64_t i0, int64_t m, int64_t k0, int64_t kc,
                        float *dst) {
  memset(dst, 0, (size_t)(kc * MR) * sizeof(float));
  for (int64_t r = 0; r < m - i0; r++)
    for (int64_t k = 0; k < kc; k++) dst[k * MR + r] = trans_a ? a[(k0 + k) * lda + i0 + r] : a[(i0 + r) * lda + k0 + k];
}

/* columns j0.. (up to NR; zero columns after n) of op(b), rows k0..k0+kc, as [kc][NR] */
static void pack_b(int trans_b, const float *b, int64_t ldb, int64_t j0, int64_t n, int64_t k0, int64_t kc,
                   float *dst) {
  int64_t cols = n - j0 < NR ? n - j0 : NR;
  if (cols < NR) memset(dst, 0, (size_t)(kc * NR) * sizeof(float));
  if (trans_b) {
    for (int64_t j = 0; j < cols; j++) {
      const float *src = b + (j0 + j) * ldb + k0;
      for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = src[k];
    }
  } else {
    for (int64_t k = 0; k < kc; k++) memcpy(dst + k * NR, b + (k0 + k) * ldb + j0, (size_t)cols * sizeof(float));
  }
}

int SGEMM_NAME(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc) {
  int64_t mp = (m + MR - 1) / MR, np = (n + NR - 1) / NR, kcmax = k < KC ? k : KC;
  /* B's panels, then A's edge panel; aligned_alloc wants a multiple of the alignment */
  int64_t bfloats = np * NR * kcmax;
  size_t bytes = ((size_t)(bfloats + MR * kcmax) * sizeof(float) + 63) & ~(size_t)63;
  float *bp = aligned_alloc(64, bytes);
  if (!bp) return 0;
  float *ap = bp + bfloats;
  float edge[MR * NR] __attribute__((aligned(64)));
  const int64_t ars = trans_a ? 1 : lda, aks = trans_a ? lda : 1;
  for (int64_t k0 = 0; k0 < k; k0 += KC) {
    int64_t kc = k - k0 < KC ? k - k0 : KC;
    int load_c = k0 > 0;
    for (int64_t q = 0; q < np; q++) pack_b(trans_b, b, ldb, q * NR, n, k0, kc, bp + q * NR * kc);
    for (int64_t q = 0; q < np; q++) {
      int64_t j0 = q * NR, cols = n - j0 < NR ? n - j0 : NR;
      const float *bq = bp + q * NR * kc;
      int64_t bks = NR;
      for (int64_t p = 0; p < mp; p++) {
        int64_t i0 = p * MR, rows = m - i0 < MR ? m - i0 : MR;
        float *ct = c + i0 * ldc + j0;
        const float *at = a + (trans_a ? k0 * lda + i0 : i0 * lda + k0);
        int64_t rs = ars, ks = aks;
        if (rows < MR) {
          pack_a_edge(trans_a, a, lda, i0, m, k0, kc, ap);
          at = ap, rs = 1, ks = MR;
        }
        if (rows == MR && cols == NR) {
          micro_tile(kc, at, rs, ks, bq, bks, ct, ldc, load_c);
          continue;
        }
        if (load_c)
          for (int64_t r = 0; r < rows; r++) memcpy(edge + r * NR, ct + r * ldc, (size_t)cols * sizeof(float));
        micro_tile(kc, at, rs, ks, bq, bks, edge, NR, load_c);
        for (int64_t r = 0; r < rows; r++) memcpy(ct + r * ldc, edge + r * NR, (size_t)cols * sizeof(float));
      }
    }
  }
  free(bp);
  return 1;
}

#endif
