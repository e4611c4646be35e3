/* The C core's tensor: a strided float32 view over memory the caller owns.
 *
 * The core never allocates tensor storage and never sees Lua: every kernel
 * writes into an output descriptor prepared by its caller, and reports bad
 * input by returning a status with a message (attn_error_message()).
 * Dims are 0-based here; the binding converts Lua's 1-based dims once. */
#ifndef ATTN_TENSOR_H
#define ATTN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define ATTN_MAX_DIMS 8

typedef struct attn_tensor {
  float *data;                        /* element [0, ..., 0] */
  int ndim;
  int is_bool;                        /* PyTorch's bool kind: elements are 0 or 1; views carry it */
  int64_t size[ATTN_MAX_DIMS];
  int64_t stride[ATTN_MAX_DIMS];      /* in elements, may be 0 (expanded) */
} attn_tensor;

typedef enum attn_status {
  ATTN_OK = 0,
  ATTN_ESHAPE,      /* shapes do not fit together */
  ATTN_EARG,        /* a value out of its domain */
  ATTN_ENOMEM,      /* scratch memory could not be had */
  ATTN_EOVERFLOW    /* a size whose element or byte count overflows */
} attn_status;

/* Last error of the calling thread, set by the failing core function. */
const char *attn_error_message(void);
attn_status attn_fail(attn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "[2, 3]" into buf (always terminated). */
const char *attn_shape_str(const attn_tensor *t, char *buf, size_t len);
const char *attn_sizes_str(int ndim, const int64_t *size, char *buf, size_t len);

/* Element count of a shape; ATTN_EOVERFLOW when the count, or its byte size,
 * does not fit in int64_t / size_t (negative sizes are ATTN_EARG). */
attn_status attn_numel_checked(int ndim, const int64_t *size, int64_t *numel);

/* Product of non-negative sizes: 0 when any is 0 (whatever the others), else
 * saturating at INT64_MAX. attn_numel is that of t's shape. */
int64_t attn_sizes_product(int ndim, const int64_t *size);
int64_t attn_numel(const attn_tensor *t);
int attn_is_contiguous(const attn_tensor *t);
int attn_same_shape(const attn_tensor *a, const attn_tensor *b);
void attn_contiguous_strides(int ndim, const int64_t *size, int64_t *stride);
/* A contiguous descriptor of the given shape over data. */
attn_tensor attn_make(float *data, int ndim, const int64_t *size);

/* Broadcast shape of a and b (PyTorch rules) into out_size/out_ndim. */
attn_status attn_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb,
                                 int *out_ndim, int64_t *out_size);
/* View of t expanded to (ndim, size): new dims and size-1 dims get stride 0. */
attn_status attn_expand(const attn_tensor *t, int ndim, const int64_t *size, attn_tensor *out);

/* The strides a view of t with a new shape would have, if one exists without
 * copying (torch's computeStride). Returns 1 and fills stride, or 0. */
int attn_view_strides(const attn_tensor *t, int ndim, const int64_t *size, int64_t *stride);

/* Whether several elements of t refer to one memory location: an expanded
 * (stride-0) dim of size > 1, or strides that interleave (refused
 * conservatively: no view attn makes has them without overlapping). */
int attn_has_internal_overlap(const attn_tensor *t);

/* How the elements of `in` (broadcast to out's shape) meet those of `out`:
 * none in common, exactly the same element at every position (a:add_(a)),
 * or some shared otherwise (an in-place kernel would read what it wrote). */
typedef enum attn_overlap { ATTN_OVERLAP_NONE, ATTN_OVERLAP_FULL, ATTN_OVERLAP_PARTIAL } attn_overlap;
/* Exact: address ranges first, then the element sets where the ranges meet
 * (scratch of one bit per float of the common range, freed before return).
 * ATTN_ESHAPE when in does not broadcast to out, ATTN_ENOMEM without scratch. */
attn_status attn_overlap_status(const attn_tensor *out, const attn_tensor *in, attn_overlap *result);

/* Views (views.c): out shares t's memory; dims and indices 0-based; an
 * out-of-range argument is ATTN_EARG and leaves out untouched. */
attn_status attn_view_select(const attn_tensor *t, int d, int64_t k, attn_tensor *out);
attn_status attn_view_narrow(const attn_tensor *t, int d, int64_t start, int64_t len, attn_tensor *out);
attn_status attn_view_transpose(const attn_tensor *t, int a, int b, attn_tensor *out);
attn_status attn_view_permute(const attn_tensor *t, const int *dims, attn_tensor *out);
attn_status attn_view_unsqueeze(const attn_tensor *t, int d, attn_tensor *out);
attn_status attn_view_squeeze(const attn_tensor *t, int d, attn_tensor *out);

/* Element pointer at a multi-index (0-based). */
float *attn_at(const attn_tensor *t, const int64_t *index);

#endif
