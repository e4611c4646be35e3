/* The attention backward's fused tile entry (src/core/kernels_bwd.h: p_ds)
 * for the vector sets. Included by kernels_gemm_avx2.c and
 * kernels_gemm_avx512.c after src/core/kernel_gemm.h, with its VEC, VW, MR,
 * NV and vector helpers, and vexp(x): the flash forward's exponential of the
 * same set, operation for operation (so P here has the forward's bits), and
 * vkeep(x, lo, hi): x in the lanes l with lo <= l < hi, +0 in the others
 * (lo, hi in [0, VW]: the -inf the forward gives a hidden key, whose exp is
 * +0).
 * A micro-tile is MR query rows x NV vectors of keys: the scores' sums run
 * in registers, then P = exp(S - lse) is taken there and stored; then dW's
 * sums run in the same registers and dS = P (dW - D) leaves them, P read
 * back from the store just made (L1). Each sum is the one bwd_gemm makes (in
 * increasing l from 0, one vfma per product; alpha 1 is exact), and the
 * exponential and dS are ds_rows's and exp_minus's operations: the bits of
 * the unfused products and passes, with two passes over the tile less.
 * Not a public header. */
#ifndef ATTN_KERNEL_BWD_TILE_H
#define ATTN_KERNEL_BWD_TILE_H

#include <math.h>

/* acc[r][v] += sum over l < k of a[r][l] b[l][v-th vector], in increasing l,
 * one vfma per product: the register sums of both products of the tile.
 * mr rows x nv vectors, the last one nlast lanes when tail. */
static inline __attribute__((always_inline)) void pds_sums(VEC acc[MR][NV], const int mr, const int nv,
                                                           const int tail, int64_t nlast, int64_t k, const float *a,
                                                           int64_t lda, const float *b, int64_t ldb) {
  for (int64_t l = 0; l < k; l++) {
    const float *bl = b + l * ldb;
    VEC bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (v >= nv) break;
      bv[v] = tail && v == nv - 1 ? vload_n(bl + v * VW, nlast) : vload(bl + v * VW);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      if (r >= mr) break;
      VEC ar = vset1(a[r * lda + l]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; v++) {
        if (v >= nv) break;
        acc[r][v] = vfma(ar, bv[v], acc[r][v]);
      }
    }
  }
}

/* mr rows x nv vectors (the last one nlast lanes when tail); constant
 * masked (vis given), mr, nv and tail after inlining. */
static inline __attribute__((always_inline)) void pds_tile(const int masked, const int mr, const int nv, const int tail,
                                                           int64_t nlast,
                                                           int64_t e, const float *qs, int64_t ldq, const float *kt,
                                                           int64_t ldkt, int64_t ev, const float *dout, int64_t lddo,
                                                           const float *vt, int64_t ldvt, const float *lse,
                                                           const float *d, const int64_t *vis, int64_t j0, float *p,
                                                           int64_t ldp, float *ds, int64_t ldds) {
  VEC acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) acc[r][v] = vzero();
  pds_sums(acc, mr, nv, tail, nlast, e, qs, ldq, kt, ldkt); /* S = Qs K^T */
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) { /* P = exp(S - lse); 0 in a row that sees no key (lse -inf) */
    if (r >= mr) break;
    float *pr = p + r * ldp;
    int none = lse[r] == -INFINITY;
    VEC lv = vset1(lse[r]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (v >= nv) break;
      VEC x = none ? vzero() : vexp(vsub(acc[r][v], lv));
      if (masked) { /* the keys of the row's visible range; P = 0 at the others */
        int64_t c0 = j0 + v * VW, lo = vis[2 * r] - c0, hi = vis[2 * r + 1] - c0;
        lo = lo < 0 ? 0 : lo > VW ? VW : lo;
        hi = hi < 0 ? 0 : hi > VW ? VW : hi;
        if (lo > 0 || hi < VW) x = vkeep(x, (int)lo, (int)hi);
      }
      if (tail && v == nv - 1)
        vstore_n(pr + v * VW, x, nlast);
      else
        vstore(pr + v * VW, x);
      acc[r][v] = vzero();
    }
  }
  pds_sums(acc, mr, nv, tail, nlast, ev, dout, lddo, vt, ldvt); /* dW = dO V^T */
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) { /* dS = P (dW - D), 0 where P is */
    if (r >= mr) break;
    const float *pr = p + r * ldp;
    float *dr = ds + r * ldds;
    VEC dv = vset1(d[r]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
      if (v >= nv) break;
      if (tail && v == nv - 1)
        vstore_n(dr + v * VW, vmul_nz(vload_n(pr + v * VW, nlast), vsub(acc[r][v], dv)), nlast);
      else
        vstore(dr + v * VW, vmul_nz(vload(pr + v * VW), vsub(acc[r][v], dv)));
    }
  }
}

/* Every row of one column block: MR rows at a time, then the rest. */
static inline __attribute__((always_inline)) void pds_rows(const int masked, const int nv, const int tail,
                                                           int64_t nlast, int64_t m,
                                                           int64_t e, const float *qs, int64_t ldq, const float *kt,
                                                           int64_t ldkt, int64_t ev, const float *dout, int64_t lddo,
                                                           const float *vt, int64_t ldvt, const float *lse,
                                                           const float *d, const int64_t *vis, int64_t j0, float *p,
                                                           int64_t ldp, float *ds, int64_t ldds) {
  int64_t i = 0;
  for (; i + MR <= m; i += MR)
    pds_tile(masked, MR, nv, tail, nlast, e, qs + i * ldq, ldq, kt, ldkt, ev, dout + i * lddo, lddo, vt, ldvt, lse + i,
             d + i, masked ? vis + 2 * i : NULL, j0, p + i * ldp, ldp, ds + i * ldds, ldds);
  if (i == m) return;
#define PDS_ARGS                                                                                                    \
  nv, tail, nlast, e, qs + i * ldq, ldq, kt, ldkt, ev, dout + i * lddo, lddo, vt, ldvt, lse + i, d + i,              \
      masked ? vis + 2 * i : NULL, j0, p + i * ldp, ldp, ds + i * ldds, ldds
  switch ((int)(m - i)) { /* a constant mr for each tail height */
  case 1: pds_tile(masked, 1, PDS_ARGS); break;
#if MR > 2
  case 2: pds_tile(masked, 2, PDS_ARGS); break;
#endif
#if MR > 3
  case 3: pds_tile(masked, 3, PDS_ARGS); break;
#endif
#if MR > 4
  case 4: pds_tile(masked, 4, PDS_ARGS); break;
#endif
#if MR > 5
  case 5: pds_tile(masked, 5, PDS_ARGS); break;
#endif
#if MR > 6
  case 6: pds_tile(masked, 6, PDS_ARGS); break;
#endif
#if MR > 7
  case 7: pds_tile(masked, 7, PDS_ARGS); break;
#endif
  default: break;
  }
#undef PDS_ARGS
}

/* Column blocks of NV vectors of keys (K^T's and V^T's columns stay in L1
 * for all the rows), then one block of the keys left. */
static inline __attribute__((always_inline)) void pds_blocks(const int masked, int64_t m, int64_t n, int64_t e,
                                                             const float *qs, int64_t ldq, const float *kt,
                                                             int64_t ldkt, int64_t ev, const float *dout,
                                                             int64_t lddo, const float *vt, int64_t ldvt,
                                                             const float *lse, const float *d, const int64_t *vis,
                                                             float *p, int64_t ldp, float *ds, int64_t ldds) {
  int64_t j = 0;
  for (; j + NV * VW <= n; j += NV * VW)
    pds_rows(masked, NV, 0, VW, m, e, qs, ldq, kt + j, ldkt, ev, dout, lddo, vt + j, ldvt, lse, d, vis, j, p + j, ldp,
             ds + j, ldds);
  if (j == n) return;
  int64_t rest = n - j;
  int nv = (int)((rest + VW - 1) / VW);
  int64_t nlast = rest - (int64_t)(nv - 1) * VW;
#define PDS_COLS(w)                                                                                                  \
  case w:                                                                                                            \
    pds_rows(masked, w, 1, nlast, m, e, qs, ldq, kt + j, ldkt, ev, dout, lddo, vt + j, ldvt, lse, d, vis, j, p + j, \
             ldp, ds + j, ldds);                                                                                     \
    break;
  switch (nv) { /* a constant nv for each tail width */
    PDS_COLS(1)
#if NV > 1
    PDS_COLS(2)
#endif
#if NV > 2
    PDS_COLS(3)
#endif
#if NV > 3
    PDS_COLS(4)
#endif
  default: break;
  }
#undef PDS_COLS
}

/* src/core/kernels_bwd.h: p_ds. */
static void bwd_p_ds(int64_t m, int64_t n, int64_t e, const float *qs, int64_t ldq, const float *kt, int64_t ldkt,
                     int64_t ev, const float *dout, int64_t lddo, const float *vt, int64_t ldvt, const float *lse,
                     const float *d, const int64_t *vis, float *p, int64_t ldp, float *ds, int64_t ldds) {
  if (m <= 0 || n <= 0) return;
  if (vis)
    pds_blocks(1, m, n, e, qs, ldq, kt, ldkt, ev, dout, lddo, vt, ldvt, lse, d, vis, p, ldp, ds, ldds);
  else
    pds_blocks(0, m, n, e, qs, ldq, kt, ldkt, ev, dout, lddo, vt, ldvt, lse, d, vis, p, ldp, ds, ldds);
}

#endif
