/* PyTorch 1.13 CPU random numbers, bit for bit: MT19937 as torch seeds it,
 * float32 uniforms, the two randn paths (scalar cached Box-Muller and the
 * 16-lane AVX2-kernel path with its Cephes log/sincos, FMA steps explicit),
 * and the two dropout mask streams (MKL-style and default). Section numbers refer to torch-rng.md.
 * Compiled with -ffp-contract=off: every fused multiply-add below is an
 * explicit fmaf, every other operation rounds on its own. */
#include "cpu.h"
#include "rng.h"

#include <math.h>
#include <string.h>

#include "threads.h"

/* ---- §1 MT19937 ---------------------------------------------------------- */

void attn_rng_seed(attn_generator *g, uint64_t seed) {
  g->seed = seed;
  g->mt[0] = (uint32_t)(seed & 0xFFFFFFFFu);
  for (int i = 1; i < ATTN_MT_N; i++)
    g->mt[i] = 1812433253u * (g->mt[i - 1] ^ (g->mt[i - 1] >> 30)) + (uint32_t)i;
  g->index = ATTN_MT_N;
  g->has_normal = 0;
  g->normal = 0.0;
}

static void twist(attn_generator *g) {
  uint32_t *mt = g->mt;
  for (int k = 0; k < ATTN_MT_N; k++) {
    uint32_t y = (mt[k] & 0x80000000u) | (mt[(k + 1) % ATTN_MT_N] & 0x7FFFFFFFu);
    mt[k] = mt[(k + 397) % ATTN_MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908B0DFu : 0u);
  }
  g->index = 0;
}

uint32_t attn_rng_u32(attn_generator *g) {
  if (g->index >= ATTN_MT_N) twist(g);
  uint32_t y = g->mt[g->index++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9D2C5680u;
  y ^= (y << 15) & 0xEFC60000u;
  y ^= y >> 18;
  return y;
}

uint64_t attn_rng_u64(attn_generator *g) {
  uint64_t hi = attn_rng_u32(g);
  uint64_t lo = attn_rng_u32(g);
  return (hi << 32) | lo;
}

/* float32 uniform in [0, 1): low 24 bits of one draw (exact) */
static float u24f(attn_generator *g) {
  return (float)(attn_rng_u32(g) & 0xFFFFFFu) * 0x1p-24f;
}

/* float64 uniform in [0, 1): low 53 bits of a 64-bit draw (exact) */
static double u53d(attn_generator *g) {
  return (double)(attn_rng_u64(g) & ((UINT64_C(1) << 53) - 1)) * 0x1p-53;
}

/* ---- §2 uniform ---------------------------------------------------------- */

ATTN_FMA_CLONES void attn_rng_uniform_f32(attn_generator *g, float *out, int64_t n, double a, double b) {
  float lo = (float)a, hi = (float)b;
  float r = hi - lo;
  for (int64_t i = 0; i < n; i++) out[i] = fmaf(u24f(g), r, lo);
}

/* ---- §4.1 scalar normal with one cached double ---------------------------- */

static double normal_double(attn_generator *g) {
  if (g->has_normal) {
    g->has_normal = 0;
    return g->normal;
  }
  double u1 = u53d(g);
  double u2 = u53d(g);
  double r = sqrt(-2.0 * log(1.0 - u2));
  double theta = 6.283185307179586 * u1;
  g->normal = r * sin(theta);
  g->has_normal = 1;
  return r * cos(theta);
}

ATTN_FMA_CLONES void attn_rng_normal_scalar_f32(attn_generator *g, float *out, int64_t n, double mean, double std) {
  for (int64_t i = 0; i < n; i++) out[i] = (float)(normal_double(g) * std + mean);
}

/* ---- §4.3 AVX2 Cephes LOG, x in (0, 1] -------------------------------------- */

static float f_from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static uint32_t f_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

/* always inlined, so each ATTN_FMA_CLONES clone of the callers gets its own FMA steps */
static inline __attribute__((always_inline)) float log_avx(float x) {
  static const float P[9] = {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f,
                             -1.2420140846E-1f, 1.4249322787E-1f, -1.6668057665E-1f,
                             2.0000714765E-1f,  -2.4999993993E-1f, 3.3333331174E-1f};
  const float Q1 = -2.12194440E-4f, Q2 = 0.693359375f, SQRTHF = 0.707106781186547524f;
  const float min_norm = 0x1p-126f;
  if (!(x >= min_norm)) x = min_norm; /* max_ps(x, min_norm): NaN goes to min_norm too */
  uint32_t b = f_bits(x);
  float e = (float)((int32_t)(b >> 23) - 127) + 1.0f;
  float m = f_from_bits((b & 0x807FFFFFu) | 0x3F000000u);
  float t;
  if (m < SQRTHF) {
    e = e - 1.0f;
    t = (m - 1.0f) + m;
  } else {
    t = m - 1.0f;
  }
  float z = t * t;
  float y = P[0];
  for (int k = 1; k < 9; k++) y = fmaf(y, t, P[k]);
  y = y * t;
  y = fmaf(y, z, e * Q1);
  y = y - z * 0.5f;
  return (t + y) + e * Q2;
}

/* ---- §4.4 AVX2 Cephes SINCOS, x in [0, 2pi) --------------------------------- */

static inline __attribute__((always_inline)) void sincos_avx(float x, float *s_out, float *c_out) {
  const float S0 = -1.9515295891E-4f, S1 = 8.3321608736E-3f, S2 = -1.6666654611E-1f;
  const float C0 = 2.443315711809948E-5f, C1 = -1.388731625493765E-3f, C2 = 4.166664568298827E-2f;
  const float DP1 = -0.78515625f, DP2 = -2.4187564849853515625E-4f, DP3 = -3.77489497744594108E-8f;
  const float FOPI = 1.27323954473516f;
  int sign_in = signbit(x) != 0;
  x = fabsf(x);
  int32_t j = (int32_t)(x * FOPI);
  j = (j + 1) & ~1;
  float y = (float)j;
  float r = fmaf(y, DP1, x);
  r = fmaf(y, DP2, r);
  r = fmaf(y, DP3, r);
  float z = r * r;
  float c = fmaf(fmaf(C0, z, C1), z, C2);
  c = c * z;
  c = fmaf(c, z, -(z * 0.5f));
  c = c + 1.0f;
  float s = fmaf(fmaf(S0, z, S1), z, S2);
  s = s * z;
  s = fmaf(s, r, r);
  float sn, cs;
  if ((j & 2) == 0) {
    sn = 0.0f + s;
    cs = c + 0.0f;
  } else {
    sn = c + 0.0f;
    cs = 0.0f + s;
  }
  if (((j & 4) != 0) != sign_in) sn = -sn;
  if (((j - 2) & 4) == 0) cs = -cs;
  *s_out = sn;
  *c_out = cs;
}

/* ---- §4.2 16-lane transform ------------------------------------------------- */

ATTN_FMA_CLONES static void normal_fill16(float *d, float mean, float std) {
  const float TWO_PI_F = 6.28318548f; /* (float)(2 pi), 0x40C90FDB */
  for (int j = 0; j < 8; j++) {
    float u1 = 1.0f - d[j];
    float u2 = d[j + 8];
    float r = sqrtf(-2.0f * log_avx(u1));
    float sn, cs;
    sincos_avx(TWO_PI_F * u2, &sn, &cs);
    d[j] = fmaf(r * cs, std, mean);
    d[j + 8] = fmaf(r * sn, std, mean);
  }
}

ATTN_FMA_CLONES void attn_rng_normal_f32(attn_generator *g, float *out, int64_t n, double mean, double std) {
  if (n < 16) {
    attn_rng_normal_scalar_f32(g, out, n, mean, std);
    return;
  }
  float fm = (float)mean, fs = (float)std;
  for (int64_t i = 0; i < n; i++) out[i] = u24f(g);
  for (int64_t i = 0; i + 16 <= n; i += 16) normal_fill16(out + i, fm, fs);
  if (n % 16 != 0) {
    float tail[16];
    for (int i = 0; i < 16; i++) tail[i] = u24f(g);
    normal_fill16(tail, fm, fs);
    memcpy(out + n - 16, tail, sizeof tail);
  }
}

/* ---- §5.1 MKL-style dropout (MCG31m1) -------------------------------------- */

#define MCG_M UINT64_C(2147483647) /* 2^31 - 1 */
#define MCG_A UINT64_C(1132489760)

/* A^k mod M by squaring; every product < 2^62 */
static uint64_t mcg_pow(uint64_t k) {
  uint64_t result = 1, base = MCG_A;
  while (k) {
    if (k & 1) result = result * base % MCG_M;
    base = base * base % MCG_M;
    k >>= 1;
  }
  return result;
}

static void dropout_block(uint32_t draw, double q, float scale, int64_t start, int64_t n, float *out) {
  uint64_t x = draw % MCG_M;
  if (x == 0) x = 1;
  if (start > 0) x = mcg_pow((uint64_t)start) * x % MCG_M;
  for (int64_t i = 0; i < n; i++) {
    out[i] = ((double)x / (double)MCG_M < q) ? scale : 0.0f;
    x = x * MCG_A % MCG_M;
  }
}

#define DROPOUT_BLOCK 32768

static void mkl_factors(uint32_t draw, double q, float scale, int64_t start, int64_t n, float *out) {
  if (n <= DROPOUT_BLOCK) {
    dropout_block(draw, q, scale, start, n, out);
    return;
  }
  int64_t nblocks = (n + DROPOUT_BLOCK - 1) / DROPOUT_BLOCK;
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(nblocks))
  for (int64_t b = 0; b < nblocks; b++) {
    int64_t off = b * DROPOUT_BLOCK;
    int64_t len = n - off < DROPOUT_BLOCK ? n - off : DROPOUT_BLOCK;
    dropout_block(draw, q, scale, start + off, len, out + off);
  }
}

/* ---- §5.2 default (non-MKL) dropout: bernoulli_distribution<double> per element ---- */

/* torch 1.13's bernoulli_scalar_kernel_default: a serial loop, element i kept
 * iff uniform_real_distribution<double>(0, 1) < q, i.e. its 53-bit uniform
 * (two draws, first one high) is below q */
static int default_keep(attn_generator *g, double q) { return u53d(g) < q; }

const char *attn_dropout_stream_name(attn_dropout_stream s) {
  return s == ATTN_DROPOUT_DEFAULT ? "default" : "mkl";
}

int64_t attn_dropout_keep_words(attn_dropout_stream s, int64_t numel) {
  return s == ATTN_DROPOUT_DEFAULT && numel > 0 ? numel / 64 + (numel % 64 != 0) : 0;
}

attn_dropout_draw attn_dropout_draw_from(attn_generator *g, attn_dropout_stream s, double p, int64_t numel,
                                         uint64_t *keep) {
  attn_dropout_draw d = {0, NULL};
  if (s != ATTN_DROPOUT_DEFAULT) {
    d.mkl = attn_rng_u32(g);
    return d;
  }
  double q = 1.0 - p;
  int64_t words = attn_dropout_keep_words(s, numel);
  for (int64_t w = 0; w < words; w++) {
    int64_t n = numel - 64 * w < 64 ? numel - 64 * w : 64;
    uint64_t bits = 0;
    for (int64_t b = 0; b < n; b++) bits |= (uint64_t)default_keep(g, q) << b;
    keep[w] = bits;
  }
  d.keep = keep;
  return d;
}

void attn_dropout_factors(attn_dropout_draw d, double p, int64_t start, int64_t n, float *out) {
  double q = 1.0 - p;
  float scale = 1.0f / (float)q;
  if (n <= 0) return;
  if (!d.keep) {
    mkl_factors(d.mkl, q, scale, start, n, out);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t e = start + i;
    out[i] = (d.keep[e >> 6] >> (e & 63)) & 1u ? scale : 0.0f;
  }
}

void attn_rng_dropout_f32(attn_generator *g, attn_dropout_stream s, const float *x, float *out, int64_t n, double p) {
  if (s == ATTN_DROPOUT_DEFAULT) {
    double q = 1.0 - p;
    float scale = 1.0f / (float)q;
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * (default_keep(g, q) ? scale : 0.0f);
    return;
  }
  attn_dropout_draw d = {attn_rng_u32(g), NULL};
  attn_dropout_factors(d, p, 0, n, out);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * out[i];
}

/* ---- state blob ----------------------------------------------------------- */

static const unsigned char MAGIC[4] = {'A', 'T', 'R', 'N'};

static unsigned char *put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
  return p + 4;
}

static unsigned char *put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
  return p + 8;
}

static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

void attn_rng_get_state(const attn_generator *g, unsigned char out[ATTN_RNG_STATE_BYTES]) {
  unsigned char *p = out;
  memcpy(p, MAGIC, 4);
  p += 4;
  for (int i = 0; i < ATTN_MT_N; i++) p = put32(p, g->mt[i]);
  p = put32(p, (uint32_t)g->index);
  p = put64(p, g->seed);
  p = put32(p, g->has_normal ? 1u : 0u);
  uint64_t nb;
  memcpy(&nb, &g->normal, sizeof nb);
  put64(p, g->has_normal ? nb : 0);
}

attn_status attn_rng_set_state(attn_generator *g, const unsigned char *in, int64_t len) {
  if (len != ATTN_RNG_STATE_BYTES)
    return attn_fail(ATTN_EARG, "expected a state of %d bytes (from get_rng_state), got %lld bytes",
                     ATTN_RNG_STATE_BYTES, (long long)len);
  if (memcmp(in, MAGIC, 4) != 0)
    return attn_fail(ATTN_EARG, "not a state from get_rng_state (bad header)");
  const unsigned char *p = in + 4 + 4 * ATTN_MT_N;
  uint32_t index = get32(p);
  uint32_t flag = get32(p + 12);
  if (index > ATTN_MT_N) return attn_fail(ATTN_EARG, "corrupt state: index %u out of [0, %d]", index, ATTN_MT_N);
  if (flag > 1) return attn_fail(ATTN_EARG, "corrupt state: cached-normal flag %u is not 0 or 1", flag);
  for (int i = 0; i < ATTN_MT_N; i++) g->mt[i] = get32(in + 4 + 4 * i);
  g->index = (int32_t)index;
  g->seed = get64(p + 4);
  g->has_normal = (int)flag;
  uint64_t nb = get64(p + 16);
  memcpy(&g->normal, &nb, sizeof nb);
  return ATTN_OK;
}
