/* The decoding kernels of every set (src/core/cpu.h: rows_dot,
 * softmax_row, rows_axpy), included by kernels_scalar.c, kernels_avx2.c and
 * kernels_avx512.c after they define a vector of VW floats:
 *   VEC, vzero(), vload(p), vload_n(p, n) (n < VW floats, the rest 0),
 *   vload_fill(p, n, f) (the rest f), vstore(p, x), vstore_n(p, x, n),
 *   vset1(f), vfma(a, b, c) (a b + c), vadd, vsub, vmul, vmax (either
 *   operand when one is NaN), vexp (the set's e^x for x <= 0, -inf -> 0,
 *   NaN stays NaN), vsum(x) (the lanes' sum, in a fixed order), vhmax(x),
 *   optionally vsum4(a, b, c, d, out) (four sums at once, HAVE_VSUM4),
 * and DOT_ROWS (query rows per dot group, <= 4), AXPY_ROWS x AXPY_VECS
 * (accumulators of rows_axpy, in registers). Not a public header.
 *
 * The two vector sets both use VW = 16 (AVX2: a pair of 8-float registers)
 * and the same trees for vsum, vsum4 and vhmax, so every partial sum and its
 * reduction are the same: AVX2 and AVX-512 give the same bits here, as in
 * the tile kernels, whose lanes are query rows and need no reduction.
 *
 * Decoding reads each K and V row once for a few query rows (R = g Lq <= 8),
 * so these work row-wise: a K row is loaded once and dotted with the R
 * queries; a V row is loaded once and added, scaled, into R output rows held
 * in registers across the whole key block. Every sum has a fixed order given
 * by the sizes (E or the key count), never by the threads. */
#ifndef ATTN_KERNEL_DECODE_H
#define ATTN_KERNEL_DECODE_H

/* out[i ld] = q_i . kj for nr (constant) query rows q_i = q + i e. */
static inline __attribute__((always_inline)) void dot_group(int nr, const float *q, int64_t e, const float *kj,
                                                            float *out, int64_t ld) {
  VEC acc[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) acc[i] = vzero();
  int64_t d = 0;
  for (; d + VW <= e; d += VW) {
    VEC kv = vload(kj + d);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
      if (i < nr) acc[i] = vfma(vload(q + i * e + d), kv, acc[i]);
  }
  if (d < e) {
    VEC kv = vload_n(kj + d, e - d);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
      if (i < nr) acc[i] = vfma(vload_n(q + i * e + d, e - d), kv, acc[i]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
    if (i < nr) out[i * ld] = vsum(acc[i]);
}

#if defined(DOT_QREGS) && DOT_QREGS > 0
/* rows_dot for E = 64 and nr (constant) rows whose queries fit DOT_QREGS
 * registers: loaded once for the whole block. The same operations, in the
 * same order, as dot_group: the same bits. */
#define DOT_NV (64 / VW)
static inline __attribute__((always_inline)) void dot_block64(int nr, const float *q, const float *k, int64_t sk,
                                                              int64_t kn, float *st, int64_t ld) {
  VEC qv[4][DOT_NV];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
#pragma GCC unroll 8
    for (int x = 0; x < DOT_NV; x++)
      if (i < nr) qv[i][x] = vload(q + i * 64 + x * VW);
  for (int64_t j = 0; j < kn; j++) {
    const float *kj = k + j * sk;
    VEC acc[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) acc[i] = vzero();
#pragma GCC unroll 8
    for (int x = 0; x < DOT_NV; x++) {
      VEC kv = vload(kj + x * VW);
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++)
        if (i < nr) acc[i] = vfma(qv[i][x], kv, acc[i]);
    }
#ifdef HAVE_VSUM4
    if (nr == 4) { /* the four sums in one tree */
      float sums[4];
      vsum4(acc[0], acc[1], acc[2], acc[3], sums);
      for (int i = 0; i < 4; i++) st[i * ld + j] = sums[i];
      continue;
    }
#endif
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
      if (i < nr) st[i * ld + j] = vsum(acc[i]);
  }
}
#endif

static void rows_dot(const float *q, int64_t rows, int64_t e, const float *k, int64_t sk, int64_t kn, float *st,
                     int64_t ld) {
#if defined(DOT_QREGS) && DOT_QREGS > 0
  if (e == 64) { /* the common head size: queries in registers */
    enum { GROUP = DOT_QREGS / DOT_NV < 4 ? DOT_QREGS / DOT_NV : 4 };
    int64_t r = 0;
    for (; r + GROUP <= rows; r += GROUP) dot_block64(GROUP, q + r * 64, k, sk, kn, st + r * ld, ld);
    switch ((int)(rows - r)) {
    case 0: break;
    case 1: dot_block64(1, q + r * 64, k, sk, kn, st + r * ld, ld); break;
    case 2: dot_block64(GROUP > 2 ? 2 : 1, q + r * 64, k, sk, kn, st + r * ld, ld); break;
    default: dot_block64(GROUP > 3 ? 3 : 1, q + r * 64, k, sk, kn, st + r * ld, ld); break;
    }
    return;
  }
#endif
  for (int64_t j = 0; j < kn; j++) {
    const float *kj = k + j * sk;
    int64_t r = 0;
    for (; r + DOT_ROWS <= rows; r += DOT_ROWS) dot_group(DOT_ROWS, q + r * e, e, kj, st + r * ld + j, ld);
    switch ((int)(rows - r)) { /* a constant row count for each tail */
    case 0: break;
    case 1: dot_group(1, q + r * e, e, kj, st + r * ld + j, ld); break;
    case 2: dot_group(2, q + r * e, e, kj, st + r * ld + j, ld); break;
    default: dot_group(3, q + r * e, e, kj, st + r * ld + j, ld); break;
    }
  }
}

static void softmax_row(float *s, int64_t n, float *m, float *l, float *rescale) {
  VEC bm = vset1(-INFINITY);
  int64_t j = 0;
  for (; j + VW <= n; j += VW) bm = vmax(vload(s + j), bm);
  if (j < n) bm = vmax(vload_fill(s + j, n - j, -INFINITY), bm);
  float mx = vhmax(bm), mold = *m;
  float mnew = mx > mold ? mx : mold; /* a NaN score makes the sum, so the row, NaN */
  VEC msub = vset1(mnew == -INFINITY ? 0.0f : mnew); /* nothing visible yet: exp(-inf - 0) = 0, not NaN */
  VEC sum = vzero();
  for (j = 0; j + VW <= n; j += VW) {
    VEC x = vexp(vsub(vload(s + j), msub));
    vstore(s + j, x);
    sum = vadd(sum, x);
  }
  if (j < n) {
    VEC x = vexp(vsub(vload_fill(s + j, n - j, -INFINITY), msub));
    vstore_n(s + j, x, n - j);
    sum = vadd(sum, x);
  }
  float kept = *l * vsum(vexp(vsub(vload_fill(&mold, 1, -INFINITY), msub))); /* 0 where mold = -inf */
  float lnew = kept + vsum(sum);
  VEC inv = vset1(lnew == 0.0f ? 0.0f : 1.0f / lnew);
  for (j = 0; j + VW <= n; j += VW) vstore(s + j, vmul(vload(s + j), inv));
  if (j < n) vstore_n(s + j, vmul(vload_n(s + j, n - j), inv), n - j);
  *rescale = kept * (lnew == 0.0f ? 0.0f : 1.0f / lnew);
  *l = lnew;
  *m = mnew;
}

/* o_i[0, w) += sum over j < kn (increasing) of p[i ld + j] v_j[0, w) for nr
 * (constant) rows o_i = o + i ldo; w <= AXPY_VECS VW (full: w equals it). */
static inline __attribute__((always_inline)) void axpy_group(int nr, int full, const float *p, int64_t ld,
                                                             const float *v, int64_t sv, int64_t kn, int64_t w,
                                                             float *o, int64_t ldo) {
  VEC acc[AXPY_ROWS][AXPY_VECS];
#pragma GCC unroll 8
  for (int i = 0; i < AXPY_ROWS; i++)
#pragma GCC unroll 8
    for (int x = 0; x < AXPY_VECS; x++) {
      if (i >= nr) break;
      int64_t n = w - x * VW;
      acc[i][x] = full || n >= VW ? vload(o + i * ldo + x * VW) : (n > 0 ? vload_n(o + i * ldo + x * VW, n) : vzero());
    }
  for (int64_t j = 0; j < kn; j++) {
    const float *vj = v + j * sv;
    VEC vv[AXPY_VECS];
#pragma GCC unroll 8
    for (int x = 0; x < AXPY_VECS; x++) {
      int64_t n = w - x * VW;
      vv[x] = full || n >= VW ? vload(vj + x * VW) : (n > 0 ? vload_n(vj + x * VW, n) : vzero());
    }
#pragma GCC unroll 8
    for (int i = 0; i < AXPY_ROWS; i++) {
      if (i >= nr) break;
      VEC pb = vset1(p[i * ld + j]);
#pragma GCC unroll 8
      for (int x = 0; x < AXPY_VECS; x++) acc[i][x] = vfma(vv[x], pb, acc[i][x]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < AXPY_ROWS; i++)
#pragma GCC unroll 8
    for (int x = 0; x < AXPY_VECS; x++) {
      if (i >= nr) break;
      int64_t n = w - x * VW;
      if (full || n >= VW)
        vstore(o + i * ldo + x * VW, acc[i][x]);
      else if (n > 0)
        vstore_n(o + i * ldo + x * VW, acc[i][x], n);
    }
}

/* Row groups of AXPY_ROWS (a constant count for the tail) over one column block. */
static inline __attribute__((always_inline)) void axpy_columns(int full, const float *p, int64_t ld, int64_t rows,
                                                               const float *v, int64_t sv, int64_t kn, int64_t w,
                                                               float *o, int64_t ldo) {
  int64_t r = 0;
  for (; r + AXPY_ROWS <= rows; r += AXPY_ROWS)
    axpy_group(AXPY_ROWS, full, p + r * ld, ld, v, sv, kn, w, o + r * ldo, ldo);
  switch ((int)(rows - r)) {
  case 0: break;
  case 1: axpy_group(1, full, p + r * ld, ld, v, sv, kn, w, o + r * ldo, ldo); break;
  case 2: axpy_group(AXPY_ROWS > 2 ? 2 : 1, full, p + r * ld, ld, v, sv, kn, w, o + r * ldo, ldo); break;
  default: axpy_group(AXPY_ROWS > 3 ? 3 : 1, full, p + r * ld, ld, v, sv, kn, w, o + r * ldo, ldo); break;
  }
}

static void rows_axpy(const float *p, int64_t ld, int64_t rows, const float *v, int64_t sv, int64_t kn, int64_t ev,
                      float *o) {
  const int64_t block = (int64_t)AXPY_VECS * VW;
  int64_t d = 0;
  for (; d + block <= ev; d += block) axpy_columns(1, p, ld, rows, v + d, sv, kn, block, o + d, ev);
  if (d < ev) axpy_columns(0, p, ld, rows, v + d, sv, kn, ev - d, o + d, ev);
}

#endif
