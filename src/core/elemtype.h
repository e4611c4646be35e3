/* The element types that .npy and safetensors files hold, and their one
 * conversion to float32 (the engine's only float type). Floats convert as
 * NumPy's astype(float32) does (F16 and BF16 exactly, F64 rounded to
 * nearest); integers and bools convert exactly, which float32 can do only
 * while |x| <= 2^24: a larger integer is reported, never rounded. No Lua. */
#ifndef ATTN_ELEMTYPE_H
#define ATTN_ELEMTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum attn_elem_type {
  ATTN_ELEM_F32,
  ATTN_ELEM_F64,
  ATTN_ELEM_F16,
  ATTN_ELEM_BF16,
  ATTN_ELEM_I64,
  ATTN_ELEM_I32,
  ATTN_ELEM_I16,
  ATTN_ELEM_I8,
  ATTN_ELEM_U8,
  ATTN_ELEM_BOOL /* one byte; nonzero is true (1) */
} attn_elem_type;

/* The largest integer magnitude float32 holds exactly, with all below it. */
#define ATTN_ELEM_EXACT_INT (INT64_C(1) << 24)

/* Bytes per element. */
int attn_elem_size(attn_elem_type t);
/* "float32", "int64", "bool", ...: for messages. */
const char *attn_elem_name(attn_elem_type t);
/* n little-endian elements of type t at raw, as float32 into out. Returns -1
 * when every one converted; else the index of the first integer with
 * |x| > 2^24 (its value in *bad_value), with out[0 .. index) written. */
int64_t attn_elem_to_f32(attn_elem_type t, const unsigned char *raw, int64_t n, float *out, int64_t *bad_value);
/* "[2, 3]": the 1-based index (as Lua shows it) of row-major element flat of
 * a tensor of shape (ndim, size); "[]" for a 0-dim one. Returns buf. */
const char *attn_elem_index_str(int ndim, const int64_t *size, int64_t flat, char *buf, size_t len);

#endif
