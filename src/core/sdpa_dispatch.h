/* The front door of scaled dot-product attention: which kernel runs a call,
 * and the fused kernel's entry point, which picks its tiled driver or its
 * split-K decoding one. Above every kernel (src/core/attention.h: math,
 * src/core/flash.h: tiles, src/core/flash_decode.h: decoding), which sit
 * above the shared core (src/core/sdpa_common.h, src/core/flash_common.h);
 * nothing below calls up here. Callers: the binding, the modules' fused
 * forward and backward (src/core/modules.c, modules_backward.c). */
#ifndef ATTN_SDPA_DISPATCH_H
#define ATTN_SDPA_DISPATCH_H

#include <stdint.h>

#include "sdpa_common.h"
#include "tensor.h"

/* out [B..., Lq, Ev] (contiguous, caller-owned) = softmax(mask(scale*q k^T +
 * bias)) v by the fused kernel, with the math kernel's shapes, options and
 * meaning (src/core/attention.h): src/core/flash_decode.c where the call is
 * a decoding one (attn_flash_decode_fits), else src/core/flash.c's tiles.
 * Scratch memory is O(threads x tile), never [Lq, Lk]; a query row whose
 * keys are all hidden gives zeros; the weights are never formed (a caller
 * that needs them uses attn_sdpa_math). opts->lse (NULL or [B..., Lq]) gets
 * each row's log-sum-exp. The bits of out are the same for any
 * OMP_NUM_THREADS. dropout_p > 0 needs the RNG module. */
attn_status attn_sdpa_flash(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_sdpa_opts *opts, attn_tensor *out);

/* NULL when kernel (MATH or FLASH) can serve a call that asks for the
 * weights (need_weights) or not; else why not, as a phrase ("kernel \"flash\"
 * cannot return the attention weights ..."). */
const char *attn_sdpa_kernel_refuses(attn_sdpa_kernel kernel, int need_weights);

/* The kernel that runs a call with nb (batch x heads) slices of Lq x Lk
 * scores and head sizes E and Ev: requested (MATH or FLASH) when it can
 * serve the call, else ATTN_SDPA_AUTO with *why (attn_sdpa_kernel_refuses).
 * AUTO takes the fused kernel where it is faster (the measured crossover)
 * and can serve the call, else the math kernel. */
attn_sdpa_kernel attn_sdpa_choose_kernel(attn_sdpa_kernel requested, int64_t nb, int64_t lq, int64_t lk, int64_t e,
                                         int64_t ev, int need_weights, const char **why);

/* attn_sdpa_choose_kernel weighing the call's options too: AUTO also takes
 * the fused kernel for decoding (attn_flash_decode_fits: gqa_group * Lq
 * query rows per kv head in one tile, more than one split-K chunk of keys) and where
 * is_causal and the window leave at most a quarter of the pairs visible
 * (with Lk > 256: its key tiles are skipped). opts may be NULL;
 * gqa_group: query heads per kv head (attn_sdpa_gqa_group_of), 1 without GQA.
 * Both kernels run every option, so only need_weights limits the choice. */
attn_sdpa_kernel attn_sdpa_choose_kernel_for(attn_sdpa_kernel requested, int64_t nb, int64_t lq, int64_t lk,
                                             int64_t e, int64_t ev, int need_weights, int64_t gqa_group,
                                             const attn_sdpa_opts *opts, const char **why);

/* Query heads per kv head of a call (Hq / Hkv with enable_gqa and dividing
 * head counts, else 1: a bad call fails later, in the kernel's checks). */
int64_t attn_sdpa_gqa_group_of(const attn_tensor *q, const attn_tensor *k, const attn_sdpa_opts *opts);

/* Run kernel (MATH or FLASH; AUTO chooses as attn_sdpa_choose_kernel_for does)
 * on the call: attn_sdpa_math or attn_sdpa_flash. ATTN_EARG when the kernel
 * cannot serve it (flash with weights). */
attn_status attn_sdpa_run(attn_sdpa_kernel kernel, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                          const attn_sdpa_opts *opts, attn_tensor *out, attn_tensor *weights);

#endif
