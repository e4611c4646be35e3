/* The flash kernel's inner loops for AVX-512F (src/core/cpu.h); this file alone
 * is compiled with -mavx512f (and -mfma), and runs only where cpuid reports
 * AVX-512F and the OS saves its registers.
 *
 * Micro-kernel: C[c][r] (+)= sum_k A[k][r] * B[k * bsk + c * bsc] for 64 rows
 * (four 16-float vectors) and up to 6 columns of B read in place by scalar
 * broadcasts: 24 accumulators of the 32 registers, 24 FMAs per 4 loads + 6
 * broadcasts (AVX2: 12 per 2 + 6); 48, 32 or 16 rows take 3 x 8, 2 x 12 or
 * 1 x 12. A flash tile's 64 rows are one micro-tile row, so A is read once
 * per column block. Each sum runs in increasing k with one fused step per
 * product, as in the AVX2 set, so the two sets give the same bits for the
 * products.
 *
 * Exponential and softmax step: the AVX2 set's operations (src/core/kernels_avx2.c:
 * Cody-Waite reduction, Cephes' degree-7 polynomial, max relative error
 * 1.18e-7 over [-87.33, 0]) on one 16-float vector per 16-row group. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "cpu.h"

/* Columns of a tile of nv vectors (16 rows each): 24 accumulators where
 * they fit (4 x 6, 3 x 8, 2 x 12), 12 for one vector. */
#define NR_MAX 12
#define NR_OF(nv) ((nv) == 4 ? 6 : (nv) == 3 ? 8 : 12)

/* How a tile leaves its sums in C: overwrite, add, or C = rs C + sum (the
 * rescale of the output so far, then the block's sum: rs per row). */
enum { STORE, ADD, RESCALE_ADD };

/* acc[v][j] += A[k][16 v .. 16 v + 15] B[k][j] for k in [k0, k1), in
 * increasing k with one fused multiply-add each, for the vectors v < nv in
 * the mask mk (the others' accumulators untouched) and the columns j < nc:
 * a tile's sums (mk all ones) and a band's products over one segment of its
 * keys (mk its active vectors). */
static inline __attribute__((always_inline)) void tile_sums(int nv, int nc, unsigned mk, const float *a, int64_t lda,
                                                            int64_t k0, int64_t k1, const float *b, int64_t bsk,
                                                            int64_t bsc, __m512 (*acc)[NR_MAX]) {
  for (int64_t k = k0; k < k1; k++) {
    __m512 av[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
      av[v] = v < nv && (mk >> v & 1u) ? _mm512_loadu_ps(a + k * lda + 16 * v) : _mm512_setzero_ps();
    const float *bk = b + k * bsk;
#pragma GCC unroll 12
    for (int j = 0; j < NR_MAX; j++) {
      if (j >= nc) break;
      __m512 bv = _mm512_set1_ps(bk[j * bsc]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; v++)
        if (v < nv && (mk >> v & 1u)) acc[v][j] = _mm512_fmadd_ps(av[v], bv, acc[v][j]);
    }
  }
}

/* nv (1 to 4) vectors of 16 rows x nc (<= NR_OF(nv)) columns; always inlined
 * with constant nv, nc and mode, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(int nv, const float *a, int64_t lda, int64_t kn, const float *b,
                                                       int64_t bsk, int64_t bsc, int nc, float *c, int64_t ldc,
                                                       int mode, const float *rs) {
  __m512 acc[4][NR_MAX];
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++)
#pragma GCC unroll 12
    for (int j = 0; j < NR_MAX; j++) acc[v][j] = _mm512_setzero_ps();
  tile_sums(nv, nc, 0xFu, a, lda, 0, kn, b, bsk, bsc, acc);
  __m512 sv[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) sv[v] = mode == RESCALE_ADD && v < nv ? _mm512_loadu_ps(rs + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int j = 0; j < NR_MAX; j++) {
    if (j >= nc) break;
    float *cj = c + j * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (v >= nv) break;
      __m512 x = acc[v][j];
      if (mode == ADD) x = _mm512_add_ps(_mm512_loadu_ps(cj + 16 * v), x);
      if (mode == RESCALE_ADD) x = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cj + 16 * v), sv[v]), x);
      _mm512_storeu_ps(cj + 16 * v, x);
    }
  }
}

/* Every column of nv vectors of rows: tiles of NR_OF(nv) columns, then one
 * tail tile of a constant width. */
static inline __attribute__((always_inline)) void columns(int nv, const float *a, int64_t lda, int64_t kn,
                                                          const float *b, int64_t bsk, int64_t bsc, int64_t n,
                                                          float *c, int64_t ldc, int mode, const float *rs) {
  const int w = NR_OF(nv);
  int64_t j = 0;
  for (; j + w <= n; j += w) tile(nv, a, lda, kn, b + j * bsc, bsk, bsc, w, c + j * ldc, ldc, mode, rs);
  if (j == n) return;
  const float *bj = b + j * bsc;
  float *cj = c + j * ldc;
  switch ((int)(n - j)) { /* a constant nc for each tail width */
#define TAIL(t) \
  case t: if (t < w) tile(nv, a, lda, kn, bj, bsk, bsc, t, cj, ldc, mode, rs); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7) TAIL(8) TAIL(9) TAIL(10) TAIL(11)
#undef TAIL
  default: break;
  }
}

/* The whole product: 64 rows at a time (one tile spans them), then the 48,
 * 32 or 16 rows left. */
static inline __attribute__((always_inline)) void gemm_any(const float *a, int64_t lda, int64_t kn, int64_t rows_p,
                                                           const float *b, int64_t bsk, int64_t bsc, int64_t n,
                                                           float *c, int64_t ldc, int mode, const float *rs) {
  int64_t r = 0;
  for (; r + 64 <= rows_p; r += 64) columns(4, a + r, lda, kn, b, bsk, bsc, n, c + r, ldc, mode, mode == RESCALE_ADD ? rs + r : rs);
  switch ((int)(rows_p - r) / 16) {
  case 3: columns(3, a + r, lda, kn, b, bsk, bsc, n, c + r, ldc, mode, mode == RESCALE_ADD ? rs + r : rs); break;
  case 2: columns(2, a + r, lda, kn, b, bsk, bsc, n, c + r, ldc, mode, mode == RESCALE_ADD ? rs + r : rs); break;
  case 1: columns(1, a + r, lda, kn, b, bsk, bsc, n, c + r, ldc, mode, mode == RESCALE_ADD ? rs + r : rs); break;
  default: break;
  }
}

static void gemm_t(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk, int64_t bsc,
                   int64_t n, float *c, int64_t ldc, int accumulate) {
  if (accumulate)
    gemm_any(a, lda, kn, rows_p, b, bsk, bsc, n, c, ldc, ADD, NULL);
  else
    gemm_any(a, lda, kn, rows_p, b, bsk, bsc, n, c, ldc, STORE, NULL);
}

static void gemm_t_rescale(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk,
                           int64_t bsc, int64_t n, float *c, int64_t ldc, const float *rs) {
  gemm_any(a, lda, kn, rows_p, b, bsk, bsc, n, c, ldc, RESCALE_ADD, rs);
}

#include "exp_avx512.h"
#include "expf_glibc.h"

/* One online-softmax step of nv (1 to 4) vectors of 16 rows side by side
 * (src/core/cpu.h): nv independent chains for the max and the sum, where one
 * vector alone waits on the latency of each max and add; per row the same
 * operations in the same order as one vector alone. A NaN score is found
 * from its row's sum of exp, which it makes NaN (no other score can: exp
 * gives 0 for -inf, and a +inf score makes its row NaN anyway), instead of
 * by a compare per score: the row's m, l, p and rescale come out NaN. */
static inline __attribute__((always_inline)) void softmax_nv(int nv, float *st, int64_t ld, int64_t bk, float *m,
                                                             float *l, float *rescale) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
  __m512 mx[4], msub[4], sum[4], inv[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) mx[v] = msub[v] = sum[v] = inv[v] = v < nv ? ninf : zero;
  int64_t j0 = 0;
  if (nv <= 2) { /* a second chain per vector over the odd keys (max is exact: any order gives its bits) */
    __m512 mx2[2] = {ninf, ninf};
    for (; j0 + 2 <= bk; j0 += 2) {
#pragma GCC unroll 2
      for (int v = 0; v < 2; v++) {
        if (v >= nv) break;
        mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(st + j0 * ld + 16 * v));
        mx2[v] = _mm512_max_ps(mx2[v], _mm512_loadu_ps(st + (j0 + 1) * ld + 16 * v));
      }
    }
#pragma GCC unroll 2
    for (int v = 0; v < 2; v++)
      if (v < nv) mx[v] = _mm512_max_ps(mx[v], mx2[v]);
  }
  for (int64_t j = j0; j < bk; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
      if (v < nv) mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(st + j * ld + 16 * v));
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) {
    if (v >= nv) break;
    mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(m + 16 * v)); /* a NaN m (max's second operand) stays */
    /* rows with nothing visible yet subtract 0: exp(-inf - 0) = 0, not NaN */
    msub[v] = _mm512_maskz_mov_ps((__mmask16)~_mm512_cmp_ps_mask(mx[v], ninf, _CMP_EQ_OQ), mx[v]);
    sum[v] = zero;
  }
  for (int64_t j = 0; j < bk; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (v >= nv) break;
      float *sj = st + j * ld + 16 * v;
      __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sj), msub[v]));
      _mm512_storeu_ps(sj, p);
      sum[v] = _mm512_add_ps(sum[v], p);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) {
    if (v >= nv) break;
    __m512 mold = _mm512_loadu_ps(m + 16 * v);
    __m512 kept = _mm512_mul_ps(_mm512_loadu_ps(l + 16 * v), exp16(_mm512_sub_ps(mold, msub[v]))); /* 0 where mold = -inf */
    __m512 lnew = _mm512_add_ps(kept, sum[v]);
    inv[v] = _mm512_maskz_div_ps((__mmask16)~_mm512_cmp_ps_mask(lnew, zero, _CMP_EQ_OQ), _mm512_set1_ps(1.0f), lnew);
    _mm512_storeu_ps(rescale + 16 * v, _mm512_mul_ps(kept, inv[v]));
    _mm512_storeu_ps(l + 16 * v, lnew);
    __mmask16 bad = _mm512_cmp_ps_mask(sum[v], sum[v], _CMP_UNORD_Q);
    _mm512_storeu_ps(m + 16 * v, _mm512_mask_mov_ps(mx[v], bad, _mm512_set1_ps(NAN)));
  }
  for (int64_t j = 0; j < bk; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (v >= nv) break;
      float *sj = st + j * ld + 16 * v;
      _mm512_storeu_ps(sj, _mm512_mul_ps(_mm512_loadu_ps(sj), inv[v]));
    }
  }
}

static void softmax_step16(float *st, int64_t ld, int64_t bk, float *m, float *l, float *rescale) {
  softmax_nv(1, st, ld, bk, m, l, rescale);
}

/* rows_p rows: 64 at a time, then the 48, 32 or 16 left */
static void softmax_step(float *st, int64_t ld, int64_t bk, int64_t rows_p, float *m, float *l, float *rescale) {
  int64_t r = 0;
  for (; r + 64 <= rows_p; r += 64) softmax_nv(4, st + r, ld, bk, m + r, l + r, rescale + r);
  switch ((int)(rows_p - r) / 16) {
  case 3: softmax_nv(3, st + r, ld, bk, m + r, l + r, rescale + r); break;
  case 2: softmax_nv(2, st + r, ld, bk, m + r, l + r, rescale + r); break;
  case 1: softmax_nv(1, st + r, ld, bk, m + r, l + r, rescale + r); break;
  default: break;
  }
}

/* Bands (src/core/cpu.h, src/core/kernel_band.h): each segment of the keys
 * with its active vectors side by side, so a partly visible block runs in
 * the tiles of a full one over the keys its rows see. Per vector, the same
 * operations in the same order as the 16-row entries over its own keys. */
#include "kernel_band.h"

/* one case per nonzero set of active vectors, a constant for the loops */
#define BAND_SWITCH(act, CALL)                                                                                         \
  switch (act) {                                                                                                       \
  case 1: CALL(1u); break;                                                                                             \
  case 2: CALL(2u); break;                                                                                             \
  case 3: CALL(3u); break;                                                                                             \
  case 4: CALL(4u); break;                                                                                             \
  case 5: CALL(5u); break;                                                                                             \
  case 6: CALL(6u); break;                                                                                             \
  case 7: CALL(7u); break;                                                                                             \
  case 8: CALL(8u); break;                                                                                             \
  case 9: CALL(9u); break;                                                                                             \
  case 10: CALL(10u); break;                                                                                           \
  case 11: CALL(11u); break;                                                                                           \
  case 12: CALL(12u); break;                                                                                           \
  case 13: CALL(13u); break;                                                                                           \
  case 14: CALL(14u); break;                                                                                           \
  case 15: CALL(15u); break;                                                                                           \
  default: break;                                                                                                      \
  }

/* Scores: each segment's runs of consecutive active vectors as gemm_t's
 * tiles (a tile's shape never changes a sum's bits). */
static void gemm_t_band(const float *a, int64_t lda, int64_t kn, int nv, const int64_t *kb, const int64_t *ke,
                        const float *b, int64_t bsk, int64_t bsc, float *c, int64_t ldc) {
  band_segs sg;
  band_segments(nv, kb, ke, &sg);
  for (int i = 0; i < sg.n; i++) {
    unsigned act = sg.act[i];
    int64_t s0 = sg.s0[i], n = sg.s1[i] - s0;
    for (int v = 0; v < 4;) {
      if (!(act >> v & 1u)) {
        v++;
        continue;
      }
      int w = 1;
      while (v + w < 4 && (act >> (v + w) & 1u)) w++;
      const float *av = a + 16 * v, *bv = b + s0 * bsc;
      float *cv = c + s0 * ldc + 16 * v;
      switch (w) {
      case 4: columns(4, av, lda, kn, bv, bsk, bsc, n, cv, ldc, STORE, NULL); break;
      case 3: columns(3, av, lda, kn, bv, bsk, bsc, n, cv, ldc, STORE, NULL); break;
      case 2: columns(2, av, lda, kn, bv, bsk, bsc, n, cv, ldc, STORE, NULL); break;
      default: columns(1, av, lda, kn, bv, bsk, bsc, n, cv, ldc, STORE, NULL); break;
      }
      v += w;
    }
  }
}

static inline __attribute__((always_inline)) void band_max(unsigned mk, const float *st, int64_t ld, int64_t j0,
                                                           int64_t j1, __m512 *mx) {
  for (int64_t j = j0; j < j1; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++)
      if (mk >> v & 1u) mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(st + j * ld + 16 * v));
  }
}

static inline __attribute__((always_inline)) void band_exp(unsigned mk, float *st, int64_t ld, int64_t j0, int64_t j1,
                                                           const __m512 *msub, __m512 *sum) {
  for (int64_t j = j0; j < j1; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (!(mk >> v & 1u)) continue;
      float *sj = st + j * ld + 16 * v;
      __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sj), msub[v]));
      _mm512_storeu_ps(sj, p);
      sum[v] = _mm512_add_ps(sum[v], p);
    }
  }
}

static inline __attribute__((always_inline)) void band_scale(unsigned mk, float *st, int64_t ld, int64_t j0,
                                                             int64_t j1, const __m512 *inv) {
  for (int64_t j = j0; j < j1; j++) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (!(mk >> v & 1u)) continue;
      float *sj = st + j * ld + 16 * v;
      _mm512_storeu_ps(sj, _mm512_mul_ps(_mm512_loadu_ps(sj), inv[v]));
    }
  }
}

/* softmax_nv's passes, each over the segments in increasing keys: a
 * vector's max, sum and scaling see its own keys in softmax_step16's order. */
static void softmax_band(float *st, int64_t ld, int nv, const int64_t *kb, const int64_t *ke, float *m, float *l,
                         float *rescale) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
  __m512 mx[4], msub[4], sum[4], inv[4];
  band_segs sg;
  band_segments(nv, kb, ke, &sg);
  unsigned live = 0;
  for (int v = 0; v < nv; v++)
    if (kb[v] < ke[v]) live |= 1u << v;
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) mx[v] = ninf, msub[v] = sum[v] = inv[v] = zero;
  for (int i = 0; i < sg.n; i++) {
#define CALL(mk) band_max(mk, st, ld, sg.s0[i], sg.s1[i], mx)
    BAND_SWITCH(sg.act[i], CALL)
#undef CALL
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) {
    if (!(live >> v & 1u)) continue;
    mx[v] = _mm512_max_ps(mx[v], _mm512_loadu_ps(m + 16 * v));
    msub[v] = _mm512_maskz_mov_ps((__mmask16)~_mm512_cmp_ps_mask(mx[v], ninf, _CMP_EQ_OQ), mx[v]);
  }
  for (int i = 0; i < sg.n; i++) {
#define CALL(mk) band_exp(mk, st, ld, sg.s0[i], sg.s1[i], msub, sum)
    BAND_SWITCH(sg.act[i], CALL)
#undef CALL
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) {
    if (!(live >> v & 1u)) continue;
    __m512 mold = _mm512_loadu_ps(m + 16 * v);
    __m512 kept = _mm512_mul_ps(_mm512_loadu_ps(l + 16 * v), exp16(_mm512_sub_ps(mold, msub[v])));
    __m512 lnew = _mm512_add_ps(kept, sum[v]);
    inv[v] = _mm512_maskz_div_ps((__mmask16)~_mm512_cmp_ps_mask(lnew, zero, _CMP_EQ_OQ), _mm512_set1_ps(1.0f), lnew);
    _mm512_storeu_ps(rescale + 16 * v, _mm512_mul_ps(kept, inv[v]));
    _mm512_storeu_ps(l + 16 * v, lnew);
    __mmask16 bad = _mm512_cmp_ps_mask(sum[v], sum[v], _CMP_UNORD_Q);
    _mm512_storeu_ps(m + 16 * v, _mm512_mask_mov_ps(mx[v], bad, _mm512_set1_ps(NAN)));
  }
  for (int i = 0; i < sg.n; i++) {
#define CALL(mk) band_scale(mk, st, ld, sg.s0[i], sg.s1[i], inv)
    BAND_SWITCH(sg.act[i], CALL)
#undef CALL
  }
}

/* nv vectors x nc columns of P V over the band's segments, then C = rs C +
 * sum for the live vectors (tile's RESCALE_ADD) */
static inline __attribute__((always_inline)) void band_pv_tile(int nv, int nc, const float *a, int64_t lda,
                                                               const band_segs *sg, unsigned live, const float *b,
                                                               int64_t bsk, int64_t bsc, float *c, int64_t ldc,
                                                               const float *rs) {
  __m512 acc[4][NR_MAX];
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++)
#pragma GCC unroll 12
    for (int j = 0; j < NR_MAX; j++) acc[v][j] = _mm512_setzero_ps();
  for (int i = 0; i < sg->n; i++) {
#define CALL(mk) tile_sums(nv, nc, mk, a, lda, sg->s0[i], sg->s1[i], b, bsk, bsc, acc)
    BAND_SWITCH(sg->act[i], CALL)
#undef CALL
  }
  __m512 sv[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; v++) sv[v] = v < nv ? _mm512_loadu_ps(rs + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int j = 0; j < NR_MAX; j++) {
    if (j >= nc) break;
    float *cj = c + j * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      if (v >= nv) break;
      if (!(live >> v & 1u)) continue;
      __m512 x = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cj + 16 * v), sv[v]), acc[v][j]);
      _mm512_storeu_ps(cj + 16 * v, x);
    }
  }
}

static inline __attribute__((always_inline)) void band_pv_columns(int nv, const float *a, int64_t lda,
                                                                  const band_segs *sg, unsigned live, const float *b,
                                                                  int64_t bsk, int64_t bsc, int64_t n, float *c,
                                                                  int64_t ldc, const float *rs) {
  const int w = NR_OF(nv);
  int64_t j = 0;
  for (; j + w <= n; j += w) band_pv_tile(nv, w, a, lda, sg, live, b + j * bsc, bsk, bsc, c + j * ldc, ldc, rs);
  if (j == n) return;
  const float *bj = b + j * bsc;
  float *cj = c + j * ldc;
  switch ((int)(n - j)) {
#define TAIL(t) \
  case t: if (t < w) band_pv_tile(nv, t, a, lda, sg, live, bj, bsk, bsc, cj, ldc, rs); break;
    TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7) TAIL(8) TAIL(9) TAIL(10) TAIL(11)
#undef TAIL
  default: break;
  }
}

/* P V: the live vectors from the first to the last one as one tile row (a
 * vector in between with no keys is neither summed nor stored) */
static void gemm_t_rescale_band(const float *a, int64_t lda, int nv, const int64_t *kb, const int64_t *ke,
                                const float *b, int64_t bsk, int64_t bsc, int64_t n, float *c, int64_t ldc,
                                const float *rs) {
  int f = 0, last = -1;
  for (int v = 0; v < nv; v++)
    if (kb[v] < ke[v]) {
      if (last < 0) f = v;
      last = v;
    }
  if (last < 0) return;
  int span = last - f + 1;
  band_segs sg;
  band_segments(span, kb + f, ke + f, &sg);
  unsigned live = 0;
  for (int v = 0; v < span; v++)
    if (kb[f + v] < ke[f + v]) live |= 1u << v;
  a += 16 * f, c += 16 * f, rs += 16 * f;
  switch (span) {
  case 4: band_pv_columns(4, a, lda, &sg, live, b, bsk, bsc, n, c, ldc, rs); break;
  case 3: band_pv_columns(3, a, lda, &sg, live, b, bsk, bsc, n, c, ldc, rs); break;
  case 2: band_pv_columns(2, a, lda, &sg, live, b, bsk, bsc, n, c, ldc, rs); break;
  default: band_pv_columns(1, a, lda, &sg, live, b, bsk, bsc, n, c, ldc, rs); break;
  }
}

/* The transposed copy (src/core/cpu.h): 16 rows at a time by one gather per
 * column (indices in 32 bits; a stride too large for them: element by
 * element). */
static void transpose(const float *src, int64_t s0, int64_t s1, int64_t rows, int64_t cols, float *dst, int64_t ld,
                      float scale) {
  if (s0 > INT32_MAX / 16 || s0 < -(INT32_MAX / 16)) {
    for (int64_t c = 0; c < cols; c++)
      for (int64_t r = 0; r < rows; r++) dst[c * ld + r] = src[r * s0 + c * s1] * scale;
    return;
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)s0));
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < rows; r += 16) {
    __mmask16 k = rows - r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (rows - r)) - 1u);
    const float *sr = src + r * s0;
    for (int64_t c = 0; c < cols; c++) {
      __m512 x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, sr + c * s1, 4);
      _mm512_mask_storeu_ps(dst + c * ld + r, k, _mm512_mul_ps(x, sc));
    }
  }
}

static void exp_minus(float *x, int64_t n, float m) {
  __m512 mv = _mm512_set1_ps(m);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv)));
  if (j < n) { /* the tail through a mask */
    __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
    _mm512_mask_storeu_ps(x + j, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv)));
  }
}

/* Decoding: 16-float vectors, partial ones through a lane mask; 4 rows x 4
 * vectors of output accumulators (16 of the 32 registers). The AVX2 set
 * uses 16-float vectors too (pairs of registers) with the same trees for
 * vsum and vhmax: the two give the same bits. */
#define VEC __m512
#define VW 16
#define DOT_ROWS 4
#define DOT_QREGS 16
#define AXPY_ROWS 4
#define AXPY_VECS 4
static inline __m512 vzero(void) { return _mm512_setzero_ps(); }
static inline __m512 vload(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 vload_n(const float *p, int64_t n) {
  return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vstore(float *p, __m512 x) { _mm512_storeu_ps(p, x); }
static inline void vstore_n(float *p, __m512 x, int64_t n) {
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), x);
}
static inline __m512 vset1(float x) { return _mm512_set1_ps(x); }
static inline __m512 vload_fill(const float *p, int64_t n, float f) {
  return _mm512_mask_loadu_ps(_mm512_set1_ps(f), (__mmask16)((1u << n) - 1u), p);
}
static inline __m512 vadd(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
static inline __m512 vsub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
static inline __m512 vmul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
static inline __m512 vmax(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
static inline __m512 vexp(__m512 x) { return exp16(x); }
static inline float vhmax(__m512 x) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(x),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline __m512 vfma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(__m512 x) { /* halves, then quarters, ...: a fixed tree */
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
/* out = vsum(a), vsum(b), vsum(c), vsum(d): the same tree, the four vectors
 * side by side (256-bit halves, then 128-bit quarters, then within each
 * quarter), so a row's score has the same bits in a group of 4 as alone, and
 * as the AVX2 set's (src/core/kernels_avx2.c). */
#define HAVE_VSUM4 1
static inline void vsum4(__m512 a, __m512 b, __m512 c, __m512 d, float *out) {
  /* x_i + x_(i+8): [a | b] and [c | d] as 8-lane halves */
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  /* y_i + y_(i+4): [a | b | c | d] as 4-lane quarters */
  __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2))); /* z0 + z2, z1 + z3 */
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(2, 3, 0, 1))); /* then those two */
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_maskz_compress_ps((__mmask16)0x1111, z)));
}
#include "kernel_decode.h"

/* FMA throughput (cpu.h): 16 chains of 16 lanes, one fused step each, kept
 * in registers (FMA latency 4 cycles x 2 ports needs 8 chains; 16 leave
 * headroom and fit the 32 registers). */
#define FMA_CHAINS 16
static void fma_chains(float *x, int64_t n, float a, float b) {
  __m512 v[FMA_CHAINS];
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
#pragma GCC unroll 16
  for (int j = 0; j < FMA_CHAINS; j++) v[j] = _mm512_loadu_ps(x + 16 * j);
  for (int64_t i = 0; i < n; i++) {
#pragma GCC unroll 16
    for (int j = 0; j < FMA_CHAINS; j++) v[j] = _mm512_fmadd_ps(v[j], va, vb);
  }
#pragma GCC unroll 16
  for (int j = 0; j < FMA_CHAINS; j++) _mm512_storeu_ps(x + 16 * j, v[j]);
}

const attn_flash_kernels attn_kernels_avx512 = {"avx512",    gemm_t,    gemm_t_rescale, softmax_step16,  softmax_step, exp_minus,
                                               rows_dot,    softmax_row, rows_axpy, 16 * FMA_CHAINS, fma_chains,
                                               gemm_t_band, softmax_band, gemm_t_rescale_band, transpose, libm_exp_minus};
