/* A strided N-d walk shared by the elementwise kernels: up to three operands
 * of one shape (the output first), dims coalesced where every operand is
 * contiguous across them, rows of the innermost dim handed to a row kernel,
 * rows split across OpenMP threads when the work is large. */
#ifndef ATTN_ITER_H
#define ATTN_ITER_H

#include "tensor.h"

/* n elements; p[k] + i * s[k] is operand k's element i. */
typedef void (*attn_row_fn)(int64_t n, float *const *p, const int64_t *s, const void *ctx);

/* ops[0] is the output; all operands must have ops[0]'s shape (expand first). */
void attn_foreach(int nops, const attn_tensor *const *ops, attn_row_fn fn, const void *ctx);

#endif
