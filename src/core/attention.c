/* Scaled dot-product attention, "math" kernel: per (batch, head) slice,
 * in blocks of at most ATTN_ROW_BLOCK query rows:
 *   Qs = fl(q * scale)            [R, E]    (packed, as torch 1.13 scales q)
 *   S  = Qs k^T                   [R, Lk]   (cblas_sgemm, k strided or packed)
 *   S  = S + bias, hidden -> -inf, row softmax (all hidden -> zeros), dropout
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
#include "rng.h"
#include "threads.h"

/* Query rows per work item; a constant, so the split (and the bits) never
 * depend on the thread count. */
#define ATTN_ROW_BLOCK 64

attn_sdpa_opts attn_sdpa_defaults(void) {
  attn_sdpa_opts o;
  memset(&o, 0, sizeof o);
  o.scale = 1.0f;
  return o;
}

/* The leading dims of t (all but the last two; none when t has fewer). */
static int lead_ndim(const attn_tensor *t) { return t->ndim > 2 ? t->ndim - 2 : 0; }

/* Does mask/bias t broadcast to [..., Lq, Lk] in its last two dims? */
static int fits_scores(const attn_tensor *t, int64_t lq, int64_t lk) {
  if (t->ndim >= 1 && t->size[t->ndim - 1] != 1 && t->size[t->ndim - 1] != lk) return 0;
  if (t->ndim >= 2 && t->size[t->ndim - 2] != 1 && t->size[t->ndim - 2] != lq) return 0;
  return 1;
}

attn_status attn_sdpa_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *mask, const attn_tensor *bias, int *ndim, int64_t *size) {
  char b1[200], b2[200], b3[200];
  const attn_tensor *ops[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++)
    if (ops[i]->ndim < 2)
      return attn_fail(ATTN_ESHAPE, "%s must have at least 2 dims ([..., L, E]), got %s", names[i],
                       attn_shape_str(ops[i], b1, sizeof b1));
  int64_t lq = q->size[q->ndim - 2], e = q->size[q->ndim - 1];
  int64_t lk = k->size[k->ndim - 2], ek = k->size[k->ndim - 1];
  int64_t lv = v->size[v->ndim - 2], ev = v->size[v->ndim - 1];
  if (ek != e)
    return attn_fail(ATTN_ESHAPE, "q %s and k %s differ in the embedding size E (%lld ~= %lld)",
                     attn_shape_str(q, b1, sizeof b1), attn_shape_str(k, b2, sizeof b2), (long long)e, (long long)ek);
  if (lv != lk)
    return attn_fail(ATTN_ESHAPE, "k %s and v %s differ in the key count Lk (%lld ~= %lld)",
                     attn_shape_str(k, b1, sizeof b1), attn_shape_str(v, b2, sizeof b2), (long long)lk, (long long)lv);
  int nb;
  int64_t batch[ATTN_MAX_DIMS];
  if (attn_broadcast_shape(q->ndim - 2, q->size, k->ndim - 2, k->size, &nb, batch) != ATTN_OK ||
      attn_broadcast_shape(nb, batch, v->ndim - 2, v->size, &nb, batch) != ATTN_OK)
    return attn_fail(ATTN_ESHAPE, "the leading dims of q %s, k %s and v %s do not broadcast",
                     attn_shape_str(q, b1, sizeof b1), attn_shape_str(k, b2, sizeof b2),
                     attn_shape_str(v, b3, sizeof b3));
  const attn_tensor *extra[2] = {mask, bias};
  const char *enames[2] = {"mask", "bias"};
  for (int i = 0; i < 2; i++) {
    const attn_tensor *t = extra[i];
    if (!t) continue;
    int64_t scores[ATTN_MAX_DIMS + 2];
    int ok = fits_scores(t, lq, lk);
    int nb2 = nb;
    int64_t batch2[ATTN_MAX_DIMS];
    if (ok && attn_broadcast_shape(nb, batch, lead_ndim(t), t->size, &nb2, batch2) != ATTN_OK) ok = 0;
    if (!ok) {
      for (int d = 0; d < nb; d++) scores[d] = batch[d];
      scores[nb] = lq;
      scores[nb + 1] = lk;
      return attn_fail(ATTN_ESHAPE, "%s %s does not broadcast to the scores [..., Lq, Lk] = %s", enames[i],
                       attn_shape_str(t, b1, sizeof b1), attn_sizes_str(nb + 2, scores, b2, sizeof b2));
    }
    nb = nb2;
    memcpy(batch, batch2, (size_t)nb * sizeof(int64_t));
  }
  if (nb + 2 > ATTN_MAX_DIMS)
    return attn_fail(ATTN_ESHAPE, "the result would have %d dims, at most %d are supported", nb + 2, ATTN_MAX_DIMS);
  for (int d = 0; d < nb; d++) size[d] = batch[d];
  size[nb] = lq;
  size[nb + 1] = ev;
  *ndim = nb + 2;
  return ATTN_OK;
}

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
  const attn_sdpa_opts *o;
  CBLAS_TRANSPOSE ktr, vtr;        /* k^T as [E, Lk] and v as [Lk, Ev], when not packed */
  int64_t ldk, ldv;
  int pack_k, pack_v;
  attn_tensor *out, *weights;
  int64_t nblk;                    /* row blocks per slice */
  /* per-thread scratch block, in floats: qs, kp, vp, s (those used), f */
  size_t off_kp, off_vp, off_s, off_f, block;
} sdpa_ctx;

/* Offset of batch item bi in a tensor expanded to [B..., r, c]. */
static int64_t batch_offset(const sdpa_ctx *c, const attn_tensor *t, int64_t bi) {
  int64_t off = 0;
  for (int d = c->p.nbatch - 1; d >= 0; d--) {
    off += (bi % c->p.batch[d]) * t->stride[d];
    bi /= c->p.batch[d];
  }
  return off;
}

/* Bias, mask, softmax and dropout of row i of slice bi, in place on s [Lk];
 * f [Lk] is scratch for the dropout factors. 1 when every key is hidden. */
static int score_row(const sdpa_ctx *c, int64_t bi, int64_t i, float *s, float *f) {
  int64_t lk = c->p.lk, nb = c->p.nbatch;
  if (c->p.has_bias) {
    const float *b = c->p.bias.data + batch_offset(c, &c->p.bias, bi) + i * c->p.bias.stride[nb];
    int64_t sb = c->p.bias.stride[nb + 1];
    for (int64_t j = 0; j < lk; j++) s[j] = s[j] + b[j * sb];
  }
  if (c->p.has_mask) {
    const float *m = c->p.mask.data + batch_offset(c, &c->p.mask, bi) + i * c->p.mask.stride[nb];
    int64_t sm = c->p.mask.stride[nb + 1];
    for (int64_t j = 0; j < lk; j++)
      if (m[j * sm] != 0.0f) s[j] = -INFINITY;
  }
  if (c->o->is_causal)
    for (int64_t j = i + 1; j < lk; j++) s[j] = -INFINITY;
  return attn_softmax_dropout_row(s, lk, c->o->dropout_p, c->o->dropout_draw, (bi * c->p.lq + i) * lk, f);
}

int attn_softmax_dropout_row(float *s, int64_t lk, double dropout_p, uint32_t dropout_draw, int64_t position,
                             float *f) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < lk; j++) {
    if (s[j] > mx || s[j] != s[j]) mx = s[j];
    if (mx != mx) break;
  }
  if (mx == -INFINITY) { /* every key hidden (or no key): zeros, not NaN */
    memset(s, 0, (size_t)lk * sizeof(float));
    return 1;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < lk; j++) {
    float x = expf(s[j] - mx);
    s[j] = x;
    sum += (double)x;
  }
  float inv = (float)(1.0 / sum);
  for (int64_t j = 0; j < lk; j++) s[j] *= inv;
  if (dropout_p > 0.0) {
    attn_dropout_factors(dropout_draw, dropout_p, position, lk, f);
    for (int64_t j = 0; j < lk; j++) s[j] *= f[j];
  }
  return 0;
}

/* Work item `item` (slice bi = item / nblk, rows r0 .. r0 + R - 1) with the
 * calling thread's scratch block w. */
static void run_item(const sdpa_ctx *c, int64_t item, float *w) {
  int64_t lq = c->p.lq, lk = c->p.lk, e = c->p.e, ev = c->p.ev;
  int64_t bi = item / c->nblk, r0 = (item % c->nblk) * ATTN_ROW_BLOCK;
  int64_t rows = lq - r0 < ATTN_ROW_BLOCK ? lq - r0 : ATTN_ROW_BLOCK;
  int nb = c->p.nbatch;
  float scale = c->o->scale;
  float *qs = w;
  const float *q = c->p.q.data + batch_offset(c, &c->p.q, bi);
  int64_t sq0 = c->p.q.stride[nb], sq1 = c->p.q.stride[nb + 1];
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < e; j++) qs[i * e + j] = q[(r0 + i) * sq0 + j * sq1] * scale;

  const float *k = c->p.k.data + batch_offset(c, &c->p.k, bi);
  int64_t ldk = c->ldk;
  if (c->pack_k) { /* k^T packed as [E, Lk] */
    float *kp = w + c->off_kp;
    int64_t sk0 = c->p.k.stride[nb], sk1 = c->p.k.stride[nb + 1];
    for (int64_t j = 0; j < lk; j++)
      for (int64_t d = 0; d < e; d++) kp[d * lk + j] = k[j * sk0 + d * sk1];
    k = kp;
    ldk = lk;
  }
  const float *v = c->p.v.data + batch_offset(c, &c->p.v, bi);
  int64_t ldv = c->ldv;
  if (c->pack_v) {
    float *vp = w + c->off_vp;
    int64_t sv0 = c->p.v.stride[nb], sv1 = c->p.v.stride[nb + 1];
    for (int64_t j = 0; j < lk; j++)
      for (int64_t d = 0; d < ev; d++) vp[j * ev + d] = v[j * sv0 + d * sv1];
    v = vp;
    ldv = ev;
  }
  float *s = c->weights ? c->weights->data + (bi * lq + r0) * lk : w + c->off_s;
  float *o = c->out->data + (bi * lq + r0) * ev;

  /* rows whose keys are all hidden: their output is zeros, which the sgemm
   * below would not give when v holds NaN or inf (0 * NaN) */
  unsigned char hidden[ATTN_ROW_BLOCK];
  int any_hidden = 0;
  if (lk > 0) {
    if (e > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, c->pack_k ? CblasNoTrans : c->ktr, (blasint)rows, (blasint)lk,
                  (blasint)e, 1.0f, qs, (blasint)e, k, (blasint)ldk, 0.0f, s, (blasint)lk);
    else
      memset(s, 0, (size_t)(rows * lk) * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
      hidden[i] = (unsigned char)score_row(c, bi, r0 + i, s + i * lk, w + c->off_f);
      any_hidden |= hidden[i];
    }
  }
  if (ev > 0) {
    if (lk > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, c->pack_v ? CblasNoTrans : c->vtr, (blasint)rows, (blasint)ev,
                  (blasint)lk, 1.0f, s, (blasint)lk, v, (blasint)ldv, 0.0f, o, (blasint)ev);
    else
      memset(o, 0, (size_t)(rows * ev) * sizeof(float));
    if (any_hidden)
      for (int64_t i = 0; i < rows; i++)
        if (hidden[i]) memset(o + i * ev, 0, (size_t)ev * sizeof(float));
  }
}

/* acc += a * b floats, in bytes-safe arithmetic; 0 on overflow. */
static int add_floats(size_t *acc, int64_t a, int64_t b) {
  size_t n;
  if (__builtin_mul_overflow((size_t)a, (size_t)b, &n) || __builtin_add_overflow(*acc, n, acc)) return 0;
  return 1;
}

static int check_out(const attn_tensor *t, int nb, const int64_t *batch, int64_t r, int64_t cols) {
  if (t->ndim != nb + 2 || !attn_is_contiguous(t)) return 0;
  for (int d = 0; d < nb; d++)
    if (t->size[d] != batch[d]) return 0;
  return t->size[nb] == r && t->size[nb + 1] == cols;
}

attn_status attn_sdpa_prepare(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_sdpa_opts *opts, const attn_tensor *out, const attn_tensor *weights,
                              attn_sdpa_problem *p) {
  int ondim;
  int64_t osize[ATTN_MAX_DIMS];
  attn_status st = attn_sdpa_shape(q, k, v, opts->mask, opts->bias, &ondim, osize);
  if (st != ATTN_OK) return st;
  if (!(opts->dropout_p >= 0.0 && opts->dropout_p < 1.0))
    return attn_fail(ATTN_EARG, "dropout_p must be in [0, 1), got %g", opts->dropout_p);
  if (opts->mask) {
    int64_t at[ATTN_MAX_DIMS];
    float bad;
    if (attn_mask_find_non_binary(opts->mask, at, &bad)) {
      char b1[200];
      return attn_fail(ATTN_EARG,
                       "mask must hold only 0 and 1 (nonzero = hidden), got %.9g at %s; to add values to the "
                       "scores pass them as bias",
                       (double)bad, attn_sizes_str(opts->mask->ndim, at, b1, sizeof b1));
    }
  }
  memset(p, 0, sizeof *p);
  p->nbatch = ondim - 2;
  memcpy(p->batch, osize, (size_t)p->nbatch * sizeof(int64_t));
  p->lq = q->size[q->ndim - 2];
  p->e = q->size[q->ndim - 1];
  p->lk = k->size[k->ndim - 2];
  p->ev = v->size[v->ndim - 1];
  /* with E = 0 no score is scaled (the default 1/sqrt(0) is inf) */
  if (p->e > 0 && !isfinite(opts->scale))
    return attn_fail(ATTN_EARG, "scale must be finite in float32, got %g", (double)opts->scale);
  char b1[200], b2[200];
  if (!check_out(out, p->nbatch, p->batch, p->lq, p->ev))
    return attn_fail(ATTN_ESHAPE, "out must be contiguous %s, got %s", attn_sizes_str(ondim, osize, b1, sizeof b1),
                     attn_shape_str(out, b2, sizeof b2));
  if (weights && !check_out(weights, p->nbatch, p->batch, p->lq, p->lk))
    return attn_fail(ATTN_ESHAPE, "weights must be contiguous with the scores' shape, got %s",
                     attn_shape_str(weights, b2, sizeof b2));
  if (p->lq > INT_MAX || p->lk > INT_MAX || p->e > INT_MAX || p->ev > INT_MAX)
    return attn_fail(ATTN_EARG, "sizes above %d are not supported by BLAS (Lq %lld, Lk %lld, E %lld, Ev %lld)", INT_MAX,
                     (long long)p->lq, (long long)p->lk, (long long)p->e, (long long)p->ev);

  int64_t full[ATTN_MAX_DIMS];
  memcpy(full, p->batch, (size_t)p->nbatch * sizeof(int64_t));
  full[p->nbatch] = p->lq;
  full[p->nbatch + 1] = p->e;
  if ((st = attn_expand(q, ondim, full, &p->q)) != ATTN_OK) return st;
  full[p->nbatch] = p->lk;
  if ((st = attn_expand(k, ondim, full, &p->k)) != ATTN_OK) return st;
  full[p->nbatch + 1] = p->ev;
  if ((st = attn_expand(v, ondim, full, &p->v)) != ATTN_OK) return st;
  full[p->nbatch] = p->lq;
  full[p->nbatch + 1] = p->lk;
  if (opts->mask) {
    if ((st = attn_expand(opts->mask, ondim, full, &p->mask)) != ATTN_OK) return st;
    p->has_mask = 1;
  }
  if (opts->bias) {
    if ((st = attn_expand(opts->bias, ondim, full, &p->bias)) != ATTN_OK) return st;
    p->has_bias = 1;
  }
  return ATTN_OK;
}

attn_status attn_sdpa_math(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights) {
  sdpa_ctx c;
  memset(&c, 0, sizeof c);
  attn_status st = attn_sdpa_prepare(q, k, v, opts, out, weights, &c.p);
  if (st != ATTN_OK) return st;
  c.o = opts;
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
  int ok = add_floats(&block, rb, c.p.e);
  c.off_kp = block;
  if (c.pack_k) ok = ok && add_floats(&block, c.p.e, c.p.lk);
  c.off_vp = block;
  if (c.pack_v) ok = ok && add_floats(&block, c.p.lk, c.p.ev);
  c.off_s = block;
  if (!weights) ok = ok && add_floats(&block, rb, c.p.lk);
  c.off_f = block;
  ok = ok && add_floats(&block, c.p.lk, 1);
  c.block = block;

  int64_t items;
  if (__builtin_mul_overflow(nb, c.nblk, &items))
    return attn_fail(ATTN_EOVERFLOW, "too many attention rows (%lld slices of %lld)", (long long)nb, (long long)c.p.lq);
  int nthreads = attn_threads_for(items);
  size_t total = 0, bytes;
  ok = ok && add_floats(&total, (int64_t)block, nthreads);
  if (!ok || __builtin_mul_overflow(total, sizeof(float), &bytes))
    return attn_fail(ATTN_ENOMEM, "the attention scratch size overflows (Lq %lld, Lk %lld, E %lld, Ev %lld)",
                     (long long)c.p.lq, (long long)c.p.lk, (long long)c.p.e, (long long)c.p.ev);
  float *scratch = malloc(bytes ? bytes : 1);
  if (!scratch) return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes of attention scratch", bytes);

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    /* BLAS single-threaded in here, even in a team of one (this ICV is the
     * region's own copy: the caller's thread count is left as it was). */
    omp_set_num_threads(1);
    float *w = scratch + block * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) run_item(&c, it, w);
  }
  free(scratch);
  return ATTN_OK;
}

int attn_mask_find_non_binary(const attn_tensor *mask, int64_t *at, float *value) {
  /* a broadcast (stride 0) dim repeats its first element: visit that one only,
   * so an expanded mask costs what its storage holds */
  int nd = mask->ndim;
  int64_t extent[ATTN_MAX_DIMS], idx[ATTN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    if (mask->size[d] == 0) return 0;
    extent[d] = mask->stride[d] == 0 ? 1 : mask->size[d];
    idx[d] = 0;
  }
  const float *m = mask->data;
  int64_t off = 0;
  for (;;) {
    float x = m[off];
    if (x != 0.0f && x != 1.0f) { /* NaN and +-inf too */
      for (int d = 0; d < nd; d++) at[d] = idx[d] + 1;
      *value = x != x ? NAN : x; /* a positive NaN: printed "nan", not "-nan" */
      return 1;
    }
    int d = nd - 1;
    for (; d >= 0; d--) {
      off += mask->stride[d];
      if (++idx[d] < extent[d]) break;
      off -= mask->stride[d] * extent[d];
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}

int attn_mask_is_causal(const attn_tensor *mask, int64_t n) {
  if (mask->ndim != 2 || mask->size[0] < n || mask->size[1] < n) return 0;
  int64_t s0 = mask->stride[0], s1 = mask->stride[1];
  for (int64_t i = 0; i < n; i++) {
    const float *row = mask->data + i * s0;
    for (int64_t j = 0; j < n; j++)
      if (row[j * s1] != (j > i ? 1.0f : 0.0f)) return 0;
  }
  return 1;
}
