/* The autograd bookkeeping of attn.core (attn.core._autograd_*): the
 * per-call work of every recorded operation. */
#include <string.h>

#include "attn_lua.h"
#include "ops.h"

/* ---- autograd bookkeeping ------------------------------------------------
 * The per-call work of a recorded operation (lua/attn/autograd/init.lua), in C
 * because it runs on every recorded call: at notebook sizes this bookkeeping,
 * not the arithmetic, is the cost of a forward. Each closure has the tensor
 * metatable as upvalue 1, so telling a tensor apart is one pointer compare. */

/* Each helper's name, for its errors: the function and argument at fault. */
#define AG(name) "attn.core._autograd_" name

static int is_tensor_at(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx)) return 0;
  int same = lua_rawequal(L, -1, lua_upvalueindex(1));
  lua_pop(L, 1);
  return same;
}

/* Pushes history[value at idx] (the table at `history`). */
static int push_history(lua_State *L, int history, int idx) {
  lua_pushvalue(L, idx);
  return lua_rawget(L, history);
}

static void check_table_arg(lua_State *L, int arg, const char *fname, const char *what) {
  if (lua_type(L, arg) != LUA_TTABLE)
    attnL_error(L, fname, "bad argument #%d '%s' (expected a table, got %s)", arg, what, luaL_typename(L, arg));
}

/* The tensor test before every lua_touserdata of a tensor argument: the
 * metatable pointer against upvalue 1 (luaL_checkudata's safety without
 * its registry lookup by name, on the backward's hot path). */
static void check_tensor_arg(lua_State *L, int arg, const char *fname, const char *what) {
  if (!is_tensor_at(L, arg))
    attnL_error(L, fname, "bad argument #%d '%s' (expected attn.Tensor, got %s)", arg, what, luaL_typename(L, arg));
}

/* Calls visit(L, idx, state) for every tensor input of the arguments first
 * to last: tensors, and the tensors of a plain list (no metatable), in order. */
typedef void (*input_visitor)(lua_State *L, int idx, void *state);
static void each_input(lua_State *L, int first, int last, input_visitor visit, void *state) {
  for (int i = first; i <= last; i++) {
    if (is_tensor_at(L, i)) {
      visit(L, i, state);
    } else if (lua_type(L, i) == LUA_TTABLE && !lua_getmetatable(L, i)) {
      for (lua_Integer k = 1; lua_rawgeti(L, i, k) != LUA_TNIL; k++) { /* as ipairs on a plain table */
        if (is_tensor_at(L, -1)) visit(L, lua_gettop(L), state);
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  }
}

/* stale: the stack slot receiving the first stale input (see attnL_history_stale) */
struct input_scan { int count, requires, stale, found; };
static void scan_input(lua_State *L, int idx, void *state) {
  struct input_scan *s = state;
  s->count++;
  if (push_history(L, 1, idx) != LUA_TNIL && lua_toboolean(L, -1)) s->requires = 1;
  lua_pop(L, 1);
  if (!s->found && attnL_history_stale(L, idx)) {
    s->found = 1;
    lua_pushvalue(L, idx);
    lua_replace(L, s->stale);
  }
}

/* Fills the tables inputs, edges, needs (stack slots n+1 .. n+3). */
struct input_fill { int tables; lua_Integer k; };
static void fill_input(lua_State *L, int idx, void *state) {
  struct input_fill *f = state;
  int k = (int)++f->k;
  lua_pushvalue(L, idx);
  lua_rawseti(L, f->tables, k);
  int type = push_history(L, 1, idx);
  int needs = type != LUA_TNIL && lua_toboolean(L, -1);
  if (type == LUA_TTABLE) {
    lua_rawseti(L, f->tables + 1, k); /* the edge to the node that made it */
  } else {
    lua_pop(L, 1);
    if (needs) lua_pushvalue(L, idx); /* a leaf: the edge is the tensor itself */
    else lua_pushboolean(L, 0);
    lua_rawseti(L, f->tables + 1, k);
  }
  lua_pushboolean(L, needs);
  lua_rawseti(L, f->tables + 2, k);
}

/* _autograd_inputs(history, ...): false and the input when a tensor input of
 * the call (a tensor argument, or a tensor in a plain-list argument) is stale
 * (its history must be rebuilt, or the call refused, first); nothing when no
 * tensor input has history; else inputs (the tensor inputs in order), edges
 * (per input: its history entry {node, slot}, the tensor itself for a leaf,
 * false without history) and needs_input_grad (booleans). */
static int autograd_inputs_general(lua_State *L, int n);

/* Tensor inputs up to which autograd_inputs scans its arguments once. */
#define ONE_PASS_INPUTS 24

static int autograd_inputs(lua_State *L) {
  check_table_arg(L, 1, AG("inputs"), "history");
  int n = lua_gettop(L);
  /* One pass over the arguments, each input's history kept on the stack
   * (n + k), when they hold no list and few tensors (every recorded call of
   * a module); otherwise the general scan's two passes. */
  int idx[ONE_PASS_INPUTS], count = 0, requires = 0;
  if (!lua_checkstack(L, ONE_PASS_INPUTS + 4)) return autograd_inputs_general(L, n);
  for (int i = 2; i <= n; i++) {
    int type = lua_type(L, i);
    if (type == LUA_TTABLE) {
      if (!lua_getmetatable(L, i)) goto general; /* a plain list: its tensors are inputs too */
      lua_pop(L, 1);
      continue;
    }
    if (type != LUA_TUSERDATA || !is_tensor_at(L, i)) continue;
    if (count == ONE_PASS_INPUTS) goto general;
    if (attnL_history_stale(L, i)) { /* the first stale input, as the general scan finds it */
      lua_settop(L, n);
      lua_pushboolean(L, 0);
      lua_pushvalue(L, i);
      return 2;
    }
    idx[count++] = i;
    push_history(L, 1, i);
    if (lua_toboolean(L, -1)) requires = 1;
  }
  if (!requires) {
    lua_settop(L, n);
    return 0;
  }
  for (int t = 0; t < 3; t++) lua_createtable(L, count, 0);
  int tables = n + count + 1;
  for (int k = 0; k < count; k++) {
    int h = n + 1 + k, needs = lua_toboolean(L, h);
    lua_pushvalue(L, idx[k]);
    lua_rawseti(L, tables, k + 1);
    if (lua_type(L, h) == LUA_TTABLE) lua_pushvalue(L, h); /* the edge to the node that made it */
    else if (needs) lua_pushvalue(L, idx[k]); /* a leaf: the edge is the tensor itself */
    else lua_pushboolean(L, 0);
    lua_rawseti(L, tables + 1, k + 1);
    lua_pushboolean(L, needs);
    lua_rawseti(L, tables + 2, k + 1);
  }
  return 3;
general:
  lua_settop(L, n);
  return autograd_inputs_general(L, n);
}

static int autograd_inputs_general(lua_State *L, int n) {
  lua_pushnil(L);
  struct input_scan scan = {0, 0, n + 1, 0};
  each_input(L, 2, n, scan_input, &scan);
  if (scan.found) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_settop(L, n);
  if (!scan.requires) return 0;
  for (int t = 0; t < 3; t++) lua_createtable(L, scan.count, 0);
  struct input_fill fill = {n + 1, 0};
  each_input(L, 2, n, fill_input, &fill);
  return 3;
}

/* The key of t's sizes: the int64 sizes as bytes, a string Lua interns
 * (up to 5 dims), so that recording the same shapes again allocates nothing. */
static void push_shape_key(lua_State *L, const attn_tensor *t) {
  lua_pushlstring(L, (const char *)t->size, (size_t)t->ndim * sizeof t->size[0]);
}

/* Gives each tensor of the results at stack slots first..last that is not
 * marked non-differentiable (nondiff[t], nondiff at stack slot `nondiff`, 0
 * for none) and not an input (the table of inputs at `inputs`; the first
 * input may be returned by an in-place op, `dirty`) a slot of the node at
 * `node`, and sets node._nout. node._shapes: the key of the output's sizes
 * (push_shape_key) for a node of one output, a table slot -> key for more.
 * The history entry of slot 1 is the node itself (its fields node = itself,
 * slot = 1, set by the Lua layer): no table per recorded call for the usual
 * single output; slot s > 1 gets {node = node, slot = s}. */
static void give_slots(lua_State *L, int history, int node, int inputs, int nondiff, int dirty, int first, int last) {
  lua_Integer ninputs = (lua_Integer)lua_rawlen(L, inputs);
  int keys = 0; /* the stack slot of slot 1's key, then of the table of keys */
  lua_Integer slots = 0;
  for (int i = first; i <= last; i++) {
    if (!is_tensor_at(L, i)) continue;
    int skip = 0;
    if (nondiff) {
      lua_pushvalue(L, i);
      skip = lua_rawget(L, nondiff) != LUA_TNIL && lua_toboolean(L, -1);
      lua_pop(L, 1);
    }
    int dirty_result = 0; /* the in-place op's own tensor: a new slot, whatever else it is */
    if (dirty) {
      lua_rawgeti(L, inputs, 1);
      dirty_result = lua_rawequal(L, -1, i);
      lua_pop(L, 1);
    }
    for (lua_Integer k = 1; !skip && !dirty_result && k <= ninputs; k++) {
      lua_rawgeti(L, inputs, k);
      skip = lua_rawequal(L, -1, i);
      lua_pop(L, 1);
    }
    if (skip) continue;
    slots++;
    if (slots == 2) { /* a second output: the keys go in a table */
      lua_createtable(L, last - first + 1, 0);
      lua_pushvalue(L, keys);
      lua_rawseti(L, -2, 1);
      lua_replace(L, keys);
    }
    push_shape_key(L, lua_touserdata(L, i));
    if (slots == 1) keys = lua_gettop(L);
    else lua_rawseti(L, keys, slots);
    lua_pushvalue(L, i);
    if (slots == 1) {
      lua_pushvalue(L, node);
    } else {
      lua_createtable(L, 0, 2);
      lua_pushvalue(L, node);
      lua_setfield(L, -2, "node");
      lua_pushinteger(L, slots);
      lua_setfield(L, -2, "slot");
    }
    lua_rawset(L, history);
  }
  if (keys) {
    lua_pushvalue(L, keys);
    lua_setfield(L, node, "_shapes");
    lua_settop(L, keys - 1);
  }
  lua_pushinteger(L, slots);
  lua_setfield(L, node, "_nout");
}

/* _autograd_outputs(history, node, inputs, nondiff, dirty, results): the
 * slots (give_slots) of the tensors of results[2 .. results.n] (a pcall's
 * packed results). */
static int autograd_outputs(lua_State *L) {
  lua_settop(L, 6);
  check_table_arg(L, 1, AG("outputs"), "history");
  check_table_arg(L, 2, AG("outputs"), "node");
  check_table_arg(L, 3, AG("outputs"), "inputs");
  check_table_arg(L, 6, AG("outputs"), "results");
  int has_nondiff = lua_type(L, 4) == LUA_TTABLE, dirty = lua_toboolean(L, 5);
  lua_getfield(L, 6, "n");
  lua_Integer n = lua_tointeger(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, n > 1 ? (int)n + 4 : 4, "too many results");
  for (lua_Integer i = 2; i <= n; i++) lua_rawgeti(L, 6, i);
  give_slots(L, 1, 2, 3, has_nondiff ? 4 : 0, dirty, 7, lua_gettop(L));
  return 0;
}

/* _autograd_finish(history, node, inputs, ...): the slots (give_slots) of
 * the tensors among the results `...` of a forward that writes no input in
 * place (its non-differentiable outputs are node._nondiff); returns the
 * results, so that a recorded call ends in one call, without packing them. */
static int autograd_finish(lua_State *L) {
  int n = lua_gettop(L);
  check_table_arg(L, 1, AG("finish"), "history");
  check_table_arg(L, 2, AG("finish"), "node");
  check_table_arg(L, 3, AG("finish"), "inputs");
  lua_getfield(L, 2, "_nondiff");
  int nondiff = lua_type(L, -1) == LUA_TTABLE ? n + 1 : 0;
  give_slots(L, 1, 2, 3, nondiff, 0, 4, n);
  lua_settop(L, n);
  return n - 3;
}

/* _autograd_shape_key(t): the key of tensor t's sizes (push_shape_key). */
static int autograd_shape_key(lua_State *L) {
  check_tensor_arg(L, 1, AG("shape_key"), "t");
  push_shape_key(L, lua_touserdata(L, 1));
  return 1;
}

/* Whether a string of len bytes can be a shape key (ATTN_MAX_DIMS sizes at most). */
static int is_key_length(size_t len) { return len % sizeof(int64_t) == 0 && len <= ATTN_MAX_DIMS * sizeof(int64_t); }

/* The sizes of the shape key at arg into size (their count); else an error of
 * fname naming the argument (a number is no key: not converted). */
static int check_key_arg(lua_State *L, int arg, const char *fname, int64_t size[ATTN_MAX_DIMS]) {
  if (lua_type(L, arg) != LUA_TSTRING)
    attnL_error(L, fname, "bad argument #%d 'key' (expected a shape key (string), got %s)", arg, luaL_typename(L, arg));
  size_t len;
  const char *key = lua_tolstring(L, arg, &len);
  if (!is_key_length(len))
    attnL_error(L, fname, "bad argument #%d 'key' (expected a shape key, got a string of %d bytes)", arg, (int)len);
  memcpy(size, key, len);
  return (int)(len / sizeof size[0]);
}

/* _autograd_fill_key(key, g): a new tensor of the sizes the shape key holds,
 * every element g's one value with its bits (a NaN's payload, -0): a whole
 * reduction's gradient, g expanded and made contiguous, in one call. */
static int autograd_fill_key(lua_State *L) {
  static const char *const FN = AG("fill_key");
  int64_t size[ATTN_MAX_DIMS];
  int ndim = check_key_arg(L, 1, FN, size);
  check_tensor_arg(L, 2, FN, "g");
  const attn_tensor *g = lua_touserdata(L, 2);
  if (attn_numel(g) != 1)
    attnL_error(L, FN, "bad argument #2 'g' (expected one element, got %I)", (lua_Integer)attn_numel(g));
  float v = g->data[0];
  attn_tensor *out = attnL_push_uninit(L, ndim, size, FN);
  int64_t n = attn_numel(out);
  for (int64_t i = 0; i < n; i++) out->data[i] = v;
  return 1;
}

/* _autograd_sizes(key): the list of sizes a shape key (node._shapes) holds. */
static int autograd_sizes(lua_State *L) {
  int64_t size[ATTN_MAX_DIMS];
  int ndim = check_key_arg(L, 1, AG("sizes"), size);
  lua_createtable(L, ndim, 0);
  for (int d = 0; d < ndim; d++) {
    lua_pushinteger(L, (lua_Integer)size[d]);
    lua_rawseti(L, -2, d + 1);
  }
  return 1;
}

/* _autograd_heap_kb(): Lua's heap in KiB (collectgarbage("count"), without
 * its option lookup: the backward walk asks after every node). */
static int autograd_heap_kb(lua_State *L) {
  lua_pushnumber(L, (lua_Number)lua_gc(L, LUA_GCCOUNT, 0) + (lua_Number)lua_gc(L, LUA_GCCOUNTB, 0) / 1024.0);
  return 1;
}

/* _autograd_save(...): {n, the n values, then at 1 + n + i the version of
 * value i when it is a tensor (false otherwise)}: what ctx:save_for_backward
 * keeps, all in the array part (one allocation besides the table). */
static int autograd_save(lua_State *L) {
  int n = lua_gettop(L);
  lua_createtable(L, 2 * n + 1, 0);
  lua_pushinteger(L, n);
  lua_rawseti(L, n + 1, 1);
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, n + 1, 1 + i);
    if (is_tensor_at(L, i)) lua_pushinteger(L, attnL_version(L, i));
    else lua_pushboolean(L, 0);
    lua_rawseti(L, n + 1, 1 + n + i);
  }
  return 1;
}

/* _autograd_changed(saved): the index i of the first saved tensor (value i
 * of _autograd_save's list) whose storage was written in place since, or nothing. */
static int autograd_changed(lua_State *L) {
  check_table_arg(L, 1, AG("changed"), "saved");
  lua_rawgeti(L, 1, 1);
  lua_Integer n = lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, 1 + i);
    if (is_tensor_at(L, -1)) {
      lua_rawgeti(L, 1, 1 + n + i);
      int same = lua_tointeger(L, -1) == attnL_version(L, -2);
      lua_pop(L, 1);
      if (!same) {
        lua_pushinteger(L, i);
        return 1;
      }
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* _autograd_same_size(g, shape): whether tensor g has the sizes `shape` (a
 * tensor, a list of integer sizes, or the key of a node's output shape). */
static int autograd_same_size(lua_State *L) {
  static const char *const FN = AG("same_size");
  check_tensor_arg(L, 1, FN, "g");
  const attn_tensor *g = lua_touserdata(L, 1);
  int same;
  if (is_tensor_at(L, 2)) {
    same = attn_same_shape(g, lua_touserdata(L, 2));
  } else if (lua_type(L, 2) == LUA_TSTRING) {
    size_t len;
    const char *key = lua_tolstring(L, 2, &len);
    if (!is_key_length(len))
      attnL_error(L, FN, "bad argument #2 'shape' (expected a shape key, got a string of %d bytes)", (int)len);
    same = len == (size_t)g->ndim * sizeof g->size[0] && memcmp(key, g->size, len) == 0;
  } else {
    if (lua_type(L, 2) != LUA_TTABLE)
      attnL_error(L, FN, "bad argument #2 'shape' (expected attn.Tensor, a list of sizes or a shape key, got %s)",
                  luaL_typename(L, 2));
    lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
    same = n == g->ndim;
    for (lua_Integer d = 1; d <= n; d++) {
      lua_rawgeti(L, 2, d);
      if (!lua_isinteger(L, -1))
        attnL_error(L, FN, "bad argument #2 'shape' (expected a list of integer sizes, got %s at %I)",
                    lua_type(L, -1) == LUA_TNUMBER ? "a non-integer number" : luaL_typename(L, -1), d);
      same = same && lua_tointeger(L, -1) == g->size[d - 1];
      lua_pop(L, 1);
    }
  }
  lua_pushboolean(L, same);
  return 1;
}


/* _autograd_ones_like(t): a new float tensor of t's sizes filled with 1, the
 * implicit gradient of backward's one-element root (attn.ones(t:size())
 * without the list of sizes). */
static int autograd_ones_like(lua_State *L) {
  static const char *const FN = AG("ones_like");
  check_tensor_arg(L, 1, FN, "t");
  const attn_tensor *t = lua_touserdata(L, 1);
  attn_fill(attnL_push_uninit(L, t->ndim, t->size, FN), 1.0f);
  return 1;
}

/* _autograd_stale(t): whether t was made before an in-place write that autograd
 * recorded on memory it shares (attnL_history_stale). */
static int autograd_stale(lua_State *L) {
  check_tensor_arg(L, 1, AG("stale"), "t");
  lua_pushboolean(L, attnL_history_stale(L, 1));
  return 1;
}

/* _autograd_wrote(t): t was just written in place with new history. */
static int autograd_wrote(lua_State *L) {
  check_tensor_arg(L, 1, AG("wrote"), "t");
  attnL_history_wrote(L, 1);
  return 0;
}

/* _autograd_fresh(t): t's history was rebuilt after such a write. */
static int autograd_fresh(lua_State *L) {
  check_tensor_arg(L, 1, AG("fresh"), "t");
  attnL_history_fresh(L, 1);
  return 0;
}

static const luaL_Reg autograd_funcs[] = {
  {"_autograd_stale", autograd_stale}, {"_autograd_wrote", autograd_wrote}, {"_autograd_fresh", autograd_fresh},
  {"_autograd_inputs", autograd_inputs}, {"_autograd_outputs", autograd_outputs},
  {"_autograd_finish", autograd_finish}, {"_autograd_heap_kb", autograd_heap_kb},
  {"_autograd_sizes", autograd_sizes},
  {"_autograd_save", autograd_save}, {"_autograd_changed", autograd_changed},
  {"_autograd_same_size", autograd_same_size}, {"_autograd_ones_like", autograd_ones_like},
  {"_autograd_shape_key", autograd_shape_key}, {"_autograd_fill_key", autograd_fill_key}, {NULL, NULL}};

/* Expects [module, methods, metatable] on top; registers into the module
 * with the metatable as the helpers' upvalue. */
void attnL_open_autograd(lua_State *L) {
  lua_pushvalue(L, -3);
  lua_pushvalue(L, -2); /* the metatable: upvalue of the autograd helpers */
  luaL_setfuncs(L, autograd_funcs, 1);
  lua_pop(L, 1);
}
