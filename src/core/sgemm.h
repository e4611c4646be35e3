/* The project's own single-precision GEMM for the products of training
 * (Linear layers of a few hundred features over a few thousand tokens),
 * where OpenBLAS's sgemm spends much of its time outside its inner kernel.
 * One driver (src/core/sgemm_driver.h) over the backward's micro-tiles
 * (src/core/kernel_gemm.h), compiled per instruction set with its -m flags
 * (src/core/kernels_gemm_avx2.c, kernels_gemm_avx512.c), chosen with the
 * flash kernel set (src/core/cpu.c); the scalar set (and arm64) keeps
 * OpenBLAS.
 *
 * Every output element is one sum in increasing k, started from 0, with one
 * fused multiply-add per product, whatever the tiles, the transposes, the
 * instruction set or the thread count: the AVX2 and AVX-512 drivers give the
 * same bits, and cutting a product into tiles changes none. Not a public
 * header. */
#ifndef ATTN_SGEMM_H
#define ATTN_SGEMM_H

#include <stdint.h>

/* c [m, n] (row stride ldc) = op(a) [m, k] @ op(b) [k, n] (+ bias [n], when
 * not NULL: added to each finished sum, one rounded add, as a separate
 * + bias would), row-major, op = transpose when trans_*; k >= 1. Returns 0, with c untouched, when its
 * packing buffers cannot be allocated (the caller then uses BLAS), else 1.
 * Single-threaded: the caller spreads tiles over threads. */
typedef int (*attn_sgemm_fn)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                             const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias);

/* The same product in two steps, for a caller that spreads blocks of rows
 * of one product over threads: op(b) [k, n] packed once per thread
 * (whole_b_floats(n, k) floats, 64-byte aligned; 0: too large to keep
 * packed, use the one-call form), then any rows of op(a) against it, each
 * row's outputs with the bits of the one-call form. */
typedef int64_t (*attn_sgemm_whole_b_floats_fn)(int64_t n, int64_t k);
typedef void (*attn_sgemm_pack_fn)(int trans_b, int64_t n, int64_t k, const float *b, int64_t ldb, float *packed);
typedef void (*attn_sgemm_rows_fn)(int trans_a, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                   const float *packed, float *c, int64_t ldc, const float *bias);

/* One vector set's own GEMM, in either form. */
typedef struct attn_sgemm_set {
  attn_sgemm_fn gemm;
  attn_sgemm_whole_b_floats_fn whole_b_floats;
  attn_sgemm_pack_fn pack;
  attn_sgemm_rows_fn rows;
} attn_sgemm_set;

#if defined(__x86_64__)
extern const attn_sgemm_set attn_sgemm_set_avx2, attn_sgemm_set_avx512;
int attn_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias);
int attn_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias);
#endif

#endif
