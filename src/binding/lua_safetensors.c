/* attn.save_safetensors / attn.load_safetensors (the format is src/core/safetensors.c's).
 * Every buffer here is a Lua userdata, so that an error raised at any point
 * (a bad argument, out of memory) leaks nothing. */
#include <stdlib.h>
#include <string.h>

#include "attn_lua.h"
#include "safetensors.h"

/* A garbage-collected buffer of n elements of `size` bytes, left on the stack. */
static void *push_buffer(lua_State *L, size_t n, size_t size, const char *fn) {
  if (size && n > (size_t)-1 / size) attnL_error(L, fn, "cannot allocate %I buffer elements", (lua_Integer)n);
  size_t bytes = n * size;
  return lua_newuserdatauv(L, bytes > 0 ? bytes : 1, 0);
}

static int by_item_name(const void *x, const void *y) {
  const attn_st_item *a = x, *b = y;
  int c = memcmp(a->name, b->name, a->name_len < b->name_len ? a->name_len : b->name_len);
  return c ? c : (a->name_len > b->name_len) - (a->name_len < b->name_len);
}

static int by_meta_key(const void *x, const void *y) {
  const attn_st_meta *a = x, *b = y;
  int c = memcmp(a->key, b->key, a->key_len < b->key_len ? a->key_len : b->key_len);
  return c ? c : (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

/* A key of the table at idx for messages: its text if a string, else its type. */
static const char *key_desc(lua_State *L, int key_idx) {
  return lua_type(L, key_idx) == LUA_TSTRING ? lua_tostring(L, key_idx) : luaL_typename(L, key_idx);
}

/* attn.save_safetensors(path, tensors[, metadata]): tensors is a table
 * name -> attn.Tensor, written as F32 in name order (as the Python library
 * does); metadata an optional table string -> string. Returns nothing. */
static int l_save_safetensors(lua_State *L) {
  const char *fn = "attn.save_safetensors";
  attnL_checkpath(L, 1, fn, "path");
  if (lua_type(L, 2) != LUA_TTABLE || attnL_test(L, 2))
    return attnL_error(L, fn, "bad argument #2 'tensors' (expected a table name -> attn.Tensor, got %s)",
                       attnL_test(L, 2) ? "attn.Tensor" : luaL_typename(L, 2));
  if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TTABLE)
    return attnL_error(L, fn, "bad argument #3 'metadata' (expected a table string -> string, got %s)",
                       luaL_typename(L, 3));
  lua_settop(L, 3);
  const char *path = attnL_checkpath(L, 1, fn, "path");

  /* One pass over each argument table copies every checked key and value
   * into an anchor table of our own (4 and 5): a finalizer that runs during
   * a later allocation may change the caller's tables, not what is written. */
  size_t n = 0, n_meta = 0;
  lua_newtable(L); /* 4: tensors anchor, key at 2i-1 and tensor at 2i */
  lua_newtable(L); /* 5: metadata anchor, likewise */
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      return attnL_error(L, fn, "bad argument #2 'tensors': keys must be tensor names (strings), got a %s key",
                         luaL_typename(L, -2));
    if (strcmp(lua_tostring(L, -2), "__metadata__") == 0)
      return attnL_error(L, fn, "bad argument #2 'tensors': the name '__metadata__' is reserved by the format");
    if (!attnL_test(L, -1))
      return attnL_error(L, fn, "bad argument #2 'tensors': the value of '%s' is a %s (expected attn.Tensor)",
                         lua_tostring(L, -2), luaL_typename(L, -1));
    lua_rawseti(L, 4, (lua_Integer)(2 * n + 2));
    lua_pushvalue(L, -1);
    lua_rawseti(L, 4, (lua_Integer)(2 * n + 1));
    n++;
  }
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        return attnL_error(L, fn, "bad argument #3 'metadata': entry '%s' is %s -> %s (expected string -> string)",
                           key_desc(L, -2), luaL_typename(L, -2), luaL_typename(L, -1));
      lua_rawseti(L, 5, (lua_Integer)(2 * n_meta + 2));
      lua_pushvalue(L, -1);
      lua_rawseti(L, 5, (lua_Integer)(2 * n_meta + 1));
      n_meta++;
    }
  }
  attn_st_item *items = push_buffer(L, n, sizeof *items, fn);
  attn_st_meta *meta = push_buffer(L, n_meta, sizeof *meta, fn);
  /* from here on nothing allocates: the pointers stay valid (the anchors hold them) */
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 4, (lua_Integer)(2 * i + 1));
    items[i].name = lua_tolstring(L, -1, &items[i].name_len);
    lua_rawgeti(L, 4, (lua_Integer)(2 * i + 2));
    items[i].t = attnL_test(L, -1);
    lua_pop(L, 2);
  }
  for (size_t i = 0; i < n_meta; i++) {
    lua_rawgeti(L, 5, (lua_Integer)(2 * i + 1));
    meta[i].key = lua_tolstring(L, -1, &meta[i].key_len);
    lua_rawgeti(L, 5, (lua_Integer)(2 * i + 2));
    meta[i].value = lua_tolstring(L, -1, &meta[i].value_len);
    lua_pop(L, 2);
  }
  qsort(items, n, sizeof *items, by_item_name);
  qsort(meta, n_meta, sizeof *meta, by_meta_key);
  if (attn_st_write(path, items, (int64_t)n, meta, (int64_t)n_meta) != ATTN_OK) return attnL_core_error(L, fn);
  return 0;
}

/* attn.load_safetensors(path): a table name -> tensor (float32; F64, F16 and
 * BF16 converted) and, as a second result, the __metadata__ table (empty
 * when the file has none). */
static int l_load_safetensors(lua_State *L) {
  const char *fn = "attn.load_safetensors";
  lua_settop(L, 1);
  const char *path = attnL_checkpath(L, 1, fn, "path");
  /* one descriptor for every read; the guard (2) closes it if an allocation raises */
  int *fd = attnL_push_fd_guard(L);
  uint64_t hlen;
  int64_t file_size;
  if (attn_st_open(path, fd, &file_size) != ATTN_OK) return attnL_core_error(L, fn);
  if (attn_st_read_prefix(path, *fd, file_size, &hlen) != ATTN_OK) return attnL_core_error(L, fn);
  unsigned char *buf = push_buffer(L, (size_t)hlen, 1, fn);
  if (attn_st_read_header(path, *fd, buf, (size_t)hlen) != ATTN_OK) return attnL_core_error(L, fn);
  int64_t data_len = file_size - 8 - (int64_t)hlen;
  attn_st_header h = {NULL, NULL, push_buffer(L, (size_t)hlen, 1, fn), 0, 0};
  if (attn_st_parse(path, buf, (size_t)hlen, data_len, &h) != ATTN_OK) return attnL_core_error(L, fn);
  h.entries = push_buffer(L, (size_t)h.n_entries, sizeof *h.entries, fn);
  h.meta = push_buffer(L, (size_t)h.n_meta, sizeof *h.meta, fn);
  if (attn_st_parse(path, buf, (size_t)hlen, data_len, &h) != ATTN_OK) return attnL_core_error(L, fn);

  lua_createtable(L, 0, (int)(h.n_entries < 1 << 20 ? h.n_entries : 1 << 20));
  int result = lua_gettop(L);
  for (int64_t i = 0; i < h.n_entries; i++) {
    attn_st_entry *e = &h.entries[i];
    lua_pushlstring(L, e->name, e->name_len);
    attn_tensor *t = attnL_push_uninit(L, e->ndim, e->size, fn);
    t->is_bool = e->dtype == ATTN_ELEM_BOOL; /* BOOL loads as a bool tensor, as in PyTorch */
    e->out = t->data;
    lua_rawset(L, result);
  }
  attn_status st = attn_st_read_data(path, *fd, hlen, h.entries, h.n_entries);
  attnL_close_fd(L, 2);
  if (st != ATTN_OK) return attnL_core_error(L, fn);
  lua_createtable(L, 0, (int)(h.n_meta < 1 << 20 ? h.n_meta : 1 << 20));
  for (int64_t i = 0; i < h.n_meta; i++) {
    lua_pushlstring(L, h.meta[i].key, h.meta[i].key_len);
    lua_pushlstring(L, h.meta[i].value, h.meta[i].value_len);
    lua_rawset(L, -3);
  }
  return 2;
}

static const luaL_Reg funcs[] = {
  {"save_safetensors", l_save_safetensors},
  {"load_safetensors", l_load_safetensors},
  {NULL, NULL},
};

void attnL_open_safetensors(lua_State *L) {
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, funcs, 0);
  lua_pop(L, 1);
}
