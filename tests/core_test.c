/* C-level tests of the core alone (build/libattn_core.a, no Lua): what a C
 * program using the core relies on. Each check compares the core with an
 * independent computation here (naive loops in double), or a status and its
 * message with what the contract says. Prints one line per failure and a
 * final "N passed, N failed"; exit status 1 on any failure.
 *   make test-core   (also run by make test, before the specs) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "rng.h"
#include "sdpa.h"
#include "tensor.h"

static int passed, failed;

static void check(int ok, const char *what) {
  if (ok) passed++;
  else {
    failed++;
    printf("FAIL: %s\n", what);
  }
}

/* a float widened on purpose (the warnings flags want it said) */
static double D(float x) { return (double)x; }

static float *filled(int64_t n, attn_generator *g) {
  float *p = malloc((size_t)n * sizeof *p);
  if (!p) abort();
  attn_rng_normal_f32(g, p, n, 0.0, 1.0);
  return p;
}

/* inf when any element is NaN (fmax would drop it). Not an fmax reduction
 * either: inlined, that one crashes Debian 12's aarch64 gcc 12.2 vectoriser
 * (internal compiler error in vect_transform_reduction). */
static double max_abs_diff(const float *a, const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (isnan(d)) return INFINITY;
    if (d > m) m = d;
  }
  return m;
}

static void test_views(void) {
  float data[24];
  for (int i = 0; i < 24; i++) data[i] = (float)i;
  int64_t size[3] = {2, 3, 4};
  attn_tensor t = attn_make(data, 3, size), v;
  check(attn_view_select(&t, 1, 2, &v) == ATTN_OK && v.ndim == 2 && v.size[0] == 2 && v.size[1] == 4 &&
            v.data[0] == 8.0f && *attn_at(&v, (int64_t[]){1, 3}) == 23.0f,
        "select(dim 1, 2) of [2, 3, 4] is [2, 4] starting at element 8");
  check(attn_view_transpose(&t, 0, 2, &v) == ATTN_OK && v.size[0] == 4 && v.size[2] == 2 &&
            *attn_at(&v, (int64_t[]){3, 1, 1}) == 19.0f && !attn_is_contiguous(&v),
        "transpose(0, 2) addresses element [1][1][3] at [3][1][1]");
  check(attn_view_narrow(&t, 2, 1, 2, &v) == ATTN_OK && v.size[2] == 2 && v.data[0] == 1.0f,
        "narrow(dim 2, 1, 2) starts at element 1");
  check(attn_view_select(&t, 1, 3, &v) == ATTN_EARG && strstr(attn_error_message(), "3") != NULL,
        "select out of range is ATTN_EARG naming the index");
  int perm[3] = {2, 0, 1};
  check(attn_view_permute(&t, perm, &v) == ATTN_OK && v.size[0] == 4 && v.size[1] == 2 && v.size[2] == 3 &&
            *attn_at(&v, (int64_t[]){2, 1, 0}) == 14.0f,
        "permute(2, 0, 1)");
  check(attn_view_unsqueeze(&t, 3, &v) == ATTN_OK && v.ndim == 4 && v.size[3] == 1, "unsqueeze at the end");
  int64_t big[2] = {INT64_MAX / 2, 3};
  int64_t n;
  check(attn_numel_checked(2, big, &n) == ATTN_EOVERFLOW, "an element count past int64 is ATTN_EOVERFLOW");
}

static void test_broadcast_and_matmul(attn_generator *g) {
  int64_t sa[3] = {2, 3, 4}, sb[2] = {4, 5};
  float *a = filled(24, g), *b = filled(20, g);
  attn_tensor ta = attn_make(a, 3, sa), tb = attn_make(b, 2, sb);
  int ndim;
  int64_t so[8];
  check(attn_matmul_shape(&ta, &tb, &ndim, so) == ATTN_OK && ndim == 3 && so[0] == 2 && so[1] == 3 && so[2] == 5,
        "matmul shape [2, 3, 4] x [4, 5] = [2, 3, 5]");
  float out[30];
  attn_tensor to = attn_make(out, 3, so);
  double want[30];
  for (int bi = 0; bi < 2; bi++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += D(a[bi * 12 + i * 4 + k]) * D(b[k * 5 + j]);
        want[bi * 15 + i * 5 + j] = s;
      }
  check(attn_matmul(&ta, &tb, &to) == ATTN_OK && max_abs_diff(out, want, 30) < 1e-5, "matmul against naive loops");
  int64_t sc[2] = {5, 4};
  attn_tensor tc = attn_make(b, 2, sc);
  check(attn_matmul_shape(&ta, &tc, &ndim, so) == ATTN_ESHAPE && strstr(attn_error_message(), "4") != NULL,
        "matmul of [2, 3, 4] and [5, 4] is ATTN_ESHAPE");
  /* add with broadcast: [2, 3, 4] + [4] */
  float sum[24];
  int64_t s1[1] = {4};
  attn_tensor row = attn_make(b, 1, s1), ts = attn_make(sum, 3, sa);
  double wsum[24];
  for (int i = 0; i < 24; i++) wsum[i] = D(a[i] + b[i % 4]); /* the float sum, exactly */
  check(attn_binary(ATTN_ADD, &ta, &row, &ts) == ATTN_OK && max_abs_diff(sum, wsum, 24) == 0,
        "add broadcasts a row over [2, 3, 4]");
  free(a);
  free(b);
}

static void test_softmax(attn_generator *g) {
  int64_t s[2] = {3, 7};
  float *x = filled(21, g), y[21];
  attn_tensor tx = attn_make(x, 2, s), ty = attn_make(y, 2, s);
  double want[21];
  for (int r = 0; r < 3; r++) {
    double m = -INFINITY, z = 0;
    for (int c = 0; c < 7; c++) m = fmax(m, D(x[r * 7 + c]));
    for (int c = 0; c < 7; c++) z += exp(D(x[r * 7 + c]) - m);
    for (int c = 0; c < 7; c++) want[r * 7 + c] = exp(D(x[r * 7 + c]) - m) / z;
  }
  check(attn_softmax(&tx, 1, &ty, 0) == ATTN_OK && max_abs_diff(y, want, 21) < 1e-6, "softmax rows");
  free(x);
}

/* attention in double: softmax(q k^T * scale, causal) v, one slice */
static void naive_attention(const float *q, const float *k, const float *v, int lq, int lk, int e, int ev,
                            int causal, double *out) {
  double scale = 1.0 / sqrt((double)e);
  for (int i = 0; i < lq; i++) {
    double s[512], m = -INFINITY, z = 0;
    for (int j = 0; j < lk; j++) {
      double d = 0;
      for (int c = 0; c < e; c++) d += D(q[i * e + c]) * D(k[j * e + c]);
      s[j] = (causal && j > i) ? -(double)INFINITY : d * scale;
      m = fmax(m, s[j]);
    }
    for (int j = 0; j < lk; j++) z += (s[j] = exp(s[j] - m));
    for (int c = 0; c < ev; c++) {
      double acc = 0;
      for (int j = 0; j < lk; j++) acc += s[j] / z * D(v[j * ev + c]);
      out[i * ev + c] = acc;
    }
  }
}

static void test_attention(attn_generator *g) {
  enum { LQ = 150, LK = 150, E = 64, EV = 32 };
  float *q = filled(LQ * E, g), *k = filled(LK * E, g), *v = filled(LK * EV, g);
  int64_t sq[2] = {LQ, E}, sk[2] = {LK, E}, sv[2] = {LK, EV}, so[2] = {LQ, EV};
  attn_tensor tq = attn_make(q, 2, sq), tk = attn_make(k, 2, sk), tv = attn_make(v, 2, sv);
  static float out[LQ * EV];
  static double want[LQ * EV];
  attn_tensor to = attn_make(out, 2, so);
  for (int causal = 0; causal <= 1; causal++) {
    naive_attention(q, k, v, LQ, LK, E, EV, causal, want);
    for (int kernel = ATTN_SDPA_MATH; kernel <= ATTN_SDPA_FLASH; kernel++) {
      attn_sdpa_opts o = attn_sdpa_defaults();
      o.is_causal = causal;
      o.scale = 1.0f / sqrtf((float)E); /* the caller sets the scale (the binding's default) */
      memset(out, 0, sizeof out);
      char what[96];
      snprintf(what, sizeof what, "%s attention%s against naive double loops",
               kernel == ATTN_SDPA_MATH ? "math" : "flash", causal ? " (causal)" : "");
      attn_status st = attn_sdpa_run((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, NULL);
      double err = max_abs_diff(out, want, LQ * EV);
      if (st != ATTN_OK || !(err < 2e-5)) printf("  status %d, max |diff| %g\n", (int)st, err);
      check(st == ATTN_OK && err < 2e-5, what);
    }
  }
  int64_t sbad[2] = {LK, E + 1};
  attn_tensor tbad = attn_make(k, 2, sbad);
  attn_sdpa_opts o = attn_sdpa_defaults();
  check(attn_sdpa_run(ATTN_SDPA_AUTO, &tq, &tbad, &tv, &o, &to, NULL) == ATTN_ESHAPE,
        "attention with mismatched E is ATTN_ESHAPE, not a crash");
  free(q);
  free(k);
  free(v);
}

static void test_rng(void) {
  attn_generator g;
  attn_rng_seed(&g, 0);
  float x[3];
  attn_rng_uniform_f32(&g, x, 3, 0.0, 1.0);
  /* torch.manual_seed(0); torch.rand(3) = tensor([0.4963, 0.7682, 0.0885]) */
  check(fabsf(x[0] - 0.4963f) < 1e-4f && fabsf(x[1] - 0.7682f) < 1e-4f && fabsf(x[2] - 0.0885f) < 1e-4f,
        "rand after seed 0 gives torch's first numbers");
}

int main(void) {
  attn_generator g;
  attn_rng_seed(&g, 123);
  test_views();
  test_broadcast_and_matmul(&g);
  test_softmax(&g);
  test_attention(&g);
  test_rng();
  printf("core_test: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
