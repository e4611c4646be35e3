/* Scriptable scores (FlexAttention's score_mod and mask_mod) in C: a traced
 * expression (lua/attn/score_mod.lua traces and compiles it) as a small
 * program, evaluated over score tiles inside the kernels, forward and
 * backward (src/core/score_mod.c). No Lua here.
 *
 * A program is a list of instructions in SSA form: instruction i writes value
 * i, its operands are earlier values. Leaves: the score (score_mod only), the
 * 1-based positions b, h, q, k (as exact float32 integers) and constants;
 * then float ops, comparisons and logical ops (results 0 or 1, PyTorch's bool
 * tensors), where, and gathers from captured tensors ("tables") indexed by
 * integer-valued values (1-based). The last instruction is the result: the
 * modified score (score_mod) or the visibility, nonzero = may attend
 * (mask_mod). */
#ifndef ATTN_SCORE_MOD_H
#define ATTN_SCORE_MOD_H

#include <stdint.h>

#include "tensor.h"

/* Limits: instructions per program (every value of a tile line lives in a
 * fixed stack array, nothing is allocated in the tile loop) and tables. */
#define ATTN_SMOD_MAX_INSNS 128
#define ATTN_SMOD_MAX_TABLES 16

typedef enum attn_smod_opcode {
  ATTN_SMOD_SCORE, ATTN_SMOD_B, ATTN_SMOD_H, ATTN_SMOD_Q, ATTN_SMOD_K, ATTN_SMOD_CONST,
  ATTN_SMOD_ADD, ATTN_SMOD_SUB, ATTN_SMOD_MUL, ATTN_SMOD_DIV, ATTN_SMOD_NEG, ATTN_SMOD_POW, /* POW: x ^ k (a constant) */
  ATTN_SMOD_ABS, ATTN_SMOD_EXP, ATTN_SMOD_LOG, ATTN_SMOD_SQRT, ATTN_SMOD_TANH, ATTN_SMOD_SIGMOID, ATTN_SMOD_SIN,
  ATTN_SMOD_COS, ATTN_SMOD_FLOOR, ATTN_SMOD_CEIL, ATTN_SMOD_SIGN,
  ATTN_SMOD_CLAMP, /* clamp(a, lo = b, hi = c) */
  ATTN_SMOD_MIN, ATTN_SMOD_MAX,
  ATTN_SMOD_LT, ATTN_SMOD_LE, ATTN_SMOD_GT, ATTN_SMOD_GE, ATTN_SMOD_EQ, ATTN_SMOD_NE,
  ATTN_SMOD_AND, ATTN_SMOD_OR, ATTN_SMOD_NOT,
  ATTN_SMOD_WHERE, /* a ? b : c */
  ATTN_SMOD_GATHER, /* tables[tbl][ix[0], ..., ix[nd - 1]] */
  ATTN_SMOD_NOPS
} attn_smod_opcode;

/* What a value depends on (deps bits). */
#define ATTN_SMOD_DEP_S 1u
#define ATTN_SMOD_DEP_B 2u
#define ATTN_SMOD_DEP_H 4u
#define ATTN_SMOD_DEP_Q 8u
#define ATTN_SMOD_DEP_K 16u

typedef struct attn_smod_insn {
  int op;
  int a, b, c;             /* operands (earlier instructions), -1 when unused */
  float k;                 /* CONST's value, POW's exponent */
  int tbl, nd;             /* GATHER: the table and its index count (its ndim) */
  int ix[ATTN_MAX_DIMS];   /* GATHER: the index values, one per table dim */
  unsigned deps;           /* filled by attn_score_mod_finish */
} attn_smod_insn;

/* A captured tensor as one call sees it. */
typedef struct attn_smod_table {
  const float *data;
  int ndim;
  int64_t size[ATTN_MAX_DIMS], stride[ATTN_MAX_DIMS];
  float *grad; /* backward: NULL, or where its gradient goes (contiguous, the table's shape; overwritten) */
} attn_smod_table;

/* Shapes of program run as one fused tile op (filled by
 * attn_score_mod_finish; the same bits as the program op by op):
 * ADD_GATHER: s + t[i1, ..., in] with every index an integer affine form of
 * the positions (a relative-position table); SUB_SCALE_ABS: s - x |d| with x
 * constant over a slice and d affine (ALiBi: the built-in tile op);
 * SOFTCAP: (s / c):tanh() * c (the built-in softcap). */
enum { ATTN_SMOD_SHAPE_NONE, ATTN_SMOD_SHAPE_ADD_GATHER, ATTN_SMOD_SHAPE_SUB_SCALE_ABS, ATTN_SMOD_SHAPE_SOFTCAP };

typedef struct attn_score_mod {
  int is_mask;    /* mask_mod: no score leaf, the result is a visibility */
  int n;          /* instructions */
  attn_smod_insn code[ATTN_SMOD_MAX_INSNS];
  int ntables;
  attn_smod_table tables[ATTN_SMOD_MAX_TABLES];
  /* filled by attn_score_mod_finish: value i = aff[i][0] + aff[i][1] b + aff[i][2] h + aff[i][3] q +
   * aff[i][4] k over integers where is_aff[i] (positions, integer constants, + - and products by a
   * constant of them) */
  unsigned char is_aff[ATTN_SMOD_MAX_INSNS];
  int64_t aff[ATTN_SMOD_MAX_INSNS][5];
  int shape;      /* ATTN_SMOD_SHAPE_* */
  int shape_g;    /* ADD_GATHER: the gather; SUB_SCALE_ABS: x; SOFTCAP: the constant c */
  int shape_d;    /* SUB_SCALE_ABS: d */
  int score_lin;  /* the result is s + y or s - y with y not reading s: its derivative in s is 1 */
  int ncone, nxcone; /* the affine values the gather's indices (or d) read; the values x reads, and x */
  short cone[ATTN_SMOD_MAX_INSNS], xcone[ATTN_SMOD_MAX_INSNS];
} attn_score_mod;

/* Check the program's structure (operands earlier than their user, opcodes,
 * gathers' tables and index counts) and fill every deps. ATTN_EARG when
 * malformed. */
attn_status attn_score_mod_finish(attn_score_mod *m);

/* Every gather's indices stay inside its table over the box b in [1, nb], h
 * in [1, nh], q in [1, lq], k in [1, lk], and the tables' strides fit.
 * Interval arithmetic over the program proves most indices in range at no
 * cost; an index it cannot prove (it is conservative: a where may keep the
 * value in range where its bound does not) is evaluated at every position
 * it reads, so the answer is exact. ATTN_EARG naming what (e.g.
 * "attn.score_mod") and the first position out of range otherwise. Called
 * before any kernel runs: the kernels then read in range without a check. */
attn_status attn_score_mod_check(const attn_score_mod *m, const char *what, int64_t nb, int64_t nh, int64_t lq,
                                 int64_t lk);

/* The tile of query rows [i0, i0 + ni) and keys [k0, k0 + nk) (0-based) of
 * slice (b, h) (0-based), element (r, c) at s[r * rs + c * cs]: a score_mod
 * replaces each score by the program's value, a mask_mod sets -inf where its
 * value is 0. Vectorised along the tile's contiguous direction. */
void attn_score_mod_tile(const attn_score_mod *m, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t k0,
                         int64_t nk, float *s, int64_t rs, int64_t cs);

/* A mask program's visibility over block rows [i0, i0 + ni) and keys [j0,
 * j0 + nj) (0-based) of (b, h): vis[r * ld + c] = 1 where visible, else 0;
 * row: scratch of nj floats (attn.block_mask classifies blocks with it). */
void attn_mask_mod_block(const attn_score_mod *m, int64_t b, int64_t h, int64_t i0, int64_t ni, int64_t j0, int64_t nj,
                         uint8_t *vis, int64_t ld, float *row);

/* The backward of a score_mod over one row: query i, keys [k0, k0 + nk)
 * (0-based) of slice (b, h); pre: the scores the forward gave the program,
 * ds: on entry the gradient of its results, on return that of pre. When
 * gbuf is not NULL, the gradient into each table that has a grad pointer is
 * added at gbuf + off[t] (the table's elements row-major). */
void attn_score_mod_backward_row(const attn_score_mod *m, int64_t b, int64_t h, int64_t i, int64_t k0, int64_t nk,
                                 const float *pre, float *ds, float *gbuf, const int64_t *off);

/* The floats of one gradient buffer (the tables that want a gradient, each
 * at off[t]; off[t] = -1 for the others): 0 when none wants one. */
int64_t attn_score_mod_grad_floats(const attn_score_mod *m, int64_t *off);

#endif
