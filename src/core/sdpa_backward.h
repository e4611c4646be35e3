/* The backward of scaled dot-product attention, both kernels: the gradients
 * of q, k, v and bias from the gradient of out, for the same call (the same
 * options, the same dropout draw) as the forward of src/core/attention.h and
 * src/core/flash.h. What the forward keeps for it: the softmax before dropout
 * (opts.probs, math kernel) or each row's log-sum-exp (opts.lse, flash
 * kernel), and the dropout draw (opts.dropout_draw) when dropout_p > 0.
 *
 * Shapes (PyTorch names): q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev],
 * mask and bias broadcast to [..., Lq, Lk]; B is the batch shape the leading
 * dims broadcast to (attn_sdpa_describe). The gradients come out in the
 * expanded shape (one per slice of B; dk and dv one per kv head, see
 * attn_sdpa_grads); attn_sdpa_sum_to sums one back to the shape of an operand
 * that was broadcast. Every variant of opts (enable_gqa, window,
 * alibi_slopes, softcap) is differentiated; the slopes get no gradient. */
#ifndef ATTN_SDPA_BACKWARD_H
#define ATTN_SDPA_BACKWARD_H

#include "sdpa_common.h"
#include "tensor.h"

/* Query rows and keys of one tile of the flash backward (constants: the order
 * of every sum, and so the bits, never depend on the thread count). */
#define ATTN_SDPA_BWD_BQ 64
#define ATTN_SDPA_BWD_BK 128

/* Where the gradients go: tensors of the expanded shapes dq [B..., Lq, E],
 * dk [Bkv..., Lk, E], dv [Bkv..., Lk, Ev] and dbias (NULL, or [B..., Lq, Lk]
 * when the call has a bias; the gradient of the scores after scaling and
 * softcap, which is the bias's). Bkv is B, except with enable_gqa: its last
 * dim (the query heads Hq) becomes the kv heads Hq / g, each getting the sum
 * over its g query heads. dbias is contiguous; dq, dk and dv need only
 * unit-stride rows and no element shared (a fused module writes its heads'
 * gradients straight into the columns of its [rows, 3D] buffer), the same
 * bits as contiguous ones. Each is overwritten, nothing between its rows
 * touched. */
typedef struct attn_sdpa_grads {
  attn_tensor *dq, *dk, *dv, *dbias;
} attn_sdpa_grads;

/* The gradients of the call (q, k, v, opts) of kernel (ATTN_SDPA_MATH or
 * ATTN_SDPA_FLASH, the one the forward ran) given out [B..., Lq, Ev] (the
 * forward's result), dout [B..., Lq, Ev] (any strides) and saved: for MATH
 * the forward's opts.probs [B..., Lq, Lk], for FLASH its opts.lse [B..., Lq]
 * (both contiguous). dweights: NULL, or (MATH only) the gradient of the
 * weights the forward returned (after dropout), [B..., Lq, Lk], any strides.
 * opts must be the forward's (opts.dropout_draw included); its lse and probs
 * must be NULL. A query row with no visible key gives zero gradients.
 * Errors: ATTN_ESHAPE / ATTN_EARG (operands as attn_sdpa_describe, out,
 * dout, saved, dweights or a gradient of the wrong shape), ATTN_ENOMEM. */
attn_status attn_sdpa_backward(attn_sdpa_kernel kernel, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_sdpa_opts *opts, const attn_tensor *out,
                               const attn_tensor *dout, const attn_tensor *saved, const attn_tensor *dweights,
                               const attn_sdpa_grads *grads);

/* dst (contiguous, a shape that broadcasts to full's) = full (contiguous)
 * summed over the dims dst was broadcast along, in row-major order of full
 * (the same bits for any thread count). ATTN_ESHAPE when dst does not
 * broadcast to full. */
attn_status attn_sdpa_sum_to(const attn_tensor *full, attn_tensor *dst);

#endif
