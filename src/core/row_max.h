/* The maximum of a contiguous row of floats as the softmax rows take it
 * (src/core/attention.c's math kernel, src/core/reduce.c's attn.softmax):
 * included by them; not a public header. */
#ifndef ATTN_ROW_MAX_H
#define ATTN_ROW_MAX_H

#include <math.h>
#include <stdint.h>

/* The row's max, or its first NaN: eight independent running maxima (a
 * chain the compiler can keep in vector registers, where one max with a NaN
 * test per element was a branchy serial chain), NaN found by a separate OR;
 * only a row holding a NaN is walked again for the first one. The order of
 * the maxima does not matter: the max of floats is exact, and a -0 against a
 * +0 gives the same exp(s - max) and lse (and log_softmax's s - max - lse,
 * nonzero where two zeros make lse >= log 2). */
static inline float attn_row_max(const float *s, int64_t n) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int nan = 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) {
      float v = s[j + l];
      nan |= v != v;
      m[l] = v > m[l] ? v : m[l];
    }
  for (; j < n; j++) {
    nan |= s[j] != s[j];
    m[0] = s[j] > m[0] ? s[j] : m[0];
  }
  if (nan)
    for (j = 0; j < n; j++)
      if (s[j] != s[j]) return s[j];
  float mx = m[0];
  for (int l = 1; l < 8; l++) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

#endif
