/* The log-sum-exp merge of two partial attention results (lse_merge.h).
 *
 * The arithmetic is the composition of the tensor ops it replaces in
 * ring.lua (max by `>`, expf, logf, float32 products and one sum per
 * element, no contraction under -ffp-contract=off), so the bits are those of
 * that composition. Threads: rows are independent and each row's arithmetic
 * is fixed, so the bits do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "flash.h"
#include "lse_merge.h"
#include "sdpa_common.h"
#include "threads.h"

/* [lo, hi) byte range that t's elements lie in (empty: lo == hi). */
static void byte_range(const attn_tensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t min = 0, max = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->size[d] == 0) {
      *lo = *hi = (uintptr_t)t->data;
      return;
    }
    int64_t span = (t->size[d] - 1) * t->stride[d];
    if (span < 0) min += span;
    else max += span;
  }
  *lo = (uintptr_t)(t->data + min);
  *hi = (uintptr_t)(t->data + max + 1);
}

static int ranges_meet(const attn_tensor *a, const attn_tensor *b) {
  uintptr_t alo, ahi, blo, bhi;
  byte_range(a, &alo, &ahi);
  byte_range(b, &blo, &bhi);
  return alo < ahi && blo < bhi && alo < bhi && blo < ahi;
}

/* Offset (in elements) of the idx-th index, in row-major order, over the
 * first k dims of t (0 for k = 0). */
static int64_t lead_offset(const attn_tensor *t, int k, int64_t idx) {
  int64_t off = 0;
  for (int d = k - 1; d >= 0; d--) {
    off += (idx % t->size[d]) * t->stride[d];
    idx /= t->size[d];
  }
  return off;
}

attn_status attn_lse_merge(attn_tensor *out, attn_tensor *lse, const attn_tensor *o, const attn_tensor *l) {
  char b1[200], b2[200], b3[200], b4[200];
  int nd = out->ndim;
  int fits = nd >= 2 && attn_same_shape(out, o) && lse->ndim == nd - 1 && attn_same_shape(lse, l);
  for (int d = 0; fits && d < nd - 1; d++) fits = lse->size[d] == out->size[d];
  if (!fits)
    return attn_fail(ATTN_ESHAPE,
                     "expected out, o [..., n, E] and lse, l [..., n] of the same sizes, "
                     "got out %s, lse %s, o %s, l %s",
                     attn_shape_str(out, b1, sizeof b1), attn_shape_str(lse, b2, sizeof b2),
                     attn_shape_str(o, b3, sizeof b3), attn_shape_str(l, b4, sizeof b4));
  if (attn_has_internal_overlap(out) || attn_has_internal_overlap(lse))
    return attn_fail(ATTN_EARG, "out and lse are written in place: they must not repeat an element (an expanded dim)");
  const attn_tensor *read[] = {o, l, lse};
  for (int i = 0; i < 3; i++)
    if (ranges_meet(out, read[i]))
      return attn_fail(ATTN_EARG, "out must not share memory with %s", i == 0 ? "o" : i == 1 ? "l" : "lse");
  if (ranges_meet(lse, o) || ranges_meet(lse, l))
    return attn_fail(ATTN_EARG, "lse must not share memory with %s", ranges_meet(lse, o) ? "o" : "l");
  int64_t rows = attn_numel(lse), e = out->size[nd - 1], n = lse->size[nd - 2];
  if (rows == 0) return ATTN_OK;
  /* work items: blocks of ROWS rows of one [n] run, so that the division
   * chains of the leading dims' offsets are paid once per block */
  enum { ROWS = 64 };
  int64_t nblocks = (n + ROWS - 1) / ROWS, items = (rows / n) * nblocks;
  int64_t out_rs = out->stride[nd - 2], out_es = out->stride[nd - 1], o_rs = o->stride[nd - 2],
          o_es = o->stride[nd - 1], lse_rs = lse->stride[nd - 2], l_rs = l->stride[nd - 2];
  int nthreads = attn_threads_for(rows * (e + 1) >= 32768 ? items : 1); /* a team costs more than a small merge */
#pragma omp parallel for num_threads(nthreads) if (nthreads > 1) schedule(static)
  for (int64_t it = 0; it < items; it++) {
    int64_t g = it / nblocks, r0 = (it % nblocks) * ROWS, r1 = r0 + ROWS < n ? r0 + ROWS : n;
    float *lse_g = lse->data + lead_offset(lse, nd - 2, g);
    const float *l_g = l->data + lead_offset(l, nd - 2, g);
    float *out_g = out->data + lead_offset(out, nd - 2, g);
    const float *o_g = o->data + lead_offset(o, nd - 2, g);
    for (int64_t r = r0; r < r1; r++) {
      float *lr = lse_g + r * lse_rs;
      float la = *lr, lb = l_g[r * l_rs];
      float m = la > lb ? la : lb;
      if (m == -INFINITY) m = 0.0f; /* neither side saw a key: no -inf - -inf */
      float a = expf(la - m), b = expf(lb - m);
      float s = a + b;
      float inv = s == 0.0f ? 0.0f : 1.0f / s;
      float wa = a * inv, wb = b * inv;
      float *orow = out_g + r * out_rs;
      const float *prow = o_g + r * o_rs;
      if (out_es == 1 && o_es == 1) {
        /* out and o do not overlap (checked above) */
#pragma omp simd
        for (int64_t i = 0; i < e; i++) orow[i] = orow[i] * wa + prow[i] * wb;
      } else {
        for (int64_t i = 0; i < e; i++) orow[i * out_es] = orow[i * out_es] * wa + prow[i * o_es] * wb;
      }
      *lr = m + logf(s);
    }
  }
  return ATTN_OK;
}

attn_status attn_sdpa_resume(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, float scale,
                             int is_causal, attn_tensor *out, attn_tensor *lse) {
  attn_sdpa_opts opts = attn_sdpa_defaults();
  opts.scale = scale;
  opts.is_causal = is_causal;
  attn_sdpa_problem p;
  attn_status st = attn_sdpa_describe(q, k, v, &opts, &p);
  if (st != ATTN_OK) return st;
  char b1[200], b2[200];
  int nb = p.nbatch;
  int fits = out->ndim == nb + 2 && lse->ndim == nb + 1 && out->size[nb] == p.lq && out->size[nb + 1] == p.ev &&
             lse->size[nb] == p.lq;
  for (int d = 0; fits && d < nb; d++) fits = out->size[d] == p.batch[d] && lse->size[d] == p.batch[d];
  if (!fits)
    return attn_fail(ATTN_ESHAPE, "expected out [..., %lld, %lld] and lse [..., %lld] over the batch of q, k, v, "
                     "got out %s, lse %s", (long long)p.lq, (long long)p.ev, (long long)p.lq,
                     attn_shape_str(out, b1, sizeof b1), attn_shape_str(lse, b2, sizeof b2));
  if (p.ev > 1 && out->stride[nb + 1] != 1)
    return attn_fail(ATTN_EARG, "out's last dim must have stride 1, got %lld", (long long)out->stride[nb + 1]);
  if (attn_has_internal_overlap(out) || attn_has_internal_overlap(lse))
    return attn_fail(ATTN_EARG, "out and lse are written in place: they must not repeat an element (an expanded dim)");
  const attn_tensor *read[] = {q, k, v, lse};
  const char *names[] = {"q", "k", "v", "lse"};
  for (int i = 0; i < 4; i++)
    if (ranges_meet(out, read[i])) return attn_fail(ATTN_EARG, "out must not share memory with %s", names[i]);
  for (int i = 0; i < 3; i++)
    if (ranges_meet(lse, read[i])) return attn_fail(ATTN_EARG, "lse must not share memory with %s", names[i]);
  if (attn_sizes_product(nb, p.batch) == 0 || p.lq == 0) return ATTN_OK;
  return attn_flash_tiles_resume(&p, out, lse);
}
