/* Elementwise, reduction, softmax, join and matmul kernels of the core.
 * Every kernel writes into `out`, prepared by the caller with the shape the
 * kernel documents; inputs are strided views and may be expanded (stride 0). */
#ifndef ATTN_OPS_H
#define ATTN_OPS_H

#include "op_table.h"
#include "tensor.h"

/* The op enums, in the order of op_table.h (one line there per op). */
#define ATTN_OP_ENUM_ENTRY(ID, ...) ATTN_##ID,
typedef enum attn_binop {
  ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_ENUM_ENTRY, ATTN_OP_ENUM_ENTRY, ATTN_OP_IGNORE)
  ATTN_BINOP_COUNT
} attn_binop;

typedef enum attn_unop {
  ATTN_OP_TABLE(ATTN_OP_ENUM_ENTRY, ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE)
  ATTN_UNOP_COUNT
} attn_unop;

/* Along dim d of a [..., n, ...]: out has a's shape with size 1 at d. */
typedef enum attn_reduceop {
  ATTN_OP_TABLE(ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_ENUM_ENTRY)
  ATTN_REDUCEOP_COUNT
} attn_reduceop;
#undef ATTN_OP_ENUM_ENTRY

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
/* attn_matmul, then out[..., j] + bias[j]: the bits of the two steps, the
 * bias added to each tile as it is finished (in the own GEMM's stores).
 * b has 2 or more dims; bias is contiguous, [n] (out's last size). */
attn_status attn_matmul_add_bias(const attn_tensor *a, const attn_tensor *b, const attn_tensor *bias,
                                 attn_tensor *out);

/* c [m, n] (row stride ldc) = op(a) [m, k] @ op(b) [k, n], row-major, op = transpose when
 * trans_*: in attn_matmul's fixed tiles, so the bits equal attn_matmul's for the same
 * 2-D product and do not depend on the thread count. m, n, k, lda, ldb, ldc <= INT_MAX. */
void attn_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc);
/* attn_gemm, then c[i, j] + bias[j] (bias contiguous [n]): the bits of the
 * two steps, the bias added to each tile as it is finished (in the own
 * GEMM's stores), not in a pass of its own over c. */
void attn_gemm_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc);
/* 1 when attn_gemm runs an [m, n] product over k on the project's own GEMM
 * (src/core/sgemm.h), whose bits depend on no tile: then its rows (or
 * columns) may be computed as part of a larger product, the same bits. */
int attn_gemm_is_own(int64_t m, int64_t n, int64_t k);

/* One descriptor per line of op_table.h, in its order (op_table.c): what the
 * binding registers, attn.ops_table() lists and the fuzzers pick from. */
typedef enum attn_op_kind { ATTN_KIND_UNARY, ATTN_KIND_BINARY, ATTN_KIND_COMPARE, ATTN_KIND_REDUCE } attn_op_kind;
typedef struct attn_op_info {
  const char *name;         /* the public Lua name */
  attn_op_kind kind;
  int op;                   /* its attn_unop, attn_binop or attn_reduceop */
  int arity;                /* tensor inputs: 1 or 2 */
  unsigned flags;           /* ATTN_OPF_* */
  const char *lua_operator; /* the metamethod that also calls it ("__add") or NULL */
  const char *index_name;   /* reductions: the indices-only variant ("argmax") or NULL */
  const char *forward;      /* the table's forward expression, as text */
  const char *backward;     /* derivatives.yaml-style formula, NULL when not differentiable */
} attn_op_info;
extern const attn_op_info attn_ops[];
extern const int attn_op_count;

/* Name of the BLAS core in use ("Haswell", "SkylakeX", ...). */
const char *attn_blas_corename(void);
int attn_blas_threads(void);

#endif
