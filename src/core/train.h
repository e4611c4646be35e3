/* The training kernels of the core: forward and backward of
 * LayerNorm (layernorm.c), GELU (gelu.c), cross entropy with a fused
 * log-softmax (cross_entropy.c) and embedding lookup (embedding.c), and the
 * optimizer updates SGD / Adam / AdamW and the gradient-norm clip (optim.c).
 *
 * Every tensor here is contiguous (the binding passes contiguous copies of
 * strided inputs) and float32; shapes are checked and reported as ATTN_ESHAPE,
 * bad values (a class id that is not an integer, out of range) as ATTN_EARG.
 * Class ids and token ids are 1-based float values, as Lua sees them; the
 * position in a message is 1-based too. Every result is the same bits for any
 * thread count (rows or elements are independent, or reduced in fixed
 * blocks in a fixed order). */
#ifndef ATTN_TRAIN_H
#define ATTN_TRAIN_H

#include "tensor.h"

/* ---------------------------------------------------------------- LayerNorm */
/* Over the last dim, as torch.nn.functional.layer_norm(x, [D], w, b, eps):
 *   x [N, D], weight [D] or NULL (1), bias [D] or NULL (0)
 *   -> y [N, D] = (x - mean) * rstd * weight + bias,
 *      mean [N], rstd [N] = 1 / sqrt(biased variance + eps) (saved for backward). */
attn_status attn_layer_norm_forward(const attn_tensor *x, const attn_tensor *weight, const attn_tensor *bias,
                                    double eps, attn_tensor *y, attn_tensor *mean, attn_tensor *rstd);
/* dy, x [N, D], mean, rstd [N] (from the forward), weight [D] or NULL
 *   -> dx [N, D], dweight [D], dbias [D]; each may be NULL (not wanted). */
attn_status attn_layer_norm_backward(const attn_tensor *dy, const attn_tensor *x, const attn_tensor *mean,
                                     const attn_tensor *rstd, const attn_tensor *weight, attn_tensor *dx,
                                     attn_tensor *dweight, attn_tensor *dbias);

/* ---------------------------------------------------------------- GELU */
typedef enum attn_gelu_approximate { ATTN_GELU_ERF, ATTN_GELU_TANH } attn_gelu_approximate;
/* y = gelu(x), elementwise: x, y [*] of one element count (y may be x). */
attn_status attn_gelu_forward(const attn_tensor *x, attn_tensor *y, attn_gelu_approximate approximate);
/* dx = dy * gelu'(x): dy, x, dx [*] of one element count. */
attn_status attn_gelu_backward(const attn_tensor *dy, const attn_tensor *x, attn_tensor *dx,
                               attn_gelu_approximate approximate);

/* ---------------------------------------------------------------- cross entropy */
typedef enum attn_reduction { ATTN_REDUCTION_NONE, ATTN_REDUCTION_MEAN, ATTN_REDUCTION_SUM } attn_reduction;
/* torch.nn.functional.cross_entropy(logits, target, ignore_index=, reduction=,
 * label_smoothing=) with class ids counted from 1:
 *   logits [N, C], target [N] (integer-valued: 1..C, or ignore_index)
 *   -> loss [N] (reduction none) or one element (mean, sum),
 *      lse [N] = logsumexp of each row (saved for backward),
 *      *counted = the rows whose target is not ignore_index. */
attn_status attn_cross_entropy_forward(const attn_tensor *logits, const attn_tensor *target, double ignore_index,
                                       attn_reduction reduction, double label_smoothing, attn_tensor *loss,
                                       attn_tensor *lse, int64_t *counted);
/* grad: [N] (none) or one element (mean, sum), the gradient of the loss;
 * logits, target, lse as given to / returned by the forward -> dlogits [N, C]. */
attn_status attn_cross_entropy_backward(const attn_tensor *grad, const attn_tensor *logits, const attn_tensor *target,
                                        const attn_tensor *lse, double ignore_index, attn_reduction reduction,
                                        double label_smoothing, attn_tensor *dlogits);

/* ---------------------------------------------------------------- embedding */
/* ATTN_OK when every id of ids [*] is an integer value in [1, v], else
 * ATTN_EARG naming the first bad one (what the binding checks before it
 * allocates an output). */
attn_status attn_embedding_check_ids(const attn_tensor *ids, int64_t v);
/* weight [V, D], ids [N] (integer-valued, 1..V) -> out [N, D] = weight rows. */
attn_status attn_embedding_forward(const attn_tensor *weight, const attn_tensor *ids, attn_tensor *out);
/* dy [N, D], ids [N] -> dweight [V, D] = sum of the dy rows of each id. */
attn_status attn_embedding_backward(const attn_tensor *dy, const attn_tensor *ids, attn_tensor *dweight);

/* ---------------------------------------------------------------- optimizers */
typedef struct attn_sgd_options {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
} attn_sgd_options;
/* One step of torch.optim.SGD (_single_tensor_sgd) on param [*], in place:
 * grad [*] (same element count); momentum_buffer [*] when momentum != 0
 * (first_step: it is set to the step's gradient, as torch's clone). */
attn_status attn_sgd_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *momentum_buffer, int first_step,
                          const attn_sgd_options *o);

typedef struct attn_adam_options {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled_weight_decay; /* AdamW */
} attn_adam_options;
/* One step of torch.optim.Adam / AdamW (_single_tensor_adam[w]) on param [*],
 * in place; exp_avg, exp_avg_sq [*] updated; step >= 1 is the step count
 * after this step. */
attn_status attn_adam_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                           int64_t step, const attn_adam_options *o);

/* torch.nn.utils.clip_grad_norm_'s arithmetic for the 2-norm: *total_norm =
 * float(||(float(||g_1||), ..., float(||g_n||))||), *clip_coef = min(1,
 * float(max_norm) * float(1 / float(total_norm + 1e-6f))), the factor every
 * gradient is then multiplied by. grads: n contiguous tensors. */
attn_status attn_clip_grad_norm_coef(const attn_tensor *const *grads, int n, double max_norm, float *total_norm,
                                     float *clip_coef);

#endif
