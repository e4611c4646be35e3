/* The shared attention core (src/core/sdpa_common.h), the bottom layer that
 * every SDPA kernel calls and that calls no kernel: option defaults, operand
 * validation and slice addressing, the softcap and ALiBi tile loops, the
 * scratch plan and the mask helpers. The score modifications and visible
 * ranges are inline in sdpa_common.h, so the drivers' tile loops stay as
 * cheap as when each wrote its own. The kernel choice is above the kernels,
 * in src/core/sdpa_dispatch.c. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_common.h"
#include "threads.h"

/* -> every option off, scale 1 */
attn_sdpa_opts attn_sdpa_defaults(void) {
  attn_sdpa_opts o;
  memset(&o, 0, sizeof o);
  o.scale = 1.0f;
  return o;
}

/* The leading dims of t (all but the last two; none when t has fewer). */
static int lead_ndim(const attn_tensor *t) { return t->ndim > 2 ? t->ndim - 2 : 0; }

/* Does mask/bias t broadcast to [..., Lq, Lk] in its last two dims? */
static int fits_scores(const attn_tensor *t, int64_t lq, int64_t lk) {
  if (t->ndim >= 1 && t->size[t->ndim - 1] != 1 && t->size[t->ndim - 1] != lk) return 0;
  if (t->ndim >= 2 && t->size[t->ndim - 2] != 1 && t->size[t->ndim - 2] != lq) return 0;
  return 1;
}

/* q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev], mask, bias -> out shape [B..., Lq, Ev] */
attn_status attn_sdpa_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *mask, const attn_tensor *bias, int *ndim, int64_t *size) {
  char b1[200], b2[200], b3[200];
  const attn_tensor *ops[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++)
    if (ops[i]->ndim < 2)
      return attn_fail(ATTN_ESHAPE, "%s must have at least 2 dims ([..., L, E]), got %s", names[i],
                       attn_shape_str(ops[i], b1, sizeof b1));
  int64_t lq = q->size[q->ndim - 2], e = q->size[q->ndim - 1];
  int64_t lk = k->size[k->ndim - 2], ek = k->size[k->ndim - 1];
  int64_t lv = v->size[v->ndim - 2], ev = v->size[v->ndim - 1];
  if (ek != e)
    return attn_fail(ATTN_ESHAPE, "q %s and k %s differ in the embedding size E (%lld ~= %lld)",
                     attn_shape_str(q, b1, sizeof b1), attn_shape_str(k, b2, sizeof b2), (long long)e, (long long)ek);
  if (lv != lk)
    return attn_fail(ATTN_ESHAPE, "k %s and v %s differ in the key count Lk (%lld ~= %lld)",
                     attn_shape_str(k, b1, sizeof b1), attn_shape_str(v, b2, sizeof b2), (long long)lk, (long long)lv);
  int nb;
  int64_t batch[ATTN_MAX_DIMS];
  if (attn_broadcast_shape(q->ndim - 2, q->size, k->ndim - 2, k->size, &nb, batch) != ATTN_OK ||
      attn_broadcast_shape(nb, batch, v->ndim - 2, v->size, &nb, batch) != ATTN_OK)
    return attn_fail(ATTN_ESHAPE, "the leading dims of q %s, k %s and v %s do not broadcast",
                     attn_shape_str(q, b1, sizeof b1), attn_shape_str(k, b2, sizeof b2),
                     attn_shape_str(v, b3, sizeof b3));
  const attn_tensor *extra[2] = {mask, bias};
  const char *enames[2] = {"mask", "bias"};
  for (int i = 0; i < 2; i++) {
    const attn_tensor *t = extra[i];
    if (!t) continue;
    int64_t scores[ATTN_MAX_DIMS + 2];
    int ok = fits_scores(t, lq, lk);
    int nb2 = nb;
    int64_t batch2[ATTN_MAX_DIMS];
    if (ok && attn_broadcast_shape(nb, batch, lead_ndim(t), t->size, &nb2, batch2) != ATTN_OK) ok = 0;
    if (!ok) {
      for (int d = 0; d < nb; d++) scores[d] = batch[d];
      scores[nb] = lq;
      scores[nb + 1] = lk;
      return attn_fail(ATTN_ESHAPE, "%s %s does not broadcast to the scores [..., Lq, Lk] = %s", enames[i],
                       attn_shape_str(t, b1, sizeof b1), attn_sizes_str(nb + 2, scores, b2, sizeof b2));
    }
    nb = nb2;
    memcpy(batch, batch2, (size_t)nb * sizeof(int64_t));
  }
  if (nb + 2 > ATTN_MAX_DIMS)
    return attn_fail(ATTN_ESHAPE, "the result would have %d dims, at most %d are supported", nb + 2, ATTN_MAX_DIMS);
  for (int d = 0; d < nb; d++) size[d] = batch[d];
  size[nb] = lq;
  size[nb + 1] = ev;
  *ndim = nb + 2;
  return ATTN_OK;
}

/* kv [..., Hkv, L, D] -> a view [..., Hq, L, D] (head stride 0), g = Hq / Hkv */
attn_status attn_sdpa_gqa_view(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *kv,
                               attn_tensor *view, int64_t *group) {
  char b1[200], b2[200], b3[200];
  if (q->ndim < 3 || k->ndim < 3 || v->ndim < 3)
    return attn_fail(ATTN_ESHAPE,
                     "enable_gqa needs a head dim (dim -3) in q, k and v ([..., H, L, E]), got q %s, k %s, v %s",
                     attn_shape_str(q, b1, sizeof b1), attn_shape_str(k, b2, sizeof b2),
                     attn_shape_str(v, b3, sizeof b3));
  int64_t hq = q->size[q->ndim - 3], hk = k->size[k->ndim - 3], hv = v->size[v->ndim - 3];
  if (hk != hv)
    return attn_fail(ATTN_ESHAPE, "enable_gqa: k %s and v %s differ in their head count (dim -3: %lld ~= %lld)",
                     attn_shape_str(k, b1, sizeof b1), attn_shape_str(v, b2, sizeof b2), (long long)hk,
                     (long long)hv);
  if (hk < 1 || hq % hk != 0)
    return attn_fail(ATTN_ESHAPE,
                     "enable_gqa: the query heads must be a multiple of the kv heads (dim -3), got q %s with %lld and "
                     "k %s with %lld",
                     attn_shape_str(q, b1, sizeof b1), (long long)hq, attn_shape_str(k, b2, sizeof b2), (long long)hk);
  *view = *kv;
  view->size[kv->ndim - 3] = hq;
  view->stride[kv->ndim - 3] = 0;
  *group = hq / hk > 0 ? hq / hk : 1;
  return ATTN_OK;
}

/* attn_sdpa_shape through the GQA views when opts->enable_gqa */
attn_status attn_sdpa_out_shape(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                const attn_sdpa_opts *opts, int *ndim, int64_t *size) {
  if (!opts->enable_gqa) return attn_sdpa_shape(q, k, v, opts->mask, opts->bias, ndim, size);
  attn_tensor kg, vg;
  int64_t g;
  attn_status st = attn_sdpa_gqa_view(q, k, v, k, &kg, &g);
  if (st == ATTN_OK) st = attn_sdpa_gqa_view(q, k, v, v, &vg, &g);
  if (st != ATTN_OK) return st;
  return attn_sdpa_shape(q, &kg, &vg, opts->mask, opts->bias, ndim, size);
}

/* The window and the ALiBi slopes of opts into p (after its batch shape is
 * known): window sizes >= -1, softcap >= 0, slopes [H] or [B, H]. */
static attn_status describe_variants(const attn_sdpa_opts *opts, attn_sdpa_problem *p) {
  char b1[200], b2[200];
  p->window_left = p->window_right = -1;
  if (opts->has_window) {
    if (opts->window_left < -1 || opts->window_right < -1)
      return attn_fail(ATTN_EARG, "window sizes must be >= -1 (-1 = unbounded), got {%lld, %lld}",
                       (long long)opts->window_left, (long long)opts->window_right);
    /* a side wider than every key is unbounded: so i + d -+ size never overflows */
    p->window_left = opts->window_left > p->lq + p->lk ? -1 : opts->window_left;
    p->window_right = opts->window_right > p->lq + p->lk ? -1 : opts->window_right;
  }
  if (!(opts->softcap >= 0.0f) || isinf(opts->softcap))
    return attn_fail(ATTN_EARG, "softcap must be a finite number > 0 (0 = none), got %g", (double)opts->softcap);
  p->softcap = opts->softcap;
  const attn_tensor *sl = opts->alibi_slopes;
  if (sl) {
    int nb = p->nbatch;
    int ok = (sl->ndim == 1 || sl->ndim == 2) && nb >= sl->ndim && sl->size[sl->ndim - 1] == p->batch[nb - 1] &&
             (sl->ndim == 1 || sl->size[0] == p->batch[nb - 2]);
    if (!ok) {
      if (nb < 1)
        return attn_fail(ATTN_ESHAPE, "alibi_slopes needs q with a head dim ([..., H, Lq, E]), got alibi_slopes %s",
                         attn_shape_str(sl, b1, sizeof b1));
      if (nb < 2)
        return attn_fail(ATTN_ESHAPE, "alibi_slopes must be [H] = [%lld], got %s", (long long)p->batch[nb - 1],
                         attn_shape_str(sl, b1, sizeof b1));
      return attn_fail(ATTN_ESHAPE, "alibi_slopes must be [H] = [%lld] or [B, H] = %s, got %s",
                       (long long)p->batch[nb - 1], attn_sizes_str(2, p->batch + nb - 2, b2, sizeof b2),
                       attn_shape_str(sl, b1, sizeof b1));
    }
    attn_status st = attn_expand(sl, nb, p->batch, &p->alibi);
    if (st != ATTN_OK) return st;
    p->has_alibi = 1;
  }
  const attn_block_mask *bm = opts->block_mask;
  if (bm) {
    /* its B and H are the batch's last two dims (1 broadcasts; a missing dim is 1) */
    int nb = p->nbatch;
    int64_t cb = nb >= 2 ? p->batch[nb - 2] : 1, ch = nb >= 1 ? p->batch[nb - 1] : 1;
    if ((bm->b != 1 && bm->b != cb) || (bm->h != 1 && bm->h != ch) || bm->lq != p->lq || bm->lk != p->lk)
      return attn_fail(ATTN_ESHAPE,
                       "block_mask was built for B %lld, H %lld, Lq %lld, Lk %lld, but the call has B %lld, H %lld "
                       "(q's dims -4 and -3), Lq %lld, Lk %lld (a B or H of 1 broadcasts)",
                       (long long)bm->b, (long long)bm->h, (long long)bm->lq, (long long)bm->lk, (long long)cb,
                       (long long)ch, (long long)p->lq, (long long)p->lk);
    p->block_mask = bm;
  }
  /* score programs: every gather in range over the call's positions, checked before any kernel reads */
  int nb = p->nbatch;
  int64_t hs = nb >= 1 ? p->batch[nb - 1] : 1, bs = nb >= 1 ? attn_sizes_product(nb - 1, p->batch) : 1;
  const attn_score_mod *progs[2] = {opts->score_mod, opts->mask_mod};
  const char *names[2] = {"attn.score_mod", "attn.mask_mod"};
  for (int i = 0; i < 2; i++) {
    if (!progs[i]) continue;
    if (progs[i]->is_mask != i) return attn_fail(ATTN_EARG, "%s: got a program of the other kind", names[i]);
    if (bs > 0 && hs > 0 && p->lq > 0 && p->lk > 0) {
      attn_status st = attn_score_mod_check(progs[i], names[i], bs, hs, p->lq, p->lk);
      if (st != ATTN_OK) return st;
    }
  }
  p->score_mod = opts->score_mod;
  p->mask_mod = opts->mask_mod;
  return ATTN_OK;
}

/* t contiguous [B..., r, cols] -> 1 */
static int check_out(const attn_tensor *t, int nb, const int64_t *batch, int64_t r, int64_t cols) {
  if (t->ndim != nb + 2 || !attn_is_contiguous(t)) return 0;
  for (int d = 0; d < nb; d++)
    if (t->size[d] != batch[d]) return 0;
  return t->size[nb] == r && t->size[nb + 1] == cols;
}


/* lse [B..., Lq], contiguous. */
static int check_lse(const attn_tensor *t, int nb, const int64_t *batch, int64_t lq) {
  if (t->ndim != nb + 1 || !attn_is_contiguous(t)) return 0;
  for (int d = 0; d < nb; d++)
    if (t->size[d] != batch[d]) return 0;
  return t->size[nb] == lq;
}

/* q, k, v, opts -> p: checked and expanded to [B..., rows, cols] */
attn_status attn_sdpa_describe(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_sdpa_opts *opts, attn_sdpa_problem *p) {
  int ondim;
  int64_t osize[ATTN_MAX_DIMS];
  attn_tensor kg, vg; /* k and v seen with q's head count (enable_gqa) */
  int64_t group = 1;
  if (opts->enable_gqa) {
    attn_status sg = attn_sdpa_gqa_view(q, k, v, k, &kg, &group);
    if (sg == ATTN_OK) sg = attn_sdpa_gqa_view(q, k, v, v, &vg, &group);
    if (sg != ATTN_OK) return sg;
  }
  const attn_tensor *k_real = k, *v_real = v;
  /* a group of 1 is plain attention: q's head dim may then be 1 broadcast by
   * the mask or bias beyond k's, and the kv head is no function of the batch's head */
  int gqa = opts->enable_gqa && group > 1;
  if (gqa) k = &kg, v = &vg;
  attn_status st = attn_sdpa_shape(q, k, v, opts->mask, opts->bias, &ondim, osize);
  if (st != ATTN_OK) return st;
  if (!(opts->dropout_p >= 0.0 && opts->dropout_p < 1.0))
    return attn_fail(ATTN_EARG, "dropout_p must be in [0, 1), got %g", opts->dropout_p);
  if (opts->mask) {
    int64_t at[ATTN_MAX_DIMS];
    float bad;
    if (attn_mask_find_non_binary(opts->mask, at, &bad)) {
      char b1[200];
      return attn_fail(ATTN_EARG,
                       "mask must hold only 0 and 1 (nonzero = hidden), got %.9g at %s; to add values to the "
                       "scores pass them as bias",
                       (double)bad, attn_sizes_str(opts->mask->ndim, at, b1, sizeof b1));
    }
  }
  memset(p, 0, sizeof *p);
  p->nbatch = ondim - 2;
  memcpy(p->batch, osize, (size_t)p->nbatch * sizeof(int64_t));
  p->lq = q->size[q->ndim - 2];
  p->e = q->size[q->ndim - 1];
  p->lk = k->size[k->ndim - 2];
  p->ev = v->size[v->ndim - 1];
  p->scale = opts->scale;
  p->is_causal = opts->is_causal;
  p->dropout_p = opts->dropout_p;
  p->dropout_draw = opts->dropout_draw;
  p->gqa_group = group;
  if (gqa) {
    p->k_head_stride = k_real->stride[k_real->ndim - 3];
    p->v_head_stride = v_real->stride[v_real->ndim - 3];
  }
  if ((st = describe_variants(opts, p)) != ATTN_OK) return st;
  /* with E = 0 no score is scaled (the default 1/sqrt(0) is inf) */
  if (p->e > 0 && !isfinite(opts->scale))
    return attn_fail(ATTN_EARG, "scale must be finite in float32, got %g", (double)opts->scale);
  char b1[200], b2[200];
  if (opts->lse) {
    if (!check_lse(opts->lse, p->nbatch, p->batch, p->lq))
      return attn_fail(ATTN_ESHAPE, "lse must be contiguous %s, got %s",
                       attn_sizes_str(ondim - 1, osize, b1, sizeof b1), attn_shape_str(opts->lse, b2, sizeof b2));
    p->lse = opts->lse;
  }
  if (opts->probs) {
    if (!check_out(opts->probs, p->nbatch, p->batch, p->lq, p->lk))
      return attn_fail(ATTN_ESHAPE, "probs must be contiguous with the scores' shape, got %s",
                       attn_shape_str(opts->probs, b2, sizeof b2));
    p->probs = opts->probs;
  }
  if (p->lq > INT_MAX || p->lk > INT_MAX || p->e > INT_MAX || p->ev > INT_MAX)
    return attn_fail(ATTN_EARG, "sizes above %d are not supported by BLAS (Lq %lld, Lk %lld, E %lld, Ev %lld)", INT_MAX,
                     (long long)p->lq, (long long)p->lk, (long long)p->e, (long long)p->ev);

  int64_t full[ATTN_MAX_DIMS];
  memcpy(full, p->batch, (size_t)p->nbatch * sizeof(int64_t));
  full[p->nbatch] = p->lq;
  full[p->nbatch + 1] = p->e;
  if ((st = attn_expand(q, ondim, full, &p->q)) != ATTN_OK) return st;
  full[p->nbatch] = p->lk;
  if ((st = attn_expand(k, ondim, full, &p->k)) != ATTN_OK) return st;
  full[p->nbatch + 1] = p->ev;
  if ((st = attn_expand(v, ondim, full, &p->v)) != ATTN_OK) return st;
  full[p->nbatch] = p->lq;
  full[p->nbatch + 1] = p->lk;
  if (opts->mask) {
    if ((st = attn_expand(opts->mask, ondim, full, &p->mask)) != ATTN_OK) return st;
    p->has_mask = 1;
  }
  if (opts->bias) {
    if ((st = attn_expand(opts->bias, ondim, full, &p->bias)) != ATTN_OK) return st;
    p->has_bias = 1;
  }
  return ATTN_OK;
}

/* qkv rows of [q | k | v] (h heads of hd) -> p, unchecked */
void attn_sdpa_describe_heads(float *qkv, int64_t h, int64_t n, int64_t hd, int64_t ld, const attn_tensor *mask,
                              int is_causal, float scale, attn_sdpa_problem *p) {
  p->nbatch = 1;
  p->batch[0] = h;
  p->lq = p->lk = n;
  p->e = p->ev = hd;
  attn_tensor *views[3] = {&p->q, &p->k, &p->v};
  for (int i = 0; i < 3; i++) {
    attn_tensor *t = views[i];
    t->data = qkv + i * h * hd;
    t->ndim = 3;
    t->size[0] = h, t->size[1] = n, t->size[2] = hd;
    t->stride[0] = hd, t->stride[1] = ld, t->stride[2] = 1;
  }
  p->has_mask = mask != NULL;
  if (mask) { /* [n, n] broadcast over the heads */
    p->mask = *mask;
    p->mask.ndim = 3;
    p->mask.size[0] = h, p->mask.size[1] = n, p->mask.size[2] = n;
    p->mask.stride[0] = 0, p->mask.stride[1] = mask->stride[0], p->mask.stride[2] = mask->stride[1];
  }
  p->has_bias = 0;
  p->scale = scale;
  p->is_causal = is_causal;
  p->dropout_p = 0.0; /* the tiny path draws its dropout factors itself (positions over the whole batch) */
  p->dropout_draw = (attn_dropout_draw){0, NULL};
  p->lse = NULL;
  p->gqa_group = 1;
  p->k_head_stride = p->v_head_stride = 0;
  p->window_left = p->window_right = -1;
  p->has_alibi = 0;
  p->softcap = 0.0f;
  p->probs = NULL;
  p->block_mask = NULL;
  p->score_mod = p->mask_mod = NULL;
}

/* attn_sdpa_describe, and out [B..., Lq, Ev], weights [B..., Lq, Lk] checked */
attn_status attn_sdpa_prepare(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_sdpa_opts *opts, const attn_tensor *out, const attn_tensor *weights,
                              attn_sdpa_problem *p) {
  attn_status st = attn_sdpa_describe(q, k, v, opts, p);
  if (st != ATTN_OK) return st;
  char b1[200], b2[200];
  int64_t osize[ATTN_MAX_DIMS];
  memcpy(osize, p->batch, (size_t)p->nbatch * sizeof(int64_t));
  osize[p->nbatch] = p->lq;
  osize[p->nbatch + 1] = p->ev;
  if (!check_out(out, p->nbatch, p->batch, p->lq, p->ev))
    return attn_fail(ATTN_ESHAPE, "out must be contiguous %s, got %s",
                     attn_sizes_str(p->nbatch + 2, osize, b1, sizeof b1), attn_shape_str(out, b2, sizeof b2));
  if (weights && !check_out(weights, p->nbatch, p->batch, p->lq, p->lk))
    return attn_fail(ATTN_ESHAPE, "weights must be contiguous with the scores' shape, got %s",
                     attn_shape_str(weights, b2, sizeof b2));
  return ATTN_OK;
}

/* The offset of slice bi in t, expanded to [B..., rows, cols]. The
 * outermost dim needs no remainder (bi < B): one batch dim (heads, or the
 * modules' tiny path) costs no division. */
static int64_t slice_offset(const attn_sdpa_problem *p, const attn_tensor *t, int64_t bi) {
  int64_t off = 0;
  for (int d = p->nbatch - 1; d > 0; d--) {
    off += (bi % p->batch[d]) * t->stride[d];
    bi /= p->batch[d];
  }
  return p->nbatch > 0 ? off + bi * t->stride[0] : off;
}

/* slice bi of p -> its operands' first elements, ALiBi slope, block pattern */
void attn_sdpa_slice_at(const attn_sdpa_problem *p, int64_t bi, attn_sdpa_slice *s) {
  s->bi = bi;
  s->q = p->q.data + slice_offset(p, &p->q, bi);
  s->k = p->k.data + slice_offset(p, &p->k, bi);
  s->v = p->v.data + slice_offset(p, &p->v, bi);
  if (p->gqa_group > 1 || p->k_head_stride || p->v_head_stride) {
    /* GQA: the head dim of k and v has stride 0 in p; query head h reads kv head h / g */
    int64_t kvh = (bi % p->batch[p->nbatch - 1]) / p->gqa_group;
    s->k += kvh * p->k_head_stride;
    s->v += kvh * p->v_head_stride;
  }
  s->alibi_slope = p->has_alibi ? p->alibi.data[slice_offset(p, &p->alibi, bi)] : 0.0f;
  s->blocks.kind = NULL, s->blocks.partial = NULL;
  const attn_block_mask *bm = p->block_mask;
  if (bm) { /* pattern (b, h) of the batch's last two dims; stored once when the same for all */
    int nb = p->nbatch;
    int64_t h = nb >= 1 ? bi % p->batch[nb - 1] : 0;
    int64_t b = nb >= 2 ? bi / p->batch[nb - 1] % p->batch[nb - 2] : 0;
    s->blocks = attn_block_mask_pattern(bm, (bm->sb == 1 ? 0 : b) * bm->sh + (bm->sh == 1 ? 0 : h));
  }
  int nbt = p->nbatch;
  s->h = nbt >= 1 ? bi % p->batch[nbt - 1] : 0;
  s->b = nbt >= 1 ? bi / p->batch[nbt - 1] : 0;
  s->mask = p->has_mask ? p->mask.data + slice_offset(p, &p->mask, bi) : NULL;
  s->bias = p->has_bias ? p->bias.data + slice_offset(p, &p->bias, bi) : NULL;
}

/* The score modifications' vector loops. Cloned per instruction set (the
 * best one runs, chosen by the loader): the same IEEE operations in any
 * width (no FMA contraction: -ffp-contract=off), so the same bits whatever
 * runs them, and ATTN_CPU need not choose. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ATTN_NO_CLONES)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* x -> tanh x in float32 (rational, clamped) */
static inline float tanh_rational(float x) {
  const float clamp = 7.90531110763549805f;
  float xc = x > clamp ? clamp : (x < -clamp ? -clamp : x);
  float x2 = xc * xc;
  float num = -2.76076847742355e-16f;
  num = num * x2 + 2.00018790482477e-13f;
  num = num * x2 + -8.60467152213735e-11f;
  num = num * x2 + 5.12229709037114e-08f;
  num = num * x2 + 1.48572235717979e-05f;
  num = num * x2 + 6.37261928875436e-04f;
  num = num * x2 + 4.89352455891786e-03f;
  num = num * xc;
  float den = 1.19825839466702e-06f;
  den = den * x2 + 1.18534705686654e-04f;
  den = den * x2 + 2.26843463243900e-03f;
  den = den * x2 + 4.89352518554385e-03f;
  float t = num / den;
  return fabsf(x) < 0.0004f ? x : t;
}

/* x -> tanh x (the softcap's, for the backward) */
float attn_sdpa_tanh(float x) { return tanh_rational(x); }

VECTOR_CLONES void attn_sdpa_tanh_vec(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++) y[j] = tanh_rational(x[j]);
}

VECTOR_CLONES void attn_sdpa_softcap_tile(float cap, int64_t ni, int64_t nk, float *s, int64_t rs, int64_t cs) {
  if (rs == 1 && ni > 1) {
    for (int64_t c = 0; c < nk; c++) {
      float *col = s + c * cs;
#pragma omp simd
      for (int64_t r = 0; r < ni; r++) col[r] = cap * tanh_rational(col[r] / cap);
    }
  } else if (cs == 1) { /* row-major (the math kernel, the backward): contiguous rows, no strided access */
    for (int64_t r = 0; r < ni; r++) {
      float *row = s + r * rs;
#pragma omp simd
      for (int64_t c = 0; c < nk; c++) row[c] = cap * tanh_rational(row[c] / cap);
    }
  } else {
    for (int64_t r = 0; r < ni; r++) {
      float *row = s + r * rs;
#pragma omp simd
      for (int64_t c = 0; c < nk; c++) row[c * cs] = cap * tanh_rational(row[c * cs] / cap);
    }
  }
}

VECTOR_CLONES void attn_sdpa_alibi_tile(float slope, int64_t dist, int64_t ni, int64_t nk, float *s, int64_t rs,
                                        int64_t cs) {
  if (rs == 1 && ni > 1) {
    for (int64_t c = 0; c < nk; c++) {
      float *col = s + c * cs;
      float d0 = (float)(dist - c);
#pragma omp simd
      for (int64_t r = 0; r < ni; r++) col[r] = col[r] + -slope * fabsf(d0 + (float)(int)r);
    }
  } else if (cs == 1) { /* row-major: contiguous rows */
    for (int64_t r = 0; r < ni; r++) {
      float *row = s + r * rs;
      float d0 = (float)(dist + r);
#pragma omp simd
      for (int64_t c = 0; c < nk; c++) row[c] = row[c] + -slope * fabsf(d0 - (float)(int)c);
    }
  } else {
    for (int64_t r = 0; r < ni; r++) {
      float *row = s + r * rs;
      float d0 = (float)(dist + r);
#pragma omp simd
      for (int64_t c = 0; c < nk; c++) row[c * cs] = row[c * cs] + -slope * fabsf(d0 - (float)(int)c);
    }
  }
}

/* Slope j (0-based) of n heads, n a power of 2: start^(j + 1) with start =
 * 2^(-8/n), written as the reference's start * ratio**j. */
static double alibi_power_of_2(int64_t n, int64_t j) {
  double start = pow(2.0, -pow(2.0, -(log2((double)n) - 3.0)));
  return start * pow(start, (double)j);
}

/* h -> slopes [h] */
void attn_alibi_slopes(int64_t h, float *out) {
  int64_t p2 = 1;
  while (p2 * 2 <= h) p2 *= 2;
  /* the p2 slopes of p2 heads, then the even-indexed (0, 2, ...) of 2 p2 heads */
  for (int64_t i = 0; i < h; i++)
    out[i] = (float)(i < p2 ? alibi_power_of_2(p2, i) : alibi_power_of_2(2 * p2, 2 * (i - p2)));
}

/* p, blocks per slice, floats per thread -> items, threads, scratch */
attn_status attn_sdpa_plan_work(const attn_sdpa_problem *p, int64_t nblk, size_t block, int block_ok,
                                attn_sdpa_work *w) {
  int64_t nb = attn_sizes_product(p->nbatch, p->batch);
  if (__builtin_mul_overflow(nb, nblk, &w->items))
    return attn_fail(ATTN_EOVERFLOW, "too many attention rows (%lld slices of %lld)", (long long)nb, (long long)p->lq);
  w->nthreads = attn_threads_for(w->items);
  size_t total = 0, bytes;
  int ok = block_ok && attn_sdpa_add_floats(&block, 15, 1);
  w->block = block & ~(size_t)15;
  ok = ok && attn_sdpa_add_floats(&total, (int64_t)w->block, w->nthreads);
  if (!ok || __builtin_mul_overflow(total, sizeof(float), &bytes) || bytes > SIZE_MAX - 64)
    return attn_fail(ATTN_ENOMEM, "the attention scratch size overflows (Lq %lld, Lk %lld, E %lld, Ev %lld)",
                     (long long)p->lq, (long long)p->lk, (long long)p->e, (long long)p->ev);
  w->scratch = aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
  if (!w->scratch) return attn_fail(ATTN_ENOMEM, "cannot allocate %zu bytes of attention scratch", bytes);
  return ATTN_OK;
}

/* mask -> 1 and (index, value) of its first element not 0 or 1 */
int attn_mask_find_non_binary(const attn_tensor *mask, int64_t *at, float *value) {
  /* a broadcast (stride 0) dim repeats its first element: visit that one only,
   * so an expanded mask costs what its storage holds */
  int nd = mask->ndim;
  int64_t extent[ATTN_MAX_DIMS], idx[ATTN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    if (mask->size[d] == 0) return 0;
    extent[d] = mask->stride[d] == 0 ? 1 : mask->size[d];
    idx[d] = 0;
  }
  const float *m = mask->data;
  int64_t off = 0;
  for (;;) {
    float x = m[off];
    if (x != 0.0f && x != 1.0f) { /* NaN and +-inf too */
      for (int d = 0; d < nd; d++) at[d] = idx[d] + 1;
      *value = x != x ? NAN : x; /* a positive NaN: printed "nan", not "-nan" */
      return 1;
    }
    int d = nd - 1;
    for (; d >= 0; d--) {
      off += mask->stride[d];
      if (++idx[d] < extent[d]) break;
      off -= mask->stride[d] * extent[d];
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}

/* 2-D mask, n -> 1 when its [n, n] corner is triu(ones, 1) */
int attn_mask_is_causal(const attn_tensor *mask, int64_t n) {
  if (mask->ndim != 2 || mask->size[0] < n || mask->size[1] < n) return 0;
  int64_t s0 = mask->stride[0], s1 = mask->stride[1];
  for (int64_t i = 0; i < n; i++) {
    const float *row = mask->data + i * s0;
    for (int64_t j = 0; j < n; j++)
      if (row[j * s1] != (j > i ? 1.0f : 0.0f)) return 0;
  }
  return 1;
}
