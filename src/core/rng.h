/* PyTorch 1.13-compatible CPU random numbers, bit for bit (float32).
 *
 * The generator is MT19937 seeded like torch.manual_seed, with the one cached
 * double normal of torch's scalar Box-Muller path. Every function reproduces
 * the element order and the number of 32-bit draws of the matching torch call
 * (see /work/shared/reference/torch-rng.md). No Lua here. */
#ifndef ATTN_RNG_H
#define ATTN_RNG_H

#include <stdint.h>

#include "tensor.h"

#define ATTN_MT_N 624

typedef struct attn_generator {
  uint32_t mt[ATTN_MT_N];     /* MT19937 state */
  int32_t index;              /* next word of mt to temper; ATTN_MT_N = twist first */
  uint64_t seed;              /* the seed as given to attn_rng_seed (initial_seed) */
  int has_normal;             /* a cached scalar-path normal is pending */
  double normal;              /* its value */
} attn_generator;

/* torch's default seed (default_rng_seed_val), used before any manual_seed. */
#define ATTN_RNG_DEFAULT_SEED UINT64_C(67280421310721)

/* Byte size of the state blob of attn_rng_get_state / attn_rng_set_state:
 * magic "ATRN", 624 MT words, index, seed, cached-normal flag, cached normal
 * (IEEE bits), all little-endian. */
#define ATTN_RNG_STATE_BYTES (4 + 4 * ATTN_MT_N + 4 + 8 + 4 + 8)

/* The core keeps no generator of its own: callers pass one (the binding keeps
 * one per Lua state, attnL_generator). Kernels that need draws from Lua's
 * attn.manual_seed stream (dropout inside attention) take an
 * attn_dropout_draw drawn from the caller's generator before the call.
 * A generator is not locked: use each from one thread at a time, never
 * inside an OpenMP region. */

/* torch.manual_seed: uses seed mod 2^32, clears the cached normal. */
void attn_rng_seed(attn_generator *g, uint64_t seed);
/* Next raw MT19937 output. */
uint32_t attn_rng_u32(attn_generator *g);
/* Two draws, the first one is the high word. */
uint64_t attn_rng_u64(attn_generator *g);

/* n draws: out[i] = fmaf((u32 & 0xFFFFFF) * 2^-24, fl(fl(b) - fl(a)), fl(a)). */
void attn_rng_uniform_f32(attn_generator *g, float *out, int64_t n, double a, double b);
/* torch.randn / normal_ into a contiguous buffer of n floats: the scalar
 * cached path for n < 16, the 16-lane AVX2-kernel path for n >= 16. */
void attn_rng_normal_f32(attn_generator *g, float *out, int64_t n, double mean, double std);
/* The scalar path for every element (torch's path for non-contiguous tensors),
 * elements written in order. */
void attn_rng_normal_scalar_f32(attn_generator *g, float *out, int64_t n, double mean, double std);

/* ---- dropout masks: torch's bernoulli_(1 - p), in two streams (torch-rng.md §5) ----
 * One dropout call covers numel elements in row-major order (for attention:
 * the weights [B..., Lq, Lk]). Its randomness is drawn from the generator
 * once, before any kernel runs (attn_dropout_draw_from); kernels then ask for
 * the keep/scale factors of any element range (attn_dropout_factors), from
 * any thread, in any order: the bits do not depend on the thread count. A
 * backward pass reproduces the forward's mask by keeping the same
 * attn_dropout_draw (and the keep words it points to), or by restoring the
 * generator state the forward started from and drawing again. */
typedef enum attn_dropout_stream {
  ATTN_DROPOUT_MKL = 0,    /* §5.1: ONE 32-bit draw per call, MCG31m1 keep flags (PyTorch's MKL builds on
                              Intel CPUs: the notebooks' stream) */
  ATTN_DROPOUT_DEFAULT = 1 /* §5.2: a 53-bit uniform (two draws) per element, kept iff < 1 - p (builds
                              without MKL: Debian's python3-torch, macOS arm64) */
} attn_dropout_stream;

typedef struct attn_dropout_draw {
  uint32_t mkl;         /* MKL stream: the call's single 32-bit draw */
  const uint64_t *keep; /* NULL: the MKL stream. Else the default stream's flags: element i is kept iff
                           bit i % 64 of keep[i / 64] is set */
} attn_dropout_draw;

/* "mkl" / "default" */
const char *attn_dropout_stream_name(attn_dropout_stream s);
/* The uint64_t words of keep flags one call over numel elements needs: 0 for
 * the MKL stream, ceil(numel / 64) for the default stream. */
int64_t attn_dropout_keep_words(attn_dropout_stream s, int64_t numel);
/* Draw one dropout call (0 < p < 1) over numel elements from g: the MKL
 * stream takes one draw; the default stream takes 2 * numel draws and writes
 * the flags into keep (attn_dropout_keep_words(s, numel) words; NULL for MKL). */
attn_dropout_draw attn_dropout_draw_from(attn_generator *g, attn_dropout_stream s, double p, int64_t numel,
                                         uint64_t *keep);
/* Keep/scale factors of elements [start, start + n) of the call drawn as d:
 * out[i] = fl(1/fl(1-p)) if kept, else 0. MKL: MCG31m1 skip-ahead to start. */
void attn_dropout_factors(attn_dropout_draw d, double p, int64_t start, int64_t n, float *out);

/* The whole state (MT words, index, seed, cached normal) as a fixed-size blob. */
void attn_rng_get_state(const attn_generator *g, unsigned char out[ATTN_RNG_STATE_BYTES]);
/* Restore a blob from attn_rng_get_state; ATTN_EARG (with a message) if it is
 * not a valid state (wrong length, magic, index or flag); g is then unchanged. */
attn_status attn_rng_set_state(attn_generator *g, const unsigned char *in, int64_t len);

/* One dropout call (torch.nn.Dropout in training, 0 < p < 1) in stream s:
 * out[i] = x[i] * factor_i in float32 (dropped negative x give -0.0). x and
 * out are n contiguous floats (may be the same buffer). */
void attn_rng_dropout_f32(attn_generator *g, attn_dropout_stream s, const float *x, float *out, int64_t n, double p);

#endif
