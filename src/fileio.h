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
  ATTN_FILE_CANNOT_OPEN,  /* fopen failed (errno says why) */
  ATTN_FILE_CANNOT_STAT,  /* fstat failed (errno says why) */
  ATTN_FILE_NOT_REGULAR,  /* a device, a pipe, ... */
  ATTN_FILE_IS_DIRECTORY
} attn_file_problem;

/* path opened "rb" and its size in bytes; NULL (nothing left open) with
 * *problem set when it cannot be opened or is not a regular file. */
FILE *attn_fopen_regular(const char *path, int64_t *size, attn_file_problem *problem);

/* Write t's floats to f as little-endian float32 in C order (any strides);
 * 1 when every byte was written. */
int attn_write_f32le(FILE *f, const attn_tensor *t);

/* Close a file written under path: 1 when it was all written (ok) and closed;
 * otherwise 0, the partial file removed (a regular file only, never a device)
 * and errno naming the cause. */
int attn_finish_write(FILE *f, const char *path, int ok);

#endif
