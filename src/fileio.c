/* Shared file helpers of the .npy and safetensors formats (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

int attn_host_is_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

uint32_t attn_load_u32le(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

uint64_t attn_load_u64le(const unsigned char *b) {
  return (uint64_t)attn_load_u32le(b) | (uint64_t)attn_load_u32le(b + 4) << 32;
}

float attn_f64_to_f32(double d) {
  if (d > (double)FLT_MAX) return INFINITY;
  if (d < -(double)FLT_MAX) return -INFINITY;
  return (float)d;
}

FILE *attn_fopen_regular(const char *path, int64_t *size, attn_file_problem *problem) {
  struct stat sb;
  FILE *f = fopen(path, "rb");
  if (!f) {
    *problem = ATTN_FILE_CANNOT_OPEN;
    return NULL;
  }
  if (fstat(fileno(f), &sb) != 0) {
    int err = errno; /* the caller's message names fstat's errno, not fclose's */
    *problem = ATTN_FILE_CANNOT_STAT;
    fclose(f);
    errno = err;
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    *problem = S_ISDIR(sb.st_mode) ? ATTN_FILE_IS_DIRECTORY : ATTN_FILE_NOT_REGULAR;
    fclose(f);
    return NULL;
  }
  *size = (int64_t)sb.st_size;
  return f;
}

#define WRITE_CHUNK 4096 /* floats converted per fwrite when t is strided or the host big-endian */

int attn_write_f32le(FILE *f, const attn_tensor *t) {
  int64_t numel = attn_numel(t);
  if (numel == 0) return 1;
  if (attn_is_contiguous(t) && attn_host_is_little_endian())
    return fwrite(t->data, 4, (size_t)numel, f) == (size_t)numel;
  unsigned char raw[WRITE_CHUNK * 4];
  int64_t idx[ATTN_MAX_DIMS] = {0};
  size_t k = 0;
  for (int64_t e = 0; e < numel; e++) {
    float v = *attn_at(t, idx);
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int j = 0; j < 4; j++) raw[4 * k + (size_t)j] = (unsigned char)(u >> (8 * j));
    if (++k == WRITE_CHUNK || e + 1 == numel) {
      if (fwrite(raw, 4, k, f) != k) return 0;
      k = 0;
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->size[d]) break;
      idx[d] = 0;
    }
  }
  return 1;
}

int attn_finish_write(FILE *f, const char *path, int ok) {
  int werr = errno;
  /* only a regular file is removed: a failed write to a device (/dev/full)
   * must not delete the device node */
  struct stat sb;
  int regular = fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode);
  if (fclose(f) != 0 && ok) {
    ok = 0;
    werr = errno;
  }
  if (!ok) {
    if (regular) remove(path);
    errno = werr;
  }
  return ok;
}
