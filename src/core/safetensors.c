/* safetensors reader and writer (see safetensors.h), with a small strict
 * JSON parser for exactly the header's grammar: a top-level object whose
 * values are tensor descriptions ({"dtype": string, "shape": [integers],
 * "data_offsets": [begin, end]}, each key once, no other) or, under
 * "__metadata__", an object of strings. Strings may hold any JSON escape,
 * \uXXXX with surrogate pairs included; numbers must be non-negative
 * integers. Anything else is refused with what was found and where. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fileio.h"
#include "safetensors.h"

#define CHUNK 4096
#define NAME_SHOWN 200 /* bytes of a name shown in a message */

static attn_status file_error(const char *path, const char *what) {
  return attn_fail(ATTN_EARG, "%s: cannot %s the file: %s", path, what, strerror(errno));
}

attn_status attn_st_open(const char *path, int *fd, int64_t *file_size) {
  attn_file_problem why;
  *fd = attn_open_regular(path, file_size, &why);
  if (*fd >= 0) return ATTN_OK;
  if (why == ATTN_FILE_CANNOT_OPEN) return file_error(path, "open");
  if (why == ATTN_FILE_CANNOT_STAT) return file_error(path, "stat");
  return attn_fail(ATTN_EARG, "%s: cannot read it: not a regular file%s", path,
                   why == ATTN_FILE_IS_DIRECTORY ? " (a directory)" : "");
}

attn_status attn_st_read_prefix(const char *path, int fd, int64_t file_size, uint64_t *header_len) {
  unsigned char pre[8];
  int64_t got = attn_read_at(fd, pre, sizeof pre, 0);
  if (got < 0) return file_error(path, "read");
  if (got < 8)
    return attn_fail(ATTN_EARG, "%s: truncated: %lu bytes, too short for the 8-byte header length of a "
                     "safetensors file", path, (unsigned long)got);
  uint64_t n = attn_load_u64le(pre);
  if (n > ATTN_ST_MAX_HEADER)
    return attn_fail(ATTN_EARG, "%s: not a safetensors file: its header length %llu is absurd (more than %d bytes)",
                     path, (unsigned long long)n, ATTN_ST_MAX_HEADER);
  if ((int64_t)n > file_size - 8)
    return attn_fail(ATTN_EARG, "%s: truncated: the header length is %llu bytes but the file holds only %lld "
                     "after it", path, (unsigned long long)n, (long long)(file_size - 8));
  if (n < 2)
    return attn_fail(ATTN_EARG, "%s: not a safetensors file: a header of %llu bytes cannot hold a JSON object",
                     path, (unsigned long long)n);
  *header_len = n;
  return ATTN_OK;
}

attn_status attn_st_read_header(const char *path, int fd, unsigned char *buf, size_t len) {
  int64_t got = attn_read_at(fd, buf, len, 8);
  if (got < 0) return file_error(path, "read");
  if ((size_t)got < len)
    return attn_fail(ATTN_EARG, "%s: truncated: the file ends inside its %lu-byte header", path, (unsigned long)len);
  return ATTN_OK;
}

/* ---- the header's JSON ---------------------------------------------------- */

typedef struct parser {
  const char *path;
  const unsigned char *start, *p, *end;
  char *arena;          /* decoded strings, NUL-terminated */
  size_t used;
  attn_st_header *h;
  int64_t data_len;
} parser;

static attn_status bad_json(const parser *ps, const char *what) {
  return attn_fail(ATTN_EARG, "%s: bad JSON in the header at byte %lld: %s", ps->path,
                   (long long)(ps->p - ps->start), what);
}

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

/* The next non-blank byte is c: consume it. */
static int accept(parser *ps, unsigned char c) {
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == c) {
    ps->p++;
    return 1;
  }
  return 0;
}

static attn_status expect(parser *ps, unsigned char c, const char *what) {
  if (accept(ps, c)) return ATTN_OK;
  if (ps->p >= ps->end) return bad_json(ps, "the header ends early (truncated JSON)");
  char msg[96];
  snprintf(msg, sizeof msg, "expected %s, found '%c'", what, *ps->p >= 0x20 && *ps->p < 0x7f ? *ps->p : '?');
  return bad_json(ps, msg);
}

/* Length of the valid UTF-8 sequence at p (1-4), or 0 when it is not one. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
  unsigned char c = p[0];
  int n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (end - p < n) return 0;
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3f);
  }
  /* no overlong forms, surrogates or code points past U+10FFFF */
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

static int hex4(const unsigned char *p, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return 0;
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return 1;
}

static void put_utf8(parser *ps, uint32_t cp) {
  char *o = ps->arena + ps->used;
  if (cp < 0x80) {
    o[0] = (char)cp;
    ps->used += 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xc0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3f));
    ps->used += 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xe0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    ps->used += 3;
  } else {
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    ps->used += 4;
  }
}

/* A JSON string, decoded into the arena (never longer than its source, so
 * the arena of header-length bytes always suffices, terminators included). */
static attn_status parse_string(parser *ps, const char **out, size_t *out_len) {
  attn_status st = expect(ps, '"', "a string");
  if (st != ATTN_OK) return st;
  size_t first = ps->used;
  for (;;) {
    if (ps->p >= ps->end) return bad_json(ps, "a string is not terminated (truncated JSON)");
    unsigned char c = *ps->p;
    if (c == '"') {
      ps->p++;
      break;
    }
    if (c < 0x20) return bad_json(ps, "a control character inside a string");
    if (c != '\\') {
      int n = utf8_len(ps->p, ps->end);
      if (n == 0) return bad_json(ps, "a string is not valid UTF-8");
      memcpy(ps->arena + ps->used, ps->p, (size_t)n);
      ps->used += (size_t)n;
      ps->p += n;
      continue;
    }
    if (ps->end - ps->p < 2) return bad_json(ps, "a string ends inside an escape");
    c = ps->p[1];
    const char *simple = strchr("\"\\/bfnrt", c);
    if (c != 0 && simple) {
      static const char decoded[] = "\"\\/\b\f\n\r\t";
      ps->arena[ps->used++] = decoded[simple - "\"\\/bfnrt"];
      ps->p += 2;
      continue;
    }
    if (c != 'u') return bad_json(ps, "an unknown escape in a string");
    uint32_t cp, lo;
    if (ps->end - ps->p < 6 || !hex4(ps->p + 2, &cp)) return bad_json(ps, "a \\u escape without 4 hex digits");
    if (cp >= 0xdc00 && cp <= 0xdfff) return bad_json(ps, "a \\u escape is a lone low surrogate");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      /* a high surrogate must be followed by \uDC00..\uDFFF: together one code point */
      if (ps->end - ps->p < 12 || ps->p[6] != '\\' || ps->p[7] != 'u' || !hex4(ps->p + 8, &lo) || lo < 0xdc00 ||
          lo > 0xdfff)
        return bad_json(ps, "a \\u escape is a high surrogate without its low surrogate");
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      ps->p += 6;
    }
    put_utf8(ps, cp);
    ps->p += 6;
  }
  ps->arena[ps->used++] = 0;
  *out = ps->arena + first;
  *out_len = ps->used - first - 1;
  return ATTN_OK;
}

/* A non-negative JSON integer (no sign, fraction, exponent or leading zero). */
static attn_status parse_uint(parser *ps, int64_t *out) {
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == '-') return bad_json(ps, "a negative number (sizes and offsets are >= 0)");
  if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return bad_json(ps, "expected a non-negative integer");
  if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
    return bad_json(ps, "a number with a leading zero");
  int64_t v = 0;
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    int digit = *ps->p - '0';
    if (v > (INT64_MAX - digit) / 10) return bad_json(ps, "an integer too large for 64 bits");
    v = v * 10 + digit;
    ps->p++;
  }
  if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
    return bad_json(ps, "a number that is not an integer");
  *out = v;
  return ATTN_OK;
}

/* An array of non-negative integers into v (at most cap); *n gets the count. */
static attn_status parse_uint_array(parser *ps, int64_t *v, int cap, int *n, const char *too_many) {
  attn_status st = expect(ps, '[', "'['");
  if (st != ATTN_OK) return st;
  *n = 0;
  if (accept(ps, ']')) return ATTN_OK;
  for (;;) {
    int64_t x = 0;
    if ((st = parse_uint(ps, &x)) != ATTN_OK) return st;
    if (*n >= cap) return bad_json(ps, too_many);
    v[(*n)++] = x;
    if (accept(ps, ']')) return ATTN_OK;
    if ((st = expect(ps, ',', "',' or ']' in an array")) != ATTN_OK) return st;
  }
}

static int shown(size_t len) { return len > NAME_SHOWN ? NAME_SHOWN : (int)len; }

/* safetensors' names of the element types read, in attn_elem_type order */
static const char *dtype_names[] = {"F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"};
#define N_DTYPES (int)(sizeof dtype_names / sizeof dtype_names[0])

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} of the tensor `name`. */
static attn_status parse_tensor(parser *ps, const char *name, size_t name_len, attn_st_entry *e) {
  attn_status st = expect(ps, '{', "'{' (a tensor's description)");
  if (st != ATTN_OK) return st;
  int have_dtype = 0, have_shape = 0, have_offsets = 0;
  char dtype[16] = "";
  int nd = shown(name_len);
  if (!accept(ps, '}')) {
    for (;;) {
      const char *key, *val;
      size_t key_len, val_len;
      size_t mark = ps->used;
      if ((st = parse_string(ps, &key, &key_len)) != ATTN_OK) return st;
      if ((st = expect(ps, ':', "':'")) != ATTN_OK) return st;
      if (strcmp(key, "dtype") == 0 && key_len == 5 && !have_dtype) {
        if ((st = parse_string(ps, &val, &val_len)) != ATTN_OK) return st;
        snprintf(dtype, sizeof dtype, "%.*s", (int)(val_len < 15 ? val_len : 15), val);
        if (val_len > 15) strcpy(dtype + 12, "...");
        have_dtype = 1;
      } else if (strcmp(key, "shape") == 0 && key_len == 5 && !have_shape) {
        if ((st = parse_uint_array(ps, e->size, ATTN_MAX_DIMS, &e->ndim, "a shape of more than 8 dims (attn "
                                   "supports at most 8)")) != ATTN_OK)
          return st;
        have_shape = 1;
      } else if (strcmp(key, "data_offsets") == 0 && key_len == 12 && !have_offsets) {
        int64_t off[2];
        int n;
        if ((st = parse_uint_array(ps, off, 2, &n, "data_offsets has more than 2 numbers")) != ATTN_OK) return st;
        if (n != 2) return bad_json(ps, "data_offsets does not hold 2 numbers [begin, end]");
        e->begin = off[0];
        e->end = off[1];
        have_offsets = 1;
      } else {
        char msg[128];
        snprintf(msg, sizeof msg, "tensor '%.*s' has an unexpected or repeated key \"%.40s\"", nd, name, key);
        return bad_json(ps, msg);
      }
      ps->used = mark; /* keys and the dtype need not stay in the arena */
      if (accept(ps, '}')) break;
      if ((st = expect(ps, ',', "',' or '}' in a tensor's description")) != ATTN_OK) return st;
    }
  }
  if (!have_dtype || !have_shape || !have_offsets)
    return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has no \"%s\" in the header", ps->path, nd, name,
                     !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");

  int known = -1;
  for (int i = 0; i < N_DTYPES; i++)
    if (strcmp(dtype, dtype_names[i]) == 0) known = i;
  if (known < 0) {
    static const char *other[] = {"U64", "U32", "U16", "F8_E4M3", "F8_E5M2", NULL};
    for (int i = 0; other[i]; i++)
      if (strcmp(dtype, other[i]) == 0)
        return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has dtype %s (expected F32; F64, F16, BF16, I64, I32, "
                         "I16, I8, U8 and BOOL are converted, other dtypes are not supported)", ps->path, nd,
                         name, dtype);
    return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has an unknown dtype \"%s\" (expected F32, F64, F16, BF16, "
                     "I64, I32, I16, I8, U8 or BOOL)", ps->path, nd, name, dtype);
  }
  e->dtype = (attn_elem_type)known;
  char sbuf[200];
  attn_sizes_str(e->ndim, e->size, sbuf, sizeof sbuf);
  int64_t itemsize = attn_elem_size(e->dtype);
  if (attn_numel_checked(e->ndim, e->size, &e->numel) != ATTN_OK || e->numel > INT64_MAX / itemsize)
    return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has shape %s: too many elements", ps->path, nd, name, sbuf);
  if (e->end < e->begin)
    return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has data_offsets [%lld, %lld]: the end is before the begin",
                     ps->path, nd, name, (long long)e->begin, (long long)e->end);
  if (e->end - e->begin != e->numel * itemsize)
    return attn_fail(ATTN_EARG, "%s: tensor '%.*s' has shape %s of %s (%lld bytes) but data_offsets [%lld, %lld] "
                     "span %lld bytes", ps->path, nd, name, sbuf, dtype, (long long)(e->numel * itemsize),
                     (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin));
  if (e->end > ps->data_len)
    return attn_fail(ATTN_EARG, "%s: truncated: tensor '%.*s' needs bytes [%lld, %lld) of the data but the file "
                     "holds %lld bytes of data", ps->path, nd, name, (long long)e->begin, (long long)e->end,
                     (long long)ps->data_len);
  e->name = name;
  e->name_len = name_len;
  e->out = NULL;
  return ATTN_OK;
}

/* "__metadata__": {"key": "value", ...} */
static attn_status parse_metadata(parser *ps) {
  attn_status st = expect(ps, '{', "'{' (the __metadata__ object)");
  if (st != ATTN_OK) return st;
  if (accept(ps, '}')) return ATTN_OK;
  for (;;) {
    const char *key, *val;
    size_t key_len, val_len;
    if ((st = parse_string(ps, &key, &key_len)) != ATTN_OK) return st;
    if ((st = expect(ps, ':', "':'")) != ATTN_OK) return st;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p != '"') {
      char msg[128];
      snprintf(msg, sizeof msg, "__metadata__ value of \"%.40s\" is not a string", key);
      return bad_json(ps, msg);
    }
    if ((st = parse_string(ps, &val, &val_len)) != ATTN_OK) return st;
    if (ps->h->meta) ps->h->meta[ps->h->n_meta] = (attn_st_meta){key, val, key_len, val_len};
    ps->h->n_meta++;
    if (accept(ps, '}')) return ATTN_OK;
    if ((st = expect(ps, ',', "',' or '}' in __metadata__")) != ATTN_OK) return st;
  }
}

static int bytes_cmp(const char *a, size_t na, const char *b, size_t nb) {
  int c = memcmp(a, b, na < nb ? na : nb);
  return c ? c : (na > nb) - (na < nb);
}

static int by_name(const void *x, const void *y) {
  const attn_st_entry *a = x, *b = y;
  return bytes_cmp(a->name, a->name_len, b->name, b->name_len);
}

static int by_key(const void *x, const void *y) {
  const attn_st_meta *a = x, *b = y;
  return bytes_cmp(a->key, a->key_len, b->key, b->key_len);
}

static int by_offset(const void *x, const void *y) {
  const attn_st_entry *a = x, *b = y;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  return (a->end > b->end) - (a->end < b->end);
}

/* What needs every entry: unique names, and offsets that tile the data section. */
static attn_status check_layout(const parser *ps) {
  attn_st_header *h = ps->h;
  qsort(h->entries, (size_t)h->n_entries, sizeof *h->entries, by_name);
  for (int64_t i = 1; i < h->n_entries; i++)
    if (by_name(&h->entries[i - 1], &h->entries[i]) == 0)
      return attn_fail(ATTN_EARG, "%s: the tensor name '%.*s' appears twice in the header", ps->path,
                       shown(h->entries[i].name_len), h->entries[i].name);
  qsort(h->meta, (size_t)h->n_meta, sizeof *h->meta, by_key);
  for (int64_t i = 1; i < h->n_meta; i++)
    if (by_key(&h->meta[i - 1], &h->meta[i]) == 0)
      return attn_fail(ATTN_EARG, "%s: the __metadata__ key \"%.*s\" appears twice in the header", ps->path,
                       shown(h->meta[i].key_len), h->meta[i].key);
  qsort(h->entries, (size_t)h->n_entries, sizeof *h->entries, by_offset);
  int64_t covered = 0;
  for (int64_t i = 0; i < h->n_entries; i++) {
    const attn_st_entry *e = &h->entries[i];
    if (e->begin < covered) {
      const attn_st_entry *prev = &h->entries[i - 1];
      return attn_fail(ATTN_EARG, "%s: the data of tensors '%.*s' [%lld, %lld) and '%.*s' [%lld, %lld) overlap",
                       ps->path, shown(prev->name_len), prev->name, (long long)prev->begin, (long long)prev->end,
                       shown(e->name_len), e->name, (long long)e->begin, (long long)e->end);
    }
    if (e->begin > covered)
      return attn_fail(ATTN_EARG, "%s: bytes [%lld, %lld) of the data belong to no tensor (a gap before '%.*s')",
                       ps->path, (long long)covered, (long long)e->begin, shown(e->name_len), e->name);
    covered = e->end;
  }
  if (covered != ps->data_len)
    return attn_fail(ATTN_EARG, "%s: the tensors cover %lld bytes of data but the file holds %lld after the header",
                     ps->path, (long long)covered, (long long)ps->data_len);
  return ATTN_OK;
}

attn_status attn_st_parse(const char *path, const unsigned char *buf, size_t len, int64_t data_len,
                          attn_st_header *h) {
  parser ps = {path, buf, buf, buf + len, h->arena, 0, h, data_len};
  h->n_entries = 0;
  h->n_meta = 0;
  int have_meta = 0;
  attn_status st;
  skip_ws(&ps);
  if (ps.p >= ps.end || *ps.p != '{') return bad_json(&ps, "the header is not a JSON object (no '{')");
  ps.p++;
  if (!accept(&ps, '}')) {
    for (;;) {
      const char *name;
      size_t name_len;
      if ((st = parse_string(&ps, &name, &name_len)) != ATTN_OK) return st;
      if ((st = expect(&ps, ':', "':'")) != ATTN_OK) return st;
      if (name_len == 12 && memcmp(name, "__metadata__", 12) == 0) {
        if (have_meta) return bad_json(&ps, "__metadata__ appears twice");
        have_meta = 1;
        if ((st = parse_metadata(&ps)) != ATTN_OK) return st;
      } else {
        attn_st_entry scratch;
        attn_st_entry *e = h->entries ? &h->entries[h->n_entries] : &scratch;
        memset(e, 0, sizeof *e);
        if ((st = parse_tensor(&ps, name, name_len, e)) != ATTN_OK) return st;
        h->n_entries++;
      }
      if (accept(&ps, '}')) break;
      if ((st = expect(&ps, ',', "',' or '}' after a tensor")) != ATTN_OK) return st;
    }
  }
  skip_ws(&ps);
  if (ps.p != ps.end) return bad_json(&ps, "text after the JSON object");
  if (h->entries) return check_layout(&ps);
  return ATTN_OK;
}

/* ---- data --------------------------------------------------------------- */

static attn_status data_ends_early(const char *path) {
  return attn_fail(ATTN_EARG, "%s: truncated: the data ends early (the file shrank while it was read)", path);
}

attn_status attn_st_read_data(const char *path, int fd, uint64_t header_len, const attn_st_entry *entries,
                              int64_t n) {
  int64_t base = 8 + (int64_t)header_len;
  int le = attn_host_is_little_endian();
  unsigned char raw[CHUNK * 8];
  for (int64_t i = 0; i < n; i++) {
    const attn_st_entry *e = &entries[i];
    if (e->numel == 0) continue;
    if (e->dtype == ATTN_ELEM_F32 && le) {
      size_t bytes = (size_t)e->numel * 4;
      int64_t got = attn_read_at(fd, e->out, bytes, base + e->begin);
      if (got < 0) return file_error(path, "read");
      if ((size_t)got < bytes) return data_ends_early(path);
      continue;
    }
    size_t item = (size_t)attn_elem_size(e->dtype);
    int64_t off = base + e->begin;
    for (int64_t done = 0; done < e->numel;) {
      size_t k = (size_t)(e->numel - done < CHUNK ? e->numel - done : CHUNK);
      int64_t got = attn_read_at(fd, raw, item * k, off);
      if (got < 0) return file_error(path, "read");
      if ((size_t)got < item * k) return data_ends_early(path);
      int64_t bad_value, bad = attn_elem_to_f32(e->dtype, raw, (int64_t)k, e->out + done, &bad_value);
      if (bad >= 0) {
        char at[200];
        return attn_fail(ATTN_EARG, "%s: tensor '%.*s' holds the %s value %lld at element %s, which float32 cannot "
                         "hold exactly (integers load only while |x| <= 2^24 = 16777216)", path,
                         shown(e->name_len), e->name, dtype_names[e->dtype], (long long)bad_value,
                         attn_elem_index_str(e->ndim, e->size, done + bad, at, sizeof at));
      }
      done += (int64_t)k;
      off += (int64_t)(item * k);
    }
  }
  return ATTN_OK;
}

/* ---- writing ------------------------------------------------------------ */

/* A growing byte buffer for the header (the core's own memory, freed before
 * attn_st_write returns). */
typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* A JSON string: quotes, backslashes and control bytes escaped, UTF-8 as is. */
static void put_json_string(sbuf *b, const char *s, size_t n) {
  put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      put(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      put(b, esc, 6);
    } else {
      put(b, (const char *)&s[i], 1);
    }
  }
  put(b, "\"", 1);
}

static int valid_utf8(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    int k = utf8_len(p, end);
    if (!k) return 0;
    p += k;
  }
  return 1;
}

static attn_status check_utf8(const char *path, const char *what, const char *s, size_t n) {
  if (valid_utf8(s, n)) return ATTN_OK;
  return attn_fail(ATTN_EARG, "%s: %s '%.*s' is not valid UTF-8 (JSON strings must be)", path, what, shown(n), s);
}

attn_status attn_st_write(const char *path, const attn_st_item *items, int64_t n, const attn_st_meta *meta,
                          int64_t n_meta) {
  attn_status st;
  for (int64_t i = 0; i < n; i++)
    if ((st = check_utf8(path, "the tensor name", items[i].name, items[i].name_len)) != ATTN_OK) return st;
  for (int64_t i = 0; i < n_meta; i++) {
    if ((st = check_utf8(path, "the metadata key", meta[i].key, meta[i].key_len)) != ATTN_OK) return st;
    if ((st = check_utf8(path, "the metadata value", meta[i].value, meta[i].value_len)) != ATTN_OK) return st;
  }
  /* the JSON as the reference writer makes it: compact, __metadata__ first,
   * padded with spaces so that the data starts at a multiple of 8 bytes */
  sbuf b = {0};
  char num[64];
  puts_(&b, "{");
  if (n_meta > 0) {
    puts_(&b, "\"__metadata__\":{");
    for (int64_t i = 0; i < n_meta; i++) {
      if (i) puts_(&b, ",");
      put_json_string(&b, meta[i].key, meta[i].key_len);
      puts_(&b, ":");
      put_json_string(&b, meta[i].value, meta[i].value_len);
    }
    puts_(&b, "}");
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < n; i++) {
    const attn_tensor *t = items[i].t;
    if (i || n_meta > 0) puts_(&b, ",");
    put_json_string(&b, items[i].name, items[i].name_len);
    puts_(&b, t->is_bool ? ":{\"dtype\":\"BOOL\",\"shape\":[" : ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->size[d]);
      puts_(&b, num);
    }
    int64_t bytes = attn_numel(t) * (t->is_bool ? 1 : 4);
    snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)offset, (long long)(offset + bytes));
    puts_(&b, num);
    offset += bytes;
  }
  puts_(&b, "}");
  while (!b.oom && b.n % 8) put(&b, " ", 1);
  if (b.oom) {
    free(b.p);
    return attn_fail(ATTN_ENOMEM, "%s: cannot allocate the header (out of memory)", path);
  }
  if (b.n > ATTN_ST_MAX_HEADER) {
    free(b.p);
    return attn_fail(ATTN_EARG, "%s: the header would take %llu bytes, more than safetensors allows (%d)", path,
                     (unsigned long long)b.n, ATTN_ST_MAX_HEADER);
  }

  attn_out_file of;
  if (!attn_out_open(path, &of)) {
    st = attn_fail(ATTN_EARG, "%s: cannot open the file for writing: %s", path, strerror(errno));
    free(b.p);
    return st;
  }
  FILE *f = of.f;
  unsigned char pre[8];
  for (int j = 0; j < 8; j++) pre[j] = (unsigned char)((uint64_t)b.n >> (8 * j));
  int ok = fwrite(pre, 1, 8, f) == 8 && fwrite(b.p, 1, b.n, f) == b.n;
  free(b.p);
  for (int64_t i = 0; i < n && ok; i++) ok = attn_write_elements(f, items[i].t);
  if (!attn_out_finish(&of, ok)) return file_error(path, "write");
  return ATTN_OK;
}
