/* The attention core: what every scaled dot-product attention driver shares.
 *
 * The drivers (the "math" kernel in src/core/attention.c, the fused "flash" kernel
 * in src/core/flash.c, the tiny direct loops of the module forward in
 * src/core/modules.c) differ only in how they compute scores and products. What a
 * call means lives here, once:
 *  - operands: attn_sdpa_prepare / attn_sdpa_describe validate q, k, v, mask
 *    and bias and expand them to the common batch shape (the problem);
 *    attn_sdpa_slice_at addresses slice bi (the one place a GQA head map,
 *    query head h -> kv head h / g, would go);
 *  - scores: attn_sdpa_load_q scales q as torch 1.13 does (before q k^T),
 *    attn_sdpa_row_keys gives a query row its visible keys (causal: kend =
 *    i + 1), attn_sdpa_modify_tile applies bias, mask and the visible range
 *    to a score tile in any layout (strides): causal masking is written once;
 *  - the kernel choice: attn_sdpa_choose_kernel, for the functional API and
 *    the modules alike.
 * Shapes (PyTorch names): q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev];
 * mask and bias broadcast to [..., Lq, Lk]; the leading dims "..." of q, k,
 * v, mask and bias broadcast together into the batch shape B. */
#ifndef ATTN_SDPA_H
#define ATTN_SDPA_H

#include <math.h>
#include <stdint.h>

#include "rng.h"
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

/* One (batch, head) slice bi of the flattened batch: its operands' first
 * elements (mask and bias NULL when absent). Row and column strides are the
 * problem's (attn_sdpa_row_stride / attn_sdpa_col_stride). */
typedef struct attn_sdpa_slice {
  int64_t bi;
  const float *q, *k, *v, *mask, *bias;
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

/* The visible keys of query row i: all of them, or [0, i + 1) under causal
 * masking (top-left aligned), clipped to [0, Lk). */
static inline attn_key_range attn_sdpa_row_keys(const attn_sdpa_problem *p, int64_t i) {
  attn_key_range r = {0, p->lk};
  if (p->is_causal && i + 1 < r.end) r.end = i + 1;
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

/* The score tile of query rows [i0, i0 + ni) and keys [k0, k0 + nk) of slice
 * sl, score (i0 + r, k0 + c) at s[r * rs + c * cs] (row-major for the math
 * kernel, transposed for flash): adds the bias, and sets -inf where the mask
 * hides a key or the key is outside the row's visible range. */
static inline void attn_sdpa_modify_tile(const attn_sdpa_problem *p, const attn_sdpa_slice *sl, int64_t i0, int64_t ni,
                                         int64_t k0, int64_t nk, float *s, int64_t rs, int64_t cs) {
  int64_t sb0 = 0, sb1 = 0, sm0 = 0, sm1 = 0;
  if (sl->bias) sb0 = attn_sdpa_row_stride(p, &p->bias), sb1 = attn_sdpa_col_stride(p, &p->bias);
  if (sl->mask) sm0 = attn_sdpa_row_stride(p, &p->mask), sm1 = attn_sdpa_col_stride(p, &p->mask);
  for (int64_t r = 0; r < ni; r++) {
    int64_t i = i0 + r;
    float *si = s + r * rs;
    if (sl->bias) {
      const float *b = sl->bias + i * sb0 + k0 * sb1;
      for (int64_t c = 0; c < nk; c++) si[c * cs] = si[c * cs] + b[c * sb1];
    }
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
}

/* The log-sum-exp of a row from its max and its sum of exp(s - max). */
static inline float attn_sdpa_lse_of(float max, double sum) {
  return max == -INFINITY ? -INFINITY : (float)((double)max + log(sum));
}

typedef enum attn_sdpa_kernel { ATTN_SDPA_AUTO, ATTN_SDPA_MATH, ATTN_SDPA_FLASH } attn_sdpa_kernel;

/* NULL when kernel (MATH or FLASH) can serve a call that asks for the
 * weights (need_weights) or not; else why not, as a phrase ("kernel \"flash\"
 * cannot return the attention weights ..."). */
const char *attn_sdpa_kernel_refuses(attn_sdpa_kernel kernel, int need_weights);

/* The kernel that runs a call with nb (batch x heads) slices of Lq x Lk
 * scores and head sizes E and Ev: requested (MATH or FLASH) when it can
 * serve the call, else ATTN_SDPA_AUTO with *why (attn_sdpa_kernel_refuses).
 * AUTO takes the fused kernel where it is faster (the measured crossover)
 * and can serve the call, else the math kernel. */
attn_sdpa_kernel attn_sdpa_choose_kernel(attn_sdpa_kernel requested, int64_t nb, int64_t lq, int64_t lk, int64_t e,
                                         int64_t ev, int need_weights, const char **why);

/* Run kernel (MATH or FLASH; AUTO chooses as attn_sdpa_choose_kernel does)
 * on the call: attn_sdpa_math or attn_sdpa_flash. ATTN_EARG when the kernel
 * cannot serve it (flash with weights). */
attn_status attn_sdpa_run(attn_sdpa_kernel kernel, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                          const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights);

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
