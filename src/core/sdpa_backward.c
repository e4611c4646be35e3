/* The backward of scaled dot-product attention (src/core/sdpa_backward.h),
 * one driver for both kernels over the attention core (src/core/sdpa.h:
 * attn_sdpa_load_q, attn_sdpa_rows_keys, attn_sdpa_modify_tile), so every
 * score modification the forward applies reaches the backward too. The two
 * kernels differ only in where the probabilities P of a tile come from:
 *  - math: read from the forward's saved softmax (opts.probs, before
 *    dropout), one tile of BQ query rows by all the keys they see;
 *  - flash: recomputed tile by tile (BQ rows x BK keys) from q, k and the
 *    forward's log-sum-exp, P = exp(S - lse), FlashAttention-2's backward:
 *    no [Lq, Lk] buffer, extra memory O((Lq + Lk) (E + Ev)) per thread.
 *
 * Per slice (one (batch, query head) of the flattened batch B), with Qs =
 * fl(q * scale) as the forward scaled it:
 *   D = rowsum(dO * O) (+ rowsum(W * the weights' gradient))  [Lq]
 *   for each key block [k0, k0 + bk) (flash: BK keys; math: all of them),
 *     for each query block [i0, i0 + bq) that sees some of its keys (causal
 *     and window: blocks outside every row's visible range are skipped; a
 *     block is cut to the keys its rows see, attn_sdpa_rows_keys; a tile
 *     that its rows see only in part, causal's diagonal, computes S, P, dW,
 *     dS and dQ in steps of 32 rows each cut to the keys they see, and dV,
 *     dK as one product over the tile, W and dS zero elsewhere):
 *       S0 = Qs_i K_j^T                                [bq, bk] (flash; math with softcap)
 *       S' = c tanh(S0 / c) (softcap c; else S' = S0)  kept as `capped`
 *       S  = S' + bias + ALiBi, mask and visible keys -> -inf   (flash only)
 *       P  = exp(S - lse) (0 where lse = -inf: no key seen), or saved probs
 *       W  = P * F (F: the forward's dropout factors, regenerated from its
 *            draw and the same positions; 1 without dropout)
 *       dW = dO_i V_j^T (+ the weights output's gradient)  [bq, bk]
 *       dV_j += W^T dO_i                               [bk, Ev]
 *       dS' = P * (dW * F - D)   (0 where P = 0)       [bq, bk] = dbias tile
 *       dS0 = dS' (1 - (S' / c)^2)  (softcap: tanh' = 1 - tanh^2; else dS0 = dS')
 *       dQ_i += scale dS0 K_j                          [bq, E]
 *       dK_j += dS0^T Qs_i                             [bk, E]
 * D = rowsum(dO * O) is rowsum(P * dP) of the softmax backward: O = W V, so
 * dO . O = sum_j W_j (dO . V_j) = sum_j P_j F_j dW_j.
 * Each variant's term: the window cuts the key range like causal (hidden
 * keys have P = 0, so dS' = 0 there); ALiBi adds a constant to S (its slopes
 * get no gradient); score_mod: its program's derivative at the capped
 * score (kept in `capped`, recomputed as for softcap) turns dS' into the
 * capped score's gradient, and its tables' gradients go to one buffer per
 * slice (one pass over the kv groups then, each slice's buffer filled by
 * one item), summed in increasing slice order after the parallel region;
 * the bias's gradient is dS', taken before the cap's
 * derivative, since the bias is added after the cap; softcap recomputes S'
 * from q and k (math too: its saved P cannot give S' back where P
 * underflowed), one tanh per score as in the forward; enable_gqa: query head
 * h reads kv head h / g in place (attn_sdpa_slice_at), and dK, dV of a kv
 * head are the sums of its g query heads' terms, written at slice bi / g
 * ([B..., Hkv, Lk, E], no per-query-head copy).
 * Products: the instruction set's micro-kernels (src/core/kernels_bwd.h:
 * kernels_gemm_avx512.c, kernels_gemm_avx2.c, kernels_bwd_scalar.c, the set
 * that goes with the flash kernel set src/core/cpu.c chose), or direct loops
 * for tiny ones (src/core/small_gemm.h; the sizes choose, not the threads).
 * One contract serves all five: C (+)= alpha sum_l a(i, l) B[l, :], A's
 * elements broadcast through any strides, B's rows loaded as vectors, C held
 * in registers (AVX-512: 6 rows x 64 columns, 24 of the 32 registers; AVX2:
 * 6 x 16), each element's sum in increasing l from 0 with one fused
 * multiply-add per product, then scaled and added to C once: the blocking
 * never changes a bit, and the AVX2 and AVX-512 sets agree bit for bit. The
 * two products whose B is K^T or V^T (S and dW) read a copy of the key
 * block's K^T and V^T [E, bk] packed once per key block (load_kv_t); dV, dK
 * and dQ read dO, Qs and K in place, P and dS transposed through the
 * broadcasts' strides.
 * Fused pass (p_ds, src/core/kernel_bwd_tile.h, AVX2 and AVX-512): on a flash
 * tile, or a diagonal tile's 32-row step, whose scores nothing modifies but
 * the rows' visible ranges (no bias, mask, ALiBi, softcap, score_mod, block
 * mask, mask_mod, dropout or weights' gradient), each micro-tile of 6 rows x
 * 64 keys (AVX2: 16) runs S's sums in registers, takes P = exp(S - lse) there
 * (the flash set's exponential, operation for operation; 0 outside a row's
 * visible range, where the forward's score is -inf), stores P, then runs
 * dW's sums in the same registers and stores dS = P (dW - D), P read back
 * from L1: S and dW never go to memory and back, and the bits are those of
 * the separate products and passes (the same sums, exponential and dS;
 * spec/sdpa_backward_kernels_spec.lua compares the two, a zero bias taking
 * the separate path). The two sums share no operand (S broadcasts Qs and
 * streams K^T, dW broadcasts dO and streams V^T) and their accumulators do
 * not fit the registers together (48 of 32 on AVX-512), so they run one
 * after the other per micro-tile; the 64 keys' columns of K^T and V^T (2 x
 * 16 KiB) stay in L1 across the tile's rows. Every other tile, and the scalar
 * set, runs the separate products, the flash set's exp_minus and the set's
 * dS loop (ds_rows). Loop order and tile sizes stay: key block outer (BK,
 * K^T and V^T packed once), query blocks inner (BQ); other BQ or BK would
 * change the bits (dK and dV sum each query block's terms, dQ each key
 * block's, before adding them), and padding K^T's rows by a cache line
 * measured no faster.
 * One [1024, 64] head's backward alone, one thread, AVX-512 on a Sapphire
 * Rapids core, best of 150-300 runs, alternating with the code before in the
 * same window at load 3-8: 2% to 7% faster in each pair, the best 4.43 ms
 * against 4.77 ms before (0.86 of the day's one-thread fma_peak, 177
 * GFLOP/s, against 0.79); causal 2.57-2.62 ms against 2.66-2.69. Instructions (callgrind, the AVX2 set,
 * valgrind having no AVX-512): 97.4 M against 100.8 M, causal 52.6 M against
 * 54.3 M, 92% of them now in the five products' loops. Before the fused pass,
 * against the single-threaded OpenBLAS sgemm calls before it, the same head
 * went from 7.3-7.4 ms (0.51-0.54 of fma_peak) to 4.9-5.3 ms (0.71-0.77); the
 * micro-kernel alone on a tile's shapes from L1 runs at 0.91-0.96 of it: what
 * is left is each micro-tile's start and end (its k is only 64 in four of
 * the five products), the 4-row and 2-row tail micro-tiles, and D, q's
 * scaling, K^T and V^T per slice.
 *
 * Threads: a work item is one kv group (the g slices of the query heads that
 * share a kv head; one slice without GQA) in an OpenMP parallel for, each
 * item on one thread; its dQ, dK and dV are its own. Every gradient
 * element sums its tiles' terms in a fixed order: dK and dV of a key block
 * over the group's query heads in increasing order, each over the query blocks
 * in increasing i0; dQ of a query block over the key blocks in increasing k0.
 * With fewer groups than threads, the flash kernel splits them instead,
 * without float atomics or a cross-thread reduction: pass 1 items are (group,
 * key block), each owning its rows of dK, dV (and its columns of dbias), pass
 * 2 items are (slice, query block), each owning its rows of dQ (S and dW are
 * computed twice there: 7 products instead of 5). Both ways every element
 * gets the same terms in the same order, so the bits do not depend on the
 * thread count (spec/sdpa_backward_spec.lua and spec/sdpa_variants_grad_spec.lua
 * compare 1 and 2 threads, one slice and one GQA group included). A small
 * call runs on the calling thread alone.
 *
 * Causal cost (A: b4 h12 n1024 E64, flash): the backward is 0.52 to 0.54 of
 * the non-causal one's, with the diagonal's row steps (before them: 0.53 to
 * 0.54 in the same runs, the causal backward 1.3% slower; 1 thread, CPU time,
 * three interleaved runs at load 5). On the micro-kernels: 0.53 to 0.56 (one
 * [1024, 64] head, 1 thread, best of 100 runs each, the two in the same
 * window at load 10); with the fused pass (the diagonal's steps too) 0.53 to
 * 0.55 (best of 300, causal and dense in the same window), 0.54 before. Above 0.5 remain the hidden corners of the 32-row
 * steps, the diagonal tiles' smaller products and what every slice costs
 * whatever its mask (D, q's scaling, zeroing the gradients, K^T and V^T).
 *
 * Error: against torch 1.13 autograd in float64 at most 4.8e-6 absolute
 * without variants (spec/sdpa_backward_spec.lua, Lq, Lk up to 300) and, with
 * every variant alone and combined (spec/sdpa_variants_grad_spec.lua, Lq, Lk
 * up to 1030), 3.7e-6 (math) and 1.1e-5 (flash) absolute with |gradients| up
 * to 11: within 1e-5 relative + 1e-5 absolute everywhere. With the
 * micro-kernels' summation order in place of OpenBLAS's, the largest
 * gradient error over every fixture of the two specs (both kernels) is 2.7e-6
 * (AVX-512; 3.2e-6 scalar) without variants, was 2.4e-6 (2.9e-6), and
 * 1.1e-5 (9.3e-6 scalar) with them, as before; spec/sdpa_backward_kernels_spec.lua
 * holds every set within 1e-5 of a float64 reference computed in Lua; the
 * fused pass changed no bit of any gradient (every set, 1 and 2 threads, the
 * same specs' cases and more compared with the code before). Flash and math
 * agree within 1e-4 relative + 2e-5 at 1030. The flash kernel's recomputed P
 * differs from the forward's by the rounding of its own S and exp(S - lse) (a
 * few ulp); softcap's tanh (attn_sdpa_tanh, 4.1e-7 absolute) adds at most
 * about 1e-6 relative to 1 - tanh^2. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "exp_nonpos.h"
#include "kernels_bwd.h"
#include "rng.h"
#include "sdpa_backward.h"
#include "small_gemm.h"
#include "threads.h"

#define BQ ATTN_SDPA_BWD_BQ
#define BK ATTN_SDPA_BWD_BK
/* Multiply-adds of one score product below which a call runs on one thread. */
#define SERIAL_WORK (1 << 18)
/* Most floats of scaled q a thread holds (256 KiB): a slice of more query
 * rows is run in chunks of query blocks, each loaded once. A whole slice's
 * [Lq, E] per thread was 8 MiB of C_causal_bwd's peak RSS, and 1 MiB chunks
 * still left the freed scratch too big for the holes the next call's
 * smaller blocks had cut in it: the heap grew 2 MiB a call. */
#define QS_FLOATS (1 << 16)

/* A [rows, cols] operand of a slice as the row-major products read it: in place
 * when its columns are contiguous, else packed per slice. */
typedef struct bwd_operand {
  int pack;
  int64_t ld; /* leading dimension in place (pack: cols) */
} bwd_operand;

static bwd_operand operand_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  bwd_operand o = {1, cols > 1 ? cols : 1};
  int cols_ok = sc == 1 || cols <= 1;
  int rows_ok = rows <= 1 || sr >= (cols > 1 ? cols : 1);
  if (cols_ok && rows_ok) {
    o.pack = 0;
    o.ld = rows <= 1 ? (cols > 1 ? cols : 1) : sr;
    if (o.ld > INT_MAX) o.pack = 1, o.ld = cols > 1 ? cols : 1;
  }
  return o;
}

typedef struct bwd_ctx {
  attn_sdpa_problem p;
  attn_sdpa_problem after_cap; /* p without its softcap: the modifications that follow the cap (flash) */
  int64_t group;               /* query heads per kv head (enable_gqa; else 1): slices bi .. bi + group - 1
                                  of a kv group share dK, dV at (bi / group) */
  int64_t ngroups;             /* slices / group */
  attn_sdpa_kernel kernel;
  const attn_flash_kernels *kr; /* the instruction set's exponential (src/core/cpu.h) */
  const attn_bwd_kernels *bk_kr; /* its products (src/core/kernels_bwd.h) */
  const attn_tensor *out, *dout, *saved;
  const attn_tensor *dweights; /* NULL, or the gradient of the weights output (math) */
  attn_sdpa_grads g;
  bwd_operand k, v, dout_l;
  int64_t bk;           /* keys per tile: BK (flash) or Lk (math) */
  int64_t qchunk;       /* query rows of scaled q a thread holds: a multiple of BQ, or Lq */
  int64_t nkblk, nqblk; /* key blocks and query blocks per slice */
  int64_t kv_batch[ATTN_MAX_DIMS]; /* dK and dV's batch shape: B, its last dim / group with GQA */
  int64_t ldgq, ldgk, ldgv;        /* the row strides of dQ, dK and dV (their rows may be strided) */
  /* per-thread scratch, in floats: qs [qchunk, E], kp [Lk, E], vp [Lk, Ev], dop [Lq, Ev] (those packed),
   * d [Lq], s, dw, w [BQ, bk], f [bk], capped [BQ, bk] (softcap), kt [E, bk], vt [Ev, bk] (a key block's
   * K^T and V^T) */
  size_t off_kp, off_vp, off_dop, off_d, off_s, off_dw, off_w, off_f, off_cap, off_kt, off_vt;
  /* score_mod's tables that want a gradient: one buffer of gsize floats per slice (each table at goff[t]),
   * summed in increasing slice order after the parallel region */
  float *gbuf;
  int64_t gsize, goff[ATTN_SMOD_MAX_TABLES];
} bwd_ctx;

/* The offset of index bi of the batch shape batch [nb] in t, of shape
 * [batch..., rows, cols] exactly. */
static int64_t offset_in(int nb, const int64_t *batch, const attn_tensor *t, int64_t bi) {
  int64_t off = 0;
  for (int d = nb - 1; d >= 0; d--) {
    off += (bi % batch[d]) * t->stride[d];
    bi /= batch[d];
  }
  return off;
}

/* The offset of slice bi in t, of shape [B..., rows, cols] exactly. */
static int64_t batch_offset(const attn_sdpa_problem *p, const attn_tensor *t, int64_t bi) {
  return offset_in(p->nbatch, p->batch, t, bi);
}

/* The offset of kv group gi in t, of shape [Bkv..., rows, cols] (dK, dV). */
static int64_t kv_offset(const bwd_ctx *c, const attn_tensor *t, int64_t gi) {
  return offset_in(c->p.nbatch, c->kv_batch, t, gi);
}

/* rows [r0, r1) of strided rows (row stride ld) set to 0: vector stores in
 * place (a memset call per row of a head's 32 floats cost more than its
 * stores; GCC would turn the loop back into one) */
ATTN_VECTOR_CLONES __attribute__((optimize("no-tree-loop-distribute-patterns"))) static void
zero_strided_rows(float *g, int64_t r0, int64_t r1, int64_t cols, int64_t ld) {
  for (int64_t r = r0; r < r1; r++) {
    float *gr = g + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) gr[j] = 0.0f;
  }
}

/* rows [r0, r1) of a gradient [rows, cols] (row stride ld) set to 0 */
static void zero_rows(float *g, int64_t r0, int64_t r1, int64_t cols, int64_t ld) {
  if (ld == cols)
    memset(g + r0 * ld, 0, (size_t)((r1 - r0) * cols) * sizeof(float));
  else
    zero_strided_rows(g, r0, r1, cols, ld);
}

/* columns [j0, j1) of row r of a tile (row stride ld) set to 0; none for a NULL tile */
static void zero_cols(float *tile, int64_t r, int64_t ld, int64_t j0, int64_t j1) {
  if (tile && j1 > j0) memset(tile + r * ld + j0, 0, (size_t)(j1 - j0) * sizeof(float));
}

/* src [rows, cols] strided -> dst row-major (ld = cols). */
static void pack_rows(const float *src, int64_t rows, int64_t cols, int64_t sr, int64_t sc, float *dst) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = src[r * sr + c * sc];
}

/* c [m, n] (row stride ldc) = alpha op(a) b (+ c when accumulate), op(a) =
 * a [m, kk] (row stride lda), or the transpose of a [kk, m] when trans_a;
 * b [kk, n] (row stride ldb). Tiny products as direct loops, the others
 * with the instruction set's micro-kernels: the sizes choose, never the
 * threads. */
static void gemm(const bwd_ctx *c, int trans_a, int64_t m, int64_t n, int64_t kk, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, int accumulate, float *cc, int64_t ldc) {
  if (m * n * kk <= ATTN_SMALL_GEMM_MACS)
    attn_small_gemm(trans_a, 0, m, n, kk, alpha, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, cc, ldc);
  else
    c->bk_kr->gemm(m, n, kk, a, trans_a ? 1 : lda, trans_a ? lda : 1, b, ldb, alpha, cc, ldc, accumulate);
}

/* c [m, n] = a [m, kk] b^T, b [n, kk] (row stride ldb) also given transposed
 * as bt [kk, n] (row stride ldbt) for the micro-kernels. */
static void gemm_nt(const bwd_ctx *c, int64_t m, int64_t n, int64_t kk, const float *a, int64_t lda, const float *b,
                    int64_t ldb, const float *bt, int64_t ldbt, float *cc, int64_t ldc) {
  if (m * n * kk <= ATTN_SMALL_GEMM_MACS)
    attn_small_gemm(0, 1, m, n, kk, 1.0f, a, lda, b, ldb, 0.0f, cc, ldc);
  else
    c->bk_kr->gemm(m, n, kk, a, lda, 1, bt, ldbt, 1.0f, cc, ldc, 0);
}

/* What the tiles of slice bi read and write, in the calling thread's
 * scratch block: dO and D hold the rows a work item needs, K and V the
 * keys (row i of dO at dop + i lddo, wherever it was filled); qs the query
 * rows [q0, q0 + qn) of the scaled q (qn 0: none yet). */
typedef struct bwd_slice {
  attn_sdpa_slice sl;
  int64_t bi;
  float *qs;
  int64_t q0, qn;
  const float *kp, *vp, *dop, *dd, *lse, *probs;
  float *kt, *vt; /* K^T [E, bk] and V^T [Ev, bk] of the keys [kt0, kt0 + bk) (row stride bk) */
  int64_t kt0, ldkt;
  const float *dwt; /* NULL, or the gradient of the weights [Lq, Lk] (strides sdw0, sdw1) */
  int64_t sdw0, sdw1;
  int64_t ldk, ldv, lddo;
  float *dq, *dk, *dv, *dbias; /* this slice's gradients */
  float *s, *dw, *wd, *f;      /* tiles: S/P, dW/dS, W [BQ, bk]; f [bk] */
  float *capped;               /* softcap or score_mod: the tile's scores as score_mod gets them (the capped
                                  c tanh(S0 / c), or S0) [BQ, bk]; else NULL */
  float *gbuf;                 /* NULL, or this slice's buffer of the score_mod tables' gradients */
  int fusable;                 /* flash with nothing between S and P but the visible range (no bias, mask,
                                  ALiBi, softcap, score_mod, block mask, mask_mod) and nothing between dW and
                                  dS (no dropout, no weights' gradient), in a set with p_ds */
} bwd_slice;

/* Prepare slice bi for query rows [r0, r1) and keys [c0, c1) with scratch w. */
static void prepare_slice(const bwd_ctx *c, int64_t bi, float *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          bwd_slice *t) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, lk = p->lk, e = p->e, ev = p->ev;
  int nb = p->nbatch;
  t->bi = bi;
  attn_sdpa_slice_at(p, bi, &t->sl);
  t->dq = c->g.dq->data + batch_offset(p, c->g.dq, bi);
  t->dk = c->g.dk->data + kv_offset(c, c->g.dk, bi / c->group); /* GQA: the kv head's, shared by its group */
  t->dv = c->g.dv->data + kv_offset(c, c->g.dv, bi / c->group);
  t->dbias = c->g.dbias ? c->g.dbias->data + bi * lq * lk : NULL;
  /* qs: fl(q * scale) as the forward, loaded by load_qs */
  t->qs = w;
  t->q0 = t->qn = 0;
  /* k [Lk, E], v [Lk, Ev], dO [Lq, Ev]: in place or packed */
  t->kp = t->sl.k, t->vp = t->sl.v;
  t->kt = w + c->off_kt, t->vt = w + c->off_vt, t->kt0 = -1, t->ldkt = c->bk;
  t->ldk = c->k.ld, t->ldv = c->v.ld, t->lddo = c->dout_l.ld;
  if (c->k.pack) {
    int64_t sr = attn_sdpa_row_stride(p, &p->k);
    pack_rows(t->sl.k + c0 * sr, c1 - c0, e, sr, attn_sdpa_col_stride(p, &p->k), w + c->off_kp + c0 * e);
    t->kp = w + c->off_kp;
  }
  if (c->v.pack) {
    int64_t sr = attn_sdpa_row_stride(p, &p->v);
    pack_rows(t->sl.v + c0 * sr, c1 - c0, ev, sr, attn_sdpa_col_stride(p, &p->v), w + c->off_vp + c0 * ev);
    t->vp = w + c->off_vp;
  }
  const attn_tensor *dout = c->dout, *out = c->out;
  const float *dop = dout->data + batch_offset(p, dout, bi);
  if (c->dout_l.pack) {
    pack_rows(dop + r0 * dout->stride[nb], r1 - r0, ev, dout->stride[nb], dout->stride[nb + 1],
              w + c->off_dop + r0 * ev);
    dop = w + c->off_dop;
  }
  t->dop = dop;
  /* D [Lq] = rowsum(dO * O), each row's sum in double in increasing d; four
   * rows side by side, so the adds of one row do not wait on each other's
   * latency alone */
  float *dd = w + c->off_d;
  const float *o = out->data + batch_offset(p, out, bi);
  int64_t os0 = out->stride[nb], os1 = out->stride[nb + 1], ldo = t->lddo, row = r0;
  for (; row + 4 <= r1; row += 4) {
    const float *d0 = dop + row * ldo, *o0 = o + row * os0;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (int64_t d = 0; d < ev; d++) {
      a0 += (double)d0[d] * (double)o0[d * os1];
      a1 += (double)d0[ldo + d] * (double)o0[os0 + d * os1];
      a2 += (double)d0[2 * ldo + d] * (double)o0[2 * os0 + d * os1];
      a3 += (double)d0[3 * ldo + d] * (double)o0[3 * os0 + d * os1];
    }
    dd[row] = (float)a0, dd[row + 1] = (float)a1, dd[row + 2] = (float)a2, dd[row + 3] = (float)a3;
  }
  for (; row < r1; row++) {
    double acc = 0.0;
    for (int64_t d = 0; d < ev; d++) acc += (double)dop[row * ldo + d] * (double)o[row * os0 + d * os1];
    dd[row] = (float)acc;
  }
  t->dwt = NULL;
  if (c->dweights) { /* D += rowsum(W * dWeights): the weights output's own gradient */
    const attn_tensor *g = c->dweights;
    t->dwt = g->data + batch_offset(p, g, bi);
    t->sdw0 = g->stride[nb], t->sdw1 = g->stride[nb + 1];
    const float *probs = c->saved->data + bi * lq * lk;
    float *f = w + c->off_f;
    for (int64_t i = r0; i < r1; i++) {
      if (p->dropout_p > 0.0) attn_dropout_factors(p->dropout_draw, p->dropout_p, (bi * lq + i) * lk, lk, f);
      double acc = 0.0;
      for (int64_t j = 0; j < lk; j++)
        acc += (double)probs[i * lk + j] * (p->dropout_p > 0.0 ? (double)f[j] : 1.0) *
               (double)t->dwt[i * t->sdw0 + j * t->sdw1];
      dd[i] = (float)((double)dd[i] + acc);
    }
  }
  t->dd = dd;
  t->lse = c->kernel == ATTN_SDPA_FLASH ? c->saved->data + bi * lq : NULL;
  t->probs = c->kernel == ATTN_SDPA_MATH ? c->saved->data + bi * lq * lk : NULL;
  t->s = w + c->off_s, t->dw = w + c->off_dw, t->wd = w + c->off_w, t->f = w + c->off_f;
  t->capped = p->softcap > 0.0f || p->score_mod ? w + c->off_cap : NULL;
  t->gbuf = c->gbuf ? c->gbuf + bi * c->gsize : NULL;
  t->fusable = c->bk_kr->p_ds && t->lse && !t->capped && !t->dwt && p->dropout_p == 0.0 && !t->sl.bias &&
               !t->sl.mask && !p->has_alibi && !t->sl.blocks.kind && !p->mask_mod;
}

/* The scaled q of query rows [r0, r0 + n) of slice t into its qs. */
static void load_qs(const attn_sdpa_problem *p, bwd_slice *t, int64_t r0, int64_t n) {
  attn_sdpa_load_q(p, &t->sl, r0, n, t->qs, p->e, 1);
  t->q0 = r0, t->qn = n;
}

/* K^T and V^T of the key block [k0, k1) of slice t into its kt, vt: packed
 * once per key block, read by the scores and dW of every query block. The
 * set's transposed copy (times 1: the same floats; AVX-512 gathers 16 keys
 * of a column at a time). */
static void load_kv_t(const bwd_ctx *c, bwd_slice *t, int64_t k0, int64_t k1) {
  int64_t e = c->p.e, ev = c->p.ev, ld = t->ldkt;
  c->kr->transpose(t->kp + k0 * t->ldk, t->ldk, 1, k1 - k0, e, t->kt, ld, 1.0f);
  c->kr->transpose(t->vp + k0 * t->ldv, t->ldv, 1, k1 - k0, ev, t->vt, ld, 1.0f);
  t->kt0 = k0;
}

/* dst [rows, kn] (row stride ld) = Qs_i K^T for query rows [i0, i0 + rows)
 * and keys [kb, kb + kn) of slice t: the scaled scores before any
 * modification. */
static void scores(const bwd_ctx *c, const bwd_slice *t, int64_t i0, int64_t rows, int64_t kb, int64_t kn, int64_t e,
                   float *dst, int64_t ld) {
  if (e > 0)
    gemm_nt(c, rows, kn, e, t->qs + (i0 - t->q0) * e, e, t->kp + kb * t->ldk, t->ldk, t->kt + kb - t->kt0, t->ldkt,
            dst, ld);
  else
    for (int64_t r = 0; r < rows; r++) memset(dst + r * ld, 0, (size_t)kn * sizeof(float));
}

enum { TILE_DQ = 1, TILE_DKV = 2 }; /* what a tile adds to: dQ, and/or dK, dV and dbias */

/* Query rows of a step of a tile that its rows see only in part (causal: it
 * crosses the diagonal): each step computes only the keys its rows see. */
#define STEP_ROWS 32

/* One step of a tile: query rows [i0, i0 + rows) and keys [kb, kb + kn),
 * written at row stride ld from s, dw (and wd, capped) of the tile at
 * tile_off (its first row and key): P and W = P * F (the forward's weights),
 * dS = P * (dW * F - D) in dw (and through the cap), dbias; dQ_i += scale dS
 * K_j when asked. *wt, *ldw: where W is (the saved probs, s or wd). */
static void tile_step(const bwd_ctx *c, const bwd_slice *t, int64_t i0, int64_t rows, int64_t kb, int64_t kn,
                      int64_t ld, size_t tile_off, int what, int seen_whole, const float **wt_out,
                      int64_t *ldw_out) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, lk = p->lk, e = p->e, ev = p->ev;
  int64_t ldk = t->ldk, ldv = t->ldv, lddo = t->lddo;
  float *s = t->s + tile_off, *dw = t->dw + tile_off;
  /* nothing modifies the scores but the rows' visible ranges: S -> P and
   * dW -> dS in one pass of the set's fused entry, P = 0 where a row does not
   * see a key (a step of a tile its rows see in part: each row's range), the
   * bits of the separate products and passes below (both products on the
   * micro-kernels: neither is small) */
  if (t->fusable && (seen_whole || rows <= STEP_ROWS) && rows * kn * e > ATTN_SMALL_GEMM_MACS &&
      rows * kn * ev > ATTN_SMALL_GEMM_MACS) {
    int64_t vis[2 * STEP_ROWS];
    if (!seen_whole)
      for (int64_t r = 0; r < rows; r++) {
        attn_key_range kr = attn_sdpa_row_keys(p, i0 + r);
        vis[2 * r] = kr.begin - kb, vis[2 * r + 1] = kr.end - kb;
      }
    c->bk_kr->p_ds(rows, kn, e, t->qs + (i0 - t->q0) * e, e, t->kt + kb - t->kt0, t->ldkt, ev, t->dop + i0 * lddo,
                   lddo, t->vt + kb - t->kt0, t->ldkt, t->lse + i0, t->dd + i0, seen_whole ? NULL : vis, s, ld, dw,
                   ld);
    *wt_out = s;
    *ldw_out = ld;
    if ((what & TILE_DQ) && e > 0)
      gemm(c, 0, rows, e, kn, p->scale, dw, ld, t->kp + kb * ldk, ldk, 1, t->dq + i0 * c->ldgq, c->ldgq);
    return;
  }
  /* softcap: the capped scores s' = c tanh(S0 / c), S0 = Qs_i K^T, recomputed
   * (math too: its saved P cannot give them back where it underflowed) */
  float *capped = t->capped ? t->capped + tile_off : NULL;
  if (capped) {
    scores(c, t, i0, rows, kb, kn, e, capped, ld);
    if (p->softcap > 0.0f) attn_sdpa_softcap_tile(p->softcap, rows, kn, capped, ld, 1);
  }
  /* P [rows, kn] at pt (row stride ldp) */
  const float *pt;
  int64_t ldp;
  if (t->probs) {
    pt = t->probs + i0 * lk + kb;
    ldp = lk;
  } else {
    /* S = Qs_i K^T, modified as in the forward, then P = exp(S - lse) */
    if (capped) {
      for (int64_t r = 0; r < rows; r++) memcpy(s + r * ld, capped + r * ld, (size_t)kn * sizeof(float));
      attn_sdpa_modify_tile(&c->after_cap, &t->sl, i0, rows, kb, kn, s, ld, 1);
    } else {
      scores(c, t, i0, rows, kb, kn, e, s, ld);
      attn_sdpa_modify_tile(p, &t->sl, i0, rows, kb, kn, s, ld, 1);
    }
    for (int64_t r = 0; r < rows; r++) {
      float l = t->lse[i0 + r], *sr = s + r * ld;
      if (l == -INFINITY)
        memset(sr, 0, (size_t)kn * sizeof(float));
      else
        c->kr->exp_minus(sr, kn, l);
    }
    pt = s;
    ldp = ld;
  }
  /* dW = dO_i V^T [rows, kn] */
  if (ev > 0)
    gemm_nt(c, rows, kn, ev, t->dop + i0 * lddo, lddo, t->vp + kb * ldv, ldv, t->vt + kb - t->kt0, t->ldkt, dw, ld);
  else
    for (int64_t r = 0; r < rows; r++) memset(dw + r * ld, 0, (size_t)kn * sizeof(float));
  /* dW += the weights output's gradient */
  if (t->dwt)
    for (int64_t r = 0; r < rows; r++) {
      const float *gr = t->dwt + (i0 + r) * t->sdw0 + kb * t->sdw1;
      for (int64_t j = 0; j < kn; j++) dw[r * ld + j] += gr[j * t->sdw1];
    }
  /* W = P * F (the forward's weights after dropout) and dW * F */
  *wt_out = pt;
  *ldw_out = ldp;
  if (p->dropout_p > 0.0) {
    float *wd = t->wd + tile_off;
    for (int64_t r = 0; r < rows; r++) {
      attn_dropout_factors(p->dropout_draw, p->dropout_p, (t->bi * lq + i0 + r) * lk + kb, kn, t->f);
      for (int64_t j = 0; j < kn; j++) {
        wd[r * ld + j] = pt[r * ldp + j] * t->f[j];
        dw[r * ld + j] *= t->f[j];
      }
    }
    *wt_out = wd;
    *ldw_out = ld;
  }
  /* dS = P * (dW - D) in dw; 0 where P is (hidden keys, rows with no key) */
  c->bk_kr->ds_rows(pt, ldp, dw, ld, rows, kn, t->dd + i0);
  for (int64_t r = 0; r < rows; r++) {
    float *dr = dw + r * ld;
    if ((what & TILE_DKV) && t->dbias) memcpy(t->dbias + (i0 + r) * lk + kb, dr, (size_t)kn * sizeof(float));
    if (p->score_mod) /* through the program (its tables' gradients once per element: with dK, dV) */
      attn_score_mod_backward_row(p->score_mod, t->sl.b, t->sl.h, i0 + r, kb, kn, capped + r * ld, dr,
                                  (what & TILE_DKV) ? t->gbuf : NULL, c->goff);
    if (p->softcap > 0.0f) { /* through the cap: dS0 = dS' (1 - tanh^2) = dS' (1 - (s' / c)^2) */
      const float *cr = capped + r * ld;
      float inv_cap = 1.0f / p->softcap;
#pragma omp simd
      for (int64_t j = 0; j < kn; j++) {
        float u = cr[j] * inv_cap;
        dr[j] *= 1.0f - u * u;
      }
    }
  }
  /* dQ_i += scale dS K_j [rows, E] */
  if ((what & TILE_DQ) && e > 0)
    gemm(c, 0, rows, e, kn, p->scale, dw, ld, t->kp + kb * ldk, ldk, 1, t->dq + i0 * c->ldgq, c->ldgq);
}

/* The tile of query rows [i0, i0 + BQ) and keys [k0, k1) of slice t, cut to
 * the keys its rows see (none: nothing to do). A tile that its rows see only
 * in part (causal: on the diagonal) runs in steps of STEP_ROWS rows, each cut
 * to the keys they see, with W and dS zero elsewhere in the tile (hidden:
 * their terms are 0), then dV and dK over the whole tile: the scores, dW, dS
 * and dQ skip most of the hidden triangle, and dK, dV stay one product each. */
static void run_tile(const bwd_ctx *c, bwd_slice *t, int64_t i0, int64_t k0, int64_t k1, int what) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, e = p->e, ev = p->ev;
  int64_t rows = lq - i0 < BQ ? lq - i0 : BQ;
  attn_key_range seen = attn_sdpa_rows_keys(p, i0, rows), all = attn_sdpa_common_keys(p, i0, rows);
  int64_t kb = seen.begin > k0 ? seen.begin : k0, ke = seen.end < k1 ? seen.end : k1;
  if (ke <= kb) return;
  /* a block mask's empty blocks are skipped as in the forward (P = 0 there) */
  attn_key_range vis = attn_sdpa_block_keys(p, &t->sl, i0, rows, kb, ke);
  kb = vis.begin, ke = vis.end;
  if (ke <= kb) return;
  if (i0 < t->q0 || i0 + rows > t->q0 + t->qn) load_qs(p, t, i0, rows);
  int64_t kn = ke - kb;
  const float *wt;
  int64_t ldw;
  if (kb >= all.begin && ke <= all.end) {
    tile_step(c, t, i0, rows, kb, kn, kn, 0, what, 1, &wt, &ldw);
  } else {
    float *wd = p->dropout_p > 0.0 ? t->wd : t->probs ? NULL : t->s; /* W, unless the saved probs */
    wt = wd ? wd : t->probs + i0 * p->lk + kb;
    ldw = wd ? kn : p->lk;
    for (int64_t g = 0; g < rows; g += STEP_ROWS) {
      int64_t n = rows - g < STEP_ROWS ? rows - g : STEP_ROWS;
      attn_key_range gk = attn_sdpa_rows_keys(p, i0 + g, n);
      int64_t gb = gk.begin > kb ? gk.begin : kb, ge = gk.end < ke ? gk.end : ke;
      if (ge <= gb) gb = ge = ke; /* a step that sees none of the tile's keys: all zeros */
      /* the step writes W and dS over its keys [gb, ge); zeros around them */
      for (int64_t r = g; r < g + n; r++) {
        zero_cols(wd, r, kn, 0, gb - kb);
        zero_cols(wd, r, kn, ge - kb, kn);
        zero_cols(t->dw, r, kn, 0, gb - kb);
        zero_cols(t->dw, r, kn, ge - kb, kn);
      }
      const float *unused_w;
      int64_t unused_ld;
      if (ge > gb)
        tile_step(c, t, i0 + g, n, gb, ge - gb, kn, (size_t)(g * kn + gb - kb), what, 0, &unused_w,
                  &unused_ld);
    }
  }
  /* dV_j += W^T dO_i [kn, Ev]; dK_j += dS^T Qs_i [kn, E] */
  if ((what & TILE_DKV) && ev > 0)
    gemm(c, 1, kn, ev, rows, 1.0f, wt, ldw, t->dop + i0 * t->lddo, t->lddo, 1, t->dv + kb * c->ldgv, c->ldgv);
  if ((what & TILE_DKV) && e > 0)
    gemm(c, 1, kn, e, rows, 1.0f, t->dw, kn, t->qs + (i0 - t->q0) * e, e, 1, t->dk + kb * c->ldgk, c->ldgk);
}

/* Work item `item` with the calling thread's scratch block w. By group: the
 * item is kv group gi (one slice without GQA), its slices bi = gi g .. gi g +
 * g - 1 in increasing bi, every tile of each (key blocks in increasing k0,
 * query blocks in increasing i0 inside each). Two passes: pass 1 (items of
 * dK, dV and dbias) is (group, key block) over its slices in increasing bi,
 * each over its query blocks in increasing i0; pass 2 (items of dQ) is
 * (slice, query block) over the key blocks in increasing k0. Each gradient
 * element gets the same tiles' terms in the same order either way (a dK row:
 * bi, then i0; a dQ row: k0), so both give the same bits. */
static void run_item(const bwd_ctx *c, int64_t item, int pass, float *w) {
  const attn_sdpa_problem *p = &c->p;
  int64_t lq = p->lq, lk = p->lk, e = p->e, ev = p->ev, g = c->group;
  bwd_slice t;
  if (pass == 0) { /* the whole kv group */
    int64_t gi = item;
    zero_rows(c->g.dk->data + kv_offset(c, c->g.dk, gi), 0, lk, e, c->ldgk);
    zero_rows(c->g.dv->data + kv_offset(c, c->g.dv, gi), 0, lk, ev, c->ldgv);
    for (int64_t bi = gi * g; bi < (gi + 1) * g; bi++) {
      zero_rows(c->g.dq->data + batch_offset(p, c->g.dq, bi), 0, lq, e, c->ldgq);
      if (c->g.dbias) memset(c->g.dbias->data + bi * lq * lk, 0, (size_t)(lq * lk) * sizeof(float));
      if (lq == 0 || lk == 0) continue;
      prepare_slice(c, bi, w, 0, lq, 0, lk, &t);
      /* in chunks of query rows (one, unless the slice's scaled q is over
       * QS_FLOATS): each gradient element still gets its terms in the order
       * above, dK and dV rows over increasing i0 chunk after chunk */
      for (int64_t q0 = 0; q0 < lq; q0 += c->qchunk) {
        int64_t q1 = lq - q0 < c->qchunk ? lq : q0 + c->qchunk;
        load_qs(p, &t, q0, q1 - q0);
        for (int64_t k0 = 0; k0 < lk; k0 += c->bk) {
          int64_t k1 = lk - k0 < c->bk ? lk : k0 + c->bk;
          load_kv_t(c, &t, k0, k1);
          for (int64_t i0 = q0; i0 < q1; i0 += BQ) run_tile(c, &t, i0, k0, k1, TILE_DQ | TILE_DKV);
        }
      }
    }
  } else if (pass == 1) { /* kv group gi, keys [k0, k1): dK, dV and dbias */
    int64_t gi = item / c->nkblk, k0 = item % c->nkblk * c->bk, k1 = lk - k0 < c->bk ? lk : k0 + c->bk;
    zero_rows(c->g.dk->data + kv_offset(c, c->g.dk, gi), k0, k1, e, c->ldgk);
    zero_rows(c->g.dv->data + kv_offset(c, c->g.dv, gi), k0, k1, ev, c->ldgv);
    for (int64_t bi = gi * g; bi < (gi + 1) * g; bi++) {
      if (c->g.dbias)
        for (int64_t i = 0; i < lq; i++)
          memset(c->g.dbias->data + (bi * lq + i) * lk + k0, 0, (size_t)(k1 - k0) * sizeof(float));
      prepare_slice(c, bi, w, 0, lq, k0, k1, &t);
      load_kv_t(c, &t, k0, k1);
      for (int64_t i0 = 0; i0 < lq; i0 += BQ) run_tile(c, &t, i0, k0, k1, TILE_DKV);
    }
  } else { /* slice bi, query rows [i0, i0 + BQ): dQ */
    int64_t bi = item / c->nqblk, i0 = item % c->nqblk * BQ, i1 = lq - i0 < BQ ? lq : i0 + BQ;
    zero_rows(c->g.dq->data + batch_offset(p, c->g.dq, bi), i0, i1, e, c->ldgq);
    prepare_slice(c, bi, w, i0, i1, 0, lk, &t);
    for (int64_t k0 = 0; k0 < lk; k0 += c->bk) {
      int64_t k1 = lk - k0 < c->bk ? lk : k0 + c->bk;
      load_kv_t(c, &t, k0, k1);
      run_tile(c, &t, i0, k0, k1, TILE_DQ);
    }
  }
}

/* t is contiguous with exactly the sizes (batch: nb batch dims, then rows, cols). */
static int has_shape(const attn_tensor *t, int nb, const int64_t *batch, int64_t rows, int64_t cols, int contiguous) {
  if (t->ndim != nb + 2 || (contiguous && !attn_is_contiguous(t))) return 0;
  for (int d = 0; d < nb; d++)
    if (t->size[d] != batch[d]) return 0;
  return t->size[nb] == rows && t->size[nb + 1] == cols;
}

/* ATTN_ESHAPE naming `what` unless t has the sizes [batch..., rows, cols]
 * (and is contiguous when asked). */
static attn_status check_shape_of(const attn_tensor *t, int nb, const int64_t *batch, int64_t rows, int64_t cols,
                                  int contiguous, const char *what) {
  if (has_shape(t, nb, batch, rows, cols, contiguous)) return ATTN_OK;
  int64_t want[ATTN_MAX_DIMS];
  memcpy(want, batch, (size_t)nb * sizeof(int64_t));
  want[nb] = rows;
  want[nb + 1] = cols;
  char b1[200], b2[200];
  return attn_fail(ATTN_ESHAPE, "%s must be %s%s, got %s", what, contiguous ? "contiguous " : "",
                   attn_sizes_str(nb + 2, want, b1, sizeof b1), attn_shape_str(t, b2, sizeof b2));
}

/* A gradient dq, dk or dv: exactly [batch..., rows, cols], each row's
 * elements adjacent (unit stride) and no two elements at one address (rows
 * may be strided: a module's heads side by side in its rows). ATTN_ESHAPE
 * naming `what` otherwise; its row stride in *ld. */
static attn_status check_grad(const attn_tensor *t, int nb, const int64_t *batch, int64_t rows, int64_t cols,
                              const char *what, int64_t *ld) {
  attn_status st = check_shape_of(t, nb, batch, rows, cols, 0, what);
  if (st != ATTN_OK) return st;
  int unit = cols <= 1 || t->stride[nb + 1] == 1;
  if (!unit || attn_has_internal_overlap(t)) {
    char b[200];
    return attn_fail(ATTN_ESHAPE, "%s must have unit-stride rows that do not overlap, got %s", what,
                     attn_shape_str(t, b, sizeof b));
  }
  *ld = rows > 1 ? t->stride[nb] : (cols > 1 ? cols : 1);
  return ATTN_OK;
}

/* check_shape_of with the problem's batch shape B. */
static attn_status check_shape(const attn_tensor *t, const attn_sdpa_problem *p, int64_t rows, int64_t cols,
                               int contiguous, const char *what) {
  return check_shape_of(t, p->nbatch, p->batch, rows, cols, contiguous, what);
}

/* forward's call, out, dout, saved (probs or lse) -> dq, dk, dv, dbias */
attn_status attn_sdpa_backward(attn_sdpa_kernel kernel, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_sdpa_opts *opts, const attn_tensor *out,
                               const attn_tensor *dout, const attn_tensor *saved, const attn_tensor *dweights,
                               const attn_sdpa_grads *grads) {
  if (kernel != ATTN_SDPA_MATH && kernel != ATTN_SDPA_FLASH)
    return attn_fail(ATTN_EARG, "the backward needs the kernel the forward ran (math or flash)");
  if (opts->lse || opts->probs) return attn_fail(ATTN_EARG, "the backward's options must not ask for lse or probs");
  bwd_ctx c;
  memset(&c, 0, sizeof c);
  attn_status st = attn_sdpa_describe(q, k, v, opts, &c.p);
  if (st != ATTN_OK) return st;
  const attn_sdpa_problem *p = &c.p;
  char b1[200], b2[200];
  if ((st = check_shape(out, p, p->lq, p->ev, 0, "out")) != ATTN_OK) return st;
  if ((st = check_shape(dout, p, p->lq, p->ev, 0, "dout")) != ATTN_OK) return st;
  if (kernel == ATTN_SDPA_MATH) {
    if ((st = check_shape(saved, p, p->lq, p->lk, 1, "the saved probs")) != ATTN_OK) return st;
  } else {
    int ok = saved->ndim == p->nbatch + 1 && attn_is_contiguous(saved) && saved->size[p->nbatch] == p->lq;
    for (int d = 0; ok && d < p->nbatch; d++) ok = saved->size[d] == p->batch[d];
    if (!ok) {
      int64_t want[ATTN_MAX_DIMS];
      memcpy(want, p->batch, (size_t)p->nbatch * sizeof(int64_t));
      want[p->nbatch] = p->lq;
      return attn_fail(ATTN_ESHAPE, "the saved lse must be contiguous %s, got %s",
                       attn_sizes_str(p->nbatch + 1, want, b1, sizeof b1), attn_shape_str(saved, b2, sizeof b2));
    }
  }
  if (dweights) {
    if (kernel != ATTN_SDPA_MATH) return attn_fail(ATTN_EARG, "dweights needs the math kernel (the weights are its)");
    if ((st = check_shape(dweights, p, p->lq, p->lk, 0, "dweights")) != ATTN_OK) return st;
  }
  if ((st = check_grad(grads->dq, p->nbatch, p->batch, p->lq, p->e, "dq", &c.ldgq)) != ATTN_OK) return st;
  /* dk, dv: one per kv head (enable_gqa: B with its head dim divided by the group) */
  c.group = p->gqa_group > 1 ? p->gqa_group : 1;
  memcpy(c.kv_batch, p->batch, (size_t)p->nbatch * sizeof(int64_t));
  if (c.group > 1) c.kv_batch[p->nbatch - 1] /= c.group;
  if ((st = check_grad(grads->dk, p->nbatch, c.kv_batch, p->lk, p->e, "dk", &c.ldgk)) != ATTN_OK) return st;
  if ((st = check_grad(grads->dv, p->nbatch, c.kv_batch, p->lk, p->ev, "dv", &c.ldgv)) != ATTN_OK) return st;
  if (grads->dbias) {
    if (!p->has_bias) return attn_fail(ATTN_EARG, "dbias given for a call without bias");
    if ((st = check_shape(grads->dbias, p, p->lq, p->lk, 1, "dbias")) != ATTN_OK) return st;
  }
  c.kernel = kernel;
  c.kr = attn_cpu_kernels();
  c.bk_kr = attn_bwd_kernels_for(c.kr);
  c.out = out;
  c.dout = dout;
  c.saved = saved;
  c.dweights = dweights;
  c.g = *grads;
  c.after_cap = c.p;
  c.after_cap.softcap = 0.0f;
  int64_t nb = attn_sizes_product(p->nbatch, p->batch);
  if (nb == 0) return ATTN_OK;
  c.ngroups = nb / c.group;

  int nbd = p->nbatch;
  c.k = operand_layout(p->lk, p->e, p->k.stride[nbd], p->k.stride[nbd + 1]);
  c.v = operand_layout(p->lk, p->ev, p->v.stride[nbd], p->v.stride[nbd + 1]);
  c.dout_l = operand_layout(p->lq, p->ev, dout->stride[nbd], dout->stride[nbd + 1]);
  c.bk = kernel == ATTN_SDPA_FLASH ? BK : (p->lk > 0 ? p->lk : 1);
  int64_t bq = p->lq < BQ ? p->lq : BQ;

  size_t block = 0;
  c.qchunk = p->lq;
  if (p->e > 0 && p->lq * p->e > QS_FLOATS) c.qchunk = QS_FLOATS / p->e / BQ * BQ;
  if (c.qchunk < bq) c.qchunk = bq;
  int ok = attn_sdpa_add_floats(&block, c.qchunk, p->e);
  c.off_kp = block;
  if (c.k.pack) ok = ok && attn_sdpa_add_floats(&block, p->lk, p->e);
  c.off_vp = block;
  if (c.v.pack) ok = ok && attn_sdpa_add_floats(&block, p->lk, p->ev);
  c.off_dop = block;
  if (c.dout_l.pack) ok = ok && attn_sdpa_add_floats(&block, p->lq, p->ev);
  c.off_d = block;
  ok = ok && attn_sdpa_add_floats(&block, p->lq, 1);
  c.off_s = block;
  if (kernel == ATTN_SDPA_FLASH) ok = ok && attn_sdpa_add_floats(&block, bq, c.bk);
  c.off_dw = block;
  ok = ok && attn_sdpa_add_floats(&block, bq, c.bk);
  c.off_w = block;
  if (p->dropout_p > 0.0) ok = ok && attn_sdpa_add_floats(&block, bq, c.bk);
  c.off_f = block;
  ok = ok && attn_sdpa_add_floats(&block, c.bk, 1);
  c.off_cap = block;
  if (p->softcap > 0.0f || p->score_mod) ok = ok && attn_sdpa_add_floats(&block, bq, c.bk);
  c.off_kt = block;
  ok = ok && attn_sdpa_add_floats(&block, p->e, c.bk);
  c.off_vt = block;
  ok = ok && attn_sdpa_add_floats(&block, p->ev, c.bk);
  /* fewer kv groups than threads (flash, with keys and queries to split): two
   * passes over (group or slice, block) items instead of one over groups, the
   * same bits; a small call runs on the calling thread (waking a team costs
   * more than its work) */
  c.nkblk = (p->lk + c.bk - 1) / c.bk;
  c.nqblk = (p->lq + BQ - 1) / BQ;
  int64_t maxblk = c.nkblk > c.nqblk ? c.nkblk : c.nqblk;
  int small = (double)nb * (double)p->lq * (double)p->lk * (double)(p->e + p->ev) < SERIAL_WORK;
  if (p->score_mod) c.gsize = attn_score_mod_grad_floats(p->score_mod, c.goff);
  /* tables' gradients: per slice buffers filled by one item each, so one pass over the groups */
  int two_pass = kernel == ATTN_SDPA_FLASH && !small && maxblk > 1 && c.gsize == 0 &&
                 c.ngroups < attn_threads_for(c.ngroups * maxblk);
  if (c.gsize > 0) {
    size_t nfl;
    if (__builtin_mul_overflow((size_t)nb, (size_t)c.gsize, &nfl) || nfl > SIZE_MAX / sizeof(float))
      return attn_fail(ATTN_EOVERFLOW, "the score_mod tables' gradient buffers overflow");
    c.gbuf = calloc(nfl, sizeof(float));
    if (!c.gbuf) return attn_fail(ATTN_ENOMEM, "out of memory for the score_mod tables' gradients (%zu floats)", nfl);
  }
  attn_sdpa_work work;
  if ((st = attn_sdpa_plan_work(p, two_pass ? maxblk : 1, block, ok, &work)) != ATTN_OK) {
    free(c.gbuf);
    return st;
  }
  if (small) work.nthreads = 1;
  if (!two_pass && work.nthreads > attn_threads_for(c.ngroups)) work.nthreads = attn_threads_for(c.ngroups);
  int64_t pass_items[2] = {two_pass ? c.ngroups * c.nkblk : c.ngroups, two_pass ? nb * c.nqblk : 0};
  /* items handed out dynamically (the team may be shared): each computed whole by one thread */
#pragma omp parallel num_threads(work.nthreads) if (work.nthreads > 1)
  {
    omp_set_num_threads(1); /* anything threaded called in here runs on one thread (the region's own ICV) */
    float *w = work.scratch + work.block * (size_t)omp_get_thread_num();
    for (int pass = 0; pass < 2; pass++) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < pass_items[pass]; it++) run_item(&c, it, two_pass ? pass + 1 : 0, w);
    }
  }
  free(work.scratch);
  if (c.gbuf) { /* each table's gradient: the slices' buffers summed in increasing slice order */
    const attn_score_mod *m = p->score_mod;
    for (int tb = 0; tb < m->ntables; tb++) {
      if (c.goff[tb] < 0) continue;
      int64_t n = attn_sizes_product(m->tables[tb].ndim, m->tables[tb].size);
      float *g = m->tables[tb].grad;
      memcpy(g, c.gbuf + c.goff[tb], (size_t)n * sizeof(float));
      for (int64_t bi = 1; bi < nb; bi++) {
        const float *src = c.gbuf + bi * c.gsize + c.goff[tb];
        for (int64_t x = 0; x < n; x++) g[x] += src[x];
      }
    }
    free(c.gbuf);
  }
  return ATTN_OK;
}

/* full [B..., r, c] -> dst, summed over the dims dst broadcasts along */
attn_status attn_sdpa_sum_to(const attn_tensor *full, attn_tensor *dst) {
  char b1[200], b2[200];
  int nf = full->ndim, nd = dst->ndim;
  int ok = nd <= nf && attn_is_contiguous(full) && attn_is_contiguous(dst);
  /* dst's stride along each dim of full: 0 where dst is broadcast */
  int64_t sd[ATTN_MAX_DIMS];
  for (int d = 0; ok && d < nf; d++) {
    int dd = d - (nf - nd);
    if (dd < 0) {
      sd[d] = 0;
    } else if (dst->size[dd] == full->size[d]) {
      sd[d] = full->size[d] == 1 ? 0 : dst->stride[dd];
    } else if (dst->size[dd] == 1) {
      sd[d] = 0;
    } else {
      ok = 0;
    }
  }
  if (!ok)
    return attn_fail(ATTN_ESHAPE, "cannot sum %s to %s (contiguous, broadcastable)", attn_shape_str(full, b1, sizeof b1),
                     attn_shape_str(dst, b2, sizeof b2));
  int64_t n = attn_numel(dst);
  memset(dst->data, 0, (size_t)n * sizeof(float));
  if (attn_numel(full) == 0) return ATTN_OK;
  int64_t idx[ATTN_MAX_DIMS] = {0};
  const float *src = full->data;
  int64_t inner = nf > 0 ? full->size[nf - 1] : 1, sin = nf > 0 ? sd[nf - 1] : 0, off = 0;
  for (;;) {
    float *row = dst->data + off;
    for (int64_t j = 0; j < inner; j++) row[j * sin] += src[j];
    src += inner;
    int d = nf - 2;
    for (; d >= 0; d--) {
      off += sd[d];
      if (++idx[d] < full->size[d]) break;
      off -= sd[d] * full->size[d];
      idx[d] = 0;
    }
    if (d < 0) break;
  }
  return ATTN_OK;
}
