/* The shared attention core: what every scaled dot-product attention driver
 * shares, the bottom of the SDPA layers (it calls no kernel):
 *   sdpa_common <- flash_common <- kernels (attention.c: math, flash.c:
 *   tiles, flash_decode.c: split-K decoding, sdpa_backward.c) <- sdpa_dispatch
 *   (kernel choice) <- modules and the binding.
 *
 * The drivers (the "math" kernel in src/core/attention.c, the fused kernel's
 * tiles in src/core/flash.c and its decoding path in src/core/flash_decode.c,
 * the backward in src/core/sdpa_backward.c, the tiny direct loops of the
 * module forward in src/core/modules.c) differ only in how they compute
 * scores and products. What a call means lives here, once:
 *  - options: attn_sdpa_opts (a new option is a field here, its check in
 *    attn_sdpa_describe, its effect in attn_sdpa_row_keys and/or
 *    attn_sdpa_modify_tile);
 *  - operands: attn_sdpa_prepare / attn_sdpa_describe validate q, k, v, mask
 *    and bias and expand them to the common batch shape (the problem);
 *    attn_sdpa_slice_at addresses slice bi (the one place the GQA head map,
 *    query head h -> kv head h / g, lives);
 *  - scores: attn_sdpa_load_q scales q as torch 1.13 does (before q k^T),
 *    attn_sdpa_row_keys gives a query row its visible keys (causal: kend =
 *    i + 1), attn_sdpa_modify_tile applies bias, mask and the visible range
 *    to a score tile in any layout (strides): causal masking is written once;
 *  - work: attn_sdpa_plan_work (items, threads, per-thread scratch).
 * Shapes (PyTorch names): q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev];
 * mask and bias broadcast to [..., Lq, Lk]; the leading dims "..." of q, k,
 * v, mask and bias broadcast together into the batch shape B. */
#ifndef ATTN_SDPA_COMMON_H
#define ATTN_SDPA_COMMON_H

#include <math.h>
#include <stdint.h>

#include "block_mask.h"
#include "rng.h"
#include "score_mod.h"
#include "tensor.h"

typedef struct attn_sdpa_opts {
  float scale;                /* q is multiplied by it (in float32) before q k^T, as torch 1.13 does */
  int is_causal;              /* query i sees keys 0..i (top-left aligned) */
  const attn_tensor *mask;    /* NULL, or [..., Lq, Lk] broadcastable; nonzero = hidden */
  const attn_tensor *bias;    /* NULL, or [..., Lq, Lk] broadcastable; added to the scaled scores */
  double dropout_p;           /* in [0, 1); 0 = no dropout */
  attn_dropout_draw dropout_draw; /* this call's draw (rng.h, attn_dropout_draw_from over the weights
                                     [B..., Lq, Lk]) when dropout_p > 0 */
  attn_tensor *lse;           /* output: NULL, or contiguous [B..., Lq] that gets each row's log-sum-exp:
                                 max + log(sum exp(s - max)) of its scores after bias and masking (before
                                 dropout), natural log; -inf for a row with no visible key */
  /* the variants (enable_gqa, window, alibi_slopes, softcap); attn_sdpa_defaults leaves them all off */
  int enable_gqa;             /* k and v may have fewer heads (dim -3) than q: Hq = g Hkv, query head h
                                 (0-based) reads kv head h / g, in place */
  int has_window;             /* window_left/right below apply */
  int64_t window_left, window_right; /* bottom-right aligned (d = Lk - Lq): query i sees key j iff
                                 i + d - left <= j <= i + d + right; -1 = unbounded on that side */
  const attn_tensor *alibi_slopes; /* NULL, or [H] or [B, H] (H: q's dim -3, B: the dim before it): adds
                                 -slope |i + d - j| to the scaled score */
  float softcap;              /* 0 = none, else > 0: s = softcap tanh(s / softcap) on the scaled score,
                                 before bias, ALiBi and masking */
  attn_tensor *probs;         /* output, math kernel only: NULL, or contiguous [B..., Lq, Lk] that gets the
                                 softmax before dropout (the P the backward needs; src/core/sdpa_backward.h) */
  const attn_block_mask *block_mask; /* NULL, or built for the call's [..., B, H] (or 1s), Lq, Lk: hides what it
                                 hides (src/core/block_mask.h); empty blocks are skipped */
  const attn_score_mod *score_mod; /* NULL, or a score program (src/core/score_mod.h) replacing each score
                                 after softcap, before bias, ALiBi and masks; its b is the flattened index of
                                 q's dims before -3, h the index along dim -3 (1 without those dims) */
  const attn_score_mod *mask_mod;  /* NULL, or a mask program: where it is 0 the key is hidden */
} attn_sdpa_opts;

/* Default options: scale 1/sqrt(E) must still be set by the caller. */
attn_sdpa_opts attn_sdpa_defaults(void);

/* q, k, v, mask and bias expanded to the common batch shape [B..., rows, cols]
 * (stride 0 on broadcast dims), with the sizes and the options: what every
 * driver starts from. */
typedef struct attn_sdpa_problem {
  int nbatch;
  int64_t batch[ATTN_MAX_DIMS];
  int64_t lq, lk, e, ev;
  attn_tensor q, k, v, mask, bias;
  int has_mask, has_bias;
  float scale;
  int is_causal;
  double dropout_p;
  attn_dropout_draw dropout_draw;
  attn_tensor *lse;                /* NULL or [B..., Lq], contiguous */
  /* the variants (see attn_sdpa_opts); off: gqa_group 1, window -1 -1, no alibi, softcap 0 */
  int64_t gqa_group;               /* query heads per kv head; k and v are then expanded with a stride-0
                                      head dim, and k_head_stride / v_head_stride step their real heads */
  int64_t k_head_stride, v_head_stride;
  int64_t window_left, window_right; /* -1 = unbounded (also when no window was asked for) */
  attn_tensor alibi;               /* when has_alibi: the slopes expanded to [B...] */
  int has_alibi;
  float softcap;
  attn_tensor *probs;              /* NULL or [B..., Lq, Lk], contiguous (math kernel only) */
  const attn_block_mask *block_mask; /* NULL or checked against the batch's last two dims, Lq and Lk */
  const attn_score_mod *score_mod, *mask_mod; /* NULL, or checked in range over the call's positions */
} attn_sdpa_problem;

/* Validate the operands (shapes, mask of 0 and 1 only, dropout_p, scale,
 * lse [B..., Lq] contiguous when asked for, BLAS int range) and fill p. */
attn_status attn_sdpa_describe(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_sdpa_opts *opts, attn_sdpa_problem *p);

/* The problem of one batch item of a self-attention module's heads, already
 * validated by its caller (src/core/modules.c): q, k, v are [h, n, hd] strided
 * views of projections laid side by side in rows of ld floats (q at qkv, k
 * at qkv + d_out, v at qkv + 2 d_out, d_out = h hd), mask NULL (then causal
 * when is_causal) or [n, n] of 0 and 1. The same descriptor as
 * attn_sdpa_describe gives for those views, without its checks (the tiny
 * module path builds one per call, where the checks cost 10% of a call). */
void attn_sdpa_describe_heads(float *qkv, int64_t h, int64_t n, int64_t hd, int64_t ld, const attn_tensor *mask,
                              int is_causal, float scale, attn_sdpa_problem *p);

/* attn_sdpa_describe, and out [B..., Lq, Ev] and weights (NULL or
 * [B..., Lq, Lk]) contiguous: what the kernels' entry points check. */
attn_status attn_sdpa_prepare(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_sdpa_opts *opts, const attn_tensor *out, const attn_tensor *weights,
                              attn_sdpa_problem *p);

/* Shape of out ([B..., Lq, Ev]) into (ndim, size); checks every operand's
 * shape (q, k, v at least 2 dims, E and Lk agree, mask/bias broadcast). */
attn_status attn_sdpa_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *mask, const attn_tensor *bias, int *ndim, int64_t *size);

/* k (or v) of a GQA call seen with q's head count: a view whose dim -3 has
 * Hq entries of stride 0, and the group g = Hq / Hkv. ATTN_ESHAPE unless q,
 * k and v have a head dim (at least 3 dims), k and v the same head count,
 * and Hq a multiple of it. name: "k" or "v", for the message. */
attn_status attn_sdpa_gqa_view(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *kv,
                               attn_tensor *view, int64_t *group);

/* attn_sdpa_shape with the options that change shapes (enable_gqa). */
attn_status attn_sdpa_out_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                const attn_sdpa_opts *opts, int *ndim, int64_t *size);

/* One (batch, head) slice bi of the flattened batch: its operands' first
 * elements (mask and bias NULL when absent). Row and column strides are the
 * problem's (attn_sdpa_row_stride / attn_sdpa_col_stride). */
typedef struct attn_sdpa_slice {
  int64_t bi;
  const float *q, *k, *v, *mask, *bias;
  float alibi_slope;          /* the slice's ALiBi slope (0 without ALiBi) */
  attn_block_pattern blocks;  /* the slice's block-mask pattern (kind NULL without a block mask) */
  int64_t b, h;               /* the score programs' batch and head of the slice (0-based) */
} attn_sdpa_slice;

void attn_sdpa_slice_at(const attn_sdpa_problem *p, int64_t bi, attn_sdpa_slice *s);

static inline int64_t attn_sdpa_row_stride(const attn_sdpa_problem *p, const attn_tensor *t) {
  return t->stride[p->nbatch];
}
static inline int64_t attn_sdpa_col_stride(const attn_sdpa_problem *p, const attn_tensor *t) {
  return t->stride[p->nbatch + 1];
}

/* Keys [begin, end) that a query row may see before mask and bias. */
typedef struct attn_key_range {
  int64_t begin, end;
} attn_key_range;

/* The visible keys of query row i: all of them, cut to [0, i + 1) under
 * causal masking (top-left aligned) and to [i + d - left, i + d + right] by a
 * window (bottom-right aligned, d = Lk - Lq), clipped to [0, Lk). An empty
 * range has end = begin. Both ends never decrease with i (the union and
 * intersection helpers below rely on it). */
static inline attn_key_range attn_sdpa_row_keys(const attn_sdpa_problem *p, int64_t i) {
  attn_key_range r = {0, p->lk};
  if (p->is_causal && i + 1 < r.end) r.end = i + 1;
  int64_t diag = i + p->lk - p->lq; /* the key on query i's bottom-right diagonal */
  if (p->window_left >= 0 && diag - p->window_left > r.begin) r.begin = diag - p->window_left;
  if (p->window_right >= 0 && diag + p->window_right + 1 < r.end) r.end = diag + p->window_right + 1;
  if (r.end < r.begin) r.end = r.begin; /* begin < Lk always (diag < Lk); max of nondecreasing ends */
  return r;
}

/* Keys some row of [i0, i0 + n) sees (the union; n >= 1): a driver need not
 * compute scores outside it. The ranges move forward with i, so the union is
 * the first row's begin to the last row's end. */
static inline attn_key_range attn_sdpa_rows_keys(const attn_sdpa_problem *p, int64_t i0, int64_t n) {
  attn_key_range r = {attn_sdpa_row_keys(p, i0).begin, attn_sdpa_row_keys(p, i0 + n - 1).end};
  return r;
}

/* Keys every row of [i0, i0 + n) sees (the intersection, maybe empty): a
 * key block inside it needs no per-row cut. */
static inline attn_key_range attn_sdpa_common_keys(const attn_sdpa_problem *p, int64_t i0, int64_t n) {
  attn_key_range r = {attn_sdpa_row_keys(p, i0 + n - 1).begin, attn_sdpa_row_keys(p, i0).end};
  return r;
}

/* q of rows [i0, i0 + n) times the scale, in float32 (torch 1.13 scales q
 * before q k^T): row r, column d to dst[r * rs + d * cs]. */
static inline void attn_sdpa_load_q(const attn_sdpa_problem *p, const attn_sdpa_slice *sl, int64_t i0, int64_t n,
                                    float *dst, int64_t rs, int64_t cs) {
  int64_t sq0 = attn_sdpa_row_stride(p, &p->q), sq1 = attn_sdpa_col_stride(p, &p->q);
  float scale = p->scale;
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < p->e; d++) dst[r * rs + d * cs] = sl->q[(i0 + r) * sq0 + d * sq1] * scale;
}

/* tanh in float32 for the softcap (src/core/sdpa_common.c): a rational
 * approximation (Eigen's float tanh, odd degree 13 over even degree 6) on x
 * clamped to +-7.905 (where tanh is 1 - 3e-7), x itself below 4e-4. Max
 * error 4.1e-7, absolute and relative, against double tanh over every float
 * in [-12, 12] (worst near |x| = 5.8); NaN stays NaN. */
float attn_sdpa_tanh(float x);

/* y[j] = attn_sdpa_tanh(x[j]) for j < n, vectorised (the score programs' tanh). */
void attn_sdpa_tanh_vec(const float *x, float *y, int64_t n);

/* s = cap tanh(s / cap) over an [ni, nk] tile (strides rs, cs), along its
 * contiguous direction (rows for flash's transposed tiles, columns for the
 * math kernel's), vectorised: glibc's tanhf (1 ulp) made the flash kernel
 * 6.5x slower on case A's shapes. Only IEEE +, *, / and compares, so every
 * vector width gives the same bits. */
void attn_sdpa_softcap_tile(float cap, int64_t ni, int64_t nk, float *s, int64_t rs, int64_t cs);

/* s += -slope |dist + r - c| over an [ni, nk] tile (dist = i + d - j at its
 * first element), along its contiguous direction. The distance is an exact
 * float32 integer below 2^24 keys (beyond: rounded, as a float32 reference's). */
void attn_sdpa_alibi_tile(float slope, int64_t dist, int64_t ni, int64_t nk, float *s, int64_t rs, int64_t cs);

/* The score tile of query rows [i0, i0 + ni) and keys [k0, k0 + nk) of slice
 * sl, score (i0 + r, k0 + c) at s[r * rs + c * cs] (row-major for the math
 * kernel, transposed for flash), in this order: softcap (s = c tanh(s / c)),
 * the score_mod program (s = its value), adds the bias, adds the ALiBi term -slope |i + d - j| (d = Lk - Lq), and
 * sets -inf where the mask hides a key or the key is outside the row's
 * visible range (causal, window: attn_sdpa_row_keys) or the block mask
 * hides it (empty blocks whole, partial ones by their bytes, full ones not
 * touched) or the mask_mod program gives 0.
 *
 * What a backward must do for each modification, from dS' (the gradient of
 * the modified score, P * (dP - D) as without variants), row by row:
 *  - hidden (mask, causal, window, block mask) entries: P = 0 there, so dS' = 0: nothing;
 *  - bias: dbias += dS' (summed over broadcast dims);
 *  - ALiBi: a constant of the scores: nothing (slopes are not differentiated);
 *  - score_mod: dS = dS' d(program)/ds at the score it was given (after the
 *    cap), and the gathers' gradients into the tables (src/core/score_mod.h);
 *  - softcap: s' = c tanh(s / c) has ds'/ds = 1 - tanh^2(s / c) = 1 - (s' / c)^2,
 *    so dS = dS' (1 - (s'/c)^2), with s' the capped score before bias and
 *    ALiBi (recompute it from q k^T scale; the bias must not enter the
 *    derivative); dq, dk then come from dS as without softcap;
 *  - GQA: dk and dv of kv head h / g are the sums over the g query heads
 *    that read it (the problem's k/v have a stride-0 head dim of Hq, their
 *    real head strides are k_head_stride / v_head_stride). */
static inline void attn_sdpa_modify_tile(const attn_sdpa_problem *p, const attn_sdpa_slice *sl, int64_t i0, int64_t ni,
                                         int64_t k0, int64_t nk, float *s, int64_t rs, int64_t cs) {
  int64_t sb0 = 0, sb1 = 0, sm0 = 0, sm1 = 0;
  if (sl->bias) sb0 = attn_sdpa_row_stride(p, &p->bias), sb1 = attn_sdpa_col_stride(p, &p->bias);
  if (sl->mask) sm0 = attn_sdpa_row_stride(p, &p->mask), sm1 = attn_sdpa_col_stride(p, &p->mask);
  if (p->softcap > 0.0f) attn_sdpa_softcap_tile(p->softcap, ni, nk, s, rs, cs);
  if (p->score_mod) attn_score_mod_tile(p->score_mod, sl->b, sl->h, i0, ni, k0, nk, s, rs, cs);
  for (int64_t r = 0; r < ni; r++) {
    int64_t i = i0 + r;
    float *si = s + r * rs;
    if (sl->bias) {
      const float *b = sl->bias + i * sb0 + k0 * sb1;
      for (int64_t c = 0; c < nk; c++) si[c * cs] = si[c * cs] + b[c * sb1];
    }
  }
  if (p->has_alibi) attn_sdpa_alibi_tile(sl->alibi_slope, i0 + p->lk - p->lq - k0, ni, nk, s, rs, cs);
  /* without a mask, a tile every row sees whole needs no pass (the visible
   * ranges move forward with i: the last row's begin and the first row's end
   * bound them all) */
  int whole = ni > 0 && attn_sdpa_row_keys(p, i0 + ni - 1).begin <= k0 && attn_sdpa_row_keys(p, i0).end >= k0 + nk;
  for (int64_t r = 0; r < ni && (sl->mask || !whole); r++) {
    int64_t i = i0 + r;
    float *si = s + r * rs;
    if (sl->mask) {
      const float *m = sl->mask + i * sm0 + k0 * sm1;
      for (int64_t c = 0; c < nk; c++)
        if (m[c * sm1] != 0.0f) si[c * cs] = -INFINITY;
    }
    attn_key_range vis = attn_sdpa_row_keys(p, i);
    int64_t vb = vis.begin - k0, ve = vis.end - k0; /* in tile columns */
    for (int64_t c = 0; c < nk && c < vb; c++) si[c * cs] = -INFINITY;
    for (int64_t c = ve < 0 ? 0 : ve; c < nk; c++) si[c * cs] = -INFINITY;
  }
  if (sl->blocks.kind) attn_block_mask_apply(p->block_mask, sl->blocks, i0, ni, k0, nk, s, rs, cs);
  if (p->mask_mod) attn_score_mod_tile(p->mask_mod, sl->b, sl->h, i0, ni, k0, nk, s, rs, cs);
}

/* The keys of [k0, k1) that rows [i0, i0 + ni) of slice sl may see through
 * its block mask (all of [k0, k1) without one), cut to whole blocks: a
 * driver skips the rest (the blocks the mask leaves empty). */
static inline attn_key_range attn_sdpa_block_keys(const attn_sdpa_problem *p, const attn_sdpa_slice *sl, int64_t i0,
                                                  int64_t ni, int64_t k0, int64_t k1) {
  attn_key_range r = {k0, k1};
  if (sl->blocks.kind) attn_block_mask_keys(p->block_mask, sl->blocks, i0, ni, k0, k1, &r.begin, &r.end);
  return r;
}

/* The ALiBi paper's slopes of h heads into out [h], as its reference
 * get_slopes (in double, then rounded): for h a power of 2, 2^(-8/h) to the
 * powers 1..h; else those of the largest power of 2 below h, followed by the
 * odd-numbered ones (1st, 3rd, ...) of twice that power. */
void attn_alibi_slopes(int64_t h, float *out);

/* The log-sum-exp of a row from its max and its sum of exp(s - max). */
static inline float attn_sdpa_lse_of(float max, double sum) {
  return max == -INFINITY ? -INFINITY : (float)((double)max + log(sum));
}

/* Which kernel runs a call (src/core/sdpa_dispatch.h chooses; the backward
 * is told which one the forward ran). */
typedef enum attn_sdpa_kernel { ATTN_SDPA_AUTO, ATTN_SDPA_MATH, ATTN_SDPA_FLASH } attn_sdpa_kernel;

/* acc += a * b floats, a scratch size being summed; 0 on overflow. */
static inline int attn_sdpa_add_floats(size_t *acc, int64_t a, int64_t b) {
  size_t n;
  if (__builtin_mul_overflow((size_t)a, (size_t)b, &n) || __builtin_add_overflow(*acc, n, acc)) return 0;
  return 1;
}

/* A driver's work: the problem's slices times nblk blocks each = items, run
 * by nthreads threads (attn_threads_for), each with its own block of
 * `block` floats (rounded up to 16: every block is 64-byte aligned) in
 * scratch, which the driver free()s. */
typedef struct attn_sdpa_work {
  int64_t items;
  int nthreads;
  size_t block;
  float *scratch;
} attn_sdpa_work;

/* Plan w for per-thread blocks of `block` floats (block_ok = 0 when summing
 * it overflowed). Errors: ATTN_EOVERFLOW, ATTN_ENOMEM (nothing allocated). */
attn_status attn_sdpa_plan_work(const attn_sdpa_problem *p, int64_t nblk, size_t block, int block_ok,
                                attn_sdpa_work *w);

/* 1 when mask holds a value other than 0 and 1 (NaN and +-inf included): its
 * 1-based index goes to at [mask->ndim] and the value to *value (the first
 * in row-major order); else 0. Every kernel refuses such a mask: a float
 * table there was almost surely meant as a bias. O(elements stored): a
 * broadcast (stride 0) dim is read once. */
int attn_mask_find_non_binary(const attn_tensor *mask, int64_t *at, float *value);

/* 1 when the top-left [n, n] corner of the 2-D mask is the causal triangle
 * (1 above the diagonal, 0 on and below it), as the modules' `mask` buffer
 * triu(ones, 1) is: then is_causal does its work. */
int attn_mask_is_causal(const attn_tensor *mask, int64_t n);

#endif
