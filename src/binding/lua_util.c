/* The attn.Tensor userdata: creation, storage, argument checks shared by the
 * binding files. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "attn_lua.h"
#include "ops.h"
#include "storage_version.h"

/* The tensor metatable is also kept in the registry under the address of
 * this variable: a light-userdata key is a cheaper lookup than the name
 * luaL_testudata and luaL_setmetatable hash on every call, and every
 * argument check and every new tensor goes through it. */
static const char tensor_mt_key;

void attnL_register_tensor_mt(lua_State *L, int idx) {
  lua_pushvalue(L, idx);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
}

static void set_tensor_mt(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  lua_setmetatable(L, -2);
}

const void *attnL_tensor_mt(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  const void *mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  return mt;
}

attn_tensor *attnL_test_mt(lua_State *L, int arg, const void *mt) {
  if (lua_type(L, arg) != LUA_TUSERDATA || !lua_getmetatable(L, arg)) return NULL;
  const void *its = lua_topointer(L, -1);
  lua_pop(L, 1);
  return its == mt ? lua_touserdata(L, arg) : NULL;
}

attn_tensor *attnL_test(lua_State *L, int arg) {
  void *p = lua_touserdata(L, arg);
  if (!p || !lua_getmetatable(L, arg)) return NULL;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  int same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same ? p : NULL;
}

attn_tensor *attnL_check(lua_State *L, int arg, const char *fname, const char *what) {
  attn_tensor *t = attnL_test(L, arg);
  if (!t) {
    char buf[64];
    attnL_error(L, fname, "bad argument #%d '%s' (expected attn.Tensor, got %s)", arg, what,
                attnL_typename(L, arg, buf, sizeof buf));
  }
  return t;
}

const char *attnL_typename(lua_State *L, int arg, char *buf, size_t len) {
  arg = lua_absindex(L, arg);
  const char *type = luaL_typename(L, arg);
  if (luaL_getmetafield(L, arg, "__name") == LUA_TSTRING) {
    const char *name = lua_tostring(L, -1);
    if (strcmp(name, ATTN_TENSOR_NAME) == 0 && !attnL_test(L, arg))
      snprintf(buf, len, "%s (not an attn.Tensor)", type); /* a look-alike claiming the name */
    else
      snprintf(buf, len, "%s", name);
    lua_pop(L, 1);
    return buf;
  }
  return type;
}

/* luaL_where for the user's code: the first caller that is not a Lua
 * function of the Lua layer, which stands between the user's call and many C
 * functions; an error then points at the user's line, as when the C function
 * is called directly. The layer's files are known by the source prefix that
 * lua/attn/caller.lua registers (attn's init.lua loads it before any other
 * file of the layer). A C caller such as pcall ends the walk: what it catches
 * is the catcher's to word, and the position is left out ("" from luaL_where). */
static int is_layer_source(const char *source, const char *prefix, size_t plen) {
  return prefix != NULL && strncmp(source, prefix, plen) == 0;
}

void attnL_where(lua_State *L) {
  lua_Debug ar;
  size_t plen = 0;
  lua_getfield(L, LUA_REGISTRYINDEX, "attn.lua_source_prefix");
  const char *prefix = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &plen) : NULL;
  int level = 1;
  for (; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "S", &ar)) break;
    if (ar.what[0] == 'C' || !is_layer_source(ar.source, prefix, plen)) break;
  }
  lua_pop(L, 1); /* the prefix: the strings compared above are no longer used */
  luaL_where(L, level);
}

int attnL_error(lua_State *L, const char *fname, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  attnL_where(L);
  lua_pushfstring(L, "%s: ", fname);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 3);
  return lua_error(L);
}

static const char *describe(lua_State *L, int arg, char *buf, size_t len);

void attnL_check_nargs(lua_State *L, int max, const char *fname) {
  int n = lua_gettop(L);
  if (n > max)
    attnL_error(L, fname, "bad argument #%d (no more than %d argument%s expected, got %d)", max + 1, max,
                max == 1 ? "" : "s", n);
}

int attnL_checkboolean_opt(lua_State *L, int arg, const char *fname, const char *what) {
  if (lua_isnoneornil(L, arg)) return 0;
  if (lua_type(L, arg) != LUA_TBOOLEAN) {
    char buf[64];
    attnL_error(L, fname, "bad argument #%d '%s' (expected a boolean, got %s)", arg, what,
                describe(L, arg, buf, sizeof buf));
  }
  return lua_toboolean(L, arg);
}

int attnL_core_error(lua_State *L, const char *fname) {
  return attnL_error(L, fname, "%s", attn_error_message());
}

const char *attnL_shape(const attn_tensor *t, char *buf, size_t len) {
  return attn_shape_str(t, buf, len);
}

void attnL_check_writable(lua_State *L, const attn_tensor *t, const char *fname) {
  if (attn_has_internal_overlap(t)) {
    char b[200];
    attnL_error(L, fname, "unsupported operation: more than one element of the written-to tensor (shape %s, "
                "expanded: its elements share memory) refers to a single memory location. Please clone() the "
                "tensor before performing the operation.", attnL_shape(t, b, sizeof b));
  }
}

void attnL_copy_into(lua_State *L, attn_tensor *dst, const attn_tensor *src, const char *fname) {
  attnL_check_writable(L, dst, fname);
  attn_overlap overlap;
  /* into a bool tensor, nonzero values become 1, as PyTorch's copy_ to bool */
  attn_unop op = dst->is_bool && !src->is_bool ? ATTN_NONZERO : ATTN_COPY;
  if (attn_overlap_status(dst, src, &overlap) != ATTN_OK) attnL_core_error(L, fname);
  if (overlap == ATTN_OVERLAP_FULL) { /* every element onto itself */
    if (op != ATTN_COPY) attn_unary(op, dst, dst);
    return;
  }
  if (overlap == ATTN_OVERLAP_PARTIAL) {
    attn_tensor *tmp = attnL_push_uninit(L, src->ndim, src->size, fname);
    attn_unary(ATTN_COPY, src, tmp);
    attn_unary(op, tmp, dst);
    lua_pop(L, 1);
    return;
  }
  if (attn_unary(op, src, dst) != ATTN_OK) attnL_core_error(L, fname);
}

const char *attnL_checkpath(lua_State *L, int arg, const char *fname, const char *what) {
  if (lua_type(L, arg) != LUA_TSTRING)
    attnL_error(L, fname, "bad argument #%d '%s' (expected a string, got %s)", arg, what, luaL_typename(L, arg));
  size_t len;
  const char *path = lua_tolstring(L, arg, &len);
  if (strlen(path) != len)
    attnL_error(L, fname, "bad argument #%d '%s' (a string with an embedded NUL byte)", arg, what);
  return path;
}

#define FD_GUARD_NAME "attn.FileGuard"

static int fd_guard_close(lua_State *L) {
  int *fd = luaL_checkudata(L, 1, FD_GUARD_NAME);
  if (*fd >= 0) close(*fd);
  *fd = -1;
  return 0;
}

int *attnL_push_fd_guard(lua_State *L) {
  int *fd = lua_newuserdatauv(L, sizeof(int), 0);
  *fd = -1;
  if (luaL_newmetatable(L, FD_GUARD_NAME)) {
    lua_pushcfunction(L, fd_guard_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, fd_guard_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  return fd;
}

void attnL_close_fd(lua_State *L, int idx) {
  int *fd = luaL_checkudata(L, idx, FD_GUARD_NAME);
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

#define STORAGE_USER_VALUES 3
/* Storage up to which the allocation runs without the protected call that
 * names the request in an out-of-memory error: the protected call costs more
 * than a notebook-sized tensor's whole allocation. */
#define SMALL_STORAGE_BYTES 4096

/* Storage allocation runs protected, so running out of memory becomes an
 * error that names the request instead of Lua's bare "not enough memory". */
static int allocate_storage(lua_State *L) {
  size_t bytes = *(const size_t *)lua_touserdata(L, 1);
  lua_newuserdatauv(L, bytes, STORAGE_USER_VALUES);
  return 1;
}

/* The storage's user values: src/binding/storage_version.h. */
void attnL_bump_version(lua_State *L, int arg, const char *fname) { attn_storage_bump_version(L, arg, fname); }

/* Push the history family of the tensor at arg: its own (a detached alias and
 * its views), else its storage. Its user value 3 is the serial. */
static void push_family(lua_State *L, int arg) {
  if (lua_getiuservalue(L, arg, 3) == LUA_TUSERDATA) return;
  lua_pop(L, 1);
  lua_getiuservalue(L, arg, 1);
}

static lua_Integer family_serial(lua_State *L) {
  lua_Integer serial = 0;
  if (lua_type(L, -1) == LUA_TUSERDATA) {
    lua_getiuservalue(L, -1, 3);
    serial = lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  return serial;
}

/* Whether any family has had a recorded in-place write, in any Lua state:
 * until one has, every serial is 0 and no tensor can be stale, so the checks
 * that every recorded call and every view pay are skipped (only ever set to
 * 1, so a race between states can only make a check run). */
static int history_written;

int attnL_history_stale(lua_State *L, int arg) {
  if (!history_written) return 0;
  arg = lua_absindex(L, arg);
  lua_getiuservalue(L, arg, 2);
  lua_Integer made = lua_tointeger(L, -1);
  lua_pop(L, 1);
  push_family(L, arg);
  lua_Integer serial = family_serial(L);
  lua_pop(L, 1);
  return made != serial;
}

void attnL_history_fresh(lua_State *L, int arg) {
  arg = lua_absindex(L, arg);
  push_family(L, arg);
  lua_pushinteger(L, family_serial(L));
  lua_setiuservalue(L, arg, 2);
  lua_pop(L, 1);
}

void attnL_history_wrote(lua_State *L, int arg) {
  history_written = 1;
  arg = lua_absindex(L, arg);
  push_family(L, arg);
  if (lua_type(L, -1) == LUA_TUSERDATA) {
    lua_Integer serial = family_serial(L) + 1;
    lua_pushinteger(L, serial);
    lua_setiuservalue(L, -2, 3);
    lua_pushinteger(L, serial);
    lua_setiuservalue(L, arg, 2);
  }
  lua_pop(L, 1);
}

void attnL_history_new_family(lua_State *L, int arg) {
  arg = lua_absindex(L, arg);
  lua_newuserdatauv(L, 0, 3);
  lua_setiuservalue(L, arg, 3);
  lua_pushnil(L);
  lua_setiuservalue(L, arg, 2);
}

lua_Integer attnL_version(lua_State *L, int arg) {
  lua_Integer v = 0;
  if (lua_getiuservalue(L, arg, 1) == LUA_TUSERDATA) {
    lua_getiuservalue(L, -1, 1);
    v = lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return v;
}

int attnL_push_version(lua_State *L, int arg) {
  arg = lua_absindex(L, arg);
  lua_pushinteger(L, attnL_version(L, arg));
  if (lua_getiuservalue(L, arg, 1) == LUA_TUSERDATA) {
    lua_getiuservalue(L, -1, 2);
    lua_remove(L, -2);
  } else {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
  return 2;
}

static attn_tensor *push_tensor(lua_State *L, int ndim, const int64_t *size, const char *fname, int zero) {
  int64_t numel;
  if (ndim > ATTN_MAX_DIMS) attnL_error(L, fname, "at most %d dims are supported, got %d", ATTN_MAX_DIMS, ndim);
  if (attn_numel_checked(ndim, size, &numel) != ATTN_OK) attnL_core_error(L, fname);
  /* the userdata gets its metatable before any memory that could fail */
  attn_tensor *t = lua_newuserdatauv(L, sizeof(attn_tensor), TENSOR_USER_VALUES);
  memset(t, 0, sizeof *t);
  set_tensor_mt(L);
  size_t bytes = (size_t)numel * sizeof(float);
  if (bytes <= SMALL_STORAGE_BYTES) {
    /* a small block: unprotected (Lua's own memory error if even that fails) */
    lua_newuserdatauv(L, bytes, STORAGE_USER_VALUES);
  } else {
    lua_pushcfunction(L, allocate_storage);
    lua_pushlightuserdata(L, &bytes);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
      lua_pop(L, 1);
      attnL_error(L, fname, "cannot allocate %I bytes for a tensor of %I elements (out of memory)",
                  (lua_Integer)bytes, (lua_Integer)numel);
    }
  }
  float *data = lua_touserdata(L, -1);
  if (zero && bytes) memset(data, 0, bytes);
  lua_setiuservalue(L, -2, 1);
  *t = attn_make(data, ndim, size);
  return t;
}

attn_tensor *attnL_push_new(lua_State *L, int ndim, const int64_t *size, const char *fname) {
  return push_tensor(L, ndim, size, fname, 1);
}

attn_tensor *attnL_push_uninit(lua_State *L, int ndim, const int64_t *size, const char *fname) {
  return push_tensor(L, ndim, size, fname, 0);
}

attn_tensor *attnL_push_view(lua_State *L, int base, const attn_tensor *view) {
  base = lua_absindex(L, base);
  attn_tensor *t = lua_newuserdatauv(L, sizeof(attn_tensor), TENSOR_USER_VALUES);
  *t = *view;
  set_tensor_mt(L);
  lua_getiuservalue(L, base, 1);
  lua_setiuservalue(L, -2, 1);
  if (lua_getiuservalue(L, base, 3) == LUA_TUSERDATA) {
    lua_setiuservalue(L, -2, 3); /* the base's own family */
  } else {
    lua_pop(L, 1);
  }
  lua_Integer serial = 0;
  if (history_written) {
    push_family(L, base);
    serial = family_serial(L);
    lua_pop(L, 1);
  }
  if (serial) {
    lua_pushinteger(L, serial);
    lua_setiuservalue(L, -2, 2);
  }
  return t;
}

attn_tensor *attnL_push_contiguous(lua_State *L, int arg, const char *fname) {
  attn_tensor *src = attnL_test(L, arg);
  if (attn_is_contiguous(src)) {
    lua_pushvalue(L, arg);
    return src;
  }
  attn_tensor *dst = attnL_push_uninit(L, src->ndim, src->size, fname);
  attn_unary(ATTN_COPY, src, dst);
  dst->is_bool = src->is_bool;
  return dst;
}

/* An integral value of a number argument, if it has one. */
static int integral(lua_State *L, int arg, int64_t *out) {
  if (lua_isinteger(L, arg)) {
    *out = (int64_t)lua_tointeger(L, arg);
    return 1;
  }
  if (lua_type(L, arg) == LUA_TNUMBER) {
    double v = (double)lua_tonumber(L, arg);
    if (v == v && v >= -9.2233720368547e18 && v <= 9.2233720368547e18 && (double)(int64_t)v == v) {
      *out = (int64_t)v;
      return 1;
    }
  }
  return 0;
}

static const char *describe(lua_State *L, int arg, char *buf, size_t len) {
  if (lua_type(L, arg) == LUA_TNUMBER) {
    lua_Number v = lua_tonumber(L, arg);
    snprintf(buf, len, "%.14g", (double)v);
    return buf;
  }
  return attnL_typename(L, arg, buf, len);
}

int64_t attnL_checkinteger(lua_State *L, int arg, const char *fname, const char *what) {
  int64_t v;
  if (!integral(L, arg, &v)) {
    char buf[64];
    attnL_error(L, fname, "bad argument #%d '%s' (expected an integer, got %s)", arg, what,
                describe(L, arg, buf, sizeof buf));
  }
  return v;
}

double attnL_checknumber(lua_State *L, int arg, const char *fname, const char *what) {
  if (lua_type(L, arg) != LUA_TNUMBER) {
    char buf[64];
    attnL_error(L, fname, "bad argument #%d '%s' (expected a number, got %s)", arg, what,
                describe(L, arg, buf, sizeof buf));
  }
  return (double)lua_tonumber(L, arg);
}

int attnL_checkdim(lua_State *L, int arg, int ndim, const char *fname) {
  int64_t d = attnL_checkinteger(L, arg, fname, "dim");
  int64_t lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim : 1;
  if (d == 0 || d < lo || d > hi)
    attnL_error(L, fname, "bad argument #%d 'dim' (expected a dim in [%I, %I] excluding 0, got %I)", arg,
                (lua_Integer)lo, (lua_Integer)hi, (lua_Integer)d);
  return (int)(d > 0 ? d - 1 : d + (ndim > 0 ? ndim : 1));
}

/* One size element, at stack index idx, for message position pos. */
static int64_t size_element(lua_State *L, int idx, int pos, int allow_infer, const char *fname) {
  int64_t v;
  if (!integral(L, idx, &v) || v < (allow_infer ? -1 : 0)) {
    char buf[64];
    attnL_error(L, fname, "size #%d must be a non-negative integer%s, got %s", pos,
                allow_infer ? " (or -1)" : "", describe(L, idx, buf, sizeof buf));
  }
  return v;
}

int attnL_checksizes(lua_State *L, int first, int64_t *size, int allow_infer, const char *fname) {
  int n = 0, infer = 0;
  if (lua_istable(L, first) && !attnL_test(L, first)) {
    lua_Integer len = luaL_len(L, first);
    if (len > ATTN_MAX_DIMS) attnL_error(L, fname, "at most %d dims are supported, got %I", ATTN_MAX_DIMS, len);
    if (lua_gettop(L) > first && !lua_isnil(L, first + 1))
      attnL_error(L, fname, "sizes given as a table take no further size arguments");
    for (lua_Integer i = 1; i <= len; i++) {
      lua_geti(L, first, i);
      size[n] = size_element(L, -1, n + 1, allow_infer, fname);
      lua_pop(L, 1);
      n++;
    }
  } else {
    int top = lua_gettop(L);
    if (top - first + 1 > ATTN_MAX_DIMS)
      attnL_error(L, fname, "at most %d dims are supported, got %d", ATTN_MAX_DIMS, top - first + 1);
    for (int i = first; i <= top; i++, n++) size[n] = size_element(L, i, n + 1, allow_infer, fname);
  }
  for (int i = 0; i < n; i++)
    if (size[i] == -1 && infer++) attnL_error(L, fname, "only one size may be -1");
  return n;
}
