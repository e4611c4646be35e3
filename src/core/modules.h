/* The fused forward of the causal self-attention modules of attn.nn
 * (CausalAttention, MultiHeadAttention): projections, head split, scaled
 * dot-product attention and the output projection in one call, with the same
 * numbers as the module-by-module path (Linear = sgemm then + bias; attention
 * = the "math" kernel, or "flash" where kernel = "auto" would take it). */
#ifndef ATTN_MODULES_H
#define ATTN_MODULES_H

#include <stdint.h>

#include "rng.h"
#include "sdpa_common.h"
#include "tensor.h"

typedef struct attn_self_attention {
  const attn_tensor *wq, *wk, *wv; /* [d_out, d_in] (Linear weights) */
  const attn_tensor *bq, *bk, *bv; /* NULL or [d_out] */
  const attn_tensor *wo, *bo;      /* NULL (no output projection), or [d_out, d_out] and NULL or [d_out] */
  int64_t heads;                   /* d_out divisible by it; head_dim = d_out / heads */
  float scale;                     /* of the scores */
  double dropout_p;                /* [0, 1): dropout on the attention weights */
  attn_dropout_draw dropout_draw;  /* this call's draw (rng.h) over the weights [B, heads, n, n] when
                                      dropout_p > 0 */
  const attn_tensor *mask;         /* NULL: causal; else [n, n] of 0 and 1 (nonzero = hidden), in its place */
} attn_self_attention;

/* Whether m is usable on inputs of width d_in: weights [d_out, d_in] (d_out
 * from wq) with a unit stride (as BLAS takes them), biases [d_out], out_proj
 * [d_out, d_out], heads dividing d_out, dropout_p in [0, 1). */
attn_status attn_self_attention_check(const attn_self_attention *m, int64_t d_in);

/* The checks the forward and the backward share: x a contiguous [B, n,
 * d_in], m usable on it (attn_self_attention_check), y (the forward's out or
 * the backward's dout, named yname in the message) a contiguous [B, n,
 * d_out], and m->mask (when set) [n, n]. */
attn_status attn_self_attention_check_call(const attn_self_attention *m, const attn_tensor *x, const attn_tensor *y,
                                           const char *yname);

/* The attention options of m's forward and backward: its scale, causal
 * (no mask) or its mask, its dropout and draw. */
attn_sdpa_opts attn_self_attention_sdpa_opts(const attn_self_attention *m);

/* out [B, n, d_out] = the module's forward of x [B, n, d_in] (both
 * contiguous), causal (query i sees keys 0..i) or under m->mask. A query row
 * whose keys are all hidden gives zeros. Scratch is malloc'ed and
 * freed inside. Tiny problems run as direct loops on the calling thread (no
 * BLAS call, no OpenMP region); larger ones use sgemm and the attention
 * kernels, which thread themselves. */
attn_status attn_self_attention_forward(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out);

/* What the training forward keeps for the backward (attn_self_attention_backward_saved),
 * so that the backward does not recompute the projections and the attention.
 * With rows = B n, D = d_out, h heads of hd = D / h, every buffer contiguous: */
typedef struct attn_self_attention_saved {
  float *qkv;   /* [3, rows, D]: Q, K, V, the projections (biases added) */
  float *o;     /* [B, h, n, hd]: the attention's output */
  float *c;     /* [rows, D]: o with the heads side by side, out_proj's input; NULL without out_proj */
  float *saved; /* the kernel's: MATH the softmax before dropout [B, h, n, n], FLASH the log-sum-exp [B, h, n] */
  int kernel;   /* attn_sdpa_kernel: the one kernel = "auto" takes for these sizes */
} attn_self_attention_saved;

/* Whether the forward of x [B, n, d_in] can keep its state (0 for a call
 * whose backward is tiny too, attn_self_attention_backward_tiny_fits: it
 * recomputes the state in its direct loops); if so *kernel is the one the
 * attention runs and *saved_floats the size of its `saved` buffer. */
int attn_self_attention_keeps(const attn_self_attention *m, int64_t nb, int64_t n, int64_t d_in, int *kernel,
                              int64_t *saved_floats);

/* attn_self_attention_forward (the same bits of out) that also fills s, whose
 * buffers the caller allocated for a call attn_self_attention_keeps accepts
 * (s->kernel: what it gave). Errors: those of the forward. */
attn_status attn_self_attention_forward_saving(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out,
                                               const attn_self_attention_saved *s);

/* The kernel (attn_sdpa_kernel) the attention of m runs for x [nb, n, d_in]
 * on the forward's BLAS path: what the state of attn_self_attention_state
 * holds (MATH: the softmax [B, h, n, n]; FLASH: the log-sum-exp [B, h, n]). */
int attn_self_attention_state_kernel(const attn_self_attention *m, int64_t nb, int64_t n);

/* The state attn_self_attention_forward_saving keeps, for any call (tiny
 * too), without computing out: what the backward recomputes when the
 * forward kept nothing. It runs the forward's own steps, so it has the bits
 * of what the forward computed (a tiny forward's direct loops sum in the
 * BLAS path's order). m and x as attn_self_attention_check_call accepts;
 * s->kernel: attn_self_attention_state_kernel's. Errors: ATTN_EARG (buffers
 * that do not fit), the attention's. */
attn_status attn_self_attention_state(const attn_self_attention *m, const attn_tensor *x,
                                      const attn_self_attention_saved *s);

#endif
