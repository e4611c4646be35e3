/* The backward of the fused self-attention module for tiny calls (the
 * notebooks' [2, 6, 3] batches; see modules_backward.h), as direct loops on
 * the calling thread with stack scratch: no malloc, no OpenMP region, no
 * product dispatch. At these sizes those fixed costs, not the arithmetic, were
 * the whole of attn_self_attention_backward's time.
 *
 * Per batch item b, with rows i, j < n, D = d_out, h heads of hd = D / h:
 *   QKV = x_b [Wq; Wk; Wv]^T + [bq, bk, bv]      [n, 3D] (recomputed)
 *   (QKV, S, P, W and O are recomputed with the tiny forward's sums, src/core/modules.c:
 *   one FMA per product, in the same order, so they are the bits the forward computed)
 *   per head: Qs = fl(Q * scale) (as the forward scales it), S = Qs K^T,
 *   mask / causal through the attention core (attn_sdpa_modify_tile),
 *   P = softmax rows (0 for a row that sees no key), F = the forward's
 *   dropout factors (its draw, the same positions), W = P * F, O = W V
 *   C = O with the heads side by side               [n, D]
 *   with out_proj: dWo += dout_b^T C, dbo += colsum dout_b, dC = dout_b Wo;
 *   else dC = dout_b
 *   per head, row i: Dl_i = dC_i . O_i; dW_ij = dC_i . V_j;
 *     dV_j += W_ij dC_i; dS_ij = P_ij (dW_ij F_ij - Dl_i);
 *     dQ_i += scale sum_j dS_ij K_j; dK_j += dS_ij Qs_i
 *   dW* += dQKV^T x_b, db* += colsum dQKV, dx_b = dQ Wq + dK Wk + dV Wv
 * (src/core/sdpa_backward.c's math backward, written for one slice.)
 * Contract: the caller (attn_self_attention_backward) has checked every
 * shape; attn_self_attention_backward_tiny_fits says which calls come here.
 * Error: the general path's formulas; against torch 1.13 float64 autograd
 * (the tiny cases of spec/nn_fused_backward_spec.lua: CausalAttention and
 * MultiHeadAttention shapes, biases, dropout, a mask with a hidden row) at
 * most 1.4e-6 absolute, 2.5e-7 relative to the largest gradient; the spec
 * allows 1e-5 relative + 2e-5 absolute.
 * Threads: none (one thread, a fixed order), so the bits cannot depend on
 * the thread count. */
#include <string.h>

#include "attention.h"
#include "cpu.h"
#include "modules_backward.h"
#include "modules_tiny.h"
#include "rng.h"
#include "sdpa_common.h"

/* Floats of the stack scratch (16 KiB) and multiply-adds of the forward up
 * to which a call is tiny (the forward's own tiny-path bound). */
#define TINY_BWD_FLOATS 4096
#define TINY_BWD_MACS 32768

/* scratch: qkv, dqkv [n, 3D]; c, dc [n, D]; p, w [n, n]; f, qs [n + D] */
static int64_t scratch_floats(int64_t n, int64_t d_out) { return 8 * n * d_out + 2 * n * n + 2 * (n + d_out); }

int attn_self_attention_backward_tiny_fits(const attn_self_attention *m, int64_t nb, int64_t n, int64_t d_in) {
  int64_t d_out = m->wq->size[0];
  if (n > TINY_BWD_FLOATS || d_in > TINY_BWD_FLOATS || d_out > TINY_BWD_FLOATS) return 0;
  if (scratch_floats(n, d_out) > TINY_BWD_FLOATS) return 0;
  double macs = (double)nb * (double)n * ((double)d_in * 3.0 * (double)d_out + 2.0 * (double)n * (double)d_out +
                                          (m->wo ? (double)d_out * (double)d_out : 0.0));
  return macs <= TINY_BWD_MACS;
}

/* w [rows, cols] element (r, c), any strides */
static inline float at(const attn_tensor *w, int64_t r, int64_t c) { return w->data[r * w->stride[0] + c * w->stride[1]]; }

/* y [n, nout] (row stride ldy) = x [n, nin] w^T (+ b) */
ATTN_FMA_CLONES static void linear_rows(const float *x, int64_t n, int64_t nin, const attn_tensor *w,
                                        const attn_tensor *b, float *y, int64_t ldy, int64_t nout) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < nout; j++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < nin; k++) acc = fmaf(x[i * nin + k], at(w, j, k), acc);
      y[i * ldy + j] = b ? acc + b->data[j * b->stride[0]] : acc;
    }
}

/* Weight gradients of up to this many elements are summed side by side. */
#define TINY_GRAD_ACCS 64

/* dw [nout, nin] += d [n, nout]^T (row stride ldd) x [n, nin]; db [nout] += column sums of d */
static inline __attribute__((always_inline)) void accumulate_param_grads(const float *d, int64_t ldd, const float *x,
                                                                         int64_t n, int64_t nout, int64_t nin,
                                                                         attn_tensor *dw, attn_tensor *db) {
  if (dw && nout * nin <= TINY_GRAD_ACCS) {
    /* every element's sum at once, each over i from 0 as below (the same
     * bits): independent chains instead of one serial chain after another */
    float acc[TINY_GRAD_ACCS];
    for (int64_t e = 0; e < nout * nin; e++) acc[e] = 0.0f;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < nout; j++) {
        float dij = d[i * ldd + j];
        #pragma GCC unroll 4
        for (int64_t k = 0; k < nin; k++) acc[j * nin + k] += dij * x[i * nin + k];
      }
    for (int64_t e = 0; e < nout * nin; e++) dw->data[e] += acc[e];
  } else if (dw) {
    for (int64_t j = 0; j < nout; j++)
      for (int64_t k = 0; k < nin; k++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++) acc += d[i * ldd + j] * x[i * nin + k];
        dw->data[j * nin + k] += acc;
      }
  }
  if (db)
    for (int64_t j = 0; j < nout; j++) {
      float acc = 0.0f;
      for (int64_t i = 0; i < n; i++) acc += d[i * ldd + j];
      db->data[j] += acc;
    }
}

/* dx [n, nin] (+)= d [n, nout] (row stride ldd) w [nout, nin] */
static inline __attribute__((always_inline)) void input_grad(const float *d, int64_t ldd, int64_t n, int64_t nout,
                                                              const attn_tensor *w, float *dx,
                       int64_t nin, int add) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < nin; k++) {
      float acc = 0.0f;
      for (int64_t j = 0; j < nout; j++) acc += d[i * ldd + j] * at(w, j, k);
      dx[i * nin + k] = add ? dx[i * nin + k] + acc : acc;
    }
}

static void zero(attn_tensor *t) {
  if (t) memset(t->data, 0, (size_t)attn_numel(t) * sizeof(float));
}

/* s [n] = the scores of query row i of head slice sl against every key,
 * modified as the forward modifies them (mask, causal, ...); qs [hd] scratch. */
ATTN_FMA_CLONES static void score_row(const attn_sdpa_problem *pr, const attn_sdpa_slice *sl, int64_t i, int64_t n,
                                      int64_t hd, int64_t sk, float *qs, float *s) {
  attn_sdpa_load_q(pr, sl, i, 1, qs, 0, 1);
  for (int64_t j = 0; j < n; j++) {
    float acc = 0.0f;
    for (int64_t d = 0; d < hd; d++) acc = fmaf(qs[d], sl->k[j * sk + d], acc);
    s[j] = acc;
  }
  attn_sdpa_modify_tile(pr, sl, i, 1, 0, n, s, 0, 1);
}

/* ---- the causal calls without dropout (the notebooks'): the loops above
 * with every row's probabilities computed once, the short loops of the
 * notebooks' widths unrolled, and each sum in the same order as above, so
 * the same bits. */

/* scratch: qkv, dqkv [n, 3D]; c, dc [n, D]; p [h, n, n]; hidden [h, n]; qs [hd] (causal_item's layout) */
static int64_t causal_scratch_floats(int64_t n, int64_t d_out, int64_t h) {
  return 8 * n * d_out + h * n * n + h * n + d_out;
}

/* linear_rows, inlined with nin a constant where the caller names one */
static inline __attribute__((always_inline)) void linear_rows_inline(const float *x, int64_t n, int64_t nin,
                                                                     const attn_tensor *w, const attn_tensor *b,
                                                                     float *y, int64_t ldy, int64_t nout) {
  const float *wd = w->data;
  int64_t sw0 = w->stride[0], sw1 = w->stride[1];
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < nout; j++) {
      float acc = 0.0f;
      #pragma GCC unroll 4
      for (int64_t k = 0; k < nin; k++) acc = fmaf(x[i * nin + k], wd[j * sw0 + k * sw1], acc);
      y[i * ldy + j] = b ? acc + b->data[j * b->stride[0]] : acc;
    }
}

/* The probabilities p [h, n, n] of every head's rows (score_row, then the
 * softmax without dropout: zeros after the visible keys, a row that sees
 * none all zeros, hidden[hh n + i] = 1) from qkv [n, 3D]; qs [hd] scratch. */
static inline __attribute__((always_inline)) void causal_probs(const float *qkv, int64_t n, int64_t h, int64_t hd,
                                                               int64_t dd, float scale, float *p, float *hidden,
                                                               float *qs) {
  int64_t w3 = 3 * dd;
  for (int64_t hh = 0; hh < h; hh++) {
    const float *q = qkv + hh * hd, *k = q + dd;
    for (int64_t i = 0; i < n; i++) {
      float *pi = p + (hh * n + i) * n;
      #pragma GCC unroll 4
      for (int64_t d = 0; d < hd; d++) qs[d] = q[i * w3 + d] * scale;
      for (int64_t j = 0; j <= i; j++) {
        float acc = 0.0f;
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) acc = fmaf(qs[d], k[j * w3 + d], acc);
        pi[j] = acc;
      }
      for (int64_t j = i + 1; j < n; j++) pi[j] = -INFINITY; /* causal: hidden */
      float inv = 0.0f;
      int64_t weighted = attn_softmax_short_row(pi, n, &inv);
      for (int64_t j = 0; j < weighted; j++) pi[j] *= inv;
      for (int64_t j = weighted; j < n; j++) pi[j] = 0.0f;
      hidden[hh * n + i] = weighted == 0 ? 1.0f : 0.0f;
    }
  }
}

/* Head sizes up to which causal_heads_backward sums a row's outputs side by side. */
#define TINY_HD_REGS 8

/* The attention's backward for every head of one batch item, from its
 * probabilities p and dC [n, D] (row stride D) into dqkv [n, 3D]. */
static inline __attribute__((always_inline)) void causal_heads_backward(const float *qkv, const float *p,
                                                                        const float *dcb, int64_t n, int64_t h,
                                                                        int64_t hd, int64_t dd, float scale,
                                                                        float *dqkv, float *qs) {
  int64_t w3 = 3 * dd;
  for (int64_t hh = 0; hh < h; hh++) {
    int64_t col = hh * hd;
    const float *q = qkv + col, *k = q + dd, *v = q + 2 * dd;
    float *dq = dqkv + col, *dk = dq + dd, *dv = dq + 2 * dd;
    for (int64_t i = 0; i < n; i++) {
      const float *pi = p + (hh * n + i) * n, *dci = dcb + i * dd + col;
      #pragma GCC unroll 4
      for (int64_t d = 0; d < hd; d++) qs[d] = q[i * w3 + d] * scale;
      /* Dl_i = dC_i . O_i, O_i = P_i V (over every key, as the general loop) */
      float dl = 0.0f;
      if (hd <= TINY_HD_REGS) { /* each o_d's sum over j from 0 as below, side by side */
        float o[TINY_HD_REGS];
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < n; j++) {
          #pragma GCC unroll 4
          for (int64_t d = 0; d < hd; d++) o[d] = fmaf(pi[j], v[j * w3 + d], o[d]);
        }
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) dl += dci[d] * o[d];
      } else {
        for (int64_t d = 0; d < hd; d++) {
          float o = 0.0f;
          for (int64_t j = 0; j < n; j++) o = fmaf(pi[j], v[j * w3 + d], o);
          dl += dci[d] * o;
        }
      }
      /* dS_ij = P_ij (dW_ij - Dl_i), dW_ij = dC_i . V_j; dV_j += P_ij dC_i */
      for (int64_t j = 0; j < n; j++) {
        float pij = pi[j];
        if (pij == 0.0f) continue; /* hidden, or underflowed: no term */
        const float *vj = v + j * w3, *kj = k + j * w3;
        float dw = 0.0f;
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) dw += dci[d] * vj[d];
        float ds = pij * (dw * 1.0f - dl);
        float *dvj = dv + j * w3, *dkj = dk + j * w3, *dqi = dq + i * w3;
        #pragma GCC unroll 4
        for (int64_t d = 0; d < hd; d++) {
          dvj[d] += pij * dci[d];
          dqi[d] += scale * (ds * kj[d]);
          dkj[d] += ds * qs[d];
        }
      }
    }
  }
}

/* One batch item of the causal backward, with d_in and hd as the caller gives them. */
static inline __attribute__((always_inline)) void causal_item(const attn_self_attention *m, const float *xb,
                                                              const float *db_out, float *dxb, int64_t n,
                                                              int64_t d_in, int64_t dd, int64_t hd, float *buf,
                                                              const attn_self_attention_grads *g) {
  int64_t h = m->heads, w3 = 3 * dd;
  float *qkv = buf, *dqkv = qkv + n * w3, *c = dqkv + n * w3, *dc = c + n * dd, *p = dc + n * dd,
        *hidden = p + h * n * n, *qs = hidden + h * n;
  linear_rows_inline(xb, n, d_in, m->wq, m->bq, qkv, w3, dd);
  linear_rows_inline(xb, n, d_in, m->wk, m->bk, qkv + dd, w3, dd);
  linear_rows_inline(xb, n, d_in, m->wv, m->bv, qkv + 2 * dd, w3, dd);
  for (int64_t e = 0; e < n * w3; e++) dqkv[e] = 0.0f;
  causal_probs(qkv, n, h, hd, dd, m->scale, p, hidden, qs);
  const float *dcb = db_out;
  if (m->wo) { /* C, then out_proj's backward */
    for (int64_t hh = 0; hh < h; hh++)
      for (int64_t i = 0; i < n; i++) {
        const float *pi = p + (hh * n + i) * n, *v = qkv + 2 * dd + hh * hd;
        float *ci = c + i * dd + hh * hd;
        int row_hidden = hidden[hh * n + i] != 0.0f;
        for (int64_t d = 0; d < hd; d++) {
          float acc = 0.0f;
          if (!row_hidden)
            for (int64_t j = 0; j < n; j++) acc = fmaf(pi[j], v[j * w3 + d], acc);
          ci[d] = acc;
        }
      }
    accumulate_param_grads(db_out, dd, c, n, dd, dd, g->dwo, g->dbo);
    input_grad(db_out, dd, n, dd, m->wo, dc, dd, 0);
    dcb = dc;
  }
  causal_heads_backward(qkv, p, dcb, n, h, hd, dd, m->scale, dqkv, qs);
  attn_tensor *dws[3] = {g->dwq, g->dwk, g->dwv}, *dbs[3] = {g->dbq, g->dbk, g->dbv};
  const attn_tensor *ws[3] = {m->wq, m->wk, m->wv};
  for (int i = 0; i < 3; i++) {
    accumulate_param_grads(dqkv + i * dd, w3, xb, n, dd, d_in, dws[i], dbs[i]);
    if (dxb) input_grad(dqkv + i * dd, w3, n, dd, ws[i], dxb, d_in, i > 0);
  }
}

ATTN_FMA_CLONES static void backward_tiny_causal(const attn_self_attention *m, const attn_tensor *x,
                                                 const attn_tensor *dout, const attn_self_attention_grads *g) {
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2];
  int64_t dd = m->wq->size[0], hd = dd / m->heads;
  float buf[TINY_BWD_FLOATS];
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x->data + b * n * d_in, *db_out = dout->data + b * n * dd;
    float *dxb = g->dx ? g->dx->data + b * n * d_in : NULL;
    /* the notebooks' sizes as constants: their short loops unroll (the
     * CausalAttention and MultiHeadAttention calls of [2, 6, 3] batches) */
    if (n == 6 && d_in == 3 && dd == 2 && hd == 2) causal_item(m, xb, db_out, dxb, 6, 3, 2, 2, buf, g);
    else if (n == 6 && d_in == 3 && dd == 2 && hd == 1) causal_item(m, xb, db_out, dxb, 6, 3, 2, 1, buf, g);
    else if (d_in == 3 && hd == 2) causal_item(m, xb, db_out, dxb, n, 3, dd, 2, buf, g);
    else if (d_in == 3 && hd == 1) causal_item(m, xb, db_out, dxb, n, 3, dd, 1, buf, g);
    else causal_item(m, xb, db_out, dxb, n, d_in, dd, hd, buf, g);
  }
}

/* Any tiny call (mask, dropout): the loops of the file's header comment. */
ATTN_FMA_CLONES static void backward_tiny_general(const attn_self_attention *m, const attn_tensor *x,
                                                  const attn_tensor *dout, const attn_self_attention_grads *g) {
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2];
  int64_t dd = m->wq->size[0], h = m->heads, hd = dd / h, w3 = 3 * dd;
  float buf[TINY_BWD_FLOATS];
  float *qkv = buf, *dqkv = qkv + n * w3, *c = dqkv + n * w3, *dc = c + n * dd, *p = dc + n * dd, *w = p + n * n,
        *f = w + n * n, *qs = f + n + dd;
  attn_tensor *dws[3] = {g->dwq, g->dwk, g->dwv}, *dbs[3] = {g->dbq, g->dbk, g->dbv};
  const attn_tensor *ws[3] = {m->wq, m->wk, m->wv}, *bs[3] = {m->bq, m->bk, m->bv};
  for (int i = 0; i < 3; i++) zero(dws[i]), zero(dbs[i]);
  zero(g->dwo), zero(g->dbo);
  /* one batch item's heads [h, n, hd]: strided views of the rows of qkv, as the forward's tiny path */
  attn_sdpa_problem pr;
  attn_sdpa_describe_heads(qkv, h, n, hd, w3, m->mask, m->mask == NULL, m->scale, &pr);
  int64_t sk = attn_sdpa_row_stride(&pr, &pr.k), sv = attn_sdpa_row_stride(&pr, &pr.v);

  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x->data + b * n * d_in, *db_out = dout->data + b * n * dd;
    for (int i = 0; i < 3; i++) linear_rows(xb, n, d_in, ws[i], bs[i], qkv + i * dd, w3, dd);
    memset(dqkv, 0, (size_t)(n * w3) * sizeof(float));
    const float *dcb = db_out;
    if (m->wo) {
      /* C is needed first: every head's forward, then out_proj's backward, then each head's backward */
      for (int64_t hh = 0; hh < h; hh++) {
        attn_sdpa_slice sl;
        attn_sdpa_slice_at(&pr, hh, &sl);
        for (int64_t i = 0; i < n; i++) {
          float *s = w + i * n, *ci = c + i * dd + hh * hd;
          score_row(&pr, &sl, i, n, hd, sk, qs, s);
          int hidden = attn_softmax_dropout_row(s, n, m->dropout_p, m->dropout_draw, ((b * h + hh) * n + i) * n, f,
                                                NULL);
          for (int64_t d = 0; d < hd; d++) {
            float acc = 0.0f;
            if (!hidden)
              for (int64_t j = 0; j < n; j++) acc = fmaf(s[j], sl.v[j * sv + d], acc);
            ci[d] = acc;
          }
        }
      }
      accumulate_param_grads(db_out, dd, c, n, dd, dd, g->dwo, g->dbo);
      input_grad(db_out, dd, n, dd, m->wo, dc, dd, 0);
      dcb = dc;
    }
    for (int64_t hh = 0; hh < h; hh++) {
      attn_sdpa_slice sl;
      attn_sdpa_slice_at(&pr, hh, &sl);
      int64_t col = hh * hd;
      /* P (before dropout) and W = P * F, row by row, and O_i = W_i V (Dl_i = dC_i . O_i) */
      for (int64_t i = 0; i < n; i++) {
        float *pi = p + i * n, *wi = w + i * n;
        score_row(&pr, &sl, i, n, hd, sk, qs, pi);
        int64_t position = ((b * h + hh) * n + i) * n;
        attn_softmax_dropout_row(pi, n, 0.0, (attn_dropout_draw){0, NULL}, position, f, NULL); /* 0s if hidden */
        memcpy(wi, pi, (size_t)n * sizeof(float));
        if (m->dropout_p > 0.0) {
          attn_dropout_factors(m->dropout_draw, m->dropout_p, position, n, f);
          for (int64_t j = 0; j < n; j++) wi[j] *= f[j];
        }
        const float *dci = dcb + i * dd + col;
        float dl = 0.0f;
        for (int64_t d = 0; d < hd; d++) {
          float o = 0.0f;
          for (int64_t j = 0; j < n; j++) o = fmaf(wi[j], sl.v[j * sv + d], o);
          dl += dci[d] * o;
        }
        /* dS_ij = P_ij (dW_ij F_ij - Dl_i), dW_ij = dC_i . V_j; dV_j += W_ij dC_i */
        float *dqi = dqkv + i * w3 + col;
        for (int64_t j = 0; j < n; j++) {
          if (pi[j] == 0.0f) continue; /* hidden, or underflowed: no term */
          const float *vj = sl.v + j * sv, *kj = sl.k + j * sk;
          float dw = 0.0f;
          for (int64_t d = 0; d < hd; d++) dw += dci[d] * vj[d];
          float fj = m->dropout_p > 0.0 ? f[j] : 1.0f;
          float ds = pi[j] * (dw * fj - dl);
          float *dvj = dqkv + j * w3 + 2 * dd + col, *dkj = dqkv + j * w3 + dd + col;
          for (int64_t d = 0; d < hd; d++) {
            dvj[d] += wi[j] * dci[d];
            dqi[d] += pr.scale * (ds * kj[d]);
            dkj[d] += ds * qs[d];
          }
        }
      }
    }
    float *dxb = g->dx ? g->dx->data + b * n * d_in : NULL;
    for (int i = 0; i < 3; i++) {
      accumulate_param_grads(dqkv + i * dd, w3, xb, n, dd, d_in, dws[i], dbs[i]);
      if (dxb) input_grad(dqkv + i * dd, w3, n, dd, ws[i], dxb, d_in, i > 0);
    }
  }
}

void attn_self_attention_backward_tiny(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *dout,
                                       const attn_self_attention_grads *g) {
  if (!m->mask && m->dropout_p == 0.0 &&
      causal_scratch_floats(x->size[1], m->wq->size[0], m->heads) <= TINY_BWD_FLOATS) {
    attn_tensor *all[8] = {g->dwq, g->dwk, g->dwv, g->dbq, g->dbk, g->dbv, g->dwo, g->dbo};
    for (int i = 0; i < 8; i++) zero(all[i]);
    backward_tiny_causal(m, x, dout, g);
    return;
  }
  backward_tiny_general(m, x, dout, g);
}
