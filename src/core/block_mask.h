/* Block-sparse attention masks (FlexAttention's BlockMask), the storage the
 * attention core reads (src/core/sdpa_common.h: attn_sdpa_modify_tile hides what a
 * block mask hides; both kernels and the backward skip its empty blocks).
 *
 * The [Lq, Lk] score matrix of each (b, h) is cut into blocks of `block`
 * query rows by `block` keys (the last row and column of blocks may be
 * smaller). Every block is empty (no key visible: skipped), full (every key
 * visible: no mask work) or partial (its [block, block] bytes are kept, 1 =
 * visible, row-major; only partial blocks store elements, at most Lq x Lk
 * bytes each however large the block). Patterns are
 * stored per (b, h) only where they may differ: a mask made of built-in
 * functions (causal, sliding window, document: the same for every b and h)
 * stores one pattern, a Lua function B x H of them (sb, sh; a B or H of 1
 * broadcasts over the call's batch or heads).
 *
 * The built-in mask functions are evaluated here, element by element over a
 * block (nonzero = visible, FlexAttention's mask_mod convention), with
 * 0-based indices i (query) and j (key):
 *   causal: j <= i;  sliding window w: j <= i and i - j < w;
 *   document ids: ids[i] == ids[j]. */
#ifndef ATTN_BLOCK_MASK_H
#define ATTN_BLOCK_MASK_H

#include <stdint.h>

#include "tensor.h"

enum { ATTN_BLOCK_EMPTY = 0, ATTN_BLOCK_PARTIAL = 1, ATTN_BLOCK_FULL = 2 };

/* Blocks wider than this are refused (a partial block keeps block^2 bytes). */
#define ATTN_BLOCK_MASK_MAX_BLOCK 4096

typedef struct attn_block_mask {
  int64_t b, h, lq, lk, block; /* the sizes it was built for; block: rows and keys per block */
  int64_t sb, sh;              /* stored patterns: sb x sh (1 x 1 when the same for every b and h) */
  int64_t nqb, nkb;            /* query and key blocks per pattern */
  uint8_t *kind;               /* [sb, sh, nqb, nkb]: ATTN_BLOCK_EMPTY / PARTIAL / FULL */
  int64_t *partial;            /* [sb, sh, nqb, nkb]: the partial block's index in bytes, else -1 */
  int64_t prow, pcol;          /* a partial block's stored rows and columns: block, or Lq / Lk when smaller */
  uint8_t *bytes;              /* npartial x [prow, pcol], 1 = visible */
  int64_t npartial, cap_partial;
} attn_block_mask;

/* The default block size: 128, or for max(Lq, Lk) under 1024 the multiple of
 * 16 at or above max(Lq, Lk) / 8 (at least 16), so a short mask still has
 * about 8 blocks a side to skip and to draw. */
int64_t attn_block_mask_default_block(int64_t lq, int64_t lk);

/* Sizes and storage of an empty mask (every block empty until set): b, h >=
 * 1, lq, lk >= 0, 1 <= block <= ATTN_BLOCK_MASK_MAX_BLOCK, sb in {1, b}, sh
 * in {1, h}. ATTN_EARG / ATTN_EOVERFLOW / ATTN_ENOMEM (then m holds nothing
 * to free). */
attn_status attn_block_mask_init(attn_block_mask *m, int64_t b, int64_t h, int64_t lq, int64_t lk, int64_t block,
                                 int64_t sb, int64_t sh);
void attn_block_mask_free(attn_block_mask *m);

/* The first query row and key of block (qb, kb), and its rows and keys. */
void attn_block_mask_extent(const attn_block_mask *m, int64_t qb, int64_t kb, int64_t *i0, int64_t *ni, int64_t *j0,
                            int64_t *nj);

/* Classify block (qb, kb) of pattern `pattern` (= sb index * sh + sh index)
 * from its visibility bytes vis [ni, nj] (row stride ld; nonzero = visible),
 * keeping the bytes when it is partial. ATTN_ENOMEM when they cannot be kept. */
attn_status attn_block_mask_set(attn_block_mask *m, int64_t pattern, int64_t qb, int64_t kb, const uint8_t *vis,
                                int64_t ld);

/* Fraction of the stored blocks that are empty (skipped); 0 without blocks. */
double attn_block_mask_sparsity(const attn_block_mask *m);

/* The visibility [lq, lk] of pattern `pattern` as floats 1 (visible) / 0
 * into dst (row-major). */
void attn_block_mask_dense(const attn_block_mask *m, int64_t pattern, float *dst);

/* The built-in mask functions over block rows [i0, i0 + ni), keys [j0, j0 +
 * nj): vis[r * ld + c] = 1 where visible, else 0. ids: nids floats (the
 * caller checks nids >= max(Lq, Lk)). */
void attn_mask_causal(int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld);
void attn_mask_sliding_window(int64_t w, int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld);
void attn_mask_document(const float *ids, int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld);
/* vis &= other (and) or vis |= other (or), over [ni, nj] of the same ld. */
void attn_mask_combine(int is_or, int64_t ni, int64_t nj, uint8_t *vis, const uint8_t *other, int64_t ld);

/* Where a slice's pattern lives: its kind and partial-index rows. */
typedef struct attn_block_pattern {
  const uint8_t *kind;
  const int64_t *partial;
} attn_block_pattern;

static inline attn_block_pattern attn_block_mask_pattern(const attn_block_mask *m, int64_t pattern) {
  attn_block_pattern bp = {m->kind + pattern * m->nqb * m->nkb, m->partial + pattern * m->nqb * m->nkb};
  return bp;
}

/* Scores hidden by the mask -> -inf over the tile of rows [i0, i0 + ni) and
 * keys [k0, k0 + nk) (score (i0 + r, k0 + c) at s[r * rs + c * cs]), block by
 * block: empty blocks filled with -inf, full ones untouched, partial ones
 * element by element. Tiles need not align with the blocks. */
void attn_block_mask_apply(const attn_block_mask *m, attn_block_pattern bp, int64_t i0, int64_t ni, int64_t k0,
                           int64_t nk, float *s, int64_t rs, int64_t cs);

/* The keys of [k0, k1) that rows [i0, i0 + ni) may see through the mask, as
 * a span of whole blocks cut to [k0, k1): from the first key block that is
 * not empty for some of those rows' query blocks to the last. *kb = *ke when
 * every block there is empty. */
void attn_block_mask_keys(const attn_block_mask *m, attn_block_pattern bp, int64_t i0, int64_t ni, int64_t k0,
                          int64_t k1, int64_t *kb, int64_t *ke);

#endif
