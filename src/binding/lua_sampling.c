/* Sampling from Lua with PyTorch's streams (src/core/sampling.c), on the
 * Lua state's generator: attn.multinomial, attn.randint, attn.randperm.
 * Indices come back 1-based, as every index of this API. */
#include "attn_lua.h"
#include "sampling.h"

/* attn.multinomial(probs, n[, replacement = false]): probs [k] or [rows, k]
 * -> [n] or [rows, n] of 1-based category indices. */
static int s_multinomial(lua_State *L) {
  const char *fn = "attn.multinomial";
  attnL_check_nargs(L, 3, fn);
  attn_tensor *probs = attnL_check(L, 1, fn, "probs");
  char shape[200];
  if (probs->ndim < 1 || probs->ndim > 2)
    attnL_error(L, fn, "bad argument #1 'probs' (expected a 1-D or 2-D tensor, got shape %s)",
                attnL_shape(probs, shape, sizeof shape));
  int64_t k = probs->size[probs->ndim - 1];
  int64_t rows = probs->ndim == 2 ? probs->size[0] : 1;
  if (k < 1 || k > ATTN_SAMPLE_MAX)
    attnL_error(L, fn, "bad argument #1 'probs' (expected 1 to 2^24 categories in the last dim, got shape %s)",
                attnL_shape(probs, shape, sizeof shape));
  int64_t n = attnL_checkinteger(L, 2, fn, "n");
  int replacement = attnL_checkboolean_opt(L, 3, fn, "replacement");
  if (n < 1) attnL_error(L, fn, "bad argument #2 'n' (expected a number of samples >= 1, got %I)", (lua_Integer)n);
  if (!replacement && n > k)
    attnL_error(L, fn, "bad argument #2 'n' (cannot draw %I samples without replacement from %I categories)",
                (lua_Integer)n, (lua_Integer)k);
  if (replacement && n > ATTN_SAMPLE_MAX)
    attnL_error(L, fn, "bad argument #2 'n' (expected at most 2^24 samples, got %I)", (lua_Integer)n);
  lua_settop(L, 1);
  attn_tensor *p = attnL_push_contiguous(L, 1, fn);
  if (attn_multinomial_check(p->data, rows, k, n, replacement) != ATTN_OK)
    attnL_error(L, fn, "bad argument #1 'probs' (%s)", attn_error_message());
  int64_t size[2] = {rows, n};
  int nd = probs->ndim;
  attn_tensor *out = attnL_push_uninit(L, nd, nd == 2 ? size : size + 1, fn);
  if (attn_rng_multinomial(attnL_generator(L), p->data, rows, k, n, replacement, out->data) != ATTN_OK)
    attnL_core_error(L, fn);
  return 1;
}

/* An integer bound of randint within +-2^24. */
static int64_t check_bound(lua_State *L, int arg, const char *fn, const char *what) {
  int64_t v = attnL_checkinteger(L, arg, fn, what);
  if (v < -ATTN_SAMPLE_MAX || v > ATTN_SAMPLE_MAX)
    attnL_error(L, fn, "bad argument #%d '%s' (expected an integer within +-2^24 = 16777216, got %I)", arg, what,
                (lua_Integer)v);
  return v;
}

/* attn.randint(low, high, size) or attn.randint(high, size): integers in
 * [low, high) (low = 0 by default) as torch.randint, size a table. */
static int s_randint(lua_State *L) {
  const char *fn = "attn.randint";
  attnL_check_nargs(L, 3, fn);
  int size_arg = lua_istable(L, 2) && !attnL_test(L, 2) ? 2 : 3;
  if (size_arg == 2 && !lua_isnone(L, 3))
    attnL_error(L, fn, "bad argument #3 (no more arguments expected after the size table, got %s)",
                luaL_typename(L, 3));
  if (!lua_istable(L, size_arg) || attnL_test(L, size_arg))
    attnL_error(L, fn, "bad argument #%d 'size' (expected a table of sizes such as {2, 3}, got %s)", size_arg,
                luaL_typename(L, size_arg));
  int64_t low = 0, high;
  if (size_arg == 2) {
    high = check_bound(L, 1, fn, "high");
  } else {
    low = check_bound(L, 1, fn, "low");
    high = check_bound(L, 2, fn, "high");
  }
  if (low >= high)
    attnL_error(L, fn, "bad argument #%d 'high' (expected low < high, got low = %I, high = %I)", size_arg - 1,
                (lua_Integer)low, (lua_Integer)high);
  int64_t size[ATTN_MAX_DIMS];
  lua_settop(L, size_arg);
  int nd = attnL_checksizes(L, size_arg, size, 0, fn);
  attn_tensor *out = attnL_push_uninit(L, nd, size, fn);
  if (attn_rng_randint(attnL_generator(L), low, high, out->data, attn_numel(out)) != ATTN_OK)
    attnL_core_error(L, fn);
  return 1;
}

/* attn.randperm(n): a random permutation of 1..n as torch.randperm(n) + 1. */
static int s_randperm(lua_State *L) {
  const char *fn = "attn.randperm";
  attnL_check_nargs(L, 1, fn);
  int64_t n = attnL_checkinteger(L, 1, fn, "n");
  if (n < 0 || n > ATTN_SAMPLE_MAX)
    attnL_error(L, fn, "bad argument #1 'n' (expected 0 <= n <= 2^24 = 16777216, got %I)", (lua_Integer)n);
  attn_tensor *out = attnL_push_uninit(L, 1, &n, fn);
  if (attn_rng_randperm(attnL_generator(L), n, out->data) != ATTN_OK) attnL_core_error(L, fn);
  return 1;
}

static const luaL_Reg funcs[] = {
    {"multinomial", s_multinomial},
    {"randint", s_randint},
    {"randperm", s_randperm},
    {NULL, NULL},
};

/* Expects [module, methods, metatable] on top; registers into the module. */
void attnL_open_sampling(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
