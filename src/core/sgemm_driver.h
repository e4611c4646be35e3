/* The GEMM driver of src/core/sgemm.h, included by each vector set's file
 * (src/core/kernels_gemm_avx2.c, kernels_gemm_avx512.c) after the micro-tiles
 * of src/core/kernel_gemm.h (MR rows x NV vectors of VW floats) and a
 * definition of SGEMM_NAME, the function's name. Not a public header.
 *
 * Blocking (BLIS's loops): B is packed into contiguous [kc][NR] panels per
 * block of KC values of k (zero-padded; read in place, rows a power of two
 * of 2 KiB or more apart would all fall in a few L1 sets and evict each
 * other). A block of MC rows of A (MC * KC floats, 48 KiB) stays in L2
 * while it meets every panel of a block of k, and one panel (KC * NR
 * floats, 32 KiB for AVX-512) stays in L1 while the block's MR-row panels
 * of A pass over it. Where all of B packed fits in WHOLE_B_FLOATS, it is
 * packed once and each block of rows runs every block of k in turn, its
 * [MC, n] part of C still in cache from one block of k to the next (the
 * training step's products over 512 features: 5-8% faster than below);
 * else each block of k is packed in turn and every block of rows runs over
 * it (a weight gradient's k of 2048 tokens, whose packed B would not stay
 * in L2). Without the blocks of rows, A's whole [m, KC] slice (1 MiB at
 * 2048 tokens) passed over each panel, from L3 once the product's output
 * had pushed it out of L2 (3-6% slower at the training step's shapes). A
 * micro-tile of MR x NR outputs keeps its accumulators in registers
 * (AVX-512: 6 x 4 vectors, 24 FMAs per 4 loads and 6 broadcasts); after the
 * first block of k it starts from the stored C (load_c), which continues
 * each element's one chain of fused steps, so neither order changes a bit.
 * A is read in place: its elements are broadcast one by one, so any strides
 * do (a Linear layer's input, or the transposed gradient of its weight
 * product).
 * Edge tiles have fewer rows or lanes (masked loads and stores). */
#ifndef ATTN_SGEMM_DRIVER_H
#define ATTN_SGEMM_DRIVER_H

#include <stdlib.h>
#include <string.h>

#include "sgemm.h"

#define NR (NV * VW)
#define KC 128
#define MC 96
/* B packed whole (every block of k) up to this many floats (512 KiB, within L2) */
#define WHOLE_B_FLOATS (128 * 1024)
_Static_assert(MC % MR == 0, "a block of rows is whole micro-tiles");

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

/* B's panels for the k values [k0, k0 + kc): np panels of [kc][NR] at dst */
static void pack_block(int trans_b, const float *b, int64_t ldb, int64_t np, int64_t n, int64_t k0, int64_t kc,
                       float *dst) {
  for (int64_t q = 0; q < np; q++) pack_b(trans_b, b, ldb, q * NR, n, k0, kc, dst + q * NR * kc);
}

/* rows [0, mi) of c (+)= the product's k values [k0, k0 + kc) over the
 * block's packed panels bk; the bias with the block that ends k. Not
 * inlined: one copy of its loop nests serves both orders (a call per block
 * of rows and of k costs nothing measurable). */
static __attribute__((noinline)) void block_product(int64_t ars, int64_t aks, int64_t mi, int64_t n, int64_t np,
                                                    int64_t k, int64_t k0, int64_t kc, const float *ai,
                                                    const float *bk, float *ci, int64_t ldc, const float *bias) {
  const float *bias_k = k0 + kc == k ? bias : NULL;
  for (int64_t q = 0; q < np; q++) {
    int64_t j0 = q * NR, cols = n - j0 < NR ? n - j0 : NR;
    const float *bq = bk + q * NR * kc, *bias_q = bias_k ? bias_k + j0 : NULL;
    /* constant unit-stride and load_c flags, so each case is its own inlined loop nest */
    if (k0 == 0) {
      if (ars == 1) gemm_blocks(1, 0, mi, cols, kc, ai, ars, aks, bq, NR, 1.0f, ci + j0, ldc, 0, bias_q);
      else gemm_blocks(0, 0, mi, cols, kc, ai, ars, aks, bq, NR, 1.0f, ci + j0, ldc, 0, bias_q);
    } else {
      if (ars == 1) gemm_blocks(1, 1, mi, cols, kc, ai, ars, aks, bq, NR, 1.0f, ci + j0, ldc, 0, bias_q);
      else gemm_blocks(0, 1, mi, cols, kc, ai, ars, aks, bq, NR, 1.0f, ci + j0, ldc, 0, bias_q);
    }
  }
}

/* attn_sgemm_set's whole_b_floats */
static int64_t whole_b_floats(int64_t n, int64_t k) {
  int64_t floats = (n + NR - 1) / NR * NR * k;
  return floats <= WHOLE_B_FLOATS ? floats : 0;
}

/* attn_sgemm_set's pack: every block of k's panels, block k0 at packed + k0 * np * NR */
static void pack_whole(int trans_b, int64_t n, int64_t k, const float *b, int64_t ldb, float *packed) {
  const int64_t np = (n + NR - 1) / NR;
  for (int64_t k0 = 0; k0 < k; k0 += KC)
    pack_block(trans_b, b, ldb, np, n, k0, k - k0 < KC ? k - k0 : KC, packed + k0 * np * NR);
}

/* attn_sgemm_set's rows */
static void rows_whole(int trans_a, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *packed,
                       float *c, int64_t ldc, const float *bias) {
  const int64_t np = (n + NR - 1) / NR, ars = trans_a ? 1 : lda, aks = trans_a ? lda : 1;
  for (int64_t i0 = 0; i0 < m; i0 += MC) { /* every block of k of one block of rows while its part of c is in cache */
    int64_t mi = m - i0 < MC ? m - i0 : MC;
    for (int64_t k0 = 0; k0 < k; k0 += KC)
      block_product(ars, aks, mi, n, np, k, k0, k - k0 < KC ? k - k0 : KC, a + k0 * aks + i0 * ars,
                    packed + k0 * np * NR, c + i0 * ldc, ldc, bias);
  }
}

int SGEMM_NAME(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias) {
  const int64_t np = (n + NR - 1) / NR, ars = trans_a ? 1 : lda, aks = trans_a ? lda : 1;
  const int64_t whole = whole_b_floats(n, k);
  /* B's panels: all of them, or one block of k's; aligned_alloc wants a multiple of the alignment */
  size_t bytes = ((size_t)(whole ? whole : np * NR * (k < KC ? k : KC)) * sizeof(float) + 63) & ~(size_t)63;
  float *bp = aligned_alloc(64, bytes);
  if (!bp) return 0;
  if (whole) {
    pack_whole(trans_b, n, k, b, ldb, bp);
    rows_whole(trans_a, m, n, k, a, lda, bp, c, ldc, bias);
  } else { /* every block of rows over one block of k's packed panels */
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      int64_t kc = k - k0 < KC ? k - k0 : KC;
      pack_block(trans_b, b, ldb, np, n, k0, kc, bp);
      for (int64_t i0 = 0; i0 < m; i0 += MC) {
        int64_t mi = m - i0 < MC ? m - i0 : MC;
        block_product(ars, aks, mi, n, np, k, k0, kc, a + k0 * aks + i0 * ars, bp, c + i0 * ldc, ldc, bias);
      }
    }
  }
  free(bp);
  return 1;
}

const attn_sgemm_set SGEMM_SET = {SGEMM_NAME, whole_b_floats, pack_whole, rows_whole};

#endif
