/* Block-sparse attention masks (see block_mask.h): storage, classification,
 * the built-in mask functions and the per-tile application the attention
 * core calls.
 *   build (once, by the binding, src/binding/lua_block_mask.c, before any
 *   kernel runs; fn is Lua or the built-ins here):
 *     for each stored pattern (sb x sh) and block (qb, kb) of [<= block, <= block]:
 *       vis = fn(block)            bytes, 1 = visible
 *       kind = empty | full | partial (vis kept, [prow, pcol] bytes)
 *   use (inside the kernels, read-only, any thread):
 *     attn_block_mask_keys: a tile's keys cut to the span of non-empty blocks
 *       (the drivers skip the rest: no product, no softmax there);
 *     attn_block_mask_apply: -inf over empty blocks and a partial block's
 *       hidden bytes, nothing over full ones.
 * Error: none of its own: it only chooses which scores are -inf (the
 * driver's sums then skip or add exact zeros). Threads: nothing here runs
 * threads or calls Lua, and the mask is immutable once built, so the bits
 * of a kernel's result depend on the thread count no more than without it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "block_mask.h"

int64_t attn_block_mask_default_block(int64_t lq, int64_t lk) {
  int64_t l = lq > lk ? lq : lk;
  if (l >= 1024) return 128;
  int64_t b = (l + 7) / 8;
  b = (b + 15) / 16 * 16;
  return b < 16 ? 16 : b;
}

attn_status attn_block_mask_init(attn_block_mask *m, int64_t b, int64_t h, int64_t lq, int64_t lk, int64_t block,
                                 int64_t sb, int64_t sh) {
  memset(m, 0, sizeof *m);
  if (b < 1 || h < 1 || lq < 0 || lk < 0)
    return attn_fail(ATTN_EARG, "sizes must be B >= 1, H >= 1, Lq >= 0, Lk >= 0, got B %lld, H %lld, Lq %lld, Lk %lld",
                     (long long)b, (long long)h, (long long)lq, (long long)lk);
  if (block < 1 || block > ATTN_BLOCK_MASK_MAX_BLOCK)
    return attn_fail(ATTN_EARG, "block must be an integer in [1, %d], got %lld", ATTN_BLOCK_MASK_MAX_BLOCK,
                     (long long)block);
  if ((sb != 1 && sb != b) || (sh != 1 && sh != h))
    return attn_fail(ATTN_EARG, "stored patterns %lld x %lld do not fit B %lld, H %lld", (long long)sb, (long long)sh,
                     (long long)b, (long long)h);
  int64_t nqb = (lq + block - 1) / block, nkb = (lk + block - 1) / block, n;
  size_t bytes;
  if (__builtin_mul_overflow(nqb, nkb, &n) || __builtin_mul_overflow(n, sb, &n) || __builtin_mul_overflow(n, sh, &n) ||
      __builtin_mul_overflow((size_t)n, sizeof(int64_t), &bytes))
    return attn_fail(ATTN_EOVERFLOW, "the block count overflows (B %lld, H %lld, Lq %lld, Lk %lld, block %lld)",
                     (long long)b, (long long)h, (long long)lq, (long long)lk, (long long)block);
  uint8_t *kind = calloc(n ? (size_t)n : 1, 1);
  int64_t *partial = malloc(bytes ? bytes : 1);
  if (!kind || !partial) {
    free(kind);
    free(partial);
    return attn_fail(ATTN_ENOMEM, "cannot allocate the %lld blocks of a block mask", (long long)n);
  }
  for (int64_t x = 0; x < n; x++) partial[x] = -1;
  m->b = b, m->h = h, m->lq = lq, m->lk = lk, m->block = block, m->sb = sb, m->sh = sh;
  m->nqb = nqb, m->nkb = nkb;
  m->prow = lq < block ? (lq > 0 ? lq : 1) : block;
  m->pcol = lk < block ? (lk > 0 ? lk : 1) : block;
  m->kind = kind;
  m->partial = partial;
  return ATTN_OK;
}

void attn_block_mask_free(attn_block_mask *m) {
  free(m->kind);
  free(m->partial);
  free(m->bytes);
  memset(m, 0, sizeof *m);
}

void attn_block_mask_extent(const attn_block_mask *m, int64_t qb, int64_t kb, int64_t *i0, int64_t *ni, int64_t *j0,
                            int64_t *nj) {
  *i0 = qb * m->block;
  *ni = m->lq - *i0 < m->block ? m->lq - *i0 : m->block;
  *j0 = kb * m->block;
  *nj = m->lk - *j0 < m->block ? m->lk - *j0 : m->block;
}

attn_status attn_block_mask_set(attn_block_mask *m, int64_t pattern, int64_t qb, int64_t kb, const uint8_t *vis,
                                int64_t ld) {
  int64_t i0, ni, j0, nj, seen = 0;
  attn_block_mask_extent(m, qb, kb, &i0, &ni, &j0, &nj);
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) seen += vis[r * ld + c] != 0;
  int64_t at = (pattern * m->nqb + qb) * m->nkb + kb;
  m->partial[at] = -1;
  if (seen == 0 || seen == ni * nj) {
    m->kind[at] = seen == 0 ? ATTN_BLOCK_EMPTY : ATTN_BLOCK_FULL;
    return ATTN_OK;
  }
  size_t bb = (size_t)(m->prow * m->pcol); /* <= 4096^2: no overflow */
  if (m->npartial == m->cap_partial) {
    int64_t cap = m->cap_partial ? 2 * m->cap_partial : 8;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)cap, bb, &bytes))
      return attn_fail(ATTN_ENOMEM, "the partial blocks of a block mask overflow (%lld blocks)", (long long)cap);
    uint8_t *grown = realloc(m->bytes, bytes);
    if (!grown)
      return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes for the partial blocks of a block mask", bytes);
    m->bytes = grown;
    m->cap_partial = cap;
  }
  uint8_t *dst = m->bytes + (size_t)m->npartial * bb;
  memset(dst, 0, bb);
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) dst[r * m->pcol + c] = vis[r * ld + c] != 0;
  m->kind[at] = ATTN_BLOCK_PARTIAL;
  m->partial[at] = m->npartial++;
  return ATTN_OK;
}

double attn_block_mask_sparsity(const attn_block_mask *m) {
  int64_t n = m->sb * m->sh * m->nqb * m->nkb, empty = 0;
  for (int64_t x = 0; x < n; x++) empty += m->kind[x] == ATTN_BLOCK_EMPTY;
  return n ? (double)empty / (double)n : 0.0;
}

void attn_block_mask_dense(const attn_block_mask *m, int64_t pattern, float *dst) {
  attn_block_pattern bp = attn_block_mask_pattern(m, pattern);
  for (int64_t qb = 0; qb < m->nqb; qb++)
    for (int64_t kb = 0; kb < m->nkb; kb++) {
      int64_t i0, ni, j0, nj, x = qb * m->nkb + kb;
      attn_block_mask_extent(m, qb, kb, &i0, &ni, &j0, &nj);
      const uint8_t *bytes = bp.kind[x] == ATTN_BLOCK_PARTIAL ? m->bytes + bp.partial[x] * m->prow * m->pcol : NULL;
      for (int64_t r = 0; r < ni; r++)
        for (int64_t c = 0; c < nj; c++)
          dst[(i0 + r) * m->lk + j0 + c] =
              bytes ? (float)bytes[r * m->pcol + c] : (bp.kind[x] == ATTN_BLOCK_FULL ? 1.0f : 0.0f);
    }
}

void attn_mask_causal(int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld) {
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) vis[r * ld + c] = j0 + c <= i0 + r;
}

void attn_mask_sliding_window(int64_t w, int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld) {
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) {
      int64_t i = i0 + r, j = j0 + c;
      vis[r * ld + c] = j <= i && i - j < w;
    }
}

void attn_mask_document(const float *ids, int64_t i0, int64_t ni, int64_t j0, int64_t nj, uint8_t *vis, int64_t ld) {
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) vis[r * ld + c] = ids[i0 + r] == ids[j0 + c];
}

void attn_mask_combine(int is_or, int64_t ni, int64_t nj, uint8_t *vis, const uint8_t *other, int64_t ld) {
  for (int64_t r = 0; r < ni; r++)
    for (int64_t c = 0; c < nj; c++) {
      uint8_t a = vis[r * ld + c] != 0, b = other[r * ld + c] != 0;
      vis[r * ld + c] = is_or ? (a | b) : (a & b);
    }
}

void attn_block_mask_apply(const attn_block_mask *m, attn_block_pattern bp, int64_t i0, int64_t ni, int64_t k0,
                           int64_t nk, float *s, int64_t rs, int64_t cs) {
  if (ni <= 0 || nk <= 0) return;
  int64_t bs = m->block;
  for (int64_t qb = i0 / bs; qb <= (i0 + ni - 1) / bs; qb++) {
    int64_t r0 = qb * bs > i0 ? qb * bs - i0 : 0, r1 = (qb + 1) * bs - i0 < ni ? (qb + 1) * bs - i0 : ni;
    for (int64_t kb = k0 / bs; kb <= (k0 + nk - 1) / bs; kb++) {
      int64_t x = qb * m->nkb + kb;
      uint8_t kind = bp.kind[x];
      if (kind == ATTN_BLOCK_FULL) continue; /* no mask work */
      int64_t c0 = kb * bs > k0 ? kb * bs - k0 : 0, c1 = (kb + 1) * bs - k0 < nk ? (kb + 1) * bs - k0 : nk;
      if (kind == ATTN_BLOCK_EMPTY) {
        for (int64_t r = r0; r < r1; r++)
          for (int64_t c = c0; c < c1; c++) s[r * rs + c * cs] = -INFINITY;
        continue;
      }
      const uint8_t *bytes = m->bytes + bp.partial[x] * m->prow * m->pcol;
      for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = bytes + (i0 + r - qb * bs) * m->pcol; /* the block's row of query i0 + r */
        for (int64_t c = c0; c < c1; c++)
          if (!row[k0 + c - kb * bs]) s[r * rs + c * cs] = -INFINITY;
      }
    }
  }
}

void attn_block_mask_keys(const attn_block_mask *m, attn_block_pattern bp, int64_t i0, int64_t ni, int64_t k0,
                          int64_t k1, int64_t *kb, int64_t *ke) {
  *kb = *ke = k0;
  if (ni <= 0 || k1 <= k0) return;
  int64_t bs = m->block, qb0 = i0 / bs, qb1 = (i0 + ni - 1) / bs;
  int64_t first = -1, last = -1;
  for (int64_t b = k0 / bs; b <= (k1 - 1) / bs; b++) {
    int any = 0;
    for (int64_t qb = qb0; qb <= qb1 && !any; qb++) any = bp.kind[qb * m->nkb + b] != ATTN_BLOCK_EMPTY;
    if (any) {
      if (first < 0) first = b;
      last = b;
    }
  }
  if (first < 0) return;
  *kb = first * bs > k0 ? first * bs : k0;
  *ke = (last + 1) * bs < k1 ? (last + 1) * bs : k1;
}
