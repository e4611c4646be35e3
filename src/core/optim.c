/* Optimizer updates with PyTorch 1.13's float32 single-tensor arithmetic
 * (torch/optim/sgd.py _single_tensor_sgd, adam.py _single_tensor_adam,
 * adamw.py _single_tensor_adamw), and clip_grad_norm_'s norm and factor.
 *
 * Scalars (lr, betas, ...) are Python doubles in torch: expressions of them
 * only (1 - beta1 ** step, lr / bias_correction1, sqrt(bias_correction2),
 * 1 - lr * weight_decay) are computed here in double, and each is rounded to
 * float where torch hands it to a float32 kernel. Tensor arithmetic is
 * float32, in torch's order, with a fused multiply-add where torch's CPU
 * kernels use one (add(x, alpha=a) is fmadd(x, a, self); addcmul's
 * self + v * t1 * t2 is contracted to fma(v * t1, t2, self) in the
 * Debian build; checked bit for bit against torch at sizes with and
 * without a vector tail):
 *   SGD, per element (p param, g grad, b momentum buffer):
 *     d = g;  weight_decay: d = fma(p, wd, d)
 *     momentum: b = d on the first step, else b = fma(d, 1 - dampening, b * momentum)
 *               d = nesterov ? fma(b, momentum, d) : b
 *     p = fma(d, -lr, p)
 *   Adam / AdamW (m, v the moments; step counted from 1):
 *     Adam: weight_decay: g = fma(p, wd, g);   AdamW: p = p * (1 - lr wd)
 *     m = fma(g, 1 - beta1, m * beta1)
 *     v = fma((1 - beta2) * g, g, v * beta2)
 *     p = p + (-(lr / (1 - beta1^step)) * m) / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * Contract: contiguous float32 tensors of one element count.
 * Error against torch 1.13: the same bits (spec/train_kernels_spec.lua, 5
 * steps of each optimizer and option set).
 * Threads: elements are independent, so bits do not depend on the count. */
#include <math.h>
#include <stdlib.h>

#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 32768

static attn_status check_count(const attn_tensor *t, int64_t n, const char *what) {
  if (attn_numel(t) != n)
    return attn_fail(ATTN_ESHAPE, "'%s' has %lld elements, the parameter %lld", what, (long long)attn_numel(t),
                     (long long)n);
  return ATTN_OK;
}

attn_status attn_sgd_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *momentum_buffer, int first_step,
                          const attn_sgd_options *o) {
  const int64_t n = attn_numel(param);
  attn_status st;
  if ((st = check_count(grad, n, "grad"))) return st;
  const int use_momentum = o->momentum != 0.0;
  if (use_momentum && (!momentum_buffer || (st = check_count(momentum_buffer, n, "momentum_buffer"))))
    return st ? st : attn_fail(ATTN_EARG, "a momentum buffer is needed when momentum != 0");
  const float wd = (float)o->weight_decay, mom = (float)o->momentum, damp1 = (float)(1.0 - o->dampening);
  const float neg_lr = (float)(-o->lr);
  const int decay = o->weight_decay != 0.0, nesterov = o->nesterov;
  float *p = param->data, *b = use_momentum ? momentum_buffer->data : NULL;
  const float *g = grad->data;
  /* param, grad, momentum_buffer: (*) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (decay) d = fmaf(p[i], wd, d);
    if (use_momentum) {
      float buf = first_step ? d : fmaf(d, damp1, b[i] * mom);
      b[i] = buf;
      d = nesterov ? fmaf(buf, mom, d) : buf;
    }
    p[i] = fmaf(d, neg_lr, p[i]);
  }
  return ATTN_OK;
}

attn_status attn_adam_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                           int64_t step, const attn_adam_options *o) {
  const int64_t n = attn_numel(param);
  attn_status st;
  if ((st = check_count(grad, n, "grad")) || (st = check_count(exp_avg, n, "exp_avg")) ||
      (st = check_count(exp_avg_sq, n, "exp_avg_sq")))
    return st;
  if (step < 1) return attn_fail(ATTN_EARG, "step must be >= 1, got %lld", (long long)step);
  /* the Python-double scalars of torch's loop, each rounded where a float kernel takes it */
  const double bias_correction1 = 1.0 - pow(o->beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(o->beta2, (double)step);
  const float neg_step_size = (float)(-(o->lr / bias_correction1));
  const float bias_correction2_sqrt = (float)sqrt(bias_correction2);
  const float beta1 = (float)o->beta1, one_minus_beta1 = (float)(1.0 - o->beta1);
  const float beta2 = (float)o->beta2, one_minus_beta2 = (float)(1.0 - o->beta2);
  const float eps = (float)o->eps, wd = (float)o->weight_decay;
  const float decoupled_factor = (float)(1.0 - o->lr * o->weight_decay);
  const int decoupled = o->decoupled_weight_decay, coupled_decay = !decoupled && o->weight_decay != 0.0;
  float *p = param->data, *m = exp_avg->data, *v = exp_avg_sq->data;
  const float *g = grad->data;
  /* param, grad, exp_avg, exp_avg_sq: (*) */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(n / PARALLEL_ELEMS + 1)) if (n > PARALLEL_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i], pi = p[i];
    if (coupled_decay) gi = fmaf(pi, wd, gi);
    if (decoupled) pi = pi * decoupled_factor;
    float mi = fmaf(gi, one_minus_beta1, m[i] * beta1);
    float vi = fmaf(one_minus_beta2 * gi, gi, v[i] * beta2);
    float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    p[i] = pi + (neg_step_size * mi) / denom;
    m[i] = mi, v[i] = vi;
  }
  return ATTN_OK;
}

attn_status attn_clip_grad_norm_coef(const attn_tensor *const *grads, int n, double max_norm, float *total_norm,
                                     float *clip_coef) {
  /* torch.norm(torch.stack([torch.norm(g) for g in grads])): each norm is a float32 value */
  double total_sq = 0.0;
  for (int k = 0; k < n; k++) {
    const int64_t m = attn_numel(grads[k]);
    const float *g = grads[k]->data;
    double sq = 0.0;
    for (int64_t i = 0; i < m; i++) sq += (double)g[i] * (double)g[i];
    float norm = (float)sqrt(sq);
    total_sq += (double)norm * (double)norm;
  }
  float total = (float)sqrt(total_sq);
  /* clip_coef = max_norm / (total_norm + 1e-6): Tensor.__rtruediv__ is reciprocal() * max_norm */
  float coef = (1.0f / (total + 1e-6f)) * (float)max_norm;
  *total_norm = total;
  *clip_coef = coef < 1.0f || coef != coef ? coef : 1.0f;
  return ATTN_OK;
}
