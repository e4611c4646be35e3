/* Embedding lookup (a row gather) and its backward (a scatter-add), with
 * token ids counted from 1.
 *   forward:  weight [V, D], ids [N] -> out [N, D],  out_i = weight_{ids_i}
 *   backward: dy [N, D], ids [N] -> dweight [V, D] = 0, then for i = 1..N in
 *             order: dweight_{ids_i} += dy_i
 * Contract: contiguous float32; every id an integer value in [1, V] (else
 * ATTN_EARG naming the first bad position, 1-based), checked before any write.
 * Error against torch 1.13: the forward copies; the backward adds each
 * vocabulary row's gradients in the order of the ids, as torch's CPU
 * embedding_dense_backward does, so it is the same bits.
 * Threads: the forward's rows are independent. The backward splits the
 * vocabulary into ranges (one per thread) and every thread scans all ids,
 * adding those in its range in id order: no two threads write one row, no
 * float atomics, and each row's sum runs in the same order for any thread
 * count. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 32768

attn_status attn_embedding_check_ids(const attn_tensor *ids, int64_t v) {
  const int64_t n = attn_numel(ids);
  for (int64_t i = 0; i < n; i++) {
    double t = (double)ids->data[i];
    if (t != floor(t))
      return attn_fail(ATTN_EARG, "ids[%lld] = %.9g is not an integer token id", (long long)(i + 1), t);
    if (!(t >= 1.0 && t <= (double)v))
      return attn_fail(ATTN_EARG, "ids[%lld] = %.9g is out of range (ids are 1 to %lld)", (long long)(i + 1), t,
                       (long long)v);
  }
  return ATTN_OK;
}

static attn_status check_shapes(const attn_tensor *table, const attn_tensor *ids, const attn_tensor *rows,
                                const char *table_name, const char *rows_name) {
  if (table->ndim != 2) return attn_fail(ATTN_ESHAPE, "'%s' must be 2-D [V, D]", table_name);
  if (ids->ndim != 1) return attn_fail(ATTN_ESHAPE, "'ids' must be 1-D [N]");
  if (rows->ndim != 2 || rows->size[0] != ids->size[0] || rows->size[1] != table->size[1])
    return attn_fail(ATTN_ESHAPE, "'%s' must be of shape [%lld, %lld]", rows_name, (long long)ids->size[0],
                     (long long)table->size[1]);
  return ATTN_OK;
}

attn_status attn_embedding_forward(const attn_tensor *weight, const attn_tensor *ids, attn_tensor *out) {
  attn_status st;
  if ((st = check_shapes(weight, ids, out, "weight", "out")) || (st = attn_embedding_check_ids(ids, weight->size[0]))) return st;
  const int64_t n = ids->size[0], d = weight->size[1];
  const float *w = weight->data, *is = ids->data;
  float *o = out->data;
  /* weight: (V, D), ids: (N) -> out: (N, D) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n)) if (n * d > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++)
    if (d > 0) memcpy(o + i * d, w + ((int64_t)is[i] - 1) * d, (size_t)d * sizeof(float));
  return ATTN_OK;
}

attn_status attn_embedding_backward(const attn_tensor *dy, const attn_tensor *ids, attn_tensor *dweight) {
  attn_status st;
  if ((st = check_shapes(dweight, ids, dy, "dweight", "grad")) || (st = attn_embedding_check_ids(ids, dweight->size[0]))) return st;
  const int64_t n = ids->size[0], v = dweight->size[0], d = dweight->size[1];
  const float *g = dy->data, *is = ids->data;
  float *dw = dweight->data;
  if (v * d > 0) memset(dw, 0, (size_t)(v * d) * sizeof(float));
  const int nt = n * d > PARALLEL_ELEMS ? attn_threads_for(v) : 1;
  /* dy: (N, D), ids: (N) -> dweight: (V, D); thread r owns vocabulary rows [lo, hi) */
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int64_t team = omp_get_num_threads(), r = omp_get_thread_num();
    const int64_t lo = v * r / team, hi = v * (r + 1) / team;
    for (int64_t i = 0; i < n; i++) {
      int64_t row = (int64_t)is[i] - 1;
      if (row < lo || row >= hi) continue;
      float *dst = dw + row * d;
      const float *src = g + i * d;
      for (int64_t j = 0; j < d; j++) dst[j] += src[j];
    }
  }
  return ATTN_OK;
}
