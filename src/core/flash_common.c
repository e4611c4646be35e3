/* The fused kernel's shared pieces (src/core/flash_common.h): the decoding
 * test and the tile scratch layout, used by both of its drivers. */
#include "flash_common.h"
#include "sdpa_common.h"

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK

#if ATTN_DECODE_CHUNK % ATTN_FLASH_BK != 0
#error "ATTN_DECODE_CHUNK must be a multiple of ATTN_FLASH_BK"
#endif

/* rows <= BQ and Lk > one chunk -> 1 */
int attn_flash_decode_fits(int64_t rows, int64_t lk) { return rows <= BQ && lk > ATTN_DECODE_CHUNK; }

/* (e, ev) -> offsets of qt, st, ot, m, l, a, f */
int attn_flash_tile_layout(attn_flash_tile *t, size_t *block, int64_t e, int64_t ev) {
  int ok = attn_sdpa_add_floats(block, e, BQ); /* qt */
  t->s = *block;
  ok = ok && attn_sdpa_add_floats(block, BK, BQ);
  t->o = *block;
  ok = ok && attn_sdpa_add_floats(block, ev, BQ);
  t->m = *block;
  ok = ok && attn_sdpa_add_floats(block, BQ, 1);
  t->l = *block;
  ok = ok && attn_sdpa_add_floats(block, BQ, 1);
  t->a = *block;
  ok = ok && attn_sdpa_add_floats(block, BQ, 1);
  t->f = *block;
  return ok && attn_sdpa_add_floats(block, BK, 1);
}
