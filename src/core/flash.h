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

/* The instruction set of the kernel in use: "scalar", "avx2" or "avx512" (src/core/cpu.h). */
const char *attn_flash_exp_impl(void);

#endif
