/* Rotary position embedding, forward and backward (src/core/rope.h).
 *
 * Algorithm, x [R, n, E] (R = the leading dims flattened, any strides):
 *   cos, sin [n, E/2]: theta(r, i) = (positions[r] - 1) * base^(-2i/E), in
 *     double (a float32 angle at position 4096 would be off by ~2e-4 rad, as
 *     torch's float32 tables are), rounded to float32 once;
 *   out[., r, a_i] = x_a cos - x_b sin,  out[., r, b_i] = x_b cos + x_a sin
 *     (sin negated for the inverse), with (a_i, b_i) = (i, i + E/2) for
 *     "half" and (2i, 2i + 1) for "interleaved".
 * Contract: out contiguous and not overlapping x; every element written.
 * Error: two float32 products and one sum per element after float32 tables:
 * max |out - float64 reference| = 2.4e-7 over the PyTorch fixtures of
 * spec/rope_spec.lua (|x| up to ~4, positions up to 4094).
 * Threads: rows are independent and each element is one fixed expression,
 * so the bits do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "rope.h"
#include "threads.h"

attn_status attn_rope(const attn_tensor *x, const double *positions, double base, attn_rope_style style, int inverse,
                      attn_tensor *out) {
  char b1[200], b2[200];
  if (x->ndim < 2)
    return attn_fail(ATTN_ESHAPE, "x must have at least 2 dims ([..., n, E]), got %s", attn_shape_str(x, b1, sizeof b1));
  int nd = x->ndim;
  int64_t n = x->size[nd - 2], e = x->size[nd - 1];
  if (e % 2 != 0)
    return attn_fail(ATTN_ESHAPE, "x %s must have an even last dim E (rotated in pairs), got %lld",
                     attn_shape_str(x, b1, sizeof b1), (long long)e);
  if (!(base > 0.0) || !isfinite(base)) return attn_fail(ATTN_EARG, "base must be a finite number > 0, got %g", base);
  if (out->ndim != nd || !attn_is_contiguous(out) || memcmp(out->size, x->size, (size_t)nd * sizeof(int64_t)) != 0)
    return attn_fail(ATTN_ESHAPE, "out must be contiguous %s, got %s", attn_shape_str(x, b1, sizeof b1),
                     attn_shape_str(out, b2, sizeof b2));
  for (int64_t r = 0; r < n; r++)
    if (!isfinite(positions[r]))
      return attn_fail(ATTN_EARG, "positions must be finite, got %g at %lld", positions[r], (long long)r + 1);
  int64_t rows = attn_sizes_product(nd - 2, x->size), half = e / 2;
  if (rows == 0 || n == 0 || e == 0) return ATTN_OK;

  /* cos, sin [n, E/2] */
  float *cs = malloc((size_t)(2 * n * half) * sizeof(float));
  if (!cs) return attn_fail(ATTN_ENOMEM, "cannot allocate the rotary tables (%lld x %lld)", (long long)n, (long long)e);
  float *sn = cs + n * half;
  for (int64_t i = 0; i < half; i++) {
    double inv_freq = pow(base, -(double)(2 * i) / (double)e);
    for (int64_t r = 0; r < n; r++) {
      double theta = (positions[r] - 1.0) * inv_freq;
      cs[r * half + i] = (float)cos(theta);
      sn[r * half + i] = (float)(inverse ? -sin(theta) : sin(theta));
    }
  }
  int64_t sa = style == ATTN_ROPE_HALF ? 1 : 2;    /* stride of pair i's first element, in elements */
  int64_t ob = style == ATTN_ROPE_HALF ? half : 1; /* offset of its second element */
  int64_t xs_r = x->stride[nd - 2], xs_e = x->stride[nd - 1];
  int64_t items = rows * n;
  int nthreads = attn_threads_for(items * e >= 32768 ? items : 1); /* a team costs more than a small x */
#pragma omp parallel for num_threads(nthreads) if (nthreads > 1) schedule(static)
  for (int64_t it = 0; it < items; it++) {
    int64_t lead = it / n, r = it % n;
    /* the offset of x's row: the leading dims of `lead` */
    int64_t off = r * xs_r;
    for (int d = nd - 3; d >= 0; d--) {
      off += (lead % x->size[d]) * x->stride[d];
      lead /= x->size[d];
    }
    const float *xr = x->data + off;
    float *orow = out->data + it * e;
    const float *c = cs + r * half, *s = sn + r * half;
    for (int64_t i = 0; i < half; i++) {
      int64_t ia = i * sa, ib = ia + ob;
      float a = xr[ia * xs_e], b = xr[ib * xs_e];
      orow[ia] = a * c[i] - b * s[i];
      orow[ib] = b * c[i] + a * s[i];
    }
  }
  free(cs);
  return ATTN_OK;
}
