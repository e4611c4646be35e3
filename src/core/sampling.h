/* Sampling with PyTorch 1.13's CPU streams: torch.randint, torch.randperm,
 * torch.multinomial. After the same seed each gives the same draws as torch
 * and consumes the same 32-bit draws, so later calls line up (algorithms and
 * draw counts in src/core/sampling.c). Results are float32 (exact: every
 * value is an integer of magnitude <= 2^24) and 1-based where torch gives
 * 0-based indices (randperm, multinomial). No Lua here. */
#ifndef ATTN_SAMPLING_H
#define ATTN_SAMPLING_H

#include <stdint.h>

#include "rng.h"
#include "tensor.h"

/* The largest |value| of a sampled integer: float32 holds every integer up to it. */
#define ATTN_SAMPLE_MAX (INT64_C(1) << 24)

/* torch.randint(low, high, (n,)): out[i] = low + u32 % (high - low), one
 * draw each. ATTN_EARG unless low < high and both within +-2^24. */
attn_status attn_rng_randint(attn_generator *g, int64_t low, int64_t high, float *out, int64_t n);

/* torch.randperm(n) + 1: a permutation of 1..n, n - 1 draws (none for n <= 1).
 * ATTN_EARG unless 0 <= n <= 2^24. */
attn_status attn_rng_randperm(attn_generator *g, int64_t n, float *out);

/* Check probs [rows, k] (contiguous) for multinomial with n samples: every
 * value finite and >= 0, every row's float32 sum positive and finite; without
 * replacement n <= k and no more samples than a row has nonzero
 * probabilities (torch would then return zero-probability categories in an
 * order its sort leaves unspecified). Messages give 1-based rows and columns. */
attn_status attn_multinomial_check(const float *probs, int64_t rows, int64_t k, int64_t n, int replacement);

/* torch.multinomial(probs, n, replacement) + 1 into out [rows, n], after
 * attn_multinomial_check (which it runs first: nothing is drawn on an error).
 * ATTN_ENOMEM when the scratch of 2 k floats cannot be had. */
attn_status attn_rng_multinomial(attn_generator *g, const float *probs, int64_t rows, int64_t k, int64_t n,
                                 int replacement, float *out);

#endif
