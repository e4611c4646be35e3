/* Scaled dot-product attention, fused ("flash") kernel, FlashAttention-2
 * style, tiled driver (src/core/flash.h): a driver over the shared attention
 * core (src/core/sdpa_common.h) and the fused kernel's shared tiles
 * (src/core/flash_common.h); its entry point attn_sdpa_flash
 * (src/core/sdpa_dispatch.c) sends decoding calls to its peer,
 * src/core/flash_decode.c. The shared core describes the
 * operands (attn_sdpa_prepare, attn_sdpa_slice_at), scales q
 * (attn_sdpa_load_q), gives each query row its visible keys
 * (attn_sdpa_row_keys: causal today) and modifies a score tile (bias, mask,
 * the visible range: attn_sdpa_modify_tile), the same for the math kernel
 * (src/core/attention.c) and the modules' tiny path (src/core/modules.c). What is
 * flash's own is the tiling, the online softmax and the micro-kernels.
 * A work item is one (slice bi, block of at most BQ query rows); its
 * tiles are kept transposed (query rows along the vector lanes), so the
 * online softmax is vectorised across rows and no K or V block is packed:
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
 *       diagonal; a window: its two ends) runs per group of 16 rows over the
 *       keys that group sees (scores, softmax and P V all end at its last
 *       row's key), neighbouring groups together over the union of their
 *       keys while that computes at most 1.25 times their scores
 *     m' = max(m, colmax St); Pt = exp(St - m'); l' = exp(m - m') l + colsum Pt
 *     Pt = Pt / l'; Ot = (exp(m - m') l / l') Ot + V_blk^T Pt   micro-kernel
 *   out = Ot^T (zeros where every key was hidden); lse = m + log l when
 *   asked for (-inf where every key was hidden), as the backward needs it
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
 * pointers per key block and row group: gemm_t (St = K_blk Qt), softmax_step
 * (all the group's rows; AVX-512 runs four 16-row vectors side by side, so
 * the max and sum chains do not wait on each other) and gemm_t_rescale (the
 * rescale of Ot fused into the stores of V_blk^T Pt: Ot is loaded and stored
 * once per block). Micro-kernel contract: C[c][r] (+)= sum over k of
 * A[k][r] B[k][c], each sum in increasing k with one fused multiply-add per
 * product, then added to C (after C's rescale, rounded): so the tile shape
 * never changes the bits. AVX-512 tiles are 4 vectors x 6 columns (all 64
 * rows of a tile at once; 24 accumulators, 4 loads and 6 broadcasts per 24
 * FMAs), 3 x 8, 2 x 12 or 1 x 12 for fewer rows, a tail of constant width.
 *
 * Speed (AVX-512, E = Ev = 64): per 16 scores the two products take 128
 * FMAs and the softmax about 19 vector operations (max 1, exp and its sum
 * 17, the division by l' 1) on the same two ports: a ceiling near 0.87 of
 * the FMA peak. BK = 128 keeps St (32 KiB) in the 48 KiB L1 through the
 * softmax's three passes and P V's reads (BK = 256: 64 KiB, from L2, cost
 * about 5% of A's time). One thread, CPU time, in isolation (a loop over one
 * block's three calls, K and V hot): both products about 0.97 of the peak,
 * the softmax 4 ns per 16 scores, the whole block 0.82.
 *
 * Error (measured against float64 softmax(fl(q/8) k^T) v, torch, b1 h4 n1024
 * E64, randn): max abs error 3.0e-7 dense, 5.8e-7 causal, 6.6e-7 window
 * {255, 0} (outputs up to 3.8), for AVX-512; scalar 3.4e-7 / 6.4e-7 / 6.6e-7.
 *
 * Threads: items run in one OpenMP parallel for; each thread owns its output
 * rows and its scratch tile (allocated before the region). Tile sizes are
 * constants and every sum runs in a fixed order inside one item, whatever
 * thread runs it: for one kernel set, the bits of out do not depend on the
 * thread count. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "flash.h"
#include "rng.h"
#include "threads.h"

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK
#define MR ATTN_KERNEL_ROWS /* query rows of a softmax group */

#if BQ % MR != 0
#error "ATTN_FLASH_BQ must be a multiple of 16"
#endif

/* ---------------------------------------------------------------- context */

typedef struct flash_ctx {
  attn_sdpa_problem p;             /* the shapes, expanded operands and options */
  const attn_flash_kernels *kr;    /* the instruction set's micro-kernel and softmax step */
  attn_tensor *out;
  int64_t nqblk;                   /* query blocks per slice */
  attn_flash_tile off;             /* the per-thread scratch's layout */
  attn_tensor *resume_lse;         /* attn_flash_tiles_resume: the running lse (out is the running output) */
} flash_ctx;

/* One work item's state: its slice, its rows and its scratch tiles. */
typedef struct flash_item {
  attn_sdpa_slice sl;            /* the slice's operands */
  int64_t r0, rows;              /* first query row, rows (<= BQ) */
  int64_t sk0, sk1, sv0, sv1;    /* K's and V's row and column strides */
  float *qt, *st, *ot, *m, *l, *a, *f; /* a: the rescale of Ot at each step */
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

/* Work item `item` with the calling thread's scratch block w. */
static void run_item(const flash_ctx *c, int64_t item, float *w) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, e = p->e, ev = p->ev;
  flash_item t;
  int64_t bi = item / c->nqblk;
  attn_sdpa_slice_at(p, bi, &t.sl);
  /* the last query blocks first: under causal masking they have the most keys */
  t.r0 = (c->nqblk - 1 - item % c->nqblk) * BQ;
  t.rows = lq - t.r0 < BQ ? lq - t.r0 : BQ;
  int64_t r0 = t.r0, rows = t.rows;
  int64_t rows_p = (rows + MR - 1) / MR * MR; /* padded rows: zero queries, never written out */
  t.qt = w;
  t.st = w + c->off.s;
  t.ot = w + c->off.o;
  t.m = w + c->off.m;
  t.l = w + c->off.l;
  t.a = w + c->off.a;
  t.f = w + c->off.f;

  attn_sdpa_load_q(p, &t.sl, r0, rows, t.qt, 1, BQ);
  for (int64_t d = 0; d < e; d++)
    for (int64_t i = rows; i < rows_p; i++) t.qt[d * BQ + i] = 0.0f;
  for (int64_t i = 0; i < rows_p; i++) {
    t.m[i] = -INFINITY;
    t.l[i] = 0.0f;
  }
  for (int64_t d = 0; d < ev; d++) memset(t.ot + d * BQ, 0, (size_t)rows_p * sizeof(float));
  if (c->resume_lse) resume_load(c, &t, bi);
  t.sk0 = attn_sdpa_row_stride(p, &p->k);
  t.sk1 = attn_sdpa_col_stride(p, &p->k);
  t.sv0 = attn_sdpa_row_stride(p, &p->v);
  t.sv1 = attn_sdpa_col_stride(p, &p->v);

  /* only the keys some row of the item sees are visited (causal: blocks
   * wholly above the diagonal never are) */
  attn_key_range seen = attn_sdpa_rows_keys(p, r0, rows), common = attn_sdpa_common_keys(p, r0, rows);
  for (int64_t k0 = seen.begin; k0 < seen.end; k0 += BK) {
    int64_t bk = seen.end - k0 < BK ? seen.end - k0 : BK;
    /* a block mask's empty blocks are never visited: the tile is cut to the
     * span of blocks that some of its rows may see (none: skipped) */
    attn_key_range tk = attn_sdpa_block_keys(p, &t.sl, r0, rows, k0, k0 + bk);
    if (tk.end <= tk.begin) continue;
    if (tk.begin < common.begin || tk.end > common.end) {
      /* a block that some rows see only in part (causal: it crosses the
       * diagonal): each group of 16 rows visits only the keys it sees
       * (scores, softmax and P V), instead of the whole rectangle cut after */
      attn_key_range gb[BQ / MR];
      int64_t ng = (rows + MR - 1) / MR;
      for (int64_t g = 0; g < ng; g++) {
        int64_t gn = rows - g * MR < MR ? rows - g * MR : MR;
        attn_key_range gk = attn_sdpa_rows_keys(p, r0 + g * MR, gn);
        int64_t kb = gk.begin > tk.begin ? gk.begin : tk.begin, ke = gk.end < tk.end ? gk.end : tk.end;
        gb[g] = attn_sdpa_block_keys(p, &t.sl, r0 + g * MR, gn, kb, ke > kb ? ke : kb);
      }
      /* neighbouring groups run as one tile over the union of their keys
       * while that computes at most 1.25 times their scores (the rows'
       * extra keys are hidden: exp gives them 0); a group with no key here
       * is never visited (nothing changes for it) */
      for (int64_t g = 0; g < ng;) {
        if (gb[g].end <= gb[g].begin) {
          g++;
          continue;
        }
        attn_key_range u = gb[g];
        int64_t g1 = g + 1, own = u.end - u.begin;
        for (; g1 < ng && gb[g1].end > gb[g1].begin; g1++) {
          int64_t ub = gb[g1].begin < u.begin ? gb[g1].begin : u.begin, ue = gb[g1].end > u.end ? gb[g1].end : u.end;
          int64_t own1 = own + (gb[g1].end - gb[g1].begin);
          if (4 * (ue - ub) * (g1 + 1 - g) > 5 * own1) break;
          u.begin = ub, u.end = ue, own = own1;
        }
        key_step(c, &t, g * MR, (g1 - g) * MR, u.begin, u.end - u.begin);
        g = g1;
      }
    } else {
      key_step(c, &t, 0, rows_p, tk.begin, tk.end - tk.begin);
    }
  }
  if (c->resume_lse) {
    resume_store(c, &t, bi);
    return;
  }
  /* out = Ot^T (already normalised); rows with every key hidden are zeros */
  float *o = c->out->data + (bi * lq + r0) * ev;
  for (int64_t i = 0; i < rows; i++) {
    float *oi = o + i * ev;
    if (t.m[i] == -INFINITY) {
      memset(oi, 0, (size_t)ev * sizeof(float));
    } else {
      for (int64_t d = 0; d < ev; d++) oi[d] = t.ot[d * BQ + i];
    }
  }
  if (p->lse) {
    float *lse = p->lse->data + bi * lq + r0;
    for (int64_t i = 0; i < rows; i++) lse[i] = attn_sdpa_lse_of(t.m[i], (double)t.l[i]);
  }
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
  size_t block = 0;
  int ok = attn_flash_tile_layout(&c.off, &block, c.p.e, c.p.ev);
  attn_sdpa_work work;
  attn_status st = attn_sdpa_plan_work(&c.p, c.nqblk, block, ok, &work);
  if (st != ATTN_OK) return st;

  /* dynamic hand-out of the items (heaviest first under causal masking) only
   * balances the load: every item is computed whole by one thread */
#pragma omp parallel num_threads(work.nthreads) if (work.nthreads > 1)
  {
    float *w = work.scratch + work.block * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < work.items; it++) run_item(&c, it, w);
  }
  free(work.scratch);
  return ATTN_OK;
}

attn_status attn_flash_tiles(const attn_sdpa_problem *p, attn_tensor *out) { return tiles(p, out, NULL); }

attn_status attn_flash_tiles_resume(const attn_sdpa_problem *p, attn_tensor *out, attn_tensor *lse) {
  return tiles(p, out, lse);
}
