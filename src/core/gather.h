/* Index ops along a dim (gather.c): index_select, gather, scatter_add_, where.
 * Index tensors hold integer values counting from `base` (1 from Lua, 0 from
 * C); every index is checked before anything is written, and a bad one fails
 * naming its value, its position and the valid range. */
#ifndef ATTN_GATHER_H
#define ATTN_GATHER_H

#include "tensor.h"

/* Every value of index an integer in [base, base + n - 1], n the size of dim d
 * (0-based, named 1-based in the message); else ATTN_EARG naming the first bad
 * value, its position (counted from base) and the range. */
attn_status attn_check_indices(const attn_tensor *index, int64_t n, int d, int64_t base);

/* out [.., m, ..] = a [.., n, ..] at positions index [m] along dim d. */
attn_status attn_index_select(const attn_tensor *a, int d, const attn_tensor *index, int64_t base, attn_tensor *out);

/* out[i][j] = a[index[i][j]][j] (d = 0; likewise for any d): index and out
 * have one shape, with the same dims as a and no larger than a except at d. */
attn_status attn_gather(const attn_tensor *a, int d, const attn_tensor *index, int64_t base, attn_tensor *out);

/* self[index[i][j]][j] += src[i][j] (d = 0), in index order along d: index no
 * larger than src anywhere and than self except at d, all three with the same
 * dims. self must not overlap index or src (checked). */
attn_status attn_scatter_add(attn_tensor *self, int d, const attn_tensor *index, int64_t base, const attn_tensor *src);

/* out = a where cond != 0, else b; cond, a, b broadcast to out's shape. */
attn_status attn_where(const attn_tensor *cond, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);

#endif
