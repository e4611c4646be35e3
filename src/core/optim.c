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
 * fmaf is one instruction in the FMA clone of the loops (ATTN_FMA_CLONES,
 * cpu.h), a glibc call otherwise: the same bits.
 * Threads: elements are independent (chunks of CHUNK), so bits do not depend
 * on the count. */
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "threads.h"
#include "train.h"

#define PARALLEL_ELEMS 32768
#define CHUNK 8192

static attn_status check_count(const attn_tensor *t, int64_t n, const char *what) {
  if (attn_numel(t) != n)
    return attn_fail(ATTN_ESHAPE, "'%s' has %lld elements, the parameter %lld", what, (long long)attn_numel(t),
                     (long long)n);
  return ATTN_OK;
}

/* The scalars of one SGD step, as torch's float kernels take them. */
typedef struct sgd_scalars {
  float wd, mom, damp1, neg_lr;
  int decay, use_momentum, nesterov, first_step;
} sgd_scalars;

/* p, g, b: (n) */
ATTN_FMA_CLONES static void sgd_chunk(float *p, const float *g, float *b, int64_t n, const sgd_scalars *k) {
  for (int64_t i = 0; i < n; i++) {
    float d = g[i];
    if (k->decay) d = fmaf(p[i], k->wd, d);
    if (k->use_momentum) {
      float buf = k->first_step ? d : fmaf(d, k->damp1, b[i] * k->mom);
      b[i] = buf;
      d = k->nesterov ? fmaf(buf, k->mom, d) : buf;
    }
    p[i] = fmaf(d, k->neg_lr, p[i]);
  }
}

attn_status attn_sgd_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *momentum_buffer, int first_step,
                          const attn_sgd_options *o) {
  const int64_t n = attn_numel(param), chunks = (n + CHUNK - 1) / CHUNK;
  attn_status st;
  if ((st = check_count(grad, n, "grad"))) return st;
  const int use_momentum = o->momentum != 0.0;
  if (use_momentum && (!momentum_buffer || (st = check_count(momentum_buffer, n, "momentum_buffer"))))
    return st ? st : attn_fail(ATTN_EARG, "a momentum buffer is needed when momentum != 0");
  const sgd_scalars k = {(float)o->weight_decay, (float)o->momentum, (float)(1.0 - o->dampening), (float)(-o->lr),
                         o->weight_decay != 0.0, use_momentum, o->nesterov, first_step};
  float *p = param->data, *b = use_momentum ? momentum_buffer->data : NULL;
  const float *g = grad->data;
  /* param, grad, momentum_buffer: (*), in chunks of CHUNK elements */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(chunks)) if (n > PARALLEL_ELEMS)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
    sgd_chunk(p + i0, g + i0, b ? b + i0 : NULL, len, &k);
  }
  return ATTN_OK;
}

/* The scalars of one Adam / AdamW step: torch's Python doubles, each rounded
 * where a float kernel takes it. */
typedef struct adam_scalars {
  float neg_step_size, bias_correction2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, wd;
  float decoupled_factor;
  int decoupled, coupled_decay;
} adam_scalars;

/* The clones of adam_chunk: FMA in every vector one (fmaf one instruction;
 * the file is built with -fno-math-errno, so sqrtf is one too). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_ADAM_CLONES \
  __attribute__((target_clones("avx512f", "fma", "default"), optimize("no-trapping-math")))
#else
#define ATTN_ADAM_CLONES
#endif

/* p, g, m, v: (n). The scalars in locals and one loop per decay kind, so
 * each loop vectorises (the AVX-512 or AVX2 clone; fmaf, sqrtf and the
 * division are correctly rounded in every lane: the bits of the scalar loop). */
ATTN_ADAM_CLONES static void adam_chunk(float *restrict p, const float *restrict g, float *restrict m,
                                          float *restrict v, int64_t n, const adam_scalars *k) {
  const float wd = k->wd, factor = k->decoupled_factor, b1 = k->beta1, omb1 = k->one_minus_beta1, b2 = k->beta2,
              omb2 = k->one_minus_beta2, bc2 = k->bias_correction2_sqrt, eps = k->eps, nss = k->neg_step_size;
#define ADAM_ELEMENT(decay_g, decay_p)                                  \
  {                                                                     \
    float gi = g[i], pi = p[i];                                         \
    if (decay_g) gi = fmaf(pi, wd, gi);                                 \
    if (decay_p) pi = pi * factor;                                      \
    float mi = fmaf(gi, omb1, m[i] * b1);                               \
    float vi = fmaf(omb2 * gi, gi, v[i] * b2);                          \
    float denom = sqrtf(vi) / bc2 + eps;                                \
    p[i] = pi + (nss * mi) / denom;                                     \
    m[i] = mi, v[i] = vi;                                               \
  }
  if (k->decoupled) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) ADAM_ELEMENT(0, 1)
  } else if (k->coupled_decay) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) ADAM_ELEMENT(1, 0)
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) ADAM_ELEMENT(0, 0)
  }
#undef ADAM_ELEMENT
}

attn_status attn_adam_step(attn_tensor *param, const attn_tensor *grad, attn_tensor *exp_avg, attn_tensor *exp_avg_sq,
                           int64_t step, const attn_adam_options *o) {
  const int64_t n = attn_numel(param), chunks = (n + CHUNK - 1) / CHUNK;
  attn_status st;
  if ((st = check_count(grad, n, "grad")) || (st = check_count(exp_avg, n, "exp_avg")) ||
      (st = check_count(exp_avg_sq, n, "exp_avg_sq")))
    return st;
  if (step < 1) return attn_fail(ATTN_EARG, "step must be >= 1, got %lld", (long long)step);
  const double bias_correction1 = 1.0 - pow(o->beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(o->beta2, (double)step);
  const adam_scalars k = {
      .neg_step_size = (float)(-(o->lr / bias_correction1)),
      .bias_correction2_sqrt = (float)sqrt(bias_correction2),
      .beta1 = (float)o->beta1, .one_minus_beta1 = (float)(1.0 - o->beta1),
      .beta2 = (float)o->beta2, .one_minus_beta2 = (float)(1.0 - o->beta2),
      .eps = (float)o->eps, .wd = (float)o->weight_decay,
      .decoupled_factor = (float)(1.0 - o->lr * o->weight_decay),
      .decoupled = o->decoupled_weight_decay,
      .coupled_decay = !o->decoupled_weight_decay && o->weight_decay != 0.0,
  };
  float *p = param->data, *m = exp_avg->data, *v = exp_avg_sq->data;
  const float *g = grad->data;
  /* param, grad, exp_avg, exp_avg_sq: (*), in chunks of CHUNK elements */
#pragma omp parallel for schedule(static) num_threads(attn_threads_for(chunks)) if (n > PARALLEL_ELEMS)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
    adam_chunk(p + i0, g + i0, m + i0, v + i0, len, &k);
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
