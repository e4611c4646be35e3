/* Elementwise kernels: binary ops with broadcasting, unary maths, fills,
 * masked_fill, triu/tril, arange. The ops' cases come from op_table.h: one
 * loop per op, its scalar expression inlined. */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "exp_nonpos.h"
#include "iter.h"
#include "ops.h"

/* PyTorch's pow special cases, so x^2 is x*x bit for bit. */
static inline float pow_f(float a, float b) {
  if (b == 2.0f) return a * a;
  if (b == 1.0f) return a;
  if (b == 0.5f) return sqrtf(a);
  if (b == -1.0f) return 1.0f / a;
  if (b == 3.0f) return a * a * a;
  if (b == -2.0f) return 1.0f / (a * a);
  return powf(a, b);
}

/* torch.remainder (Python's %: the sign of the divisor), as PyTorch's CPU
 * kernel computes it: fmod, then the divisor added where the signs differ;
 * -0 % 3 stays -0 and x % 0 is NaN. */
static inline float remainder_f(float a, float b) {
  float m = fmodf(a, b);
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
  return m;
}

/* torch.floor_divide (Python's //), PyTorch's div_floor: from the exact
 * fmod rather than floorf(a / b), whose rounded quotient can land on the
 * next integer; x // 0 is x / 0 (inf or NaN), a zero keeps a / b's sign. */
static inline float floor_divide_f(float a, float b) {
  if (b == 0.0f) return a / b;
  float m = fmodf(a, b);
  float d = (a - m) / b;
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) d -= 1.0f;
  if (d == 0.0f) return copysignf(0.0f, a / b);
  float f = floorf(d);
  if (d - f > 0.5f) f += 1.0f;
  return f;
}

/* NaN propagating maximum/minimum (torch.maximum). */
static inline float max_f(float a, float b) {
  if (a != a || b != b) return a + b;
  return a > b ? a : b;
}
static inline float min_f(float a, float b) {
  if (a != a || b != b) return a + b;
  return a < b ? a : b;
}

/* The row kernels start on a 64-byte boundary, so where their loops fall
 * relative to the CPU's fetch blocks does not depend on the code the linker
 * places before them (a 16-byte shift once made relu and bool 1.8x slower).
 * Their unit-stride loops are `omp simd` in AVX-512, AVX2 and SSE2 clones
 * (ATTN_VECTOR_CLONES): GCC 12 at -O2 vectorises no loop whose count it
 * does not know, so a + b ran one float at a time. Every expression is one
 * IEEE operation per element or a select (add, mul, div, sqrt, compares,
 * max with its NaN test), the same bits in any width; one that calls libm
 * (pow's general case, fmod, log, tanh, sin) leaves its loop scalar (glibc
 * declares no vector variants without -ffast-math). An out that is exactly
 * an input (a:add_(a)) is fine per element; partial overlap is refused
 * before. */
#define ATTN_LOOP_ALIGNED __attribute__((aligned(64))) ATTN_VECTOR_CLONES
#define ATTN_SIMD _Pragma("omp simd")

#define BINARY_LOOP(EXPR)                                                        \
  do {                                                                           \
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {                                   \
      ATTN_SIMD                                                                  \
      for (int64_t i = 0; i < n; i++) { float x = a[i], y = b[i]; o[i] = (EXPR); } \
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {                            \
      float y = b[0];                                                            \
      ATTN_SIMD                                                                  \
      for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); }         \
    } else {                                                                     \
      for (int64_t i = 0; i < n; i++) {                                          \
        float x = a[i * s[1]], y = b[i * s[2]];                                  \
        o[i * s[0]] = (EXPR);                                                    \
      }                                                                          \
    }                                                                            \
  } while (0)

static ATTN_LOOP_ALIGNED void binary_row(int64_t n, float *const *p, const int64_t *s, const void *ctx) {
  float *o = p[0];
  const float *a = p[1], *b = p[2];
  switch (*(const attn_binop *)ctx) {
#define BINARY_CASE(ID, name, forward, ...) \
  case ATTN_##ID: BINARY_LOOP(forward); break;
#define COMPARE_CASE(ID, name, predicate, ...) \
  case ATTN_##ID: BINARY_LOOP((predicate) ? 1.0f : 0.0f); break;
    ATTN_OP_TABLE(ATTN_OP_IGNORE, BINARY_CASE, COMPARE_CASE, ATTN_OP_IGNORE)
#undef BINARY_CASE
#undef COMPARE_CASE
    case ATTN_BINOP_COUNT: break;
  }
}

/* An in-place kernel reading an input that shares some, but not all, of its
 * elements with out would read values it already wrote: refused as PyTorch
 * does. An input that is exactly out (a:add_(a)) is fine element by element. */
static attn_status check_overlap(const attn_tensor *out, const attn_tensor *in) {
  attn_overlap overlap;
  attn_status st = attn_overlap_status(out, in, &overlap);
  if (st != ATTN_OK) return st;
  if (overlap == ATTN_OVERLAP_PARTIAL)
    return attn_fail(ATTN_EARG, "unsupported operation: some elements of the input tensor and the written-to tensor "
                     "refer to a single memory location (the input overlaps the output). Please clone() the input "
                     "before performing the operation.");
  return ATTN_OK;
}

/* Whether the contiguous in (of out's numel n) is out itself or lies wholly
 * apart from it: no partial overlap for check_overlap to refuse. */
static int apart_or_same(const attn_tensor *out, const attn_tensor *in, int64_t n) {
  return in->data == out->data || in->data + n <= out->data || out->data + n <= in->data;
}

/* Below this many elements, contiguous operands of out's shape run as one row. */
#define SMALL_ROW_ELEMS 4096

attn_status attn_binary(attn_binop op, const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  attn_tensor ea, eb;
  attn_status st;
  if ((unsigned)op >= ATTN_BINOP_COUNT) return attn_fail(ATTN_EARG, "unknown binary op %d", (int)op);
  /* small contiguous operands of one shape (a gradient added into another):
   * binary_row over the one row that attn_foreach would make of them, without
   * its expand, overlap and coalescing steps, which cost more than the adds */
  int64_t n = attn_numel(out);
  if (n > 0 && n <= SMALL_ROW_ELEMS && attn_same_shape(a, out) && attn_same_shape(b, out) &&
      attn_is_contiguous(out) && attn_is_contiguous(a) && attn_is_contiguous(b) && apart_or_same(out, a, n) &&
      apart_or_same(out, b, n)) {
    float *const p[3] = {out->data, a->data, b->data};
    static const int64_t unit[3] = {1, 1, 1};
    binary_row(n, p, unit, &op);
    return ATTN_OK;
  }
  if ((st = attn_expand(a, out->ndim, out->size, &ea)) != ATTN_OK) return st;
  if ((st = attn_expand(b, out->ndim, out->size, &eb)) != ATTN_OK) return st;
  if ((st = check_overlap(out, &ea)) != ATTN_OK || (st = check_overlap(out, &eb)) != ATTN_OK) return st;
  const attn_tensor *ops[3] = {out, &ea, &eb};
  attn_foreach(3, ops, binary_row, &op);
  return ATTN_OK;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

#define UNARY_LOOP(EXPR)                                                          \
  do {                                                                            \
    if (s[0] == 1 && s[1] == 1) {                                                 \
      ATTN_SIMD                                                                   \
      for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); }          \
    } else {                                                                      \
      for (int64_t i = 0; i < n; i++) { float x = a[i * s[1]]; o[i * s[0]] = (EXPR); } \
    }                                                                             \
  } while (0)

/* exp and sigmoid with expf's bits (the set's libm_exp_minus,
 * src/core/cpu.h: x - 0 = x): o = expf(a), or 1 / (1 + expf(-a)) with
 * sigmoid; contiguous rows in o itself, strided ones a chunk at a time (read
 * before it is written, so o may be a) */
#define EXP_CHUNK 256
static void exp_row(int64_t n, float *o, int64_t so, const float *a, int64_t sa, int sigmoid) {
  void (*exp_minus)(float *, int64_t, float) = attn_cpu_kernels()->libm_exp_minus;
  if (so == 1 && sa == 1) { /* in o itself, a chunk while it is in L1 */
    for (int64_t i0 = 0; i0 < n; i0 += 8 * EXP_CHUNK) {
      int64_t cnt = n - i0 < 8 * EXP_CHUNK ? n - i0 : 8 * EXP_CHUNK;
      float *oc = o + i0;
      const float *ac = a + i0;
      if (sigmoid) {
#pragma omp simd
        for (int64_t i = 0; i < cnt; i++) oc[i] = -ac[i];
      } else if (oc != ac) {
        memmove(oc, ac, (size_t)cnt * sizeof(float));
      }
      exp_minus(oc, cnt, 0.0f);
      if (sigmoid) {
#pragma omp simd
        for (int64_t i = 0; i < cnt; i++) oc[i] = 1.0f / (1.0f + oc[i]);
      }
    }
    return;
  }
  for (int64_t i0 = 0; i0 < n; i0 += EXP_CHUNK) {
    int64_t cnt = n - i0 < EXP_CHUNK ? n - i0 : EXP_CHUNK;
    float e[EXP_CHUNK];
    for (int64_t i = 0; i < cnt; i++) e[i] = sigmoid ? -a[(i0 + i) * sa] : a[(i0 + i) * sa];
    exp_minus(e, cnt, 0.0f);
    if (sigmoid)
      for (int64_t i = 0; i < cnt; i++) o[(i0 + i) * so] = 1.0f / (1.0f + e[i]);
    else
      for (int64_t i = 0; i < cnt; i++) o[(i0 + i) * so] = e[i];
  }
}

static ATTN_LOOP_ALIGNED void unary_row(int64_t n, float *const *p, const int64_t *s, const void *ctx) {
  float *o = p[0];
  const float *a = p[1];
  attn_unop op = *(const attn_unop *)ctx;
  if (op == ATTN_EXP || op == ATTN_SIGMOID) {
    exp_row(n, o, s[0], a, s[1], op == ATTN_SIGMOID);
    return;
  }
  switch (op) {
#define UNARY_CASE(ID, name, forward, ...) \
  case ATTN_##ID: UNARY_LOOP(forward); break;
    ATTN_OP_TABLE(UNARY_CASE, ATTN_OP_IGNORE, ATTN_OP_IGNORE, ATTN_OP_IGNORE)
#undef UNARY_CASE
    case ATTN_UNOP_COUNT: break;
  }
}

attn_status attn_unary(attn_unop op, const attn_tensor *a, attn_tensor *out) {
  attn_tensor ea;
  attn_status st;
  if ((unsigned)op >= ATTN_UNOP_COUNT) return attn_fail(ATTN_EARG, "unknown unary op %d", (int)op);
  if ((st = attn_expand(a, out->ndim, out->size, &ea)) != ATTN_OK) return st;
  if ((st = check_overlap(out, &ea)) != ATTN_OK) return st;
  /* a copy between distinct buffers that are both contiguous is one memmove */
  if (op == ATTN_COPY && attn_is_contiguous(out) && attn_is_contiguous(&ea) && ea.data != out->data) {
    memmove(out->data, ea.data, (size_t)attn_numel(out) * sizeof(float));
    return ATTN_OK;
  }
  const attn_tensor *ops[2] = {out, &ea};
  attn_foreach(2, ops, unary_row, &op);
  return ATTN_OK;
}

static void fill_row(int64_t n, float *const *p, const int64_t *s, const void *ctx) {
  float v = *(const float *)ctx, *o = p[0];
  for (int64_t i = 0; i < n; i++) o[i * s[0]] = v;
}

attn_status attn_fill(attn_tensor *out, float value) {
  /* an expanded (stride-0) dim writes the same floats again: visit it once,
   * so filling a huge expanded view costs its memory, not its element count */
  attn_tensor once = *out;
  for (int d = 0; d < once.ndim; d++)
    if (once.stride[d] == 0 && once.size[d] > 1) once.size[d] = 1;
  const attn_tensor *ops[1] = {&once};
  attn_foreach(1, ops, fill_row, &value);
  return ATTN_OK;
}

static void masked_fill_row(int64_t n, float *const *p, const int64_t *s, const void *ctx) {
  float v = *(const float *)ctx, *o = p[0];
  const float *m = p[1];
  for (int64_t i = 0; i < n; i++)
    if (m[i * s[1]] != 0.0f) o[i * s[0]] = v;
}

attn_status attn_masked_fill(attn_tensor *out, const attn_tensor *mask, float value) {
  attn_tensor em;
  attn_status st;
  if ((st = attn_expand(mask, out->ndim, out->size, &em)) != ATTN_OK) return st;
  if ((st = check_overlap(out, &em)) != ATTN_OK) return st;
  const attn_tensor *ops[2] = {out, &em};
  attn_foreach(2, ops, masked_fill_row, &value);
  return ATTN_OK;
}

attn_status attn_triangle(const attn_tensor *a, attn_tensor *out, int64_t k, int upper) {
  if (a->ndim < 2) return attn_fail(ATTN_ESHAPE, "expected at least 2 dims, got %d", a->ndim);
  if (!attn_same_shape(a, out)) return attn_fail(ATTN_ESHAPE, "output shape differs from input");
  if (a != out && a->data != out->data) {
    attn_status st = attn_unary(ATTN_COPY, a, out);
    if (st != ATTN_OK) return st;
  }
  int nd = out->ndim;
  int64_t m = out->size[nd - 2], n = out->size[nd - 1];
  int64_t batch = attn_numel(out) / (m * n > 0 ? m * n : 1);
  if (m * n == 0) return ATTN_OK;
  for (int64_t bi = 0; bi < batch; bi++) {
    int64_t rem = bi;
    float *base = out->data;
    for (int d = nd - 3; d >= 0; d--) {
      base += (rem % out->size[d]) * out->stride[d];
      rem /= out->size[d];
    }
    for (int64_t i = 0; i < m; i++) {
      float *row = base + i * out->stride[nd - 2];
      for (int64_t j = 0; j < n; j++) {
        /* triu keeps j - i >= k, tril keeps j - i <= k */
        int keep = upper ? (j - i >= k) : (j - i <= k);
        if (!keep) row[j * out->stride[nd - 1]] = 0.0f;
      }
    }
  }
  return ATTN_OK;
}

/* torch.arange's CPU kernel (AVX2/default build, 8-float vectors): the
 * vectorised loop covers whole blocks of 16 elements, each 8-wide vector
 * starting from base = (float)(start + step * i0) and adding j * step to that
 * float32 base in double; the tail is start + step * i in double. So
 * arange(0, 2, 0.1)[10] is 0.8f + 0.1 = 0.900000036, as PyTorch gives. */
attn_status attn_arange(attn_tensor *out, double start, double step) {
  if (out->ndim != 1) return attn_fail(ATTN_ESHAPE, "arange output must be 1-D");
  int64_t n = out->size[0], vec_end = n / 16 * 16;
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (i < vec_end) {
      float base = (float)(start + step * (double)(i - i % 8));
      v = (double)base + (double)(i % 8) * step;
    } else {
      v = start + step * (double)i;
    }
    out->data[i * out->stride[0]] = (float)v;
  }
  return ATTN_OK;
}
