/* The fused kernel's decoding driver: a few query rows against many keys
 * (Lq = 1 against a KV cache), split across the keys (split-K) so that one
 * sequence uses every core, and with GQA one read of each K/V row for all the
 * query heads that share it. attn_sdpa_flash (src/core/sdpa_dispatch.h)
 * takes it where attn_flash_decode_fits (src/core/flash_common.h). */
#ifndef ATTN_FLASH_DECODE_H
#define ATTN_FLASH_DECODE_H

#include "flash_common.h"
#include "sdpa_common.h"

/* out [B..., Lq, Ev] (contiguous) and p->lse of a prepared decoding problem
 * (attn_flash_decode_fits), as the tiled driver computes them. */
attn_status attn_flash_decode(const attn_sdpa_problem *p, attn_tensor *out);

#endif
