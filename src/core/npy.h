/* NumPy .npy files (format versions 1.0, 2.0 and 3.0): the C core's reader
 * and writer, no Lua. Little-endian float32 ('<f4') is read and written;
 * '<f8' '<f2' '<i8' '<i4' '<i2' '|i1' '|u1' '|b1' are read and converted to
 * float32 (elemtype.h: integers exactly; an integer past 2^24 in magnitude
 * is an error naming the file, the element and the value). Arrays in C
 * order and in Fortran order (what np.save writes for a transposed array,
 * such as PyTorch's t.t().numpy()) are read; the result is always in C order,
 * and saving writes C order. Every malformed file is an ATTN_EARG naming the
 * path.
 *
 * Loading reads through one file descriptor (so a file replaced by rename
 * meanwhile is read whole, old or new): attn_npy_open() opens it,
 * attn_npy_read_header() parses and checks the header (and that the file
 * holds all the data it announces), the caller allocates the tensor,
 * attn_npy_read_data() reads the elements into it; the caller closes the
 * descriptor. */
#ifndef ATTN_NPY_H
#define ATTN_NPY_H

#include <stdint.h>

#include "elemtype.h"
#include "tensor.h"


typedef struct attn_npy_info {
  int major, minor;          /* format version */
  attn_elem_type dtype;      /* element type on disk */
  int ndim;
  int64_t size[ATTN_MAX_DIMS];
  int64_t numel;
  int64_t data_offset;       /* bytes from the file start to the first element */
  int fortran_order;         /* the elements are stored with the first index varying fastest */
} attn_npy_info;

/* Open the .npy file at path for reading: *fd and its size; a message naming
 * path when it cannot be opened or is not a regular file (nothing left open). */
attn_status attn_npy_open(const char *path, int *fd, int64_t *file_size);
/* Parse the header of the .npy file open as fd (path for messages) into info. */
attn_status attn_npy_read_header(const char *path, int fd, int64_t file_size, attn_npy_info *info);
/* Parse a header held in memory (the magic string onwards, len bytes); for
 * attn_npy_read_header and tests. file_size is the whole file's size in bytes,
 * or -1 when unknown (then the data length is not checked). */
attn_status attn_npy_parse_header(const char *path, const unsigned char *buf, size_t len, int64_t file_size,
                                  attn_npy_info *info);
/* Read info->numel elements of the file open as fd, described by info, into out (float32, C order
 * whatever info->fortran_order); ATTN_EARG for an integer that float32 cannot hold exactly. */
attn_status attn_npy_read_data(const char *path, int fd, const attn_npy_info *info, float *out);
/* Write t (any strides) to path as a version 1.0 C-order .npy file: '<f4',
 * or '|b1' for a bool tensor. */
attn_status attn_npy_write(const char *path, const attn_tensor *t);

#endif
