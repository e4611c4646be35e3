/* The compiled score programs of attn.score_mod / attn.mask_mod (the tracer
 * is lua/attn/score_mod.lua; the evaluator src/core/score_mod.c): an
 * attn.ScoreMod userdata holding the program, with the captured tensors
 * and the printed expression as its user values.
 *
 *   core._score_program(kind, code, tables, text) -> program
 *     kind "score" or "mask"; code: a list of instructions {op = name, a, b,
 *     c (0-based operands, -1 unused), k (a number), tbl (0-based), ix = {...}};
 *     tables: the captured tensors (their shapes are the ones the program
 *     was traced with); text: what tostring gives.
 *   core._score_program_info(program) -> kind, tables
 * At each call the options parser copies the program with the tables'
 * current data and strides (attnL_score_mod_for_call), checking that they
 * kept their shapes. */
#include <string.h>

#include "attn_lua.h"
#include "lua_sdpa_options.h"
#include "score_mod.h"

#define SCORE_MOD_NAME "attn.ScoreMod"

static const char *const OPNAMES[ATTN_SMOD_NOPS] = {
    "score", "b", "h", "q", "k", "const", "add", "sub", "mul", "div", "neg", "pow", "abs", "exp", "log", "sqrt",
    "tanh", "sigmoid", "sin", "cos", "floor", "ceil", "sign", "clamp", "minimum", "maximum", "lt", "le", "gt", "ge",
    "eq", "ne", "logical_and", "logical_or", "logical_not", "where", "gather"};

static const char *const FN = "attn.core._score_program";

static int field_int(lua_State *L, int t, const char *name, int dflt) {
  int v = dflt;
  if (lua_getfield(L, t, name) != LUA_TNIL) v = (int)luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  return v;
}

static int score_program(lua_State *L) {
  attnL_check_nargs(L, 4, FN);
  const char *kind = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checkstring(L, 4);
  int is_mask = strcmp(kind, "mask") == 0;
  if (!is_mask && strcmp(kind, "score") != 0) attnL_error(L, FN, "bad kind '%s' (expected \"score\" or \"mask\")", kind);
  attn_score_mod *m = lua_newuserdatauv(L, sizeof *m, 2);
  memset(m, 0, sizeof *m);
  m->is_mask = is_mask;
  lua_Integer n = luaL_len(L, 2), nt = luaL_len(L, 3);
  if (n < 1 || n > ATTN_SMOD_MAX_INSNS)
    attnL_error(L, is_mask ? "attn.mask_mod" : "attn.score_mod",
                "the traced expression has %I operations, at most %d are supported", (LUA_INTEGER)n,
                ATTN_SMOD_MAX_INSNS);
  if (nt > ATTN_SMOD_MAX_TABLES)
    attnL_error(L, is_mask ? "attn.mask_mod" : "attn.score_mod",
                "the traced expression reads %I captured tensors, at most %d are supported", (LUA_INTEGER)nt,
                ATTN_SMOD_MAX_TABLES);
  m->n = (int)n;
  m->ntables = (int)nt;
  for (int t = 0; t < m->ntables; t++) {
    lua_geti(L, 3, t + 1);
    attn_tensor *x = attnL_check(L, -1, FN, "tables");
    attn_smod_table *tb = &m->tables[t];
    tb->ndim = x->ndim;
    memcpy(tb->size, x->size, sizeof tb->size);
    lua_pop(L, 1);
  }
  for (int i = 0; i < m->n; i++) {
    lua_geti(L, 2, i + 1);
    int e = lua_gettop(L);
    luaL_checktype(L, e, LUA_TTABLE);
    attn_smod_insn *in = &m->code[i];
    lua_getfield(L, e, "op");
    const char *op = luaL_checkstring(L, -1);
    in->op = -1;
    for (int o = 0; o < ATTN_SMOD_NOPS; o++)
      if (strcmp(op, OPNAMES[o]) == 0) in->op = o;
    if (in->op < 0) attnL_error(L, FN, "unknown operation '%s'", op);
    lua_pop(L, 1);
    in->a = field_int(L, e, "a", -1);
    in->b = field_int(L, e, "b", -1);
    in->c = field_int(L, e, "c", -1);
    in->tbl = field_int(L, e, "tbl", -1);
    lua_getfield(L, e, "k");
    in->k = (float)lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (lua_getfield(L, e, "ix") == LUA_TTABLE) {
      lua_Integer nd = luaL_len(L, -1);
      if (nd > ATTN_MAX_DIMS) attnL_error(L, FN, "a gather takes at most %d indices", ATTN_MAX_DIMS);
      in->nd = (int)nd;
      for (int d = 0; d < in->nd; d++) {
        lua_geti(L, -1, d + 1);
        in->ix[d] = (int)luaL_checkinteger(L, -1);
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 2);
  }
  if (attn_score_mod_finish(m) != ATTN_OK) attnL_core_error(L, FN);
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 4);
  lua_setiuservalue(L, -2, 2);
  luaL_setmetatable(L, SCORE_MOD_NAME);
  return 1;
}

static attn_score_mod *test_program(lua_State *L, int idx) { return luaL_testudata(L, idx, SCORE_MOD_NAME); }

int attnL_is_mask_mod(lua_State *L, int idx) {
  attn_score_mod *m = test_program(L, idx);
  return m && m->is_mask;
}

static int score_program_info(lua_State *L) {
  attn_score_mod *m = test_program(L, 1);
  if (!m) attnL_error(L, "attn.core._score_program_info", "expected an attn.ScoreMod");
  lua_pushstring(L, m->is_mask ? "mask" : "score");
  lua_getiuservalue(L, 1, 1);
  return 2;
}

static int program_tostring(lua_State *L) {
  attn_score_mod *m = luaL_checkudata(L, 1, SCORE_MOD_NAME);
  lua_getiuservalue(L, 1, 2);
  lua_pushfstring(L, "%s(%s)", m->is_mask ? "attn.mask_mod" : "attn.score_mod", lua_tostring(L, -1));
  return 1;
}

attn_score_mod *attnL_score_mod_for_call(lua_State *L, int idx, const char *fname, const char *option, int is_mask) {
  attn_score_mod *m = test_program(L, idx);
  const char *want = is_mask ? "attn.mask_mod" : "attn.score_mod";
  if (!m || m->is_mask != is_mask) {
    char buf[64];
    attnL_error(L, fname, "bad option '%s' (expected the result of %s(fn), got %s)", option, want,
                m ? (m->is_mask ? "an attn.mask_mod" : "an attn.score_mod") : attnL_typename(L, idx, buf, sizeof buf));
  }
  attn_score_mod *c = lua_newuserdatauv(L, sizeof *c, 0); /* stays on the stack for the call */
  memcpy(c, m, sizeof *c);
  lua_getiuservalue(L, idx, 1);
  int tl = lua_gettop(L);
  for (int t = 0; t < c->ntables; t++) {
    lua_geti(L, tl, t + 1);
    attn_tensor *x = attnL_test(L, -1);
    char b1[200], b2[200];
    int same = x && x->ndim == c->tables[t].ndim;
    for (int d = 0; same && d < x->ndim; d++) same = x->size[d] == c->tables[t].size[d];
    if (!same)
      attnL_error(L, fname, "%s: captured tensor #%d was %s when traced and is now %s: trace again", want, t + 1,
                  attn_sizes_str(c->tables[t].ndim, c->tables[t].size, b1, sizeof b1),
                  x ? attnL_shape(x, b2, sizeof b2) : "gone");
    c->tables[t].data = x->data;
    memcpy(c->tables[t].stride, x->stride, sizeof c->tables[t].stride);
    c->tables[t].grad = NULL;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return c;
}

static const luaL_Reg funcs[] = {{"_score_program", score_program}, {"_score_program_info", score_program_info},
                                 {NULL, NULL}};

void attnL_open_score_mod(lua_State *L) {
  if (luaL_newmetatable(L, SCORE_MOD_NAME)) {
    lua_pushcfunction(L, program_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushliteral(L, "attn.ScoreMod");
    lua_setfield(L, -2, "__metatable");
  }
  lua_pop(L, 1);
  lua_pushvalue(L, -3); /* the module */
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
