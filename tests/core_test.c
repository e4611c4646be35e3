/* C-level tests of the core alone (build/libattn_core.a, no Lua): what a C
 * program using the core relies on. Each check compares the core with an
 * independent computation here (naive loops in double), or a status and its
 * message with what the contract says. Prints one line per failure and a
 * final "N passed, N failed"; exit status 1 on any failure.
 *   make test-core   (also run by make test, before the specs) */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ops.h"
#include "rng.h"
#include "sdpa_backward.h"
#include "sdpa_common.h"
#include "sdpa_dispatch.h"
#include "tensor.h"
#include "tokenizer.h"

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

/* attention in double: softmax(q k^T * scale, causal, visible) v, one slice;
 * visible: NULL or [lq, lk] (nonzero = the key is seen); a row that sees no
 * key gives zeros (the core's contract) */
static void naive_attention(const float *q, const float *k, const float *v, int lq, int lk, int e, int ev,
                            int causal, const uint8_t *visible, double *out) {
  double scale = 1.0 / sqrt((double)e);
  for (int i = 0; i < lq; i++) {
    double s[512], m = -INFINITY, z = 0;
    for (int j = 0; j < lk; j++) {
      double d = 0;
      for (int c = 0; c < e; c++) d += D(q[i * e + c]) * D(k[j * e + c]);
      int hidden = (causal && j > i) || (visible && !visible[i * lk + j]);
      s[j] = hidden ? -(double)INFINITY : d * scale;
      m = fmax(m, s[j]);
    }
    if (m == -(double)INFINITY) {
      for (int c = 0; c < ev; c++) out[i * ev + c] = 0;
      continue;
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
    naive_attention(q, k, v, LQ, LK, E, EV, causal, NULL, want);
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

/* The flash forward's items, handed out one ahead to 1, 2, 3 and 5
 * threads, give the same output bits: 6 slices of 200 rows (a partial last
 * query block) and one slice of 700 (items of several query blocks), dense,
 * causal and a window {40, 3}. */
static void test_flash_threads(attn_generator *g) {
  struct { int64_t b, h, l, e; int causal, window; } cases[] = {
      {3, 2, 200, 32, 0, 0}, {3, 2, 200, 32, 1, 0}, {3, 2, 200, 32, 0, 1}, {1, 1, 700, 64, 1, 0}};
  int before = omp_get_max_threads();
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t b = cases[ci].b, h = cases[ci].h, l = cases[ci].l, e = cases[ci].e, n = b * h * l * e;
    float *q = filled(n, g), *k = filled(n, g), *v = filled(n, g);
    float *one = malloc((size_t)n * sizeof(float)), *many = malloc((size_t)n * sizeof(float));
    if (!one || !many) abort();
    int64_t size[4] = {b, h, l, e};
    attn_tensor tq = attn_make(q, 4, size), tk = attn_make(k, 4, size), tv = attn_make(v, 4, size);
    attn_sdpa_opts o = attn_sdpa_defaults();
    o.is_causal = cases[ci].causal;
    o.has_window = cases[ci].window, o.window_left = 40, o.window_right = 3;
    o.scale = 1.0f / sqrtf((float)e);
    const int teams[] = {1, 2, 3, 5};
    int same = 1;
    for (int ti = 0; ti < 4; ti++) {
      omp_set_num_threads(teams[ti]);
      float *dst = ti == 0 ? one : many;
      memset(dst, 0xff, (size_t)n * sizeof(float));
      attn_tensor to = attn_make(dst, 4, size);
      same = same && attn_sdpa_run(ATTN_SDPA_FLASH, &tq, &tk, &tv, &o, &to, NULL) == ATTN_OK;
      if (ti > 0) same = same && memcmp(one, many, (size_t)n * sizeof(float)) == 0;
    }
    char what[160];
    snprintf(what, sizeof what, "flash [%lld, %lld, %lld, %lld]%s%s: 1, 2, 3 and 5 threads give the same bits",
             (long long)b, (long long)h, (long long)l, (long long)e, cases[ci].causal ? " causal" : "",
             cases[ci].window ? " window" : "");
    check(same, what);
    free(q), free(k), free(v), free(one), free(many);
  }
  omp_set_num_threads(before);
}

/* attn_gemm_bias against attn_gemm followed by a separate + bias, bit for
 * bit: shapes on the own GEMM and on BLAS, transposed operands, k = 0. */
static void test_gemm_bias(attn_generator *g) {
  struct { int64_t m, n, k; int ta, tb; } cases[] = {{70, 45, 33, 0, 1}, {130, 200, 64, 1, 0}, {8, 300, 20, 0, 0},
                                                     {50, 20, 0, 0, 0}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t m = cases[ci].m, n = cases[ci].n, k = cases[ci].k;
    float *a = filled(m * k + 1, g), *b = filled(k * n + 1, g), *bias = filled(n, g);
    float *c1 = malloc((size_t)(m * n) * sizeof(float)), *c2 = malloc((size_t)(m * n) * sizeof(float));
    if (!c1 || !c2) abort();
    int64_t lda = cases[ci].ta ? m : k, ldb = cases[ci].tb ? k : n;
    attn_gemm(cases[ci].ta, cases[ci].tb, m, n, k, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, c1, n);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c1[i * n + j] = c1[i * n + j] + bias[j];
    attn_gemm_bias(cases[ci].ta, cases[ci].tb, m, n, k, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, bias, c2, n);
    char what[120];
    snprintf(what, sizeof what, "attn_gemm_bias [%lld, %lld] over %lld: the bits of the product, then + bias",
             (long long)m, (long long)n, (long long)k);
    check(memcmp(c1, c2, (size_t)(m * n) * sizeof(float)) == 0, what);
    free(a), free(b), free(bias), free(c1), free(c2);
  }
  /* attn_gemm_is_own's promise: where it holds for [32, 40] and [96, 40]
   * over 50 (a weight gradient's transposed A), each 32-row third of the
   * larger product has the bits of that third computed alone; below 16 in
   * a size (BLAS's small products) it does not hold */
  check(!attn_gemm_is_own(8, 40, 50) && !attn_gemm_is_own(32, 40, 15), "attn_gemm_is_own: no for a size under 16");
  if (attn_gemm_is_own(32, 40, 50) && attn_gemm_is_own(96, 40, 50)) {
    float *a = filled(50 * 96, g), *b = filled(50 * 40, g);
    float *whole = malloc(96 * 40 * sizeof(float)), *part = malloc(32 * 40 * sizeof(float));
    if (!whole || !part) abort();
    attn_gemm(1, 0, 96, 40, 50, a, 96, b, 40, whole, 40);
    int same = 1;
    for (int third = 0; third < 3; third++) {
      attn_gemm(1, 0, 32, 40, 50, a + 32 * third, 96, b, 40, part, 40);
      same = same && memcmp(part, whole + 32 * 40 * third, 32 * 40 * sizeof(float)) == 0;
    }
    check(same, "attn_gemm_is_own: rows of a larger own-GEMM product have the bits of their own product");
    free(a), free(b), free(whole), free(part);
  }
}

/* attn_gemm_bias on 2, 3 and 5 threads (its tiles spread over them: the
 * own GEMM's row bands, or BLAS tiles chosen by the shape) gives the bits
 * of one thread, and one thread lies within float rounding of a
 * double-precision sum: shapes with a partial last micro-tile row, panel
 * of columns and block of k, each transpose, with and without bias; B
 * packed whole, and B packed one block of k at a time (the two orders of
 * src/core/sgemm_driver.h); more columns than one band of the chunks
 * handed out to the threads (src/core/matmul.c). */
static void test_gemm_threads(attn_generator *g) {
  struct { int64_t m, n, k; int ta, tb, bias; } cases[] = {
      {200, 70, 300, 0, 1, 1}, {97, 130, 129, 1, 0, 0}, {300, 64, 2048, 1, 0, 0}, {61, 200, 40, 0, 0, 1},
      {100, 130, 1100, 0, 1, 1}, {100, 130, 1100, 1, 0, 0}, {100, 600, 64, 0, 1, 1}};
  int before = omp_get_max_threads();
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t m = cases[ci].m, n = cases[ci].n, k = cases[ci].k;
    int64_t lda = cases[ci].ta ? m : k, ldb = cases[ci].tb ? k : n;
    float *a = filled(m * k, g), *b = filled(k * n, g), *bias = cases[ci].bias ? filled(n, g) : NULL;
    float *one = malloc((size_t)(m * n) * sizeof(float)), *many = malloc((size_t)(m * n) * sizeof(float));
    if (!one || !many) abort();
    omp_set_num_threads(1);
    attn_gemm_bias(cases[ci].ta, cases[ci].tb, m, n, k, a, lda, b, ldb, bias, one, n);
    double worst = 0.0;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double sum = 0.0, mag = 0.0;
        for (int64_t l = 0; l < k; l++) {
          double x = D(cases[ci].ta ? a[l * lda + i] : a[i * lda + l]);
          double y = D(cases[ci].tb ? b[j * ldb + l] : b[l * ldb + j]);
          sum += x * y, mag += fabs(x * y);
        }
        if (bias) sum += D(bias[j]), mag += fabs(D(bias[j]));
        double err = fabs(D(one[i * n + j]) - sum) / (mag + 1e-30);
        if (err > worst) worst = err;
      }
    char what[160];
    snprintf(what, sizeof what, "attn_gemm_bias [%lld, %lld] over %lld on one thread: within %g of the double sum",
             (long long)m, (long long)n, (long long)k, worst);
    check(worst < (double)k * D(FLT_EPSILON), what);
    const int teams[] = {2, 3, 5};
    for (int ti = 0; ti < 3; ti++) {
      omp_set_num_threads(teams[ti]);
      memset(many, 0xff, (size_t)(m * n) * sizeof(float));
      attn_gemm_bias(cases[ci].ta, cases[ci].tb, m, n, k, a, lda, b, ldb, bias, many, n);
      snprintf(what, sizeof what, "attn_gemm_bias [%lld, %lld] over %lld: %d threads give one thread's bits",
               (long long)m, (long long)n, (long long)k, teams[ti]);
      check(memcmp(one, many, (size_t)(m * n) * sizeof(float)) == 0, what);
    }
    free(a), free(b), free(bias), free(one), free(many);
  }
  omp_set_num_threads(before);
}

/* attn_sdpa_modify_tile's visible ranges (no mask, bias or other variant)
 * hide exactly the (query, key) pairs that causal masking and a window
 * hide, by their definitions here: key j is seen by query i when j <= i
 * (causal) and i + d - left <= j <= i + d + right (window, d = Lk - Lq);
 * tiles at every row and many key offsets, Lq above, equal to and below
 * Lk, in flash's transposed layout and the math kernel's row-major one,
 * the padding past the tile untouched. */
static void test_visible_ranges(void) {
  enum { CS = 24 };
  struct { int causal; int64_t left, right; } modes[] = {{1, -1, -1}, {0, 3, 0}, {0, 0, 0}, {0, 5, 2}, {1, 4, -1},
                                                         {0, -1, 6}, {0, 100, 1}};
  const int64_t shapes[][2] = {{17, 17}, {9, 23}, {23, 9}};
  int64_t bad = 0, tiles = 0;
  float s[CS * CS];
  attn_sdpa_slice sl;
  memset(&sl, 0, sizeof sl);
  for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
    for (int si = 0; si < 3; si++) {
      attn_sdpa_problem p;
      memset(&p, 0, sizeof p);
      p.lq = shapes[si][0], p.lk = shapes[si][1];
      p.is_causal = modes[mi].causal, p.window_left = modes[mi].left, p.window_right = modes[mi].right;
      int64_t d = p.lk - p.lq;
      for (int64_t i0 = 0; i0 < p.lq; i0++)
        for (int64_t ni = 1; ni <= 16 && i0 + ni <= p.lq; ni += 5)
          for (int64_t k0 = 0; k0 < p.lk; k0 += 3)
            for (int64_t nk = 1; k0 + nk <= p.lk; nk += 4) {
              for (int transposed = 0; transposed < 2; transposed++) {
                int64_t rs = transposed ? 1 : CS, cs = transposed ? CS : 1; /* both fit: ni <= 16, nk <= 23 */
                for (int64_t x = 0; x < CS * CS; x++) s[x] = 1.0f;
                attn_sdpa_modify_tile(&p, &sl, i0, ni, k0, nk, s, rs, cs);
                tiles++;
                for (int64_t r = 0; r < CS; r++)
                  for (int64_t c = 0; c < CS; c++) {
                    int64_t i = i0 + r, j = k0 + c;
                    int seen = (!p.is_causal || j <= i) && (p.window_left < 0 || j >= i + d - p.window_left) &&
                               (p.window_right < 0 || j <= i + d + p.window_right);
                    float want = r >= ni || c >= nk || seen ? 1.0f : -INFINITY;
                    bad += s[r * rs + c * cs] != want;
                  }
              }
            }
    }
  char what[160];
  snprintf(what, sizeof what, "the visible ranges hide exactly causal's and the window's pairs (%lld of %lld tiles' "
                              "entries wrong)", (long long)bad, (long long)tiles);
  check(bad == 0, what);
}

/* attn_sdpa_backward's gradients written through strided rows (a module's
 * heads side by side in [rows, H E + pad]) against the same call's
 * contiguous gradients, bit for bit, with the padding left as it was: both
 * kernels, causal, GQA (dK, dV per kv head) and one long slice (the flash
 * kernel's two passes when threads outnumber slices). A row of non-unit
 * stride is ATTN_ESHAPE. */
static void test_backward_strided_grads(attn_generator *g) {
  enum { E = 16, EV = 8, PAD = 5 };
  struct { int64_t b, hq, hkv, l; int gqa, causal; } cases[] = {
      {2, 4, 4, 70, 0, 1}, {2, 4, 2, 90, 1, 0}, {1, 1, 1, 300, 0, 1}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t b = cases[ci].b, hq = cases[ci].hq, hkv = cases[ci].hkv, l = cases[ci].l;
    int64_t nq = b * hq * l, nk = b * hkv * l;
    float *q = filled(nq * E, g), *k = filled(nk * E, g), *v = filled(nk * EV, g), *dout = filled(nq * EV, g);
    float *out = malloc((size_t)(nq * EV) * sizeof(float)), *saved = malloc((size_t)(nq * l) * sizeof(float));
    int64_t sq[4] = {b, hq, l, E}, sk[4] = {b, hkv, l, E}, sv[4] = {b, hkv, l, EV}, so[4] = {b, hq, l, EV};
    int64_t slse[3] = {b, hq, l}, sp[4] = {b, hq, l, l};
    attn_tensor tq = attn_make(q, 4, sq), tk = attn_make(k, 4, sk), tv = attn_make(v, 4, sv);
    attn_tensor to = attn_make(out, 4, so), tdo = attn_make(dout, 4, so);
    /* contiguous gradients, then strided: rows of H E + PAD (or H Ev + PAD) floats */
    float *flat = malloc((size_t)(nq * E + 2 * nk * E) * sizeof(float));
    int64_t ldq = hq * E + PAD, ldk = hkv * E + PAD, ldv = hkv * EV + PAD;
    int64_t wide_n = b * l * (ldq + ldk + ldv);
    float *wide = malloc((size_t)wide_n * sizeof(float)), *wq = wide, *wk = wq + b * l * ldq, *wv = wk + b * l * ldk;
    if (!out || !saved || !flat || !wide) abort();
    for (int kernel = ATTN_SDPA_MATH; kernel <= ATTN_SDPA_FLASH; kernel++) {
      attn_sdpa_opts o = attn_sdpa_defaults();
      o.scale = 0.25f;
      o.is_causal = cases[ci].causal;
      o.enable_gqa = cases[ci].gqa;
      attn_tensor tsaved = kernel == ATTN_SDPA_MATH ? attn_make(saved, 4, sp) : attn_make(saved, 3, slse);
      if (kernel == ATTN_SDPA_MATH) o.probs = &tsaved;
      else o.lse = &tsaved;
      attn_status st = attn_sdpa_run((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, NULL);
      o.probs = NULL, o.lse = NULL;
      attn_tensor cq = attn_make(flat, 4, sq), ck = attn_make(flat + nq * E, 4, sk);
      attn_tensor cv = attn_make(flat + nq * E + nk * E, 4, sv);
      attn_sdpa_grads cg = {&cq, &ck, &cv, NULL};
      if (st == ATTN_OK) st = attn_sdpa_backward((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, &tdo, &tsaved, NULL, &cg);
      for (int64_t i = 0; i < wide_n; i++) wide[i] = -7.5f; /* the padding's sentinel */
      attn_tensor rq = cq, rk = ck, rv = cv; /* [B, H, L, *] views of rows [B L, H * + PAD] */
      rq.data = wq, rk.data = wk, rv.data = wv;
      rq.stride[0] = l * ldq, rq.stride[1] = E, rq.stride[2] = ldq;
      rk.stride[0] = l * ldk, rk.stride[1] = E, rk.stride[2] = ldk;
      rv.stride[0] = l * ldv, rv.stride[1] = EV, rv.stride[2] = ldv;
      attn_sdpa_grads rg = {&rq, &rk, &rv, NULL};
      attn_status st2 = st == ATTN_OK ? attn_sdpa_backward((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, &tdo,
                                                           &tsaved, NULL, &rg)
                                      : st;
      int same = st2 == ATTN_OK;
      const attn_tensor *strided[3] = {&rq, &rk, &rv}, *plain[3] = {&cq, &ck, &cv};
      for (int gi = 0; gi < 3 && same; gi++) {
        const attn_tensor *r = strided[gi], *c = plain[gi];
        for (int64_t i0 = 0; i0 < r->size[0]; i0++)
          for (int64_t i1 = 0; i1 < r->size[1]; i1++)
            for (int64_t i2 = 0; i2 < r->size[2]; i2++)
              for (int64_t i3 = 0; i3 < r->size[3]; i3++) {
                float a = r->data[i0 * r->stride[0] + i1 * r->stride[1] + i2 * r->stride[2] + i3];
                float bb = c->data[((i0 * c->size[1] + i1) * c->size[2] + i2) * c->size[3] + i3];
                if (memcmp(&a, &bb, sizeof a) != 0) same = 0;
              }
      }
      int64_t pads = 0; /* the rows' padding: untouched */
      for (int64_t r = 0; r < b * l; r++)
        for (int64_t j = 0; j < PAD; j++)
          pads += wq[r * ldq + hq * E + j] == -7.5f && wk[r * ldk + hkv * E + j] == -7.5f &&
                  wv[r * ldv + hkv * EV + j] == -7.5f;
      char what[160];
      snprintf(what, sizeof what, "%s backward into strided gradient rows (B %lld, Hq %lld, Hkv %lld, L %lld%s): the "
               "contiguous call's bits, padding untouched", kernel == ATTN_SDPA_MATH ? "math" : "flash",
               (long long)b, (long long)hq, (long long)hkv, (long long)l, cases[ci].causal ? ", causal" : "");
      check(same && pads == b * l * PAD, what);
      /* a gradient whose rows are not unit-stride is refused */
      attn_tensor bad = rq;
      bad.stride[3] = 2, bad.stride[2] = 2 * ldq, bad.stride[0] = 2 * l * ldq;
      attn_sdpa_grads bg = {&bad, &rk, &rv, NULL};
      check(attn_sdpa_backward((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, &tdo, &tsaved, NULL, &bg) ==
                ATTN_ESHAPE,
            "a dq gradient with strided elements is ATTN_ESHAPE");
    }
    free(q), free(k), free(v), free(dout), free(out), free(saved), free(flat), free(wide);
  }
}

/* The built-in block-mask functions, element by element (0-based query i,
 * key j; nonzero = visible), written here apart from src/core/block_mask.c. */
enum { MASK_CAUSAL, MASK_WINDOW, MASK_DOCUMENT, MASK_DOCUMENT_CAUSAL };

static int naive_visible(int fn, int64_t i, int64_t j, int64_t w, const float *ids) {
  switch (fn) {
  case MASK_CAUSAL: return j <= i;
  case MASK_WINDOW: return j <= i && i - j < w;
  case MASK_DOCUMENT: return ids[i] == ids[j];
  default: return ids[i] == ids[j] && j <= i;
  }
}

static const char *const mask_names[] = {"causal", "sliding_window", "document", "and_(document, causal)"};

/* Pattern `pattern` of m from a built-in through the core's block evaluators,
 * block by block, as the binding builds it. */
static attn_status build_pattern(attn_block_mask *m, int64_t pattern, int fn, int64_t w, const float *ids) {
  uint8_t *vis = malloc((size_t)(2 * m->prow * m->pcol)), *other = vis + m->prow * m->pcol;
  if (!vis) abort();
  attn_status st = ATTN_OK;
  for (int64_t qb = 0; qb < m->nqb && st == ATTN_OK; qb++)
    for (int64_t kb = 0; kb < m->nkb && st == ATTN_OK; kb++) {
      int64_t i0, ni, j0, nj;
      attn_block_mask_extent(m, qb, kb, &i0, &ni, &j0, &nj);
      if (fn == MASK_CAUSAL) attn_mask_causal(i0, ni, j0, nj, vis, m->pcol);
      else if (fn == MASK_WINDOW) attn_mask_sliding_window(w, i0, ni, j0, nj, vis, m->pcol);
      else attn_mask_document(ids, i0, ni, j0, nj, vis, m->pcol);
      if (fn == MASK_DOCUMENT_CAUSAL) {
        attn_mask_causal(i0, ni, j0, nj, other, m->pcol);
        attn_mask_combine(0, ni, nj, vis, other, m->pcol);
      }
      st = attn_block_mask_set(m, pattern, qb, kb, vis, m->pcol);
    }
  free(vis);
  return st;
}

/* Block kinds, sparsity and the dense pattern of each built-in against a
 * per-element loop, for blocks that divide L, that do not, and that are
 * larger than L. */
static void test_block_mask_classes(void) {
  const int64_t sizes[][3] = {{64, 64, 16}, {37, 45, 8}, {45, 37, 16}, {5, 3, 16}, {1, 100, 7}, {100, 1, 7}};
  float ids[100];
  for (int t = 0; t < 100; t++) ids[t] = (float)(t / 11 + (t > 50)); /* documents of 11 tokens, one of 7 */
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (int fn = MASK_CAUSAL; fn <= MASK_DOCUMENT_CAUSAL; fn++) {
      int64_t lq = sizes[z][0], lk = sizes[z][1], block = sizes[z][2], w = 6;
      char what[160];
      snprintf(what, sizeof what, "block mask %s, Lq %lld, Lk %lld, block %lld: ", mask_names[fn], (long long)lq,
               (long long)lk, (long long)block);
      size_t len = strlen(what);
      attn_block_mask m;
      if (attn_block_mask_init(&m, 1, 1, lq, lk, block, 1, 1) != ATTN_OK || build_pattern(&m, 0, fn, w, ids) != ATTN_OK) {
        snprintf(what + len, sizeof what - len, "built (%s)", attn_error_message());
        check(0, what);
        continue;
      }
      int kinds_ok = m.nqb == (lq + block - 1) / block && m.nkb == (lk + block - 1) / block;
      int64_t empty = 0;
      for (int64_t qb = 0; qb < m.nqb; qb++)
        for (int64_t kb = 0; kb < m.nkb; kb++) {
          int64_t seen = 0, n = 0;
          for (int64_t i = qb * block; i < (qb + 1) * block && i < lq; i++)
            for (int64_t j = kb * block; j < (kb + 1) * block && j < lk; j++, n++) seen += naive_visible(fn, i, j, w, ids);
          int want = seen == 0 ? ATTN_BLOCK_EMPTY : seen == n ? ATTN_BLOCK_FULL : ATTN_BLOCK_PARTIAL;
          kinds_ok &= m.kind[qb * m.nkb + kb] == want;
          empty += seen == 0;
        }
      snprintf(what + len, sizeof what - len, "empty / partial / full blocks as counted element by element");
      check(kinds_ok, what);
      snprintf(what + len, sizeof what - len, "sparsity = the empty blocks' fraction");
      check(attn_block_mask_sparsity(&m) == (double)empty / (double)(m.nqb * m.nkb), what);
      float *dense = malloc((size_t)(lq * lk) * sizeof *dense);
      if (!dense) abort();
      attn_block_mask_dense(&m, 0, dense);
      int dense_ok = 1;
      for (int64_t i = 0; i < lq; i++)
        for (int64_t j = 0; j < lk; j++) dense_ok &= dense[i * lk + j] == (float)naive_visible(fn, i, j, w, ids);
      snprintf(what + len, sizeof what - len, "its dense pattern is the per-element mask");
      check(dense_ok, what);
      free(dense);
      attn_block_mask_free(&m);
    }
}

/* Both kernels with a block mask (one pattern per head: sh = 2) against the
 * naive attention with the equivalent element mask; Lq != Lk, blocks that do
 * not divide them, and rows with no visible key (zeros). */
static void test_block_mask_attention(attn_generator *g) {
  enum { H = 2, E = 32, EV = 16, BLOCK = 16 };
  const int lens[][2] = {{70, 90}, {90, 70}};
  const int fns[H] = {MASK_DOCUMENT_CAUSAL, MASK_WINDOW};
  const int64_t w = 10;
  float ids[90];
  for (int t = 0; t < 90; t++) ids[t] = (float)(t / 23);
  for (int z = 0; z < 2; z++) {
    int lq = lens[z][0], lk = lens[z][1];
    float *q = filled(H * lq * E, g), *k = filled(H * lk * E, g), *v = filled(H * lk * EV, g);
    float *out = malloc((size_t)(H * lq * EV) * sizeof *out);
    double *want = malloc((size_t)(H * lq * EV) * sizeof *want);
    uint8_t *visible = malloc((size_t)(lq * lk));
    if (!out || !want || !visible) abort();
    attn_block_mask m;
    int built = attn_block_mask_init(&m, 1, H, lq, lk, BLOCK, 1, H) == ATTN_OK;
    for (int h = 0; h < H && built; h++) {
      built = build_pattern(&m, h, fns[h], w, ids) == ATTN_OK;
      for (int i = 0; i < lq; i++)
        for (int j = 0; j < lk; j++) visible[i * lk + j] = (uint8_t)naive_visible(fns[h], i, j, w, ids);
      naive_attention(q + h * lq * E, k + h * lk * E, v + h * lk * EV, lq, lk, E, EV, 0, visible,
                      want + h * lq * EV);
    }
    check(built, "block mask of one pattern per head built");
    int64_t sq[3] = {H, lq, E}, sk[3] = {H, lk, E}, sv[3] = {H, lk, EV}, so[3] = {H, lq, EV};
    attn_tensor tq = attn_make(q, 3, sq), tk = attn_make(k, 3, sk), tv = attn_make(v, 3, sv);
    attn_tensor to = attn_make(out, 3, so);
    for (int kernel = ATTN_SDPA_MATH; kernel <= ATTN_SDPA_FLASH && built; kernel++) {
      attn_sdpa_opts o = attn_sdpa_defaults();
      o.scale = 1.0f / sqrtf((float)E);
      o.block_mask = &m;
      memset(out, 0xff, (size_t)(H * lq * EV) * sizeof *out); /* NaN: every element must be written */
      attn_status st = attn_sdpa_run((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, NULL);
      double err = max_abs_diff(out, want, H * lq * EV);
      char what[160];
      snprintf(what, sizeof what, "%s attention, Lq %d, Lk %d, block mask (%s; %s) against naive double loops",
               kernel == ATTN_SDPA_MATH ? "math" : "flash", lq, lk, mask_names[fns[0]], mask_names[fns[1]]);
      if (st != ATTN_OK || !(err < 2e-5)) printf("  status %d, max |diff| %g\n", (int)st, err);
      check(st == ATTN_OK && err < 2e-5, what);
    }
    if (built) { /* a mask built for other sizes: refused, naming block_mask and both sizes */
      attn_block_mask other;
      attn_sdpa_opts o = attn_sdpa_defaults();
      o.scale = 1.0f;
      o.block_mask = &other;
      int ok = attn_block_mask_init(&other, 1, H, lq + 1, lk, BLOCK, 1, 1) == ATTN_OK;
      for (int kernel = ATTN_SDPA_MATH; kernel <= ATTN_SDPA_FLASH && ok; kernel++)
        ok = attn_sdpa_run((attn_sdpa_kernel)kernel, &tq, &tk, &tv, &o, &to, NULL) == ATTN_ESHAPE &&
             strstr(attn_error_message(), "block_mask") != NULL;
      if (ok) attn_block_mask_free(&other);
      check(ok, "a block mask built for another Lq is ATTN_ESHAPE naming block_mask (both kernels)");
      attn_block_mask_free(&m);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(want);
    free(visible);
  }
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

/* GPT-2's tokenizer from the shipped vocabulary (make test-core runs in the
 * repository root): tiktoken's gpt2 ids, the allowed end-of-text token, and
 * invalid UTF-8 named by its byte offset. */
static void test_tokenizer(void) {
  attn_tokenizer *tok;
  if (attn_tokenizer_load("data/gpt2/encoder.json", "data/gpt2/vocab.bpe", &tok) != ATTN_OK) {
    check(0, attn_error_message());
    return;
  }
  check(attn_tokenizer_n_vocab(tok) == 50257 && attn_tokenizer_eot(tok) == 50256, "GPT-2 has 50257 ids, eot 50256");
  const char *text = "Hello, world<|endoftext|>";
  int32_t ids[32];
  size_t n = 0;
  /* tiktoken: enc.encode("Hello, world<|endoftext|>", allowed_special="all") = [15496, 11, 995, 50256] */
  check(attn_tokenizer_encode(tok, text, strlen(text), 1, ids, &n) == ATTN_OK && n == 4 && ids[0] == 15496 &&
            ids[1] == 11 && ids[2] == 995 && ids[3] == 50256,
        "encode gives tiktoken's gpt2 ids");
  size_t len;
  const char *p = attn_tokenizer_token(tok, 15496, &len);
  check(len == 5 && memcmp(p, "Hello", 5) == 0, "token 15496 is 'Hello'");
  check(attn_tokenizer_encode(tok, "ok\xC3", 3, 0, ids, &n) == ATTN_EARG &&
            strstr(attn_error_message(), "byte offset 2") != NULL,
        "a cut UTF-8 sequence is an error naming its byte offset");
  attn_tokenizer_free(tok);
}

/* Every runnable kernel set's libm_exp_minus gives glibc's expf bits: on a
 * stride of all 2^32 float bit patterns (x - 0 = x), every special input, and
 * with a shift m (the difference rounded first, then expf), in rows of every
 * tail length. */
static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_libm_exp(void) {
  static const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN, 88.0f, 0x1.62e42ep6f,
                                   0x1.62e430p6f, 89.0f, -87.33654f, -88.0f, -0x1.9d1d9ep6f, -0x1.9d1da0p6f,
                                   -0x1.9d1d9cp6f, -0x1.9fe368p6f, -0x1.9fe36ap6f, -0x1.9fe366p6f, -104.0f, -1e30f,
                                   1e30f, 0x1p-149f, -0x1p-149f, 0x1p-126f, FLT_MIN, -FLT_MAX, FLT_MAX};
  const char *const *names = attn_cpu_available();
  for (int si = 0; names[si]; si++) {
    const attn_flash_kernels *k = attn_cpu_kernels_named(names[si]);
    if (!k) continue;
    int64_t n = 0, bad = 0;
    float x[1024], want[1024];
    for (uint64_t u = 0; u < (1ull << 32);) { /* a stride prime to every power of 2 */
      int64_t cnt = 0;
      for (; cnt < 1024 && u < (1ull << 32); cnt++, u += 4099) {
        uint32_t b = (uint32_t)u;
        memcpy(&x[cnt], &b, sizeof b);
        want[cnt] = expf(x[cnt]);
      }
      k->libm_exp_minus(x, cnt, 0.0f);
      for (int64_t i = 0; i < cnt; i++, n++) bad += !same_bits(x[i], want[i]);
    }
    int nsp = (int)(sizeof specials / sizeof specials[0]);
    for (int len = 1; len <= nsp; len++) /* every tail length, specials in every lane */
      for (int at = 0; at + len <= nsp; at += len) {
        memcpy(x, specials + at, (size_t)len * sizeof(float));
        x[len] = 12345.0f; /* past the row: untouched */
        k->libm_exp_minus(x, len, 0.0f);
        for (int i = 0; i < len; i++, n++) bad += !same_bits(x[i], expf(specials[at + i]));
        bad += x[len] != 12345.0f;
      }
    const float shifts[] = {3.5f, -2.25f, 80.0f, INFINITY, NAN};
    for (int sj = 0; sj < 5; sj++) {
      for (int i = 0; i < nsp; i++) x[i] = specials[i];
      k->libm_exp_minus(x, nsp, shifts[sj]);
      for (int i = 0; i < nsp; i++, n++) bad += !same_bits(x[i], expf(specials[i] - shifts[sj]));
    }
    char what[160];
    snprintf(what, sizeof what, "the %s set's libm_exp_minus gives expf's bits (%lld of %lld differ)", names[si],
             (long long)bad, (long long)n);
    check(bad == 0, what);
  }
}

int main(void) {
  attn_generator g;
  attn_rng_seed(&g, 123);
  test_views();
  test_broadcast_and_matmul(&g);
  test_softmax(&g);
  test_attention(&g);
  test_flash_threads(&g);
  test_gemm_bias(&g);
  test_gemm_threads(&g);
  test_visible_ranges();
  test_backward_strided_grads(&g);
  test_block_mask_classes();
  test_block_mask_attention(&g);
  test_rng();
  test_tokenizer();
  test_libm_exp();
  printf("core_test: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
