/* Runtime CPU dispatch of the flash kernel's inner loops. The micro-kernel
 * (both products of a key block), the exponential and the online-softmax step
 * live in one file per instruction set (src/core/kernels_scalar.c, kernels_avx2.c,
 * kernels_avx512.c); only those files are compiled with -m flags, so the rest
 * of the core runs on any CPU of the architecture. One set is chosen once,
 * from cpuid or ATTN_CPU, and every later call uses it: the bits of a result
 * depend on the choice (each within 2e-6 relative of the others), never on
 * the thread count. */
#ifndef ATTN_CPU_H
#define ATTN_CPU_H

#include <stdint.h>

#include "tensor.h"

/* Query rows of a softmax group and of the padded tiles (the flash kernel's
 * BQ is a multiple of it). */
#define ATTN_KERNEL_ROWS 16

typedef struct attn_flash_kernels {
  const char *name; /* "scalar", "avx2", "avx512" */
  /* C [n, rows_p] (leading dimension ldc) (+)= B^T A: for each column c < n and
   * padded row r < rows_p (a multiple of 16), C[c * ldc + r] (+)= sum over
   * k < kn of A[k * lda + r] * B[k * bsk + c * bsc]. accumulate: add to C,
   * else overwrite it. The order of every sum is fixed by (kn, rows_p, n). */
  void (*gemm_t)(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk, int64_t bsc,
                 int64_t n, float *c, int64_t ldc, int accumulate);
  /* gemm_t with C [c * ldc + r] = rs[r] C[c * ldc + r] + sum (the product
   * rounded, then the sum added: the bits of scaling C first, then calling
   * gemm_t with accumulate = 1), for r < rows_p: the flash forward's update
   * of its output rows, fused into the product's stores. */
  void (*gemm_t_rescale)(const float *a, int64_t lda, int64_t kn, int64_t rows_p, const float *b, int64_t bsk,
                         int64_t bsc, int64_t n, float *c, int64_t ldc, const float *rs);
  /* One online-softmax step of 16 query rows over bk keys: st [bk][ld] holds
   * their scores (row r at st[j * ld + r]); m and l are the rows' running max
   * and sum. On return st holds p = exp(s - m') / l' (already divided by the
   * new sum, so the output accumulator stays within max |v|), m = m', l = l',
   * and rescale = exp(m - m') l / l', the factor for the output so far.
   * Rows with nothing visible yet get p = 0, rescale = 0; a NaN score makes
   * its row NaN. */
  void (*softmax_step16)(float *st, int64_t ld, int64_t bk, float *m, float *l, float *rescale);
  /* softmax_step16 for rows_p (a multiple of 16) rows: each group of 16 rows
   * gets the bits softmax_step16 gives it (a set may run groups side by side). */
  void (*softmax_step)(float *st, int64_t ld, int64_t bk, int64_t rows_p, float *m, float *l, float *rescale);
  /* x[j] = exp(x[j] - m) for j < n, with the set's exponential (the flash
   * backward's probabilities from the log-sum-exp m, finite; x - m about <= 0,
   * -inf gives 0). */
  void (*exp_minus)(float *x, int64_t n, float m);
  /* Decoding (src/core/flash_decode.c; src/core/kernel_decode.h): few query
   * rows, each K and V row read once, scores row-major (keys contiguous).
   * rows_dot: st[r * ld + j] = sum over d < e of q[r * e + d] * k[j * sk + d],
   * for r < rows, j < kn (K rows contiguous). softmax_row: softmax_step16's
   * step for one row of n scores s[0, n) (m, l, rescale: that row's).
   * rows_axpy: o[r * ev + d] += sum over j < kn (increasing) of
   * p[r * ld + j] * v[j * sv + d], for r < rows, d < ev (V rows contiguous).
   * Every sum's order is fixed by the sizes. */
  void (*rows_dot)(const float *q, int64_t rows, int64_t e, const float *k, int64_t sk, int64_t kn, float *st,
                   int64_t ld);
  void (*softmax_row)(float *s, int64_t n, float *m, float *l, float *rescale);
  void (*rows_axpy)(const float *p, int64_t ld, int64_t rows, const float *v, int64_t sv, int64_t kn, int64_t ev,
                    float *o);
  /* The FMA throughput loop (attn_cpu_fma_peak): x holds fma_lanes floats,
   * independent chains of the set's widest vectors, enough of them to cover
   * FMA latency x ports; each lane steps n times through x = x * a + b (one
   * fused step in the AVX2 and AVX-512 sets; the scalar set, built without
   * fused products, rounds the product and the sum). */
  int fma_lanes;
  void (*fma_chains)(float *x, int64_t n, float a, float b);
  /* A band: the partly visible key blocks of the flash forward (a window's
   * ends, the causal diagonal). nv (<= 4) vectors of 16 rows (rows 16 v to
   * 16 v + 15), vector v over its own keys [kb[v], ke[v]) (kb[v] >= ke[v]:
   * empty, that vector is not touched); keys are counted from st's, b's or
   * a's first row as in the 16-row entries above. For each vector v with
   * keys, the bits of:
   * gemm_t_band: gemm_t (accumulate 0) of its rows over its key columns,
   *   C[j * ldc + 16 v + r] = sum over k < kn of A[k * lda + 16 v + r]
   *   B[k * bsk + j * bsc], kb[v] <= j < ke[v];
   * softmax_band: softmax_step16 of its rows over its keys (st + kb[v] ld +
   *   16 v, ke[v] - kb[v] keys; m, l, rescale + 16 v);
   * gemm_t_rescale_band: gemm_t_rescale of its rows with the keys as the
   *   sum's k, C[c * ldc + 16 v + r] = rs[16 v + r] C[...] + sum over
   *   kb[v] <= k < ke[v] of A[k * lda + 16 v + r] B[k * bsk + c * bsc], c < n.
   * The rest of C and st is not touched. */
  void (*gemm_t_band)(const float *a, int64_t lda, int64_t kn, int nv, const int64_t *kb, const int64_t *ke,
                      const float *b, int64_t bsk, int64_t bsc, float *c, int64_t ldc);
  void (*softmax_band)(float *st, int64_t ld, int nv, const int64_t *kb, const int64_t *ke, float *m, float *l,
                       float *rescale);
  void (*gemm_t_rescale_band)(const float *a, int64_t lda, int nv, const int64_t *kb, const int64_t *ke,
                              const float *b, int64_t bsk, int64_t bsc, int64_t n, float *c, int64_t ldc,
                              const float *rs);
  /* dst[c * ld + r] = src[r * s0 + c * s1] * scale for r < rows, c < cols,
   * one rounded product per element (the same bits in every set): the flash
   * forward's transposed load of q (times the scale, as attn_sdpa_load_q)
   * and its store of out (scale 1). */
  void (*transpose)(const float *src, int64_t s0, int64_t s1, int64_t rows, int64_t cols, float *dst, int64_t ld,
                    float scale);
  /* x[j] = expf(x[j] - m) for j < n (the difference rounded to float), with
   * glibc's bits (src/core/expf_glibc.h; the scalar set calls expf): the
   * softmax rows of the math kernel, the tiny module paths, attn.softmax,
   * t:exp(), t:sigmoid() and score_mod's exp and sigmoid, vectorised where a
   * set can. */
  void (*libm_exp_minus)(float *x, int64_t n, float m);
} attn_flash_kernels;

/* The kernel sets built in: the x86-64 ones only on x86-64. */
extern const attn_flash_kernels attn_kernels_scalar;
#if defined(__x86_64__)
extern const attn_flash_kernels attn_kernels_avx2;
extern const attn_flash_kernels attn_kernels_avx512;
#endif

/* Choose the kernel set once. choice: NULL, "" or "auto" picks the best the
 * CPU runs; "scalar", "avx2" or "avx512" forces one. An unknown name or one
 * this CPU (or build) lacks: ATTN_EARG with a message naming the choices,
 * and nothing is chosen. Calling it again after a successful choice returns
 * ATTN_OK only for the same choice. */
attn_status attn_cpu_select(const char *choice);

/* The chosen set (the best available one if attn_cpu_select was never
 * called: C hosts and the fuzz harness need not call it). Thread-safe. */
const attn_flash_kernels *attn_cpu_kernels(void);

/* The names of the sets this CPU and build can run, best last, NULL-ended. */
const char *const *attn_cpu_available(void);

/* The ATTN_CPU value that forced the choice, or NULL when it was automatic. */
const char *attn_cpu_forced(void);

/* The FP32 multiply-add throughput of the chosen kernel set, measured over
 * OpenMP threads: each thread runs the set's fma_chains on its own lanes.
 * The steps per round are doubled from 2^16 until the faster of two rounds
 * takes round_seconds (this also warms the units up); then `rounds` timed
 * rounds, the best one kept. */
typedef struct attn_fma_peak {
  double gflops;   /* 2 flops per lane step, all threads, best round */
  double seconds;  /* wall time of the best round */
  double checksum; /* the sum of every final lane (so no loop is optimised away) */
  int64_t steps;   /* steps per lane in a round */
  int threads;     /* threads that ran */
  int lanes;       /* lanes per thread */
} attn_fma_peak;

/* threads <= 0: OpenMP's maximum. round_seconds > 0, rounds >= 1. */
attn_fma_peak attn_cpu_fma_peak(double round_seconds, int rounds, int threads);

/* The kernel set named `name` if this CPU and build run it, else NULL. */
const attn_flash_kernels *attn_cpu_kernels_named(const char *name);

/* Whether the CPU's AVX-512 runs 512-bit FMAs at full width (two 512-bit
 * FMA ports) rather than as two 256-bit halves: inferred from cpuid, not
 * measured. AMD family 0x19 (Zen 4): no; 0x1A (Zen 5) and later: yes; Intel
 * with AVX-512F: yes (its server cores have two ports; the few one-port
 * parts are not told apart). 0 where AVX-512F is not available. */
int attn_cpu_avx512_full_width(void);

/* For a function whose fmaf calls are hot (the RNG's fills, the tiny module
 * path): the core is built without -mfma, so fmaf is a call into glibc (an
 * ifunc, hardware FMA where the CPU has it, but a call per element: rand and
 * the tiny forward took 1.7x and 2x as long). This adds a clone compiled for
 * FMA, where fmaf is one instruction, chosen at load by cpuid; the bits are
 * the same (fmaf rounds once either way). x86-64 GCC only (clang 14 names
 * the clones of an external function so that other files cannot link it;
 * the fuzz build, with clang, calls glibc's fmaf). */
#if defined(__x86_64__) && !defined(__FMA__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define ATTN_FMA_CLONES
#endif

#endif
