/* The fused forward of the causal self-attention modules of attn.nn
 * (CausalAttention, MultiHeadAttention): projections, head split, scaled
 * dot-product attention and the output projection in one call, with the same
 * numbers as the module-by-module path (Linear = sgemm then + bias; attention
 * = the "math" kernel, or "flash" where kernel = "auto" would take it). */
#ifndef ATTN_MODULES_H
#define ATTN_MODULES_H

#include <stdint.h>

#include "rng.h"
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

/* out [B, n, d_out] = the module's forward of x [B, n, d_in] (both
 * contiguous), causal (query i sees keys 0..i) or under m->mask. A query row
 * whose keys are all hidden gives zeros. Scratch is malloc'ed and
 * freed inside. Tiny problems run as direct loops on the calling thread (no
 * BLAS call, no OpenMP region); larger ones use sgemm and the attention
 * kernels, which thread themselves. */
attn_status attn_self_attention_forward(const attn_self_attention *m, const attn_tensor *x, attn_tensor *out);

#endif
