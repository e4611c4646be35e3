/* File element types to float32 (see elemtype.h). */
#include "elemtype.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fileio.h"

int attn_elem_size(attn_elem_type t) {
  switch (t) {
  case ATTN_ELEM_F64:
  case ATTN_ELEM_I64: return 8;
  case ATTN_ELEM_F32:
  case ATTN_ELEM_I32: return 4;
  case ATTN_ELEM_F16:
  case ATTN_ELEM_BF16:
  case ATTN_ELEM_I16: return 2;
  case ATTN_ELEM_I8:
  case ATTN_ELEM_U8:
  case ATTN_ELEM_BOOL:
  default: return 1;
  }
}

const char *attn_elem_name(attn_elem_type t) {
  static const char *const names[] = {"float32", "float64", "float16", "bfloat16", "int64",
                                      "int32",   "int16",   "int8",    "uint8",    "bool"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static float f16_to_f32(uint16_t h) {
  int sign = h >> 15, exp = h >> 10 & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0x1f) v = man ? NAN : INFINITY;
  else if (exp == 0) v = ldexpf((float)man, -24); /* zero and subnormals, exact */
  else v = ldexpf((float)(man | 0x400), exp - 25);
  return sign ? -v : v;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

/* the signed integer of type t at b (two's complement, little-endian) */
static int64_t load_int(attn_elem_type t, const unsigned char *b) {
  switch (t) {
  case ATTN_ELEM_I64: return (int64_t)attn_load_u64le(b);
  case ATTN_ELEM_I32: return (int32_t)attn_load_u32le(b);
  case ATTN_ELEM_I16: return (int16_t)(uint16_t)(b[0] | b[1] << 8);
  case ATTN_ELEM_I8: return (int8_t)b[0];
  case ATTN_ELEM_U8: return b[0];
  case ATTN_ELEM_BOOL:
  default: return b[0] != 0;
  }
}

int64_t attn_elem_to_f32(attn_elem_type t, const unsigned char *raw, int64_t n, float *out, int64_t *bad_value) {
  int size = attn_elem_size(t);
  for (int64_t i = 0; i < n; i++) {
    const unsigned char *b = raw + i * size;
    switch (t) {
    case ATTN_ELEM_F32: {
      uint32_t u = attn_load_u32le(b);
      memcpy(&out[i], &u, 4);
      break;
    }
    case ATTN_ELEM_F64: {
      uint64_t u = attn_load_u64le(b);
      double d;
      memcpy(&d, &u, 8);
      out[i] = attn_f64_to_f32(d);
      break;
    }
    case ATTN_ELEM_F16: out[i] = f16_to_f32((uint16_t)(b[0] | b[1] << 8)); break;
    case ATTN_ELEM_BF16: out[i] = bf16_to_f32((uint16_t)(b[0] | b[1] << 8)); break;
    default: {
      int64_t v = load_int(t, b);
      /* INT64_MIN has no magnitude in int64: compare without negating */
      if (v > ATTN_ELEM_EXACT_INT || v < -ATTN_ELEM_EXACT_INT) {
        *bad_value = v;
        return i;
      }
      out[i] = (float)v;
    }
    }
  }
  return -1;
}

const char *attn_elem_index_str(int ndim, const int64_t *size, int64_t flat, char *buf, size_t len) {
  int64_t at[64];
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t n = size[d] > 0 ? size[d] : 1;
    at[d] = flat % n;
    flat /= n;
  }
  size_t used = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)at[d] + 1);
  if (used < len) snprintf(buf + used, len - used, "]");
  return buf;
}
