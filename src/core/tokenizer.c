/* GPT-2's byte-level BPE tokenizer: see tokenizer.h. */
#include "tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "unicode_tables.h"

/* One token's bytes: offset into the tokenizer's blob and length. */
typedef struct tok_span { uint32_t off, len; } tok_span;

/* A merge: the pair (a, b) of ids, its rank (line of vocab.bpe) and the id of a + b. */
typedef struct tok_merge { int32_t a, b, rank, merged; } tok_merge;

struct attn_tokenizer {
  int32_t n_vocab, eot;
  char *blob;          /* every token's bytes, back to back */
  tok_span *spans;     /* [n_vocab] */
  int32_t byte_id[256];
  tok_merge *merges;   /* open-addressed table keyed by (a, b); a < 0 marks an empty slot */
  uint32_t merge_mask; /* slots - 1 */
  /* every merge's parts are made only by lower-ranked merges (GPT-2's are):
   * then a merge never makes a pair ranked below its own, and long pieces can
   * take the heap path (bpe_merge_heap) with the same result */
  int ranks_ordered;
};

/* ---- bytes_to_unicode: GPT-2's printable stand-ins for the 256 bytes ---- */

/* byte_of_cp[cp] for cp < 324: the byte that code point stands for, or -1 */
static void byte_decoder_table(int byte_of_cp[324]) {
  for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) byte_of_cp[b] = b;
    else byte_of_cp[256 + n++] = b;
  }
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s (n bytes left) and its code point, or 0 if invalid. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned c = s[0];
  if (c < 0x80) { *cp = c; return 1; }
  int len;
  uint32_t v, min;
  if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
  else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
  else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
  else return 0;
  if ((size_t)len > n) return 0;
  for (int k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[k] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

attn_status attn_utf8_check(const char *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < len) {
    if (s[i] < 0x80) { i++; continue; }
    uint32_t cp;
    int l = utf8_decode(s + i, len - i, &cp);
    if (!l) return attn_fail(ATTN_EARG, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", i, s[i]);
    i += (size_t)l;
  }
  return ATTN_OK;
}

/* ---- character classes of the pattern ---- */

enum { CLS_LETTER, CLS_NUMBER, CLS_SPACE, CLS_OTHER };

static int in_ranges(const attn_uni_range *r, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid].lo) hi = mid;
    else if (cp > r[mid].hi) lo = mid + 1;
    else return 1;
  }
  return 0;
}

#define NRANGES(t) (sizeof(t) / sizeof((t)[0]))

static int cp_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CLS_LETTER;
    if (cp >= '0' && cp <= '9') return CLS_NUMBER;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CLS_SPACE;
    return CLS_OTHER;
  }
  if (in_ranges(attn_uni_letter, NRANGES(attn_uni_letter), cp)) return CLS_LETTER;
  if (in_ranges(attn_uni_number, NRANGES(attn_uni_number), cp)) return CLS_NUMBER;
  if (in_ranges(attn_uni_space, NRANGES(attn_uni_space), cp)) return CLS_SPACE;
  return CLS_OTHER;
}

/* Class of the (valid) code point at s[i], and its byte length in *l. */
static int class_at(const unsigned char *s, size_t n, size_t i, int *l) {
  if (s[i] < 0x80) { *l = 1; return cp_class(s[i]); }
  uint32_t cp = 0;
  *l = utf8_decode(s + i, n - i, &cp);
  return cp_class(cp);
}

/* Byte length of the pattern's match at s[i] (i < n; s valid UTF-8). The
 * alternatives are tried in the pattern's order. */
static size_t match_piece(const unsigned char *s, size_t n, size_t i) {
  /* 's|'t|'re|'ve|'m|'ll|'d (ASCII, case-sensitive) */
  if (s[i] == '\'' && i + 1 < n) {
    unsigned char a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < n) {
      unsigned char b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  int l;
  int cls = class_at(s, n, i, &l);
  size_t j = i;
  /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class */
  if (s[i] == ' ' && i + 1 < n) {
    int l2;
    int next = class_at(s, n, i + 1, &l2);
    if (next != CLS_SPACE) { cls = next; j = i + 1; l = l2; }
  }
  if (cls != CLS_SPACE) {
    j += (size_t)l;
    while (j < n) {
      int c = class_at(s, n, j, &l);
      if (c != cls) break;
      j += (size_t)l;
    }
    return j - i;
  }
  /* '\s+(?!\S)': the whitespace run, less its last character when a
   * non-space follows (that character starts the next piece); '\s+' when
   * the run is that one character. */
  size_t last = i;
  int count = 0;
  while (j < n) {
    int c = class_at(s, n, j, &l);
    if (c != CLS_SPACE) break;
    last = j;
    j += (size_t)l;
    count++;
  }
  if (j == n || count == 1) return j - i;
  return last - i;
}

/* ---- the merge table ---- */

static uint32_t pair_hash(int32_t a, int32_t b) {
  uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  k *= 0x9E3779B97F4A7C15ull;
  return (uint32_t)(k >> 32);
}

static const tok_merge *merge_find(const attn_tokenizer *tok, int32_t a, int32_t b) {
  uint32_t h = pair_hash(a, b) & tok->merge_mask;
  for (;;) {
    const tok_merge *m = &tok->merges[h];
    if (m->a < 0) return NULL;
    if (m->a == a && m->b == b) return m;
    h = (h + 1) & tok->merge_mask;
  }
}

/* Merge the piece's byte ids in place (w[0..n)): the lowest-ranked adjacent
 * pair, every non-overlapping occurrence left to right, until no adjacent
 * pair is a merge, as encoder.py's bpe(). Returns the new count. */
static size_t bpe_merge(const attn_tokenizer *tok, int32_t *w, size_t n) {
  while (n > 1) {
    const tok_merge *best = NULL;
    for (size_t k = 0; k + 1 < n; k++) {
      const tok_merge *m = merge_find(tok, w[k], w[k + 1]);
      if (m && (!best || m->rank < best->rank)) best = m;
    }
    if (!best) break;
    size_t o = 0;
    for (size_t k = 0; k < n;) {
      if (k + 1 < n && w[k] == best->a && w[k + 1] == best->b) {
        w[o++] = best->merged;
        k += 2;
      } else {
        w[o++] = w[k++];
      }
    }
    n = o;
  }
  return n;
}

/* Pieces longer than this take bpe_merge_heap when the ranks allow it. */
#define BPE_HEAP_MIN 64

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h[p] <= v) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
  return top;
}

/* bpe_merge in O(n log n): the adjacent pairs in a heap keyed by (rank,
 * position), the piece a linked list. Popping every occurrence of the lowest
 * rank in position order is bpe_merge's left-to-right pass, since (with
 * ranks_ordered) no merge makes a pair ranked at or below its own. Entries
 * whose pair has changed since they were pushed are skipped when popped.
 * Returns the new count, or (size_t)-1 without memory. */
static size_t bpe_merge_heap(const attn_tokenizer *tok, int32_t *w, size_t n) {
  int32_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
  /* n - 1 pairs at first; each merge pops one and pushes at most two, and there are fewer than n merges */
  uint64_t *heap = malloc(2 * n * sizeof *heap);
  if (!next || !prev || !heap) {
    free(next); free(prev); free(heap);
    return (size_t)-1;
  }
  size_t hn = 0;
  for (size_t k = 0; k < n; k++) {
    next[k] = k + 1 < n ? (int32_t)(k + 1) : -1;
    prev[k] = (int32_t)k - 1;
    if (k + 1 < n) {
      const tok_merge *m = merge_find(tok, w[k], w[k + 1]);
      if (m) heap_push(heap, &hn, ((uint64_t)(uint32_t)m->rank << 32) | k);
    }
  }
  while (hn > 0) {
    uint64_t e = heap_pop(heap, &hn);
    int32_t rank = (int32_t)(e >> 32), k = (int32_t)(uint32_t)e;
    if (w[k] < 0 || next[k] < 0) continue; /* merged away, or now last */
    int32_t r = next[k];
    const tok_merge *m = merge_find(tok, w[k], w[r]);
    if (!m || m->rank != rank) continue; /* the pair here has changed */
    w[k] = m->merged;
    w[r] = -1;
    next[k] = next[r];
    if (next[r] >= 0) prev[next[r]] = k;
    if (prev[k] >= 0) {
      const tok_merge *ml = merge_find(tok, w[prev[k]], w[k]);
      if (ml) heap_push(heap, &hn, ((uint64_t)(uint32_t)ml->rank << 32) | (uint32_t)prev[k]);
    }
    if (next[k] >= 0) {
      const tok_merge *mr = merge_find(tok, w[k], w[next[k]]);
      if (mr) heap_push(heap, &hn, ((uint64_t)(uint32_t)mr->rank << 32) | (uint32_t)k);
    }
  }
  size_t o = 0;
  for (int32_t k = 0; k >= 0; k = next[k]) w[o++] = w[k];
  free(next);
  free(prev);
  free(heap);
  return o;
}

/* ---- encode ---- */

int64_t attn_tokenizer_find_special(const char *text, size_t len) {
  const size_t sl = sizeof(ATTN_TOKENIZER_EOT_TEXT) - 1;
  for (size_t i = 0; i + sl <= len; i++) {
    const char *p = memchr(text + i, '<', len - i);
    if (!p) return -1;
    i = (size_t)(p - text);
    if (i + sl > len) return -1;
    if (memcmp(p, ATTN_TOKENIZER_EOT_TEXT, sl) == 0) return (int64_t)i;
  }
  return -1;
}

/* Encode text without specials into ids (room for len): the count, or
 * (size_t)-1 without memory. */
static size_t encode_ordinary(const attn_tokenizer *tok, const unsigned char *s, size_t len, int32_t *ids) {
  size_t out = 0;
  size_t i = 0;
  while (i < len) {
    size_t pl = match_piece(s, len, i);
    /* the piece's ids are merged in place in the output, which has room for every byte */
    int32_t *w = ids + out;
    for (size_t k = 0; k < pl; k++) w[k] = tok->byte_id[s[i + k]];
    size_t got = pl > BPE_HEAP_MIN && tok->ranks_ordered && pl < INT32_MAX ? bpe_merge_heap(tok, w, pl)
                                                                            : bpe_merge(tok, w, pl);
    if (got == (size_t)-1) return got;
    out += got;
    i += pl;
  }
  return out;
}

attn_status attn_tokenizer_encode(attn_tokenizer *tok, const char *text, size_t len, int allow_eot,
                                  int32_t *ids, size_t *n_ids) {
  attn_status st = attn_utf8_check(text, len);
  if (st != ATTN_OK) return st;
  const unsigned char *s = (const unsigned char *)text;
  size_t out = 0, i = 0;
  const size_t sl = sizeof(ATTN_TOKENIZER_EOT_TEXT) - 1;
  while (i < len) {
    size_t end = len;
    if (allow_eot && tok->eot >= 0) {
      int64_t at = attn_tokenizer_find_special(text + i, len - i);
      if (at >= 0) end = i + (size_t)at;
    }
    size_t got = encode_ordinary(tok, s + i, end - i, ids + out);
    if (got == (size_t)-1) return attn_fail(ATTN_ENOMEM, "no memory to merge a piece of %zu bytes", end - i);
    out += got;
    i = end;
    if (i < len) { /* at an allowed <|endoftext|> */
      ids[out++] = tok->eot;
      i += sl;
    }
  }
  *n_ids = out;
  return ATTN_OK;
}

const char *attn_tokenizer_token(const attn_tokenizer *tok, int32_t id, size_t *len) {
  *len = tok->spans[id].len;
  return tok->blob + tok->spans[id].off;
}

int32_t attn_tokenizer_n_vocab(const attn_tokenizer *tok) { return tok->n_vocab; }
int32_t attn_tokenizer_eot(const attn_tokenizer *tok) { return tok->eot; }

/* ---- loading ---- */

static attn_status read_whole(const char *path, char **buf, size_t *len) {
  int64_t size;
  attn_file_problem problem;
  int fd = attn_open_regular(path, &size, &problem);
  if (fd < 0) {
    if (problem == ATTN_FILE_IS_DIRECTORY) return attn_fail(ATTN_EARG, "%s: is a directory", path);
    if (problem == ATTN_FILE_NOT_REGULAR) return attn_fail(ATTN_EARG, "%s: not a regular file", path);
    return attn_fail(ATTN_EARG, "cannot open %s: %s", path, strerror(errno));
  }
  char *b = malloc((size_t)size + 1);
  if (!b) { close(fd); return attn_fail(ATTN_ENOMEM, "%s: no memory for %lld bytes", path, (long long)size); }
  int64_t got = attn_read_at(fd, b, (size_t)size, 0);
  int err = errno;
  close(fd);
  if (got != size) {
    free(b);
    return attn_fail(ATTN_EARG, "cannot read %s: %s", path, got < 0 ? strerror(err) : "file shrank while read");
  }
  b[size] = 0;
  *buf = b;
  *len = (size_t)size;
  return ATTN_OK;
}

/* A bytes -> id table used while loading (open addressing over the spans). */
typedef struct str_table { int32_t *slot; uint32_t mask; } str_table;

static uint32_t str_hash(const char *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
  return h;
}

/* The id whose bytes are p[0..n), or -1; *where gets the slot for an insert. */
static int32_t str_find(const str_table *t, const attn_tokenizer *tok, const char *p, size_t n, uint32_t *where) {
  uint32_t h = str_hash(p, n) & t->mask;
  for (;;) {
    int32_t id = t->slot[h];
    if (id < 0) { if (where) *where = h; return -1; }
    if (tok->spans[id].len == n && memcmp(tok->blob + tok->spans[id].off, p, n) == 0) return id;
    h = (h + 1) & t->mask;
  }
}

/* Decode one JSON string at s[*i] (the opening quote) as byte-level text:
 * each code point is one byte by bytes_to_unicode, unless raw (the special
 * token's text is kept as UTF-8). Appends to out; *i past the closing quote.
 * Returns 0, or -1 with *why set. */
static int json_token(const char *s, size_t len, size_t *i, const int byte_of_cp[324], char *out, size_t *out_len,
                      size_t cap, const char **why) {
  size_t k = *i + 1, o = 0;
  for (;;) {
    if (k >= len) { *why = "unterminated string"; return -1; }
    unsigned char c = (unsigned char)s[k];
    if (c == '"') break;
    uint32_t cp;
    if (c == '\\') {
      if (k + 1 >= len) { *why = "unterminated string"; return -1; }
      char e = s[k + 1];
      k += 2;
      switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
          if (k + 4 > len) { *why = "bad \\u escape"; return -1; }
          cp = 0;
          for (int d = 0; d < 4; d++) {
            char h = s[k + (size_t)d];
            int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0) { *why = "bad \\u escape"; return -1; }
            cp = cp * 16 + (uint32_t)v;
          }
          k += 4;
          break;
        }
        default: *why = "bad escape"; return -1;
      }
    } else {
      int l = utf8_decode((const unsigned char *)s + k, len - k, &cp);
      if (!l) { *why = "invalid UTF-8"; return -1; }
      k += (size_t)l;
    }
    if (cp >= 324 || byte_of_cp[cp] < 0) { *why = "a character outside GPT-2's byte alphabet"; return -1; }
    if (o >= cap) { *why = "token too long"; return -1; }
    out[o++] = (char)byte_of_cp[cp];
  }
  *i = k + 1;
  *out_len = o;
  return 0;
}

static size_t skip_ws(const char *s, size_t len, size_t i) {
  while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
  return i;
}

/* Parse encoder.json into tok (spans, blob, n_vocab, eot, byte ids). */
static attn_status load_encoder(attn_tokenizer *tok, const char *path, const char *s, size_t len,
                                const int byte_of_cp[324]) {
  /* first pass: count entries (every token is at most its JSON text long) */
  tok->blob = malloc(len + 1);
  if (!tok->blob) return attn_fail(ATTN_ENOMEM, "%s: no memory", path);
  size_t cap_entries = 1024, n = 0, blob_len = 0;
  int32_t *id_of = malloc(cap_entries * sizeof *id_of);      /* entry -> id */
  tok_span *entry = malloc(cap_entries * sizeof *entry);     /* entry -> bytes */
  const char *why = NULL;
  size_t i = skip_ws(s, len, 0);
  if (!id_of || !entry) goto nomem;
  if (i >= len || s[i] != '{') { why = "expected '{'"; goto bad; }
  i = skip_ws(s, len, i + 1);
  if (i < len && s[i] == '}') { why = "no tokens"; goto bad; }
  for (;;) {
    if (i >= len || s[i] != '"') { why = "expected a string"; goto bad; }
    size_t tl;
    if (json_token(s, len, &i, byte_of_cp, tok->blob + blob_len, &tl, len - blob_len, &why)) goto bad;
    i = skip_ws(s, len, i);
    if (i >= len || s[i] != ':') { why = "expected ':'"; goto bad; }
    i = skip_ws(s, len, i + 1);
    long long v = 0;
    size_t d0 = i;
    while (i < len && s[i] >= '0' && s[i] <= '9' && v < 100000000) v = v * 10 + (s[i++] - '0');
    if (i == d0 || v >= 100000000) { why = "expected an id (a non-negative integer)"; goto bad; }
    if (n == cap_entries) {
      cap_entries *= 2;
      int32_t *a = realloc(id_of, cap_entries * sizeof *id_of);
      if (a) id_of = a;
      tok_span *b = realloc(entry, cap_entries * sizeof *entry);
      if (b) entry = b;
      if (!a || !b) goto nomem;
    }
    id_of[n] = (int32_t)v;
    entry[n].off = (uint32_t)blob_len;
    entry[n].len = (uint32_t)tl;
    n++;
    blob_len += tl;
    i = skip_ws(s, len, i);
    if (i < len && s[i] == ',') { i = skip_ws(s, len, i + 1); continue; }
    if (i < len && s[i] == '}') break;
    why = "expected ',' or '}'";
    goto bad;
  }
  if (skip_ws(s, len, i + 1) != len) { why = "text after the object"; goto bad; }
  if (n > 0x7FFFFFF) { why = "too many tokens"; goto bad; }
  tok->n_vocab = (int32_t)n;
  tok->spans = malloc(n * sizeof *tok->spans);
  if (!tok->spans) goto nomem;
  for (size_t e = 0; e < n; e++) tok->spans[e].len = UINT32_MAX;
  for (size_t e = 0; e < n; e++) {
    int32_t id = id_of[e];
    if ((size_t)id >= n || tok->spans[id].len != UINT32_MAX) {
      free(id_of); free(entry);
      return attn_fail(ATTN_EARG, "%s: the ids are not 0..%zu, each once (id %d)", path, n - 1, (int)id);
    }
    tok->spans[id] = entry[e];
  }
  free(id_of);
  free(entry);
  return ATTN_OK;
nomem:
  free(id_of);
  free(entry);
  return attn_fail(ATTN_ENOMEM, "%s: no memory", path);
bad:
  free(id_of);
  free(entry);
  return attn_fail(ATTN_EARG, "%s: not a GPT-2 encoder.json: %s at byte offset %zu", path, why, i);
}

/* One space-separated token of a vocab.bpe line (UTF-8 in GPT-2's byte
 * alphabet) into bytes; 0, or -1 when a character is outside the alphabet. */
static int bpe_part(const char *p, size_t n, const int byte_of_cp[324], char *out, size_t *out_len) {
  size_t k = 0, o = 0;
  while (k < n) {
    uint32_t cp;
    int l = utf8_decode((const unsigned char *)p + k, n - k, &cp);
    if (!l || cp >= 324 || byte_of_cp[cp] < 0) return -1;
    out[o++] = (char)byte_of_cp[cp];
    k += (size_t)l;
  }
  *out_len = o;
  return 0;
}

/* Parse vocab.bpe into the merge table; every pair and its concatenation must be tokens. */
static attn_status load_merges(attn_tokenizer *tok, const char *path, const char *s, size_t len,
                               const int byte_of_cp[324]) {
  uint32_t slots = 1u << 10;
  size_t n_lines = 0;
  for (size_t i = 0; i < len; i++) n_lines += s[i] == '\n';
  while (slots < 2 * n_lines + 2) slots *= 2;
  str_table t = {NULL, 0};
  uint32_t tslots = 1u << 10;
  while (tslots < 2 * (uint32_t)tok->n_vocab + 2) tslots *= 2;
  t.slot = malloc(tslots * sizeof *t.slot);
  t.mask = tslots - 1;
  tok->merges = malloc(slots * sizeof *tok->merges);
  tok->merge_mask = slots - 1;
  char *tmp = malloc(len + 1);
  if (!t.slot || !tok->merges || !tmp) {
    free(t.slot); free(tmp);
    return attn_fail(ATTN_ENOMEM, "%s: no memory", path);
  }
  for (uint32_t k = 0; k < tslots; k++) t.slot[k] = -1;
  for (uint32_t k = 0; k < slots; k++) tok->merges[k].a = -1;
  for (int32_t id = 0; id < tok->n_vocab; id++) {
    uint32_t where;
    const tok_span *sp = &tok->spans[id];
    if (str_find(&t, tok, tok->blob + sp->off, sp->len, &where) < 0) t.slot[where] = id;
  }
  /* encoder.py: the lines between the first ("#version: ...") and the last (empty after the final newline) */
  size_t i = 0, line_no = 1;
  const char *why = NULL;
  while (i < len && s[i] != '\n') i++;
  i++;
  int32_t rank = 0;
  int repeated = 0;
  while (i < len) {
    size_t e = i;
    while (e < len && s[e] != '\n') e++;
    line_no++;
    if (e == len) break; /* the last piece (normally empty) is not a merge, as in encoder.py */
    const char *sp = memchr(s + i, ' ', e - i);
    if (!sp) { why = "expected two tokens separated by a space"; goto bad; }
    size_t la, lb;
    if (bpe_part(s + i, (size_t)(sp - (s + i)), byte_of_cp, tmp, &la) ||
        bpe_part(sp + 1, (size_t)(s + e - (sp + 1)), byte_of_cp, tmp + la, &lb)) {
      why = "a character outside GPT-2's byte alphabet (or two spaces)"; goto bad;
    }
    int32_t a = str_find(&t, tok, tmp, la, NULL);
    int32_t b = str_find(&t, tok, tmp + la, lb, NULL);
    int32_t m = str_find(&t, tok, tmp, la + lb, NULL);
    if (a < 0 || b < 0 || m < 0 || la == 0 || lb == 0) { why = "a merge whose parts or result is not in the encoder"; goto bad; }
    /* as dict(zip(merges, ranks)): a repeated pair keeps its last rank */
    uint32_t h = pair_hash(a, b) & tok->merge_mask;
    while (tok->merges[h].a >= 0 && !(tok->merges[h].a == a && tok->merges[h].b == b)) h = (h + 1) & tok->merge_mask;
    repeated |= tok->merges[h].a >= 0;
    tok->merges[h] = (tok_merge){a, b, rank++, m};
    i = e + 1;
  }
  /* ranks_ordered: the highest rank that makes each token, below every rank that uses it */
  int32_t *made_at = malloc((size_t)tok->n_vocab * sizeof *made_at);
  if (!made_at) {
    free(t.slot); free(tmp);
    return attn_fail(ATTN_ENOMEM, "%s: no memory", path);
  }
  for (int32_t id = 0; id < tok->n_vocab; id++) made_at[id] = -1;
  for (uint32_t k = 0; k <= tok->merge_mask; k++) {
    const tok_merge *mg = &tok->merges[k];
    if (mg->a >= 0 && mg->rank > made_at[mg->merged]) made_at[mg->merged] = mg->rank;
  }
  tok->ranks_ordered = !repeated;
  for (uint32_t k = 0; k <= tok->merge_mask; k++) {
    const tok_merge *mg = &tok->merges[k];
    if (mg->a >= 0 && (made_at[mg->a] >= mg->rank || made_at[mg->b] >= mg->rank)) tok->ranks_ordered = 0;
  }
  free(made_at);
  for (int c = 0; c < 256; c++) {
    char ch = (char)c;
    tok->byte_id[c] = str_find(&t, tok, &ch, 1, NULL);
    if (tok->byte_id[c] < 0) {
      free(t.slot); free(tmp);
      return attn_fail(ATTN_EARG, "the encoder has no token for byte 0x%02X", c);
    }
  }
  tok->eot = str_find(&t, tok, ATTN_TOKENIZER_EOT_TEXT, sizeof(ATTN_TOKENIZER_EOT_TEXT) - 1, NULL);
  free(t.slot);
  free(tmp);
  return ATTN_OK;
bad:
  free(t.slot);
  free(tmp);
  return attn_fail(ATTN_EARG, "%s: not a GPT-2 vocab.bpe: line %zu: %s", path, line_no, why);
}

void attn_tokenizer_free(attn_tokenizer *tok) {
  if (!tok) return;
  free(tok->blob);
  free(tok->spans);
  free(tok->merges);
  free(tok);
}

attn_status attn_tokenizer_load(const char *encoder_json_path, const char *vocab_bpe_path, attn_tokenizer **out) {
  *out = NULL;
  int byte_of_cp[324];
  byte_decoder_table(byte_of_cp);
  attn_tokenizer *tok = calloc(1, sizeof *tok);
  if (!tok) return attn_fail(ATTN_ENOMEM, "no memory for a tokenizer");
  char *text = NULL;
  size_t len;
  attn_status st = read_whole(encoder_json_path, &text, &len);
  if (st == ATTN_OK) st = load_encoder(tok, encoder_json_path, text, len, byte_of_cp);
  free(text);
  text = NULL;
  if (st == ATTN_OK) st = read_whole(vocab_bpe_path, &text, &len);
  if (st == ATTN_OK) st = load_merges(tok, vocab_bpe_path, text, len, byte_of_cp);
  free(text);
  if (st != ATTN_OK) {
    attn_tokenizer_free(tok);
    return st;
  }
  *out = tok;
  return ATTN_OK;
}
