/* Attention kernels of the core: scaled dot-product attention with the
 * scores materialised ("math" kernel), one (batch, head) slice at a time.
 *
 * Shapes (PyTorch names): q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev];
 * mask and bias broadcast to [..., Lq, Lk]; the leading dims "..." of q, k, v,
 * mask and bias broadcast together (PyTorch rules) into the batch shape B.
 * out [B..., Lq, Ev], weights [B..., Lq, Lk], both contiguous, caller-owned. */
#ifndef ATTN_ATTENTION_H
#define ATTN_ATTENTION_H

#include <stdint.h>

#include "tensor.h"

typedef struct attn_sdpa_opts {
  float scale;                /* q is multiplied by it (in float32) before q k^T, as torch 1.13 does */
  int is_causal;              /* query i sees keys 0..i (top-left aligned) */
  const attn_tensor *mask;    /* NULL, or [..., Lq, Lk] broadcastable; nonzero = hidden */
  const attn_tensor *bias;    /* NULL, or [..., Lq, Lk] broadcastable; added to the scaled scores */
  double dropout_p;           /* in [0, 1); 0 = no dropout */
  uint32_t dropout_draw;      /* the one 32-bit draw of this call when dropout_p > 0 */
} attn_sdpa_opts;

/* Default options: scale 1/sqrt(E) must still be set by the caller. */
/* q, k, v, mask and bias expanded to the common batch shape [B..., rows, cols]
 * (stride 0 on broadcast dims), with the sizes: what every kernel starts from. */
typedef struct attn_sdpa_problem {
  int nbatch;
  int64_t batch[ATTN_MAX_DIMS];
  int64_t lq, lk, e, ev;
  attn_tensor q, k, v, mask, bias;
  int has_mask, has_bias;
} attn_sdpa_problem;

/* Validate the call (shapes, dropout_p, out [B..., Lq, Ev] and weights
 * [B..., Lq, Lk] contiguous, BLAS int range) and fill p. */
attn_status attn_sdpa_prepare(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_sdpa_opts *opts, const attn_tensor *out, const attn_tensor *weights,
                              attn_sdpa_problem *p);

attn_sdpa_opts attn_sdpa_defaults(void);

/* Shape of out ([B..., Lq, Ev]) into (ndim, size); checks every operand's
 * shape (q, k, v at least 2 dims, E and Lk agree, mask/bias broadcast). */
attn_status attn_sdpa_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *mask, const attn_tensor *bias, int *ndim, int64_t *size);

/* out [B..., Lq, Ev] = softmax(mask(scale*q k^T + bias)) v, with dropout on the
 * weights after the softmax; weights (NULL or [B..., Lq, Lk]) gets the
 * weights after dropout. A query row whose keys are all hidden gives zeros.
 * Parallel over the flattened batch B; the bits do not depend on the thread
 * count. dropout_p > 0 needs the RNG module (ATTN_EARG without it). */
attn_status attn_sdpa_math(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights);

/* The math kernel's softmax of one score row s [lk] in place (max subtracted,
 * exp summed in double, one reciprocal), then dropout: factors of the
 * positions position .. position + lk - 1 of the call's mask (f [lk] is
 * scratch). A row with every key hidden (-inf) becomes zeros and the result
 * is 1 (its output row must then be zeros too, whatever v holds); else 0.
 * The fused module forward uses it too, so both give the same bits. */
int attn_softmax_dropout_row(float *s, int64_t lk, double dropout_p, uint32_t dropout_draw, int64_t position,
                             float *f);

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
