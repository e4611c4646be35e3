/* Split-K decoding for the fused kernel (src/core/flash_decode.h), a driver
 * over the shared attention core (src/core/sdpa_common.h) and the fused
 * kernel's shared tiles (src/core/flash_common.h), with flash's
 * micro-kernels (src/core/cpu.h); the tiled driver (src/core/flash.c) is its
 * peer, not its caller: the dispatcher (src/core/sdpa_dispatch.c) picks one.
 *
 * A group is the g query heads that read one kv head (g = 1 without GQA): the
 * query slices gi g .. gi g + g - 1. Its R = g Lq query rows (R <= BQ) are
 * stacked in one transposed query tile, so each K and V row is loaded once
 * for all of them. The keys are cut into chunks of ATTN_DECODE_CHUNK; a work
 * item is one (group, chunk):
 *   Qt = fl(q * scale)^T of the g heads     [E, R]  (R padded to 16)
 *   for each key block [k0, k0 + bk) of the chunk (within the keys the rows
 *   see, attn_sdpa_rows_keys), as flash.c's key step:
 *     St = K_blk Qt                         [bk, R]  one K read for g heads
 *     St: softcap, bias, ALiBi, mask, visible range per head (attn_sdpa_modify_tile
 *       on the head's columns, with the head's slice)
 *     online softmax (m, l, normalised Ot), dropout, Ot = a Ot + V_blk^T Pt
 *   partial[item][r] = (m_r, l_r, Ot[:, r])  [R, Ev + 2]
 * For R <= 8 (Lq = 1 decoding, GQA groups up to 8 heads) the item runs row
 * by row instead (run_chunk_rows): the tile products above pad R to 16 rows,
 * 16 times the arithmetic of one row, which made Lq = 1 compute-bound:
 *   Q = fl(q * scale) [R, E], O [R, Ev], S [R, bk] row-major; per key block:
 *     S = Q K_blk^T    rows_dot: each K row loaded once, dotted with the R
 *                      query rows (E = 64: the queries stay in registers)
 *     S: the same modifications; softmax_row per row (vectors over keys)
 *     O = a O + P V_blk  rows_axpy: each V row loaded once, O in registers
 *   (strided K or V rows are packed per block first: the same bits as a
 *   contiguous copy).
 *   Measured (one thread, K/V of 8192 keys in L2, E 64, AVX-512, load ~7 on
 *   2 cores): 7.2 ns per key row for R = 1 (16.4 with the padded tiles), 13.4
 *   ns for R = 4 (21.1); a key row's K and V are 512 bytes, so one thread
 *   computes at ~70 GB/s (R = 1) and decoding is left to memory. scripts/
 *   bench.lua --threads 2 (Lk 65536, 8 kv heads), x the same run's membw:
 *   decode 0.98, 1.19, 0.80 (three runs at load 2.6; 32.6 GB/s of membw's
 *   33.3 in the first) and 1.00, 1.00 (load 7; 0.63 before this path);
 *   decode_gqa 0.98, 0.38, 0.66 and 0.91, 0.72: with R = 4 rows it computes
 *   twice as long per key, so a core shared with other jobs costs it more.
 *   The math kernel: 0.30 to 0.40 x and 0.08 to 0.13 x.
 * then per (group, row): M = max_c m_c, L = sum_c exp(m_c - M) l_c,
 *   out = sum_c exp(m_c - M) l_c Ot_c / L, lse = M + log L (double sums),
 *   zeros and -inf where no chunk saw a key.
 *
 * Error: as flash's (the same steps within a chunk) plus one rescale per
 * chunk in double: within 1e-5 of the math kernel on the specs
 * (spec/sdpa_variants_spec.lua, spec/sdpa_decode_spec.lua).
 * Threads: both passes are parallel for loops over items whose sums run in a
 * fixed order (the chunk size and the merge order are constants): the bits
 * of out do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "flash_common.h"
#include "flash_decode.h"
#include "rng.h"
#include "threads.h"

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK
#define MR ATTN_KERNEL_ROWS
#define CHUNK ATTN_DECODE_CHUNK

/* The keys of chunk ci that the query rows see (begin >= end: none). */
static attn_key_range chunk_keys(const attn_sdpa_problem *p, int64_t ci) {
  attn_key_range seen = attn_sdpa_rows_keys(p, 0, p->lq);
  attn_key_range r = {ci * CHUNK > seen.begin ? ci * CHUNK : seen.begin,
                      (ci + 1) * CHUNK < seen.end ? (ci + 1) * CHUNK : seen.end};
  return r;
}

typedef struct decode_ctx {
  const attn_sdpa_problem *p;
  const attn_flash_kernels *kr;
  int64_t g, rows, rows_p, nchunk; /* heads per group, stacked rows R, padded, chunks per group */
  int row_wise;                    /* run_chunk_rows (few rows) instead of run_chunk */
  attn_flash_tile off;             /* the fused kernel's per-thread scratch (flash_common.h) */
  size_t off_kp, off_vp;           /* then packed K and V blocks */
  float *partial;                  /* [groups * nchunk][R][Ev + 2]: m, l, Ot row */
} decode_ctx;

/* Ask for the next key block's K and V rows [k0, min(k0 + BK, ke)) while this
 * one is computed: decoding reads each row once, so its speed is the memory's,
 * and the micro-kernel's access (12 rows at a time, across them) is one the
 * hardware prefetcher follows poorly. Only for contiguous rows. */
static void prefetch_block(const attn_sdpa_problem *p, const float *k, const float *v, int64_t k0, int64_t ke,
                           int64_t sk0, int64_t sv0) {
  int64_t kn = ke - k0 < BK ? ke - k0 : BK;
  if (kn <= 0) return;
  if (attn_sdpa_col_stride(p, &p->k) == 1 && sk0 == p->e)
    for (int64_t x = 0; x < kn * p->e; x += 16) __builtin_prefetch(k + k0 * sk0 + x, 0, 3);
  if (attn_sdpa_col_stride(p, &p->v) == 1 && sv0 == p->ev)
    for (int64_t x = 0; x < kn * p->ev; x += 16) __builtin_prefetch(v + k0 * sv0 + x, 0, 3);
}

/* Work item (group gi, chunk ci) with the calling thread's scratch w. */
static void run_chunk(const decode_ctx *c, int64_t item, float *w) {
  const attn_sdpa_problem *p = c->p;
  int64_t gi = item / c->nchunk, ci = item % c->nchunk;
  int64_t g = c->g, lq = p->lq, e = p->e, ev = p->ev, rows = c->rows, rows_p = c->rows_p;
  float *qt = w, *st = w + c->off.s, *ot = w + c->off.o, *m = w + c->off.m, *l = w + c->off.l, *a = w + c->off.a,
        *f = w + c->off.f;
  attn_sdpa_slice sl[BQ];
  for (int64_t hh = 0; hh < g; hh++) attn_sdpa_slice_at(p, gi * g + hh, &sl[hh]);
  for (int64_t hh = 0; hh < g; hh++) attn_sdpa_load_q(p, &sl[hh], 0, lq, qt + hh * lq, 1, BQ);
  for (int64_t d = 0; d < e; d++)
    for (int64_t i = rows; i < rows_p; i++) qt[d * BQ + i] = 0.0f;
  for (int64_t i = 0; i < rows_p; i++) m[i] = -INFINITY, l[i] = 0.0f;
  for (int64_t d = 0; d < ev; d++) memset(ot + d * BQ, 0, (size_t)rows_p * sizeof(float));
  int64_t sk0 = attn_sdpa_row_stride(p, &p->k), sk1 = attn_sdpa_col_stride(p, &p->k);
  int64_t sv0 = attn_sdpa_row_stride(p, &p->v), sv1 = attn_sdpa_col_stride(p, &p->v);
  const float *k = sl[0].k, *v = sl[0].v; /* the group's kv head: the same for its g slices */

  attn_key_range keys = chunk_keys(p, ci);
  int64_t kb = keys.begin, ke = keys.end;
  for (int64_t k0 = kb; k0 < ke; k0 += BK) {
    int64_t kn = ke - k0 < BK ? ke - k0 : BK;
    if (sl[0].blocks.kind) { /* a block mask: a key block empty for every head of the group is skipped */
      int seen_any = 0;
      for (int64_t hh = 0; hh < g && !seen_any; hh++) {
        attn_key_range bk = attn_sdpa_block_keys(p, &sl[hh], 0, lq, k0, k0 + kn);
        seen_any = bk.end > bk.begin;
      }
      if (!seen_any) continue;
    }
    prefetch_block(p, k, v, k0 + kn, ke, sk0, sv0);
    /* St = K_blk Qt */
    if (e > 0)
      c->kr->gemm_t(qt, BQ, e, rows_p, k + k0 * sk0, sk1, sk0, kn, st, BQ, 0);
    else
      for (int64_t j = 0; j < kn; j++) memset(st + j * BQ, 0, (size_t)rows_p * sizeof(float));
    for (int64_t hh = 0; hh < g; hh++) attn_sdpa_modify_tile(p, &sl[hh], 0, lq, k0, kn, st + hh * lq, 1, BQ);
    for (int64_t r = 0; r < rows_p; r += MR) c->kr->softmax_step16(st + r, BQ, kn, m + r, l + r, a + r);
    if (p->dropout_p > 0.0) {
      for (int64_t r = 0; r < rows; r++) {
        int64_t bi = gi * g + r / lq, i = r % lq;
        attn_dropout_factors(p->dropout_draw, p->dropout_p, (bi * lq + i) * p->lk + k0, kn, f);
        for (int64_t j = 0; j < kn; j++) st[j * BQ + r] *= f[j];
      }
    }
    for (int64_t d = 0; d < ev; d++)
      for (int64_t r = 0; r < rows_p; r++) ot[d * BQ + r] *= a[r];
    c->kr->gemm_t(st, BQ, kn, rows_p, v + k0 * sv0, sv0, sv1, ev, ot, BQ, 1);
  }
  float *part = c->partial + item * rows * (ev + 2);
  for (int64_t r = 0; r < rows; r++) {
    float *pr = part + r * (ev + 2);
    pr[0] = m[r];
    pr[1] = l[r];
    for (int64_t d = 0; d < ev; d++) pr[2 + d] = ot[d * BQ + r];
  }
}

/* Rows [k0, k0 + kn) of x (row stride s0, column stride s1) as contiguous
 * rows of n floats: the row-wise kernels read a strided K or V from here, so
 * a view gives the bits of its contiguous copy. */
static const float *packed_rows(const float *x, int64_t s0, int64_t s1, int64_t k0, int64_t kn, int64_t n,
                                float *pack) {
  if (s1 == 1) return x + k0 * s0;
  for (int64_t j = 0; j < kn; j++)
    for (int64_t d = 0; d < n; d++) pack[j * n + d] = x[(k0 + j) * s0 + d * s1];
  return pack;
}

/* run_chunk for R <= ROW_WISE_MAX rows: the same steps row by row, without
 * the tile products and the softmax step padded to 16 rows, which for R = 1
 * did 16 times the arithmetic a row needs and made decoding compute-bound.
 * Q [R, E], S [R, BK] (keys contiguous) and O [R, Ev] are row-major. Per key
 * block: S = Q K_blk^T by rows_dot (each K row loaded once for the R rows),
 * the score modification, softmax_row per row (vectors over the keys),
 * O = a O + P V_blk by rows_axpy (each V row loaded once, O in registers). */
#define ROW_WISE_MAX 8

/* item (group, chunk) -> its rows' partial (m, l, O), row by row */
static void run_chunk_rows(const decode_ctx *c, int64_t item, float *w) {
  const attn_sdpa_problem *p = c->p;
  int64_t gi = item / c->nchunk, ci = item % c->nchunk;
  int64_t g = c->g, lq = p->lq, e = p->e, ev = p->ev, rows = c->rows;
  float *qr = w, *s = w + c->off.s, *o = w + c->off.o, *m = w + c->off.m, *l = w + c->off.l, *a = w + c->off.a,
        *f = w + c->off.f;
  attn_sdpa_slice sl[ROW_WISE_MAX];
  for (int64_t hh = 0; hh < g; hh++) attn_sdpa_slice_at(p, gi * g + hh, &sl[hh]);
  for (int64_t hh = 0; hh < g; hh++) attn_sdpa_load_q(p, &sl[hh], 0, lq, qr + hh * lq * e, e, 1);
  for (int64_t i = 0; i < rows; i++) m[i] = -INFINITY, l[i] = 0.0f;
  memset(o, 0, (size_t)(rows * ev) * sizeof(float));
  int64_t sk0 = attn_sdpa_row_stride(p, &p->k), sk1 = attn_sdpa_col_stride(p, &p->k);
  int64_t sv0 = attn_sdpa_row_stride(p, &p->v), sv1 = attn_sdpa_col_stride(p, &p->v);
  const float *k = sl[0].k, *v = sl[0].v; /* the group's kv head: the same for its g slices */

  attn_key_range keys = chunk_keys(p, ci);
  int64_t kb = keys.begin, ke = keys.end;
  for (int64_t k0 = kb; k0 < ke; k0 += BK) {
    int64_t kn = ke - k0 < BK ? ke - k0 : BK;
    prefetch_block(p, k, v, k0 + kn, ke, sk0, sv0);
    const float *k_rows = packed_rows(k, sk0, sk1, k0, kn, e, w + c->off_kp);
    c->kr->rows_dot(qr, rows, e, k_rows, sk1 == 1 ? sk0 : e, kn, s, BK);
    for (int64_t hh = 0; hh < g; hh++) attn_sdpa_modify_tile(p, &sl[hh], 0, lq, k0, kn, s + hh * lq * BK, BK, 1);
    for (int64_t r = 0; r < rows; r++) c->kr->softmax_row(s + r * BK, kn, m + r, l + r, a + r);
    if (p->dropout_p > 0.0) {
      for (int64_t r = 0; r < rows; r++) {
        int64_t bi = gi * g + r / lq, i = r % lq;
        attn_dropout_factors(p->dropout_draw, p->dropout_p, (bi * lq + i) * p->lk + k0, kn, f);
        for (int64_t j = 0; j < kn; j++) s[r * BK + j] *= f[j];
      }
    }
    for (int64_t r = 0; r < rows; r++)
      if (a[r] != 1.0f) /* (a product by 1 changes nothing) */
        for (int64_t d = 0; d < ev; d++) o[r * ev + d] *= a[r];
    const float *v_rows = packed_rows(v, sv0, sv1, k0, kn, ev, w + c->off_vp);
    c->kr->rows_axpy(s, BK, rows, v_rows, sv1 == 1 ? sv0 : ev, kn, ev, o);
  }
  float *part = c->partial + item * rows * (ev + 2);
  for (int64_t r = 0; r < rows; r++) {
    float *pr = part + r * (ev + 2);
    pr[0] = m[r];
    pr[1] = l[r];
    memcpy(pr + 2, o + r * ev, (size_t)ev * sizeof(float));
  }
}

/* Row r of group gi: the chunks' partial results merged in chunk order. */
static void merge_row(const decode_ctx *c, int64_t gi, int64_t r, float *out_data, double *acc) {
  const attn_sdpa_problem *p = c->p;
  int64_t ev = p->ev, lq = p->lq, rows = c->rows, stride = rows * (ev + 2);
  const float *base = c->partial + gi * c->nchunk * stride + r * (ev + 2);
  float mx = -INFINITY;
  for (int64_t ci = 0; ci < c->nchunk; ci++)
    if (base[ci * stride] > mx) mx = base[ci * stride];
  int64_t bi = gi * c->g + r / lq, i = r % lq;
  float *o = out_data + (bi * lq + i) * ev;
  float *lse = p->lse ? p->lse->data + bi * lq + i : NULL;
  if (mx == -INFINITY) { /* no chunk saw a key */
    memset(o, 0, (size_t)ev * sizeof(float));
    if (lse) *lse = -INFINITY;
    return;
  }
  double sum = 0.0;
  for (int64_t d = 0; d < ev; d++) acc[d] = 0.0;
  for (int64_t ci = 0; ci < c->nchunk; ci++) {
    const float *pr = base + ci * stride;
    if (pr[0] == -INFINITY) continue;
    double wgt = exp((double)pr[0] - (double)mx) * (double)pr[1]; /* the chunk's share of the sum */
    sum += wgt;
    for (int64_t d = 0; d < ev; d++) acc[d] += wgt * (double)pr[2 + d];
  }
  for (int64_t d = 0; d < ev; d++) o[d] = (float)(acc[d] / sum);
  if (lse) *lse = attn_sdpa_lse_of(mx, sum);
}

/* p -> out [B..., Lq, Ev], lse: chunks in parallel, then the merge per row */
attn_status attn_flash_decode(const attn_sdpa_problem *p, attn_tensor *out) {
  decode_ctx c;
  memset(&c, 0, sizeof c);
  c.p = p;
  c.kr = attn_cpu_kernels();
  c.g = p->gqa_group;
  c.rows = c.g * p->lq;
  c.rows_p = (c.rows + MR - 1) / MR * MR;
  c.nchunk = (p->lk + CHUNK - 1) / CHUNK;
  c.row_wise = c.rows <= ROW_WISE_MAX && p->e > 0;
  int64_t nb = attn_sizes_product(p->nbatch, p->batch), ngroups = nb / c.g;

  size_t block = 0;
  int ok = attn_flash_tile_layout(&c.off, &block, p->e, p->ev);
  c.off_kp = block; /* packed K and V blocks [BK, E], [BK, Ev] (row-wise path, strided K or V) */
  ok = ok && attn_sdpa_add_floats(&block, BK, p->e);
  c.off_vp = block;
  ok = ok && attn_sdpa_add_floats(&block, BK, p->ev);
  attn_sdpa_work work;
  /* items: nb / g groups x chunks (plan_work counts nb slices x nblk) */
  attn_status st = attn_sdpa_plan_work(p, c.nchunk, block, ok, &work);
  if (st != ATTN_OK) return st;
  work.items = ngroups * c.nchunk;
  size_t np = 0;
  if (!attn_sdpa_add_floats(&np, work.items * c.rows, p->ev + 2) ||
      !(c.partial = malloc(np > 0 ? np * sizeof(float) : 1))) {
    free(work.scratch);
    return attn_fail(ATTN_ENOMEM, "cannot allocate the split-K partial results (%lld chunks of %lld rows)",
                     (long long)work.items, (long long)c.rows);
  }
  int nthreads = attn_threads_for(work.items);
  if (nthreads > work.nthreads) nthreads = work.nthreads; /* scratch blocks were planned for work.nthreads */
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    float *w = work.scratch + work.block * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < work.items; it++) {
      if (c.row_wise)
        run_chunk_rows(&c, it, w);
      else
        run_chunk(&c, it, w);
    }
  }
  free(work.scratch);

  int64_t nrows = ngroups * c.rows;
  /* the merge reads nchunk (Ev + 2) floats a row: a team only pays off when that is large */
  int mthreads = attn_threads_for(nrows * c.nchunk * (p->ev + 2) >= (1 << 18) ? nrows : 1);
  double *acc_all = malloc((size_t)(p->ev > 0 ? p->ev : 1) * sizeof(double) * (size_t)mthreads);
  if (!acc_all) {
    free(c.partial);
    return attn_fail(ATTN_ENOMEM, "cannot allocate the split-K merge scratch");
  }
#pragma omp parallel num_threads(mthreads) if (mthreads > 1)
  {
    double *acc = acc_all + (size_t)omp_get_thread_num() * (size_t)(p->ev > 0 ? p->ev : 1);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < nrows; r++) merge_row(&c, r / c.rows, r % c.rows, out->data, acc);
  }
  free(acc_all);
  free(c.partial);
  return ATTN_OK;
}
