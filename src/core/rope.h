/* Rotary position embedding (RoPE, Su et al. 2021): x [..., n, E] rotated
 * pairwise by angles that grow with the position. */
#ifndef ATTN_ROPE_H
#define ATTN_ROPE_H

#include <stdint.h>

#include "tensor.h"

typedef enum attn_rope_style {
  ATTN_ROPE_HALF,       /* pairs (x[i], x[i + E/2]): Llama, GPT-NeoX (rotate_half) */
  ATTN_ROPE_INTERLEAVED /* pairs (x[2i], x[2i + 1]): GPT-J */
} attn_rope_style;

/* out [..., n, E] (contiguous, caller-owned, not overlapping x) = x (any
 * strides, E even) with each pair (a, b) of row r rotated by the angle
 * theta = (positions[r] - 1) * base^(-2i/E), i = 0 .. E/2 - 1 the pair:
 *   a' = a cos(theta) - b sin(theta),  b' = b cos(theta) + a sin(theta);
 * positions are 1-based (position 1 is not rotated). inverse = 1 rotates by
 * -theta: the backward (the rotation's transpose), dx = rope^-1(dy).
 * ATTN_ESHAPE / ATTN_EARG on a bad shape, odd E, base <= 0, a non-finite
 * position; ATTN_ENOMEM. */
attn_status attn_rope(const attn_tensor *x, const double *positions, double base, attn_rope_style style, int inverse,
                      attn_tensor *out);

#endif
