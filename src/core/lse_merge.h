/* The merge of two partial attention results over disjoint sets of keys by
 * their log-sum-exp: ring attention's step (lua/attn/dist/ring.lua), which
 * attends the same queries to one chunk of keys at a time. */
#ifndef ATTN_LSE_MERGE_H
#define ATTN_LSE_MERGE_H

#include "tensor.h"

/* out, o [..., n, E]; lse, l [..., n] (the same leading sizes), any strides.
 * In place, every row independently (m, a, b, s in float32):
 *   m = max(lse, l) (l when either is NaN), 0 where that is -inf;
 *   a = e^(lse - m), b = e^(l - m), s = a + b, inv = 1 / s (0 where s = 0);
 *   out = out * (a inv) + o * (b inv), lse = m + log s.
 * A row where neither side saw a key (both lse -inf) keeps out * 0 with lse
 * -inf, never NaN. out and lse are written, so neither may share memory with
 * any of the four (checked by address range; ATTN_EARG) nor repeat an element
 * (an expanded dim). ATTN_ESHAPE when the shapes do not fit. */
attn_status attn_lse_merge(attn_tensor *out, attn_tensor *lse, const attn_tensor *o, const attn_tensor *l);

/* The attention of q to k, v (scale, is_causal: as
 * attn_sdpa_defaults with those two set) merged into a running result over
 * other keys, in place, by the fused kernel's online softmax starting from
 * it (src/core/flash.h, attn_flash_tiles_resume): the same result as
 * attn_lse_merge of the call's out and lse, without them. out [B..., Lq, Ev]
 * and lse [B..., Lq] over the batch shape of q, k, v, any strides but out's
 * last (1); neither may share memory with q, k, v or the other, nor repeat
 * an element. A row that saw no key before has lse -inf and zeros in out. */
attn_status attn_sdpa_resume(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, float scale,
                             int is_causal, attn_tensor *out, attn_tensor *lse);

#endif
