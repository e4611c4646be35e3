/* Kernel choice and dispatch (src/core/sdpa_dispatch.h): the only file that
 * calls more than one kernel. It reads the call's sizes and options, picks
 * the math kernel (src/core/attention.c) or the fused one, and for the fused
 * one its tiled driver (src/core/flash.c) or its split-K decoding driver
 * (src/core/flash_decode.c), each given the problem the shared core
 * (src/core/sdpa_common.c) describes. */
#include "attention.h"
#include "flash.h"
#include "flash_common.h"
#include "flash_decode.h"
#include "sdpa_dispatch.h"

/* attn_sdpa_prepare, then the tiled driver or the decoding one. */
attn_status attn_sdpa_flash(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_sdpa_opts *opts, attn_tensor *out) {
  attn_sdpa_problem p;
  attn_status st = attn_sdpa_prepare(q, k, v, opts, out, NULL, &p);
  if (st != ATTN_OK) return st;
  if (opts->probs) return attn_fail(ATTN_EARG, "kernel \"flash\" cannot return the softmax probabilities (probs)");
  int64_t nb = attn_sizes_product(p.nbatch, p.batch);
  if (nb == 0 || p.lq == 0 || (p.ev == 0 && !p.lse)) return ATTN_OK;
  /* a few query rows against many keys: split across the keys */
  if (attn_flash_decode_fits(p.gqa_group * p.lq, p.lk)) return attn_flash_decode(&p, out);
  return attn_flash_tiles(&p, out);
}

/* kernel, need_weights -> NULL, or why it cannot serve the call */
const char *attn_sdpa_kernel_refuses(attn_sdpa_kernel kernel, int need_weights) {
  /* the fused kernel never forms the [Lq, Lk] weights: asking for both is an
   * error rather than a silent fallback that would break its O(tile) memory */
  if (kernel == ATTN_SDPA_FLASH && need_weights)
    return "kernel \"flash\" cannot return the attention weights (need_weights = true)";
  return NULL;
}

/* Query-key pairs a slice's rows see under is_causal and the window (a mask
 * or bias can only hide more): what the fused kernel computes, tile by tile,
 * where the math kernel computes all lq * lk. */
static double visible_pairs(int64_t lq, int64_t lk, const attn_sdpa_opts *o) {
  if (!o || (!o->is_causal && !o->has_window)) return (double)lq * (double)lk;
  double pairs = 0.0;
  int64_t d = lk - lq;
  for (int64_t i = 0; i < lq; i++) {
    int64_t begin = 0, end = lk;
    if (o->is_causal && i + 1 < end) end = i + 1;
    if (o->has_window && o->window_left >= 0 && i + d - o->window_left > begin) begin = i + d - o->window_left;
    if (o->has_window && o->window_right >= 0 && i + d + o->window_right + 1 < end) end = i + d + o->window_right + 1;
    if (end > begin) pairs += (double)(end - begin);
  }
  return pairs;
}

/* requested kernel, sizes, options -> the kernel that runs (AUTO + why: none) */
/* The key count of the window rule below (measured when the fused kernel's
 * key tile had 256 keys) and the sizes of the dense crossover: constants of
 * their own, so that a tile size never moves a call from one kernel (and its
 * bits) to the other. */
#define CROSSOVER_KEYS 256
#define SMALL_KEYS 32
#define SMALL_ROWS 16

attn_sdpa_kernel attn_sdpa_choose_kernel_for(attn_sdpa_kernel requested, int64_t nb, int64_t lq, int64_t lk,
                                             int64_t e, int64_t ev, int need_weights, int64_t gqa_group,
                                             const attn_sdpa_opts *opts, const char **why) {
  (void)nb;
  (void)e;
  (void)ev;
  *why = NULL;
  if (requested != ATTN_SDPA_AUTO) {
    *why = attn_sdpa_kernel_refuses(requested, need_weights);
    return *why ? ATTN_SDPA_AUTO : requested;
  }
  if (attn_sdpa_kernel_refuses(ATTN_SDPA_FLASH, need_weights)) return ATTN_SDPA_MATH;
  /* decoding (a few rows per kv head against more than one split-K chunk):
   * the fused kernel splits the keys over the threads and reads each K/V row
   * once for a GQA group; the math kernel runs one thread per slice and a
   * score row per query head (scripts/bench.lua, 2 threads at load 7: decode
   * 2.5-2.9x faster, decode_gqa 6-7x) */
  if (attn_flash_decode_fits(gqa_group < 1 ? lq : gqa_group * lq, lk)) return ATTN_SDPA_FLASH;
  /* measured crossover (one thread, CPU time, [8, 8, n, n] with E 16 and 64,
   * causal or not, on an Intel Xeon with AVX-512): the fused kernel's forward
   * is 1.7-7x the math kernel's from 16 keys on, forward + backward break
   * even at 16 keys and gain 1.1-2x from 32; below that (the notebooks'
   * sizes) and for fewer than 16 query rows (a tile's rows would be mostly
   * padding) the math kernel stays */
  if (lk >= SMALL_KEYS && lq >= SMALL_ROWS) return ATTN_SDPA_FLASH;
  /* a window that hides most pairs: the fused kernel skips the key tiles
   * outside it, the math kernel computes every score (scripts/bench.lua
   * window, 2 threads at load 7: 36x). Causal alone hides half, which the
   * crossover above weighs; square causal calls (the module forward and
   * backward) choose by it alone. */
  if (lk > CROSSOVER_KEYS && 4.0 * visible_pairs(lq, lk, opts) <= (double)lq * (double)lk) return ATTN_SDPA_FLASH;
  return ATTN_SDPA_MATH;
}

/* attn_sdpa_choose_kernel_for without options or GQA */
attn_sdpa_kernel attn_sdpa_choose_kernel(attn_sdpa_kernel requested, int64_t nb, int64_t lq, int64_t lk, int64_t e,
                                         int64_t ev, int need_weights, const char **why) {
  return attn_sdpa_choose_kernel_for(requested, nb, lq, lk, e, ev, need_weights, 1, NULL, why);
}

/* q [..., Hq, Lq, E], k [..., Hkv, Lk, E] -> Hq / Hkv (1 without GQA) */
int64_t attn_sdpa_gqa_group_of(const attn_tensor *q, const attn_tensor *k, const attn_sdpa_opts *opts) {
  if (!opts || !opts->enable_gqa || q->ndim < 3 || k->ndim < 3) return 1;
  int64_t hq = q->size[q->ndim - 3], hkv = k->size[k->ndim - 3];
  return hkv > 0 && hq >= hkv && hq % hkv == 0 ? hq / hkv : 1;
}

/* kernel, q, k, v, opts -> out [B..., Lq, Ev] (and weights) by the chosen kernel */
attn_status attn_sdpa_run(attn_sdpa_kernel kernel, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                          const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights) {
  if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2) /* no sizes to choose by: the math kernel words the error */
    return attn_sdpa_math(q, k, v, opts, out, weights);
  int64_t nb = attn_sizes_product(out->ndim > 2 ? out->ndim - 2 : 0, out->size);
  const char *why;
  kernel = attn_sdpa_choose_kernel_for(kernel, nb, q->size[q->ndim - 2], k->size[k->ndim - 2], q->size[q->ndim - 1],
                                       v->size[v->ndim - 1], weights != NULL, attn_sdpa_gqa_group_of(q, k, opts), opts,
                                       &why);
  if (kernel == ATTN_SDPA_AUTO) return attn_fail(ATTN_EARG, "%s", why);
  return kernel == ATTN_SDPA_FLASH ? attn_sdpa_flash(q, k, v, opts, out) : attn_sdpa_math(q, k, v, opts, out, weights);
}
