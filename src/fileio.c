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
