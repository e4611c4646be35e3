/* safetensors files: the C core's reader and writer, no Lua.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * (padded with spaces), then the raw little-endian data; offsets count from
 * the end of the header. Tensors are written as F32 (bool tensors as BOOL); on load F32 is read as
 * is and F64, F16, BF16, I64, I32, I16, I8, U8 and BOOL are converted to
 * float32 (elemtype.h: F16 and BF16 exactly, F64 rounded to nearest,
 * out-of-range values becoming +-inf as in torch's .float(); integers exactly,
 * an integer past 2^24 in magnitude being an error naming the file, the
 * tensor, the element and the value). Any other dtype is refused, naming it.
 *
 * Loading never allocates and reads through one file descriptor (so a file
 * replaced by rename meanwhile is read whole, old or new): the caller (the
 * Lua binding) owns every buffer, so that it can allocate them as
 * garbage-collected userdata, and closes the descriptor:
 *   0. attn_st_open()         the descriptor and the file size;
 *   1. attn_st_read_prefix()  the header length;
 *   2. attn_st_read_header()  the N header bytes into a buffer of the caller;
 *   3. attn_st_parse()        once with entries == NULL to count them, then
 *                             again with arrays of those counts (and a string
 *                             arena of N bytes) to fill them;
 *   4. attn_st_read_data()    every tensor's elements into its `out`.
 * Every malformed file is an ATTN_EARG whose message starts with the path. */
#ifndef ATTN_SAFETENSORS_H
#define ATTN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "elemtype.h"
#include "tensor.h"

/* The reference implementation's bound on the header: more is not a
 * safetensors file but a damaged or hostile one. */
#define ATTN_ST_MAX_HEADER 100000000

typedef struct attn_st_entry {
  const char *name;          /* decoded (JSON escapes resolved), in the arena */
  size_t name_len;           /* may hold NUL bytes from \u0000 */
  attn_elem_type dtype;
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  int64_t numel;
  int64_t begin, end;        /* byte offsets into the data section */
  float *out;                /* where attn_st_read_data() puts the elements */
} attn_st_entry;

typedef struct attn_st_meta {
  const char *key, *value;   /* decoded, in the arena */
  size_t key_len, value_len;
} attn_st_meta;

typedef struct attn_st_header {
  attn_st_entry *entries;    /* NULL: count only */
  attn_st_meta *meta;
  char *arena;               /* at least header-length bytes for decoded strings */
  int64_t n_entries, n_meta; /* set by attn_st_parse */
} attn_st_header;

/* Open path for reading: *fd and the file's size; a message naming path when
 * it cannot be opened or is not a regular file (nothing left open). */
attn_status attn_st_open(const char *path, int *fd, int64_t *file_size);
/* Check that the file open as fd holds a plausible header: its length N. */
attn_status attn_st_read_prefix(const char *path, int fd, int64_t file_size, uint64_t *header_len);
/* Read the len header bytes (those after the 8-byte prefix) into buf. */
attn_status attn_st_read_header(const char *path, int fd, unsigned char *buf, size_t len);
/* Parse and check a header of len bytes; data_len is the size of the data
 * section (file size - 8 - len). With h->entries == NULL only counts (and
 * checks each entry); with arrays of those counts it fills them and also
 * checks what needs every entry: duplicate names, offsets that overlap, leave
 * a gap or stop before the end of the data. Entries come out sorted by offset. */
attn_status attn_st_parse(const char *path, const unsigned char *buf, size_t len, int64_t data_len,
                          attn_st_header *h);
/* Read the elements of every entry into entry->out (float32), converting. */
attn_status attn_st_read_data(const char *path, int fd, uint64_t header_len, const attn_st_entry *entries,
                              int64_t n);

/* One tensor to write: its name (any bytes) and the tensor (any strides). */
typedef struct attn_st_item {
  const char *name;
  size_t name_len;
  const attn_tensor *t;
} attn_st_item;

/* Write items (in the order given; the caller sorts them) as F32 tensors (BOOL
 * for a bool tensor) to path, with the metadata pairs unless n_meta == 0. */
attn_status attn_st_write(const char *path, const attn_st_item *items, int64_t n, const attn_st_meta *meta,
                          int64_t n_meta);

#endif
