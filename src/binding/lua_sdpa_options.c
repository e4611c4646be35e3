/* The options of scaled dot-product attention from Lua
 * (src/binding/lua_sdpa_options.h): one table, OPTIONS below, gives each
 * option's name, which entry points take it, its Lua type, its default and
 * what it does; one parser walks it for the plain call, the recorded forward
 * and the backward. A new option is one line in OPTIONS (with a setter when
 * it needs more than a type check) plus its field in attn_sdpa_opts and its
 * kernel code (src/core/sdpa_common.h); the "unknown option" lists and the
 * parse order follow from the table. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lua_sdpa_options.h"
#include "sdpa_dispatch.h"

#define FWD ATTNL_SDPA_FORWARD
#define BWD ATTNL_SDPA_BACKWARD

/* The type the parser checks before a setter runs (ANY: the setter checks). */
typedef enum option_kind { OPT_TENSOR, OPT_BOOLEAN, OPT_NUMBER, OPT_ANY } option_kind;

/* A setter: the option's value at idx (type-checked for its kind) into c. */
typedef void (*option_setter)(lua_State *L, int idx, const char *fname, int direction, attnL_sdpa_call *c);

typedef struct sdpa_option {
  const char *name;
  int where;         /* FWD, BWD or both */
  option_kind kind;
  option_setter set;
  const char *dflt;  /* the default, and what the forward and backward do with the option */
  const char *does;
} sdpa_option;

/* ------------------------------------------------------------ setters */

static void set_mask(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->o.mask = attnL_test(L, idx);
}
static void set_bias(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->o.bias = attnL_test(L, idx);
}
static void set_is_causal(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->o.is_causal = lua_toboolean(L, idx);
}

/* checked as the float32 the kernels use: 1e39 is a finite double but inf in float32 */
static void set_scale(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  double scale = (double)lua_tonumber(L, idx);
  if (!(fabs(scale) <= (double)FLT_MAX)) {
    char got[80]; /* lua_pushfstring has no %g */
    snprintf(got, sizeof got, "|scale| <= %.9g, got %.9g", (double)FLT_MAX, scale);
    attnL_error(L, fname, "bad option 'scale' (expected a number finite in float32, %s)", got);
  }
  c->o.scale = (float)scale;
}

static void set_dropout_p(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  c->o.dropout_p = (double)lua_tonumber(L, idx);
  if (!(c->o.dropout_p >= 0.0 && c->o.dropout_p < 1.0))
    attnL_error(L, fname, "bad option 'dropout_p' (expected a number in [0, 1), got %f)", c->o.dropout_p);
}

static void set_need_weights(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->need_weights = lua_toboolean(L, idx);
}

static void set_kernel(lua_State *L, int idx, const char *fname, int direction, attnL_sdpa_call *c) {
  const char *kn = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
  if (kn && strcmp(kn, "math") == 0)
    c->kernel = ATTN_SDPA_MATH;
  else if (kn && strcmp(kn, "flash") == 0)
    c->kernel = ATTN_SDPA_FLASH;
  else if (direction == BWD)
    attnL_error(L, fname, "bad option 'kernel' (expected \"math\" or \"flash\", the kernel the forward ran, got %s)",
                luaL_tolstring(L, idx, NULL));
  else if (!kn)
    attnL_error(L, fname, "bad option 'kernel' (expected \"auto\", \"math\" or \"flash\", got %s)",
                luaL_typename(L, idx));
  else if (strcmp(kn, "auto") != 0)
    attnL_error(L, fname, "unknown kernel \"%s\" (expected \"auto\", \"math\" or \"flash\")", kn);
}

static void set_return_lse(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->return_lse = lua_toboolean(L, idx);
}

/* decoded once the shapes are known (attnL_check_dropout_draw) */
static void set_dropout_draw(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)L, (void)f, (void)d;
  c->draw_idx = idx;
}

static void set_bias_grad(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->bias_grad = lua_toboolean(L, idx);
}
static void set_dweights(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->dweights = attnL_test(L, idx);
}
static void set_enable_gqa(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->o.enable_gqa = lua_toboolean(L, idx);
}

/* One side of the window table at t: an integer >= -1 at index i. */
static int64_t window_side(lua_State *L, int t, int i, const char *side, const char *fname) {
  lua_geti(L, t, i);
  int isint = 0;
  lua_Integer n = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
  if (!isint) {
    if (lua_type(L, -1) == LUA_TNUMBER)
      attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s = %s)", side,
                  lua_tostring(L, -1));
    attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s of type %s)", side,
                luaL_typename(L, -1));
  }
  if (n < -1)
    attnL_error(L, fname, "bad option 'window' (expected {left, right} of integers >= -1, got %s = %I)", side,
                (LUA_INTEGER)n);
  lua_pop(L, 1);
  return (int64_t)n;
}

static void set_window(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  if (!lua_istable(L, idx) || attnL_test(L, idx)) {
    char buf[64];
    attnL_error(L, fname, "bad option 'window' (expected a table {left, right}, got %s)",
                attnL_typename(L, idx, buf, sizeof buf));
  }
  if (luaL_len(L, idx) != 2)
    attnL_error(L, fname, "bad option 'window' (expected a table {left, right} of 2 integers, got %I entries)",
                (LUA_INTEGER)luaL_len(L, idx));
  c->o.has_window = 1;
  c->o.window_left = window_side(L, idx, 1, "left", fname);
  c->o.window_right = window_side(L, idx, 2, "right", fname);
}

static void set_alibi_slopes(lua_State *L, int idx, const char *f, int d, attnL_sdpa_call *c) {
  (void)f, (void)d;
  c->o.alibi_slopes = attnL_test(L, idx);
}

static void set_softcap(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  double cap = (double)lua_tonumber(L, idx);
  if (!(cap > 0.0 && cap <= (double)FLT_MAX) || !((float)cap > 0.0f)) {
    char got[64];
    snprintf(got, sizeof got, "%.9g", cap);
    attnL_error(L, fname, "bad option 'softcap' (expected a number > 0, finite in float32, got %s)", got);
  }
  c->o.softcap = (float)cap;
}

static void set_block_mask(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  c->o.block_mask = attnL_test_block_mask(L, idx);
  if (!c->o.block_mask) {
    char buf[64];
    attnL_error(L, fname, "bad option 'block_mask' (expected attn.BlockMask, the result of attn.block_mask(fn, B, H, "
                "Lq, Lk), got %s)", attnL_typename(L, idx, buf, sizeof buf));
  }
}

static void set_score_mod(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  c->score_mod = attnL_score_mod_for_call(L, idx, fname, "score_mod", 0);
  lua_replace(L, idx); /* the call's copy stays where the option was */
  c->o.score_mod = c->score_mod;
}
static void set_mask_mod(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  c->o.mask_mod = attnL_score_mod_for_call(L, idx, fname, "mask_mod", 1);
  lua_replace(L, idx);
}
static void set_score_mod_grads(lua_State *L, int idx, const char *fname, int d, attnL_sdpa_call *c) {
  (void)d;
  if (!lua_istable(L, idx) || attnL_test(L, idx))
    attnL_error(L, fname, "bad option 'score_mod_grads' (expected a table of booleans, got %s)", luaL_typename(L, idx));
  c->table_grads_idx = idx;
}

/* ------------------------------------------------------------ the table */

/* In parse order, which is also the order of the "expected one of" lists. */
static const sdpa_option OPTIONS[] = {
    {"mask", FWD | BWD, OPT_TENSOR, set_mask, "nil",
     "[..., Lq, Lk] of 0 and 1, 1 hides the key; the backward gives hidden keys no gradient"},
    {"bias", FWD | BWD, OPT_TENSOR, set_bias, "nil",
     "[..., Lq, Lk] added to the scaled scores; the backward's dbias (unless bias_grad = false)"},
    {"is_causal", FWD | BWD, OPT_BOOLEAN, set_is_causal, "false", "query i sees keys 0..i (top-left aligned)"},
    {"scale", FWD | BWD, OPT_NUMBER, set_scale, "1/sqrt(E)", "q is multiplied by it (in float32) before q k^T"},
    {"dropout_p", FWD | BWD, OPT_NUMBER, set_dropout_p, "0",
     "in [0, 1): dropout of the weights; the backward needs the forward's dropout_draw"},
    {"need_weights", FWD, OPT_BOOLEAN, set_need_weights, "false",
     "also return the weights after dropout (math kernel only)"},
    {"kernel", FWD | BWD, OPT_ANY, set_kernel, "\"auto\"",
     "\"auto\", \"math\" or \"flash\"; the backward must be told the one the forward ran"},
    {"return_lse", FWD, OPT_BOOLEAN, set_return_lse, "false", "also return each row's log-sum-exp [B..., Lq]"},
    {"dropout_draw", BWD, OPT_ANY, set_dropout_draw, "nil", "the forward's dropout draw (its 4th result)"},
    {"bias_grad", BWD, OPT_BOOLEAN, set_bias_grad, "true", "false skips dbias"},
    {"dweights", BWD, OPT_TENSOR, set_dweights, "nil",
     "the gradient of the weights output [B..., Lq, Lk] (math kernel only)"},
    {"enable_gqa", FWD | BWD, OPT_BOOLEAN, set_enable_gqa, "false",
     "k and v may have fewer heads: query head h reads kv head h / g; dk, dv summed per kv head"},
    {"window", FWD | BWD, OPT_ANY, set_window, "nil",
     "{left, right} integers >= -1 (-1 unbounded), bottom-right aligned: the keys a row sees"},
    {"alibi_slopes", FWD | BWD, OPT_TENSOR, set_alibi_slopes, "nil",
     "[H] or [B, H]: adds -slope |i + Lk - Lq - j| to the scores; no gradient"},
    {"softcap", FWD | BWD, OPT_NUMBER, set_softcap, "none",
     "> 0: s = softcap tanh(s / softcap) before bias and masking; the backward scales dS by its derivative"},
    {"block_mask", FWD | BWD, OPT_ANY, set_block_mask, "nil",
     "an attn.BlockMask: hides what it hides, its empty blocks are skipped"},
    {"score_mod", FWD | BWD, OPT_ANY, set_score_mod, "nil",
     "attn.score_mod(fn): replaces each score after softcap, before bias, ALiBi and masks; differentiated"},
    {"mask_mod", FWD | BWD, OPT_ANY, set_mask_mod, "nil", "attn.mask_mod(fn): hides the keys where it is false"},
    {"score_mod_grads", BWD, OPT_ANY, set_score_mod_grads, "nil",
     "{bool, ...}: which of score_mod's captured tensors get a gradient (the 5th result)"},
};
#define NOPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

/* ------------------------------------------------------------ the parser */

/* The options direction takes, ", "-separated, into buf. */
static const char *option_list(int direction, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < NOPTIONS; i++)
    if (OPTIONS[i].where & direction)
      n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? ", " : "", OPTIONS[i].name);
  return buf;
}

/* Every key of the table at arg must be an option that direction takes. */
static void check_keys(lua_State *L, int arg, const char *fname, int direction) {
  lua_pushnil(L);
  while (lua_next(L, arg)) {
    lua_pop(L, 1); /* the value */
    int known = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (size_t i = 0; i < NOPTIONS; i++)
        known |= (OPTIONS[i].where & direction) && strcmp(lua_tostring(L, -1), OPTIONS[i].name) == 0;
    if (!known) {
      char list[600];
      option_list(direction, list, sizeof list);
      if (lua_type(L, -1) == LUA_TSTRING)
        attnL_error(L, fname, "unknown option '%s' (expected one of %s)", lua_tostring(L, -1), list);
      attnL_error(L, fname, "bad option key of type %s (expected one of %s)", luaL_typename(L, -1), list);
    }
  }
}

/* The value at idx has the type of option op's kind. */
static void check_kind(lua_State *L, int idx, const char *fname, const sdpa_option *op) {
  char buf[64];
  if (op->kind == OPT_TENSOR && !attnL_test(L, idx))
    attnL_error(L, fname, "bad option '%s' (expected attn.Tensor, got %s)", op->name,
                attnL_typename(L, idx, buf, sizeof buf));
  if (op->kind == OPT_BOOLEAN && !lua_isboolean(L, idx))
    attnL_error(L, fname, "bad option '%s' (expected a boolean, got %s)", op->name, luaL_typename(L, idx));
  if (op->kind == OPT_NUMBER && lua_type(L, idx) != LUA_TNUMBER)
    attnL_error(L, fname, "bad option '%s' (expected a number, got %s)", op->name, luaL_typename(L, idx));
}

void attnL_sdpa_parse_options(lua_State *L, int arg, const char *fname, int direction, const attn_tensor *q,
                              attnL_sdpa_call *c) {
  memset(c, 0, sizeof *c);
  c->o = attn_sdpa_defaults();
  c->kernel = ATTN_SDPA_AUTO;
  c->bias_grad = 1;
  if (q->ndim >= 1) c->o.scale = (float)(1.0 / sqrt((double)q->size[q->ndim - 1])); /* unless scale is given */
  if (!lua_isnoneornil(L, arg)) {
    if (!lua_istable(L, arg) || attnL_test(L, arg))
      attnL_error(L, fname, "bad argument #%d 'opts' (expected a table of options, got %s)", arg,
                  luaL_typename(L, arg));
    arg = lua_absindex(L, arg);
    check_keys(L, arg, fname, direction);
    luaL_checkstack(L, (int)NOPTIONS, fname);
    for (size_t i = 0; i < NOPTIONS; i++) {
      const sdpa_option *op = &OPTIONS[i];
      if (!(op->where & direction)) continue;
      if (lua_getfield(L, arg, op->name) == LUA_TNIL) {
        lua_pop(L, 1);
        continue;
      }
      check_kind(L, lua_gettop(L), fname, op);
      op->set(L, lua_gettop(L), fname, direction, c); /* the value stays on the stack */
    }
  }
  if (direction == FWD) { /* checked before the shapes, as the other options are */
    const char *why = attn_sdpa_kernel_refuses(c->kernel, c->need_weights);
    if (why) attnL_error(L, fname, "%s; use kernel = \"math\" or \"auto\"", why);
  } else {
    if (c->kernel == ATTN_SDPA_AUTO)
      attnL_error(L, fname, "bad argument #%d 'opts' (expected option kernel = \"math\" or \"flash\", the kernel the "
                  "forward ran)", arg);
    if (c->o.dropout_p > 0.0 && !c->draw_idx)
      attnL_error(L, fname, "bad argument #%d 'opts' (dropout_p > 0 needs dropout_draw, the forward's draw)", arg);
  }
}
