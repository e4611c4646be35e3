/* Random numbers from Lua, on the Lua state's generator (attnL_generator):
 * attn.manual_seed, initial_seed, get_rng_state, set_rng_state, check_rng_state,
 * rand, randn, rng_raw_u32, dropout, set_dropout_stream, get_dropout_stream; methods
 * t:uniform_ and t:normal_; attnL_draw_dropout, the one place every dropout
 * consumer (attention, the fused modules) draws its mask. */
#include <math.h>
#include <string.h>

#include "attn_lua.h"
#include "ops.h"
#include "rng.h"

/* The registry key of the state's generator (a full userdata). */
static const char GENERATOR_KEY = 0;

attn_generator *attnL_generator(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &GENERATOR_KEY);
  attn_generator *g = lua_type(L, -1) == LUA_TUSERDATA && lua_rawlen(L, -1) == sizeof *g ? lua_touserdata(L, -1) : NULL;
  lua_pop(L, 1); /* the registry keeps it alive */
  if (!g) luaL_error(L, "attn: the random generator is missing (was the registry altered?)");
  return g;
}

/* Creates the state's generator, seeded as torch's default, unless a
 * previous require of attn.core in this state already did. */
static void open_generator(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &GENERATOR_KEY);
  int have = lua_touserdata(L, -1) != NULL;
  lua_pop(L, 1);
  if (have) return;
  attn_generator *g = lua_newuserdatauv(L, sizeof *g, 0);
  attn_rng_seed(g, ATTN_RNG_DEFAULT_SEED);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &GENERATOR_KEY);
}

typedef void (*fill_fn)(attn_generator *g, float *out, int64_t n, double a, double b);

/* Fill t with fn's numbers in torch's order for an in-place nullary op: the
 * tensor's memory order (TensorIterator sorts dims by stride), which is
 * row-major for contiguous tensors. Non-contiguous targets are filled through
 * a contiguous temporary in that order, then copied. */
static void fill_memory_order(lua_State *L, attn_tensor *t, fill_fn fn, double a, double b, const char *fname) {
  attn_generator *g = attnL_generator(L);
  attnL_check_writable(L, t, fname);
  int64_t n = attn_numel(t);
  if (n == 0) return;
  if (attn_is_contiguous(t)) {
    fn(g, t->data, n, a, b);
    return;
  }
  attn_tensor v;
  memset(&v, 0, sizeof v);
  v.data = t->data;
  for (int d = 0; d < t->ndim; d++) {
    if (t->size[d] == 1) continue;
    /* insertion by decreasing stride, stable */
    int k = v.ndim++;
    while (k > 0 && v.stride[k - 1] < t->stride[d]) {
      v.size[k] = v.size[k - 1];
      v.stride[k] = v.stride[k - 1];
      k--;
    }
    v.size[k] = t->size[d];
    v.stride[k] = t->stride[d];
  }
  if (attn_is_contiguous(&v)) {
    fn(g, v.data, n, a, b);
    return;
  }
  attn_tensor *tmp = attnL_push_uninit(L, v.ndim, v.size, fname);
  fn(g, tmp->data, n, a, b);
  if (attn_unary(ATTN_COPY, tmp, &v) != ATTN_OK) attnL_core_error(L, fname);
  lua_pop(L, 1);
}

static double optnumber(lua_State *L, int arg, double def, const char *fname, const char *what) {
  return lua_isnoneornil(L, arg) ? def : attnL_checknumber(L, arg, fname, what);
}

/* ---- seeding and state ----------------------------------------------------- */

static int r_manual_seed(lua_State *L) {
  attnL_check_nargs(L, 1, "attn.manual_seed");
  const char *fn = "attn.manual_seed";
  if (lua_type(L, 1) != LUA_TNUMBER)
    attnL_error(L, fn, "bad argument #1 'seed' (expected integer, got %s)", luaL_typename(L, 1));
  int64_t s = attnL_checkinteger(L, 1, fn, "seed");
  attn_rng_seed(attnL_generator(L), (uint64_t)s); /* two's complement, as torch */
  return 0;
}

static int r_initial_seed(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)attnL_generator(L)->seed);
  return 1;
}

static int r_get_rng_state(lua_State *L) {
  unsigned char buf[ATTN_RNG_STATE_BYTES];
  attn_rng_get_state(attnL_generator(L), buf);
  lua_pushlstring(L, (const char *)buf, sizeof buf);
  return 1;
}

static int r_set_rng_state(lua_State *L) {
  const char *fn = "attn.set_rng_state";
  if (lua_type(L, 1) != LUA_TSTRING)
    attnL_error(L, fn, "bad argument #1 'state' (expected a string from attn.get_rng_state, got %s)",
                luaL_typename(L, 1));
  size_t len;
  const char *s = lua_tolstring(L, 1, &len);
  if (attn_rng_set_state(attnL_generator(L), (const unsigned char *)s, (int64_t)len) != ATTN_OK)
    attnL_core_error(L, fn);
  return 0;
}

/* The check of set_rng_state without the change: the state is read into a
 * scratch generator, so that a caller restoring several things at once
 * (attn.checkpoint.load) can check them all before changing any. */
static int r_check_rng_state(lua_State *L) {
  const char *fn = "attn.check_rng_state";
  if (lua_type(L, 1) != LUA_TSTRING)
    attnL_error(L, fn, "bad argument #1 'state' (expected a string from attn.get_rng_state, got %s)",
                luaL_typename(L, 1));
  size_t len;
  const char *s = lua_tolstring(L, 1, &len);
  attn_generator scratch;
  if (attn_rng_set_state(&scratch, (const unsigned char *)s, (int64_t)len) != ATTN_OK) attnL_core_error(L, fn);
  lua_pushboolean(L, 1);
  return 1;
}

/* n raw 32-bit draws as a table of integers: for tests and for checking a
 * port against torch.randint streams. */
static int r_raw_u32(lua_State *L) {
  const char *fn = "attn.rng_raw_u32";
  int64_t n = attnL_checkinteger(L, 1, fn, "n");
  if (n < 0 || n > (int64_t)1 << 24)
    attnL_error(L, fn, "bad argument #1 'n' (expected 0 <= n <= 16777216, got %I)", (lua_Integer)n);
  attn_generator *g = attnL_generator(L);
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 1; i <= n; i++) {
    lua_pushinteger(L, (lua_Integer)attn_rng_u32(g));
    lua_rawseti(L, -2, (lua_Integer)i);
  }
  return 1;
}

/* ---- creation ---------------------------------------------------------------- */

/* A new tensor of the sizes at argument 1 filled by fn(a, b) (contiguous: memory order is torch's order). */
static int new_filled(lua_State *L, fill_fn fn, double a, double b, const char *fname) {
  int64_t size[ATTN_MAX_DIMS];
  int n = attnL_checksizes(L, 1, size, 0, fname);
  attn_tensor *t = attnL_push_uninit(L, n, size, fname);
  fn(attnL_generator(L), t->data, attn_numel(t), a, b);
  return 1;
}

static int r_rand(lua_State *L) { return new_filled(L, attn_rng_uniform_f32, 0.0, 1.0, "attn.rand"); }
static int r_randn(lua_State *L) { return new_filled(L, attn_rng_normal_f32, 0.0, 1.0, "attn.randn"); }

/* ---- in place ------------------------------------------------------------------ */

static int m_uniform_(lua_State *L) {
  const char *fn = "Tensor:uniform_";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  double a = optnumber(L, 2, 0.0, fn, "from");
  double b = optnumber(L, 3, 1.0, fn, "to");
  if (!(a <= b)) attnL_error(L, fn, "expects to return a [from, to) range, but found from=%f > to=%f", a, b);
  float range = (float)b - (float)a;
  if (!isfinite(range))
    attnL_error(L, fn, "expects to - from to be a finite float32, but found from=%f and to=%f", a, b);
  lua_settop(L, 1);
  fill_memory_order(L, t, attn_rng_uniform_f32, a, b, fn);
  attnL_bump_version(L, 1, fn);
  return 1;
}

static int m_normal_(lua_State *L) {
  const char *fn = "Tensor:normal_";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "self");
  double mean = optnumber(L, 2, 0.0, fn, "mean");
  double std = optnumber(L, 3, 1.0, fn, "std");
  if (!(std >= 0.0)) attnL_error(L, fn, "bad argument #3 'std' (expected std >= 0, got %f)", std);
  lua_settop(L, 1);
  /* torch: the 16-lane path only for contiguous float tensors of >= 16
   * elements; anything non-contiguous takes the scalar path */
  fill_memory_order(L, t, attn_is_contiguous(t) ? attn_rng_normal_f32 : attn_rng_normal_scalar_f32, mean, std,
                    fn);
  attnL_bump_version(L, 1, fn);
  return 1;
}

/* ---- dropout ------------------------------------------------------------------- */

/* The registry key of the state's dropout stream (an integer; absent: MKL). */
static const char DROPOUT_STREAM_KEY = 0;

static attn_dropout_stream dropout_stream(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &DROPOUT_STREAM_KEY);
  attn_dropout_stream s = lua_tointeger(L, -1) == ATTN_DROPOUT_DEFAULT ? ATTN_DROPOUT_DEFAULT : ATTN_DROPOUT_MKL;
  lua_pop(L, 1);
  return s;
}

attn_dropout_draw attnL_draw_dropout(lua_State *L, double p, int64_t numel, const char *fname) {
  attn_dropout_stream s = dropout_stream(L);
  if (numel < 0 && s == ATTN_DROPOUT_DEFAULT)
    attnL_error(L, fname, "the dropout mask has more elements than int64 counts (the default stream needs one "
                "flag per element; the \"mkl\" stream does not)");
  int64_t words = attn_dropout_keep_words(s, numel);
  uint64_t *keep = NULL;
  if (words > 0) {
    if ((uint64_t)words > (uint64_t)SIZE_MAX / sizeof *keep)
      attnL_error(L, fname, "dropout mask of %I elements is too large", (lua_Integer)numel);
    keep = lua_newuserdatauv(L, (size_t)words * sizeof *keep, 0); /* the GC owns it: nothing leaks on an error */
  } else {
    lua_pushnil(L);
  }
  return attn_dropout_draw_from(attnL_generator(L), s, p, numel, keep);
}

/* attn.set_dropout_stream(name): "mkl" or "default" (see rng.h). */
static int r_set_dropout_stream(lua_State *L) {
  const char *fn = "attn.set_dropout_stream";
  attnL_check_nargs(L, 1, fn);
  if (lua_type(L, 1) != LUA_TSTRING)
    attnL_error(L, fn, "bad argument #1 'stream' (expected \"mkl\" or \"default\", got %s)", luaL_typename(L, 1));
  const char *name = lua_tostring(L, 1);
  attn_dropout_stream s = ATTN_DROPOUT_MKL;
  if (strcmp(name, "mkl") == 0)
    s = ATTN_DROPOUT_MKL;
  else if (strcmp(name, "default") == 0)
    s = ATTN_DROPOUT_DEFAULT;
  else
    attnL_error(L, fn, "bad argument #1 'stream' (expected \"mkl\" or \"default\", got \"%s\")", name);
  lua_pushinteger(L, (lua_Integer)s);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &DROPOUT_STREAM_KEY);
  return 0;
}

static int r_get_dropout_stream(lua_State *L) {
  attnL_check_nargs(L, 0, "attn.get_dropout_stream");
  lua_pushstring(L, attn_dropout_stream_name(dropout_stream(L)));
  return 1;
}

/* attn.dropout(t, p[, training = true]): torch.nn.functional.dropout with the
 * selected stream's mask (MKL: one draw per call; default: two per element). Eval mode, p == 0 and empty tensors give
 * t itself; p == 1 gives t * 0; neither draws. */
static int r_dropout(lua_State *L) {
  const char *fn = "attn.dropout";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *t = attnL_check(L, 1, fn, "input");
  double p = attnL_checknumber(L, 2, fn, "p");
  if (!(p >= 0.0 && p <= 1.0)) attnL_error(L, fn, "dropout probability has to be between 0 and 1, but got %f", p);
  int training = 1;
  if (!lua_isnoneornil(L, 3)) {
    if (lua_type(L, 3) != LUA_TBOOLEAN)
      attnL_error(L, fn, "bad argument #3 'training' (expected boolean, got %s)", luaL_typename(L, 3));
    training = lua_toboolean(L, 3);
  }
  lua_settop(L, 1);
  int64_t n = attn_numel(t);
  if (!training || p == 0.0 || n == 0) return 1;
  attn_tensor *x = attnL_push_contiguous(L, 1, fn);
  attn_tensor *out = attnL_push_uninit(L, t->ndim, t->size, fn);
  if (p == 1.0) {
    for (int64_t i = 0; i < n; i++) out->data[i] = x->data[i] * 0.0f;
  } else {
    attn_rng_dropout_f32(attnL_generator(L), dropout_stream(L), x->data, out->data, n, p);
  }
  return 1;
}

static const luaL_Reg module_funcs[] = {
  {"manual_seed", r_manual_seed}, {"initial_seed", r_initial_seed}, {"get_rng_state", r_get_rng_state},
  {"set_rng_state", r_set_rng_state}, {"check_rng_state", r_check_rng_state}, {"rng_raw_u32", r_raw_u32},
  {"rand", r_rand}, {"randn", r_randn}, {"dropout", r_dropout}, {"set_dropout_stream", r_set_dropout_stream},
  {"get_dropout_stream", r_get_dropout_stream}, {NULL, NULL}};

static const luaL_Reg methods[] = {{"uniform_", m_uniform_}, {"normal_", m_normal_}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top; registers into them. */
void attnL_open_rng(lua_State *L) {
  open_generator(L);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, methods, 0);
  lua_pop(L, 1);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, module_funcs, 0);
  lua_pop(L, 1);
}
