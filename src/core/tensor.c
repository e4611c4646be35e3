/* Shape bookkeeping shared by every kernel, and the core's error channel. */
#include "tensor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[512];

const char *attn_error_message(void) { return error_message; }

attn_status attn_fail(attn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, ap);
  va_end(ap);
  return status;
}

const char *attn_sizes_str(int ndim, const int64_t *size, char *buf, size_t len) {
  size_t used = 0;
  if (len == 0) return buf;
  buf[0] = '\0';
  used += (size_t)snprintf(buf + used, len - used, "[");
  for (int d = 0; d < ndim && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, d ? ", %lld" : "%lld", (long long)size[d]);
  if (used < len) snprintf(buf + used, len - used, "]");
  return buf;
}

const char *attn_shape_str(const attn_tensor *t, char *buf, size_t len) {
  return attn_sizes_str(t->ndim, t->size, buf, len);
}

attn_status attn_numel_checked(int ndim, const int64_t *size, int64_t *numel) {
  int64_t n = 1;
  int empty = 0;
  for (int d = 0; d < ndim; d++) {
    if (size[d] < 0) return attn_fail(ATTN_EARG, "size %lld is negative", (long long)size[d]);
    if (size[d] == 0) empty = 1;
  }
  if (empty) { *numel = 0; return ATTN_OK; }
  /* bytes must fit in both int64_t and size_t */
  const int64_t limit = (int64_t)((SIZE_MAX / sizeof(float) < (uint64_t)INT64_MAX / sizeof(float))
                                      ? SIZE_MAX / sizeof(float)
                                      : (uint64_t)INT64_MAX / sizeof(float));
  for (int d = 0; d < ndim; d++) {
    if (n > limit / size[d]) {
      char buf[200];
      double bytes = (double)sizeof(float);
      for (int k = 0; k < ndim; k++) bytes *= (double)size[k];
      return attn_fail(ATTN_EOVERFLOW,
                       "size %s has too many elements: %.4g bytes requested, more than the %lld bytes "
                       "a size can express (the byte count overflows)",
                       attn_sizes_str(ndim, size, buf, sizeof buf), bytes, (long long)(limit * (int64_t)sizeof(float)));
    }
    n *= size[d];
  }
  *numel = n;
  return ATTN_OK;
}

int64_t attn_sizes_product(int ndim, const int64_t *size) {
  /* an empty shape may have other sizes whose product overflows ([0, 2^62, 2^62]) */
  for (int d = 0; d < ndim; d++)
    if (size[d] == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n = n > INT64_MAX / size[d] ? INT64_MAX : n * size[d];
  return n;
}

int64_t attn_numel(const attn_tensor *t) { return attn_sizes_product(t->ndim, t->size); }

int attn_is_contiguous(const attn_tensor *t) {
  int64_t expected = 1;
  if (attn_numel(t) == 0) return 1; /* before any product of the other sizes, which may overflow */
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->size[d] != 1 && t->stride[d] != expected) return 0;
    expected *= t->size[d];
  }
  return 1;
}

int attn_same_shape(const attn_tensor *a, const attn_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->size[d] != b->size[d]) return 0;
  return 1;
}

void attn_contiguous_strides(int ndim, const int64_t *size, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    int64_t n = size[d] > 0 ? size[d] : 1;
    /* only an empty tensor gets here with a product past int64 (its strides are never used) */
    s = s > INT64_MAX / n ? INT64_MAX : s * n;
  }
}

attn_tensor attn_make(float *data, int ndim, const int64_t *size) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.ndim = ndim;
  for (int d = 0; d < ndim; d++) t.size[d] = size[d];
  attn_contiguous_strides(ndim, size, t.stride);
  return t;
}

attn_status attn_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb,
                                 int *out_ndim, int64_t *out_size) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = na - n + i, ib = nb - n + i;
    int64_t a = ia >= 0 ? sa[ia] : 1, b = ib >= 0 ? sb[ib] : 1;
    if (a != b && a != 1 && b != 1) {
      char bufa[200], bufb[200];
      return attn_fail(ATTN_ESHAPE, "shapes %s and %s cannot be broadcast (%lld ~= %lld at dim %d)",
                       attn_sizes_str(na, sa, bufa, sizeof bufa), attn_sizes_str(nb, sb, bufb, sizeof bufb),
                       (long long)a, (long long)b, i + 1);
    }
    out_size[i] = a == 1 ? b : a;
  }
  *out_ndim = n;
  return ATTN_OK;
}

attn_status attn_expand(const attn_tensor *t, int ndim, const int64_t *size, attn_tensor *out) {
  attn_tensor r;
  if (ndim < t->ndim) {
    char bufa[200], bufb[200];
    return attn_fail(ATTN_ESHAPE, "cannot expand %s to %s (fewer dims)", attn_shape_str(t, bufa, sizeof bufa),
                     attn_sizes_str(ndim, size, bufb, sizeof bufb));
  }
  memset(&r, 0, sizeof r);
  r.data = t->data;
  r.ndim = ndim;
  r.is_bool = t->is_bool;
  for (int i = 0; i < ndim; i++) {
    int it = t->ndim - ndim + i;
    if (it < 0) {
      r.size[i] = size[i];
      r.stride[i] = 0;
    } else if (t->size[it] == size[i]) {
      r.size[i] = size[i];
      r.stride[i] = size[i] == 1 ? 0 : t->stride[it];
    } else if (t->size[it] == 1) {
      r.size[i] = size[i];
      r.stride[i] = 0;
    } else {
      char bufa[200], bufb[200];
      return attn_fail(ATTN_ESHAPE, "cannot expand %s to %s (%lld ~= %lld at dim %d)",
                       attn_shape_str(t, bufa, sizeof bufa), attn_sizes_str(ndim, size, bufb, sizeof bufb),
                       (long long)t->size[it], (long long)size[i], i + 1);
    }
  }
  *out = r;
  return ATTN_OK;
}

/* PyTorch's computeStride: split or merge runs of dims that are contiguous
 * among themselves. */
int attn_view_strides(const attn_tensor *t, int ndim, const int64_t *size, int64_t *stride) {
  int64_t numel = attn_numel(t);
  if (numel == 0 || t->ndim == 0) { /* every view size is then 0 or 1 */
    attn_contiguous_strides(ndim, size, stride);
    return 1;
  }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->ndim ? t->stride[t->ndim - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int tensor_d = t->ndim - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= t->size[tensor_d];
    if (tensor_d == 0 ||
        (t->size[tensor_d - 1] != 1 && t->stride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || size[view_d] == 1)) {
        stride[view_d] = view_numel * chunk_base_stride;
        view_numel *= size[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return 0;
      if (tensor_d > 0) {
        chunk_base_stride = t->stride[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return 0;
  return 1;
}

float *attn_at(const attn_tensor *t, const int64_t *index) {
  float *p = t->data;
  for (int d = 0; d < t->ndim; d++) p += index[d] * t->stride[d];
  return p;
}

int attn_has_internal_overlap(const attn_tensor *t) {
  int64_t size[ATTN_MAX_DIMS], stride[ATTN_MAX_DIMS];
  int n = 0;
  if (attn_numel(t) <= 1) return 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->size[d] == 1) continue;
    int64_t s = t->stride[d] < 0 ? -t->stride[d] : t->stride[d];
    if (s == 0) return 1;
    int k = n++; /* insertion by increasing stride */
    while (k > 0 && stride[k - 1] > s) {
      size[k] = size[k - 1];
      stride[k] = stride[k - 1];
      k--;
    }
    size[k] = t->size[d];
    stride[k] = s;
  }
  /* each stride must step past everything the smaller ones reach */
  int64_t reach = 0;
  for (int k = 0; k < n; k++) {
    if (stride[k] <= reach) return 1;
    reach += stride[k] * (size[k] - 1);
  }
  return 0;
}

/* Lowest and highest element address of a non-empty t. */
static void address_range(const attn_tensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t min_off = 0, max_off = 0;
  for (int d = 0; d < t->ndim; d++) {
    int64_t reach = t->stride[d] * (t->size[d] - 1);
    if (reach < 0) min_off += reach;
    else max_off += reach;
  }
  *lo = (uintptr_t)(t->data + min_off);
  *hi = (uintptr_t)(t->data + max_off);
}

/* Calls visit(addr) for every distinct element address of t (stride-0 and
 * size-1 dims walked once) until it returns nonzero; returns that value. */
static int each_address(const attn_tensor *t, int (*visit)(uintptr_t addr, void *ctx), void *ctx) {
  int64_t size[ATTN_MAX_DIMS], stride[ATTN_MAX_DIMS], idx[ATTN_MAX_DIMS] = {0};
  int n = 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->size[d] > 1 && t->stride[d] != 0) {
      size[n] = t->size[d];
      stride[n++] = t->stride[d];
    }
  const float *p = t->data;
  for (;;) {
    int r = visit((uintptr_t)p, ctx);
    if (r) return r;
    int d = n - 1;
    for (; d >= 0; d--) {
      p += stride[d];
      if (++idx[d] < size[d]) break;
      p -= stride[d] * size[d];
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}

typedef struct bitmap_ctx {
  uintptr_t lo, hi;
  unsigned char *bits;
} bitmap_ctx;

static int mark_address(uintptr_t addr, void *vctx) {
  bitmap_ctx *c = vctx;
  if (addr >= c->lo && addr <= c->hi) {
    size_t i = (addr - c->lo) / sizeof(float);
    c->bits[i / 8] |= (unsigned char)(1u << (i % 8));
  }
  return 0;
}

static int marked_address(uintptr_t addr, void *vctx) {
  const bitmap_ctx *c = vctx;
  if (addr < c->lo || addr > c->hi) return 0;
  size_t i = (addr - c->lo) / sizeof(float);
  return (c->bits[i / 8] >> (i % 8)) & 1;
}

attn_status attn_overlap_status(const attn_tensor *out, const attn_tensor *in, attn_overlap *result) {
  attn_tensor e;
  attn_status st = attn_expand(in, out->ndim, out->size, &e);
  if (st != ATTN_OK) return st;
  *result = ATTN_OVERLAP_NONE;
  if (attn_numel(out) == 0) return ATTN_OK;
  uintptr_t out_lo, out_hi, in_lo, in_hi;
  address_range(out, &out_lo, &out_hi);
  address_range(&e, &in_lo, &in_hi);
  if (in_hi < out_lo || out_hi < in_lo) return ATTN_OK;
  int same = e.data == out->data;
  for (int d = 0; d < out->ndim && same; d++) same = out->size[d] == 1 || e.stride[d] == out->stride[d];
  if (same) {
    *result = ATTN_OVERLAP_FULL;
    return ATTN_OK;
  }
  /* the ranges meet: compare the element sets over the common range */
  bitmap_ctx c = {in_lo > out_lo ? in_lo : out_lo, in_hi < out_hi ? in_hi : out_hi, NULL};
  size_t floats = (c.hi - c.lo) / sizeof(float) + 1;
  c.bits = calloc(floats / 8 + 1, 1);
  if (!c.bits)
    return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes to compare the memory of two overlapping views",
                     floats / 8 + 1);
  each_address(out, mark_address, &c);
  if (each_address(&e, marked_address, &c)) *result = ATTN_OVERLAP_PARTIAL;
  free(c.bits);
  return ATTN_OK;
}
