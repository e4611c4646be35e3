/* Scaled dot-product attention, "math" kernel, a driver over the attention
 * core (src/core/sdpa_common.h: operands, q scaling, bias/mask/visible keys of a score
 * tile): per (batch, head) slice, in blocks of at most ATTN_ROW_BLOCK query
 * rows:
 *   Qs = fl(q * scale)            [R, E]    (packed, as torch 1.13 scales q)
 *   S  = Qs k^T                   [R, Lk]   (cblas_sgemm, k strided or packed)
 *   S  = S + bias, hidden or not visible -> -inf  (attn_sdpa_modify_tile)
 *        (a block mask: both products and the softmax over the span of
 *        key blocks the rows see; the weights outside it are 0)
 *   row softmax (all hidden -> zeros; lse when asked for; glibc's expf
 *        bits, eight at a time: the set's libm_exp_minus), dropout
 *   O  = S v                      [R, Ev]   (cblas_sgemm)
 *
 * Threads: the (slice, row block) items of the flattened batch run in one
 * OpenMP parallel for, and every cblas_sgemm call runs single-threaded.
 * OpenBLAS's threaded sgemm does not give the same bits for different thread
 * counts (seen on the Zen core: 1 vs 2 threads differ in the last bit), so a
 * lone slice is split into fixed-size row blocks (independent of the thread
 * count) instead of being handed to a threaded BLAS: the bits of the result
 * are the same for any OMP_NUM_THREADS. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cpu.h"
#include "rng.h"
#include "row_max.h"
#include "threads.h"

/* Query rows per work item; a constant, so the split (and the bits) never
 * depend on the thread count. */
#define ATTN_ROW_BLOCK 64


/* How a [rows, cols] matrix with strides (sr, sc) goes to row-major BLAS
 * (NoTrans with ld = sr, or Trans with ld = sc); 0 when it must be packed. */
static int blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, CBLAS_TRANSPOSE *tr, int64_t *ld) {
  if ((sc == 1 || cols == 1) && (sr >= (cols > 1 ? cols : 1) || rows == 1)) {
    *tr = CblasNoTrans;
    *ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
  } else if ((sr == 1 || rows == 1) && (sc >= (rows > 1 ? rows : 1) || cols == 1)) {
    *tr = CblasTrans;
    *ld = cols == 1 ? (rows > 1 ? rows : 1) : sc;
  } else {
    return 0;
  }
  return *ld <= INT_MAX;
}

/* Everything a slice needs, shared read-only by the threads. */
typedef struct sdpa_ctx {
  attn_sdpa_problem p;             /* the shapes and expanded operands */
  CBLAS_TRANSPOSE ktr, vtr;        /* k^T as [E, Lk] and v as [Lk, Ev], when not packed */
  int64_t ldk, ldv;
  int pack_k, pack_v;
  attn_tensor *out, *weights;
  int64_t nblk;                    /* row blocks per slice */
  /* per-thread scratch block, in floats: qs, kp, vp, s (those used), f */
  size_t off_kp, off_vp, off_s, off_f;
} sdpa_ctx;

/* s [lk] -> softmax(s) with dropout, in place; 1 when every key is hidden */
int attn_softmax_dropout_row(float *s, int64_t lk, double dropout_p, attn_dropout_draw dropout_draw, int64_t position,
                             float *f, float *lse) {
  /* hidden keys at the end of the row (the causal mask's) are exp(-inf) = 0
   * and add 0 to the sum: they are zeroed, not computed (the same bits) */
  int64_t visible = lk;
  while (visible > 0 && s[visible - 1] == -INFINITY) visible--;
  float mx = attn_row_max(s, visible);
  if (mx != mx) visible = lk; /* NaN everywhere, the hidden keys' too */
  if (mx == -INFINITY) { /* every key hidden (or no key): zeros, not NaN */
    memset(s, 0, (size_t)lk * sizeof(float));
    if (lse) *lse = -INFINITY;
    return 1;
  }
  memset(s + visible, 0, (size_t)(lk - visible) * sizeof(float));
  /* expf(s - max) row by row (one call per score gave these bits): exp(-inf
   * - max) = 0 unless max is NaN */
  attn_cpu_kernels()->libm_exp_minus(s, visible, mx);
  double sum = 0.0;
  for (int64_t j = 0; j < visible; j++) sum += (double)s[j];
  if (lse) *lse = attn_sdpa_lse_of(mx, sum);
  float inv = (float)(1.0 / sum);
  for (int64_t j = 0; j < visible; j++) s[j] *= inv;
  if (dropout_p > 0.0) {
    attn_dropout_factors(dropout_draw, dropout_p, position, lk, f);
    for (int64_t j = 0; j < visible; j++) s[j] *= f[j];
  }
  return 0;
}

/* dst[j * d0 + d * d1] = src[j * s0 + d * s1] for j < rows, d < cols. */
static void pack(const float *src, int64_t rows, int64_t cols, int64_t s0, int64_t s1, float *dst, int64_t d0,
                 int64_t d1) {
  for (int64_t j = 0; j < rows; j++)
    for (int64_t d = 0; d < cols; d++) dst[j * d0 + d * d1] = src[j * s0 + d * s1];
}

/* probs row = the softmax row s before dropout; then s gets its dropout
 * (factors of the call's positions position ..., f [Lk] scratch). */
static void keep_probs(const attn_sdpa_problem *p, float *s, float *probs, int64_t position, int hidden, float *f) {
  memcpy(probs, s, (size_t)p->lk * sizeof(float));
  if (p->dropout_p > 0.0 && !hidden) {
    attn_dropout_factors(p->dropout_draw, p->dropout_p, position, p->lk, f);
    for (int64_t j = 0; j < p->lk; j++) s[j] *= f[j];
  }
}

/* Work item `item` (slice bi = item / nblk, rows r0 .. r0 + R - 1) with the
 * calling thread's scratch block w. */
static void run_item(const sdpa_ctx *c, int64_t item, float *w) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, lk = p->lk, e = p->e, ev = p->ev;
  int64_t bi = item / c->nblk, r0 = (item % c->nblk) * ATTN_ROW_BLOCK;
  int64_t rows = lq - r0 < ATTN_ROW_BLOCK ? lq - r0 : ATTN_ROW_BLOCK;
  attn_sdpa_slice sl;
  attn_sdpa_slice_at(p, bi, &sl);
  float *qs = w;
  attn_sdpa_load_q(p, &sl, r0, rows, qs, e, 1);

  const float *k = sl.k;
  int64_t ldk = c->ldk;
  if (c->pack_k) { /* k^T packed as [E, Lk] */
    pack(k, lk, e, attn_sdpa_row_stride(p, &p->k), attn_sdpa_col_stride(p, &p->k), w + c->off_kp, 1, lk);
    k = w + c->off_kp;
    ldk = lk;
  }
  const float *v = sl.v;
  int64_t ldv = c->ldv;
  if (c->pack_v) { /* v packed as [Lk, Ev] */
    pack(v, lk, ev, attn_sdpa_row_stride(p, &p->v), attn_sdpa_col_stride(p, &p->v), w + c->off_vp, ev, 1);
    v = w + c->off_vp;
    ldv = ev;
  }
  float *s = c->weights ? c->weights->data + (bi * lq + r0) * lk : w + c->off_s;
  float *o = c->out->data + (bi * lq + r0) * ev;
  float *lse = p->lse ? p->lse->data + bi * lq + r0 : NULL;

  /* rows whose keys are all hidden: their output is zeros, which the sgemm
   * below would not give when v holds NaN or inf (0 * NaN) */
  unsigned char hidden[ATTN_ROW_BLOCK];
  int any_hidden = 0;
  /* a block mask: the products and the softmax run over the span of key
   * blocks some row of the item sees; outside it every weight is 0 */
  attn_key_range span = attn_sdpa_block_keys(p, &sl, r0, rows, 0, lk);
  int64_t kb = span.begin, kn = span.end - span.begin;
  if (lk > 0) {
    if (kn > 0 && e > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, c->pack_k ? CblasNoTrans : c->ktr, (blasint)rows, (blasint)kn,
                  (blasint)e, 1.0f, qs, (blasint)e, k + (c->pack_k || c->ktr == CblasNoTrans ? kb : kb * ldk),
                  (blasint)ldk, 0.0f, s + kb, (blasint)lk);
    if (kn > 0 && e == 0)
      for (int64_t i = 0; i < rows; i++) memset(s + i * lk + kb, 0, (size_t)kn * sizeof(float));
    if (kn > 0) attn_sdpa_modify_tile(p, &sl, r0, rows, kb, kn, s + kb, lk, 1);
    for (int64_t i = 0; i < rows; i++) {
      int64_t position = (bi * lq + r0 + i) * lk;
      float *si = s + i * lk;
      /* with probs asked for, the softmax is kept before dropout multiplies it (the same bits); outside the
       * span the weights are 0 */
      hidden[i] = (unsigned char)attn_softmax_dropout_row(si + kb, kn, p->probs ? 0.0 : p->dropout_p, p->dropout_draw,
                                                          position + kb, w + c->off_f, lse ? lse + i : NULL);
      if (kb > 0) memset(si, 0, (size_t)kb * sizeof(float));
      if (kb + kn < lk) memset(si + kb + kn, 0, (size_t)(lk - kb - kn) * sizeof(float));
      if (p->probs) keep_probs(p, s + i * lk, p->probs->data + position, position, hidden[i], w + c->off_f);
      any_hidden |= hidden[i];
    }
  } else if (lse) { /* no key: every row hidden */
    for (int64_t i = 0; i < rows; i++) lse[i] = -INFINITY;
  }
  if (ev > 0) {
    if (kn > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, c->pack_v ? CblasNoTrans : c->vtr, (blasint)rows, (blasint)ev,
                  (blasint)kn, 1.0f, s + kb, (blasint)lk, v + (c->pack_v || c->vtr == CblasNoTrans ? kb * ldv : kb),
                  (blasint)ldv, 0.0f, o, (blasint)ev);
    else
      memset(o, 0, (size_t)(rows * ev) * sizeof(float));
    if (any_hidden)
      for (int64_t i = 0; i < rows; i++)
        if (hidden[i]) memset(o + i * ev, 0, (size_t)ev * sizeof(float));
  }
}

/* q, k, v, opts -> out [B..., Lq, Ev], weights [B..., Lq, Lk] */
attn_status attn_sdpa_math(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights) {
  sdpa_ctx c;
  memset(&c, 0, sizeof c);
  attn_status st = attn_sdpa_prepare(q, k, v, opts, out, weights, &c.p);
  if (st != ATTN_OK) return st;
  c.out = out;
  c.weights = weights;

  int64_t nb = attn_sizes_product(c.p.nbatch, c.p.batch);
  if (nb == 0 || c.p.lq == 0) return ATTN_OK;

  int nbd = c.p.nbatch;
  c.pack_k = !blas_layout(c.p.e, c.p.lk, c.p.k.stride[nbd + 1], c.p.k.stride[nbd], &c.ktr, &c.ldk);
  c.pack_v = !blas_layout(c.p.lk, c.p.ev, c.p.v.stride[nbd], c.p.v.stride[nbd + 1], &c.vtr, &c.ldv);

  /* per-thread block: qs [R, E], kp [E, Lk], vp [Lk, Ev], s [R, Lk], f [Lk] */
  int64_t rb = c.p.lq < ATTN_ROW_BLOCK ? c.p.lq : ATTN_ROW_BLOCK;
  c.nblk = (c.p.lq + ATTN_ROW_BLOCK - 1) / ATTN_ROW_BLOCK;
  size_t block = 0;
  int ok = attn_sdpa_add_floats(&block, rb, c.p.e);
  c.off_kp = block;
  if (c.pack_k) ok = ok && attn_sdpa_add_floats(&block, c.p.e, c.p.lk);
  c.off_vp = block;
  if (c.pack_v) ok = ok && attn_sdpa_add_floats(&block, c.p.lk, c.p.ev);
  c.off_s = block;
  if (!weights) ok = ok && attn_sdpa_add_floats(&block, rb, c.p.lk);
  c.off_f = block;
  ok = ok && attn_sdpa_add_floats(&block, c.p.lk, 1);
  attn_sdpa_work work;
  if ((st = attn_sdpa_plan_work(&c.p, c.nblk, block, ok, &work)) != ATTN_OK) return st;

#pragma omp parallel num_threads(work.nthreads) if (work.nthreads > 1)
  {
    /* BLAS single-threaded in here, even in a team of one (this ICV is the
     * region's own copy: the caller's thread count is left as it was). */
    omp_set_num_threads(1);
    float *w = work.scratch + work.block * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t it = 0; it < work.items; it++) run_item(&c, it, w);
  }
  free(work.scratch);
  return ATTN_OK;
}


