/* The descriptors of op_table.h's ops, generated from its one list. */
#include <stddef.h>

#include "ops.h"

#define UNARY_INFO(ID, name, forward, operator, flags, backward) \
  {name, ATTN_KIND_UNARY, ATTN_##ID, 1, flags, operator, NULL, #forward, backward},
#define BINARY_INFO(ID, name, forward, operator, flags, backward) \
  {name, ATTN_KIND_BINARY, ATTN_##ID, 2, flags, operator, NULL, #forward, backward},
#define COMPARE_INFO(ID, name, predicate, flags, backward) \
  {name, ATTN_KIND_COMPARE, ATTN_##ID, 2, flags, NULL, NULL, #predicate, backward},
/* a reduction's forward, as text, from its family */
#define REDUCE_TEXT_TOTAL(better) "sum of v in double"
#define REDUCE_TEXT_AVERAGE(better) "sum of v in double / count"
#define REDUCE_TEXT_EXTREME(better) "best = the first v, then each v for which " #better " (a NaN wins)"
#define REDUCE_INFO(ID, name, family, better, index_name, flags, backward) \
  {name, ATTN_KIND_REDUCE, ATTN_##ID, 1, flags, NULL, index_name, REDUCE_TEXT_##family(better), backward},

const attn_op_info attn_ops[] = {ATTN_OP_TABLE(UNARY_INFO, BINARY_INFO, COMPARE_INFO, REDUCE_INFO)};
const int attn_op_count = (int)(sizeof attn_ops / sizeof attn_ops[0]);

/* t:name_ is the in-place form of a binary op (binary_ in lua_math.c): the
 * flag on a unary op or a reduction is a mistake in the table, caught here */
#define UNARY_NOT_INPLACE(ID, name, forward, operator, flags, backward) \
  _Static_assert(!((flags) & ATTN_OPF_INPLACE), "ATTN_OPF_INPLACE is for binary ops: " name);
#define REDUCE_NOT_INPLACE(ID, name, family, better, index_name, flags, backward) \
  _Static_assert(!((flags) & ATTN_OPF_INPLACE), "ATTN_OPF_INPLACE is for binary ops: " name);
ATTN_OP_TABLE(UNARY_NOT_INPLACE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, REDUCE_NOT_INPLACE)
