/* The fused ("flash") kernel of scaled dot-product attention: FlashAttention-2
 * style on the CPU, with the scores never materialised beyond one tile.
 * Same shapes, options and meaning as attn_sdpa_math (src/core/attention.h). */
#ifndef ATTN_FLASH_H
#define ATTN_FLASH_H

#include <stdint.h>

#include "attention.h"
#include "tensor.h"

/* Tile sizes: query rows per work item and keys per block. Constants, so the
 * order of every sum (and the bits of out) never depends on the thread count. */
#ifndef ATTN_FLASH_BQ
#define ATTN_FLASH_BQ 64
#endif
#ifndef ATTN_FLASH_BK
#define ATTN_FLASH_BK 256
#endif

/* out [B..., Lq, Ev] (contiguous, caller-owned) = softmax(mask(scale*q k^T +
 * bias)) v, computed tile by tile with an online softmax: running max and sum
 * per query row, one division per output element at the end. Scratch memory
 * is O(threads x tile), never [Lq, Lk]. A query row whose keys are all hidden
 * gives zeros. The weights are never formed: a caller that needs them uses
 * attn_sdpa_math. opts->lse (NULL or [B..., Lq]) gets each row's
 * log-sum-exp, m + log l from the online softmax. Parallel over (batch,
 * query block); the bits of out are the same for any OMP_NUM_THREADS.
 * dropout_p > 0 needs the RNG module. */
attn_status attn_sdpa_flash(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_sdpa_opts *opts, attn_tensor *out);

/* The per-thread tile scratch of the flash forward, shared by its split-K
 * decoding path (flash_decode.c): offsets in floats from the block's start,
 * qt [E, BQ] at 0, then st [BK, BQ], ot [Ev, BQ], m, l, a [BQ], f [BK]. */
typedef struct attn_flash_tile {
  size_t s, o, m, l, a, f;
} attn_flash_tile;

/* Lays that scratch out from *block (in floats, advanced past it); 0 when a
 * size overflows size_t. */
int attn_flash_tile_layout(attn_flash_tile *t, size_t *block, int64_t e, int64_t ev);

/* The instruction set of the kernel in use: "scalar", "avx2" or "avx512" (src/core/cpu.h). */
const char *attn_flash_exp_impl(void);

#endif
