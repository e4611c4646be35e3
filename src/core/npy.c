/* NumPy .npy reader and writer (see npy.h). The format:
 *   "\x93NUMPY" major minor, header length (uint16 LE for 1.0, uint32 LE for
 *   2.0 and 3.0), then a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *   padded with spaces and a final '\n', then the raw elements. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fileio.h"
#include "npy.h"

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
/* NumPy itself refuses headers over 10000 bytes unless told otherwise; a
 * header of 8 dims is far below this bound. */
#define MAX_HEADER (1 << 20)
#define CHUNK 4096

/* The dtypes read, as NumPy writes their descr (one-byte types with '|'). */
static const struct {
  const char *descr;
  attn_elem_type type;
} DESCRS[] = {{"<f4", ATTN_ELEM_F32}, {"<f8", ATTN_ELEM_F64}, {"<f2", ATTN_ELEM_F16}, {"<i8", ATTN_ELEM_I64},
              {"<i4", ATTN_ELEM_I32}, {"<i2", ATTN_ELEM_I16}, {"|i1", ATTN_ELEM_I8},  {"|u1", ATTN_ELEM_U8},
              {"|b1", ATTN_ELEM_BOOL}};
#define SUPPORTED "'<f4' '<f8' '<f2' '<i8' '<i4' '<i2' '|i1' '|u1' '|b1'"

static attn_status file_error(const char *path, const char *what) {
  return attn_fail(ATTN_EARG, "cannot %s '%s': %s", what, path, strerror(errno));
}

/* ---- header parsing ---------------------------------------------------- */

typedef struct parser {
  const char *path;
  const char *p, *end;
} parser;

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static attn_status bad_header(const parser *ps, const char *what) {
  return attn_fail(ATTN_EARG, "'%s' is not a valid .npy file: %s in its header", ps->path, what);
}

/* A quoted string (no escapes) into out. */
static attn_status parse_string(parser *ps, char *out, size_t cap) {
  if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"')) return bad_header(ps, "a string was expected");
  char q = *ps->p++;
  size_t n = 0;
  while (ps->p < ps->end && *ps->p != q) {
    if (*ps->p == '\\') return bad_header(ps, "an escape in a string");
    /* NumPy's literal_eval refuses a NUL in the header; a control byte
     * would otherwise end the text compared ('<f4\0junk' read as '<f4') */
    if ((unsigned char)*ps->p < 0x20) return bad_header(ps, "a control character in a string");
    if (n + 1 >= cap) return bad_header(ps, "an overlong string");
    out[n++] = *ps->p++;
  }
  if (ps->p >= ps->end) return bad_header(ps, "an unterminated string");
  ps->p++;
  out[n] = 0;
  return ATTN_OK;
}

static int match_word(parser *ps, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, w, n) == 0) {
    ps->p += n;
    return 1;
  }
  return 0;
}

static attn_status parse_shape(parser *ps, attn_npy_info *info) {
  if (ps->p >= ps->end || *ps->p != '(') return bad_header(ps, "'shape' is not a tuple");
  ps->p++;
  int n = 0;
  for (;;) {
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ')') break;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return bad_header(ps, "'shape' holds something other than non-negative integers");
    /* as Python's literal_eval: 0, 00 are zero, but 0002 is a syntax error */
    const char *digits = ps->p;
    while (digits < ps->end && *digits == '0') digits++;
    if (digits > ps->p && digits < ps->end && *digits >= '1' && *digits <= '9')
      return bad_header(ps, "a size with a leading zero in 'shape'");
    int64_t v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
      int digit = *ps->p++ - '0';
      if (v > (INT64_MAX - digit) / 10) return bad_header(ps, "a size in 'shape' overflows");
      v = v * 10 + digit;
    }
    if (ps->p < ps->end && *ps->p == 'L') ps->p++; /* Python 2's long suffix */
    if (n >= ATTN_MAX_DIMS)
      return attn_fail(ATTN_EARG, "'%s': arrays of more than %d dims are not supported", ps->path, ATTN_MAX_DIMS);
    info->size[n++] = v;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ',') {
      ps->p++;
      continue;
    }
    if (ps->p < ps->end && *ps->p == ')') break;
    return bad_header(ps, "'shape' is not a tuple of integers");
  }
  ps->p++;
  info->ndim = n;
  return ATTN_OK;
}

attn_status attn_npy_parse_header(const char *path, const unsigned char *buf, size_t len, int64_t file_size,
                                  attn_npy_info *info) {
  memset(info, 0, sizeof *info);
  if (len < MAGIC_LEN || memcmp(buf, MAGIC, MAGIC_LEN) != 0)
    return attn_fail(ATTN_EARG, "'%s' is not a .npy file (no \\x93NUMPY magic string)", path);
  if (len < 10) return attn_fail(ATTN_EARG, "'%s' is truncated: the file ends inside the .npy preamble", path);
  info->major = buf[6];
  info->minor = buf[7];
  if (info->major < 1 || info->major > 3 || info->minor != 0)
    return attn_fail(ATTN_EARG, "'%s': .npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are)", path,
                     info->major, info->minor);
  size_t pre = info->major == 1 ? 10 : 12;
  if (len < pre) return attn_fail(ATTN_EARG, "'%s' is truncated: the file ends inside the .npy preamble", path);
  uint32_t hlen = info->major == 1 ? (uint32_t)buf[8] | (uint32_t)buf[9] << 8
                                   : (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                                         (uint32_t)buf[11] << 24;
  if (hlen > MAX_HEADER)
    return attn_fail(ATTN_EARG, "'%s' is not a valid .npy file: its header length %lu is implausible", path,
                     (unsigned long)hlen);
  if (len - pre < hlen) {
    int64_t holds = (file_size >= (int64_t)pre ? file_size : (int64_t)len) - (int64_t)pre;
    return attn_fail(ATTN_EARG, "'%s' is truncated: the header announces %lu bytes, the file holds %lld", path,
                     (unsigned long)hlen, (long long)holds);
  }
  info->data_offset = (int64_t)pre + hlen;

  parser ps = {path, (const char *)buf + pre, (const char *)buf + pre + hlen};
  char descr[40] = {0};
  int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
  attn_status st;
  skip_ws(&ps);
  if (ps.p >= ps.end || *ps.p != '{') return bad_header(&ps, "no dict");
  ps.p++;
  for (;;) {
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == '}') break;
    char key[40];
    if ((st = parse_string(&ps, key, sizeof key)) != ATTN_OK) return st;
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p != ':') return bad_header(&ps, "a ':' is missing");
    ps.p++;
    skip_ws(&ps);
    if (strcmp(key, "descr") == 0 && !have_descr) {
      if (ps.p < ps.end && *ps.p == '[')
        return attn_fail(ATTN_EARG, "'%s': structured dtypes are not supported (expected one of %s)", path,
                         SUPPORTED);
      if ((st = parse_string(&ps, descr, sizeof descr)) != ATTN_OK) return st;
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
      if (match_word(&ps, "True")) fortran = 1;
      else if (match_word(&ps, "False")) fortran = 0;
      else return bad_header(&ps, "'fortran_order' is neither True nor False");
      have_order = 1;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      if ((st = parse_shape(&ps, info)) != ATTN_OK) return st;
      have_shape = 1;
    } else {
      return bad_header(&ps, "an unexpected or repeated key");
    }
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == ',') {
      ps.p++;
      continue;
    }
    if (ps.p < ps.end && *ps.p == '}') break;
    return bad_header(&ps, "a ',' or '}' is missing");
  }
  ps.p++;
  skip_ws(&ps);
  while (ps.p < ps.end && *ps.p == 0) ps.p++; /* some writers pad with NULs */
  if (ps.p != ps.end) return bad_header(&ps, "text after the dict");
  if (!have_descr || !have_order || !have_shape)
    return bad_header(&ps, !have_descr ? "no 'descr'" : !have_order ? "no 'fortran_order'" : "no 'shape'");

  int known = -1;
  for (int i = 0; i < (int)(sizeof DESCRS / sizeof DESCRS[0]); i++)
    if (strcmp(descr, DESCRS[i].descr) == 0) known = i;
  if (known >= 0)
    info->dtype = DESCRS[known].type;
  else if (descr[0] == '>')
    return attn_fail(ATTN_EARG, "'%s': big-endian dtype '%s' is not supported (expected one of %s; "
                     "save it with arr.astype('<f4'))", path, descr, SUPPORTED);
  else
    return attn_fail(ATTN_EARG, "'%s': dtype '%s' is not supported (expected one of %s)", path, descr, SUPPORTED);
  info->fortran_order = fortran;

  char sbuf[256];
  attn_status sst = attn_numel_checked(info->ndim, info->size, &info->numel);
  if (sst != ATTN_OK || info->numel > INT64_MAX / 8)
    return attn_fail(ATTN_EARG, "'%s': shape %s has too many elements", path,
                     attn_sizes_str(info->ndim, info->size, sbuf, sizeof sbuf));
  int64_t need = info->numel * attn_elem_size(info->dtype);
  if (file_size >= 0 && (file_size < info->data_offset || file_size - info->data_offset < need))
    return attn_fail(ATTN_EARG, "'%s' is truncated: shape %s of '%s' needs %lld bytes of data, the file holds %lld",
                     path, attn_sizes_str(info->ndim, info->size, sbuf, sizeof sbuf), descr, (long long)need,
                     (long long)(file_size > info->data_offset ? file_size - info->data_offset : 0));
  return ATTN_OK;
}

attn_status attn_npy_open(const char *path, int *fd, int64_t *file_size) {
  attn_file_problem why;
  *fd = attn_open_regular(path, file_size, &why);
  if (*fd >= 0) return ATTN_OK;
  if (why == ATTN_FILE_CANNOT_OPEN) return file_error(path, "open");
  if (why == ATTN_FILE_CANNOT_STAT) return file_error(path, "stat");
  return attn_fail(ATTN_EARG, "cannot read '%s': not a regular file", path);
}

attn_status attn_npy_read_header(const char *path, int fd, int64_t file_size, attn_npy_info *info) {
  unsigned char pre[12];
  int64_t got64 = attn_read_at(fd, pre, sizeof pre, 0);
  if (got64 < 0) return file_error(path, "read");
  size_t got = (size_t)got64;
  /* Too short for the preamble, or not a .npy file: the parser says which. */
  if (got < 10 || memcmp(pre, MAGIC, MAGIC_LEN) != 0 || (pre[6] != 1 && got < 12))
    return attn_npy_parse_header(path, pre, got, file_size, info);
  size_t preamble = pre[6] == 1 ? 10 : 12;
  uint32_t hlen = pre[6] == 1 ? (uint32_t)pre[8] | (uint32_t)pre[9] << 8
                              : (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
                                    (uint32_t)pre[11] << 24;
  if (hlen > MAX_HEADER || (int64_t)(preamble + hlen) > file_size)
    /* let the parser report the bad length with what the file holds */
    return attn_npy_parse_header(path, pre, got < (size_t)file_size ? got : (size_t)file_size, file_size, info);
  size_t total = preamble + hlen;
  unsigned char *buf = malloc(total);
  if (!buf) return attn_fail(ATTN_ENOMEM, "cannot allocate %lu bytes for the header of '%s'", (unsigned long)total, path);
  int64_t have = attn_read_at(fd, buf, total, 0);
  attn_status st;
  if (have < 0) st = file_error(path, "read");
  else if ((size_t)have < total) st = attn_fail(ATTN_EARG, "'%s' is truncated: the file ends inside the header", path);
  else st = attn_npy_parse_header(path, buf, total, file_size, info);
  free(buf);
  return st;
}

static attn_status data_ends_early(const char *path) {
  return attn_fail(ATTN_EARG, "'%s' is truncated: the data ends early (the file shrank while it was read)", path);
}

/* Where the elements of a Fortran-order file go in the C-order result: the
 * file's order walks the first index fastest, an odometer over the dims
 * gives each element's C-order offset. */
typedef struct fortran_walk {
  int ndim;
  const int64_t *size;
  int64_t idx[ATTN_MAX_DIMS];
  int64_t stride[ATTN_MAX_DIMS]; /* C-order strides */
  int64_t offset;                /* C-order offset of the element at idx */
} fortran_walk;

static void fortran_walk_init(fortran_walk *w, int ndim, const int64_t *size) {
  w->ndim = ndim;
  w->size = size;
  w->offset = 0;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    w->idx[d] = 0;
    w->stride[d] = stride;
    stride *= size[d];
  }
}

static void fortran_walk_next(fortran_walk *w) {
  for (int d = 0; d < w->ndim; d++) {
    w->offset += w->stride[d];
    if (++w->idx[d] < w->size[d]) return;
    w->offset -= w->idx[d] * w->stride[d];
    w->idx[d] = 0;
  }
}

attn_status attn_npy_read_data(const char *path, int fd, const attn_npy_info *info, float *out) {
  int64_t off = info->data_offset;
  int le = attn_host_is_little_endian();
  int64_t item = attn_elem_size(info->dtype);
  /* with one dim (or none) both orders are the same */
  int scatter = info->fortran_order && info->ndim > 1;
  fortran_walk walk;
  fortran_walk_init(&walk, info->ndim, info->size);
  unsigned char raw[CHUNK * 8];
  float conv[CHUNK];
  for (int64_t done = 0; done < info->numel;) {
    size_t n = (size_t)(info->numel - done < CHUNK ? info->numel - done : CHUNK);
    if (info->dtype == ATTN_ELEM_F32 && le && !scatter) { /* straight into place, all at once */
      size_t bytes = (size_t)(info->numel - done) * 4;
      int64_t got = attn_read_at(fd, out + done, bytes, off);
      if (got < 0) return file_error(path, "read");
      if ((size_t)got < bytes) return data_ends_early(path);
      break;
    }
    int64_t got = attn_read_at(fd, raw, n * (size_t)item, off);
    if (got < 0) return file_error(path, "read");
    if ((size_t)got < n * (size_t)item) return data_ends_early(path);
    float *dst = scatter ? conv : out + done;
    int64_t bad_value, bad = attn_elem_to_f32(info->dtype, raw, (int64_t)n, dst, &bad_value);
    int64_t bad_at = done + bad; /* the C-order position of the bad element, for the message */
    if (scatter) {
      int64_t upto = bad >= 0 ? bad : (int64_t)n;
      for (int64_t i = 0; i < upto; i++) {
        out[walk.offset] = conv[i];
        fortran_walk_next(&walk);
      }
      bad_at = walk.offset;
    }
    if (bad >= 0) {
      char at[200];
      return attn_fail(ATTN_EARG, "'%s': element %s holds the %s value %lld, which float32 cannot hold exactly "
                       "(integers load only while |x| <= 2^24 = 16777216)", path,
                       attn_elem_index_str(info->ndim, info->size, bad_at, at, sizeof at),
                       attn_elem_name(info->dtype), (long long)bad_value);
    }
    done += (int64_t)n;
    off += (int64_t)n * item;
  }
  return ATTN_OK;
}

/* ---- writing ------------------------------------------------------------ */

attn_status attn_npy_write(const char *path, const attn_tensor *t) {
  char header[512];
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                   t->is_bool ? "|b1" : "<f4");
  /* as NumPy writes it: "()", "(3,)", "(2, 3)" */
  for (int d = 0; d < t->ndim; d++)
    n += snprintf(header + n, sizeof header - (size_t)n, "%s%lld", d ? ", " : "", (long long)t->size[d]);
  if (t->ndim == 1) header[n++] = ',';
  n += snprintf(header + n, sizeof header - (size_t)n, "), }");
  /* pad with spaces so that the data starts at a multiple of 64 bytes */
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  memset(header + n, ' ', (size_t)pad);
  n += pad;
  header[n++] = '\n';

  attn_out_file of;
  if (!attn_out_open(path, &of)) return attn_fail(ATTN_EARG, "cannot open '%s' for writing: %s", path, strerror(errno));
  FILE *f = of.f;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff),
                           (unsigned char)(n >> 8)};
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)n, f) == (size_t)n && attn_write_elements(f, t);
  if (!attn_out_finish(&of, ok)) return file_error(path, "write");
  return ATTN_OK;
}
