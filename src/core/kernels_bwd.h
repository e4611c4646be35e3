/* The attention backward's products (src/core/sdpa_backward.c), one set per
 * instruction set: src/core/kernels_bwd_scalar.c (plain C, every CPU),
 * kernels_gemm_avx2.c and kernels_gemm_avx512.c (register-blocked FMA
 * micro-kernels; only those two files get -m flags). The set follows the
 * flash kernel set src/core/cpu.c chose (ATTN_CPU included), so one process
 * runs one instruction set everywhere.
 *
 * Contract of gemm: for i < m, j < n
 *   C[i * ldc + j] = alpha * sum + (accumulate ? C[i * ldc + j] : 0),
 *   sum = sum over l < k, in increasing l, of a[i * sai + l * sal] * b[l * ldb + j],
 * the sum started from 0 with one fused multiply-add per product (AVX2 and
 * AVX-512: the two give the same bits) or one rounded product and one
 * rounded addition (scalar), then one rounded multiply by alpha and one
 * rounded addition to C. The order of every sum depends on k alone: never on
 * the blocking, the thread count or where the call sits in a larger product.
 * A is read through any strides (its elements are broadcast), B's rows and
 * C's rows are contiguous. m, n, k >= 0; k = 0 gives sum = 0.
 *
 * Contract of ds_rows: for r < rows, j < n
 *   dw[r * ld + j] = p[r * ldp + j] == 0 ? 0 : p[r * ldp + j] * (dw[r * ld + j] - d[r]),
 * the difference and the product each rounded once: the same bits in every
 * set.
 *
 * Contract of p_ds (NULL in the scalar set: the driver runs gemm, the
 * flash set's exp_minus and ds_rows instead), the plain flash tile's scores,
 * probabilities and dS in one pass: for i < m, j < n
 *   p[i * ldp + j] = lse[i] == -inf or j hidden ? 0 : exp(S - lse[i]),
 *   j hidden: vis given and j outside [vis[2 i], vis[2 i + 1]) (row i's
 *   visible keys as columns: where the forward's score is -inf),
 *   S = sum over l < e of qs[i * ldq + l] * kt[l * ldkt + j],
 *   ds[i * ldds + j] = P == 0 ? 0 : P * (dW - d[i]), P = p[i * ldp + j],
 *   dW = sum over l < ev of dout[i * lddo + l] * vt[l * ldvt + j],
 * each sum as gemm's (alpha 1), exp the flash set's exp_minus, dS as
 * ds_rows: the bits of gemm, exp_minus and ds_rows called one after the
 * other. p and ds must not overlap the operands. */
#ifndef ATTN_KERNELS_BWD_H
#define ATTN_KERNELS_BWD_H

#include <stdint.h>

#include "cpu.h"

typedef struct attn_bwd_kernels {
  const char *name; /* the flash set's name it goes with: "scalar", "avx2", "avx512" */
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t sai, int64_t sal, const float *b, int64_t ldb,
               float alpha, float *c, int64_t ldc, int accumulate);
  void (*ds_rows)(const float *p, int64_t ldp, float *dw, int64_t ld, int64_t rows, int64_t n, const float *d);
  void (*p_ds)(int64_t m, int64_t n, int64_t e, const float *qs, int64_t ldq, const float *kt, int64_t ldkt,
               int64_t ev, const float *dout, int64_t lddo, const float *vt, int64_t ldvt, const float *lse,
               const float *d, const int64_t *vis, float *p, int64_t ldp, float *ds, int64_t ldds);
} attn_bwd_kernels;

extern const attn_bwd_kernels attn_bwd_kernels_scalar;
#if defined(__x86_64__)
extern const attn_bwd_kernels attn_bwd_kernels_avx2;
extern const attn_bwd_kernels attn_bwd_kernels_avx512;
#endif

/* The backward set of the same instruction set as the flash set kr. */
const attn_bwd_kernels *attn_bwd_kernels_for(const attn_flash_kernels *kr);

#endif
