/* The driver of scripts/gemm_ab.sh: two builds of the own GEMM
 * (attn_sgemm_avx512 or attn_sgemm_avx2 of src/core/sgemm.h, renamed by
 * objcopy to gemm_a and gemm_b) timed in one process at the training step's
 * products, call by call in turn with an FMA loop, so that a shared
 * machine's slow minutes slow all three alike: each side's best of ROUNDS
 * calls per product, as a ratio to the FMA loop's best over the same flops
 * (24 chains of 16 lanes: the AVX-512 set's limit; the AVX2 set's is half).
 * Each output is also compared bit for bit between the two builds (the own
 * GEMM's bits depend on no blocking). Not part of the library. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*gemm_fn)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias);
int gemm_a(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
           int64_t ldb, float *c, int64_t ldc, const float *bias);
int gemm_b(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
           int64_t ldb, float *c, int64_t ldc, const float *bias);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* starting values the compiler cannot see, so no two chains fold into one */
static volatile float seeds[24];

/* steps x 24 fused multiply-adds of 16 lanes in independent chains */
__attribute__((noinline, target("avx512f"))) static float fma_loop(int64_t steps) {
  __m512 x[24];
#pragma GCC unroll 24
  for (int i = 0; i < 24; i++) x[i] = _mm512_set1_ps(seeds[i]);
  const __m512 a = _mm512_set1_ps(0.5f), b = _mm512_set1_ps(1.0f);
  for (int64_t s = 0; s < steps; s++)
#pragma GCC unroll 24
    for (int i = 0; i < 24; i++) x[i] = _mm512_fmadd_ps(x[i], a, b);
  __m512 t = x[0];
  for (int i = 1; i < 24; i++) t = _mm512_add_ps(t, x[i]);
  return _mm512_reduce_add_ps(t);
}

/* the step's products at 2048 tokens: x W^T, g W and g^T x of its five
 * weights [out, in] (q, k and v together, the attention's output, the
 * MLP's two, the output head) */
typedef struct product {
  const char *name;
  int64_t m, n, k;
  int ta, tb;
} product;

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 25;
  if (rounds < 1) rounds = 1;
  for (int i = 0; i < 24; i++) seeds[i] = 1.0f + 0.01f * (float)i;
  static const int64_t weights[5][2] = {{384, 128}, {128, 128}, {512, 128}, {128, 512}, {256, 128}};
  static const char *forms[3] = {"x W^T", "g W", "g^T x"};
  const int64_t tokens = 2048;
  double form_a[3] = {0}, form_b[3] = {0}, form_f[3] = {0}, all_flops = 0.0;
  int differ = 0;
  float sink = 0.0f;
  for (int f = 0; f < 3; f++)
    for (int w = 0; w < 5; w++) {
      int64_t out = weights[w][0], in = weights[w][1];
      product p = f == 0   ? (product){forms[f], tokens, out, in, 0, 1}
                  : f == 1 ? (product){forms[f], tokens, in, out, 0, 0}
                           : (product){forms[f], out, in, tokens, 1, 0};
      int64_t lda = p.ta ? p.m : p.k, ldb = p.tb ? p.k : p.n;
      float *a = aligned_alloc(64, (size_t)(p.m * p.k) * sizeof(float));
      float *b = aligned_alloc(64, (size_t)(p.k * p.n) * sizeof(float));
      float *ca = aligned_alloc(64, (size_t)(p.m * p.n) * sizeof(float));
      float *cb = aligned_alloc(64, (size_t)(p.m * p.n) * sizeof(float));
      if (!a || !b || !ca || !cb) return 1;
      for (int64_t i = 0; i < p.m * p.k; i++) a[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
      for (int64_t i = 0; i < p.k * p.n; i++) b[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
      double flops = 2.0 * (double)p.m * (double)p.n * (double)p.k, ba = 1e30, bb = 1e30, bf = 1e30;
      for (int r = 0; r < rounds; r++) {
        double t = now();
        gemm_a(p.ta, p.tb, p.m, p.n, p.k, a, lda, b, ldb, ca, p.n, NULL);
        t = now() - t;
        if (t < ba) ba = t;
        t = now();
        gemm_b(p.ta, p.tb, p.m, p.n, p.k, a, lda, b, ldb, cb, p.n, NULL);
        t = now() - t;
        if (t < bb) bb = t;
        t = now();
        sink += fma_loop((int64_t)(flops / (24.0 * 32.0)));
        t = now() - t;
        if (t < bf) bf = t;
      }
      if (memcmp(ca, cb, (size_t)(p.m * p.n) * sizeof(float))) differ++;
      printf("%-6s %4lldx%-4lld  [%lld, %lld] over %lld  a %.3f  b %.3f of the FMA loop  b/a %.3f\n", p.name,
             (long long)out, (long long)in, (long long)p.m, (long long)p.n, (long long)p.k, bf / ba, bf / bb, ba / bb);
      form_a[f] += ba, form_b[f] += bb, form_f[f] += bf, all_flops += flops;
      free(a), free(b), free(ca), free(cb);
    }
  double ta = 0, tb = 0, tf = 0;
  for (int f = 0; f < 3; f++) {
    printf("%-6s all        a %.3f  b %.3f of the FMA loop  b/a %.3f\n", forms[f], form_f[f] / form_a[f],
           form_f[f] / form_b[f], form_a[f] / form_b[f]);
    ta += form_a[f], tb += form_b[f], tf += form_f[f];
  }
  printf("all              a %.3f  b %.3f of the FMA loop  b/a %.3f (the FMA loop: %.1f GFLOP/s)\n", tf / ta, tf / tb,
         ta / tb, all_flops / tf / 1e9);
  printf("%s\n", differ ? "outputs DIFFER between the builds" : "same bits in every output");
  return (int)(sink * 0.0f) + (differ ? 3 : 0);
}
