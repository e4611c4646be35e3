/* What the file formats (npy.c, safetensors.c) share: byte order, little-endian
 * loads, float64 narrowing, opening a regular file for reading and writing
 * float32 data. Each format
 * words its own error messages. */
#ifndef ATTN_FILEIO_H
#define ATTN_FILEIO_H

#include <stdint.h>
#include <stdio.h>

#include "tensor.h"

int attn_host_is_little_endian(void);
uint32_t attn_load_u32le(const unsigned char *b);
uint64_t attn_load_u64le(const unsigned char *b);
/* float32 of d; beyond float's range +-inf, as NumPy's astype and torch's .float(). */
float attn_f64_to_f32(double d);

typedef enum {
  ATTN_FILE_CANNOT_OPEN,  /* open failed (errno says why) */
  ATTN_FILE_CANNOT_STAT,  /* fstat failed (errno says why) */
  ATTN_FILE_NOT_REGULAR,  /* a device, a pipe, ... */
  ATTN_FILE_IS_DIRECTORY
} attn_file_problem;

/* path opened for reading: a file descriptor and the file's size; -1
 * (nothing left open) with *problem set when it cannot be opened or is not a
 * regular file. The open does not block on a FIFO (O_NONBLOCK until fstat has
 * said it is a regular file), and the descriptor is close-on-exec. A load
 * reads everything through this one descriptor, so a file replaced by rename
 * during the load is read whole, old or new, never half of each. */
int attn_open_regular(const char *path, int64_t *size, attn_file_problem *problem);

/* Read up to n bytes at offset off of fd (retrying short reads and EINTR):
 * the count read, less than n only at the end of the file; -1 on a read
 * error (errno says why). */
int64_t attn_read_at(int fd, void *buf, size_t n, int64_t off);

/* A file being saved. A regular file (or a new one) is written to a
 * temporary file beside it (same directory, unique name, created with
 * O_EXCL) that replaces it by rename only when every byte was written and
 * flushed to disk, so that a failed or interrupted save leaves the previous
 * file as it was; a symlink is followed (the link stays, its target is
 * replaced) and the permissions of a replaced file are kept. An existing
 * non-regular file (a device such as /dev/null or /dev/full, a FIFO with a
 * reader) is written in place and never removed. */
typedef struct attn_out_file {
  FILE *f;
  char *tmp_path;    /* malloc'ed; NULL when writing in place */
  char *final_path;  /* malloc'ed: what tmp_path is renamed to */
} attn_out_file;

/* 1 with of->f open for writing; 0 (nothing left behind) with errno set. */
int attn_out_open(const char *path, attn_out_file *of);

/* Finish a file opened by attn_out_open: when ok (every write succeeded),
 * flush, sync and close it and rename it into place; otherwise (or when one
 * of these fails) close and remove the temporary file. 1 on success, else 0
 * with errno naming the first cause. Frees what attn_out_open allocated. */
int attn_out_finish(attn_out_file *of, int ok);

/* Write t's floats to f as little-endian float32 in C order (any strides);
 * 1 when every byte was written. */
int attn_write_f32le(FILE *f, const attn_tensor *t);
/* Write a bool tensor's elements to f as bytes 0 and 1 (nonzero is 1) in C
 * order (any strides); 1 when every byte was written. */
int attn_write_bool(FILE *f, const attn_tensor *t);
/* What attn_write_f32le or attn_write_bool writes for t: its dtype's bytes. */
int attn_write_elements(FILE *f, const attn_tensor *t);

#endif
