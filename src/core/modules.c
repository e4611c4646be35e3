/* Fused forward of the causal self-attention modules (see modules.h).
 *
 * Two paths with the numbers of the module-by-module Lua path:
 *  - tiny problems (the notebooks' [2, 6, 3] batches): direct loops on the
 *    calling thread. A Linear output is an FMA chain over d_in from 0 (as the
 *    sgemm micro-kernel accumulates), then + bias; the attention rows follow
 *    the math kernel through the attention core (src/core/sdpa_common.h: the heads are
 *    described as strided views of the projections, q scaled in float32,
 *    mask/causal by attn_sdpa_modify_tile) and its row softmax
 *    (max-subtracted expf, sum in double, one reciprocal, dropout factors by
 *    element index). No BLAS call and no OpenMP region: at this size their
 *    fixed costs (and an OpenMP team waking up on a loaded machine) are the
 *    whole call. The causal calls without dropout (the notebooks') run the
 *    same arithmetic as one lean loop (forward_tiny_causal), whose call
 *    overheads were most of the time.
 *  - everything else: one sgemm per projection (the heads are strided views
 *    of its output, no copy), the attention kernel that kernel = "auto"
 *    picks (attn_sdpa_run: the core's one choice), one transpose of the
 *    context and out_proj. The training forward
 *    (attn_self_attention_forward_saving) runs the same steps into the
 *    caller's buffers and keeps the attention's softmax or log-sum-exp, so
 *    the backward recomputes nothing. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cpu.h"
#include "sdpa_dispatch.h"
#include "modules.h"
#include "modules_backward.h"
#include "modules_tiny.h"
#include "ops.h"
#include "rng.h"
#include "threads.h"

/* Multiply-adds up to which the direct loops beat sgemm's call overhead. */
#define TINY_MACS 32768
/* Floats of the on-stack scratch of the tiny path (16 KiB). */
#define TINY_FLOATS 4096
/* Elements above which an elementwise pass over a projection is threaded. */
#define PARALLEL_ELEMS (1 << 16)

/* A [B, h, n, hd] view of one of Q, K, V ([B*n, d_out] each): heads by strides, no copy. */
static attn_tensor head_view(float *data, int64_t nb, int64_t n, int64_t h, int64_t hd) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.ndim = 4;
  t.size[0] = nb, t.size[1] = h, t.size[2] = n, t.size[3] = hd;
  t.stride[0] = n * h * hd, t.stride[1] = hd, t.stride[2] = h * hd, t.stride[3] = 1;
  return t;
}

/* ------------------------------------------------------------ tiny path */

/* y[j] (j < nout) = x . w[j] (+ b[j]), w [nout, nin] with strides (sw0, sw1):
 * an FMA chain over nin from 0, as the sgemm micro-kernel accumulates. Inlined
 * into both callers, so each FMA clone below gets its own copy. */
static inline __attribute__((always_inline)) void linear_row_chains(const float *x, int64_t nin,
                                                                    const attn_tensor *w, const attn_tensor *b,
                                                                    float *y, int64_t nout) {
  int64_t sw0 = w->stride[0], sw1 = w->stride[1];
  for (int64_t j = 0; j < nout; j++) {
    const float *wj = w->data + j * sw0;
    float acc = 0.0f;
    for (int64_t k = 0; k < nin; k++) acc = fmaf(x[k], wj[k * sw1], acc);
    y[j] = b ? acc + b->data[j * b->stride[0]] : acc;
  }
}

ATTN_FMA_CLONES static void linear_row(const float *x, int64_t nin, const attn_tensor *w, const attn_tensor *b, float *y,
                       int64_t nout) {
  linear_row_chains(x, nin, w, b, y, nout);
}

/* The q, k and v projections of one row x [nin] into y [3 nout] (q, k, v
 * side by side): linear_row's chains, one call. */
ATTN_FMA_CLONES static void linear_row_qkv(const attn_self_attention *m, const float *x, int64_t nin, float *y,
                                           int64_t nout) {
  linear_row_chains(x, nin, m->wq, m->bq, y, nout);
  linear_row_chains(x, nin, m->wk, m->bk, y + nout, nout);
  linear_row_chains(x, nin, m->wv, m->bv, y + 2 * nout, nout);
}

static int tiny_fits(int64_t nb, int64_t n, int64_t d_in, int64_t d_out, int has_out_proj) {
  /* scratch: qkv [n, 3*d_out], ctx [n, d_out], s [n], f [n], qs [d_out] */
  if (n > TINY_FLOATS || d_in > TINY_FLOATS || d_out > TINY_FLOATS) return 0;
  if (n * 4 * d_out + 2 * n + d_out > TINY_FLOATS) return 0;
  double macs = (double)nb * (double)n * ((double)d_in * 3.0 * (double)d_out + 2.0 * (double)n * (double)d_out +
                                          (has_out_proj ? (double)d_out * (double)d_out : 0.0));
  return macs <= TINY_MACS;
}

/* Widths up to which tiny_linear keeps an input row in registers. */
#define TINY_NIN_REGS 4

/* y [rows, nout] (row stride ldy) = x [rows, nin] w^T (+ b): per output
 * linear_row_chains' FMA chain over nin from 0, then + bias (the same
 * roundings), with the row's inputs loaded once. Inlined with nin a
 * constant where the caller names one, so the chains unroll. */
static inline __attribute__((always_inline)) void tiny_linear(const float *x, int64_t rows, int64_t nin,
                                                              const attn_tensor *w, const attn_tensor *b, float *y,
                                                              int64_t ldy, int64_t nout) {
  const float *wd = w->data;
  int64_t sw0 = w->stride[0], sw1 = w->stride[1];
  for (int64_t i = 0; i < rows; i++) {
    const float *xi = x + i * nin;
    float *yi = y + i * ldy;
    if (nin <= TINY_NIN_REGS) {
      float xr[TINY_NIN_REGS];
      #pragma GCC unroll 4
      for (int64_t k = 0; k < nin; k++) xr[k] = xi[k];
      for (int64_t j = 0; j < nout; j++) {
        const float *wj = wd + j * sw0;
        float acc = 0.0f;
        #pragma GCC unroll 4
        for (int64_t k = 0; k < nin; k++) acc = fmaf(xr[k], wj[k * sw1], acc);
        yi[j] = acc;
      }
    } else {
      for (int64_t j = 0; j < nout; j++) {
        const float *wj = wd + j * sw0;
        float acc = 0.0f;
        for (int64_t k = 0; k < nin; k++) acc = fmaf(xi[k], wj[k * sw1], acc);
        yi[j] = acc;
      }
    }
    if (b) {
      const float *bd = b->data;
      int64_t sb = b->stride[0];
      for (int64_t j = 0; j < nout; j++) yi[j] = yi[j] + bd[j * sb];
    }
  }
}

/* tiny_linear with the widths of the notebooks (1 to 4) as constants. */
static inline __attribute__((always_inline)) void tiny_linear_small(const float *x, int64_t rows, int64_t nin,
                                                                    const attn_tensor *w, const attn_tensor *b,
                                                                    float *y, int64_t ldy, int64_t nout) {
  switch (nin) {
    case 1: tiny_linear(x, rows, 1, w, b, y, ldy, nout); break;
    case 2: tiny_linear(x, rows, 2, w, b, y, ldy, nout); break;
    case 3: tiny_linear(x, rows, 3, w, b, y, ldy, nout); break;
    case 4: tiny_linear(x, rows, 4, w, b, y, ldy, nout); break;
    default: tiny_linear(x, rows, nin, w, b, y, ldy, nout);
  }
}

/* Head sizes up to which causal_heads keeps a row's outputs in registers. */
#define TINY_HD_CHUNK 8

/* Rows' scores packed one after the other (row i: its i + 1 keys) so that
 * causal_heads takes a group of rows' exponentials in one call, and the most
 * rows in a group (the notebooks' 6 rows are one group of 21 scores). */
#define TINY_TRI 256
#define TINY_TRI_ROWS 32
/* tiny_fits bounds 2 n^2 by TINY_MACS, so every row (n keys at most) fits a
 * group alone, and a group always takes its first row */
_Static_assert((int64_t)TINY_TRI * TINY_TRI >= TINY_MACS / 2, "a tiny path's row fits TINY_TRI");

/* The causal attention of every head of one batch item: qkv [n, 3 d_out]
 * (heads of hd side by side in each third) -> c [n, d_out]; qs [hd]
 * scratch. Row i sees keys 0..i: q scaled in float32, FMA chains for the
 * scores, attn_softmax_short_row's operations (its halves, the
 * exponentials of a group of rows in one call), then each output an FMA
 * chain over every key in order (weights fl(e_j / sum), 0 for the keys not
 * seen, so a NaN or inf in their v spreads as in the math kernel):
 * forward_tiny's bits. Inlined with hd a constant where the caller names
 * one. */
static inline __attribute__((always_inline)) void causal_heads(const float *qkv, float *c, int64_t n, int64_t h,
                                                               int64_t hd, int64_t d_out, float scale, float *qs) {
  int64_t w3 = 3 * d_out;
  void (*exp_minus)(float *, int64_t, float) = attn_cpu_kernels()->libm_exp_minus;
  for (int64_t hh = 0; hh < h; hh++) {
    const float *q = qkv + hh * hd, *k = q + d_out, *v = q + 2 * d_out;
    for (int64_t i0 = 0; i0 < n;) {
      /* rows [i0, i1): their scores packed in tri */
      float tri[TINY_TRI];
      int64_t weighted[TINY_TRI_ROWS], i1 = i0, used = 0;
      while (i1 < n && i1 - i0 < TINY_TRI_ROWS && used + i1 + 1 <= TINY_TRI) {
        float *s = tri + used;
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) qs[d] = q[i1 * w3 + d] * scale;
        for (int64_t j = 0; j <= i1; j++) {
          const float *kj = k + j * w3;
          float acc = 0.0f;
          #pragma GCC unroll 4
          for (int64_t d = 0; d < hd; d++) acc = fmaf(qs[d], kj[d], acc);
          s[j] = acc;
        }
        weighted[i1 - i0] = attn_short_row_shift(s, i1 + 1);
        used += i1 + 1;
        i1++;
      }
      exp_minus(tri, used, 0.0f); /* the rows' hidden and trimmed keys too: unused */
      used = 0;
      for (int64_t i = i0; i < i1; used += i + 1, i++) {
        const float *s = tri + used;
        int64_t wt = weighted[i - i0];
        float *ci = c + i * d_out + hh * hd;
        if (wt == 0) { /* zeros, as the math kernel gives, even where v holds NaN */
          for (int64_t d = 0; d < hd; d++) ci[d] = 0.0f;
          continue;
        }
        float inv = attn_short_row_inv(s, wt);
        for (int64_t d0 = 0; d0 < hd; d0 += TINY_HD_CHUNK) {
          int64_t nd = hd - d0 < TINY_HD_CHUNK ? hd - d0 : TINY_HD_CHUNK;
          float acc[TINY_HD_CHUNK];
          #pragma GCC unroll 4
          for (int64_t d = 0; d < nd; d++) acc[d] = 0.0f;
          for (int64_t j = 0; j < wt; j++) {
            float w = s[j] * inv;
            const float *vj = v + j * w3 + d0;
            #pragma GCC unroll 4
            for (int64_t d = 0; d < nd; d++) acc[d] = fmaf(w, vj[d], acc[d]);
          }
          for (int64_t j = wt; j < n; j++) {
            const float *vj = v + j * w3 + d0;
            #pragma GCC unroll 4
            for (int64_t d = 0; d < nd; d++) acc[d] = fmaf(0.0f, vj[d], acc[d]);
          }
          #pragma GCC unroll 4
          for (int64_t d = 0; d < nd; d++) ci[d0 + d] = acc[d];
        }
      }
      i0 = i1;
    }
  }
}

/* forward_tiny for the causal triangle without dropout (the notebooks'
 * calls): the same arithmetic as forward_tiny, with the heads addressed in
 * qkv directly instead of through the attention core's problem and slices,
 * and the short loops of the notebooks' widths (d_in and d_out up to 4, head
 * size up to 2) unrolled: their loop overhead was most of the call. */
ATTN_FMA_CLONES static void forward_tiny_causal(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                                                int64_t nb, int64_t n, int64_t d_in, int64_t d_out) {
  float buf[TINY_FLOATS];
  int64_t h = m->heads, hd = d_out / h;
  float *qkv = buf, *ctx = qkv + n * 3 * d_out, *qs = ctx + n * d_out;
  float scale = m->scale;
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x->data + b * n * d_in;
    float *ob = out->data + b * n * d_out;
    tiny_linear_small(xb, n, d_in, m->wq, m->bq, qkv, 3 * d_out, d_out);
    tiny_linear_small(xb, n, d_in, m->wk, m->bk, qkv + d_out, 3 * d_out, d_out);
    tiny_linear_small(xb, n, d_in, m->wv, m->bv, qkv + 2 * d_out, 3 * d_out, d_out);
    float *c = m->wo ? ctx : ob; /* without out_proj the context is the output */
    switch (hd) {
      case 1: causal_heads(qkv, c, n, h, 1, d_out, scale, qs); break;
      case 2: causal_heads(qkv, c, n, h, 2, d_out, scale, qs); break;
      default: causal_heads(qkv, c, n, h, hd, d_out, scale, qs);
    }
    if (m->wo)
      tiny_linear_small(ctx, n, d_out, m->wo, m->bo, ob, d_out, d_out);
  }
}

/* s[j] = qs . k_j for the keys j the row sees (k_j at row stride sk), each
 * sum in increasing d with one fused multiply-add per product: the scores
 * of forward_tiny and of the state it keeps, the same bits. */
static inline __attribute__((always_inline)) void tiny_scores(const float *qs, const float *k, int64_t sk, int64_t hd,
                                                              attn_key_range vis, float *s) {
  for (int64_t j = vis.begin; j < vis.end; j++) {
    const float *kj = k + j * sk;
    float acc = 0.0f;
    for (int64_t d = 0; d < hd; d++) acc = fmaf(qs[d], kj[d], acc);
    s[j] = acc;
  }
}

ATTN_FMA_CLONES static void forward_tiny(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                                                int64_t nb, int64_t n, int64_t d_in, int64_t d_out) {
  float buf[TINY_FLOATS];
  int64_t h = m->heads, hd = d_out / h, w3 = 3 * d_out;
  float *qkv = buf, *ctx = qkv + n * w3, *s = ctx + n * d_out, *f = s + n, *qs = f + n;
  /* one batch item's heads [h, n, hd], strided views of its projections
   * (rows of qkv), described once: each batch item refills qkv */
  attn_sdpa_problem p;
  attn_sdpa_describe_heads(qkv, h, n, hd, w3, m->mask, m->mask == NULL, m->scale, &p);
  int64_t sk = attn_sdpa_row_stride(&p, &p.k), sv = attn_sdpa_row_stride(&p, &p.v);
  /* s may be nonzero only in [nz_begin, nz_end) (at first: all of it, unwritten) */
  int64_t nz_begin = 0, nz_end = n;
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x->data + b * n * d_in;
    float *ob = out->data + b * n * d_out;
    for (int64_t i = 0; i < n; i++) linear_row_qkv(m, xb + i * d_in, d_in, qkv + i * w3, d_out);
    float *c = m->wo ? ctx : ob; /* without out_proj the context is the output */
    for (int64_t hh = 0; hh < h; hh++) {
      int64_t bi = b * h + hh, col = hh * hd;
      attn_sdpa_slice sl;
      attn_sdpa_slice_at(&p, hh, &sl);
      /* inside the visible range only a mask (or a bias, softcap, ALiBi) changes a score */
      int modified = sl.mask || sl.bias || p.softcap > 0.0f || p.has_alibi;
      for (int64_t i = 0; i < n; i++) {
        /* scores and softmax over the keys the row sees only (causal: 0..i):
         * the others would be -inf, add 0 to the sum and get weight 0 */
        attn_key_range vis = attn_sdpa_row_keys(&p, i);
        int64_t nk = vis.end - vis.begin;
        attn_sdpa_load_q(&p, &sl, i, 1, qs, 0, 1);
        tiny_scores(qs, sl.k, sk, hd, vis, s);
        if (modified) attn_sdpa_modify_tile(&p, &sl, i, 1, vis.begin, nk, s + vis.begin, 0, 1);
        int hidden = attn_softmax_dropout_row(s + vis.begin, nk, m->dropout_p, m->dropout_draw,
                                              (bi * n + i) * n + vis.begin, f, NULL);
        /* the weights of the unseen keys are 0; the product below still visits
         * them, so a NaN or inf in v there spreads as in the math kernel. Only
         * what an earlier row left outside this row's keys needs zeroing
         * (causal: nothing after the first row) */
        for (int64_t j = nz_begin; j < nz_end && j < vis.begin; j++) s[j] = 0.0f;
        for (int64_t j = nz_begin > vis.end ? nz_begin : vis.end; j < nz_end; j++) s[j] = 0.0f;
        nz_begin = vis.begin, nz_end = vis.end;
        float *ci = c + i * d_out + col;
        if (hidden) { /* zeros, as the math kernel gives, even where v holds NaN */
          memset(ci, 0, (size_t)hd * sizeof(float));
          continue;
        }
        for (int64_t d = 0; d < hd; d++) {
          float acc = 0.0f;
          for (int64_t j = 0; j < n; j++) acc = fmaf(s[j], sl.v[j * sv + d], acc);
          ci[d] = acc;
        }
      }
    }
    if (m->wo)
      for (int64_t i = 0; i < n; i++) linear_row(ctx + i * d_out, d_out, m->wo, m->bo, ob + i * d_out, d_out);
  }
}

/* forward_tiny's steps keeping what the backward needs (a tiny call's
 * attn_self_attention_state): Q, K, V into st->qkv [3, rows, D]; st->saved:
 * for the math kernel each row's softmax before dropout [B, h, n, n] (0 for
 * the keys it does not see), for flash (from 32 keys) each row's log-sum-exp
 * [B, h, n] of these scores; the attention's output into st->o [B, h, n, hd]
 * and, heads side by side, into rows [rows, D] unless NULL (st->c, or the
 * output itself without out_proj). Every sum as forward_tiny's (and so
 * forward_tiny_causal's): the forward's bits. The softmax runs without
 * dropout, then the factors multiply it: attn_softmax_dropout_row's own two
 * steps, the same weights. */
ATTN_FMA_CLONES static void state_tiny(const attn_self_attention *m, const attn_tensor *x,
                                       const attn_self_attention_saved *st, float *rows, int64_t nb, int64_t n,
                                       int64_t d_in, int64_t d_out) {
  float buf[TINY_FLOATS];
  int64_t h = m->heads, hd = d_out / h, w3 = 3 * d_out, act = nb * n * d_out;
  float *qkv = buf, *s = qkv + n * w3, *f = s + n, *qs = f + n;
  attn_sdpa_problem p;
  attn_sdpa_describe_heads(qkv, h, n, hd, w3, m->mask, m->mask == NULL, m->scale, &p);
  int64_t sk = attn_sdpa_row_stride(&p, &p.k), sv = attn_sdpa_row_stride(&p, &p.v);
  int keep_probs = st->kernel == ATTN_SDPA_MATH;
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x->data + b * n * d_in;
    for (int64_t i = 0; i < n; i++) {
      float *y = qkv + i * w3;
      const float *xi = xb + i * d_in;
      linear_row_chains(xi, d_in, m->wq, m->bq, y, d_out);
      linear_row_chains(xi, d_in, m->wk, m->bk, y + d_out, d_out);
      linear_row_chains(xi, d_in, m->wv, m->bv, y + 2 * d_out, d_out);
      for (int t = 0; t < 3; t++)
        memcpy(st->qkv + t * act + (b * n + i) * d_out, y + t * d_out, (size_t)d_out * sizeof(float));
    }
    for (int64_t hh = 0; hh < h; hh++) {
      int64_t bi = b * h + hh;
      attn_sdpa_slice sl;
      attn_sdpa_slice_at(&p, hh, &sl);
      int modified = sl.mask || sl.bias || p.softcap > 0.0f || p.has_alibi;
      for (int64_t i = 0; i < n; i++) {
        attn_key_range vis = attn_sdpa_row_keys(&p, i);
        int64_t nk = vis.end - vis.begin;
        float *oi = st->o + (bi * n + i) * hd, *lse = keep_probs ? NULL : st->saved + bi * n + i;
        attn_sdpa_load_q(&p, &sl, i, 1, qs, 0, 1);
        for (int64_t j = 0; j < n; j++) s[j] = 0.0f;
        tiny_scores(qs, sl.k, sk, hd, vis, s);
        if (modified) attn_sdpa_modify_tile(&p, &sl, i, 1, vis.begin, nk, s + vis.begin, 0, 1);
        int64_t position = (bi * n + i) * n + vis.begin;
        int hidden = attn_softmax_dropout_row(s + vis.begin, nk, 0.0, (attn_dropout_draw){0, NULL}, position, f, lse);
        if (keep_probs) memcpy(st->saved + (bi * n + i) * n, s, (size_t)n * sizeof(float));
        if (hidden) {
          memset(oi, 0, (size_t)hd * sizeof(float));
          continue;
        }
        if (m->dropout_p > 0.0) {
          attn_dropout_factors(m->dropout_draw, m->dropout_p, position, nk, f);
          for (int64_t j = 0; j < nk; j++) s[vis.begin + j] *= f[j];
        }
        for (int64_t d = 0; d < hd; d++) {
          float acc = 0.0f;
          for (int64_t j = 0; j < n; j++) acc = fmaf(s[j], sl.v[j * sv + d], acc);
          oi[d] = acc;
        }
      }
    }
  }
  if (rows) /* [B, h, n, hd] -> [rows, D] */
    for (int64_t r = 0; r < nb * n; r++)
      for (int64_t hh = 0; hh < h; hh++)
        memcpy(rows + r * d_out + hh * hd, st->o + (((r / n) * h + hh) * n + r % n) * hd, (size_t)hd * sizeof(float));
}

/* The training forward of a tiny call (attn_self_attention_keeps: one whose
 * backward is not tiny): state_tiny, then out_proj's rows as forward_tiny's
 * (linear_row_chains); without out_proj the context is the output. */
ATTN_FMA_CLONES static void forward_tiny_saving(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                                                const attn_self_attention_saved *st, int64_t nb, int64_t n,
                                                int64_t d_in, int64_t d_out) {
  state_tiny(m, x, st, m->wo ? st->c : out->data, nb, n, d_in, d_out);
  if (m->wo)
    for (int64_t r = 0; r < nb * n; r++)
      linear_row_chains(st->c + r * d_out, d_out, m->wo, m->bo, out->data + r * d_out, d_out);
}

/* ------------------------------------------------------------ BLAS path */

/* y [rows, nout] (row stride ldy) = x [rows, nin] w^T (+ b): sgemm then a
 * separate bias pass, as matmul followed by + bias rounds. */
static void linear_blas(const float *x, int64_t rows, int64_t nin, const attn_tensor *w, const attn_tensor *b,
                        float *y, int64_t ldy, int64_t nout) {
  /* w [nout, nin] as w^T [nin, nout] for row-major BLAS (checked by the caller) */
  int trans = w->stride[1] == 1;
  int64_t ldw = trans ? w->stride[0] : w->stride[1];
  /* attn_matmul's tiles: the bits of the module path (matmul, then + bias) for any thread count;
   * a contiguous bias added in the product's stores */
  int64_t sb = b ? b->stride[0] : 1;
  if (!b || sb == 1 || nout == 1) {
    attn_gemm_bias(0, trans, rows, nout, nin, x, nin, w->data, ldw, b ? b->data : NULL, y, ldy);
    return;
  }
  attn_gemm(0, trans, rows, nout, nin, x, nin, w->data, ldw, y, ldy);
  const float *bd = b->data;
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(rows)) if (rows * nout > PARALLEL_ELEMS)
  for (int64_t r = 0; r < rows; r++) {
    float *yr = y + r * ldy;
    for (int64_t j = 0; j < nout; j++) yr[j] = yr[j] + bd[j * sb];
  }
}

/* With s (the training forward): the projections, the attention's output
 * and what its backward needs go to s's buffers, and nothing is allocated.
 * With s and out NULL (attn_self_attention_state): the state alone, without
 * out_proj's product. */
static attn_status forward_blas(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out, int64_t nb,
                                int64_t n, int64_t d_in, int64_t d_out, const attn_self_attention_saved *s) {
  int64_t h = m->heads, hd = d_out / h, rows = nb * n;
  /* Q, K, V [rows, d_out] each; ctx [B, h, n, hd] unless it can be the
   * output itself; its [B, n, h*hd] transpose (for out_proj) goes over Q.
   * Separate blocks of one activation's size: glibc serves blocks up to its
   * mmap threshold (32 MiB at most) from the heap once one was freed, where
   * one block of them all would be a fresh mmap, page faults and all, per call. */
  int need_ctx = !s && (m->wo || h > 1);
  size_t bytes = (size_t)rows * (size_t)d_out * sizeof(float);
  float *qp, *kp, *vp, *ctx;
  if (s) { /* the caller's buffers (checked non-NULL by forward) */
    qp = s->qkv, kp = qp + rows * d_out, vp = kp + rows * d_out, ctx = s->o;
  } else {
    qp = malloc(bytes), kp = malloc(bytes), vp = malloc(bytes), ctx = need_ctx ? malloc(bytes) : out->data;
    if (!qp || !kp || !vp || !ctx) {
      free(qp), free(kp), free(vp);
      if (need_ctx) free(ctx);
      return attn_fail(ATTN_ENOMEM, "cannot allocate 4 x %zu bytes of attention scratch", bytes);
    }
  }
  linear_blas(x->data, rows, d_in, m->wq, m->bq, qp, d_out, d_out);
  linear_blas(x->data, rows, d_in, m->wk, m->bk, kp, d_out, d_out);
  linear_blas(x->data, rows, d_in, m->wv, m->bv, vp, d_out, d_out);

  attn_tensor q = head_view(qp, nb, n, h, hd), k = head_view(kp, nb, n, h, hd), v = head_view(vp, nb, n, h, hd);
  int64_t csize[4] = {nb, h, n, hd};
  attn_tensor c = attn_make(ctx, 4, csize);
  attn_sdpa_opts o = attn_self_attention_sdpa_opts(m);
  attn_status st;
  if (s) { /* the kernel "auto" runs, keeping its probabilities or log-sum-exp: the same bits of c */
    int64_t ssize[4] = {nb, h, n, n};
    attn_tensor saved = attn_make(s->saved, s->kernel == ATTN_SDPA_MATH ? 4 : 3, ssize);
    if (s->kernel == ATTN_SDPA_MATH) {
      o.probs = &saved;
      st = attn_sdpa_math(&q, &k, &v, &o, &c, NULL);
    } else {
      o.lse = &saved;
      st = attn_sdpa_flash(&q, &k, &v, &o, &c);
    }
  } else {
    st = attn_sdpa_run(ATTN_SDPA_AUTO, &q, &k, &v, &o, &c, NULL);
  }
  if (st == ATTN_OK) {
    float *ct = ctx;
    if (s && h == 1) { /* [B, 1, n, hd] is already [rows, d_out]; s->o stays the attention's own */
      ct = m->wo ? s->c : out ? out->data : NULL;
      if (ct) memcpy(ct, ctx, bytes);
    } else if (h > 1) { /* [B, h, n, hd] -> [B, n, h, hd] */
      ct = s ? (m->wo ? s->c : out ? out->data : NULL) : m->wo ? qp : out->data; /* Q is spent (unless kept) */
      if (ct) {
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(rows)) if (rows * d_out > PARALLEL_ELEMS)
        for (int64_t r = 0; r < rows; r++) {
          int64_t b = r / n, i = r % n;
          for (int64_t hh = 0; hh < h; hh++)
            memcpy(ct + r * d_out + hh * hd, ctx + ((b * h + hh) * n + i) * hd, (size_t)hd * sizeof(float));
        }
      }
    }
    if (m->wo && out) linear_blas(ct, rows, d_out, m->wo, m->bo, out->data, d_out, d_out);
  }
  if (s) return st;
  free(qp), free(kp), free(vp);
  if (need_ctx) free(ctx);
  return st;
}

/* ------------------------------------------------------------ entry */

static int is_weight(const attn_tensor *w, int64_t rows, int64_t cols) {
  if (!w || w->ndim != 2 || w->size[0] != rows || w->size[1] != cols || rows > INT_MAX || cols > INT_MAX) return 0;
  /* row-major BLAS takes it with a transpose flag: one unit stride, the other >= its extent */
  if (w->stride[1] == 1 && w->stride[0] >= (cols > 1 ? cols : 1)) return w->stride[0] <= INT_MAX;
  if (w->stride[0] == 1 && w->stride[1] >= (rows > 1 ? rows : 1)) return w->stride[1] <= INT_MAX;
  return 0;
}

static int is_bias(const attn_tensor *b, int64_t n) { return !b || (b->ndim == 1 && b->size[0] == n); }

attn_sdpa_opts attn_self_attention_sdpa_opts(const attn_self_attention *m) {
  attn_sdpa_opts o = attn_sdpa_defaults();
  o.scale = m->scale;
  o.is_causal = m->mask == NULL;
  o.mask = m->mask;
  o.dropout_p = m->dropout_p;
  o.dropout_draw = m->dropout_draw;
  return o;
}

attn_status attn_self_attention_check(const attn_self_attention *m, int64_t d_in) {
  int64_t d_out = m->wq ? m->wq->size[0] : 0;
  if (!is_weight(m->wq, d_out, d_in) || !is_weight(m->wk, d_out, d_in) || !is_weight(m->wv, d_out, d_in) ||
      !is_bias(m->bq, d_out) || !is_bias(m->bk, d_out) || !is_bias(m->bv, d_out) ||
      (m->wo && (!is_weight(m->wo, d_out, d_out) || !is_bias(m->bo, d_out))))
    return attn_fail(ATTN_ESHAPE, "the weights must be [d_out, d_in] (out_proj [d_out, d_out]) and the biases [d_out]");
  if (m->heads < 1 || d_out % m->heads != 0)
    return attn_fail(ATTN_EARG, "d_out (%lld) must be divisible by heads (%lld)", (long long)d_out, (long long)m->heads);
  if (!(m->dropout_p >= 0.0 && m->dropout_p < 1.0))
    return attn_fail(ATTN_EARG, "dropout_p must be in [0, 1), got %g", m->dropout_p);
  if (d_out > 0 && !isfinite(m->scale)) return attn_fail(ATTN_EARG, "scale must be finite, got %g", (double)m->scale);
  return ATTN_OK;
}

/* m, x [B, n, d_in], y [B, n, d_out], m->mask [n, n] -> ATTN_OK or why not */
attn_status attn_self_attention_check_call(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *y,
                                           const char *yname) {
  char b1[200];
  if (x->ndim != 3 || !attn_is_contiguous(x))
    return attn_fail(ATTN_ESHAPE, "x must be a contiguous [B, n, d_in] tensor, got %s", attn_shape_str(x, b1, sizeof b1));
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2];
  attn_status st = attn_self_attention_check(m, d_in);
  if (st != ATTN_OK) return st;
  int64_t d_out = m->wq->size[0];
  if (y->ndim != 3 || !attn_is_contiguous(y) || y->size[0] != nb || y->size[1] != n || y->size[2] != d_out)
    return attn_fail(ATTN_ESHAPE, "%s must be a contiguous [B, n, d_out] = [%lld, %lld, %lld] tensor, got %s", yname,
                     (long long)nb, (long long)n, (long long)d_out, attn_shape_str(y, b1, sizeof b1));
  if (m->mask && (m->mask->ndim != 2 || m->mask->size[0] != n || m->mask->size[1] != n))
    return attn_fail(ATTN_ESHAPE, "mask must be [n, n] = [%lld, %lld], got %s", (long long)n, (long long)n,
                     attn_shape_str(m->mask, b1, sizeof b1));
  return ATTN_OK;
}

/* The kernel kernel = "auto" takes for the attention of m on [nb, n, .] inputs */
static int state_kernel(const attn_self_attention *m, int64_t nb, int64_t n) {
  int64_t h = m->heads, hd = m->wq->size[0] / h;
  const char *why;
  return (int)attn_sdpa_choose_kernel(ATTN_SDPA_AUTO, nb * h, n, n, hd, hd, 0, &why);
}

int attn_self_attention_keeps(const attn_self_attention *m, int64_t nb, int64_t n, int64_t d_in, int *kernel,
                              int64_t *saved_floats) {
  int64_t d_out = m->wq->size[0], h = m->heads;
  if (nb == 0 || n == 0 || d_out == 0) return 0;
  /* a call whose backward is tiny recomputes the state in its direct loops:
   * cheaper than keeping it (a malloc'ed tensor per buffer) */
  if (tiny_fits(nb, n, d_in, d_out, m->wo != NULL) && attn_self_attention_backward_tiny_fits(m, nb, n, d_in))
    return 0;
  *kernel = state_kernel(m, nb, n);
  *saved_floats = nb * h * n * (*kernel == ATTN_SDPA_MATH ? n : 1);
  return 1;
}

int attn_self_attention_state_kernel(const attn_self_attention *m, int64_t nb, int64_t n) {
  return state_kernel(m, nb, n);
}

attn_status attn_self_attention_state(const attn_self_attention *m, const attn_tensor *x,
                                      const attn_self_attention_saved *s) {
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2], d_out = m->wq->size[0];
  if (nb == 0 || n == 0 || d_out == 0) return ATTN_OK;
  if (s->kernel != state_kernel(m, nb, n) || !s->qkv || !s->o || !s->saved || (m->wo && !s->c))
    return attn_fail(ATTN_EARG, "the state buffers do not fit the call (see attn_self_attention_state_kernel)");
  /* the forward's own choice of path, so its bits */
  if (tiny_fits(nb, n, d_in, d_out, m->wo != NULL)) {
    state_tiny(m, x, s, s->c, nb, n, d_in, d_out);
    return ATTN_OK;
  }
  return forward_blas(m, x, NULL, nb, n, d_in, d_out, s);
}

/* The forward, with s: keeping its state (see attn_self_attention_forward_saving) */
static attn_status forward(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                           const attn_self_attention_saved *s) {
  attn_status st = attn_self_attention_check_call(m, x, out, "out");
  if (st != ATTN_OK) return st;
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2], d_out = m->wq->size[0];
  if (nb * n > INT_MAX || 3 * d_out > INT_MAX)
    return attn_fail(ATTN_EARG, "sizes beyond the BLAS integer range");
  if (nb == 0 || n == 0 || d_out == 0) return ATTN_OK;
  if (s) {
    int kernel;
    int64_t saved_floats;
    if (!attn_self_attention_keeps(m, nb, n, d_in, &kernel, &saved_floats))
      return attn_fail(ATTN_EARG, "a call whose backward is tiny keeps no state (see attn_self_attention_keeps)");
    if (kernel != s->kernel || !s->qkv || !s->o || !s->saved || (m->wo && !s->c))
      return attn_fail(ATTN_EARG, "the state buffers do not fit the call (see attn_self_attention_keeps)");
  }
  if (tiny_fits(nb, n, d_in, d_out, m->wo != NULL)) {
    if (s) forward_tiny_saving(m, x, out, s, nb, n, d_in, d_out);
    else if (!m->mask && m->dropout_p == 0.0) forward_tiny_causal(m, x, out, nb, n, d_in, d_out);
    else forward_tiny(m, x, out, nb, n, d_in, d_out);
    return ATTN_OK;
  }
  return forward_blas(m, x, out, nb, n, d_in, d_out, s);
}

attn_status attn_self_attention_forward(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out) {
  return forward(m, x, out, NULL);
}

attn_status attn_self_attention_forward_saving(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                                               const attn_self_attention_saved *s) {
  return forward(m, x, out, s);
}
