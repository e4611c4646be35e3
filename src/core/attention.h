/* The "math" kernel of scaled dot-product attention: the scores
 * materialised, one (batch, head) slice at a time, over OpenBLAS. One of the
 * drivers of the shared attention core (src/core/sdpa_common.h: operands,
 * score modification, visible keys); the others are the fused kernel's tiles
 * and split-K decoding (src/core/flash.h, flash_decode.h) and the modules'
 * tiny direct loops (src/core/modules.c), which share this file's row
 * softmax to give its bits. The kernel choice is above, in
 * src/core/sdpa_dispatch.h.
 *
 * Shapes (PyTorch names): q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev];
 * mask and bias broadcast to [..., Lq, Lk]; the leading dims "..." of q, k, v,
 * mask and bias broadcast together (PyTorch rules) into the batch shape B.
 * out [B..., Lq, Ev], weights [B..., Lq, Lk], both contiguous, caller-owned;
 * opts->lse (NULL or [B..., Lq]) gets each row's log-sum-exp. */
#ifndef ATTN_ATTENTION_H
#define ATTN_ATTENTION_H

#include <stdint.h>

#include "sdpa_common.h"
#include "tensor.h"

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
 * lse: NULL, or where the row's log-sum-exp goes (-inf when all hidden).
 * The fused module forward uses it too, so both give the same bits. */
int attn_softmax_dropout_row(float *s, int64_t lk, double dropout_p, attn_dropout_draw dropout_draw, int64_t position,
                             float *f, float *lse);

#endif
