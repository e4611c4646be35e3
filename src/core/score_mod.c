/* Scriptable scores evaluated in C (src/core/score_mod.h): the program a
 * traced score_mod or mask_mod compiles to (lua/attn/score_mod.lua), run
 * over the kernels' score tiles from attn_sdpa_modify_tile (forward, every
 * kernel) and from the backward's tiles (src/core/sdpa_backward.c).
 *
 * Interpretation costs per tile line, not per element: a tile is cut into
 * lines along its contiguous direction (query rows for flash's transposed
 * tiles, keys for the row-major ones) of at most LINE elements, and the
 * program runs one instruction at a time over a line. A value that does not
 * vary along the line (it reads neither the score nor the line's varying
 * position: h, q - 1 on a key line, a gather by them) is computed once as a
 * scalar, and broadcast only when a varying value reads it. Every value
 * lives in a fixed stack array (ATTN_SMOD_MAX_INSNS x LINE floats): no
 * allocation, no function pointer per element, no Lua.
 *
 * Numbers as PyTorch 1.13 computes the same elementwise expression in
 * float32: positions are exact float32 integers (below 2^24), constants are
 * rounded to float32 (a Python scalar in a float32 op), + - * / and
 * comparisons are IEEE float32, floor ceil sign abs clamp minimum maximum
 * where as torch (NaN propagates through minimum, maximum and clamp; sign of
 * NaN is 0), pow with torch's special exponents (2, 3, 0.5, -0.5, -1, -2)
 * and powf otherwise, sigmoid = 1 / (1 + exp(-x)). exp, log, sqrt, sin, cos
 * are glibc's (expf, logf, sinf, cosf: within 1 ulp, as torch's Sleef
 * kernels; they may differ from torch in the last bit). tanh is the
 * softcap's (attn_sdpa_tanh: 4.1e-7 absolute), so `(s / c):tanh() * c` gives
 * the bits of the built-in softcap = c.
 *
 * The backward runs the program forward over a row, then its adjoint in
 * reverse (torch 1.13's derivative formulas: tanh 1 - y^2, sigmoid
 * (1 - y) y, minimum/maximum halved on ties, clamp by its bounds, where by
 * its condition, floor ceil sign 0), giving the score's gradient and the
 * gathers' gradients scattered into a buffer of the caller's (one per work
 * chunk, reduced in a fixed order: sdpa_backward.c).
 *
 * Fused shapes (find_shape, at compile time): three common programs skip
 * the interpretation and run as one loop over the tile, with the bits of the
 * program op by op: s + t[i1, ..., in] with every index an integer affine
 * form of the positions (one strided read of the table per element; its
 * backward adds dS along the table at the same affine offsets, with no
 * forward pass for P's program and no adjoint pass), s - x |d| with x
 * constant over a slice and d = +-(q - k) + const (the built-in ALiBi's
 * loop: s + (-x) |d| is the same IEEE operation), and (s / c):tanh() * c
 * (the built-in softcap's loop). The backward of any s + y or s - y (y not
 * reading s) whose tables want no gradient is dS itself. A tile where an
 * affine index would leave exact float32 integers, or x is not finite,
 * runs the program op by op.
 *
 * Cost (flash, B's shape [1, 8, 4096, 64], 2 threads, best of 3 interleaved
 * rounds, three runs on a shared 2-core VM: scripts/attn-lua
 * scripts/bench.lua --cases score_mod_relbias,score_mod_alibi,
 * score_mod_softcap,mask_mod_document --reps 3): s + rel[h, q - k + L]
 * 0.99-1.07x the plain forward, 1.07-1.10x forward + backward (the table's
 * gradient included); s - slope[h] |q - k| 0.98-1.03x the built-in
 * alibi_slopes; (s / 30):tanh() * 30 1.01-1.04x the built-in softcap; the
 * document mask_mod 1.00x block_mask.document and causal. A program of
 * another shape pays the interpretation per line of at most 64 elements (a
 * dispatch and the affine bookkeeping per instruction, one pass per
 * instruction that needs elements; the backward evaluates the program twice:
 * for P, then the values its adjoints read): run that way, the three above
 * cost 1.27-1.38x forward and 1.55-1.81x forward + backward (the table),
 * 1.22-1.25x (ALiBi) and 1.04-1.22x (softcap) in the same setting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "score_mod.h"
#include "sdpa_common.h"

#define LINE 64

/* Cloned per instruction set as the softcap's loops (src/core/sdpa_common.c):
 * IEEE operations only (no FMA contraction), the same bits in any width. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ATTN_NO_CLONES)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

static int n_operands(int op) {
  switch (op) {
  case ATTN_SMOD_SCORE: case ATTN_SMOD_B: case ATTN_SMOD_H: case ATTN_SMOD_Q: case ATTN_SMOD_K:
  case ATTN_SMOD_CONST: case ATTN_SMOD_GATHER:
    return 0;
  case ATTN_SMOD_ADD: case ATTN_SMOD_SUB: case ATTN_SMOD_MUL: case ATTN_SMOD_DIV: case ATTN_SMOD_MIN:
  case ATTN_SMOD_MAX: case ATTN_SMOD_LT: case ATTN_SMOD_LE: case ATTN_SMOD_GT: case ATTN_SMOD_GE:
  case ATTN_SMOD_EQ: case ATTN_SMOD_NE: case ATTN_SMOD_AND: case ATTN_SMOD_OR:
    return 2;
  case ATTN_SMOD_CLAMP: case ATTN_SMOD_WHERE:
    return 3;
  default:
    return 1;
  }
}


/* ------------------------------------------------------------ shapes */

#define AFF_LIMIT 16777216 /* 2^24: integers exact in float32 */

/* integer affine forms of the positions (an op whose coefficients would pass 2^24 is not one) */
static void find_affine(attn_score_mod *m) {
  for (int i = 0; i < m->n; i++) {
    const attn_smod_insn *in = &m->code[i];
    int64_t *f = m->aff[i];
    int ok = 0;
    memset(f, 0, 5 * sizeof *f);
    int aa = in->a >= 0 && in->a < i && m->is_aff[in->a], ab = in->b >= 0 && in->b < i && m->is_aff[in->b];
    const int64_t *fa = aa ? m->aff[in->a] : NULL, *fb = ab ? m->aff[in->b] : NULL;
    switch (in->op) {
    case ATTN_SMOD_B: f[1] = 1, ok = 1; break;
    case ATTN_SMOD_H: f[2] = 1, ok = 1; break;
    case ATTN_SMOD_Q: f[3] = 1, ok = 1; break;
    case ATTN_SMOD_K: f[4] = 1, ok = 1; break;
    case ATTN_SMOD_CONST:
      ok = in->k == floorf(in->k) && fabsf(in->k) <= (float)AFF_LIMIT;
      if (ok) f[0] = (int64_t)in->k;
      break;
    case ATTN_SMOD_ADD: case ATTN_SMOD_SUB:
      ok = aa && ab;
      for (int c = 0; ok && c < 5; c++) f[c] = in->op == ATTN_SMOD_ADD ? fa[c] + fb[c] : fa[c] - fb[c];
      break;
    case ATTN_SMOD_NEG:
      ok = aa;
      for (int c = 0; ok && c < 5; c++) f[c] = -fa[c];
      break;
    case ATTN_SMOD_MUL: {
      int ca = aa && !(fa[1] | fa[2] | fa[3] | fa[4]), cb = ab && !(fb[1] | fb[2] | fb[3] | fb[4]);
      ok = aa && ab && (ca || cb);
      for (int c = 0; ok && c < 5; c++) f[c] = ca ? fa[0] * fb[c] : fa[c] * fb[0];
      break;
    }
    default: break;
    }
    for (int c = 0; ok && c < 5; c++) ok = f[c] >= -AFF_LIMIT && f[c] <= AFF_LIMIT;
    m->is_aff[i] = (unsigned char)ok;
    if (!ok) memset(f, 0, 5 * sizeof *f);
  }
}

/* the values root reads (and root), in program order, into list; 0 when one is not affine and aff_only */
static int cone_of(const attn_score_mod *m, const int *roots, int nroots, int aff_only, short *list, int *cnt) {
  unsigned char need[ATTN_SMOD_MAX_INSNS] = {0};
  for (int r = 0; r < nroots; r++) need[roots[r]] = 1;
  for (int i = m->n - 1; i >= 0; i--) {
    if (!need[i]) continue;
    const attn_smod_insn *in = &m->code[i];
    if (in->a >= 0) need[in->a] = 1;
    if (in->b >= 0) need[in->b] = 1;
    if (in->c >= 0) need[in->c] = 1;
    if (in->op == ATTN_SMOD_GATHER)
      for (int d = 0; d < in->nd; d++) need[in->ix[d]] = 1;
  }
  *cnt = 0;
  for (int i = 0; i < m->n; i++) {
    if (!need[i]) continue;
    if (aff_only && !m->is_aff[i]) return 0;
    list[(*cnt)++] = (short)i;
  }
  return 1;
}

static void find_shape(attn_score_mod *m) {
  m->shape = ATTN_SMOD_SHAPE_NONE;
  m->score_lin = 0;
  m->ncone = m->nxcone = 0;
  if (m->is_mask) return;
  int last = m->n - 1, nscores = 0;
  const attn_smod_insn *r = &m->code[last];
  int is_s[ATTN_SMOD_MAX_INSNS];
  for (int i = 0; i < m->n; i++) is_s[i] = m->code[i].op == ATTN_SMOD_SCORE, nscores += is_s[i];
  if (nscores != 1) return;
  /* s + y, y + s, s - y */
  int y = -1;
  if (r->op == ATTN_SMOD_ADD || r->op == ATTN_SMOD_SUB) {
    if (is_s[r->a] && !(m->code[r->b].deps & ATTN_SMOD_DEP_S)) y = r->b;
    else if (r->op == ATTN_SMOD_ADD && is_s[r->b] && !(m->code[r->a].deps & ATTN_SMOD_DEP_S)) y = r->a;
  }
  m->score_lin = y >= 0;
  if (y >= 0 && r->op == ATTN_SMOD_ADD && m->code[y].op == ATTN_SMOD_GATHER) {
    const attn_smod_insn *g = &m->code[y];
    int roots[ATTN_MAX_DIMS];
    for (int d = 0; d < g->nd; d++) roots[d] = g->ix[d];
    if (cone_of(m, roots, g->nd, 1, m->cone, &m->ncone)) m->shape = ATTN_SMOD_SHAPE_ADD_GATHER, m->shape_g = y;
    return;
  }
  if (y >= 0 && r->op == ATTN_SMOD_SUB && m->code[y].op == ATTN_SMOD_MUL) {
    const attn_smod_insn *p = &m->code[y];
    int x = -1, d = -1;
    if (m->code[p->b].op == ATTN_SMOD_ABS) x = p->a, d = m->code[p->b].a;
    else if (m->code[p->a].op == ATTN_SMOD_ABS) x = p->b, d = m->code[p->a].a;
    if (x < 0 || (m->code[x].deps & ~(ATTN_SMOD_DEP_B | ATTN_SMOD_DEP_H)) || !m->is_aff[d]) return;
    const int64_t *f = m->aff[d];
    if (!((f[3] == 1 && f[4] == -1) || (f[3] == -1 && f[4] == 1))) return;
    if (!cone_of(m, &d, 1, 1, m->cone, &m->ncone) || !cone_of(m, &x, 1, 0, m->xcone, &m->nxcone)) return;
    m->shape = ATTN_SMOD_SHAPE_SUB_SCALE_ABS, m->shape_g = x, m->shape_d = d;
    return;
  }
  /* (s / c):tanh() * c or c * (s / c):tanh(), the same finite c */
  if (r->op == ATTN_SMOD_MUL) {
    int t = -1, c2 = -1;
    if (m->code[r->a].op == ATTN_SMOD_TANH && m->code[r->b].op == ATTN_SMOD_CONST) t = r->a, c2 = r->b;
    else if (m->code[r->b].op == ATTN_SMOD_TANH && m->code[r->a].op == ATTN_SMOD_CONST) t = r->b, c2 = r->a;
    if (t < 0) return;
    const attn_smod_insn *dv = &m->code[m->code[t].a];
    if (dv->op != ATTN_SMOD_DIV || !is_s[dv->a] || m->code[dv->b].op != ATTN_SMOD_CONST) return;
    float c = m->code[c2].k, c1 = m->code[dv->b].k;
    if (!isfinite(c) || memcmp(&c, &c1, sizeof c) != 0) return;
    m->shape = ATTN_SMOD_SHAPE_SOFTCAP, m->shape_g = c2;
  }
}

attn_status attn_score_mod_finish(attn_score_mod *m) {
  if (m->n < 1 || m->n > ATTN_SMOD_MAX_INSNS)
    return attn_fail(ATTN_EARG, "a score program has 1 to %d instructions, got %d", ATTN_SMOD_MAX_INSNS, m->n);
  if (m->ntables < 0 || m->ntables > ATTN_SMOD_MAX_TABLES)
    return attn_fail(ATTN_EARG, "a score program reads at most %d tables, got %d", ATTN_SMOD_MAX_TABLES, m->ntables);
  for (int i = 0; i < m->n; i++) {
    attn_smod_insn *in = &m->code[i];
    if (in->op < 0 || in->op >= ATTN_SMOD_NOPS) return attn_fail(ATTN_EARG, "instruction %d: bad opcode %d", i, in->op);
    if (in->op == ATTN_SMOD_SCORE && m->is_mask) return attn_fail(ATTN_EARG, "a mask program has no score");
    int no = n_operands(in->op), ops[3] = {in->a, in->b, in->c};
    unsigned deps = 0;
    for (int o = 0; o < no; o++) {
      if (ops[o] < 0 || ops[o] >= i) return attn_fail(ATTN_EARG, "instruction %d: bad operand %d", i, ops[o]);
      deps |= m->code[ops[o]].deps;
    }
    switch (in->op) {
    case ATTN_SMOD_SCORE: deps = ATTN_SMOD_DEP_S; break;
    case ATTN_SMOD_B: deps = ATTN_SMOD_DEP_B; break;
    case ATTN_SMOD_H: deps = ATTN_SMOD_DEP_H; break;
    case ATTN_SMOD_Q: deps = ATTN_SMOD_DEP_Q; break;
    case ATTN_SMOD_K: deps = ATTN_SMOD_DEP_K; break;
    case ATTN_SMOD_GATHER:
      if (in->tbl < 0 || in->tbl >= m->ntables) return attn_fail(ATTN_EARG, "instruction %d: bad table %d", i, in->tbl);
      if (in->nd != m->tables[in->tbl].ndim || in->nd < 1 || in->nd > ATTN_MAX_DIMS)
        return attn_fail(ATTN_EARG, "instruction %d: %d indices for a table of %d dims", i, in->nd,
                         m->tables[in->tbl].ndim);
      for (int d = 0; d < in->nd; d++) {
        if (in->ix[d] < 0 || in->ix[d] >= i) return attn_fail(ATTN_EARG, "instruction %d: bad index %d", i, in->ix[d]);
        deps |= m->code[in->ix[d]].deps;
      }
      break;
    default: break;
    }
    in->deps = deps;
  }
  find_affine(m);
  find_shape(m);
  return ATTN_OK;
}

/* ------------------------------------------------------------ intervals */

typedef struct span {
  double lo, hi;
} span;

static const span FULL = {-INFINITY, INFINITY};

/* a span whose ends may be NaN (inf - inf, 0 * inf) made safe: all reals */
static span fix(span s) { return (isnan(s.lo) || isnan(s.hi)) ? FULL : s; }

static span mul_span(span a, span b) {
  double p[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
  span r = {p[0], p[0]};
  for (int i = 0; i < 4; i++) {
    if (isnan(p[i])) return FULL;
    r.lo = p[i] < r.lo ? p[i] : r.lo;
    r.hi = p[i] > r.hi ? p[i] : r.hi;
  }
  return r;
}

static float value_at(const attn_score_mod *m, const attn_smod_insn *in, const float *v, float b, float h, float q,
                      float k);

/* Gather g's indices at every point of the box, exactly: the fallback when
 * the interval bound cannot prove them in range (a where whose discarded
 * branch would leave it, as T5's bucket: base + where(n < e, n, large)).
 * Only the instructions the unproven indices (bit d of dims: index d) read
 * run, over only the positions they read; gathers among them were checked
 * before (instruction order). Costs
 * one scalar pass over those positions (e.g. Lq x Lk for an index of q and
 * k; a clamp in the expression lets the bound prove it instead). ATTN_OK
 * when every index is in range, ATTN_EARG naming the first point that is
 * not; *decided = 0 when it cannot tell (an index that reads the score). */
static attn_status check_gather_exact(const attn_score_mod *m, int g, unsigned dims, const char *what, int64_t nb,
                                      int64_t nh, int64_t lq, int64_t lk, int *decided) {
  const attn_smod_insn *gi = &m->code[g];
  const attn_smod_table *t = &m->tables[gi->tbl];
  int roots[ATTN_MAX_DIMS], nroots = 0;
  unsigned deps = 0;
  for (int d = 0; d < gi->nd; d++)
    if (dims >> d & 1u) roots[nroots++] = gi->ix[d], deps |= m->code[gi->ix[d]].deps;
  *decided = 0;
  if (deps & ATTN_SMOD_DEP_S) return ATTN_OK;
  *decided = 1;
  short cone[ATTN_SMOD_MAX_INSNS];
  int nc;
  cone_of(m, roots, nroots, 0, cone, &nc);
  int64_t eb = deps & ATTN_SMOD_DEP_B ? nb : 1, eh = deps & ATTN_SMOD_DEP_H ? nh : 1;
  int64_t eq = deps & ATTN_SMOD_DEP_Q ? lq : 1, ek = deps & ATTN_SMOD_DEP_K ? lk : 1;
  float v[ATTN_SMOD_MAX_INSNS] = {0};
  for (int64_t b = 1; b <= eb; b++)
    for (int64_t h = 1; h <= eh; h++)
      for (int64_t q = 1; q <= eq; q++)
        for (int64_t k = 1; k <= ek; k++) {
          for (int c = 0; c < nc; c++)
            v[cone[c]] = value_at(m, &m->code[cone[c]], v, (float)b, (float)h, (float)q, (float)k);
          for (int d = 0; d < gi->nd; d++) {
            if (!(dims >> d & 1u)) continue;
            float x = v[gi->ix[d]];
            if (!(x >= 1.0f && (double)x <= (double)t->size[d]))
              return attn_fail(ATTN_EARG,
                               "%s: index %d of captured tensor #%d is %.9g at b = %lld, h = %lld, q = %lld, k = %lld: "
                               "out of range (expected 1..%lld)",
                               what, d + 1, gi->tbl + 1, (double)x, (long long)b, (long long)h, (long long)q,
                               (long long)k, (long long)t->size[d]);
          }
        }
  return ATTN_OK;
}

attn_status attn_score_mod_check(const attn_score_mod *m, const char *what, int64_t nb, int64_t nh, int64_t lq,
                                 int64_t lk) {
  span v[ATTN_SMOD_MAX_INSNS];
  for (int i = 0; i < m->n; i++) {
    const attn_smod_insn *in = &m->code[i];
    span a = in->a >= 0 ? v[in->a] : FULL, b = in->b >= 0 ? v[in->b] : FULL, c = in->c >= 0 ? v[in->c] : FULL, r = FULL;
    switch (in->op) {
    case ATTN_SMOD_B: r = (span){1, (double)nb}; break;
    case ATTN_SMOD_H: r = (span){1, (double)nh}; break;
    case ATTN_SMOD_Q: r = (span){1, (double)lq}; break;
    case ATTN_SMOD_K: r = (span){1, (double)lk}; break;
    case ATTN_SMOD_CONST: r = (span){in->k, in->k}; break;
    case ATTN_SMOD_ADD: r = (span){a.lo + b.lo, a.hi + b.hi}; break;
    case ATTN_SMOD_SUB: r = (span){a.lo - b.hi, a.hi - b.lo}; break;
    case ATTN_SMOD_MUL: r = mul_span(a, b); break;
    case ATTN_SMOD_DIV:
      if (b.lo > 0 || b.hi < 0) r = mul_span(a, (span){1 / b.hi, 1 / b.lo});
      break;
    case ATTN_SMOD_NEG: r = (span){-a.hi, -a.lo}; break;
    case ATTN_SMOD_ABS:
      r = a.lo >= 0 ? a : a.hi <= 0 ? (span){-a.hi, -a.lo} : (span){0, -a.lo > a.hi ? -a.lo : a.hi};
      break;
    case ATTN_SMOD_EXP: r = (span){exp(a.lo), exp(a.hi)}; break;
    case ATTN_SMOD_LOG:
      if (a.lo >= 0) r = (span){log(a.lo), log(a.hi)};
      break;
    case ATTN_SMOD_SQRT:
      if (a.lo >= 0) r = (span){sqrt(a.lo), sqrt(a.hi)};
      break;
    case ATTN_SMOD_TANH: case ATTN_SMOD_SIN: case ATTN_SMOD_COS: case ATTN_SMOD_SIGN: r = (span){-1, 1}; break;
    case ATTN_SMOD_SIGMOID: r = (span){0, 1}; break;
    case ATTN_SMOD_FLOOR: r = (span){floor(a.lo), floor(a.hi)}; break;
    case ATTN_SMOD_CEIL: r = (span){ceil(a.lo), ceil(a.hi)}; break;
    case ATTN_SMOD_CLAMP: {
      span t = {a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
      r = (span){t.lo < c.lo ? t.lo : c.lo, t.hi < c.hi ? t.hi : c.hi};
      break;
    }
    case ATTN_SMOD_MIN: r = (span){a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi}; break;
    case ATTN_SMOD_MAX: r = (span){a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi}; break;
    case ATTN_SMOD_LT: case ATTN_SMOD_LE: case ATTN_SMOD_GT: case ATTN_SMOD_GE: case ATTN_SMOD_EQ:
    case ATTN_SMOD_NE: case ATTN_SMOD_AND: case ATTN_SMOD_OR: case ATTN_SMOD_NOT:
      r = (span){0, 1};
      break;
    case ATTN_SMOD_WHERE: {
      /* the true branch, when it is a compared value itself, holds only where the comparison is true (T5's
         bucket: where(n < e, n, large) keeps n below e). Only the true one: NaN fails every comparison, so
         it reaches the false branch, never the true one. */
      span tb = b, fb = c;
      const attn_smod_insn *cond = &m->code[in->a];
      int lt = cond->op == ATTN_SMOD_LT || cond->op == ATTN_SMOD_LE, gt = cond->op == ATTN_SMOD_GT || cond->op == ATTN_SMOD_GE;
      if (lt || gt) {
        span x = v[cond->a], y = v[cond->b];
        if (in->b == cond->a) tb = lt ? (span){x.lo, x.hi < y.hi ? x.hi : y.hi} : (span){x.lo > y.lo ? x.lo : y.lo, x.hi};
        else if (in->b == cond->b) tb = lt ? (span){y.lo > x.lo ? y.lo : x.lo, y.hi} : (span){y.lo, y.hi < x.hi ? y.hi : x.hi};
        if (tb.lo > tb.hi) tb = b; /* never taken: keep its own span */
      }
      r = (span){tb.lo < fb.lo ? tb.lo : fb.lo, tb.hi > fb.hi ? tb.hi : fb.hi};
      break;
    }
    case ATTN_SMOD_GATHER: {
      const attn_smod_table *t = &m->tables[in->tbl];
      int proven = 1;
      unsigned unproven = 0;
      for (int d = 0; d < in->nd; d++) {
        span ix = v[in->ix[d]];
        if (!(ix.lo >= 1 && ix.hi <= (double)t->size[d])) proven = 0, unproven |= 1u << d;
      }
      if (!proven) {
        int decided;
        attn_status exact = check_gather_exact(m, i, unproven, what, nb, nh, lq, lk, &decided);
        if (exact != ATTN_OK) return exact;
        proven = decided;
      }
      for (int d = 0; d < in->nd && !proven; d++) {
        span ix = v[in->ix[d]];
        if (!(ix.lo >= 1 && ix.hi <= (double)t->size[d])) {
          char lo[32], hi[32];
          snprintf(lo, sizeof lo, "%.17g", ix.lo);
          snprintf(hi, sizeof hi, "%.17g", ix.hi);
          return attn_fail(ATTN_EARG,
                           "%s: index %d of captured tensor #%d (size %lld along it) may range over [%s, %s] for "
                           "b in [1, %lld], h in [1, %lld], q in [1, %lld], k in [1, %lld]: out of range (expected "
                           "1..%lld; clamp it, e.g. with :clamp(1, %lld))",
                           what, d + 1, in->tbl + 1, (long long)t->size[d], lo, hi, (long long)nb, (long long)nh,
                           (long long)lq, (long long)lk, (long long)t->size[d], (long long)t->size[d]);
        }
      }
      /* the values' range, read (only a gather whose value becomes an index needs it; it costs one pass) */
      int64_t idx[ATTN_MAX_DIMS] = {0}, n = 1;
      for (int d = 0; d < t->ndim; d++) n *= t->size[d];
      double lo = INFINITY, hi = -INFINITY;
      int has_nan = 0;
      for (int64_t e = 0; e < n; e++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
        double x = t->data[off];
        if (isnan(x)) has_nan = 1;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
        for (int d = t->ndim - 1; d >= 0; d--) {
          if (++idx[d] < t->size[d]) break;
          idx[d] = 0;
        }
      }
      r = has_nan ? FULL : (span){lo, hi};
      break;
    }
    default: break;
    }
    v[i] = fix(r);
  }
  return ATTN_OK;
}

/* ------------------------------------------------------------ evaluation */

static inline float f_min(float x, float y) { return (x != x || y != y) ? x + y : (y < x ? y : x); }
static inline float f_max(float x, float y) { return (x != x || y != y) ? x + y : (x < y ? y : x); }
static inline float f_sign(float x) { return (float)((0.0f < x) - (x < 0.0f)); }
static inline float f_pow(float x, float k) {
  if (k == 2.0f) return x * x;
  if (k == 3.0f) return x * x * x;
  if (k == 0.5f) return sqrtf(x);
  if (k == -0.5f) return 1.0f / sqrtf(x);
  if (k == -1.0f) return 1.0f / x;
  if (k == -2.0f) return 1.0f / (x * x);
  return powf(x, k);
}

/* one scalar op on operand values x, y, z (the same as the vector loops) */
static float scalar_op(const attn_score_mod *m, const attn_smod_insn *in, const float *v) {
  float x = in->a >= 0 ? v[in->a] : 0.0f, y = in->b >= 0 ? v[in->b] : 0.0f, z = in->c >= 0 ? v[in->c] : 0.0f;
  switch (in->op) {
  case ATTN_SMOD_CONST: return in->k;
  case ATTN_SMOD_ADD: return x + y;
  case ATTN_SMOD_SUB: return x - y;
  case ATTN_SMOD_MUL: return x * y;
  case ATTN_SMOD_DIV: return x / y;
  case ATTN_SMOD_NEG: return -x;
  case ATTN_SMOD_POW: return f_pow(x, in->k);
  case ATTN_SMOD_ABS: return fabsf(x);
  case ATTN_SMOD_EXP: return expf(x);
  case ATTN_SMOD_LOG: return logf(x);
  case ATTN_SMOD_SQRT: return sqrtf(x);
  case ATTN_SMOD_TANH: return attn_sdpa_tanh(x);
  case ATTN_SMOD_SIGMOID: return 1.0f / (1.0f + expf(-x));
  case ATTN_SMOD_SIN: return sinf(x);
  case ATTN_SMOD_COS: return cosf(x);
  case ATTN_SMOD_FLOOR: return floorf(x);
  case ATTN_SMOD_CEIL: return ceilf(x);
  case ATTN_SMOD_SIGN: return f_sign(x);
  case ATTN_SMOD_CLAMP: return f_min(f_max(x, y), z);
  case ATTN_SMOD_MIN: return f_min(x, y);
  case ATTN_SMOD_MAX: return f_max(x, y);
  case ATTN_SMOD_LT: return (float)(x < y);
  case ATTN_SMOD_LE: return (float)(x <= y);
  case ATTN_SMOD_GT: return (float)(x > y);
  case ATTN_SMOD_GE: return (float)(x >= y);
  case ATTN_SMOD_EQ: return (float)(x == y);
  case ATTN_SMOD_NE: return (float)(x != y);
  case ATTN_SMOD_AND: return (float)(x != 0.0f && y != 0.0f);
  case ATTN_SMOD_OR: return (float)(x != 0.0f || y != 0.0f);
  case ATTN_SMOD_NOT: return (float)(x == 0.0f);
  case ATTN_SMOD_WHERE: return x != 0.0f ? y : z;
  case ATTN_SMOD_GATHER: {
    const attn_smod_table *t = &m->tables[in->tbl];
    int64_t off = 0;
    for (int d = 0; d < in->nd; d++) off += ((int64_t)v[in->ix[d]] - 1) * t->stride[d];
    return t->data[off];
  }
  default: return 0.0f;
  }
}

/* one instruction's value at the position (b, h, q, k) (1-based, as floats), its operands in v */
static float value_at(const attn_score_mod *m, const attn_smod_insn *in, const float *v, float b, float h, float q,
                      float k) {
  switch (in->op) {
  case ATTN_SMOD_B: return b;
  case ATTN_SMOD_H: return h;
  case ATTN_SMOD_Q: return q;
  case ATTN_SMOD_K: return k;
  default: return scalar_op(m, in, v);
  }
}

/* The values over lines of n elements: element j at positions (b, h, q0 + j
 * dq, k0 + j dk) (1-based, as floats) and score[j] (none for a mask). A
 * plan (per tile) sorts the instructions: class 0 reads none of the line's
 * positions and no score (computed once per tile), class 1 reads the line's
 * fixed position only (once per line, a scalar), class 2 varies along the
 * line (vectors). */
typedef struct line_vals {
  float sc[ATTN_SMOD_MAX_INSNS];
  const float *p[ATTN_SMOD_MAX_INSNS]; /* a varying value's elements: vec[i] or the score line; NULL while
                                          an affine value is not materialised */
  unsigned char in_vec[ATTN_SMOD_MAX_INSNS];
  /* integer values affine along the line, value j = base + j coef (the positions and + - * of them, and
   * integer scalars): a gather by them reads at a fixed step, with no float-to-int conversion, and they
   * are materialised only when an op needs their elements */
  unsigned char affine[ATTN_SMOD_MAX_INSNS];
  int64_t base[ATTN_SMOD_MAX_INSNS], coef[ATTN_SMOD_MAX_INSNS];
  int n0, n1, n2;                                              /* instructions per class */
  short c0[ATTN_SMOD_MAX_INSNS], c1[ATTN_SMOD_MAX_INSNS], c2[ATTN_SMOD_MAX_INSNS];
  float vec[ATTN_SMOD_MAX_INSNS][LINE];
} line_vals;

/* live: NULL, or the varying values to compute (the others are skipped) */
static void plan(const attn_score_mod *m, unsigned vary, unsigned fixed, const unsigned char *live, line_vals *lv) {
  lv->n0 = lv->n1 = lv->n2 = 0;
  for (int i = 0; i < m->n; i++) {
    unsigned d = m->code[i].deps;
    if (d & vary) {
      if (!live || live[i]) lv->c2[lv->n2++] = (short)i;
    } else if (d & fixed) {
      lv->c1[lv->n1++] = (short)i;
    } else {
      lv->c0[lv->n0++] = (short)i;
    }
  }
}

/* scalar instructions list[0..cnt) at positions (b, h, q, k) */
static void eval_scalars(const attn_score_mod *m, const short *list, int cnt, float b, float h, float q, float k,
                         line_vals *lv) {
  for (int t = 0; t < cnt; t++) {
    int i = list[t];
    const attn_smod_insn *in = &m->code[i];
    float x = value_at(m, in, lv->sc, b, h, q, k);
    lv->sc[i] = x;
    lv->in_vec[i] = 0;
    lv->affine[i] = x == floorf(x) && fabsf(x) < 16777216.0f;
    lv->base[i] = lv->affine[i] ? (int64_t)x : 0;
    lv->coef[i] = 0;
  }
}

/* the elements of varying value o (materialising an affine one) */
static inline const float *values(line_vals *lv, int o, int n) {
  if (!lv->p[o]) {
    float *d = lv->vec[o], b = (float)lv->base[o], c = (float)lv->coef[o];
#pragma omp simd
    for (int j = 0; j < n; j++) d[j] = b + (float)j * c;
    lv->p[o] = d;
  }
  return lv->p[o];
}

#define VEC_LOOP(expr)                                                                                                \
  do {                                                                                                                \
    _Pragma("omp simd") for (int j = 0; j < n; j++) {                                                                 \
      float x = X[j], y = Y[j], z = Z[j];                                                                             \
      (void)x, (void)y, (void)z;                                                                                      \
      out[j] = (expr);                                                                                                \
    }                                                                                                                 \
  } while (0)

/* value o (a scalar) as elements */
static inline void broadcast(line_vals *lv, int o, int n) {
  if (lv->in_vec[o]) {
    values(lv, o, n);
    return;
  }
  float x = lv->sc[o];
  float *d = lv->vec[o];
#pragma omp simd
  for (int j = 0; j < n; j++) d[j] = x;
  lv->p[o] = d;
  lv->in_vec[o] = 1;
}

/* a binary op with a scalar operand reads it as one (no broadcast) */
#define BIN_LOOP(expr)                                                                                                \
  do {                                                                                                                \
    int va_ = lv->in_vec[in->a], vb_ = lv->in_vec[in->b];                                                             \
    const float *Xb_ = va_ ? values(lv, in->a, n) : NULL, *Yb_ = vb_ ? values(lv, in->b, n) : NULL;                   \
    if (va_ && vb_) {                                                                                                 \
      _Pragma("omp simd") for (int j = 0; j < n; j++) {                                                               \
        float x = Xb_[j], y = Yb_[j];                                                                                 \
        out[j] = (expr);                                                                                              \
      }                                                                                                               \
    } else if (va_) {                                                                                                 \
      float y = lv->sc[in->b];                                                                                        \
      _Pragma("omp simd") for (int j = 0; j < n; j++) {                                                               \
        float x = Xb_[j];                                                                                             \
        out[j] = (expr);                                                                                              \
      }                                                                                                               \
    } else {                                                                                                          \
      float x = lv->sc[in->a];                                                                                        \
      _Pragma("omp simd") for (int j = 0; j < n; j++) {                                                               \
        float y = Yb_[j];                                                                                             \
        out[j] = (expr);                                                                                              \
      }                                                                                                               \
    }                                                                                                                 \
  } while (0)

/* the binary ops that take a scalar operand as is */
static int scalar_operand_ok(int op) {
  return (op >= ATTN_SMOD_ADD && op <= ATTN_SMOD_DIV) || op == ATTN_SMOD_MIN || op == ATTN_SMOD_MAX ||
         (op >= ATTN_SMOD_LT && op <= ATTN_SMOD_OR);
}

/* The class 2 instructions over one line (classes 0 and 1 already in sc).
 * out_last: where the last instruction writes its elements (a score line
 * of stride 1), or NULL for vec. */
VECTOR_CLONES static void eval_vectors(const attn_score_mod *m, float q0, float dq, float k0, float dk, int n,
                                       const float *score, float *out_last, line_vals *lv) {
  static const float zeros[LINE];
  for (int t = 0; t < lv->n2; t++) {
    int i = lv->c2[t];
    const attn_smod_insn *in = &m->code[i];
    float *out = (out_last && i == m->n - 1) ? out_last : lv->vec[i];
    lv->in_vec[i] = 1;
    lv->p[i] = out;
    lv->affine[i] = 0;
    int aff_a = in->a >= 0 && lv->affine[in->a], aff_b = in->b >= 0 && lv->affine[in->b];
    if (in->op == ATTN_SMOD_Q || in->op == ATTN_SMOD_K) {
      lv->affine[i] = 1;
      lv->base[i] = (int64_t)(in->op == ATTN_SMOD_Q ? q0 : k0);
      lv->coef[i] = (int64_t)(in->op == ATTN_SMOD_Q ? dq : dk);
    } else if ((in->op == ATTN_SMOD_ADD || in->op == ATTN_SMOD_SUB) && aff_a && aff_b) {
      int64_t sg = in->op == ATTN_SMOD_ADD ? 1 : -1;
      lv->affine[i] = 1;
      lv->base[i] = lv->base[in->a] + sg * lv->base[in->b];
      lv->coef[i] = lv->coef[in->a] + sg * lv->coef[in->b];
    } else if (in->op == ATTN_SMOD_NEG && aff_a) {
      lv->affine[i] = 1;
      lv->base[i] = -lv->base[in->a];
      lv->coef[i] = -lv->coef[in->a];
    } else if (in->op == ATTN_SMOD_MUL && aff_a && aff_b && (lv->coef[in->a] == 0 || lv->coef[in->b] == 0)) {
      lv->affine[i] = 1;
      lv->base[i] = lv->base[in->a] * lv->base[in->b];
      lv->coef[i] = lv->coef[in->a] * lv->base[in->b] + lv->coef[in->b] * lv->base[in->a];
    }
    /* kept to exact float32 integers over the line (operands then are too: no int64 overflow) */
    if (lv->affine[i] && (llabs(lv->base[i]) > 16777216 || llabs(lv->coef[i]) > 16777216 / LINE)) lv->affine[i] = 0;
    if (lv->affine[i] && out != out_last) { /* materialised when an op needs its elements */
      lv->p[i] = NULL;
      continue;
    }
    int no = n_operands(in->op);
    if (!(no == 2 && scalar_operand_ok(in->op))) {
      if (no >= 1) broadcast(lv, in->a, n);
      if (no >= 2) broadcast(lv, in->b, n);
      if (no >= 3) broadcast(lv, in->c, n);
    }
    const float *X = no >= 1 && no != 2 ? lv->p[in->a] : zeros, *Y = no >= 3 ? lv->p[in->b] : zeros,
                *Z = no >= 3 ? lv->p[in->c] : zeros;
    if (no == 2 && !scalar_operand_ok(in->op)) X = lv->p[in->a];
    switch (in->op) {
    case ATTN_SMOD_SCORE:
      if (out == out_last && out != score)
        memcpy(out, score, (size_t)n * sizeof(float));
      else
        lv->p[i] = score;
      break;
    case ATTN_SMOD_Q: case ATTN_SMOD_K: {
      float b0 = (float)lv->base[i], c0 = (float)lv->coef[i];
#pragma omp simd
      for (int j = 0; j < n; j++) out[j] = b0 + (float)j * c0;
      break;
    }
    case ATTN_SMOD_ADD: BIN_LOOP(x + y); break;
    case ATTN_SMOD_SUB: BIN_LOOP(x - y); break;
    case ATTN_SMOD_MUL: BIN_LOOP(x * y); break;
    case ATTN_SMOD_DIV: BIN_LOOP(x / y); break;
    case ATTN_SMOD_NEG: VEC_LOOP(-x); break;
    case ATTN_SMOD_ABS: VEC_LOOP(fabsf(x)); break;
    case ATTN_SMOD_TANH: attn_sdpa_tanh_vec(X, out, n); break;
    case ATTN_SMOD_FLOOR: VEC_LOOP(floorf(x)); break;
    case ATTN_SMOD_CEIL: VEC_LOOP(ceilf(x)); break;
    case ATTN_SMOD_SIGN: VEC_LOOP(f_sign(x)); break;
    case ATTN_SMOD_CLAMP: VEC_LOOP(f_min(f_max(x, y), z)); break;
    case ATTN_SMOD_MIN: BIN_LOOP(f_min(x, y)); break;
    case ATTN_SMOD_MAX: BIN_LOOP(f_max(x, y)); break;
    case ATTN_SMOD_LT: BIN_LOOP((float)(x < y)); break;
    case ATTN_SMOD_LE: BIN_LOOP((float)(x <= y)); break;
    case ATTN_SMOD_GT: BIN_LOOP((float)(x > y)); break;
    case ATTN_SMOD_GE: BIN_LOOP((float)(x >= y)); break;
    case ATTN_SMOD_EQ: BIN_LOOP((float)(x == y)); break;
    case ATTN_SMOD_NE: BIN_LOOP((float)(x != y)); break;
    case ATTN_SMOD_AND: BIN_LOOP((float)(x != 0.0f && y != 0.0f)); break;
    case ATTN_SMOD_OR: BIN_LOOP((float)(x != 0.0f || y != 0.0f)); break;
    case ATTN_SMOD_NOT: VEC_LOOP((float)(x == 0.0f)); break;
    case ATTN_SMOD_WHERE: VEC_LOOP(x != 0.0f ? y : z); break;
    case ATTN_SMOD_GATHER: {
      const attn_smod_table *tb = &m->tables[in->tbl];
      int64_t base = 0, a0 = 0, ast = 0, step[ATTN_MAX_DIMS];
      int nv = 0, aff = 1;
      for (int d = 0; d < in->nd; d++) {
        int o = in->ix[d];
        if (!lv->in_vec[o]) {
          base += ((int64_t)lv->sc[o] - 1) * tb->stride[d];
          continue;
        }
        aff = aff && lv->affine[o];
        a0 += (lv->base[o] - 1) * tb->stride[d];
        ast += lv->coef[o] * tb->stride[d];
        step[nv++] = tb->stride[d];
      }
      const float *data = tb->data + base;
      if (aff) { /* a fixed step along the line: read in place (step 1), or a strided copy */
        const float *d0 = data + a0;
        if (ast == 1 && out != out_last)
          lv->p[i] = d0;
        else if (ast == 1)
          memcpy(out, d0, (size_t)n * sizeof(float));
        else
          for (int j = 0; j < n; j++) out[j] = d0[j * ast];
        break;
      }
      const float *iv[ATTN_MAX_DIMS];
      nv = 0;
      for (int d = 0; d < in->nd; d++)
        if (lv->in_vec[in->ix[d]]) iv[nv++] = values(lv, in->ix[d], n);
      if (nv == 1 && step[0] == 1) { /* offsets in int: the table's extent was checked below 2^24 */
        const float *i0 = iv[0], *d1 = data - 1;
#pragma omp simd
        for (int j = 0; j < n; j++) out[j] = d1[(int)i0[j]];
      } else if (nv == 1) {
        const float *i0 = iv[0];
        int64_t s0 = step[0];
        for (int j = 0; j < n; j++) out[j] = data[((int64_t)i0[j] - 1) * s0];
      } else {
        for (int j = 0; j < n; j++) {
          int64_t off = 0;
          for (int d = 0; d < nv; d++) off += ((int64_t)iv[d][j] - 1) * step[d];
          out[j] = data[off];
        }
      }
      break;
    }
    case ATTN_SMOD_EXP: /* expf's bits, a line at a time (x - 0 = x) */
      VEC_LOOP(x);
      attn_cpu_kernels()->libm_exp_minus(out, n, 0.0f);
      break;
    case ATTN_SMOD_LOG: VEC_LOOP(logf(x)); break;
    case ATTN_SMOD_SQRT: VEC_LOOP(sqrtf(x)); break;
    case ATTN_SMOD_SIGMOID: { /* 1 / (1 + expf(-x)), expf a line at a time */
      VEC_LOOP(-x);
      attn_cpu_kernels()->libm_exp_minus(out, n, 0.0f);
      float *o = out;
#pragma omp simd
      for (int j = 0; j < n; j++) o[j] = 1.0f / (1.0f + o[j]);
      break;
    }
    case ATTN_SMOD_SIN: VEC_LOOP(sinf(x)); break;
    case ATTN_SMOD_COS: VEC_LOOP(cosf(x)); break;
    case ATTN_SMOD_POW: {
      float k = in->k;
      VEC_LOOP(f_pow(x, k));
      break;
    }
    default: break;
    }
  }
}

/* affine form f at 1-based positions */
static inline int64_t aff_at(const int64_t *f, int64_t b, int64_t h, int64_t q, int64_t k) {
  return f[0] + f[1] * b + f[2] * h + f[3] * q + f[4] * k;
}

/* every value of the shape's affine cone stays an exact float32 integer over positions b, h, q in [q0, q1],
 * k in [k0, k1] (1-based): the program op by op computes them exactly there, as the integer forms do */
static int cone_exact(const attn_score_mod *m, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  for (int c = 0; c < m->ncone; c++) {
    const int64_t *f = m->aff[m->cone[c]];
    int64_t v[4] = {aff_at(f, b, h, q0, k0), aff_at(f, b, h, q0, k1), aff_at(f, b, h, q1, k0), aff_at(f, b, h, q1, k1)};
    for (int e = 0; e < 4; e++)
      if (v[e] < -AFF_LIMIT || v[e] > AFF_LIMIT) return 0;
  }
  return 1;
}

/* the table offset of the ADD_GATHER shape's gather at (b, h, q, k) (1-based), and its steps along q and k,
 * for strides st */
static int64_t gather_offset(const attn_score_mod *m, const int64_t *st, int64_t b, int64_t h, int64_t q, int64_t k,
                             int64_t *oq, int64_t *ok) {
  const attn_smod_insn *g = &m->code[m->shape_g];
  int64_t o = 0;
  *oq = *ok = 0;
  for (int d = 0; d < g->nd; d++) {
    const int64_t *f = m->aff[g->ix[d]];
    o += (aff_at(f, b, h, q, k) - 1) * st[d];
    *oq += f[3] * st[d];
    *ok += f[4] * st[d];
  }
  return o;
}

/* The tile by a fused shape: 1 when done, 0 when this tile must run the program op by op (an index that
 * would leave exact float32 integers, a scale that is not finite). */
VECTOR_CLONES static int shape_tile(const attn_score_mod *m, int64_t b, int64_t h, int64_t i0, int64_t ni,
                                    int64_t k0, int64_t nk, float *s, int64_t rs, int64_t cs) {
  int64_t pb = b + 1, ph = h + 1;
  switch (m->shape) {
  case ATTN_SMOD_SHAPE_SOFTCAP: /* c tanh(s / c): the built-in's bits (a product commutes) */
    attn_sdpa_softcap_tile(m->code[m->shape_g].k, ni, nk, s, rs, cs);
    return 1;
  case ATTN_SMOD_SHAPE_ADD_GATHER: {
    if (!cone_exact(m, pb, ph, i0 + 1, i0 + ni, k0 + 1, k0 + nk)) return 0;
    const attn_smod_table *t = &m->tables[m->code[m->shape_g].tbl];
    int64_t oq, ok;
    const float *t0 = t->data + gather_offset(m, t->stride, pb, ph, i0 + 1, k0 + 1, &oq, &ok);
    if (rs == 1 && ni > 1) { /* flash's transposed tiles: a column of query rows is contiguous */
      for (int64_t c = 0; c < nk; c++) {
        float *col = s + c * cs;
        const float *tc = t0 + c * ok;
        if (oq == 1) {
#pragma omp simd
          for (int64_t r = 0; r < ni; r++) col[r] = col[r] + tc[r];
        } else {
          for (int64_t r = 0; r < ni; r++) col[r] = col[r] + tc[r * oq];
        }
      }
    } else {
      for (int64_t r = 0; r < ni; r++) {
        float *row = s + r * rs;
        const float *tr = t0 + r * oq;
        if (cs == 1 && ok == 1) {
#pragma omp simd
          for (int64_t c = 0; c < nk; c++) row[c] = row[c] + tr[c];
        } else if (cs == 1 && ok == -1) {
#pragma omp simd
          for (int64_t c = 0; c < nk; c++) row[c] = row[c] + tr[-c];
        } else {
          for (int64_t c = 0; c < nk; c++) row[c * cs] = row[c * cs] + tr[c * ok];
        }
      }
    }
    return 1;
  }
  case ATTN_SMOD_SHAPE_SUB_SCALE_ABS: {
    /* s - x |d| = s + (-x) |d| exactly (IEEE negation): the built-in ALiBi's tile op with slope x and distance d
     * (q - k or k - q plus a constant over the slice) */
    if (!cone_exact(m, pb, ph, i0 + 1, i0 + ni, k0 + 1, k0 + nk)) return 0;
    float v[ATTN_SMOD_MAX_INSNS];
    for (int c = 0; c < m->nxcone; c++) {
      int i = m->xcone[c];
      const attn_smod_insn *in = &m->code[i];
      v[i] = in->op == ATTN_SMOD_B ? (float)pb : in->op == ATTN_SMOD_H ? (float)ph : scalar_op(m, in, v);
    }
    float x = v[m->shape_g];
    if (!isfinite(x)) return 0; /* NaN's sign could differ */
    const int64_t *f = m->aff[m->shape_d];
    int64_t d0 = aff_at(f, pb, ph, i0 + 1, k0 + 1);
    attn_sdpa_alibi_tile(x, f[3] == 1 ? d0 : -d0, ni, nk, s, rs, cs);
    return 1;
  }
  default: return 0;
  }
}

void attn_score_mod_tile(const attn_score_mod *m, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t k0,
                         int64_t nk, float *s, int64_t rs, int64_t cs) {
  if (m->shape && ni > 0 && nk > 0 && shape_tile(m, b, h, i0, ni, k0, nk, s, rs, cs)) return;
  line_vals lv;
  int along_q = rs == 1 && ni > 1 && cs != 1; /* flash's transposed tiles: lines of query rows */
  unsigned vary = ATTN_SMOD_DEP_S | (along_q ? ATTN_SMOD_DEP_Q : ATTN_SMOD_DEP_K);
  plan(m, vary, along_q ? ATTN_SMOD_DEP_K : ATTN_SMOD_DEP_Q, NULL, &lv);
  float fb = (float)b + 1.0f, fh = (float)h + 1.0f;
  eval_scalars(m, lv.c0, lv.n0, fb, fh, 0.0f, 0.0f, &lv);
  int64_t nlines = along_q ? nk : ni, len = along_q ? ni : nk;
  int64_t ls = along_q ? cs : rs, es = along_q ? rs : cs; /* line stride, element stride */
  int last = m->n - 1;
  /* a score program whose result varies writes it straight into a contiguous line */
  int direct = !m->is_mask && es == 1 && (m->code[last].deps & vary);
  float buf[LINE];
  for (int64_t l = 0; l < nlines; l++) {
    float *line = s + l * ls;
    float q = (float)(along_q ? i0 : i0 + l) + 1.0f, k = (float)(along_q ? k0 + l : k0) + 1.0f;
    eval_scalars(m, lv.c1, lv.n1, fb, fh, q, k, &lv);
    for (int64_t j0 = 0; j0 < len; j0 += LINE) {
      int n = (int)(len - j0 < LINE ? len - j0 : LINE);
      float *e = line + j0 * es;
      const float *score = e;
      if (!m->is_mask && es != 1) {
        for (int j = 0; j < n; j++) buf[j] = e[j * es];
        score = buf;
      }
      float qj = along_q ? q + (float)j0 : q, kj = along_q ? k : k + (float)j0;
      /* direct: the last op may write the line it reads the score from, element by element (each element
       * is read before it is written, and no op runs after it) */
      eval_vectors(m, qj, along_q ? 1.0f : 0.0f, kj, along_q ? 0.0f : 1.0f, n, score, direct ? e : NULL, &lv);
      if (direct) continue;
      if (!lv.in_vec[last]) { /* constant along the line */
        float x = lv.sc[last];
        if (m->is_mask) {
          if (x == 0.0f)
            for (int j = 0; j < n; j++) e[j * es] = -INFINITY;
        } else {
          for (int j = 0; j < n; j++) e[j * es] = x;
        }
        continue;
      }
      const float *r = values(&lv, last, n);
      if (m->is_mask) {
        for (int j = 0; j < n; j++)
          if (r[j] == 0.0f) e[j * es] = -INFINITY;
      } else if (es == 1) {
        memcpy(e, r, (size_t)n * sizeof(float));
      } else {
        for (int j = 0; j < n; j++) e[j * es] = r[j];
      }
    }
  }
}

void attn_mask_mod_block(const attn_score_mod *m, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0, int64_t nj,
                         uint8_t *vis, int64_t ld, float *row) {
  for (int64_t r = 0; r < ni; r++) {
    memset(row, 0, (size_t)nj * sizeof(float));
    attn_score_mod_tile(m, b, h, i0 + r, 1, j0, nj, row, 0, 1);
    for (int64_t c = 0; c < nj; c++) vis[r * ld + c] = row[c] != -INFINITY;
  }
}

/* ------------------------------------------------------------ backward */

int64_t attn_score_mod_grad_floats(const attn_score_mod *m, int64_t *off) {
  int64_t total = 0;
  for (int t = 0; t < m->ntables; t++) {
    off[t] = -1;
    if (!m->tables[t].grad) continue;
    off[t] = total;
    int64_t n = 1;
    for (int d = 0; d < m->tables[t].ndim; d++) n *= m->tables[t].size[d];
    total += n;
  }
  return total;
}

/* adjoint loops: acc[j] += (expr) over the line */
#define ADJ_LOOP(acc, expr)                                                                                           \
  do {                                                                                                                \
    float *acc_ = (acc);                                                                                              \
    _Pragma("omp simd") for (int j = 0; j < n; j++) {                                                                 \
      float g = A[j], x = X[j], y = Y[j], z = Z[j], r = R[j];                                                         \
      (void)g, (void)x, (void)y, (void)z, (void)r;                                                                    \
      acc_[j] += (expr);                                                                                              \
    }                                                                                                                 \
  } while (0)

/* the operands that carry an adjoint (gathers' and comparisons' indices do not) */
static int propagates(int op) {
  return !(op == ATTN_SMOD_GATHER || (op >= ATTN_SMOD_LT && op <= ATTN_SMOD_NOT) || op == ATTN_SMOD_FLOOR ||
           op == ATTN_SMOD_CEIL || op == ATTN_SMOD_SIGN);
}

VECTOR_CLONES void attn_score_mod_backward_row(const attn_score_mod *m, int64_t b, int64_t h, int64_t i, int64_t k0,
                                               int64_t nk, const float *pre, float *ds, float *gbuf,
                                               const int64_t *off) {
  if (m->score_lin && nk > 0) {
    /* s + y or s - y: the score's gradient is ds (0 + ds, as the adjoints accumulate from 0); a gradient
     * into the ADD_GATHER shape's table is ds added along the gather's affine offsets */
    int grads = 0, gt = m->shape == ATTN_SMOD_SHAPE_ADD_GATHER ? m->code[m->shape_g].tbl : -1;
    for (int t = 0; t < m->ntables && gbuf; t++) grads += t != gt && off[t] >= 0;
    int gather = gt >= 0 && gbuf && off[gt] >= 0;
    if (!grads && (!gather || cone_exact(m, b + 1, h + 1, i + 1, i + 1, k0 + 1, k0 + nk))) {
#pragma omp simd
      for (int64_t j = 0; j < nk; j++) ds[j] = 0.0f + ds[j];
      if (!gather) return;
      const attn_smod_table *tb = &m->tables[gt];
      int64_t cstride[ATTN_MAX_DIMS], acc = 1, oq, ok;
      for (int d = tb->ndim - 1; d >= 0; d--) cstride[d] = acc, acc *= tb->size[d];
      float *g0 = gbuf + off[gt] + gather_offset(m, cstride, b + 1, h + 1, i + 1, k0 + 1, &oq, &ok);
      if (ok == 1) {
#pragma omp simd
        for (int64_t j = 0; j < nk; j++) g0[j] += ds[j];
      } else if (ok == -1) {
#pragma omp simd
        for (int64_t j = 0; j < nk; j++) g0[-j] += ds[j];
      } else { /* in key order (a step of 0 sums into one element) */
        for (int64_t j = 0; j < nk; j++) g0[j * ok] += ds[j];
      }
      return;
    }
  }
  line_vals lv;
  float adj[ATTN_SMOD_MAX_INSNS][LINE];
  unsigned char need[ATTN_SMOD_MAX_INSNS];
  int score_at = -1;
  for (int t = 0; t < m->n; t++) {
    const attn_smod_insn *in = &m->code[t];
    int no = n_operands(in->op), ops[3] = {in->a, in->b, in->c};
    need[t] = 0;
    if (in->op == ATTN_SMOD_SCORE) need[t] = 1, score_at = t;
    if (in->op == ATTN_SMOD_GATHER && gbuf && off[in->tbl] >= 0) need[t] = 1;
    if (propagates(in->op) && in->op != ATTN_SMOD_WHERE)
      for (int o = 0; o < no; o++) need[t] |= need[ops[o]];
    if (in->op == ATTN_SMOD_WHERE) need[t] = need[in->b] | need[in->c];
  }
  /* the values the adjoints read: the nodes that carry one and their operands */
  unsigned char used[ATTN_SMOD_MAX_INSNS] = {0}, live[ATTN_SMOD_MAX_INSNS] = {0};
  for (int t = 0; t < m->n; t++) {
    if (!need[t]) continue;
    const attn_smod_insn *in = &m->code[t];
    switch (in->op) {
    case ATTN_SMOD_ADD: case ATTN_SMOD_SUB: case ATTN_SMOD_NEG: case ATTN_SMOD_SCORE: break; /* read no value */
    case ATTN_SMOD_EXP: case ATTN_SMOD_SQRT: case ATTN_SMOD_TANH: case ATTN_SMOD_SIGMOID: used[t] = 1; break;
    case ATTN_SMOD_WHERE: used[in->a] = 1; break;
    case ATTN_SMOD_GATHER: /* its indices: from their affine form or their elements (broadcast there) */
      for (int d = 0; d < in->nd; d++) live[in->ix[d]] = 1;
      break;
    default:
      if (in->a >= 0) used[in->a] = 1;
      if (in->b >= 0) used[in->b] = 1;
      if (in->c >= 0) used[in->c] = 1;
      break;
    }
  }
  /* what the read values need computed, down to the leaves */
  for (int t = m->n - 1; t >= 0; t--) {
    live[t] |= used[t];
    if (!live[t]) continue;
    const attn_smod_insn *in = &m->code[t];
    if (in->a >= 0) live[in->a] = 1;
    if (in->b >= 0) live[in->b] = 1;
    if (in->c >= 0) live[in->c] = 1;
    if (in->op == ATTN_SMOD_GATHER)
      for (int d = 0; d < in->nd; d++) live[in->ix[d]] = 1;
  }
  static const float zeros[LINE];
  int last = m->n - 1;
  plan(m, ATTN_SMOD_DEP_S | ATTN_SMOD_DEP_K, ATTN_SMOD_DEP_Q, live, &lv);
  eval_scalars(m, lv.c0, lv.n0, (float)b + 1.0f, (float)h + 1.0f, 0.0f, 0.0f, &lv);
  eval_scalars(m, lv.c1, lv.n1, (float)b + 1.0f, (float)h + 1.0f, (float)i + 1.0f, 0.0f, &lv);
  for (int64_t j0 = 0; j0 < nk; j0 += LINE) {
    int n = (int)(nk - j0 < LINE ? nk - j0 : LINE);
    float *dsl = ds + j0;
    if (!need[last]) { /* the result reads neither the score nor a table that wants a gradient */
      memset(dsl, 0, (size_t)n * sizeof(float));
      continue;
    }
    eval_vectors(m, (float)i + 1.0f, 0.0f, (float)(k0 + j0) + 1.0f, 1.0f, n, pre + j0, NULL, &lv);
    for (int t = 0; t < m->n; t++)
      if (used[t]) broadcast(&lv, t, n); /* as elements, for the adjoints */
    for (int t = 0; t < m->n; t++)
      if (need[t]) memset(adj[t], 0, (size_t)n * sizeof(float));
    memcpy(adj[last], dsl, (size_t)n * sizeof(float));
    for (int t = last; t >= 0; t--) {
      if (!need[t]) continue;
      const attn_smod_insn *in = &m->code[t];
      /* the values this adjoint reads (zeros for those it does not: never read, but loaded) */
      const float *A = adj[t], *R = used[t] ? lv.p[t] : zeros;
      const float *X = in->a >= 0 && used[in->a] ? lv.p[in->a] : zeros,
                  *Y = in->b >= 0 && used[in->b] ? lv.p[in->b] : zeros,
                  *Z = in->c >= 0 && used[in->c] ? lv.p[in->c] : zeros;
      int na = in->a >= 0 && need[in->a], nb = in->b >= 0 && need[in->b], nc = in->c >= 0 && need[in->c];
      switch (in->op) {
      case ATTN_SMOD_ADD:
        if (na) ADJ_LOOP(adj[in->a], g);
        if (nb) ADJ_LOOP(adj[in->b], g);
        break;
      case ATTN_SMOD_SUB:
        if (na) ADJ_LOOP(adj[in->a], g);
        if (nb) ADJ_LOOP(adj[in->b], -g);
        break;
      case ATTN_SMOD_MUL:
        if (na) ADJ_LOOP(adj[in->a], g * y);
        if (nb) ADJ_LOOP(adj[in->b], g * x);
        break;
      case ATTN_SMOD_DIV:
        if (na) ADJ_LOOP(adj[in->a], g / y);
        if (nb) ADJ_LOOP(adj[in->b], -g * ((x / y) / y));
        break;
      case ATTN_SMOD_NEG: if (na) ADJ_LOOP(adj[in->a], -g); break;
      case ATTN_SMOD_POW: {
        float k = in->k;
        if (na && k != 0.0f) ADJ_LOOP(adj[in->a], g * (k * f_pow(x, k - 1.0f)));
        break;
      }
      case ATTN_SMOD_ABS: if (na) ADJ_LOOP(adj[in->a], g * f_sign(x)); break;
      case ATTN_SMOD_EXP: if (na) ADJ_LOOP(adj[in->a], g * r); break;
      case ATTN_SMOD_LOG: if (na) ADJ_LOOP(adj[in->a], g / x); break;
      case ATTN_SMOD_SQRT: if (na) ADJ_LOOP(adj[in->a], g / (2.0f * r)); break;
      case ATTN_SMOD_TANH: if (na) ADJ_LOOP(adj[in->a], g * (1.0f - r * r)); break;
      case ATTN_SMOD_SIGMOID: if (na) ADJ_LOOP(adj[in->a], g * (1.0f - r) * r); break;
      case ATTN_SMOD_SIN: if (na) ADJ_LOOP(adj[in->a], g * cosf(x)); break;
      case ATTN_SMOD_COS: if (na) ADJ_LOOP(adj[in->a], g * -sinf(x)); break;
      case ATTN_SMOD_CLAMP: /* torch 1.13's clamp_backward_min_max */
        if (na) ADJ_LOOP(adj[in->a], (x >= y && x <= z) ? g : 0.0f);
        if (nb) ADJ_LOOP(adj[in->b], (x < y && y < z) ? g : 0.0f);
        if (nc) ADJ_LOOP(adj[in->c], (x > z || z < y) ? g : 0.0f);
        break;
      case ATTN_SMOD_MIN: /* halved on ties, as torch 1.13 */
        if (na) ADJ_LOOP(adj[in->a], x == y ? g / 2.0f : (x > y ? 0.0f : g));
        if (nb) ADJ_LOOP(adj[in->b], x == y ? g / 2.0f : (x < y ? 0.0f : g));
        break;
      case ATTN_SMOD_MAX:
        if (na) ADJ_LOOP(adj[in->a], x == y ? g / 2.0f : (x < y ? 0.0f : g));
        if (nb) ADJ_LOOP(adj[in->b], x == y ? g / 2.0f : (x > y ? 0.0f : g));
        break;
      case ATTN_SMOD_WHERE:
        if (nb) ADJ_LOOP(adj[in->b], x != 0.0f ? g : 0.0f);
        if (nc) ADJ_LOOP(adj[in->c], x != 0.0f ? 0.0f : g);
        break;
      case ATTN_SMOD_GATHER: {
        const attn_smod_table *tb = &m->tables[in->tbl];
        if (!gbuf || off[in->tbl] < 0) break;
        float *gt = gbuf + off[in->tbl];
        int64_t cstride[ATTN_MAX_DIMS], acc = 1;
        for (int d = tb->ndim - 1; d >= 0; d--) cstride[d] = acc, acc *= tb->size[d];
        int aff = 1;
        int64_t o0 = 0, ost = 0;
        for (int d = 0; d < in->nd; d++) {
          int o = in->ix[d];
          if (lv.in_vec[o] && !lv.affine[o]) aff = 0;
          o0 += ((lv.in_vec[o] ? lv.base[o] : (int64_t)lv.sc[o]) - 1) * cstride[d];
          ost += (lv.in_vec[o] ? lv.coef[o] : 0) * cstride[d];
        }
        if (aff) { /* a fixed step: no float-to-int conversion */
          float *g0 = gt + o0;
          if (ost == 1) {
#pragma omp simd
            for (int j = 0; j < n; j++) g0[j] += A[j];
          } else {
            for (int j = 0; j < n; j++) g0[j * ost] += A[j];
          }
          break;
        }
        for (int d = 0; d < in->nd; d++) broadcast(&lv, in->ix[d], n);
        for (int j = 0; j < n; j++) {
          int64_t o = 0;
          for (int d = 0; d < in->nd; d++) o += ((int64_t)lv.p[in->ix[d]][j] - 1) * cstride[d];
          gt[o] += A[j];
        }
        break;
      }
      default: break;
      }
    }
    if (score_at >= 0)
      memcpy(dsl, adj[score_at], (size_t)n * sizeof(float));
    else
      memset(dsl, 0, (size_t)n * sizeof(float));
  }
}
