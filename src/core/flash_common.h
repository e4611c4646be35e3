/* What the fused kernel's two drivers share, below both: the tile sizes,
 * the split-K chunk, the per-thread tile scratch and the test for a decoding
 * call. The tiled driver (src/core/flash.c) and the split-K decoding driver
 * (src/core/flash_decode.c) call this and the shared core
 * (src/core/sdpa_common.h), never each other; the dispatcher
 * (src/core/sdpa_dispatch.c) picks one. */
#ifndef ATTN_FLASH_COMMON_H
#define ATTN_FLASH_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Tile sizes: query rows per work item and keys per block. Constants, so the
 * order of every sum (and the bits of out) never depends on the thread count.
 * BK x BQ floats of scores (32 KiB) stay in a 48 KiB L1 through the softmax's
 * passes and the P V product (src/core/flash.c). */
#ifndef ATTN_FLASH_BQ
#define ATTN_FLASH_BQ 64
#endif
#ifndef ATTN_FLASH_BK
#define ATTN_FLASH_BK 128
#endif

/* Keys per split-K chunk: a constant, so the merge order (and the bits)
 * never depend on the thread count. */
#define ATTN_DECODE_CHUNK 1024

/* 1 when a call is a decoding one: the query rows that read one kv head
 * (rows = gqa_group * Lq) fit one query tile, and there is more than one
 * chunk of keys. */
int attn_flash_decode_fits(int64_t rows, int64_t lk);

/* The per-thread tile scratch of both drivers: offsets in floats from the
 * block's start, qt [E, BQ] at 0, then st [BK, BQ], ot [Ev, BQ], m, l, a
 * [BQ], f [BK]. */
typedef struct attn_flash_tile {
  size_t s, o, m, l, a, f;
} attn_flash_tile;

/* Lays that scratch out from *block (in floats, advanced past it); 0 when a
 * size overflows size_t. */
int attn_flash_tile_layout(attn_flash_tile *t, size_t *block, int64_t e, int64_t ev);

#endif
