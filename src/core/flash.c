/* Scaled dot-product attention, fused ("flash") kernel, FlashAttention-2
 * style, tiled driver (src/core/flash.h): a driver over the shared attention
 * core (src/core/sdpa_common.h) and the fused kernel's shared tiles
 * (src/core/flash_common.h); its entry point attn_sdpa_flash
 * (src/core/sdpa_dispatch.c) sends decoding calls to its peer,
 * src/core/flash_decode.c. The shared core describes the
 * operands (attn_sdpa_prepare, attn_sdpa_slice_at), scales q
 * (attn_sdpa_load_q), gives each query row its visible keys
 * (attn_sdpa_row_keys: causal, a window) and modifies a score tile (bias, mask,
 * the visible range: attn_sdpa_modify_tile), the same for the math kernel
 * (src/core/attention.c) and the modules' tiny path (src/core/modules.c). What is
 * flash's own is the tiling, the online softmax and the micro-kernels.
 * A work item is one slice bi and up to GROUP = 4 consecutive blocks of at
 * most BQ query rows (fewer where that would leave under 8 items per
 * thread); each block's tiles are kept transposed (query rows along the
 * vector lanes), so the online softmax is vectorised across rows and no K or
 * V block is packed. Per query block:
 *   Qt = fl(q * scale)^T                        [E, BQ]   packed once per item
 *   m = -inf, l = 0, Ot = 0                     Ot [Ev, BQ] in scratch
 *   for each key block [k0, k0 + bk), bk <= BK, in increasing k0, within the
 *   keys some row of the item sees (causal: blocks wholly above the diagonal
 *   are never visited; a block mask: cut to the span of its blocks that are
 *   not empty for the item's rows, a tile with none is never visited, and
 *   its full blocks cost no mask work in attn_sdpa_modify_tile):
 *     St = K_blk Qt                             [bk, BQ]  micro-kernel
 *     St += bias^T, hidden or outside the row's visible keys -> -inf; a
 *       block that some rows see only in part (causal: one that crosses the
 *       diagonal; a window: its two ends; a block mask's partial blocks)
 *       runs as a band: each group of 16 rows over the keys it sees (its
 *       scores, softmax and P V start at its first row's first key and end
 *       at its last row's last one; a group that sees none is not visited),
 *       all groups in one call of each band entry (src/core/cpu.h)
 *     m' = max(m, colmax St); Pt = exp(St - m'); l' = exp(m - m') l + colsum Pt
 *     Pt = Pt / l'; Ot = (exp(m - m') l / l') Ot + V_blk^T Pt   micro-kernel
 *   out = Ot^T (zeros where every key was hidden); lse = m + log l when
 *   asked for (-inf where every key was hidden), as the backward needs it
 *
 * The item's query blocks take their key blocks in one increasing key order
 * (each its own sequence above, merged): a K and V block read once serves
 * every query block of the item while it is in L1 or L2, where a slice's K
 * and V (B: 2 MiB) do not fit in one core's L2 (simulated 2 MiB L2, one
 * thread, b1 h1 n4096 E64 dense: L2 read misses 1.41 M -> 0.57 M). Each
 * query block's bits are those of an item of one block.
 *
 * Ot stays normalised: after each block it is a weighted mean of the values
 * seen so far (weights summing to 1), so |Ot| <= max |v| up to rounding, and
 * every result the math kernel gives finite is finite here too (an
 * unnormalised Ot, divided by l at the end, reached Lk x max |v|: v = 1e36,
 * Lk = 1000 gave inf; spec/reliability_flash_spec.lua). The cost is one
 * multiply per score and per block.
 *
 * The micro-kernels, the exponential and the softmax step are per
 * instruction set (src/core/cpu.h): src/core/kernels_scalar.c (plain C,
 * glibc's expf), kernels_avx2.c (16 x 6 micro-tiles of FMAs, a Cephes
 * polynomial exp with max relative error 1.18e-7 over [-87.33, 0]) and
 * kernels_avx512.c (the same exp on 16 lanes; the same bits as AVX2). Only
 * those files are compiled with -m flags; src/core/cpu.c picks one set once,
 * from cpuid or ATTN_CPU, and this driver calls it through three function
 * pointers per key block: gemm_t (St = K_blk Qt), softmax_step (all the
 * tile's rows; AVX-512 runs four 16-row vectors side by side, so the max and
 * sum chains do not wait on each other) and gemm_t_rescale (the rescale of
 * Ot fused into the stores of V_blk^T Pt: Ot is loaded and stored once per
 * block); a band calls their band twins (gemm_t_band, softmax_band,
 * gemm_t_rescale_band), which give each group the bits the 16-row entries
 * give it over its own keys: the scalar and AVX2 sets run them group by
 * group, AVX-512 cuts the band's keys where a group's keys begin or end and
 * runs each piece with the groups that see it side by side (one tile of up
 * to 64 rows; src/core/kernel_band.h). Qt's load and out's store are the
 * sets' transposed copy (AVX-512: a gather per 16 elements). Micro-kernel
 * contract: C[c][r] (+)= sum over k of A[k][r] B[k][c], each sum in
 * increasing k with one fused multiply-add per product, then added to C
 * (after C's rescale, rounded): so the tile shape never changes the bits,
 * and a band's skipped products (P = 0 outside a group's keys) change none
 * where V is finite. AVX-512 tiles are 4 vectors x 6 columns (all 64 rows
 * of a tile at once; 24 accumulators, 4 loads and 6 broadcasts per 24
 * FMAs), 3 x 8, 2 x 12 or 1 x 12 for fewer rows, a tail of constant width.
 *
 * Speed (AVX-512, E = Ev = 64): per 16 scores the two products take 128
 * FMAs and the softmax about 19 vector operations (max 1, exp and its sum
 * 17, the division by l' 1) on the same two ports: a ceiling near 0.87 of
 * the FMA peak. BK = 128 keeps St (32 KiB) in the 48 KiB L1 through the
 * softmax's three passes and P V's reads (BK = 256: 64 KiB, from L2, cost
 * about 5% of A's time). One thread, CPU time, in isolation (a loop over one
 * block's three calls, K and V hot): both products about 0.97 of the peak,
 * the softmax 4 ns per 16 scores, the whole block 0.82. A band, the same
 * way (one thread, CPU time per 16 computed scores, best of 2000, on a
 * loaded VM): a full 64 x 128 block 30 ns; a window's first block (groups
 * over 128, 112, 96 and 80 keys) 35 ns, against 47 ns group by group; the
 * causal diagonal (15, 31, 47, 63 keys) 41 ns, against 49 ns. A window's
 * item (b1 h8 n4096, window {255, 0}) computes 17344 scores for its 16384
 * visible pairs (neighbouring groups merged into 64-row tiles: 19136).
 *
 * Error (measured against float64 softmax(fl(q/8) k^T) v, torch, b1 h4 n1024
 * E64, randn): max abs error 3.0e-7 dense, 5.8e-7 causal, 6.6e-7 window
 * {255, 0} (outputs up to 3.8), for AVX-512; scalar 3.4e-7 / 6.4e-7 / 6.6e-7.
 *
 * Memory: the transposed load of q and store of out are bursts of cache
 * misses that the hardware prefetcher, which follows K's and V's in-order
 * streams, does not cover (one thread, b1 h8 n4096, window {255, 0}: 12.8%
 * of the samples, in the gathers). So each item prefetches its own output
 * rows and the next item's q rows, a few lines per key step: the
 * transposes and the prefetches together 9-10% (docs/benchmarks.md).
 *
 * Threads: items are handed out one at a time in one OpenMP parallel region
 * (each thread takes its next item before it runs the one it holds, so it
 * knows whose q to prefetch); each thread owns its output rows and its
 * scratch tile (allocated before the region). Tile sizes are
 * constants and every sum runs in a fixed order inside one query block,
 * whatever thread runs it and however many blocks its item holds (the group
 * size follows the thread count): for one kernel set, the bits of out do
 * not depend on the thread count. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "flash.h"
#include "prefetch.h"
#include "rng.h"
#include "threads.h"

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK
#define MR ATTN_KERNEL_ROWS /* query rows of a softmax group */
#define GROUP 4              /* query blocks per work item, at most */

#if BQ % MR != 0 || BQ / MR > 4
#error "ATTN_FLASH_BQ must be a multiple of 16, at most 64 (a band has at most 4 vectors of rows)"
#endif

/* ---------------------------------------------------------------- context */

typedef struct flash_ctx {
  attn_sdpa_problem p;             /* the shapes, expanded operands and options */
  const attn_flash_kernels *kr;    /* the instruction set's micro-kernel and softmax step */
  attn_tensor *out;
  int64_t nqblk;                   /* query blocks per slice */
  int64_t group, ngroups;          /* query blocks per work item (<= GROUP), items per slice */
  size_t slot;                     /* floats of one query block's scratch */
  attn_flash_tile off;             /* the per-thread scratch's layout */
  attn_tensor *resume_lse;         /* attn_flash_tiles_resume: the running lse (out is the running output) */
} flash_ctx;

/* One work item's state: its slice, its rows and its scratch tiles. */
typedef struct flash_item {
  attn_sdpa_slice sl;            /* the slice's operands */
  int64_t r0, rows;              /* first query row, rows (<= BQ) */
  int64_t sk0, sk1, sv0, sv1;    /* K's and V's row and column strides */
  float *qt, *st, *ot, *m, *l, *a, *f; /* a: the rescale of Ot at each step */
  attn_key_range seen, common;   /* the keys some / every row of the block sees */
  int64_t k0;                    /* the next key block's first key */
} flash_item;

/* One online-softmax step of the padded rows [g0, g0 + n_p) (n_p a multiple
 * of 16) over the keys [k0, k0 + kn): scores, bias/mask/visible range,
 * softmax, dropout, Ot = a Ot + V^T P. Each micro-tile's sums run in a fixed
 * order. */
static void key_step(const flash_ctx *c, const flash_item *t, int64_t g0, int64_t n_p, int64_t k0, int64_t kn) {
  const attn_sdpa_problem *p = &c->p;
  int64_t r0 = t->r0, ev = p->ev;
  float *st = t->st;
  /* St = K_blk Qt */
  if (p->e > 0) {
    c->kr->gemm_t(t->qt + g0, BQ, p->e, n_p, t->sl.k + k0 * t->sk0, t->sk1, t->sk0, kn, st + g0, BQ, 0);
  } else {
    for (int64_t j = 0; j < kn; j++) memset(st + j * BQ + g0, 0, (size_t)n_p * sizeof(float));
  }
  int64_t i_end = g0 + n_p < t->rows ? g0 + n_p : t->rows; /* real (not padded) rows */
  /* the tile is transposed: row i at column stride BQ */
  attn_sdpa_modify_tile(p, &t->sl, r0 + g0, i_end - g0, k0, kn, st + g0, 1, BQ);
  c->kr->softmax_step(st + g0, BQ, kn, n_p, t->m + g0, t->l + g0, t->a + g0);
  if (p->dropout_p > 0.0) {
    for (int64_t i = g0; i < i_end; i++) {
      attn_dropout_factors(p->dropout_draw, p->dropout_p, (t->sl.bi * p->lq + r0 + i) * p->lk + k0, kn, t->f);
      for (int64_t j = 0; j < kn; j++) st[j * BQ + i] *= t->f[j];
    }
  }
  /* Ot = a Ot + V_blk^T Pt (a = exp(m - m') l / l', Pt already divided by l') */
  c->kr->gemm_t_rescale(st + g0, BQ, kn, n_p, t->sl.v + k0 * t->sv0, t->sv0, t->sv1, ev, t->ot + g0, BQ, t->a + g0);
}

/* attn_flash_tiles_resume: where slice bi's row r0 of the running output
 * and lse lie (their own strides; the batch dims those of the problem). */
static void resume_rows(const flash_ctx *c, int64_t bi, int64_t r0, float **o, float **lse) {
  const attn_tensor *out = c->out, *l = c->resume_lse;
  int nb = c->p.nbatch;
  int64_t oo = r0 * out->stride[nb], lo = r0 * l->stride[nb];
  for (int d = nb - 1; d >= 0; d--) {
    int64_t i = bi % c->p.batch[d];
    bi /= c->p.batch[d];
    oo += i * out->stride[d];
    lo += i * l->stride[d];
  }
  *o = out->data + oo;
  *lse = l->data + lo;
}

/* The online softmax's state from a partial result over other keys (out
 * normalised, lse its log-sum-exp): m = lse, l = 1 (0 where lse is -inf,
 * as a row that saw nothing), Ot = out; the steps that follow weigh it by
 * e^(lse - m') against the new keys' e^(s - m'), as if its keys had been
 * visited first. */
static void resume_load(const flash_ctx *c, flash_item *t, int64_t bi) {
  float *o, *lse;
  resume_rows(c, bi, t->r0, &o, &lse);
  int64_t ors = c->out->stride[c->p.nbatch], lrs = c->resume_lse->stride[c->p.nbatch];
  for (int64_t i = 0; i < t->rows; i++) {
    float m = lse[i * lrs];
    t->m[i] = m;
    t->l[i] = m == -INFINITY ? 0.0f : 1.0f;
    if (m == -INFINITY) continue; /* Ot stays 0: its weight is 0, and 0 * NaN would not be */
    for (int64_t d = 0; d < c->p.ev; d++) t->ot[d * BQ + i] = o[i * ors + d];
  }
}

/* out = Ot^T, lse = m + log l into the running output's rows */
static void resume_store(const flash_ctx *c, const flash_item *t, int64_t bi) {
  float *o, *lse;
  resume_rows(c, bi, t->r0, &o, &lse);
  int64_t ors = c->out->stride[c->p.nbatch], lrs = c->resume_lse->stride[c->p.nbatch];
  for (int64_t i = 0; i < t->rows; i++) {
    float *oi = o + i * ors;
    if (t->m[i] == -INFINITY) {
      for (int64_t d = 0; d < c->p.ev; d++) oi[d] = 0.0f;
    } else {
      for (int64_t d = 0; d < c->p.ev; d++) oi[d] = t->ot[d * BQ + i];
    }
    lse[i * lrs] = attn_sdpa_lse_of(t->m[i], (double)t->l[i]);
  }
}

/* One online-softmax step of a band: the nv (<= 4) groups of 16 rows, group
 * g over its own keys [kb[g], ke[g]) (none: not visited), in one pass of the
 * set's band entries (tiles of 64 rows where the groups' keys overlap). The
 * same bits as a key_step per group over its keys. */
static void band_step(const flash_ctx *c, const flash_item *t, int nv, const int64_t *kb, const int64_t *ke) {
  const attn_sdpa_problem *p = &c->p;
  int64_t k0 = INT64_MAX, rb[BQ / MR], re[BQ / MR]; /* the keys from the band's first one */
  for (int g = 0; g < nv; g++)
    if (kb[g] < ke[g] && kb[g] < k0) k0 = kb[g];
  if (k0 == INT64_MAX) return;
  for (int g = 0; g < nv; g++) rb[g] = kb[g] - k0, re[g] = ke[g] - k0;
  float *st = t->st;
  if (p->e > 0) {
    c->kr->gemm_t_band(t->qt, BQ, p->e, nv, rb, re, t->sl.k + k0 * t->sk0, t->sk1, t->sk0, st, BQ);
  } else {
    for (int g = 0; g < nv; g++)
      for (int64_t j = rb[g]; j < re[g]; j++) memset(st + j * BQ + g * MR, 0, MR * sizeof(float));
  }
  for (int g = 0; g < nv; g++) {
    if (kb[g] >= ke[g]) continue;
    int64_t gn = t->rows - g * MR < MR ? t->rows - g * MR : MR; /* real (not padded) rows */
    attn_sdpa_modify_tile(p, &t->sl, t->r0 + g * MR, gn, kb[g], ke[g] - kb[g], st + rb[g] * BQ + g * MR, 1, BQ);
  }
  c->kr->softmax_band(st, BQ, nv, rb, re, t->m, t->l, t->a);
  if (p->dropout_p > 0.0) {
    for (int g = 0; g < nv; g++) {
      int64_t kn = ke[g] - kb[g], i_end = (g + 1) * MR < t->rows ? (g + 1) * MR : t->rows;
      for (int64_t i = g * MR; kn > 0 && i < i_end; i++) {
        attn_dropout_factors(p->dropout_draw, p->dropout_p, (t->sl.bi * p->lq + t->r0 + i) * p->lk + kb[g], kn, t->f);
        for (int64_t j = 0; j < kn; j++) st[(rb[g] + j) * BQ + i] *= t->f[j];
      }
    }
  }
  c->kr->gemm_t_rescale_band(st, BQ, nv, rb, re, t->sl.v + k0 * t->sv0, t->sv0, t->sv1, p->ev, t->ot, BQ, t->a);
}

/* Query block qb of slice bi into slot t (its scratch at w; st and f are
 * shared by the item's slots, as one key step runs at a time): Qt =
 * fl(q * scale)^T, m = -inf, l = 0, Ot = 0 (or the running state to resume),
 * and the keys its rows see. */
static void slot_begin(const flash_ctx *c, flash_item *t, int64_t bi, int64_t qb, float *w, float *shared) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, e = p->e, ev = p->ev;
  attn_sdpa_slice_at(p, bi, &t->sl);
  t->r0 = qb * BQ;
  t->rows = lq - t->r0 < BQ ? lq - t->r0 : BQ;
  int64_t r0 = t->r0, rows = t->rows;
  int64_t rows_p = (rows + MR - 1) / MR * MR; /* padded rows: zero queries, never written out */
  t->qt = w;
  t->st = shared + c->off.s;
  t->ot = w + c->off.o;
  t->m = w + c->off.m;
  t->l = w + c->off.l;
  t->a = w + c->off.a;
  t->f = shared + c->off.f;

  /* Qt = fl(q * scale)^T: attn_sdpa_load_q's products, through the set's
   * transposed copy */
  int64_t sq0 = attn_sdpa_row_stride(p, &p->q), sq1 = attn_sdpa_col_stride(p, &p->q);
  c->kr->transpose(t->sl.q + r0 * sq0, sq0, sq1, rows, e, t->qt, BQ, p->scale);
  for (int64_t d = 0; d < e; d++)
    for (int64_t i = rows; i < rows_p; i++) t->qt[d * BQ + i] = 0.0f;
  for (int64_t i = 0; i < rows_p; i++) {
    t->m[i] = -INFINITY;
    t->l[i] = 0.0f;
  }
  for (int64_t d = 0; d < ev; d++) memset(t->ot + d * BQ, 0, (size_t)rows_p * sizeof(float));
  if (c->resume_lse) resume_load(c, t, bi);
  t->sk0 = attn_sdpa_row_stride(p, &p->k);
  t->sk1 = attn_sdpa_col_stride(p, &p->k);
  t->sv0 = attn_sdpa_row_stride(p, &p->v);
  t->sv1 = attn_sdpa_col_stride(p, &p->v);
  /* only the keys some row of the block sees are visited (causal: key
   * blocks wholly above the diagonal never are) */
  t->seen = attn_sdpa_rows_keys(p, r0, rows);
  t->common = attn_sdpa_common_keys(p, r0, rows);
  t->k0 = t->seen.begin;
}

/* Slot t's next key block [t->k0, t->k0 + bk), bk <= BK: a band or a full
 * step; then t->k0 moves on by BK. */
static void slot_key_block(const flash_ctx *c, flash_item *t) {
  const attn_sdpa_problem *p = &c->p;
  int64_t r0 = t->r0, rows = t->rows, k0 = t->k0;
  int64_t rows_p = (rows + MR - 1) / MR * MR;
  int64_t bk = t->seen.end - k0 < BK ? t->seen.end - k0 : BK;
  t->k0 += BK;
  /* a block mask's empty blocks are never visited: the tile is cut to the
   * span of blocks that some of its rows may see (none: skipped) */
  attn_key_range tk = attn_sdpa_block_keys(p, &t->sl, r0, rows, k0, k0 + bk);
  if (tk.end <= tk.begin) return;
  if (tk.begin < t->common.begin || tk.end > t->common.end) {
    /* a block that some rows see only in part (causal: it crosses the
     * diagonal; a window's ends): a band, each group of 16 rows over only
     * the keys it sees (scores, softmax and P V), instead of the whole
     * rectangle cut after */
    int64_t kb[BQ / MR], ke[BQ / MR];
    int ng = (int)((rows + MR - 1) / MR);
    for (int g = 0; g < ng; g++) {
      int64_t gn = rows - g * MR < MR ? rows - g * MR : MR;
      attn_key_range gk = attn_sdpa_rows_keys(p, r0 + g * MR, gn);
      int64_t b0 = gk.begin > tk.begin ? gk.begin : tk.begin, b1 = gk.end < tk.end ? gk.end : tk.end;
      attn_key_range gb = attn_sdpa_block_keys(p, &t->sl, r0 + g * MR, gn, b0, b1 > b0 ? b1 : b0);
      kb[g] = gb.begin, ke[g] = gb.end > gb.begin ? gb.end : gb.begin;
    }
    band_step(c, t, ng, kb, ke);
  } else {
    key_step(c, t, 0, rows_p, tk.begin, tk.end - tk.begin);
  }
}

/* out = Ot^T (already normalised; zeros where every key was hidden), lse */
static void slot_end(const flash_ctx *c, const flash_item *t, int64_t bi) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, ev = p->ev, r0 = t->r0, rows = t->rows;
  if (c->resume_lse) {
    resume_store(c, t, bi);
    return;
  }
  float *o = c->out->data + (bi * lq + r0) * ev;
  c->kr->transpose(t->ot, BQ, 1, ev, rows, o, ev, 1.0f);
  for (int64_t i = 0; i < rows; i++)
    if (t->m[i] == -INFINITY) memset(o + i * ev, 0, (size_t)ev * sizeof(float));
  if (p->lse) {
    float *lse = p->lse->data + bi * lq + r0;
    for (int64_t i = 0; i < rows; i++) lse[i] = attn_sdpa_lse_of(t->m[i], (double)t->l[i]);
  }
}

/* Item `item`'s slice, first query block and blocks (the last groups first:
 * under causal masking they have the most keys), and the query rows they
 * hold: [qb0 BQ, qb0 BQ + *rows). */
static void item_blocks(const flash_ctx *c, int64_t item, int64_t *bi, int64_t *qb0, int64_t *nq, int64_t *rows) {
  int64_t gi = c->ngroups - 1 - item % c->ngroups;
  *bi = item / c->ngroups;
  *qb0 = gi * c->group;
  *nq = c->nqblk - *qb0 < c->group ? c->nqblk - *qb0 : c->group;
  *rows = c->p.lq - *qb0 * BQ < *nq * BQ ? c->p.lq - *qb0 * BQ : *nq * BQ;
}

/* Work item `item` (slice bi, a group of up to GROUP query blocks) with the
 * calling thread's scratch w. The group's blocks take their key blocks in
 * increasing key order across the group (ties: lower query block first), so
 * a K and V block, once read, serves every query block that needs it while
 * it is still in cache; each query block still visits its own key blocks in
 * its own increasing order, so its bits are those of a group of one.
 * Between key steps the item prefetches its own output rows and the q rows
 * of `next` (the item this thread runs after it; -1: none), a few lines per
 * step: the transposed load of q and store of out are otherwise two bursts
 * of cache misses per item, which K and V's streams (read in order, so the
 * hardware prefetches them) are not. */
static void run_item(const flash_ctx *c, int64_t item, int64_t next, float *w) {
  const attn_sdpa_problem *p = &c->p;
  int64_t bi, qb0, nq, rows;
  item_blocks(c, item, &bi, &qb0, &nq, &rows);
  flash_item t[GROUP];
  int64_t steps = 0;
  for (int64_t j = 0; j < nq; j++) {
    slot_begin(c, &t[j], bi, qb0 + nq - 1 - j, w + c->slot * (size_t)j, w);
    steps += (t[j].seen.end - t[j].seen.begin + BK - 1) / BK;
  }
  /* its output rows, then the next item's q rows */
  attn_prefetch_list ahead = {0};
  attn_prefetch_add(&ahead, attn_prefetch_matrix(c->out->data + (bi * p->lq + qb0 * BQ) * p->ev, p->ev, rows, p->ev));
  if (next >= 0 && attn_sdpa_col_stride(p, &p->q) == 1) {
    int64_t nbi, nqb0, nnq, nrows;
    item_blocks(c, next, &nbi, &nqb0, &nnq, &nrows);
    attn_sdpa_slice nsl;
    attn_sdpa_slice_at(p, nbi, &nsl);
    int64_t sq0 = attn_sdpa_row_stride(p, &p->q);
    attn_prefetch_add(&ahead, attn_prefetch_matrix(nsl.q + nqb0 * BQ * sq0, sq0, nrows, p->e));
  }
  attn_prefetch_plan(&ahead, steps);
  for (;;) {
    int64_t nx = -1;
    for (int64_t j = 0; j < nq; j++)
      if (t[j].k0 < t[j].seen.end && (nx < 0 || t[j].k0 < t[nx].k0)) nx = j;
    if (nx < 0) break;
    attn_prefetch_step(&ahead);
    slot_key_block(c, &t[nx]);
  }
  for (int64_t j = 0; j < nq; j++) slot_end(c, &t[j], bi);
}

/* problem -> out, lse: the items (slice, query block) in one parallel for;
 * resume_lse: attn_flash_tiles_resume's running lse, else NULL */
static attn_status tiles(const attn_sdpa_problem *p, attn_tensor *out, attn_tensor *resume_lse) {
  flash_ctx c;
  memset(&c, 0, sizeof c);
  c.p = *p;
  c.kr = attn_cpu_kernels();
  c.out = out;
  c.resume_lse = resume_lse;
  c.nqblk = (c.p.lq + BQ - 1) / BQ;
  /* GROUP query blocks per item where that leaves at least 8 items per
   * thread (fewer: halved until it does, or 1) */
  int64_t slices = attn_sizes_product(c.p.nbatch, c.p.batch), spread = 8 * (int64_t)attn_threads_for(INT64_MAX);
  c.group = GROUP;
  while (c.group > 1 && slices * ((c.nqblk + c.group - 1) / c.group) < spread) c.group /= 2;
  c.ngroups = (c.nqblk + c.group - 1) / c.group;
  size_t block = 0;
  int ok = attn_flash_tile_layout(&c.off, &block, c.p.e, c.p.ev);
  ok = ok && attn_sdpa_add_floats(&block, 15, 1); /* each slot 64-byte aligned */
  c.slot = block & ~(size_t)15;
  block = 0;
  ok = ok && attn_sdpa_add_floats(&block, (int64_t)c.slot, c.group);
  attn_sdpa_work work;
  attn_status st = attn_sdpa_plan_work(&c.p, c.ngroups, block, ok, &work);
  if (st != ATTN_OK) return st;

  /* dynamic hand-out of the items (heaviest first under causal masking),
   * each thread taking its next item before it runs the one it holds (so
   * that it can prefetch that item's q): this only balances the load, every
   * item is computed whole by one thread */
  int64_t handed = 0;
#pragma omp parallel num_threads(work.nthreads) if (work.nthreads > 1)
  {
    float *w = work.scratch + work.block * (size_t)omp_get_thread_num();
    int64_t it, nx;
#pragma omp atomic capture
    it = handed++;
    while (it < work.items) {
#pragma omp atomic capture
      nx = handed++;
      run_item(&c, it, nx < work.items ? nx : -1, w);
      it = nx;
    }
  }
  free(work.scratch);
  return ATTN_OK;
}

attn_status attn_flash_tiles(const attn_sdpa_problem *p, attn_tensor *out) { return tiles(p, out, NULL); }

attn_status attn_flash_tiles_resume(const attn_sdpa_problem *p, attn_tensor *out, attn_tensor *lse) {
  return tiles(p, out, lse);
}
