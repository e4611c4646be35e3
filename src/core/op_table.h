/* The one table of elementwise and reduction ops. Everything else is generated
 * from it: the enums of ops.h, the kernels' switch cases in elementwise.c and
 * reduce.c, the descriptors of op_table.c (names, kinds, flags, formulas), and
 * from those the Lua functions and methods of lua_math.c, attn.ops_table(), and
 * the ops scripts/fuzz.lua and fuzz/core_fuzz.c pick. Adding an op is one line
 * here plus its doc in lua/attn/ldoc_core.lua (spec/op_table_spec.lua checks both).
 *
 * A consumer expands ATTN_OP_TABLE(UNARY, BINARY, COMPARE, REDUCE) with one
 * macro per kind (ATTN_OP_IGNORE for the kinds it does not want):
 *   UNARY(ID, name, forward, operator, flags, backward)
 *   BINARY(ID, name, forward, operator, flags, backward)
 *   COMPARE(ID, name, predicate, flags, backward)
 *   REDUCE(ID, name, family, better, index_name, flags, backward)
 * ID       the enum value without its prefix: ATTN_##ID
 * name     the public Lua name: attn.name(...) and t:name(...)
 * forward  the float result of the scalar inputs x (and y), expanded inline into
 *          the kernels' loops (so no call per element); helpers such as pow_f
 *          are defined in elementwise.c before the expansion
 * predicate (comparisons and logical ops) of x and y: the result is 1 where true, else 0,
 *          a bool tensor (nonzero operands are true, NaN included)
 * operator the Lua metamethod that also calls the op ("__add", "__unm"), or NULL
 * family   (reductions) TOTAL: double sum; AVERAGE: double sum / count;
 *          EXTREME: the first element for which `better` (of v, best) holds
 * index_name (reductions) the name of the variant that returns the indices
 *          alone ("argmax" for max), or NULL
 * flags    ATTN_OPF_* below
 * backward the gradient formula in PyTorch's derivatives.yaml style, for the
 *          autograd to come (NULL when not differentiable): `grad` is the
 *          incoming gradient, `self` and `other` the inputs, `result` the output;
 *          a binary op gives one formula per input ("self: ...; other: ...").
 *          Broadcast inputs get their gradient summed back to their own shape.
 *
 * The order of the lines is the order of each enum (attn_binop holds the
 * binary ops and comparisons); fuzz inputs pick ops by number, so a new op
 * goes after the last op of its enum. */
#ifndef ATTN_OP_TABLE_H
#define ATTN_OP_TABLE_H

#define ATTN_OPF_DIFF 1u     /* differentiable: the backward formula is meaningful */
#define ATTN_OPF_INPLACE 2u  /* binary ops: also the method t:name_(other), in place */
#define ATTN_OPF_INTERNAL 4u /* a kernel of the core only, no Lua name (copy) */

#define ATTN_OP_IGNORE(...)

#define ATTN_OP_TABLE(UNARY, BINARY, COMPARE, REDUCE)                                                                  \
  BINARY(ADD, "add", x + y, "__add", ATTN_OPF_DIFF | ATTN_OPF_INPLACE, "self: grad; other: grad")                      \
  BINARY(SUB, "sub", x - y, "__sub", ATTN_OPF_DIFF | ATTN_OPF_INPLACE, "self: grad; other: -grad")                     \
  BINARY(MUL, "mul", x * y, "__mul", ATTN_OPF_DIFF | ATTN_OPF_INPLACE, "self: grad * other; other: grad * self")       \
  BINARY(DIV, "div", x / y, "__div", ATTN_OPF_DIFF | ATTN_OPF_INPLACE,                                                 \
         "self: grad / other; other: -grad * self / (other * other)")                                                  \
  BINARY(POW, "pow", pow_f(x, y), "__pow", ATTN_OPF_DIFF,                                                              \
         "self: grad * other * self ^ (other - 1) (0 where other == 0); "                                              \
         "other: grad * result * log(self) (0 where self == 0 and other >= 0)")                                        \
  BINARY(REMAINDER, "remainder", remainder_f(x, y), "__mod", ATTN_OPF_DIFF | ATTN_OPF_INPLACE,                          \
         "self: grad; other: -grad * floor(self / other)")                                                             \
  BINARY(FLOOR_DIVIDE, "floor_divide", floor_divide_f(x, y), "__idiv", 0, NULL)                                        \
  COMPARE(EQ, "eq", x == y, 0, NULL)                                                                                   \
  COMPARE(NE, "ne", x != y, 0, NULL)                                                                                   \
  COMPARE(GT, "gt", x > y, 0, NULL)                                                                                    \
  COMPARE(LT, "lt", x < y, 0, NULL)                                                                                    \
  COMPARE(GE, "ge", x >= y, 0, NULL)                                                                                   \
  COMPARE(LE, "le", x <= y, 0, NULL)                                                                                   \
  BINARY(MAXIMUM, "maximum", max_f(x, y), NULL, ATTN_OPF_DIFF,                                                         \
         "self: grad where self > other, grad / 2 where self == other, else 0; "                                       \
         "other: grad where other > self, grad / 2 where self == other, else 0")                                       \
  BINARY(MINIMUM, "minimum", min_f(x, y), NULL, ATTN_OPF_DIFF,                                                         \
         "self: grad where self < other, grad / 2 where self == other, else 0; "                                       \
         "other: grad where other < self, grad / 2 where self == other, else 0")                                       \
  COMPARE(LOGICAL_AND, "logical_and", x != 0.0f && y != 0.0f, 0, NULL)                                                 \
  COMPARE(LOGICAL_OR, "logical_or", x != 0.0f || y != 0.0f, 0, NULL)                                                   \
  COMPARE(LOGICAL_XOR, "logical_xor", (x != 0.0f) != (y != 0.0f), 0, NULL)                                             \
  UNARY(COPY, "copy", x, NULL, ATTN_OPF_DIFF | ATTN_OPF_INTERNAL, "self: grad")                                        \
  UNARY(NEG, "neg", -x, "__unm", ATTN_OPF_DIFF, "self: -grad")                                                         \
  UNARY(EXP, "exp", expf(x), NULL, ATTN_OPF_DIFF, "self: grad * result")                                               \
  UNARY(LOG, "log", logf(x), NULL, ATTN_OPF_DIFF, "self: grad / self")                                                 \
  UNARY(SQRT, "sqrt", sqrtf(x), NULL, ATTN_OPF_DIFF, "self: grad / (2 * result)")                                      \
  UNARY(TANH, "tanh", tanhf(x), NULL, ATTN_OPF_DIFF, "self: grad * (1 - result * result)")                             \
  UNARY(ABS, "abs", fabsf(x), NULL, ATTN_OPF_DIFF, "self: grad * sign(self)")                                          \
  UNARY(NONZERO, "bool", x != 0.0f ? 1.0f : 0.0f, NULL, 0, NULL)                                                       \
  UNARY(SIGMOID, "sigmoid", sigmoid_f(x), NULL, ATTN_OPF_DIFF, "self: grad * result * (1 - result)")                   \
  UNARY(RELU, "relu", x > 0.0f ? x : (x != x ? x : 0.0f), NULL, ATTN_OPF_DIFF, "self: grad where result > 0, else 0")  \
  UNARY(RECIPROCAL, "reciprocal", 1.0f / x, NULL, ATTN_OPF_DIFF, "self: -grad * result * result")                      \
  UNARY(ERF, "erf", erff(x), NULL, ATTN_OPF_DIFF, "self: grad * 2 / sqrt(pi) * exp(-self * self)")                   \
  UNARY(SIN, "sin", sinf(x), NULL, ATTN_OPF_DIFF, "self: grad * cos(self)")                                           \
  UNARY(FLOOR, "floor", floorf(x), NULL, ATTN_OPF_DIFF, "self: zeros_like(grad) (floor is flat between the integers)")  \
  UNARY(COS, "cos", cosf(x), NULL, ATTN_OPF_DIFF, "self: -grad * sin(self)")                                          \
  UNARY(LOGICAL_NOT, "logical_not", x == 0.0f ? 1.0f : 0.0f, NULL, 0, NULL)                                          \
  REDUCE(SUM, "sum", TOTAL, 0, NULL, ATTN_OPF_DIFF,                                                                    \
         "self: grad expanded to self's shape (with dim and not keepdim: unsqueezed at dim first)")                    \
  REDUCE(MEAN, "mean", AVERAGE, 0, NULL, ATTN_OPF_DIFF,                                                                \
         "self: grad / count expanded to self's shape (with dim and not keepdim: unsqueezed at dim first)")            \
  REDUCE(MAX, "max", EXTREME, v > best, "argmax", ATTN_OPF_DIFF,                                                       \
         "self: with dim: grad to the index (indices), 0 elsewhere; "                                                  \
         "all: grad shared evenly among the elements equal to result")                                                 \
  REDUCE(MIN, "min", EXTREME, v < best, "argmin", ATTN_OPF_DIFF,                                                       \
         "self: with dim: grad to the index (indices), 0 elsewhere; "                                                  \
         "all: grad shared evenly among the elements equal to result")

#endif
