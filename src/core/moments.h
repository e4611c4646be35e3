/* Sums along a dim beyond the op table's reductions (moments.c): variance,
 * standard deviation, cumulative sum. Accumulation in double, as PyTorch's
 * CPU kernels for float. */
#ifndef ATTN_MOMENTS_H
#define ATTN_MOMENTS_H

#include "tensor.h"

/* out [.. 1 ..] = var (or std when take_sqrt) of a [.. n ..] along d:
 * sum((x - mean)^2) / (n - correction), NaN when n - correction <= 0. */
attn_status attn_var_dim(const attn_tensor *a, int d, int64_t correction, int take_sqrt, attn_tensor *out);
/* *out = var (or std) of every element of a. */
attn_status attn_var_all(const attn_tensor *a, int64_t correction, int take_sqrt, float *out);

/* out [.. n ..] = running sum of a [.. n ..] along d (out may not overlap a
 * partially; out == a works). */
attn_status attn_cumsum(const attn_tensor *a, int d, attn_tensor *out);

#endif
