/* View arithmetic: new sizes and strides over the same memory, no copy.
 * Dims and indices are 0-based; the binding converts Lua's 1-based ones and
 * words its own range errors before calling, so these checks are a second
 * line (a C caller gets a status, never an out-of-range view). */
#include "tensor.h"

/* out = t with dim d removed at index k: [.., n, ..] -> [.., ..] */
attn_status attn_view_select(const attn_tensor *t, int d, int64_t k, attn_tensor *out) {
  if (d < 0 || d >= t->ndim || k < 0 || k >= t->size[d])
    return attn_fail(ATTN_EARG, "select: index %lld of dim %d is out of range", (long long)k, d);
  attn_tensor v = *t;
  v.data = t->data + k * t->stride[d];
  for (int j = d; j < t->ndim - 1; j++) {
    v.size[j] = t->size[j + 1];
    v.stride[j] = t->stride[j + 1];
  }
  v.ndim = t->ndim - 1;
  *out = v;
  return ATTN_OK;
}

/* out = elements start .. start + len - 1 of dim d: [.., n, ..] -> [.., len, ..] */
attn_status attn_view_narrow(const attn_tensor *t, int d, int64_t start, int64_t len, attn_tensor *out) {
  if (d < 0 || d >= t->ndim || start < 0 || len < 0 || start > t->size[d] || len > t->size[d] - start)
    return attn_fail(ATTN_EARG, "narrow: start %lld, length %lld out of range for dim %d", (long long)start,
                     (long long)len, d);
  attn_tensor v = *t;
  v.data = t->data + start * t->stride[d];
  v.size[d] = len;
  *out = v;
  return ATTN_OK;
}

/* out = t with dims a and b swapped */
attn_status attn_view_transpose(const attn_tensor *t, int a, int b, attn_tensor *out) {
  attn_tensor v = *t;
  if (t->ndim == 0) { /* as PyTorch: dims 0 and -1 of a 0-dim tensor name the tensor itself */
    *out = v;
    return ATTN_OK;
  }
  if (a < 0 || a >= t->ndim || b < 0 || b >= t->ndim)
    return attn_fail(ATTN_EARG, "transpose: dims %d and %d out of range", a, b);
  v.size[a] = t->size[b];
  v.size[b] = t->size[a];
  v.stride[a] = t->stride[b];
  v.stride[b] = t->stride[a];
  *out = v;
  return ATTN_OK;
}

/* out dim i = t dim dims[i], dims a permutation of 0 .. ndim-1 */
attn_status attn_view_permute(const attn_tensor *t, const int *dims, attn_tensor *out) {
  int seen[ATTN_MAX_DIMS] = {0};
  attn_tensor v = *t;
  for (int i = 0; i < t->ndim; i++) {
    if (dims[i] < 0 || dims[i] >= t->ndim || seen[dims[i]]++)
      return attn_fail(ATTN_EARG, "permute: dims are not a permutation (dim %d)", dims[i]);
    v.size[i] = t->size[dims[i]];
    v.stride[i] = t->stride[dims[i]];
  }
  *out = v;
  return ATTN_OK;
}

/* out = t with a size-1 dim inserted at d (0 <= d <= ndim) */
attn_status attn_view_unsqueeze(const attn_tensor *t, int d, attn_tensor *out) {
  if (t->ndim >= ATTN_MAX_DIMS) return attn_fail(ATTN_EARG, "at most %d dims are supported", ATTN_MAX_DIMS);
  if (d < 0 || d > t->ndim) return attn_fail(ATTN_EARG, "unsqueeze: dim %d out of range", d);
  attn_tensor v = *t;
  for (int k = t->ndim; k > d; k--) {
    v.size[k] = t->size[k - 1];
    v.stride[k] = t->stride[k - 1];
  }
  v.size[d] = 1;
  v.stride[d] = d < t->ndim ? t->size[d] * t->stride[d] : 1;
  v.ndim = t->ndim + 1;
  *out = v;
  return ATTN_OK;
}

/* out = t without its size-1 dims (only dim d when d >= 0) */
attn_status attn_view_squeeze(const attn_tensor *t, int d, attn_tensor *out) {
  if (d >= t->ndim) return attn_fail(ATTN_EARG, "squeeze: dim %d out of range", d);
  attn_tensor v = *t;
  v.ndim = 0;
  for (int k = 0; k < t->ndim; k++) {
    if (t->size[k] == 1 && (d < 0 || d == k)) continue;
    v.size[v.ndim] = t->size[k];
    v.stride[v.ndim] = t->stride[k];
    v.ndim++;
  }
  *out = v;
  return ATTN_OK;
}
