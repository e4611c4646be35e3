/* Scaled dot-product attention, fused ("flash") kernel, FlashAttention-2
 * style. A work item is one (slice bi, block of at most BQ query rows):
 *   Qs = fl(q * scale)                          [R, E]   packed once per item
 *   m = -inf, l = 0, O = 0                      O is the item's rows of out
 *   for each key block [k0, k0 + bk), bk <= BK, in increasing k0:
 *     S = Qs K_blk^T                            [R, bk]  cblas_sgemm
 *     S += bias, hidden -> -inf; causal: only the block that crosses the
 *       diagonal is cut row by row (a row keeps its first i + 1 - k0 keys);
 *       blocks wholly above the diagonal are never visited
 *     m' = max(m, rowmax S); P = exp(S - m'); a = exp(m - m')
 *     l = a l + rowsum P; O = a O; O += P V_blk  (cblas_sgemm, beta = 1)
 *   O /= l (zeros where every key was hidden)
 *
 * The exponential is a vectorised polynomial (AVX2 + FMA, chosen at run time
 * with __builtin_cpu_supports; glibc's expf otherwise): Cody-Waite reduction
 * x = n ln2 + r, |r| <= ln2 / 2, and Cephes' degree-7 minimax polynomial for
 * e^r. Measured against double exp over every float in [-87.3, 0] (the
 * kernel's arguments are <= 0): max relative error 1.8e-7 (under 2 ulp).
 * Arguments below -87.33 (e^x < 2^-126) give 0, -inf gives 0, NaN stays NaN.
 *
 * Threads: items run in one OpenMP parallel for; each thread owns its output
 * rows and its scratch tile (allocated before the region); every cblas_sgemm
 * runs single-threaded inside the region (OpenBLAS's OpenMP build does that
 * by itself; omp_set_num_threads(1) covers a team of one). Tile sizes are
 * constants and the key blocks are visited in a fixed order: the bits of out
 * do not depend on the thread count. */
#include <cblas.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "flash.h"
#include "rng.h"

#define BQ ATTN_FLASH_BQ
#define BK ATTN_FLASH_BK

/* ---------------------------------------------------------------- exp rows */

/* Row kernels: max of s[0, n) (NaN if any is NaN, -inf if n == 0), and
 * s[j] = exp(s[j] - m) for j < n returning the sum of the new s[0, n). */
typedef float (*row_max_fn)(const float *s, int64_t n);
typedef float (*row_exp_fn)(float *s, int64_t n, float m);

static float row_max_scalar(const float *s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; j++)
    if (s[j] > mx || s[j] != s[j]) {
      mx = s[j];
      if (mx != mx) break;
    }
  return mx;
}

static float row_exp_scalar(float *s, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) {
    float x = expf(s[j] - m);
    s[j] = x;
    sum += x;
  }
  return sum;
}

#if defined(__x86_64__) || defined(__i386__)
#define FLASH_X86 1

__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f); /* ln(2^-126) */
  const __m256 hi = _mm256_set1_ps(88.37626f);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f);    /* ln2, high part (exact in n * c1) */
  const __m256 c2 = _mm256_set1_ps(-2.12194440e-4f); /* ln2 - c1 */
  __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);    /* false for NaN */
  __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x)); /* NaN passes through */
  __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, c1, xc);
  r = _mm256_fnmadd_ps(n, c2, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(tiny, y);
}

__attribute__((target("avx2,fma"))) static float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

__attribute__((target("avx2,fma"))) static float row_max_avx2(const float *s, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, bad = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256 a = _mm256_loadu_ps(s + j), b = _mm256_loadu_ps(s + j + 8);
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  m0 = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float mx = _mm_cvtss_f32(h);
  if (_mm256_movemask_ps(bad)) return NAN;
  for (; j < n; j++)
    if (s[j] > mx || s[j] != s[j]) {
      mx = s[j];
      if (mx != mx) break;
    }
  return mx;
}

__attribute__((target("avx2,fma"))) static float row_exp_avx2(float *s, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256 a = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    __m256 b = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
    _mm256_storeu_ps(s + j, a);
    _mm256_storeu_ps(s + j + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  if (j < n) { /* the tail through a masked vector pair */
    float buf[16];
    int64_t t = n - j;
    for (int64_t i = 0; i < 16; i++) buf[i] = i < t ? s[j + i] - m : -INFINITY;
    __m256 a = exp8(_mm256_loadu_ps(buf)), b = exp8(_mm256_loadu_ps(buf + 8));
    _mm256_storeu_ps(buf, a);
    _mm256_storeu_ps(buf + 8, b);
    for (int64_t i = 0; i < t; i++) s[j + i] = buf[i];
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  return hsum8(_mm256_add_ps(s0, s1));
}
#endif

static int have_avx2(void) {
#ifdef FLASH_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

const char *attn_flash_exp_impl(void) { return have_avx2() ? "avx2" : "scalar"; }

/* ---------------------------------------------------------------- context */

typedef struct flash_ctx {
  attn_sdpa_problem p;             /* the shapes and expanded operands */
  int causal;
  float scale;
  const attn_sdpa_opts *o;
  CBLAS_TRANSPOSE ktr, vtr;        /* k^T as [E, Lk] and v as [Lk, Ev], when not packed */
  int64_t ldk, ldv;
  int pack_k, pack_v;
  attn_tensor *out;
  int64_t nqblk;                   /* query blocks per slice */
  size_t off_s, off_kp, off_vp, off_m, off_l, off_f, block; /* per-thread scratch, in floats */
  row_max_fn rmax;
  row_exp_fn rexp;
} flash_ctx;

/* How a [rows, cols] matrix with strides (sr, sc) goes to row-major BLAS
 * (NoTrans with ld = sr, or Trans with ld = sc); 0 when it must be packed.
 * (The same rule as the math kernel's, for blocks of any row count.) */
static int blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, CBLAS_TRANSPOSE *tr, int64_t *ld) {
  if ((sc == 1 || cols == 1) && sr >= (cols > 1 ? cols : 1)) {
    *tr = CblasNoTrans;
    *ld = sr;
  } else if ((sr == 1 || rows == 1) && sc >= (rows > 1 ? rows : 1)) {
    *tr = CblasTrans;
    *ld = sc;
  } else {
    return 0;
  }
  return *ld >= 1 && *ld <= INT_MAX;
}

static int64_t batch_offset(const flash_ctx *c, const attn_tensor *t, int64_t bi) {
  int64_t off = 0;
  for (int d = c->p.nbatch - 1; d >= 0; d--) {
    off += (bi % c->p.batch[d]) * t->stride[d];
    bi /= c->p.batch[d];
  }
  return off;
}

/* Bias and mask of row i, keys [k0, k0 + n), onto s. */
static void bias_mask_row(const flash_ctx *c, int64_t bi, int64_t i, int64_t k0, int64_t n, float *s) {
  int nb = c->p.nbatch;
  if (c->p.has_bias) {
    const float *b = c->p.bias.data + batch_offset(c, &c->p.bias, bi) + i * c->p.bias.stride[nb];
    int64_t sb = c->p.bias.stride[nb + 1];
    b += k0 * sb;
    if (sb == 1)
      for (int64_t j = 0; j < n; j++) s[j] = s[j] + b[j];
    else
      for (int64_t j = 0; j < n; j++) s[j] = s[j] + b[j * sb];
  }
  if (c->p.has_mask) {
    const float *m = c->p.mask.data + batch_offset(c, &c->p.mask, bi) + i * c->p.mask.stride[nb];
    int64_t sm = c->p.mask.stride[nb + 1];
    m += k0 * sm;
    if (sm == 1) {
      for (int64_t j = 0; j < n; j++)
        if (m[j] != 0.0f) s[j] = -INFINITY;
    } else {
      for (int64_t j = 0; j < n; j++)
        if (m[j * sm] != 0.0f) s[j] = -INFINITY;
    }
  }
}

/* Work item `item` with the calling thread's scratch block w. */
static void run_item(const flash_ctx *c, int64_t item, float *w) {
  int64_t lq = c->p.lq, lk = c->p.lk, e = c->p.e, ev = c->p.ev;
  int64_t bi = item / c->nqblk;
  /* the last query blocks first: under causal masking they have the most keys */
  int64_t r0 = (c->nqblk - 1 - item % c->nqblk) * BQ;
  int64_t rows = lq - r0 < BQ ? lq - r0 : BQ;
  int nb = c->p.nbatch;
  float *qs = w, *s = w + c->off_s, *mrow = w + c->off_m, *lrow = w + c->off_l;
  float *o = c->out->data + (bi * lq + r0) * ev;

  const float *q = c->p.q.data + batch_offset(c, &c->p.q, bi);
  int64_t sq0 = c->p.q.stride[nb], sq1 = c->p.q.stride[nb + 1];
  float scale = c->scale;
  for (int64_t i = 0; i < rows; i++) {
    const float *qi = q + (r0 + i) * sq0;
    if (sq1 == 1)
      for (int64_t d = 0; d < e; d++) qs[i * e + d] = qi[d] * scale;
    else
      for (int64_t d = 0; d < e; d++) qs[i * e + d] = qi[d * sq1] * scale;
    mrow[i] = -INFINITY;
    lrow[i] = 0.0f;
  }
  memset(o, 0, (size_t)(rows * ev) * sizeof(float));

  /* keys [0, kend): causal rows r0 .. r0 + rows - 1 see keys up to r0 + rows - 1 */
  int64_t kend = lk;
  if (c->causal && r0 + rows < kend) kend = r0 + rows;
  const float *kb = c->p.k.data + batch_offset(c, &c->p.k, bi);
  const float *vb = c->p.v.data + batch_offset(c, &c->p.v, bi);
  int64_t sk0 = c->p.k.stride[nb], sk1 = c->p.k.stride[nb + 1];
  int64_t sv0 = c->p.v.stride[nb], sv1 = c->p.v.stride[nb + 1];

  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    int64_t bk = kend - k0 < BK ? kend - k0 : BK;
    /* S = Qs K_blk^T */
    if (e > 0) {
      const float *kp = kb + k0 * sk0;
      int64_t ldk = c->ldk;
      CBLAS_TRANSPOSE tr = c->ktr;
      if (c->pack_k) { /* K_blk^T packed as [E, bk] */
        float *p = w + c->off_kp;
        for (int64_t j = 0; j < bk; j++)
          for (int64_t d = 0; d < e; d++) p[d * bk + j] = kp[j * sk0 + d * sk1];
        kp = p;
        ldk = bk;
        tr = CblasNoTrans;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tr, (blasint)rows, (blasint)bk, (blasint)e, 1.0f, qs, (blasint)e, kp,
                  (blasint)ldk, 0.0f, s, (blasint)bk);
    } else {
      memset(s, 0, (size_t)(rows * bk) * sizeof(float));
    }
    /* online softmax, row by row */
    int any = 0;
    for (int64_t i = 0; i < rows; i++) {
      float *si = s + i * bk;
      int64_t gi = r0 + i;
      int64_t n = bk; /* keys of this block row i may see */
      if (c->causal && k0 + bk > gi + 1) n = gi + 1 - k0 > 0 ? gi + 1 - k0 : 0;
      if (c->p.has_bias || c->p.has_mask) bias_mask_row(c, bi, gi, k0, n, si);
      float mold = mrow[i];
      float mb = c->rmax(si, n);
      float mnew = mold; /* max(mold, mb), NaN winning */
      if (mold == mold && (mb != mb || mb > mold)) mnew = mb;
      if (mnew == -INFINITY) { /* nothing visible yet in this row */
        memset(si, 0, (size_t)bk * sizeof(float));
        continue;
      }
      any = 1;
      float sum = c->rexp(si, n, mnew);
      if (n < bk) memset(si + n, 0, (size_t)(bk - n) * sizeof(float));
      if (c->o->dropout_p > 0.0) {
        float *f = w + c->off_f;
        attn_dropout_factors(c->o->dropout_draw, c->o->dropout_p, (bi * lq + gi) * lk + k0, bk, f);
        for (int64_t j = 0; j < n; j++) si[j] *= f[j];
      }
      if (mnew != mold) {
        float a = expf(mold - mnew); /* 0 when mold = -inf */
        lrow[i] = lrow[i] * a + sum;
        float *oi = o + i * ev;
        for (int64_t d = 0; d < ev; d++) oi[d] *= a;
        mrow[i] = mnew;
      } else {
        lrow[i] += sum;
      }
    }
    /* O += P V_blk */
    if (any && ev > 0) {
      const float *vp = vb + k0 * sv0;
      int64_t ldv = c->ldv;
      CBLAS_TRANSPOSE tr = c->vtr;
      if (c->pack_v) {
        float *p = w + c->off_vp;
        for (int64_t j = 0; j < bk; j++)
          for (int64_t d = 0; d < ev; d++) p[j * ev + d] = vp[j * sv0 + d * sv1];
        vp = p;
        ldv = ev;
        tr = CblasNoTrans;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tr, (blasint)rows, (blasint)ev, (blasint)bk, 1.0f, s, (blasint)bk, vp,
                  (blasint)ldv, 1.0f, o, (blasint)ev);
    }
  }
  /* O /= l; rows with every key hidden are zeros */
  for (int64_t i = 0; i < rows; i++) {
    float *oi = o + i * ev;
    float l = lrow[i];
    if (mrow[i] == -INFINITY) {
      memset(oi, 0, (size_t)ev * sizeof(float));
    } else {
      for (int64_t d = 0; d < ev; d++) oi[d] = oi[d] / l;
    }
  }
}

/* acc += a * b floats; 0 on overflow. */
static int add_floats(size_t *acc, int64_t a, int64_t b) {
  size_t n;
  if (__builtin_mul_overflow((size_t)a, (size_t)b, &n) || __builtin_add_overflow(*acc, n, acc)) return 0;
  return 1;
}

int attn_sdpa_prefer_flash(int64_t nb, int64_t lq, int64_t lk, int64_t e, int64_t ev) {
  (void)nb;
  (void)e;
  (void)ev;
  /* measured crossover (scripts/bench.lua --cases crossover on a 2-core Zen 3):
   * the math kernel is as fast or faster while a slice's scores fit in a few
   * tiles; past that the fused kernel wins and its memory stays O(tile) */
  return lk > 2 * BK / 4 && lq * lk >= 64 * 1024;
}

attn_status attn_sdpa_flash(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_sdpa_opts *opts, attn_tensor *out) {
  flash_ctx c;
  memset(&c, 0, sizeof c);
  attn_status st = attn_sdpa_prepare(q, k, v, opts, out, NULL, &c.p);
  if (st != ATTN_OK) return st;
  c.o = opts;
  c.scale = opts->scale;
  c.causal = opts->is_causal;
  c.out = out;

  int64_t nb = attn_sizes_product(c.p.nbatch, c.p.batch);
  if (nb == 0 || c.p.lq == 0 || c.p.ev == 0) return ATTN_OK;

  int nbd = c.p.nbatch;
  int64_t kbmax = c.p.lk < BK ? c.p.lk : BK; /* the most keys of a block */
  c.pack_k = !blas_layout(c.p.e, kbmax, c.p.k.stride[nbd + 1], c.p.k.stride[nbd], &c.ktr, &c.ldk);
  c.pack_v = !blas_layout(kbmax, c.p.ev, c.p.v.stride[nbd], c.p.v.stride[nbd + 1], &c.vtr, &c.ldv);
  if (have_avx2()) {
#ifdef FLASH_X86
    c.rmax = row_max_avx2;
    c.rexp = row_exp_avx2;
#endif
  } else {
    c.rmax = row_max_scalar;
    c.rexp = row_exp_scalar;
  }

  /* per-thread block: qs [BQ, E], s [BQ, BK], kp [E, BK], vp [BK, Ev], m [BQ], l [BQ], f [BK] */
  int64_t rb = c.p.lq < BQ ? c.p.lq : BQ;
  c.nqblk = (c.p.lq + BQ - 1) / BQ;
  size_t block = 0;
  int ok = add_floats(&block, rb, c.p.e);
  c.off_s = block;
  ok = ok && add_floats(&block, rb, BK);
  c.off_kp = block;
  if (c.pack_k) ok = ok && add_floats(&block, c.p.e, BK);
  c.off_vp = block;
  if (c.pack_v) ok = ok && add_floats(&block, BK, c.p.ev);
  c.off_m = block;
  ok = ok && add_floats(&block, rb, 1);
  c.off_l = block;
  ok = ok && add_floats(&block, rb, 1);
  c.off_f = block;
  ok = ok && add_floats(&block, BK, 1);
  ok = ok && add_floats(&block, 16, 1); /* keeps the next thread's block 64-byte aligned */
  block &= ~(size_t)15;
  c.block = block;

  int64_t items;
  if (__builtin_mul_overflow(nb, c.nqblk, &items))
    return attn_fail(ATTN_EOVERFLOW, "too many attention rows (%lld slices of %lld)", (long long)nb, (long long)c.p.lq);
  int nthreads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (nthreads < 1) nthreads = 1;
  if (items < nthreads) nthreads = (int)items;
  size_t total = 0, bytes;
  ok = ok && add_floats(&total, (int64_t)block, nthreads);
  if (!ok || __builtin_mul_overflow(total, sizeof(float), &bytes))
    return attn_fail(ATTN_ENOMEM, "the attention scratch size overflows (E %lld, Ev %lld)", (long long)c.p.e,
                     (long long)c.p.ev);
  float *scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  if (!scratch) return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes of attention scratch", bytes);

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    omp_set_num_threads(1);
    float *w = scratch + block * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) run_item(&c, it, w);
  }
  free(scratch);
  return ATTN_OK;
}
