/* attn.core.tokenizer: the GPT-2 tokenizer of src/core/tokenizer.h from Lua
 * (a table, not copied into attn; lua/attn/tokenizer.lua wraps it):
 *   load(encoder_json, vocab_bpe) -> attn.Tokenizer userdata
 *   info(tok) -> n_vocab, eot (0-based; -1 when the vocabulary has none)
 *   encode(tok, text, allow_eot, base, fname[, raise_disallowed = true]) -> table of ids (id + base);
 *     without allow_eot, "<|endoftext|>" in the text raises, or with
 *     raise_disallowed false is encoded as plain text
 *   decode(tok, ids, base, fname) -> string (the tokens' bytes)
 * fname names the Lua method in messages. */
#include <string.h>

#include "attn_lua.h"
#include "tokenizer.h"

#define TOKENIZER_NAME "attn.Tokenizer"

static attn_tokenizer *check_tok(lua_State *L, int arg, const char *fname) {
  attn_tokenizer **p = luaL_testudata(L, arg, TOKENIZER_NAME);
  if (!p || !*p) {
    char buf[64];
    attnL_error(L, fname, "bad argument #%d 'tok' (expected %s, got %s)", arg, TOKENIZER_NAME,
                attnL_typename(L, arg, buf, sizeof buf));
  }
  return *p;
}

static int l_tok_gc(lua_State *L) {
  attn_tokenizer **p = luaL_checkudata(L, 1, TOKENIZER_NAME);
  attn_tokenizer_free(*p);
  *p = NULL;
  return 0;
}

static int l_load(lua_State *L) {
  const char *fn = "attn.tokenizer.gpt2";
  const char *enc = attnL_checkpath(L, 1, fn, "encoder_json");
  const char *bpe = attnL_checkpath(L, 2, fn, "vocab_bpe");
  /* the userdata first, so the loaded tokenizer is never held outside Lua */
  attn_tokenizer **p = lua_newuserdatauv(L, sizeof *p, 0);
  *p = NULL;
  luaL_setmetatable(L, TOKENIZER_NAME);
  if (attn_tokenizer_load(enc, bpe, p) != ATTN_OK) return attnL_core_error(L, fn);
  return 1;
}

static int l_info(lua_State *L) {
  attn_tokenizer *tok = check_tok(L, 1, "attn.core.tokenizer.info");
  lua_pushinteger(L, attn_tokenizer_n_vocab(tok));
  lua_pushinteger(L, attn_tokenizer_eot(tok));
  return 2;
}

static int l_encode(lua_State *L) {
  const char *fn = luaL_optstring(L, 5, "tok:encode");
  attn_tokenizer *tok = check_tok(L, 1, fn);
  if (lua_type(L, 2) != LUA_TSTRING) {
    char buf[64];
    return attnL_error(L, fn, "bad argument #1 'text' (expected a string, got %s)",
                       attnL_typename(L, 2, buf, sizeof buf));
  }
  size_t len;
  const char *text = lua_tolstring(L, 2, &len);
  int allow_eot = lua_toboolean(L, 3);
  lua_Integer base = luaL_checkinteger(L, 4);
  int raise_disallowed = lua_isnoneornil(L, 6) || lua_toboolean(L, 6);
  if (!allow_eot && raise_disallowed && attn_tokenizer_eot(tok) >= 0) {
    /* as tiktoken: special text that is not allowed is an error, not silently plain text */
    int64_t at = attn_tokenizer_find_special(text, len);
    if (at >= 0)
      return attnL_error(L, fn,
                         "the text holds the special token \"" ATTN_TOKENIZER_EOT_TEXT "\" at byte offset %d, "
                         "which is not allowed: pass {allowed_special = {\"" ATTN_TOKENIZER_EOT_TEXT "\"}} to "
                         "encode it as the end-of-text token, or {disallowed_special = {}} to encode it as text",
                         (int)at);
  }
  /* never more ids than bytes; the scratch is a userdata, freed by the collector if anything raises */
  int32_t *ids = lua_newuserdatauv(L, (len ? len : 1) * sizeof *ids, 0);
  size_t n;
  if (attn_tokenizer_encode(tok, text, len, allow_eot, ids, &n) != ATTN_OK)
    return attnL_core_error(L, fn);
  lua_createtable(L, n > 0x7FFFFFFF ? 0x7FFFFFFF : (int)n, 0);
  for (size_t k = 0; k < n; k++) {
    lua_pushinteger(L, (lua_Integer)ids[k] + base);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
  }
  return 1;
}

static int l_decode(lua_State *L) {
  const char *fn = luaL_optstring(L, 4, "tok:decode");
  attn_tokenizer *tok = check_tok(L, 1, fn);
  if (!lua_istable(L, 2)) {
    char buf[64];
    return attnL_error(L, fn, "bad argument #1 'ids' (expected a table of ids, got %s)",
                       attnL_typename(L, 2, buf, sizeof buf));
  }
  lua_Integer base = luaL_checkinteger(L, 3);
  lua_Integer nv = attn_tokenizer_n_vocab(tok);
  lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (lua_Integer k = 1; k <= n; k++) {
    int isint;
    int t = lua_rawgeti(L, 2, k);
    lua_Integer id = lua_tointegerx(L, -1, &isint);
    if (t != LUA_TNUMBER || !isint || id < base || id - base >= nv) {
      char buf[64];
      const char *got = t == LUA_TNUMBER ? lua_pushfstring(L, "%s", lua_tostring(L, -1))
                                         : attnL_typename(L, -1, buf, sizeof buf);
      return attnL_error(L, fn, "bad argument #1 'ids' (ids[%d] must be an integer id in %d..%d, got %s)", (int)k,
                         (int)base, (int)(base + nv - 1), got);
    }
    lua_pop(L, 1);
    size_t tl;
    const char *p = attn_tokenizer_token(tok, (int32_t)(id - base), &tl);
    luaL_addlstring(&b, p, tl);
  }
  luaL_pushresult(&b);
  return 1;
}

static const luaL_Reg funcs[] = {
  {"load", l_load},
  {"info", l_info},
  {"encode", l_encode},
  {"decode", l_decode},
  {NULL, NULL},
};

/* The module table is at -3 (module, methods, tensor metatable). */
void attnL_open_tokenizer(lua_State *L) {
  luaL_newmetatable(L, TOKENIZER_NAME);
  lua_pushcfunction(L, l_tok_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_newtable(L);
  luaL_setfuncs(L, funcs, 0);
  lua_setfield(L, -4, "tokenizer");
}
