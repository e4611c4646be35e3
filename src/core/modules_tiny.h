/* What the tiny paths of the fused self-attention modules share
 * (src/core/modules.c, src/core/modules_backward_tiny.c): the softmax of one
 * short score row, inlined into their loops. */
#ifndef ATTN_MODULES_TINY_H
#define ATTN_MODULES_TINY_H

#include <math.h>
#include <stdint.h>

#include "cpu.h"

/* attn_softmax_short_row's halves, for a caller that takes the exponentials
 * of several rows in one call: attn_short_row_shift leaves s[j] = s[j] - max
 * for j < the count it returns (0: every key hidden, s unchanged), then
 * libm_exp_minus(s, count, 0) gives expf(s[j] - max) (x - 0 = x: the same
 * bits as subtracting there), and attn_short_row_inv the factor 1 / sum. */
static inline __attribute__((always_inline)) int64_t attn_short_row_shift(float *s, int64_t lk) {
  int64_t visible = lk;
  while (visible > 0 && s[visible - 1] == -INFINITY) visible--;
  float mx = -INFINITY;
  for (int64_t j = 0; j < visible; j++) {
    float v = s[j];
    if (v != v) {
      mx = v;
      visible = lk; /* NaN everywhere, the hidden keys' too */
      break;
    }
    mx = v > mx ? v : mx;
  }
  if (mx == -INFINITY) return 0; /* every key hidden (or no key): zeros, not NaN */
  for (int64_t j = 0; j < visible; j++) s[j] = s[j] - mx;
  return visible;
}

static inline __attribute__((always_inline)) float attn_short_row_inv(const float *s, int64_t visible) {
  double sum = 0.0;
  for (int64_t j = 0; j < visible; j++) sum += (double)s[j];
  return (float)(1.0 / sum);
}

/* attn_softmax_dropout_row (src/core/attention.c) without dropout, for the
 * short rows of the tiny paths: the same operations in the same order, so
 * the same bits (the max is exact in any order; a NaN row takes the first
 * NaN, as its row_max does; the exponentials are the same call), without
 * its 8-lane max. It leaves s[j] = exp(s[j] -
 * max) for j < the returned count of keys that get a weight (the others get
 * 0), and in *inv the factor 1 / sum that makes the weights s[j] * *inv;
 * it returns 0 when every key is hidden (every weight 0, the output zeros). */
static inline __attribute__((always_inline)) int64_t attn_softmax_short_row(float *s, int64_t lk, float *inv) {
  int64_t visible = attn_short_row_shift(s, lk);
  if (visible == 0) return 0;
  attn_cpu_kernels()->libm_exp_minus(s, visible, 0.0f);
  *inv = attn_short_row_inv(s, visible);
  return visible;
}

#endif
