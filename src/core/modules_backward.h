/* The backward of the fused forward of attn.nn's CausalAttention and
 * MultiHeadAttention (src/core/modules.h): every parameter's gradient and x's
 * from the gradient of the output, in one C call. */
#ifndef ATTN_MODULES_BACKWARD_H
#define ATTN_MODULES_BACKWARD_H

#include "modules.h"
#include "tensor.h"

/* Where the gradients go: contiguous tensors of the shapes of x ([B, n, d_in])
 * and of the parameters (dwq, dwk, dwv [d_out, d_in]; dbq, dbk, dbv, dbo
 * [d_out]; dwo [d_out, d_out]); NULL for one not wanted (or absent: a bias
 * the module does not have, out_proj). Each given one is overwritten. */
typedef struct attn_self_attention_grads {
  attn_tensor *dx, *dwq, *dwk, *dwv, *dbq, *dbk, *dbv, *dwo, *dbo;
} attn_self_attention_grads;

/* The gradients of out = attn_self_attention_forward(m, x) given dout
 * [B, n, d_out] (contiguous), for the same m (m->dropout_draw: the forward's
 * draw, so the dropout mask is the forward's). The forward's state is
 * recomputed by attn_self_attention_state (the forward's own steps: the
 * projections, the attention keeping its probabilities or log-sum-exp, the
 * bits the forward computed); the
 * attention part is attn_sdpa_backward (src/core/sdpa_backward.h), the
 * products attn_gemm's fixed tiles: the bits do not depend on the thread
 * count. Errors: ATTN_ESHAPE / ATTN_EARG (as the forward; a gradient of the
 * wrong shape, or asked for a parameter the module lacks), ATTN_ENOMEM. */
attn_status attn_self_attention_backward(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *dout,
                                         const attn_self_attention_grads *g);

/* The same gradients from the state the training forward kept
 * (attn_self_attention_forward_saving, for the same m, x and draw): nothing
 * of the forward is recomputed, and the gradients are
 * attn_self_attention_backward's bits. */
attn_status attn_self_attention_backward_saved(const attn_self_attention *m, const attn_tensor *x,
                                               const attn_tensor *dout, const attn_self_attention_saved *s,
                                               const attn_self_attention_grads *g);

/* The tiny calls' backward (src/core/modules_backward_tiny.c, direct loops, no
 * scratch allocation), which attn_self_attention_backward takes once it has
 * checked the shapes: fits says whether x [nb, n, d_in] is such a call. */
int attn_self_attention_backward_tiny_fits(const attn_self_attention *m, int64_t nb, int64_t n, int64_t d_in);
void attn_self_attention_backward_tiny(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *dout,
                                       const attn_self_attention_grads *g);

#endif
