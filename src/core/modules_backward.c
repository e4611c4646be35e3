/* Backward of the fused self-attention module forward (see
 * modules_backward.h). With rows = B n, D = d_out, h heads of hd = D / h:
 *   QKV = x [Wq; Wk; Wv]^T + [bq, bk, bv]        [rows, 3D]
 *   O   = attention of the head views of Q, K, V [B, h, n, hd] keeping P
 *         (math: the softmax; flash: the log-sum-exp), the forward's kernel
 *         choice (attn_sdpa_choose_kernel) and dropout draw
 *   C   = O as [rows, D] (heads side by side)
 *   QKV, O, P and C are what the training forward kept
 *   (attn_self_attention_forward_saving: the recorded module forward), or
 *   are recomputed here (a tiny call, or a caller that kept nothing) by
 *   attn_self_attention_state, the forward's own steps: the bits of what the
 *   forward computed, so the gradients are the same bits either way. Keeping
 *   them took train_gpt's step from 216 to 188 ms of CPU on one thread.
 *   with out_proj: dWo = dout^T C [D, D], dbo = colsum dout, dC = dout Wo;
 *   else dC = dout
 *   dQ, dK, dV = attn_sdpa_backward(dC as [B, h, n, hd] views), written
 *                into their columns of dQKV [rows, 3D] as head views
 *   dW* = d*^T x [D, d_in], db* = colsum d*, dx = dQ Wq + dK Wk + dV Wv
 * The gradients' products by attn_gemm (attn_matmul's fixed tiles; direct
 * loops for tiny ones, src/core/small_gemm.h); column sums each in row
 * order (bands of columns to the threads): the bits do not depend on the
 * thread count (a small
 * call runs on one thread: the same bits, without waking a team). Scratch
 * is malloc'ed and freed here. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "exp_nonpos.h"
#include "modules_backward.h"
#include "ops.h"
#include "sdpa_backward.h"
#include "small_gemm.h"
#include "threads.h"

/* Multiply-adds of the forward up to which the backward runs on one thread. */
#define SERIAL_MACS (1 << 20)

/* The memory passes (colsum, dx's sum) go to the threads in
 * chunks of PASS_CHUNK floats (none below one chunk) and colsum in bands of
 * COLSUM_BAND columns (whole cache lines of a row) */
#define PASS_CHUNK (16 * 1024)
#define COLSUM_BAND 32

/* dst [n] += src [n], element by element (vectorised: same bits in any width) */
ATTN_VECTOR_CLONES static void add_into(float *restrict dst, const float *restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* db [w] = column sums of d [rows, w] (row stride ld), each in row order */
ATTN_VECTOR_CLONES static void colsum_band(const float *restrict d, int64_t rows, int64_t w, int64_t ld,
                                           float *restrict db) {
  for (int64_t j = 0; j < w; j++) db[j] = 0.0f;
  for (int64_t r = 0; r < rows; r++) {
#pragma omp simd
    for (int64_t j = 0; j < w; j++) db[j] += d[r * ld + j];
  }
}

/* A [B, h, n, hd] view of heads laid side by side in rows of ld floats. */
static attn_tensor heads_view(float *data, int64_t nb, int64_t n, int64_t h, int64_t hd, int64_t ld) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.ndim = 4;
  t.size[0] = nb, t.size[1] = h, t.size[2] = n, t.size[3] = hd;
  t.stride[0] = n * ld, t.stride[1] = hd, t.stride[2] = ld, t.stride[3] = 1;
  return t;
}

/* c [m, n] (row stride ldc) = op(a) op(b): direct loops for a tiny product,
 * else attn_gemm's fixed tiles (the sizes choose) */
static void product(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                    int64_t ldb, float *c, int64_t ldc) {
  if (m * n * k <= ATTN_SMALL_GEMM_MACS)
    attn_small_gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  else
    attn_gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
}

/* How w [rows, cols] goes to attn_gemm as op(w) = w^T (for x w^T): trans flag and ld. */
static void weight_layout(const attn_tensor *w, int *trans, int64_t *ld) {
  *trans = w->stride[1] == 1;
  *ld = *trans ? w->stride[0] : w->stride[1];
  if (*ld < 1) *ld = 1;
}

/* dx [rows, nin] (+)= dy [rows, nout] (row stride ldy) w, through tmp when adding */
static void linear_dx(const float *dy, int64_t ldy, int64_t rows, int64_t nout, const attn_tensor *w, float *dx,
                      int64_t nin, int add, float *tmp) {
  int trans;
  int64_t ldw;
  weight_layout(w, &trans, &ldw);
  float *dst = add ? tmp : dx;
  product(0, !trans, rows, nin, nout, dy, ldy, w->data, ldw, dst, nin);
  if (add) {
    int64_t total = rows * nin, chunks = (total + PASS_CHUNK - 1) / PASS_CHUNK;
    int nt = attn_threads_for(chunks);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++) {
      int64_t end = (ch + 1) * PASS_CHUNK < total ? (ch + 1) * PASS_CHUNK : total;
      add_into(dx + ch * PASS_CHUNK, tmp + ch * PASS_CHUNK, end - ch * PASS_CHUNK);
    }
  }
}

/* db [n] = column sums of d [rows, n] (row stride ld), each in row order
 * (bands of columns to the threads: the same sums in the same order) */
static void colsum(const float *d, int64_t rows, int64_t n, int64_t ld, float *db) {
  int64_t bands = (n + COLSUM_BAND - 1) / COLSUM_BAND;
  int nt = rows * n >= PASS_CHUNK ? attn_threads_for(bands) : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t bj = 0; bj < bands; bj++) {
    int64_t j0 = bj * COLSUM_BAND, j1 = j0 + COLSUM_BAND < n ? j0 + COLSUM_BAND : n;
    colsum_band(d + j0, rows, j1 - j0, ld, db + j0);
  }
}

static int grad_fits(const attn_tensor *g, const attn_tensor *param) {
  if (!g) return 1;
  if (!param || g->ndim != param->ndim || !attn_is_contiguous(g)) return 0;
  for (int d = 0; d < g->ndim; d++)
    if (g->size[d] != param->size[d]) return 0;
  return 1;
}

/* The backward; with sv (the training forward's state) nothing of the forward is recomputed */
static attn_status backward(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *dout,
                            const attn_self_attention_saved *sv, const attn_self_attention_grads *g) {
  attn_status st = attn_self_attention_check_call(m, x, dout, "dout");
  if (st != ATTN_OK) return st;
  int64_t nb = x->size[0], n = x->size[1], d_in = x->size[2];
  int64_t dd = m->wq->size[0], h = m->heads, hd = dd / h, rows = nb * n, w3 = 3 * dd;
  int fits = (!g->dx || (g->dx->ndim == 3 && attn_is_contiguous(g->dx) && g->dx->size[0] == nb &&
                         g->dx->size[1] == n && g->dx->size[2] == d_in)) &&
             grad_fits(g->dwq, m->wq) && grad_fits(g->dwk, m->wk) && grad_fits(g->dwv, m->wv) &&
             grad_fits(g->dbq, m->bq) && grad_fits(g->dbk, m->bk) && grad_fits(g->dbv, m->bv) &&
             grad_fits(g->dwo, m->wo) && grad_fits(g->dbo, m->bo);
  if (!fits) return attn_fail(ATTN_ESHAPE, "each gradient must be contiguous with its parameter's (or x's) shape");
  if (rows * w3 > INT64_MAX / 4 || rows > INT32_MAX || w3 > INT32_MAX)
    return attn_fail(ATTN_EARG, "sizes beyond the BLAS integer range");

  if (attn_self_attention_backward_tiny_fits(m, nb, n, d_in)) {
    attn_self_attention_backward_tiny(m, x, dout, g);
    return ATTN_OK;
  }

  /* the attention kernel the forward used, and what its backward needs */
  attn_sdpa_kernel kernel = (attn_sdpa_kernel)attn_self_attention_state_kernel(m, nb, n);
  if (sv && (int)kernel != sv->kernel)
    return attn_fail(ATTN_EARG, "the saved state is not that of a forward of these sizes");
  size_t act = (size_t)(rows * dd), saved_n = kernel == ATTN_SDPA_MATH ? (size_t)(nb * h * n * n) : (size_t)(nb * h * n);
  /* dWq, dWk, dWv as one product dQKV^T x [3D, d_in] where the own GEMM runs
   * each of them (its bits depend on no tile, so each row is the one its own
   * product gives): x is packed once instead of three times */
  int one_dw = g->dwq && g->dwk && g->dwv && dd * d_in * rows > ATTN_SMALL_GEMM_MACS &&
               attn_gemm_is_own(dd, d_in, rows) && attn_gemm_is_own(w3, d_in, rows);
  /* the state (unless kept: qkv [3, rows, D], o, c, saved), dc [rows, D], dqkv [rows, 3D], tmp [rows, d_in],
   * dw3 [3D, d_in] (with one_dw: that product) */
  size_t tmp_n = (size_t)(rows * d_in), dw3_n = one_dw ? (size_t)(w3 * d_in) : 0;
  size_t kept = sv ? 0 : 3 * act + act + act + saved_n;
  size_t total = kept + act + 3 * act + tmp_n + dw3_n;
  float *buf = malloc((total ? total : 1) * sizeof(float));
  if (!buf) return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes of module backward scratch", total * sizeof(float));
  attn_self_attention_saved state; /* the forward's: kept, or recomputed below */
  if (sv) {
    state = *sv;
  } else {
    state.qkv = buf, state.o = state.qkv + 3 * act, state.c = state.o + act, state.saved = state.c + act;
    state.kernel = (int)kernel;
    if (!m->wo) state.c = NULL;
  }
  float *o = state.o, *c = state.c, *saved = state.saved, *dc = sv ? buf : buf + kept;
  float *dqkv = dc + act, *tmp = dqkv + 3 * act, *dw3 = tmp + tmp_n;

  /* a small call runs on the calling thread alone: waking an OpenMP team costs
   * more than its work (milliseconds on a loaded machine, as the forward's tiny
   * path found); every region below then gets one thread (attn_threads_for) */
  double macs = (double)rows * ((double)d_in * 3.0 * (double)dd + 2.0 * (double)n * (double)dd +
                                (m->wo ? (double)dd * (double)dd : 0.0));
  int saved_threads = omp_get_max_threads();
  if (macs <= SERIAL_MACS) omp_set_num_threads(1);

  /* without a kept state: the forward's own steps recompute it (its bits) */
  if (!sv && (st = attn_self_attention_state(m, x, &state)) != ATTN_OK) goto done;
  /* the forward's Q, K, V [rows, D] each */
  attn_tensor q = heads_view(state.qkv, nb, n, h, hd, dd), k = heads_view(state.qkv + act, nb, n, h, hd, dd);
  attn_tensor v = heads_view(state.qkv + 2 * act, nb, n, h, hd, dd);
  int64_t hsize[4] = {nb, h, n, hd}, psize[4] = {nb, h, n, n};
  attn_tensor ot = attn_make(o, 4, hsize), st_t = attn_make(saved, kernel == ATTN_SDPA_MATH ? 4 : 3, psize);
  attn_sdpa_opts opts = attn_self_attention_sdpa_opts(m);

  const float *dcp = dout->data; /* dC [rows, D] */
  if (m->wo) {
    if (g->dwo) product(1, 0, dd, dd, rows, dout->data, dd, c, dd, g->dwo->data, dd);
    if (g->dbo) colsum(dout->data, rows, dd, dd, g->dbo->data);
    linear_dx(dout->data, dd, rows, dd, m->wo, dc, dd, 0, NULL);
    dcp = dc;
  }
  attn_tensor dct = heads_view((float *)dcp, nb, n, h, hd, dd);
  /* dQ, dK, dV written straight into their columns of dqkv [rows, 3D] (head views) */
  attn_tensor dqt = heads_view(dqkv, nb, n, h, hd, w3), dkt = heads_view(dqkv + dd, nb, n, h, hd, w3);
  attn_tensor dvt = heads_view(dqkv + 2 * dd, nb, n, h, hd, w3);
  attn_sdpa_grads sg = {&dqt, &dkt, &dvt, NULL};
  if ((st = attn_sdpa_backward(kernel, &q, &k, &v, &opts, &ot, &dct, &st_t, NULL, &sg)) != ATTN_OK) goto done;

  const attn_tensor *ws[3] = {m->wq, m->wk, m->wv};
  attn_tensor *dws[3] = {g->dwq, g->dwk, g->dwv}, *dbs[3] = {g->dbq, g->dbk, g->dbv};
  if (one_dw) {
    attn_gemm(1, 0, w3, d_in, rows, dqkv, w3, x->data, d_in, dw3, d_in);
    for (int i = 0; i < 3; i++) memcpy(dws[i]->data, dw3 + i * dd * d_in, (size_t)(dd * d_in) * sizeof(float));
  }
  for (int i = 0; i < 3; i++) {
    const float *di = dqkv + i * dd;
    if (dws[i] && !one_dw) product(1, 0, dd, d_in, rows, di, w3, x->data, d_in, dws[i]->data, d_in);
    if (dbs[i]) colsum(di, rows, dd, w3, dbs[i]->data);
    if (g->dx) linear_dx(di, w3, rows, dd, ws[i], g->dx->data, d_in, i > 0, tmp);
  }
done:
  omp_set_num_threads(saved_threads);
  free(buf);
  return st;
}

attn_status attn_self_attention_backward(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *dout,
                                         const attn_self_attention_grads *g) {
  return backward(m, x, dout, NULL, g);
}

attn_status attn_self_attention_backward_saved(const attn_self_attention *m, const attn_tensor *x,
                                               const attn_tensor *dout, const attn_self_attention_saved *s,
                                               const attn_self_attention_grads *g) {
  return backward(m, x, dout, s, g);
}
