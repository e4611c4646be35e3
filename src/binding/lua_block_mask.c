/* Block masks from Lua: attn.block_mask (a callable table) builds an
 * attn.BlockMask (src/core/block_mask.h) from a mask function, and its
 * fields are the built-in mask functions (attn.MaskFn userdata), evaluated
 * in C without calling Lua:
 *   attn.block_mask(fn, B, H, Lq, Lk[, {block = n}]) -> attn.BlockMask
 *   attn.block_mask.causal, .sliding_window(w), .document(ids),
 *   .and_(f, g, ...), .or_(f, g, ...)
 * A built-in is also callable as fn(b, h, q, k) -> [n, m] (1 = visible), for
 * Lua mask functions that build on one.
 * fn(b, h, q, k) (a Lua function) gets 1-based numbers b, h and index
 * tensors q [n, 1], k [1, m] of one block and returns a tensor
 * broadcastable to [n, m], nonzero = visible. It is called once per block
 * and per (b, h): a Lua function may depend on b and h, so B x H patterns
 * are kept; a mask of built-ins alone is the same for every (b, h) and is
 * kept once. Everything a build allocates belongs to userdata (the mask,
 * its scratch) before fn is first called, so an error in fn leaks nothing;
 * fn runs here, before any kernel, never inside an OpenMP region. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attn_lua.h"
#include "lua_sdpa_options.h"
#include "score_mod.h"
#include "block_mask.h"

#define BLOCK_MASK_NAME "attn.BlockMask"
#define MASK_FN_NAME "attn.MaskFn"

static const char *const BM = "attn.block_mask";

enum { FN_CAUSAL, FN_SLIDING, FN_DOCUMENT, FN_AND, FN_OR };

/* A built-in mask function; and/or keep their operands (MaskFn userdata or
 * Lua functions) in user value 1, document its ids after the struct. */
typedef struct mask_fn {
  int kind;
  int has_lua;    /* some operand, at any depth, is a Lua function */
  int depth;      /* nesting of and/or (0 for a leaf): the scratch buffers an evaluation needs */
  int64_t window; /* sliding_window */
  int64_t nids;   /* document */
  float ids[];
} mask_fn;

const attn_block_mask *attnL_test_block_mask(lua_State *L, int idx) {
  return luaL_testudata(L, idx, BLOCK_MASK_NAME);
}

static mask_fn *test_fn(lua_State *L, int idx) { return luaL_testudata(L, idx, MASK_FN_NAME); }

static mask_fn *push_fn(lua_State *L, int kind, int64_t nids) {
  mask_fn *f = lua_newuserdatauv(L, sizeof(mask_fn) + (size_t)nids * sizeof(float), 1);
  memset(f, 0, sizeof *f);
  f->kind = kind;
  f->nids = nids;
  luaL_setmetatable(L, MASK_FN_NAME);
  return f;
}

/* ------------------------------------------------------------ built-ins */

static int l_sliding_window(lua_State *L) {
  const char *fname = "attn.block_mask.sliding_window";
  attnL_check_nargs(L, 1, fname);
  int isint = 0;
  lua_Integer w = lua_type(L, 1) == LUA_TNUMBER ? lua_tointegerx(L, 1, &isint) : 0;
  if (!isint || w < 1) {
    if (lua_type(L, 1) == LUA_TNUMBER)
      attnL_error(L, fname, "bad argument #1 'w' (expected an integer window width >= 1, got %s)", lua_tostring(L, 1));
    attnL_error(L, fname, "bad argument #1 'w' (expected an integer window width >= 1, got %s)", luaL_typename(L, 1));
  }
  push_fn(L, FN_SLIDING, 0)->window = (int64_t)w;
  return 1;
}

static int l_document(lua_State *L) {
  const char *fname = "attn.block_mask.document";
  attnL_check_nargs(L, 1, fname);
  attn_tensor *ids = attnL_check(L, 1, fname, "ids");
  char buf[200];
  if (ids->ndim != 1)
    attnL_error(L, fname, "bad argument #1 'ids' (expected a 1-D tensor [L] of document ids, got %s)",
                attnL_shape(ids, buf, sizeof buf));
  int64_t n = ids->size[0];
  if (n > ((int64_t)1 << 31))
    attnL_error(L, fname, "bad argument #1 'ids' (expected at most 2^31 ids, got %I)", (LUAI_UACINT)n);
  mask_fn *f = push_fn(L, FN_DOCUMENT, n);
  for (int64_t i = 0; i < n; i++) {
    float x = ids->data[i * ids->stride[0]];
    if (!isfinite(x)) {
      char got[64];
      snprintf(got, sizeof got, "%g", (double)x);
      attnL_error(L, fname, "bad argument #1 'ids' (expected finite ids, got %s at %I)", got, (LUAI_UACINT)(i + 1));
    }
    f->ids[i] = x;
  }
  return 1;
}

/* and_ / or_: the operands (at least one) into user value 1. */
static int combinator(lua_State *L, int kind) {
  const char *fname = kind == FN_AND ? "attn.block_mask.and_" : "attn.block_mask.or_";
  int n = lua_gettop(L);
  if (n < 1) attnL_error(L, fname, "expected at least one mask function, got none");
  int has_lua = 0, depth = 0;
  for (int i = 1; i <= n; i++) {
    mask_fn *c = test_fn(L, i);
    if (c) {
      has_lua |= c->has_lua;
      if (c->depth > depth) depth = c->depth;
    } else if (lua_type(L, i) == LUA_TFUNCTION) {
      has_lua = 1;
    } else {
      char buf[64];
      attnL_error(L, fname,
                  "bad argument #%d (expected a mask function: a Lua function or a built-in of attn.block_mask, got %s)",
                  i, attnL_typename(L, i, buf, sizeof buf));
    }
  }
  if (depth >= 64) attnL_error(L, fname, "mask functions nested more than 64 deep");
  mask_fn *f = push_fn(L, kind, 0);
  f->has_lua = has_lua;
  f->depth = depth + 1;
  lua_createtable(L, n, 0);
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, -2, i);
  }
  lua_setiuservalue(L, -2, 1);
  return 1;
}

static int l_and(lua_State *L) { return combinator(L, FN_AND); }
static int l_or(lua_State *L) { return combinator(L, FN_OR); }

/* Push the text of the mask function at idx ("causal", "and_(causal, <Lua function>)", ...). */
static void push_fn_text(lua_State *L, int idx, int depth) {
  idx = lua_absindex(L, idx);
  mask_fn *f = test_fn(L, idx);
  if (!f) {
    lua_pushstring(L, "<Lua function>");
    return;
  }
  switch (f->kind) {
  case FN_CAUSAL: lua_pushstring(L, "causal"); return;
  case FN_SLIDING: lua_pushfstring(L, "sliding_window(%I)", (LUAI_UACINT)f->window); return;
  case FN_DOCUMENT: lua_pushfstring(L, "document([%I] ids)", (LUAI_UACINT)f->nids); return;
  default: break;
  }
  if (depth > 8) {
    lua_pushstring(L, f->kind == FN_AND ? "and_(...)" : "or_(...)");
    return;
  }
  lua_getiuservalue(L, idx, 1);
  int tbl = lua_gettop(L);
  lua_Integer n = luaL_len(L, tbl);
  luaL_checkstack(L, (int)(2 * n + 4), "mask function text");
  lua_pushstring(L, f->kind == FN_AND ? "and_(" : "or_(");
  for (lua_Integer i = 1; i <= n; i++) { /* the pieces pile up above the table, then join */
    lua_rawgeti(L, tbl, i);
    push_fn_text(L, -1, depth + 1);
    lua_remove(L, -2);
    lua_pushstring(L, i < n ? ", " : ")");
  }
  lua_concat(L, (int)(2 * n + 1));
  lua_remove(L, tbl);
}

static int l_fn_tostring(lua_State *L) {
  luaL_checkudata(L, 1, MASK_FN_NAME);
  lua_pushstring(L, "attn.block_mask.");
  push_fn_text(L, 1, 0);
  lua_concat(L, 2);
  return 1;
}

/* ------------------------------------------------- calling a built-in */

/* What a built-in called from Lua evaluates: b, h (stack slots) and the
 * positions q [n, 1], k [1, m] (1-based, as attn.block_mask passes them). */
typedef struct call_args {
  int b_idx, h_idx, q_idx, k_idx;
  const attn_tensor *q, *k;
  int64_t n, m;
} call_args;

/* Position x (a float) as a 0-based index below limit, or an error naming fname. */
static int64_t position(lua_State *L, float x, int64_t limit, const char *fname) {
  if (!(x >= 1.0f && x <= (float)limit) || x != floorf(x)) {
    char got[64];
    snprintf(got, sizeof got, "%g", (double)x);
    attnL_error(L, fname, "position %s is not an integer in [1, %I] (the document ids)", got, (LUAI_UACINT)limit);
  }
  return (int64_t)x - 1;
}

/* The mask function at idx on the call's positions into vis [n, m]. */
static void call_fn(lua_State *L, const call_args *a, int idx, uint8_t *vis) {
  luaL_checkstack(L, 8, "nested block mask functions"); /* 2 slots per and_/or_ level, 64 levels */
  idx = lua_absindex(L, idx);
  mask_fn *f = test_fn(L, idx);
  int64_t n = a->n, m = a->m, sq = a->q->stride[0], sk = a->k->stride[1];
  if (!f) { /* a Lua operand: called with the same arguments */
    lua_pushvalue(L, idx);
    lua_pushvalue(L, a->b_idx);
    lua_pushvalue(L, a->h_idx);
    lua_pushvalue(L, a->q_idx);
    lua_pushvalue(L, a->k_idx);
    lua_call(L, 4, 1);
    attn_tensor *r = attnL_test(L, -1);
    int ok = r && r->ndim <= 2;
    if (ok && r->ndim >= 1) ok = r->size[r->ndim - 1] == 1 || r->size[r->ndim - 1] == m;
    if (ok && r->ndim == 2) ok = r->size[0] == 1 || r->size[0] == n;
    if (!ok) {
      char got[200], buf[64];
      if (r)
        attnL_shape(r, got, sizeof got);
      else
        snprintf(got, sizeof got, "%s", attnL_typename(L, -1, buf, sizeof buf));
      attnL_error(L, "attn.block_mask", "an operand must return a tensor broadcastable to [%I, %I], got %s",
                  (LUAI_UACINT)n, (LUAI_UACINT)m, got);
    }
    int64_t s0 = r->ndim == 2 && r->size[0] != 1 ? r->stride[0] : 0;
    int64_t s1 = r->ndim >= 1 && r->size[r->ndim - 1] != 1 ? r->stride[r->ndim - 1] : 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) vis[i * m + j] = r->data[i * s0 + j * s1] != 0.0f;
    lua_pop(L, 1);
    return;
  }
  if (f->kind == FN_AND || f->kind == FN_OR) {
    uint8_t *other = lua_newuserdatauv(L, (size_t)(n * m) + 1, 0);
    int tmp = lua_gettop(L);
    lua_getiuservalue(L, idx, 1);
    lua_Integer cnt = luaL_len(L, -1);
    for (lua_Integer x = 1; x <= cnt; x++) {
      lua_rawgeti(L, -1, x);
      call_fn(L, a, -1, x == 1 ? vis : other);
      lua_pop(L, 1);
      if (x > 1) attn_mask_combine(f->kind == FN_OR, n, m, vis, other, m);
    }
    lua_settop(L, tmp - 1);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float qi = a->q->data[i * sq];
    for (int64_t j = 0; j < m; j++) {
      float kj = a->k->data[j * sk];
      int v;
      if (f->kind == FN_CAUSAL)
        v = kj <= qi;
      else if (f->kind == FN_SLIDING)
        v = kj <= qi && qi - kj < (float)f->window;
      else
        v = f->ids[position(L, qi, f->nids, "attn.block_mask.document")] ==
            f->ids[position(L, kj, f->nids, "attn.block_mask.document")];
      vis[i * m + j] = (uint8_t)v;
    }
  }
}

/* A built-in called as fn(b, h, q, k): its visibility [n, m] (1 = visible), so a
 * Lua mask function can use the built-ins. */
static int l_fn_call(lua_State *L) {
  const char *fname = "attn.block_mask (a built-in mask function)";
  if (lua_gettop(L) > 5)
    attnL_error(L, fname, "bad argument #5 (no more than 4 arguments expected, got %d)", lua_gettop(L) - 1);
  lua_settop(L, 5);
  call_args a = {2, 3, 4, 5, NULL, NULL, 0, 0};
  a.q = attnL_check(L, 4, fname, "q");
  a.k = attnL_check(L, 5, fname, "k");
  char b1[200], b2[200];
  if (a.q->ndim != 2 || a.q->size[1] != 1 || a.k->ndim != 2 || a.k->size[0] != 1)
    attnL_error(L, fname, "bad arguments 'q', 'k' (expected positions q [n, 1] and k [1, m], got %s and %s)",
                attnL_shape(a.q, b1, sizeof b1), attnL_shape(a.k, b2, sizeof b2));
  a.n = a.q->size[0], a.m = a.k->size[1];
  int64_t size[2] = {a.n, a.m};
  attn_tensor *out = attnL_push_new(L, 2, size, fname);
  uint8_t *vis = lua_newuserdatauv(L, (size_t)(a.n * a.m) + 1, 0);
  call_fn(L, &a, 1, vis);
  for (int64_t x = 0; x < a.n * a.m; x++) out->data[x] = vis[x] ? 1.0f : 0.0f;
  lua_pop(L, 1);
  return 1;
}

/* ------------------------------------------------------------- building */

/* One build: the mask being filled, its scratch bytes (depth + 1 buffers of
 * [prow, pcol]) and the block in hand. */
typedef struct build {
  attn_block_mask *m;
  uint8_t *scratch;
  int64_t bb; /* bytes per buffer */
  int64_t b, h, qb, kb, i0, ni, j0, nj;
} build;

/* Push an index tensor of n 1-based positions from first + 1, shaped [n, 1] (rows) or [1, n]. */
static void push_positions(lua_State *L, int64_t first, int64_t n, int rows) {
  int64_t size[2] = {rows ? n : 1, rows ? 1 : n};
  attn_tensor *t = attnL_push_uninit(L, 2, size, BM);
  for (int64_t x = 0; x < n; x++) t->data[x] = (float)(first + x + 1);
}

static int tolstring_of_arg(lua_State *L) {
  luaL_tolstring(L, 1, NULL);
  return 1;
}

/* Text for the value at idx (an error object or a table key), pushed: its
 * __tostring runs protected, since a user's __tostring may raise or return a
 * non-string, and the message must still come from attn.block_mask. */
static const char *push_value_text(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_pushcfunction(L, tolstring_of_arg);
  lua_pushvalue(L, idx);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK) return lua_tostring(L, -1);
  lua_pop(L, 1);
  return lua_pushfstring(L, "a %s whose __tostring failed", luaL_typename(L, idx));
}

/* Call the Lua function at idx on the block in hand; its visibility into vis (ld = block). */
static void eval_lua(lua_State *L, build *bd, int idx, uint8_t *vis) {
  int64_t ld = bd->m->pcol;
  lua_pushvalue(L, idx);
  lua_pushinteger(L, (lua_Integer)(bd->b + 1));
  lua_pushinteger(L, (lua_Integer)(bd->h + 1));
  push_positions(L, bd->i0, bd->ni, 1);
  push_positions(L, bd->j0, bd->nj, 0);
  if (lua_pcall(L, 4, 1, 0) != LUA_OK) {
    const char *msg = push_value_text(L, -1);
    attnL_error(L, BM, "fn raised an error at b %I, h %I, query block %I, key block %I: %s", (LUAI_UACINT)(bd->b + 1),
                (LUAI_UACINT)(bd->h + 1), (LUAI_UACINT)(bd->qb + 1), (LUAI_UACINT)(bd->kb + 1), msg);
  }
  attn_tensor *r = attnL_test(L, -1);
  int ok = r && r->ndim <= 2;
  if (ok && r->ndim >= 1) ok = r->size[r->ndim - 1] == 1 || r->size[r->ndim - 1] == bd->nj;
  if (ok && r->ndim == 2) ok = r->size[0] == 1 || r->size[0] == bd->ni;
  if (!ok) {
    char got[200], buf[64];
    if (r)
      attnL_shape(r, got, sizeof got);
    else
      snprintf(got, sizeof got, "%s", attnL_typename(L, -1, buf, sizeof buf));
    attnL_error(L, BM,
                "fn must return a tensor broadcastable to the block's [%I, %I] (nonzero = visible), got %s at b %I, "
                "h %I, query block %I, key block %I",
                (LUAI_UACINT)bd->ni, (LUAI_UACINT)bd->nj, got, (LUAI_UACINT)(bd->b + 1), (LUAI_UACINT)(bd->h + 1),
                (LUAI_UACINT)(bd->qb + 1), (LUAI_UACINT)(bd->kb + 1));
  }
  int64_t s0 = r->ndim == 2 && r->size[0] != 1 ? r->stride[0] : 0;
  int64_t s1 = r->ndim >= 1 && r->size[r->ndim - 1] != 1 ? r->stride[r->ndim - 1] : 0;
  for (int64_t i = 0; i < bd->ni; i++)
    for (int64_t j = 0; j < bd->nj; j++) vis[i * ld + j] = r->data[i * s0 + j * s1] != 0.0f;
  lua_pop(L, 1);
}

/* The mask function at idx (a MaskFn or a Lua function) on the block in
 * hand, into scratch buffer `level` (its operands use the levels above). */
static void eval_fn(lua_State *L, build *bd, int idx, int level) {
  luaL_checkstack(L, 8, "nested block mask functions"); /* 2 slots per and_/or_ level, 64 levels */
  idx = lua_absindex(L, idx);
  uint8_t *vis = bd->scratch + level * bd->bb;
  int64_t ld = bd->m->pcol;
  mask_fn *f = test_fn(L, idx);
  if (!f) {
    eval_lua(L, bd, idx, vis);
    return;
  }
  switch (f->kind) {
  case FN_CAUSAL: attn_mask_causal(bd->i0, bd->ni, bd->j0, bd->nj, vis, ld); break;
  case FN_SLIDING: attn_mask_sliding_window(f->window, bd->i0, bd->ni, bd->j0, bd->nj, vis, ld); break;
  case FN_DOCUMENT: attn_mask_document(f->ids, bd->i0, bd->ni, bd->j0, bd->nj, vis, ld); break;
  default: {
    lua_getiuservalue(L, idx, 1);
    lua_Integer n = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      eval_fn(L, bd, -1, i == 1 ? level : level + 1);
      lua_pop(L, 1);
      if (i > 1) attn_mask_combine(f->kind == FN_OR, bd->ni, bd->nj, vis, vis + bd->bb, ld);
    }
    lua_pop(L, 1);
  }
  }
}

/* The ids a document mask (anywhere in the tree at idx) needs: max(Lq, Lk). */
static void check_ids(lua_State *L, int idx, int64_t need) {
  luaL_checkstack(L, 4, "nested block mask functions");
  idx = lua_absindex(L, idx);
  mask_fn *f = test_fn(L, idx);
  if (!f) return;
  if (f->kind == FN_DOCUMENT && f->nids < need)
    attnL_error(L, BM, "bad argument #1 'fn' (document ids has %I entries, the mask needs max(Lq, Lk) = %I)",
                (LUAI_UACINT)f->nids, (LUAI_UACINT)need);
  if (f->kind == FN_AND || f->kind == FN_OR) {
    lua_getiuservalue(L, idx, 1);
    lua_Integer n = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      check_ids(L, -1, need);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
}

static int64_t size_arg(lua_State *L, int arg, const char *what, int64_t min) {
  int isint = 0;
  lua_Integer n = lua_type(L, arg) == LUA_TNUMBER ? lua_tointegerx(L, arg, &isint) : 0;
  if (!isint || n < min || n > INT32_MAX) {
    char got[64];
    snprintf(got, sizeof got, "%s", lua_type(L, arg) == LUA_TNUMBER ? lua_tostring(L, arg) : luaL_typename(L, arg));
    attnL_error(L, BM, "bad argument #%d '%s' (expected an integer in [%d, 2147483647], got %s)", arg - 1, what,
                (int)min, got);
  }
  return (int64_t)n;
}

/* attn.block_mask(mm, B, H, Lq, Lk, block) for a mask_mod at slot 2: its
 * program classifies the blocks in C, one pattern per (b, h) only where it
 * reads b or h. */
static int build_from_mask_mod(lua_State *L, const char *fname, int64_t b, int64_t h, int64_t lq, int64_t lk,
                               int64_t block) {
  attn_score_mod *mm = attnL_score_mod_for_call(L, 2, fname, "fn", 1); /* slot 8 */
  if (lq > 0 && lk > 0 && attn_score_mod_check(mm, "attn.mask_mod", b, h, lq, lk) != ATTN_OK)
    attnL_core_error(L, fname);
  unsigned deps = mm->code[mm->n - 1].deps;
  attn_block_mask *m = lua_newuserdatauv(L, sizeof *m, 0); /* slot 9 */
  memset(m, 0, sizeof *m);
  luaL_setmetatable(L, BLOCK_MASK_NAME);
  if (attn_block_mask_init(m, b, h, lq, lk, block, deps & ATTN_SMOD_DEP_B ? b : 1, deps & ATTN_SMOD_DEP_H ? h : 1) !=
      ATTN_OK)
    attnL_core_error(L, BM);
  /* scratch: a row of floats (the program's values), then the block's bytes */
  float *row = lua_newuserdatauv(L, (size_t)m->pcol * sizeof(float) + (size_t)(m->prow * m->pcol), 0);
  uint8_t *vis = (uint8_t *)(row + m->pcol);
  for (int64_t bb = 0; bb < m->sb; bb++)
    for (int64_t hh = 0; hh < m->sh; hh++)
      for (int64_t qb = 0; qb < m->nqb; qb++)
        for (int64_t kb = 0; kb < m->nkb; kb++) {
          int64_t i0, ni, j0, nj;
          attn_block_mask_extent(m, qb, kb, &i0, &ni, &j0, &nj);
          attn_mask_mod_block(mm, bb, hh, i0, ni, j0, nj, vis, m->pcol, row);
          if (attn_block_mask_set(m, bb * m->sh + hh, qb, kb, vis, m->pcol) != ATTN_OK) attnL_core_error(L, BM);
        }
  lua_settop(L, 9);
  return 1;
}

/* core._mask_mod_blocks(fname, mm, B, H, Lq, Lk): the block mask of a
 * mask_mod given as an option of function fname (the default block), its
 * errors naming fname, not attn.block_mask. */
static int l_mask_mod_blocks(lua_State *L) {
  const char *fname = luaL_checkstring(L, 1);
  lua_settop(L, 7); /* mm at 2 and sizes at 3..6, as attn.block_mask has them; fname stays at 1 */
  int64_t b = size_arg(L, 3, "B", 1), h = size_arg(L, 4, "H", 1);
  int64_t lq = size_arg(L, 5, "Lq", 0), lk = size_arg(L, 6, "Lk", 0);
  return build_from_mask_mod(L, fname, b, h, lq, lk, attn_block_mask_default_block(lq, lk));
}

static int l_build(lua_State *L) {
  /* called through the table's __call: argument 1 is the table, the user's are 2.. */
  if (lua_gettop(L) > 7)
    attnL_error(L, BM, "bad argument #7 (no more than 6 arguments expected, got %d)", lua_gettop(L) - 1);
  lua_settop(L, 7);
  mask_fn *root = test_fn(L, 2);
  int is_mask_mod = attnL_is_mask_mod(L, 2);
  if (!root && !is_mask_mod && lua_type(L, 2) != LUA_TFUNCTION) {
    char buf[64];
    attnL_error(L, BM,
                "bad argument #1 'fn' (expected a mask function: attn.mask_mod(fn), a Lua function fn(b, h, q, k) "
                "or a built-in of attn.block_mask, got %s)",
                attnL_typename(L, 2, buf, sizeof buf));
  }
  int64_t b = size_arg(L, 3, "B", 1), h = size_arg(L, 4, "H", 1);
  int64_t lq = size_arg(L, 5, "Lq", 0), lk = size_arg(L, 6, "Lk", 0);
  int64_t block = attn_block_mask_default_block(lq, lk);
  if (!lua_isnil(L, 7)) {
    if (!lua_istable(L, 7) || attnL_test(L, 7))
      attnL_error(L, BM, "bad argument #6 'opts' (expected a table {block = n}, got %s)", luaL_typename(L, 7));
    lua_pushnil(L);
    while (lua_next(L, 7)) {
      lua_pop(L, 1);
      if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "block") != 0)
        attnL_error(L, BM, "bad argument #6 'opts' (unknown option '%s'; expected block)", push_value_text(L, -1));
    }
    lua_getfield(L, 7, "block");
    if (!lua_isnil(L, -1)) {
      int isint = 0;
      lua_Integer n = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
      if (!isint || n < 1 || n > ATTN_BLOCK_MASK_MAX_BLOCK)
        attnL_error(L, BM, "bad option 'block' (expected an integer in [1, %d], got %s)", ATTN_BLOCK_MASK_MAX_BLOCK,
                    lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
      block = (int64_t)n;
    }
    lua_pop(L, 1);
  }
  if (is_mask_mod) return build_from_mask_mod(L, BM, b, h, lq, lk, block);
  check_ids(L, 2, lq > lk ? lq : lk);
  int per_bh = !root || root->has_lua; /* a Lua function may depend on b and h */
  int depth = root ? root->depth : 0;

  attn_block_mask *m = lua_newuserdatauv(L, sizeof *m, 0); /* slot 8 */
  memset(m, 0, sizeof *m);
  luaL_setmetatable(L, BLOCK_MASK_NAME);
  if (attn_block_mask_init(m, b, h, lq, lk, block, per_bh ? b : 1, per_bh ? h : 1) != ATTN_OK)
    attnL_core_error(L, BM);
  build bd;
  memset(&bd, 0, sizeof bd);
  bd.m = m;
  bd.bb = m->prow * m->pcol; /* a block's bytes, row stride pcol */
  bd.scratch = lua_newuserdatauv(L, (size_t)((depth + 1) * bd.bb), 0); /* slot 9 */
  for (bd.b = 0; bd.b < m->sb; bd.b++)
    for (bd.h = 0; bd.h < m->sh; bd.h++)
      for (bd.qb = 0; bd.qb < m->nqb; bd.qb++)
        for (bd.kb = 0; bd.kb < m->nkb; bd.kb++) {
          attn_block_mask_extent(m, bd.qb, bd.kb, &bd.i0, &bd.ni, &bd.j0, &bd.nj);
          eval_fn(L, &bd, 2, 0);
          if (attn_block_mask_set(m, bd.b * m->sh + bd.h, bd.qb, bd.kb, bd.scratch, m->pcol) != ATTN_OK)
            attnL_core_error(L, BM);
        }
  lua_settop(L, 8);
  return 1;
}

/* ------------------------------------------------------ attn.BlockMask */

static attn_block_mask *check_bm(lua_State *L, int idx, const char *fname) {
  attn_block_mask *m = luaL_testudata(L, idx, BLOCK_MASK_NAME);
  if (!m) {
    char buf[64];
    attnL_error(L, fname, "bad argument #1 'self' (expected attn.BlockMask, got %s)",
                attnL_typename(L, idx, buf, sizeof buf));
  }
  return m;
}

static int l_bm_gc(lua_State *L) {
  attn_block_mask *m = luaL_checkudata(L, 1, BLOCK_MASK_NAME);
  attn_block_mask_free(m);
  return 0;
}

static int l_bm_sparsity(lua_State *L) {
  attnL_check_nargs(L, 1, "attn.BlockMask:sparsity");
  attn_block_mask *m = check_bm(L, 1, "attn.BlockMask:sparsity");
  lua_pushnumber(L, (lua_Number)attn_block_mask_sparsity(m));
  return 1;
}

/* bm:to_dense(): the visibility [B, H, Lq, Lk], 1 = visible (a shared pattern is an expanded view). */
static int l_bm_to_dense(lua_State *L) {
  const char *fname = "attn.BlockMask:to_dense";
  attnL_check_nargs(L, 1, fname);
  attn_block_mask *m = check_bm(L, 1, fname);
  int64_t size[4] = {m->sb, m->sh, m->lq, m->lk};
  attn_tensor *t = attnL_push_uninit(L, 4, size, fname);
  for (int64_t x = 0; x < m->sb * m->sh; x++) attn_block_mask_dense(m, x, t->data + x * m->lq * m->lk);
  if (m->sb == m->b && m->sh == m->h) return 1;
  attn_tensor view = *t;
  view.size[0] = m->b, view.size[1] = m->h;
  if (m->sb == 1) view.stride[0] = 0;
  if (m->sh == 1) view.stride[1] = 0;
  attnL_push_view(L, lua_gettop(L), &view);
  return 1;
}

#define DRAW_ROWS 32
#define DRAW_COLS 64

static int l_bm_tostring(lua_State *L) {
  attn_block_mask *m = check_bm(L, 1, "attn.BlockMask:__tostring");
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  char line[256];
  snprintf(line, sizeof line, "attn.BlockMask(B=%lld, H=%lld, Lq=%lld, Lk=%lld, block=%lld): %lld x %lld blocks, "
           "sparsity %.4g\n", (long long)m->b, (long long)m->h, (long long)m->lq, (long long)m->lk,
           (long long)m->block, (long long)m->nqb, (long long)m->nkb, attn_block_mask_sparsity(m));
  luaL_addstring(&b, line);
  attn_block_pattern bp = attn_block_mask_pattern(m, 0);
  int64_t rows = m->nqb < DRAW_ROWS ? m->nqb : DRAW_ROWS, cols = m->nkb < DRAW_COLS ? m->nkb : DRAW_COLS;
  for (int64_t qb = 0; qb < rows; qb++) {
    for (int64_t kb = 0; kb < cols; kb++) {
      uint8_t k = bp.kind[qb * m->nkb + kb];
      luaL_addstring(&b, k == ATTN_BLOCK_FULL ? "\xe2\x96\x88" : k == ATTN_BLOCK_PARTIAL ? "\xe2\x96\x91" : "\xc2\xb7");
    }
    if (cols < m->nkb) luaL_addstring(&b, " \xe2\x80\xa6");
    luaL_addstring(&b, "\n");
  }
  if (rows < m->nqb) {
    snprintf(line, sizeof line, "\xe2\x80\xa6 (%lld more query blocks)\n", (long long)(m->nqb - rows));
    luaL_addstring(&b, line);
  }
  luaL_addstring(&b, "\xe2\x96\x88 full  \xe2\x96\x91 partial  \xc2\xb7 empty (rows: query blocks, columns: key blocks");
  if (m->sb > 1 || m->sh > 1) luaL_addstring(&b, "; the pattern of b 1, h 1");
  luaL_addstring(&b, ")");
  luaL_pushresult(&b);
  return 1;
}

static int l_bm_index(lua_State *L) {
  attn_block_mask *m = check_bm(L, 1, "attn.BlockMask");
  const char *key = lua_tostring(L, 2);
  if (lua_type(L, 2) == LUA_TSTRING) {
    const struct { const char *name; int64_t value; } fields[] = {
        {"B", m->b}, {"H", m->h}, {"Lq", m->lq}, {"Lk", m->lk}, {"block", m->block}, {NULL, 0}};
    for (int i = 0; fields[i].name; i++)
      if (strcmp(key, fields[i].name) == 0) {
        lua_pushinteger(L, (lua_Integer)fields[i].value);
        return 1;
      }
    if (strcmp(key, "sparsity") == 0) {
      lua_pushcfunction(L, l_bm_sparsity);
      return 1;
    }
    if (strcmp(key, "to_dense") == 0) {
      lua_pushcfunction(L, l_bm_to_dense);
      return 1;
    }
  }
  lua_pushnil(L);
  return 1;
}

/* ------------------------------------------------------------- opening */

/* The module table is at -3 (module, methods, tensor metatable). */
void attnL_open_block_mask(lua_State *L) {
  luaL_newmetatable(L, BLOCK_MASK_NAME);
  lua_pushcfunction(L, l_bm_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_bm_index);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_bm_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  luaL_newmetatable(L, MASK_FN_NAME);
  lua_pushcfunction(L, l_fn_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, l_fn_call);
  lua_setfield(L, -2, "__call");
  lua_pop(L, 1);

  lua_newtable(L); /* attn.block_mask */
  push_fn(L, FN_CAUSAL, 0);
  lua_setfield(L, -2, "causal");
  const luaL_Reg fns[] = {{"sliding_window", l_sliding_window}, {"document", l_document}, {"and_", l_and},
                          {"or_", l_or}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
  lua_newtable(L);
  lua_pushcfunction(L, l_build);
  lua_setfield(L, -2, "__call");
  lua_setmetatable(L, -2);
  lua_pushcfunction(L, l_mask_mod_blocks);
  lua_setfield(L, -5, "_mask_mod_blocks");
  lua_setfield(L, -4, "block_mask"); /* module, methods, metatable, this */
}
