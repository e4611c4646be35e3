/* Cache-line prefetches of runs of rows, a few lines at a time, for the
 * flash forward's items (src/core/flash.c): an item's transposed load of q
 * and store of out are bursts of misses that the hardware prefetcher, which
 * follows in-order streams once they start, does not cover. A prefetch
 * waits for a free line-fill buffer like a load, so all of an item's lines
 * at once would stall as the misses did: spread over the item before, they
 * arrive while its products run. Not a public header. */
#ifndef ATTN_PREFETCH_H
#define ATTN_PREFETCH_H

#include <stdint.h>

/* rows of row_bytes bytes, stride bytes apart from base; the cursor (row, at) */
typedef struct attn_prefetch_rows {
  const char *base;
  int64_t stride, rows, row_bytes;
  int64_t row, at;
} attn_prefetch_rows;

/* rows [0, rows) of a float matrix at base with row stride `stride` floats,
 * cols floats each (unit stride) */
static inline attn_prefetch_rows attn_prefetch_matrix(const float *base, int64_t stride, int64_t rows, int64_t cols) {
  attn_prefetch_rows r = {(const char *)base, stride * (int64_t)sizeof(float), rows, cols * (int64_t)sizeof(float),
                          0, 0};
  return r;
}

/* its 64-byte lines */
static inline int64_t attn_prefetch_lines(const attn_prefetch_rows *r) { return r->rows * ((r->row_bytes + 63) / 64); }

/* up to `lines` more of r's lines toward L2 (a hint: never faults); the
 * lines left over */
static inline int64_t attn_prefetch_some(attn_prefetch_rows *r, int64_t lines) {
  for (; lines > 0 && r->row < r->rows; lines--) {
    __builtin_prefetch(r->base + r->row * r->stride + r->at, 0, 2);
    r->at += 64;
    if (r->at >= r->row_bytes) {
      r->at = 0;
      r->row++;
    }
  }
  return lines;
}

/* A list of runs prefetched in order, `quota` lines per step: planned to
 * spread its lines over a number of steps. */
enum { ATTN_PREFETCH_RUNS = 4 };
typedef struct attn_prefetch_list {
  attn_prefetch_rows run[ATTN_PREFETCH_RUNS];
  int n, at;
  int64_t quota;
} attn_prefetch_list;

/* a run more (ignored past ATTN_PREFETCH_RUNS, or when empty) */
static inline void attn_prefetch_add(attn_prefetch_list *l, attn_prefetch_rows r) {
  if (l->n < ATTN_PREFETCH_RUNS && r.rows > 0 && r.row_bytes > 0) l->run[l->n++] = r;
}

/* the quota that spreads every line of l over `steps` steps */
static inline void attn_prefetch_plan(attn_prefetch_list *l, int64_t steps) {
  int64_t lines = 0;
  for (int i = 0; i < l->n; i++) lines += attn_prefetch_lines(&l->run[i]);
  l->quota = steps > 1 ? (lines + steps - 1) / steps : lines;
}

/* one step: the next quota lines */
static inline void attn_prefetch_step(attn_prefetch_list *l) {
  int64_t left = l->quota;
  while (left > 0 && l->at < l->n) {
    left = attn_prefetch_some(&l->run[l->at], left);
    if (left > 0) l->at++;
  }
}

#endif
