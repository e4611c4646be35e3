/* torch.randint, torch.randperm and torch.multinomial as PyTorch 1.13 runs
 * them on CPU, draw for draw (checked against the installed torch by
 * scripts/fixtures/make_sampling_fixtures.py; torch-rng.md gives the
 * generator: u32 = one MT19937 output, u64 = two (high word first),
 * U53 = (u64 & (2^53 - 1)) * 2^-53).
 *
 * randint(low, high): random_from_to: out = low + u32 % (high - low) (range
 *   < 2^32 always here), one draw per element, row-major.
 * randperm(n): randperm_cpu's Fisher-Yates for n < 2^32 / 20: r = 0..n-1;
 *   for i = 0 .. n-2: z = u32 % (n - i); swap r[i], r[i + z]. n - 1 draws.
 * multinomial(probs [rows, k], n, replacement):
 *   - without replacement (torch's Gumbel-top-k path): e = empty_like(probs)
 *     .exponential_() = (float)(-log(1 - U53)) per element (two draws each,
 *     all rows' k values in row-major order, serial kernel); key = p / e in
 *     float32; each row's n largest keys, largest first (topk; NaN ranks
 *     highest, as torch's comparator has it). 2 * rows * k draws.
 *   - with replacement (also for n = 1: torch 1.13 takes the exponential path
 *     only without replacement): per row, float32 running sums cum[j],
 *     cum[j] /= sum (float32), cum[k-1] = 1; per sample U53 and the first j
 *     with (double)cum[j] >= U53 by torch's binary search. 2 * rows * n draws.
 * Every loop is serial, like torch's kernels (draws have one order), so the
 * bits do not depend on the thread count. */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>

static double u53(attn_generator *g) {
  return (double)(attn_rng_u64(g) & ((UINT64_C(1) << 53) - 1)) * 0x1p-53;
}

/* out [n] = low + u32 % (high - low) */
attn_status attn_rng_randint(attn_generator *g, int64_t low, int64_t high, float *out, int64_t n) {
  if (!(low >= -ATTN_SAMPLE_MAX && high <= ATTN_SAMPLE_MAX))
    return attn_fail(ATTN_EARG, "randint: low %lld and high %lld must lie within +-2^24 (float32 integers)",
                     (long long)low, (long long)high);
  if (low >= high)
    return attn_fail(ATTN_EARG, "randint: expected low < high, got low = %lld, high = %lld", (long long)low,
                     (long long)high);
  if (n < 0) return attn_fail(ATTN_EARG, "randint: negative count %lld", (long long)n);
  uint32_t range = (uint32_t)(high - low);
  for (int64_t i = 0; i < n; i++) out[i] = (float)(low + (int64_t)(attn_rng_u32(g) % range));
  return ATTN_OK;
}

/* out [n] = a permutation of 1..n */
attn_status attn_rng_randperm(attn_generator *g, int64_t n, float *out) {
  if (n < 0 || n > ATTN_SAMPLE_MAX)
    return attn_fail(ATTN_EARG, "randperm: n must be in [0, 2^24], got %lld", (long long)n);
  for (int64_t i = 0; i < n; i++) out[i] = (float)(i + 1);
  for (int64_t i = 0; i + 1 < n; i++) {
    int64_t z = (int64_t)(attn_rng_u32(g) % (uint32_t)(n - i));
    float saved = out[i];
    out[i] = out[i + z];
    out[i + z] = saved;
  }
  return ATTN_OK;
}

/* probs: [rows, k] */
attn_status attn_multinomial_check(const float *probs, int64_t rows, int64_t k, int64_t n, int replacement) {
  if (k < 1 || k > ATTN_SAMPLE_MAX)
    return attn_fail(ATTN_EARG, "expected 1 to 2^24 categories, got %lld", (long long)k);
  if (n < 1) return attn_fail(ATTN_EARG, "cannot draw n = %lld samples (n must be >= 1)", (long long)n);
  if (!replacement && n > k)
    return attn_fail(ATTN_EARG, "cannot draw n = %lld samples without replacement from %lld categories",
                     (long long)n, (long long)k);
  for (int64_t r = 0; r < rows; r++) {
    const float *p = probs + r * k;
    float sum = 0.0f;
    int64_t nonzero = 0;
    for (int64_t j = 0; j < k; j++) {
      if (isnan(p[j]))
        return attn_fail(ATTN_EARG, "expected finite probabilities >= 0, got nan at row %lld, column %lld",
                         (long long)r + 1, (long long)j + 1);
      if (!isfinite(p[j]) || p[j] < 0.0f)
        return attn_fail(ATTN_EARG, "expected finite probabilities >= 0, got %g at row %lld, column %lld",
                         (double)p[j], (long long)r + 1, (long long)j + 1);
      sum += p[j];
      nonzero += p[j] > 0.0f;
    }
    if (nonzero == 0)
      return attn_fail(ATTN_EARG, "expected a positive probability in every row, got only zeros in row %lld",
                       (long long)r + 1);
    if (!isfinite(sum))
      return attn_fail(ATTN_EARG, "expected rows whose sum is finite in float32, got infinity in row %lld "
                       "(scale the probabilities down)", (long long)r + 1);
    if (!replacement && n > nonzero)
      return attn_fail(ATTN_EARG, "expected at least n = %lld nonzero probabilities per row to draw without "
                       "replacement, got %lld in row %lld", (long long)n, (long long)nonzero, (long long)r + 1);
  }
  return ATTN_OK;
}

typedef struct keyed {
  float key;
  int32_t index;
} keyed;

/* torch's topk order: NaN first, then larger keys; equal keys by index (a tie
 * between two exact float32 quotients, which torch's sort leaves unspecified) */
static int by_key_desc(const void *pa, const void *pb) {
  const keyed *a = pa, *b = pb;
  int an = isnan(a->key), bn = isnan(b->key);
  if (an != bn) return an ? -1 : 1;
  if (!an && a->key != b->key) return a->key > b->key ? -1 : 1;
  return (a->index > b->index) - (a->index < b->index);
}

/* row p [k] -> out [n]: the Gumbel-top-k path */
static void sample_without_replacement(attn_generator *g, const float *p, int64_t k, int64_t n, keyed *scratch,
                                       float *out) {
  for (int64_t j = 0; j < k; j++) {
    float e = (float)(-log(1.0 - u53(g))); /* exponential_(lambda = 1): -1/lambda * log(1 - U) */
    scratch[j].key = p[j] / e;
    scratch[j].index = (int32_t)j;
  }
  if (n == 1) {
    /* one sample (every generation step): the first key in the sort's order
     * (a total order: equal keys by index), found without sorting the row */
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++)
      if (by_key_desc(&scratch[j], &scratch[best]) < 0) best = j;
    out[0] = (float)(scratch[best].index + 1);
    return;
  }
  qsort(scratch, (size_t)k, sizeof *scratch, by_key_desc);
  for (int64_t s = 0; s < n; s++) out[s] = (float)(scratch[s].index + 1);
}

/* row p [k] -> out [n]: inverse CDF by binary search */
static void sample_with_replacement(attn_generator *g, const float *p, int64_t k, int64_t n, float *cum, float *out) {
  float sum = 0.0f;
  for (int64_t j = 0; j < k; j++) {
    sum += p[j];
    cum[j] = sum;
  }
  for (int64_t j = 0; j < k; j++) cum[j] /= sum;
  cum[k - 1] = 1.0f;
  for (int64_t s = 0; s < n; s++) {
    double u = u53(g);
    int64_t left = 0, right = k;
    while (right - left > 0) {
      int64_t mid = left + (right - left) / 2;
      if ((double)cum[mid] < u)
        left = mid + 1;
      else
        right = mid;
    }
    out[s] = (float)(left + 1);
  }
}

attn_status attn_rng_multinomial(attn_generator *g, const float *probs, int64_t rows, int64_t k, int64_t n,
                                 int replacement, float *out) {
  attn_status st = attn_multinomial_check(probs, rows, k, n, replacement);
  if (st != ATTN_OK) return st;
  void *scratch = malloc((size_t)k * (replacement ? sizeof(float) : sizeof(keyed)));
  if (!scratch) return attn_fail(ATTN_ENOMEM, "cannot allocate the scratch of %lld categories", (long long)k);
  for (int64_t r = 0; r < rows; r++) {
    if (replacement)
      sample_with_replacement(g, probs + r * k, k, n, scratch, out + r * n);
    else
      sample_without_replacement(g, probs + r * k, k, n, scratch, out + r * n);
  }
  free(scratch);
  return ATTN_OK;
}
