/* The fused kernel's decoding path: a few query rows against many keys
 * (Lq = 1 against a KV cache), split across the keys (split-K) so that one
 * sequence uses every core, and with GQA one read of each K/V row for all the
 * query heads that share it. attn_sdpa_flash takes it when it applies. */
#ifndef ATTN_FLASH_DECODE_H
#define ATTN_FLASH_DECODE_H

#include "sdpa.h"

/* Keys per split-K chunk: a constant, so the merge order (and the bits)
 * never depend on the thread count. */
#define ATTN_DECODE_CHUNK 1024

/* 1 when the problem is a decoding one: the query rows of the heads sharing
 * a kv head (g Lq) fit one query tile, and there is more than one chunk of keys. */
int attn_flash_decode_applies(const attn_sdpa_problem *p);

/* out [B..., Lq, Ev] (contiguous) and p->lse, as attn_sdpa_flash computes them. */
attn_status attn_flash_decode(const attn_sdpa_problem *p, attn_tensor *out);

#endif
