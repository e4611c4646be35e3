/* sort and topk along a dim, with PyTorch 1.13's CPU tie order (sort.c). */
#ifndef ATTN_SORT_H
#define ATTN_SORT_H

#include "tensor.h"

/* a [.., n, ..] sorted along dim d: values [.., n, ..] and indices (0-based
 * positions in a, as floats) of a's shape. NaN sorts as the largest value.
 * n must be at most 2^24 (indices are exact floats). */
attn_status attn_sort(const attn_tensor *a, int d, int descending, attn_tensor *values, attn_tensor *indices);

/* The k largest (or smallest) of a [.., n, ..] along d: values and indices
 * [.., k, ..]; sorted: in order (else in PyTorch's unspecified order). 0 <= k <= n. */
attn_status attn_topk(const attn_tensor *a, int d, int64_t k, int largest, int sorted, attn_tensor *values,
                      attn_tensor *indices);

#endif
