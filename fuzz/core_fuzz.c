/* libFuzzer harness for the C core (no Lua): the input bytes are decoded into
 * an operation, shapes, strides (contiguous, transposed, broadcast with stride
 * 0, padded), options and float data (NaN, inf, denormals, huge and ordinary
 * values), and the core's functions are called directly. Built and run by
 * `make fuzz-core` under ASan + UBSan: the core must answer every input with
 * a status, never with a crash, an out-of-bounds access or undefined
 * behaviour. Every tensor's storage is malloc'ed at exactly the extent its
 * view reaches, so a read one element past the view is an ASan report. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "sdpa_dispatch.h"
#include "npy.h"
#include "ops.h"
#include "rng.h"
#include "sdpa_backward.h"
#include "tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ------------------------------------------------------------ input bytes */

typedef struct reader {
  const uint8_t *p;
  size_t n;
  uint32_t fill; /* a deterministic stream once the input is used up */
} reader;

static uint8_t u8(reader *r) {
  if (r->n == 0) {
    r->fill = r->fill * 1103515245u + 12345u;
    return (uint8_t)(r->fill >> 16);
  }
  r->n--;
  return *r->p++;
}

static uint32_t u32(reader *r) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | u8(r);
  return v;
}

/* A float: mostly small values, often the special ones. */
static float fval(reader *r) {
  static const float special[] = {NAN, INFINITY, -INFINITY, 1e-45f, -1e-40f, 0.0f, -0.0f, 3.4028235e38f,
                                  -3.4028235e38f, 1e4f, -1e4f, -1e9f, 1e30f, 1.0f};
  uint8_t b = u8(r);
  if (b < 32) return special[b % (sizeof special / sizeof special[0])];
  if (b < 40) {
    uint32_t bits = u32(r);
    float f;
    memcpy(&f, &bits, 4);
    return f;
  }
  return ((float)b - 148.0f) / 16.0f;
}

/* A double option value (arange start/step, dropout p, rng bounds). */
static double dval(reader *r) {
  static const double special[] = {(double)NAN, (double)INFINITY, -(double)INFINITY, 1e300, -1e300, 1e-320, 0.0, 1.0, 0.5, 0.999999,
                                   -0.1, 3.5e38, -3.5e38, 1e20};
  uint8_t b = u8(r);
  if (b < 64) return special[b % (sizeof special / sizeof special[0])];
  return ((double)b - 160.0) / 8.0;
}

/* ------------------------------------------------------------ storage */

#define MAX_BUFFERS 64
typedef struct arena {
  void *ptr[MAX_BUFFERS];
  int n;
} arena;

static float *arena_floats(arena *a, int64_t n) {
  if (a->n == MAX_BUFFERS) abort(); /* a harness bug, not a finding */
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!p) abort();
  a->ptr[a->n++] = p;
  return p;
}

static void arena_free(arena *a) {
  for (int i = 0; i < a->n; i++) free(a->ptr[i]);
  a->n = 0;
}

/* Elements a view reaches: 1 + sum (size - 1) * stride, 0 when empty. */
static int64_t extent(const attn_tensor *t) {
  int64_t e = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->size[d] == 0) return 0;
    e += (t->size[d] - 1) * t->stride[d];
  }
  return e;
}

/* The harness keeps tensors small: the fuzzer's time goes to shapes, not to flops. */
#define MAX_EXTENT (1 << 16)

/* Strides for (ndim, size) in one of the layouts a Lua view can have. */
static void layout(reader *r, attn_tensor *t) {
  uint8_t mode = u8(r) % 6;
  attn_contiguous_strides(t->ndim, t->size, t->stride);
  if (mode == 1 && t->ndim >= 2) { /* transposed: dims stored in reverse order */
    int64_t s = 1;
    for (int d = 0; d < t->ndim; d++) {
      t->stride[d] = s;
      s *= t->size[d] > 0 ? t->size[d] : 1;
    }
  } else if (mode == 2) { /* broadcast: some dims of stride 0 (expanded) */
    uint8_t which = u8(r);
    for (int d = 0; d < t->ndim; d++)
      if (which >> d & 1) t->stride[d] = 0;
  } else if (mode == 3) { /* padded rows: a gap after every innermost run */
    int64_t pad = 1 + u8(r) % 3, s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      t->stride[d] = s;
      s = (s * (t->size[d] > 0 ? t->size[d] : 1)) + (d == t->ndim - 1 ? pad : 0);
    }
  } else if (mode == 4 && t->ndim >= 2) { /* the last two dims swapped (k:transpose(-2, -1)) */
    int64_t swapped[ATTN_MAX_DIMS], s;
    int a = t->ndim - 2, b = t->ndim - 1;
    memcpy(swapped, t->size, sizeof swapped);
    swapped[a] = t->size[b];
    swapped[b] = t->size[a];
    attn_contiguous_strides(t->ndim, swapped, t->stride);
    s = t->stride[a];
    t->stride[a] = t->stride[b];
    t->stride[b] = s;
  } else if (mode == 5) { /* a step along one dim (x[{{1, -1, 2}}]-like) */
    int d = t->ndim ? u8(r) % t->ndim : 0;
    if (t->ndim) t->stride[d] *= 2;
  }
}

/* A tensor of this shape with storage at exactly its extent, filled from the input. */
static int make_tensor(reader *r, arena *a, int ndim, const int64_t *size, attn_tensor *t) {
  memset(t, 0, sizeof *t);
  t->ndim = ndim;
  memcpy(t->size, size, (size_t)ndim * sizeof(int64_t));
  layout(r, t);
  int64_t n = extent(t);
  if (n > MAX_EXTENT) { /* too big for the harness: use the contiguous layout or give up */
    attn_contiguous_strides(ndim, size, t->stride);
    n = extent(t);
    if (n > MAX_EXTENT) return 0;
  }
  t->data = arena_floats(a, n);
  for (int64_t i = 0; i < n; i++) t->data[i] = fval(r);
  return 1;
}

/* A contiguous output of this shape (the core's outputs are caller-owned). */
static int make_out(arena *a, int ndim, const int64_t *size, attn_tensor *t) {
  int64_t n;
  if (attn_numel_checked(ndim, size, &n) != ATTN_OK || n > MAX_EXTENT) return 0;
  *t = attn_make(arena_floats(a, n), ndim, size);
  for (int64_t i = 0; i < n; i++) t->data[i] = NAN; /* never read before written */
  return 1;
}

static int small_size(reader *r) { return u8(r) % 6; }

static int random_shape(reader *r, int64_t *size) {
  int ndim = u8(r) % 5;
  for (int d = 0; d < ndim; d++) size[d] = small_size(r);
  return ndim;
}

/* A shape that broadcasts to (ndim, size) (usually): leading dims dropped, some set to 1, or one broken. */
static int broadcastable_shape(reader *r, int ndim, const int64_t *size, int64_t *out) {
  int drop = ndim ? u8(r) % (ndim + 1) : 0;
  uint8_t ones = u8(r), broken = u8(r);
  int n = ndim - drop;
  for (int d = 0; d < n; d++) {
    out[d] = size[drop + d];
    if (ones >> d & 1) out[d] = 1;
  }
  if (n > 0 && broken < 16) out[broken % n] = small_size(r) + 2;
  return n;
}

/* ------------------------------------------------------------ operations */

static void fuzz_binary(reader *r, arena *a) {
  int64_t so[ATTN_MAX_DIMS], sa[ATTN_MAX_DIMS], sb[ATTN_MAX_DIMS], bs[ATTN_MAX_DIMS];
  int no = random_shape(r, so);
  int na = broadcastable_shape(r, no, so, sa), nb = broadcastable_shape(r, no, so, sb), nbs;
  attn_tensor ta, tb, out;
  if (!make_tensor(r, a, na, sa, &ta) || !make_tensor(r, a, nb, sb, &tb)) return;
  attn_binop op = (attn_binop)(u8(r) % ATTN_BINOP_COUNT); /* every op of op_table.h */
  uint8_t how = u8(r) % 4;
  if (attn_broadcast_shape(na, sa, nb, sb, &nbs, bs) != ATTN_OK) {
    if (!make_out(a, no, so, &out)) return; /* the core must refuse the mismatch */
  } else if (how == 0 && nbs == na && memcmp(bs, sa, (size_t)na * sizeof(int64_t)) == 0) {
    out = ta; /* in place, out = a */
  } else if (how == 1 && na >= 2 && memcmp(bs, sa, (size_t)na * sizeof(int64_t)) == 0 && nbs == na) {
    out = ta; /* out is a with two dims swapped: an overlap the core must refuse or handle */
    out.stride[0] = ta.stride[1];
    out.stride[1] = ta.stride[0];
    if (out.size[0] != out.size[1]) return;
  } else if (!make_out(a, nbs, bs, &out)) {
    return;
  }
  attn_binary(op, &ta, &tb, &out);
}

static void fuzz_unary(reader *r, arena *a) {
  int64_t so[ATTN_MAX_DIMS], sa[ATTN_MAX_DIMS];
  int no = random_shape(r, so);
  int na = broadcastable_shape(r, no, so, sa);
  attn_tensor ta, out;
  if (!make_tensor(r, a, na, sa, &ta)) return;
  attn_unop op = (attn_unop)(u8(r) % ATTN_UNOP_COUNT);
  if (u8(r) % 4 == 0 && na == no && memcmp(so, sa, (size_t)na * sizeof(int64_t)) == 0) out = ta;
  else if (!make_tensor(r, a, no, so, &out)) return; /* a strided output */
  attn_unary(op, &ta, &out);
}

static void fuzz_fill(reader *r, arena *a) {
  int64_t so[ATTN_MAX_DIMS], sm[ATTN_MAX_DIMS];
  int no = random_shape(r, so);
  attn_tensor out, mask;
  if (!make_tensor(r, a, no, so, &out)) return;
  if (u8(r) & 1) {
    attn_fill(&out, fval(r));
    return;
  }
  int nm = broadcastable_shape(r, no, so, sm);
  if (!make_tensor(r, a, nm, sm, &mask)) return;
  attn_masked_fill(&out, &mask, fval(r));
}

static void fuzz_triangle(reader *r, arena *a) {
  int64_t so[ATTN_MAX_DIMS];
  int no = random_shape(r, so);
  attn_tensor ta, out;
  if (!make_tensor(r, a, no, so, &ta)) return;
  int64_t k = (int8_t)u8(r);
  if (u8(r) & 1) out = ta;
  else if (!make_tensor(r, a, no, so, &out)) return;
  attn_triangle(&ta, &out, k, u8(r) & 1);
}

static void fuzz_arange(reader *r, arena *a) {
  int64_t n = u8(r) % 40;
  attn_tensor out;
  if (!make_tensor(r, a, 1, &n, &out)) return;
  attn_arange(&out, dval(r), dval(r));
}

/* max and min (the reductions with an indices variant in op_table.h) also fill indices */
static int reduction_has_indices(attn_reduceop op) {
  for (int i = 0; i < attn_op_count; i++)
    if (attn_ops[i].kind == ATTN_KIND_REDUCE && attn_ops[i].op == (int)op) return attn_ops[i].index_name != NULL;
  return 0;
}

static void fuzz_reduce(reader *r, arena *a) {
  int64_t sa[ATTN_MAX_DIMS], so[ATTN_MAX_DIMS];
  int na = random_shape(r, sa);
  attn_tensor ta, out, idx;
  if (!make_tensor(r, a, na, sa, &ta)) return;
  attn_reduceop op = (attn_reduceop)(u8(r) % ATTN_REDUCEOP_COUNT);
  if (u8(r) % 3 == 0) {
    float v;
    int64_t at;
    attn_reduce_all(op, &ta, &v, &at);
    return;
  }
  int d = (int)(u8(r) % 7) - 1; /* -1 and past the end are refused */
  memcpy(so, sa, sizeof so);
  if (d >= 0 && d < na) so[d] = 1;
  if (u8(r) % 8 == 0 && na) so[0] += 1; /* a wrong output shape */
  if (!make_tensor(r, a, na, so, &out)) return;
  int with_idx = reduction_has_indices(op) && (u8(r) & 1);
  if (with_idx && !make_tensor(r, a, na, so, &idx)) return;
  attn_reduce_dim(op, &ta, d, &out, with_idx ? &idx : NULL);
}

static void fuzz_softmax(reader *r, arena *a) {
  int64_t sa[ATTN_MAX_DIMS];
  int na = random_shape(r, sa);
  if (u8(r) % 4 == 0 && na) sa[na - 1] = 60 + u8(r) % 200; /* long rows */
  attn_tensor ta, out;
  if (!make_tensor(r, a, na, sa, &ta)) return;
  int d = (int)(u8(r) % 6) - 1;
  uint8_t how = u8(r) % 3;
  if (how == 0) out = ta;
  else if (!make_tensor(r, a, na, sa, &out)) return;
  attn_softmax(&ta, d, &out, u8(r) & 1);
}

static void fuzz_cat(reader *r, arena *a) {
  int64_t so[ATTN_MAX_DIMS], sp[ATTN_MAX_DIMS];
  int no = random_shape(r, so);
  if (no == 0) return;
  int d = u8(r) % no, n = 1 + u8(r) % 3;
  attn_tensor parts[3], out;
  const attn_tensor *pp[3];
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    memcpy(sp, so, sizeof sp);
    sp[d] = small_size(r);
    if (u8(r) % 16 == 0) sp[(d + 1) % no] += 1; /* a part that does not fit */
    if (!make_tensor(r, a, no, sp, &parts[i])) return;
    pp[i] = &parts[i];
    total += sp[d];
  }
  so[d] = total + (u8(r) % 16 == 0);
  if (!make_tensor(r, a, no, so, &out)) return;
  attn_cat(pp, n, d, &out);
}

static void fuzz_matmul(reader *r, arena *a) {
  int64_t sa[ATTN_MAX_DIMS], sb[ATTN_MAX_DIMS], so[ATTN_MAX_DIMS];
  int na = 1 + u8(r) % 4, nb = 1 + u8(r) % 4, no;
  for (int d = 0; d < na; d++) sa[d] = small_size(r);
  for (int d = 0; d < nb; d++) sb[d] = small_size(r);
  if (u8(r) % 4) sb[nb >= 2 ? nb - 2 : 0] = sa[na - 1]; /* usually the inner sizes agree */
  if (u8(r) % 4 == 0) sa[na - 1] = sb[nb >= 2 ? nb - 2 : 0] = 40 + u8(r) % 60; /* a longer k */
  attn_tensor ta, tb, out;
  if (!make_tensor(r, a, na, sa, &ta) || !make_tensor(r, a, nb, sb, &tb)) return;
  if (attn_matmul_shape(&ta, &tb, &no, so) != ATTN_OK) {
    if (!make_out(a, 2, sa, &out)) return;
  } else if (!make_out(a, no, so, &out)) {
    return;
  }
  attn_matmul(&ta, &tb, &out);
}

/* A block mask for about (b, h, lq, lk) (sometimes other sizes): built-ins,
 * random bytes (as a Lua fn's) or a mix, any block size, one pattern or one
 * per (b, h). Left empty (nothing to free) when init refuses the sizes. */
static void make_block_mask(reader *r, int64_t b, int64_t h, int64_t lq, int64_t lk, attn_block_mask *m) {
  uint8_t how = u8(r);
  if (how % 8 == 0) b += 1 + u8(r) % 2;
  if (how % 8 == 1) lq += 1;
  if (how % 8 == 2) lk = u8(r) % 4;
  if (how & 8) b = 1;
  if (how & 16) h = 1;
  int64_t block = u8(r) % 4 ? 1 + u8(r) % 70 : (int64_t)u32(r) % 5000 - 10; /* sometimes out of range */
  int per_bh = (how & 32) != 0;
  if (attn_block_mask_init(m, b, h, lq, lk, block, per_bh ? b : 1, per_bh ? h : 1) != ATTN_OK) return;
  float ids[512];
  int64_t nid = lq > lk ? lq : lk;
  for (int64_t i = 0; i < nid && i < 512; i++) ids[i] = (float)(i / (1 + u8(r) % 9));
  if (nid > 512) return; /* the harness's lengths stay below */
  uint8_t *vis = malloc((size_t)(2 * m->prow * m->pcol)), *other = vis + m->prow * m->pcol;
  if (!vis) abort();
  int64_t w = 1 + u8(r) % 9;
  for (int64_t pat = 0; pat < m->sb * m->sh; pat++)
    for (int64_t qb = 0; qb < m->nqb; qb++)
      for (int64_t kb = 0; kb < m->nkb; kb++) {
        int64_t i0, ni, j0, nj;
        attn_block_mask_extent(m, qb, kb, &i0, &ni, &j0, &nj);
        uint8_t fn = u8(r) % 6;
        if (fn == 0) attn_mask_causal(i0, ni, j0, nj, vis, m->pcol);
        else if (fn == 1) attn_mask_sliding_window(w, i0, ni, j0, nj, vis, m->pcol);
        else if (fn == 2) attn_mask_document(ids, i0, ni, j0, nj, vis, m->pcol);
        else if (fn == 3) memset(vis, 0, (size_t)(m->prow * m->pcol));
        else { /* random bytes, as a Lua fn may return: mostly a pattern, sometimes every bit drawn */
          uint32_t bits = u32(r);
          for (int64_t x = 0; x < ni; x++)
            for (int64_t y = 0; y < nj; y++) vis[x * m->pcol + y] = (uint8_t)(bits >> ((x * 7 + y) % 32) & 1);
        }
        if (fn == 5) { /* and_/or_ with causal */
          attn_mask_causal(i0, ni, j0, nj, other, m->pcol);
          attn_mask_combine(u8(r) & 1, ni, nj, vis, other, m->pcol);
        }
        if (attn_block_mask_set(m, pat, qb, kb, vis, m->pcol) != ATTN_OK) break;
      }
  free(vis);
}

/* The backward of the call the forward just ran (saved: probs or lse), with
 * dout drawn from the input, gradients of the expanded shapes (sometimes
 * one of the wrong shape). */
static void fuzz_sdpa_backward(reader *r, arena *a, int flash, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_sdpa_opts *fwd, const attn_tensor *out,
                               const attn_tensor *saved) {
  attn_sdpa_problem p;
  attn_sdpa_opts o = *fwd;
  o.lse = NULL, o.probs = NULL;
  if (attn_sdpa_describe(q, k, v, &o, &p) != ATTN_OK) return;
  int nb = p.nbatch;
  int64_t sq[ATTN_MAX_DIMS], skv[ATTN_MAX_DIMS], sv[ATTN_MAX_DIMS], sbias[ATTN_MAX_DIMS];
  memcpy(sq, p.batch, sizeof sq);
  memcpy(skv, p.batch, sizeof skv);
  if (nb >= 1 && p.gqa_group > 1) skv[nb - 1] = p.batch[nb - 1] / p.gqa_group;
  memcpy(sv, skv, sizeof sv);
  memcpy(sbias, p.batch, sizeof sbias);
  sq[nb] = p.lq, sq[nb + 1] = p.e;
  skv[nb] = p.lk, skv[nb + 1] = p.e;
  sv[nb] = p.lk, sv[nb + 1] = p.ev;
  sbias[nb] = p.lq, sbias[nb + 1] = p.lk;
  uint8_t wrong = u8(r);
  if (wrong < 8) sq[wrong % (nb + 2)] += 1;
  else if (wrong < 16) skv[wrong % (nb + 2)] += 1;
  attn_tensor dout, dq, dk, dv, dbias;
  if (!make_tensor(r, a, out->ndim, out->size, &dout) || !make_out(a, nb + 2, sq, &dq) ||
      !make_out(a, nb + 2, skv, &dk) || !make_out(a, nb + 2, sv, &dv))
    return;
  attn_sdpa_grads g = {&dq, &dk, &dv, NULL};
  if (o.bias) {
    if (!make_out(a, nb + 2, sbias, &dbias)) return;
    g.dbias = &dbias;
  }
  attn_sdpa_backward(flash ? ATTN_SDPA_FLASH : ATTN_SDPA_MATH, q, k, v, &o, out, &dout, saved, NULL, &g);
}

/* q [B.., Lq, E], k [B'.., Lk, E], v [B''.., Lk, Ev], mask and bias broadcast
 * to the scores; the variants (enable_gqa, window, alibi_slopes, softcap, a
 * block mask, the lse) at random, then sometimes the backward. */
static void fuzz_sdpa_with(reader *r, arena *a, int flash, attn_block_mask *bm) {
  int64_t batch[2] = {small_size(r) % 3, small_size(r) % 4};
  int nbd = u8(r) % 3;
  int64_t lq = small_size(r), lk = small_size(r), e = small_size(r), ev = small_size(r);
  uint8_t longer = u8(r);
  if (longer % 8 == 0) lq = 60 + u8(r) % 10;       /* across a query block (BQ = 64) */
  if (longer % 16 == 1) lk = 250 + u8(r) % 10;     /* across a key block (BK = 256) */
  if (longer % 32 == 2) lk = 0;
  int64_t sq[ATTN_MAX_DIMS], sk[ATTN_MAX_DIMS], sv[ATTN_MAX_DIMS], ss[ATTN_MAX_DIMS];
  for (int d = 0; d < nbd; d++) sq[d] = sk[d] = sv[d] = ss[d] = batch[d];
  uint8_t variants = u8(r);
  if (variants & 1) { /* enable_gqa: g query heads per kv head (or none to share: refused) */
    if (nbd >= 1) sq[nbd - 1] = ss[nbd - 1] = batch[nbd - 1] * (1 + u8(r) % 3) + (u8(r) < 16);
  }
  sq[nbd] = lq, sq[nbd + 1] = e;
  sk[nbd] = lk, sk[nbd + 1] = e;
  sv[nbd] = lk, sv[nbd + 1] = ev;
  ss[nbd] = lq, ss[nbd + 1] = lk;
  int64_t tk[ATTN_MAX_DIMS], tv[ATTN_MAX_DIMS], tm[ATTN_MAX_DIMS], tb[ATTN_MAX_DIMS];
  int nk = broadcastable_shape(r, nbd + 2, sk, tk), nv = broadcastable_shape(r, nbd + 2, sv, tv);
  if (nk < 2 || u8(r) % 8) nk = nbd + 2, memcpy(tk, sk, sizeof tk); /* k and v usually whole */
  if (nv < 2 || u8(r) % 8) nv = nbd + 2, memcpy(tv, sv, sizeof tv);
  attn_tensor q, k, v, mask, bias, out, weights;
  if (!make_tensor(r, a, nbd + 2, sq, &q) || !make_tensor(r, a, nk, tk, &k) || !make_tensor(r, a, nv, tv, &v)) return;
  attn_sdpa_opts o = attn_sdpa_defaults();
  o.scale = u8(r) % 4 ? (e > 0 ? 1.0f / sqrtf((float)e) : 1.0f) : fval(r);
  uint8_t flags = u8(r);
  o.is_causal = flags & 1;
  if (flags & 2) {
    int nm = broadcastable_shape(r, nbd + 2, ss, tm);
    if (!make_tensor(r, a, nm, tm, &mask)) return;
    for (int64_t i = 0, n = extent(&mask); i < n; i++) /* mostly 0/1, like a bool mask */
      if (mask.data[i] == mask.data[i] && fabsf(mask.data[i]) < 1e3f) mask.data[i] = mask.data[i] > 0.5f ? 1.0f : 0.0f;
    o.mask = &mask;
  }
  if (flags & 4) {
    int nb = broadcastable_shape(r, nbd + 2, ss, tb);
    if (!make_tensor(r, a, nb, tb, &bias)) return;
    o.bias = &bias;
  }
  if (flags & 8) {
    o.dropout_p = flags & 16 ? dval(r) : (double)(u8(r) % 100) / 100.0;
    o.dropout_draw.mkl = u32(r); /* the MKL stream (keep NULL): one draw per call */
  }
  attn_tensor slopes, lse, probs;
  if (variants & 1) o.enable_gqa = 1;
  if (variants & 2) {
    static const int64_t sides[] = {-1, 0, 1, 2, 5, 70, -2, INT64_MAX, INT64_MIN, (int64_t)1 << 40, -1, 0};
    o.has_window = 1;
    o.window_left = sides[u8(r) % 12], o.window_right = sides[u8(r) % 12];
  }
  if (variants & 4) { /* [H] or [B, H] (q's dims -3, -4), or a broken shape */
    int64_t ssl[2] = {nbd >= 2 ? sq[0] : 1, nbd >= 1 ? sq[nbd - 1] : 1};
    int nsl = 1 + u8(r) % 2;
    if (nsl == 1) ssl[0] = ssl[1];
    if (u8(r) < 24) ssl[u8(r) % 2] += 1;
    if (!make_tensor(r, a, nsl, ssl, &slopes)) return;
    o.alibi_slopes = &slopes;
  }
  if (variants & 8) o.softcap = u8(r) % 2 ? (float)(1 + u8(r) % 50) : fval(r);
  if (variants & 16) {
    make_block_mask(r, nbd >= 2 ? sq[0] : 1, nbd >= 1 ? sq[nbd - 1] : 1, lq, lk, bm);
    if (bm->kind) o.block_mask = bm;
  }
  int ondim;
  int64_t osize[ATTN_MAX_DIMS];
  if (o.enable_gqa ? attn_sdpa_out_shape(&q, &k, &v, &o, &ondim, osize) != ATTN_OK
                   : attn_sdpa_shape(&q, &k, &v, o.mask, o.bias, &ondim, osize) != ATTN_OK) {
    ondim = nbd + 2;
    memcpy(osize, sq, sizeof osize);
    osize[nbd + 1] = ev;
  }
  if (flags & 32 && ondim) osize[0] += 1; /* a wrong output shape */
  if (!make_out(a, ondim, osize, &out)) return;
  int backward = (variants & 64) && !(flags & 32), saved_ok = 0;
  if ((variants & 32) || (backward && flash)) { /* lse [B..., Lq] (sometimes one too long) */
    int64_t sl[ATTN_MAX_DIMS];
    memcpy(sl, osize, sizeof sl);
    if (ondim && !backward && u8(r) < 32) sl[ondim - 1 - u8(r) % ondim] += 1;
    if (ondim && make_out(a, ondim - 1, sl, &lse)) o.lse = &lse;
  }
  if (flash) {
    saved_ok = attn_sdpa_flash(&q, &k, &v, &o, &out) == ATTN_OK;
    if (backward && saved_ok && o.lse) fuzz_sdpa_backward(r, a, 1, &q, &k, &v, &o, &out, &lse);
    return;
  }
  attn_tensor *w = NULL;
  if (ondim && (flags & 64 || backward)) {
    osize[ondim - 1] = lk;
    if (flags & 64) {
      if (!make_out(a, ondim, osize, &weights)) return;
      w = &weights;
    }
    if (backward && make_out(a, ondim, osize, &probs)) o.probs = &probs;
  }
  saved_ok = attn_sdpa_math(&q, &k, &v, &o, &out, w) == ATTN_OK;
  if (backward && saved_ok && o.probs) fuzz_sdpa_backward(r, a, 0, &q, &k, &v, &o, &out, &probs);
}

static void fuzz_sdpa(reader *r, arena *a, int flash) {
  attn_block_mask bm;
  memset(&bm, 0, sizeof bm);
  fuzz_sdpa_with(r, a, flash, &bm);
  attn_block_mask_free(&bm);
}

static void fuzz_npy(reader *r) {
  /* the rest of the input is the file */
  attn_npy_info info;
  int known_size = u8(r) & 1;
  const unsigned char *buf = r->p;
  size_t len = r->n;
  attn_npy_parse_header("fuzz.npy", buf, len, known_size ? (int64_t)len : -1, &info);
  char path[64];
  snprintf(path, sizeof path, "/tmp/attn_core_fuzz_%d.npy", (int)getpid());
  FILE *f = fopen(path, "wb");
  if (!f) return;
  size_t wrote = fwrite(buf, 1, len, f);
  fclose(f);
  int fd = -1;
  int64_t file_size;
  if (wrote == len && attn_npy_open(path, &fd, &file_size) == ATTN_OK &&
      attn_npy_read_header(path, fd, file_size, &info) == ATTN_OK && info.numel <= MAX_EXTENT) {
    float *out = malloc((size_t)(info.numel > 0 ? info.numel : 1) * sizeof(float));
    if (out) {
      attn_npy_read_data(path, fd, &info, out);
      attn_tensor t = attn_make(out, info.ndim, info.size);
      attn_npy_write(path, &t); /* and back */
      free(out);
    }
  }
  if (fd >= 0) close(fd);
  remove(path);
}

static void fuzz_rng(reader *r, arena *a) {
  attn_generator g;
  attn_rng_seed(&g, (uint64_t)u32(r) << 32 | u32(r));
  int64_t n = u8(r) % 40;
  float *out = arena_floats(a, n);
  switch (u8(r) % 5) {
    case 0: attn_rng_uniform_f32(&g, out, n, dval(r), dval(r)); break;
    case 1: attn_rng_normal_f32(&g, out, n, dval(r), dval(r)); break;
    case 2: attn_rng_normal_scalar_f32(&g, out, n, dval(r), dval(r)); break;
    case 3: attn_dropout_factors((attn_dropout_draw){u32(r), NULL}, (double)(1 + u8(r) % 98) / 100.0, (int64_t)u32(r), n, out); break;
    default: {
      unsigned char state[ATTN_RNG_STATE_BYTES];
      attn_rng_get_state(&g, state);
      size_t len = u8(r) % 2 ? sizeof state : u8(r);
      for (size_t i = 0; i < len && i < sizeof state; i++)
        if (u8(r) < 8) state[i] ^= u8(r);
      attn_rng_set_state(&g, state, (int64_t)len);
      attn_rng_u32(&g);
    }
  }
}

/* Shape arithmetic with arbitrary int64 sizes: overflow must be a status. */
static void fuzz_shapes(reader *r) {
  int64_t sa[ATTN_MAX_DIMS], sb[ATTN_MAX_DIMS], so[ATTN_MAX_DIMS];
  int na = u8(r) % (ATTN_MAX_DIMS + 1), nb = u8(r) % (ATTN_MAX_DIMS + 1), no, numel_ok;
  for (int d = 0; d < na; d++) sa[d] = (int64_t)((uint64_t)u32(r) << 32 | u32(r)) >> (u8(r) % 64);
  for (int d = 0; d < nb; d++) sb[d] = (int64_t)(u8(r) % 4);
  int64_t n;
  numel_ok = attn_numel_checked(na, sa, &n) == ATTN_OK;
  attn_broadcast_shape(na, sa, nb, sb, &no, so);
  char buf[64];
  attn_sizes_str(na, sa, buf, sizeof buf);
  if (numel_ok) { /* a valid (maybe huge) shape: views and expansion of a descriptor without data */
    attn_tensor t = attn_make(NULL, na, sa), e;
    attn_view_strides(&t, nb, sb, so);
    attn_expand(&t, nb, sb, &e);
    attn_is_contiguous(&t);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size, 1};
  arena a = {{0}, 0};
  switch (u8(&r) % 15) {
    case 0: fuzz_binary(&r, &a); break;
    case 1: fuzz_unary(&r, &a); break;
    case 2: fuzz_fill(&r, &a); break;
    case 3: fuzz_triangle(&r, &a); break;
    case 4: fuzz_arange(&r, &a); break;
    case 5: fuzz_reduce(&r, &a); break;
    case 6: fuzz_softmax(&r, &a); break;
    case 7: fuzz_cat(&r, &a); break;
    case 8: fuzz_matmul(&r, &a); break;
    case 9: fuzz_sdpa(&r, &a, 0); break;
    case 10: fuzz_sdpa(&r, &a, 1); break;
    case 11: fuzz_npy(&r); break;
    case 12: fuzz_rng(&r, &a); break;
    case 13: fuzz_shapes(&r); break;
    default: fuzz_sdpa(&r, &a, u8(&r) & 1); break;
  }
  arena_free(&a);
  return 0;
}
