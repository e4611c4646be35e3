/* The segments of a band (src/core/cpu.h: gemm_t_band, softmax_band,
 * gemm_t_rescale_band): nv (<= 4) vectors of 16 rows, vector v over its own
 * keys [kb[v], ke[v]) (empty where kb[v] >= ke[v]). The ranges' ends, sorted,
 * cut the keys into at most 7 segments; in each, the same vectors are
 * active. The 16-row sets (scalar, AVX2) run a band vector by vector with
 * their 16-row entries; the AVX-512 set runs each segment with its active
 * vectors side by side. With ATTN_BAND_BY_VECTOR defined, the 16-row sets'
 * band entries and their element-by-element transposed copy (cpu.h's
 * transpose) follow. Included by the kernel files; not a public header. */
#ifndef ATTN_KERNEL_BAND_H
#define ATTN_KERNEL_BAND_H

#include <stdint.h>

typedef struct band_segs {
  int n;
  int64_t s0[8], s1[8];
  unsigned act[8]; /* bit v: vector v sees every key of [s0, s1) */
} band_segs;

static inline void band_segments(int nv, const int64_t *kb, const int64_t *ke, band_segs *sg) {
  int64_t pts[8];
  int np = 0;
  for (int v = 0; v < nv; v++) {
    if (kb[v] >= ke[v]) continue;
    pts[np++] = kb[v];
    pts[np++] = ke[v];
  }
  for (int i = 1; i < np; i++) /* insertion sort: at most 8 points */
    for (int j = i; j > 0 && pts[j - 1] > pts[j]; j--) {
      int64_t x = pts[j];
      pts[j] = pts[j - 1];
      pts[j - 1] = x;
    }
  sg->n = 0;
  for (int i = 0; i + 1 < np; i++) {
    if (pts[i] == pts[i + 1]) continue;
    unsigned act = 0;
    for (int v = 0; v < nv; v++)
      if (kb[v] < ke[v] && kb[v] <= pts[i] && pts[i + 1] <= ke[v]) act |= 1u << v;
    if (!act) continue;
    sg->s0[sg->n] = pts[i];
    sg->s1[sg->n] = pts[i + 1];
    sg->act[sg->n] = act;
    sg->n++;
  }
}

#ifdef ATTN_BAND_BY_VECTOR
/* The 16-row sets: vector by vector with the set's own 16-row entries
 * (gemm_t, softmax_step16, gemm_t_rescale), so a band gives each vector the
 * bits those give it over its keys. */
static void gemm_t_band(const float *a, int64_t lda, int64_t kn, int nv, const int64_t *kb, const int64_t *ke,
                        const float *b, int64_t bsk, int64_t bsc, float *c, int64_t ldc) {
  for (int v = 0; v < nv; v++)
    if (kb[v] < ke[v])
      gemm_t(a + 16 * v, lda, kn, 16, b + kb[v] * bsc, bsk, bsc, ke[v] - kb[v], c + kb[v] * ldc + 16 * v, ldc, 0);
}

static void softmax_band(float *st, int64_t ld, int nv, const int64_t *kb, const int64_t *ke, float *m, float *l,
                         float *rescale) {
  for (int v = 0; v < nv; v++)
    if (kb[v] < ke[v])
      softmax_step16(st + kb[v] * ld + 16 * v, ld, ke[v] - kb[v], m + 16 * v, l + 16 * v, rescale + 16 * v);
}

static void gemm_t_rescale_band(const float *a, int64_t lda, int nv, const int64_t *kb, const int64_t *ke,
                                const float *b, int64_t bsk, int64_t bsc, int64_t n, float *c, int64_t ldc,
                                const float *rs) {
  for (int v = 0; v < nv; v++)
    if (kb[v] < ke[v])
      gemm_t_rescale(a + kb[v] * lda + 16 * v, lda, ke[v] - kb[v], 16, b + kb[v] * bsk, bsk, bsc, n, c + 16 * v, ldc,
                     rs + 16 * v);
}

/* The transposed copy, element by element. */
static void transpose(const float *src, int64_t s0, int64_t s1, int64_t rows, int64_t cols, float *dst, int64_t ld,
                      float scale) {
  for (int64_t c = 0; c < cols; c++)
    for (int64_t r = 0; r < rows; r++) dst[c * ld + r] = src[r * s0 + c * s1] * scale;
}
#endif

#endif
