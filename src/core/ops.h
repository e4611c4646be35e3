/* Elementwise, reduction, softmax, join and matmul kernels of the core.
 * Every kernel writes into `out`, prepared by the caller with the shape the
 * kernel documents; inputs are strided views and may be expanded (stride 0). */
#ifndef ATTN_OPS_H
#define ATTN_OPS_H

#include "tensor.h"

typedef enum attn_binop {
  ATTN_ADD, ATTN_SUB, ATTN_MUL, ATTN_DIV, ATTN_POW,
  ATTN_EQ, ATTN_NE, ATTN_GT, ATTN_LT, ATTN_GE, ATTN_LE,
  ATTN_MAXIMUM, ATTN_MINIMUM
} attn_binop;

typedef enum attn_unop {
  ATTN_COPY, ATTN_NEG, ATTN_EXP, ATTN_LOG, ATTN_SQRT, ATTN_TANH, ATTN_ABS,
  ATTN_NONZERO, ATTN_SIGMOID, ATTN_RELU, ATTN_RECIPROCAL
} attn_unop;

/* out = a op b, a and b broadcast to out's shape: out [*], a [*'], b [*'']. out may
 * be a itself (in place). Comparisons write 1 or 0. */
attn_status attn_binary(attn_binop op, const attn_tensor *a, const attn_tensor *b, attn_tensor *out);
/* out = op(a), a broadcast to out's shape (ATTN_COPY with broadcast is copy_). */
attn_status attn_unary(attn_unop op, const attn_tensor *a, attn_tensor *out);
/* out[*] = value */
attn_status attn_fill(attn_tensor *out, float value);
/* out[i] = value where mask[i] != 0; mask [*'] broadcast to out [*]. */
attn_status attn_masked_fill(attn_tensor *out, const attn_tensor *mask, float value);
/* out = a with elements below (upper) or above (lower) diagonal k zeroed;
 * a, out [..., m, n], out may alias a. */
attn_status attn_triangle(const attn_tensor *a, attn_tensor *out, int64_t k, int upper);
/* out[i] = start + i * step, out 1-D */
attn_status attn_arange(attn_tensor *out, double start, double step);

/* Along dim d of a [..., n, ...]: out has a's shape with size 1 at d. */
typedef enum attn_reduceop { ATTN_SUM, ATTN_MEAN, ATTN_MAX, ATTN_MIN } attn_reduceop;
/* out [.. 1 ..] = reduce(a [.. n ..]) over dim d; for MAX/MIN, indices (if not NULL)
 * get the 0-based position of the first extreme value (NaN wins, as in PyTorch). */
attn_status attn_reduce_dim(attn_reduceop op, const attn_tensor *a, int d, attn_tensor *out,
                            attn_tensor *indices);
/* out 0-dim = reduce(a) over every element */
attn_status attn_reduce_all(attn_reduceop op, const attn_tensor *a, float *out, int64_t *index);

/* 1 when a and b (the same shape) are equal everywhere (NaN never equal), else 0;
 * no temporary, stops at the first difference. */
int attn_equal(const attn_tensor *a, const attn_tensor *b);

/* out = softmax(a) (or log_softmax) along dim d; out has a's shape, may alias a.
 * Max-subtracted; a row of -inf only gives NaN as in PyTorch. */
attn_status attn_softmax(const attn_tensor *a, int d, attn_tensor *out, int log);

/* out = concatenation of n tensors along d; out's shape is checked. */
attn_status attn_cat(const attn_tensor *const *parts, int n, int d, attn_tensor *out);

/* matmul with torch.matmul rules.  attn_matmul_shape computes out's shape from
 * a and b; attn_matmul then fills out (contiguous, that shape). */
attn_status attn_matmul_shape(const attn_tensor *a, const attn_tensor *b, int *ndim, int64_t *size);
attn_status attn_matmul(const attn_tensor *a, const attn_tensor *b, attn_tensor *out);

/* c [m, n] (row stride ldc) = op(a) [m, k] @ op(b) [k, n], row-major, op = transpose when
 * trans_*: in attn_matmul's fixed tiles, so the bits equal attn_matmul's for the same
 * 2-D product and do not depend on the thread count. m, n, k, lda, ldb, ldc <= INT_MAX. */
void attn_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc);

/* Name of the BLAS core in use ("Haswell", "SkylakeX", ...). */
const char *attn_blas_corename(void);
int attn_blas_threads(void);

#endif
