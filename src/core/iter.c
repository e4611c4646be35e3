/* The N-d walk of iter.h. */
#include "iter.h"

#include <omp.h>
#include <string.h>

#include "threads.h"

/* Below this many elements a walk stays on the calling thread. */
#define ATTN_PARALLEL_MIN 32768

typedef struct walk {
  int nops, ndim;
  int64_t size[ATTN_MAX_DIMS];
  int64_t stride[3][ATTN_MAX_DIMS];
  float *base[3];
} walk;

/* Drop size-1 dims and merge neighbours that are contiguous in every operand. */
static void coalesce(walk *w, int nops, const attn_tensor *const *ops) {
  const attn_tensor *o = ops[0];
  w->nops = nops;
  w->ndim = 0;
  for (int k = 0; k < nops; k++) w->base[k] = ops[k]->data;
  for (int d = 0; d < o->ndim; d++) {
    if (o->size[d] == 1) continue;
    int n = w->ndim;
    int mergeable = n > 0;
    for (int k = 0; k < nops && mergeable; k++)
      mergeable = w->stride[k][n - 1] == ops[k]->stride[d] * o->size[d];
    if (mergeable) {
      w->size[n - 1] *= o->size[d];
      for (int k = 0; k < nops; k++) w->stride[k][n - 1] = ops[k]->stride[d];
    } else {
      w->size[n] = o->size[d];
      for (int k = 0; k < nops; k++) w->stride[k][n] = ops[k]->stride[d];
      w->ndim++;
    }
  }
  if (w->ndim == 0) { /* a single element */
    w->ndim = 1;
    w->size[0] = 1;
    for (int k = 0; k < nops; k++) w->stride[k][0] = 1;
  }
}

/* Rows [begin, end) of the walk, rows being every index of dims 0..ndim-2. */
static void walk_rows(const walk *w, int64_t begin, int64_t end, attn_row_fn fn, const void *ctx) {
  int outer = w->ndim - 1;
  int64_t idx[ATTN_MAX_DIMS];
  float *p[3];
  int64_t s[3];
  int64_t rem = begin;
  for (int d = outer - 1; d >= 0; d--) {
    idx[d] = rem % w->size[d];
    rem /= w->size[d];
  }
  for (int k = 0; k < w->nops; k++) {
    p[k] = w->base[k];
    for (int d = 0; d < outer; d++) p[k] += idx[d] * w->stride[k][d];
    s[k] = w->stride[k][outer];
  }
  for (int64_t r = begin; r < end; r++) {
    fn(w->size[outer], p, s, ctx);
    for (int d = outer - 1; d >= 0; d--) { /* odometer step */
      for (int k = 0; k < w->nops; k++) p[k] += w->stride[k][d];
      if (++idx[d] < w->size[d]) break;
      for (int k = 0; k < w->nops; k++) p[k] -= w->stride[k][d] * w->size[d];
      idx[d] = 0;
    }
  }
}

void attn_foreach(int nops, const attn_tensor *const *ops, attn_row_fn fn, const void *ctx) {
  walk w;
  if (attn_numel(ops[0]) == 0) return;
  coalesce(&w, nops, ops);
  int64_t rows = 1;
  for (int d = 0; d < w.ndim - 1; d++) rows *= w.size[d];
  int64_t total = rows * w.size[w.ndim - 1];
  if (total < ATTN_PARALLEL_MIN || rows == 1 || omp_in_parallel()) {
    if (rows == 1 && total >= ATTN_PARALLEL_MIN && !omp_in_parallel()) {
      /* one long row: split it into pieces, one per thread */
      int64_t n = w.size[0];
#pragma omp parallel num_threads(attn_threads_for(n / (ATTN_PARALLEL_MIN / 4)))
      {
        int nth = omp_get_num_threads(), tid = omp_get_thread_num();
        int64_t b = n * tid / nth, e = n * (tid + 1) / nth;
        float *p[3];
        int64_t s[3];
        for (int k = 0; k < nops; k++) {
          p[k] = w.base[k] + b * w.stride[k][0];
          s[k] = w.stride[k][0];
        }
        if (e > b) fn(e - b, p, s, ctx);
      }
      return;
    }
    walk_rows(&w, 0, rows, fn, ctx);
    return;
  }
#pragma omp parallel num_threads(attn_threads_for(rows))
  {
    int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    int64_t b = rows * tid / nth, e = rows * (tid + 1) / nth;
    if (e > b) walk_rows(&w, b, e, fn, ctx);
  }
}
