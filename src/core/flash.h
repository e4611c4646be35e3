/* The fused ("flash") kernel's tiled driver: FlashAttention-2 style on the
 * CPU, with the scores never materialised beyond one tile. Its entry point
 * for callers, attn_sdpa_flash (src/core/sdpa_dispatch.h), validates the call
 * and sends decoding calls to src/core/flash_decode.h instead. */
#ifndef ATTN_FLASH_H
#define ATTN_FLASH_H

#include "flash_common.h"
#include "sdpa_common.h"
#include "tensor.h"

/* out [B..., Lq, Ev] (contiguous, checked by attn_sdpa_prepare) and p->lse
 * for a prepared problem with at least one slice and one query row:
 * softmax(mask(scale*q k^T + bias)) v tile by tile with an online softmax
 * (running max and sum per query row). Scratch memory is O(threads x tile),
 * never [Lq, Lk]. A query row whose keys are all hidden gives zeros; lse is
 * m + log l from the online softmax. Parallel over (batch, query block); the
 * bits of out are the same for any OMP_NUM_THREADS. */
attn_status attn_flash_tiles(const attn_sdpa_problem *p, attn_tensor *out);

/* attn_flash_tiles continuing from a partial result over other keys: out
 * [B..., Lq, Ev] (the problem's batch shape) holds it, normalised, and lse
 * [B..., Lq] its log-sum-exp (-inf, with zeros in out, for a row that saw no
 * key); both become the result over those keys and the problem's: the
 * log-sum-exp merge of lse_merge.h done by the online softmax itself. Any
 * strides but out's last, which must be 1; p->lse NULL. For ring attention
 * (attn_sdpa_resume, src/core/lse_merge.h). */
attn_status attn_flash_tiles_resume(const attn_sdpa_problem *p, attn_tensor *out, attn_tensor *lse);

#endif
