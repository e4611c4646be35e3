/* torch.matmul on top of cblas_sgemm, or of the project's own GEMM
 * (src/core/sgemm.h) where the AVX2 or AVX-512 kernel set runs and the
 * product is at least OWN_GEMM_MIN in every size. Strided operands go as
 * transpose flags when one of their matrix dims is unit-stride; only other
 * layouts are copied (once, into scratch). */
#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ops.h"
#include "sgemm.h"
#include "threads.h"

char *openblas_get_corename(void);
int openblas_get_num_threads(void);

const char *attn_blas_corename(void) { return openblas_get_corename(); }
int attn_blas_threads(void) { return openblas_get_num_threads(); }

/* The product is cut into tiles of at most TILE_M x TILE_N outputs (per batch
 * item), each one single-threaded cblas_sgemm, the tiles spread over OpenMP
 * threads. OpenBLAS's own threaded sgemm splits the work by the thread count
 * and its bits differ between 1 and 2 threads; tiles chosen by the shape
 * alone make the bits of every result the same for any OMP_NUM_THREADS. */
#define TILE_M 256
#define TILE_N 512
/* A product of at least SPLIT_MACS multiply-adds whose matrix has fewer
 * tiles than MIN_TILES gets smaller ones (rows first, then columns, halved
 * down to MIN_TILE): a Linear layer's weight gradient [out, in] summed over
 * thousands of rows is one full-size tile, all of it on one thread (in
 * train_gpt's step, a fifth of the products' work). Smaller products keep
 * whole tiles: cut up, their pieces would fall to OpenBLAS's small-matrix
 * kernels, whose bits differ between a transposed operand and a plain one
 * (as a cut product's ragged last tile may, like any TILE_M remainder). */
#define MIN_TILES 8
#define MIN_TILE 64
#define SPLIT_MACS (1 << 23)
/* OpenBLAS (0.3.21, SkylakeX) takes sgemm products of at most 100^3
 * multiply-adds to its small-matrix kernels */
#define GEMV_TILE_MACS 1000000

/* The tile of an [m, n] product over k: by the sizes alone (not the batch or
 * the threads), so attn_matmul and attn_gemm cut a product the same way. */
static void tile_shape(int64_t m, int64_t n, int64_t k, int64_t *tm, int64_t *tn) {
  int64_t rows = TILE_M, cols = TILE_N;
  if (m == 1) {
    /* one row (a decoding step's Linear layers): every weight is read once,
     * so the time is memory traffic; a tile of up to GEMV_TILE_MACS goes to
     * OpenBLAS's small-matrix kernel, which reads the weight in place, where
     * a larger one is first packed (copied) by sgemm, doubling the traffic */
    while (cols > MIN_TILE && (double)cols * (double)k > (double)GEMV_TILE_MACS) cols /= 2;
    *tm = rows, *tn = cols;
    return;
  }
  if ((double)m * (double)n * (double)k >= (double)SPLIT_MACS) {
    while (rows > MIN_TILE && ((m + rows - 1) / rows) * ((n + cols - 1) / cols) < MIN_TILES) rows /= 2;
    while (cols > MIN_TILE && ((m + rows - 1) / rows) * ((n + cols - 1) / cols) < MIN_TILES) cols /= 2;
  }
  *tm = rows, *tn = cols;
}

/* The own GEMM takes products with at least this many rows, columns and
 * terms: below, its 6 x 64 micro-tiles would be mostly padding, and a
 * decoding step's one-row products read the weight in place in OpenBLAS. */
#define OWN_GEMM_MIN 16

/* The GEMM for an [m, n] product over k: the chosen kernel set's own
 * (whose bits depend on none of the tiles, transposes or threads), or NULL
 * for cblas_sgemm. The sizes and the kernel set alone decide, the same in
 * attn_matmul and attn_gemm. Where the own GEMM cannot allocate its packing
 * buffers, that tile falls back to cblas_sgemm. */
static const attn_sgemm_set *own_gemm(int64_t m, int64_t n, int64_t k) {
#if defined(__x86_64__)
  if (m < OWN_GEMM_MIN || n < OWN_GEMM_MIN || k < OWN_GEMM_MIN) return NULL;
  const attn_flash_kernels *set = attn_cpu_kernels();
  if (set == &attn_kernels_avx512) return &attn_sgemm_set_avx512;
  if (set == &attn_kernels_avx2) return &attn_sgemm_set_avx2;
#else
  (void)m, (void)n, (void)k;
#endif
  return NULL;
}

/* Below this many multiply-adds in all, the tiles run on the calling thread. */
#define PARALLEL_MIN_FLOPS (64 * 64 * 64)

/* The rows of the own GEMM's micro-tiles (MR of src/core/kernels_gemm_avx2.c and kernels_gemm_avx512.c) */
#define OWN_GEMM_MR 6
/* Where the own GEMM's chunks of rows are handed out one at a time: about
 * CHUNKS_PER_THREAD per thread, of at most CHUNK_ROWS rows (half the
 * driver's block of rows: as fast in the step's products, and half the
 * wait at a region's end) */
#define CHUNKS_PER_THREAD 8
#define CHUNK_ROWS 48

/* The own GEMM's tiles of nb [m, n] products: its bits depend on no tile,
 * so the tiles follow the threads: columns in bands of up to TILE_N (what
 * bounds its packing buffer), rows in as many bands of whole micro-tiles
 * as there are threads left for each column band. Fewer, larger tiles pack
 * a transposed B (a Linear layer's weight) fewer times. */
static void own_tile_shape(int64_t nb, int64_t m, int64_t n, double work, int64_t *tm, int64_t *tn) {
  int64_t panels = (m + OWN_GEMM_MR - 1) / OWN_GEMM_MR;
  *tn = n < TILE_N ? n : TILE_N;
  int64_t col_tiles = nb * ((n + *tn - 1) / *tn), most;
  if (__builtin_mul_overflow(col_tiles, panels, &most)) most = INT64_MAX;
  int threads = work < (double)PARALLEL_MIN_FLOPS ? 1 : attn_threads_for(most);
  int64_t bands = col_tiles >= threads ? 1 : (threads + col_tiles - 1) / col_tiles;
  if (bands > panels) bands = panels;
  *tm = (panels + bands - 1) / bands * OWN_GEMM_MR;
}

attn_status attn_matmul_shape(const attn_tensor *a, const attn_tensor *b, int *ndim, int64_t *size) {
  char b1[200], b2[200];
  if (a->ndim == 0 || b->ndim == 0)
    return attn_fail(ATTN_ESHAPE, "both arguments need at least 1 dim, got %s and %s",
                     attn_shape_str(a, b1, sizeof b1), attn_shape_str(b, b2, sizeof b2));
  int64_t ka = a->size[a->ndim - 1];
  int64_t kb = b->ndim == 1 ? b->size[0] : b->size[b->ndim - 2];
  if (ka != kb)
    return attn_fail(ATTN_ESHAPE, "shapes %s and %s cannot be multiplied (%lld ~= %lld)",
                     attn_shape_str(a, b1, sizeof b1), attn_shape_str(b, b2, sizeof b2), (long long)ka,
                     (long long)kb);
  int na = a->ndim >= 2 ? a->ndim - 2 : 0, nb = b->ndim >= 2 ? b->ndim - 2 : 0;
  int nbatch;
  int64_t batch[ATTN_MAX_DIMS];
  attn_status st = attn_broadcast_shape(na, a->size, nb, b->size, &nbatch, batch);
  if (st != ATTN_OK)
    return attn_fail(ATTN_ESHAPE, "shapes %s and %s cannot be multiplied (batch dims do not broadcast)",
                     attn_shape_str(a, b1, sizeof b1), attn_shape_str(b, b2, sizeof b2));
  int n = 0;
  for (int i = 0; i < nbatch; i++) size[n++] = batch[i];
  if (a->ndim >= 2) size[n++] = a->size[a->ndim - 2];
  if (b->ndim >= 2) size[n++] = b->size[b->ndim - 1];
  if (n > ATTN_MAX_DIMS) return attn_fail(ATTN_ESHAPE, "result would have more than %d dims", ATTN_MAX_DIMS);
  *ndim = n;
  return ATTN_OK;
}

/* How a [rows, cols] matrix with strides (sr, sc) goes to row-major BLAS. */
static int blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, CBLAS_TRANSPOSE *tr, int64_t *ld) {
  if ((sc == 1 || cols == 1) && (sr >= (cols > 1 ? cols : 1) || rows == 1)) {
    *tr = CblasNoTrans;
    *ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
    return 1;
  }
  if ((sr == 1 || rows == 1) && (sc >= (rows > 1 ? rows : 1) || cols == 1)) {
    *tr = CblasTrans;
    *ld = cols == 1 ? (rows > 1 ? rows : 1) : sc;
    return 1;
  }
  return 0;
}

/* t as a batch of [r, c] matrices expanded to the batch shape; a contiguous
 * copy into *scratch when its layout cannot go to BLAS. */
typedef struct operand {
  attn_tensor t;  /* [batch..., r, c] */
  CBLAS_TRANSPOSE tr;
  int64_t ld;
} operand;

static attn_status prepare(operand *op, const attn_tensor *src, int nbatch, const int64_t *batch, float **scratch) {
  int64_t r = src->size[src->ndim - 2], c = src->size[src->ndim - 1];
  int64_t sr = src->stride[src->ndim - 2], sc = src->stride[src->ndim - 1];
  attn_tensor mat = *src;
  *scratch = NULL;
  if (!blas_layout(r, c, sr, sc, &op->tr, &op->ld)) {
    int64_t n = attn_numel(src);
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf) return attn_fail(ATTN_ENOMEM, "cannot allocate %lld bytes of scratch", (long long)n * 4);
    attn_tensor dense = attn_make(buf, src->ndim, src->size);
    attn_unary(ATTN_COPY, src, &dense);
    mat = dense;
    *scratch = buf;
    op->tr = CblasNoTrans;
    op->ld = c > 1 ? c : 1;
  }
  int64_t full[ATTN_MAX_DIMS];
  for (int i = 0; i < nbatch; i++) full[i] = batch[i];
  full[nbatch] = r;
  full[nbatch + 1] = c;
  return attn_expand(&mat, nbatch + 2, full, &op->t);
}

/* out[..., j] += bias[j] over a [rows, cols] tile of out (row stride ld) */
static void add_bias_tile(float *c, int64_t rows, int64_t cols, int64_t ld, const float *bias) {
  for (int64_t r = 0; r < rows; r++) {
    float *cr = c + r * ld;
    for (int64_t j = 0; j < cols; j++) cr[j] = cr[j] + bias[j];
  }
}

/* A batch of nb [m, n] products over k for the own GEMM: batch item bi's
 * op(a), op(b) and c (row-major, strides lda, ldb, ldc; trans flags as
 * attn_sgemm_fn's), through `at`. */
typedef struct own_batch {
  const attn_sgemm_set *set;
  int ta, tb;
  int64_t nb, m, n, k, lda, ldb, ldc;
  const float *bias;
  void (*at)(const void *ctx, int64_t bi, const float **a, const float **b, float **c);
  const void *ctx;
} own_batch;

/* Where B packed whole fits (src/core/sgemm_driver.h), the products in
 * chunks of rows handed out one at a time to the threads, each of which
 * packs a column band's B once and keeps it for every chunk of that band it
 * takes: a thread on a core the host slows down takes fewer chunks, where
 * fixed bands of rows left the other thread waiting at the region's end
 * (on the 2-core VM, most of a two-thread training step's waiting). The
 * bits are those of any other cut (src/core/sgemm.h). Returns 0 (nothing
 * done) where B is too large to keep packed (a weight gradient's over 2048
 * tokens: narrower column bands re-read A from memory, 1.4x slower), which
 * keeps the fixed tiles. */
static int own_chunks(const own_batch *p) {
  int64_t tn = p->n < TILE_N ? p->n : TILE_N, nct = (p->n + tn - 1) / tn, jobs = p->nb * nct;
  int64_t floats = p->set->whole_b_floats(tn, p->k);
  if (!floats) return 0;
  double work = (double)p->nb * (double)p->m * (double)p->n * (double)p->k;
  int64_t blocks = (p->m + CHUNK_ROWS - 1) / CHUNK_ROWS, most;
  if (__builtin_mul_overflow(jobs, blocks, &most)) most = INT64_MAX;
  int nthreads = work < (double)PARALLEL_MIN_FLOPS ? 1 : attn_threads_for(most);
  /* chunks of whole micro-tiles */
  int64_t per_job = (CHUNKS_PER_THREAD * (int64_t)nthreads + jobs - 1) / jobs;
  int64_t chunk = ((p->m + per_job - 1) / per_job + OWN_GEMM_MR - 1) / OWN_GEMM_MR * OWN_GEMM_MR;
  if (chunk > CHUNK_ROWS) chunk = CHUNK_ROWS;
  int64_t nch = (p->m + chunk - 1) / chunk, items;
  if (__builtin_mul_overflow(jobs, nch, &items)) return 0;
  int64_t handed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    omp_set_num_threads(1); /* BLAS single-threaded in here, as in attn_matmul */
    float *packed = NULL;
    int64_t held = -1, it; /* the job whose B is in packed */
    for (;;) {
#pragma omp atomic capture
      it = handed++;
      if (it >= items) break;
      int64_t job = it / nch, bi = job / nct, r0 = it % nch * chunk, c0 = job % nct * tn;
      int64_t rows = p->m - r0 < chunk ? p->m - r0 : chunk, cols = p->n - c0 < tn ? p->n - c0 : tn;
      const float *pa, *pb;
      float *pc;
      p->at(p->ctx, bi, &pa, &pb, &pc);
      pa += p->ta ? r0 : r0 * p->lda; /* rows r0.. of op(a) */
      pb += p->tb ? c0 * p->ldb : c0; /* columns c0.. of op(b) */
      pc += r0 * p->ldc + c0;
      const float *pbias = p->bias ? p->bias + c0 : NULL;
      if (!packed) packed = aligned_alloc(64, (size_t)floats * sizeof(float)); /* floats: a multiple of 16 */
      if (packed && held != job) {
        p->set->pack(p->tb, cols, p->k, pb, p->ldb, packed);
        held = job;
      }
      if (packed) {
        p->set->rows(p->ta, rows, cols, p->k, pa, p->lda, packed, pc, p->ldc, pbias);
      } else { /* no memory for the panels: this chunk in BLAS */
        cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans,
                    (blasint)rows, (blasint)cols, (blasint)p->k, 1.0f, pa, (blasint)p->lda, pb, (blasint)p->ldb,
                    0.0f, pc, (blasint)p->ldc);
        if (pbias) add_bias_tile(pc, rows, cols, p->ldc, pbias);
      }
    }
    free(packed);
  }
  return 1;
}

/* matmul_bias's operands: batch item bi of the expanded a and b, and of out */
typedef struct matmul_operands {
  const operand *a, *b;
  int nbatch;
  const int64_t *batch;
  float *out;
  int64_t m, n;
} matmul_operands;

static void matmul_at(const void *ctx, int64_t bi, const float **a, const float **b, float **c) {
  const matmul_operands *o = ctx;
  const float *pa = o->a->t.data, *pb = o->b->t.data;
  int64_t rem = bi;
  for (int d = o->nbatch - 1; d >= 0; d--) {
    int64_t i = rem % o->batch[d];
    rem /= o->batch[d];
    pa += i * o->a->t.stride[d];
    pb += i * o->b->t.stride[d];
  }
  *a = pa, *b = pb, *c = o->out + bi * o->m * o->n;
}

/* attn_gemm_bias's one product */
typedef struct gemm_operands {
  const float *a, *b;
  float *c;
} gemm_operands;

static void gemm_at(const void *ctx, int64_t bi, const float **a, const float **b, float **c) {
  const gemm_operands *o = ctx;
  (void)bi;
  *a = o->a, *b = o->b, *c = o->c;
}

/* attn_matmul, then + bias[j] in each tile as it is finished (bias NULL:
 * none; else contiguous, [n]) */
static attn_status matmul_bias(const attn_tensor *a, const attn_tensor *b, const float *bias, attn_tensor *out) {
  int ondim;
  int64_t osize[ATTN_MAX_DIMS];
  attn_status st = attn_matmul_shape(a, b, &ondim, osize);
  if (st != ATTN_OK) return st;
  if (out->ndim != ondim || !attn_is_contiguous(out)) return attn_fail(ATTN_ESHAPE, "bad matmul output");
  for (int i = 0; i < ondim; i++)
    if (out->size[i] != osize[i]) return attn_fail(ATTN_ESHAPE, "bad matmul output shape");

  /* 1-D operands become [1, k] and [k, 1] matrices */
  attn_tensor a2 = *a, b2 = *b;
  if (a->ndim == 1) {
    a2.ndim = 2;
    a2.size[1] = a->size[0];
    a2.stride[1] = a->stride[0];
    a2.size[0] = 1;
    a2.stride[0] = 0;
  }
  if (b->ndim == 1) {
    b2.ndim = 2;
    b2.size[0] = b->size[0];
    b2.stride[0] = b->stride[0];
    b2.size[1] = 1;
    b2.stride[1] = 0;
  }
  /* [..., m, k] @ [k, n]: when a's leading dims fold into its rows without a
   * copy, the whole product is one GEMM of (prod(...) * m) rows (Linear layers). */
  if (b2.ndim == 2 && a2.ndim > 2) {
    int64_t rows = attn_sizes_product(a2.ndim - 1, a2.size), flat[2], fstride[2];
    flat[0] = rows;
    flat[1] = a2.size[a2.ndim - 1];
    if (attn_view_strides(&a2, 2, flat, fstride)) {
      attn_tensor folded = a2;
      folded.ndim = 2;
      folded.size[0] = flat[0];
      folded.size[1] = flat[1];
      folded.stride[0] = fstride[0];
      folded.stride[1] = fstride[1];
      a2 = folded;
    }
  }
  int64_t m = a2.size[a2.ndim - 2], k = a2.size[a2.ndim - 1], n = b2.size[b2.ndim - 1];
  int nbatch;
  int64_t batch[ATTN_MAX_DIMS];
  st = attn_broadcast_shape(a2.ndim - 2, a2.size, b2.ndim - 2, b2.size, &nbatch, batch);
  if (st != ATTN_OK) return st;
  int64_t nb = attn_sizes_product(nbatch, batch);
  if (nb == 0 || m == 0 || n == 0) return ATTN_OK;
  if (k == 0) {
    attn_status fs = attn_fill(out, 0.0f);
    if (fs == ATTN_OK && bias) add_bias_tile(out->data, nb * m, n, n, bias);
    return fs;
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
    return attn_fail(ATTN_EOVERFLOW, "matrix sizes %lld x %lld x %lld exceed the BLAS integer range", (long long)m,
                     (long long)k, (long long)n);

  operand oa, ob;
  float *sa = NULL, *sb = NULL;
  if ((st = prepare(&oa, &a2, nbatch, batch, &sa)) != ATTN_OK) return st;
  if ((st = prepare(&ob, &b2, nbatch, batch, &sb)) != ATTN_OK) {
    free(sa);
    return st;
  }
  if (oa.ld > INT_MAX || ob.ld > INT_MAX) {
    free(sa);
    free(sb);
    return attn_fail(ATTN_EOVERFLOW, "a matrix stride exceeds the BLAS integer range");
  }
  const attn_sgemm_set *set = own_gemm(m, n, k);
  if (set) {
    matmul_operands ops = {&oa, &ob, nbatch, batch, out->data, m, n};
    own_batch ob1 = {set, oa.tr == CblasTrans, ob.tr == CblasTrans, nb, m, n, k, oa.ld, ob.ld, n, bias,
                     matmul_at, &ops};
    if (own_chunks(&ob1)) {
      free(sa);
      free(sb);
      return ATTN_OK;
    }
  }
  attn_sgemm_fn own = set ? set->gemm : NULL;
  int64_t tm, tn;
  double work = (double)nb * (double)m * (double)n * (double)k;
  if (own) own_tile_shape(nb, m, n, work, &tm, &tn);
  else tile_shape(m, n, k, &tm, &tn);
  int64_t mt = (m + tm - 1) / tm, nt = (n + tn - 1) / tn, items;
  if (__builtin_mul_overflow(nb, mt * nt, &items)) items = INT64_MAX; /* never: out holds nb*m*n floats */
  int nthreads = work < (double)PARALLEL_MIN_FLOPS ? 1 : attn_threads_for(items);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    /* BLAS single-threaded in here, even in a team of one (the region's own ICV) */
    omp_set_num_threads(1);
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t bi = it / (mt * nt), r0 = (it % (mt * nt)) / nt * tm, c0 = it % nt * tn;
      int64_t rows = m - r0 < tm ? m - r0 : tm, cols = n - c0 < tn ? n - c0 : tn;
      const float *pa = oa.t.data, *pb = ob.t.data;
      int64_t rem = bi;
      for (int d = nbatch - 1; d >= 0; d--) {
        int64_t i = rem % batch[d];
        rem /= batch[d];
        pa += i * oa.t.stride[d];
        pb += i * ob.t.stride[d];
      }
      pa += oa.tr == CblasNoTrans ? r0 * oa.ld : r0; /* rows r0.. of op(a) */
      pb += ob.tr == CblasNoTrans ? c0 : c0 * ob.ld; /* columns c0.. of op(b) */
      float *pc = out->data + bi * m * n + r0 * n + c0;
      const float *pbias = bias ? bias + c0 : NULL;
      if (own && own(oa.tr == CblasTrans, ob.tr == CblasTrans, rows, cols, k, pa, oa.ld, pb, ob.ld, pc, n, pbias))
        continue;
      cblas_sgemm(CblasRowMajor, oa.tr, ob.tr, (blasint)rows, (blasint)cols, (blasint)k, 1.0f, pa, (blasint)oa.ld,
                  pb, (blasint)ob.ld, 0.0f, pc, (blasint)n);
      if (pbias) add_bias_tile(pc, rows, cols, n, pbias);
    }
  }
  free(sa);
  free(sb);
  return ATTN_OK;
}

attn_status attn_matmul(const attn_tensor *a, const attn_tensor *b, attn_tensor *out) {
  return matmul_bias(a, b, NULL, out);
}

attn_status attn_matmul_add_bias(const attn_tensor *a, const attn_tensor *b, const attn_tensor *bias,
                                 attn_tensor *out) {
  int64_t n = out->ndim ? out->size[out->ndim - 1] : 1;
  if (b->ndim < 2 || out->ndim < 1 || bias->ndim != 1 || bias->size[0] != n || !attn_is_contiguous(bias))
    return attn_fail(ATTN_ESHAPE, "bias must be a contiguous [%lld] vector", (long long)n);
  return matmul_bias(a, b, bias->data, out);
}

int attn_gemm_is_own(int64_t m, int64_t n, int64_t k) { return own_gemm(m, n, k) != NULL; }

void attn_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc) {
  attn_gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, NULL, c, ldc);
}

void attn_gemm_bias(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const attn_sgemm_set *set = k > 0 ? own_gemm(m, n, k) : NULL;
  if (set) {
    gemm_operands ops = {a, b, c};
    own_batch one = {set, trans_a, trans_b, 1, m, n, k, lda, ldb, ldc, bias, gemm_at, &ops};
    if (own_chunks(&one)) return;
  }
  attn_sgemm_fn own = set ? set->gemm : NULL;
  int64_t tm, tn;
  double work = (double)m * (double)n * (double)k;
  if (own) own_tile_shape(1, m, n, work, &tm, &tn);
  else tile_shape(m, n, k, &tm, &tn);
  int64_t mt = (m + tm - 1) / tm, nt = (n + tn - 1) / tn, items = mt * nt;
  int nthreads = work < (double)PARALLEL_MIN_FLOPS ? 1 : attn_threads_for(items);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    omp_set_num_threads(1); /* BLAS single-threaded in here, as in attn_matmul */
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t r0 = it / nt * tm, c0 = it % nt * tn;
      int64_t rows = m - r0 < tm ? m - r0 : tm, cols = n - c0 < tn ? n - c0 : tn;
      const float *pa = a + (trans_a ? r0 : r0 * lda), *pb = b + (trans_b ? c0 * ldb : c0);
      float *pc = c + r0 * ldc + c0;
      const float *pbias = bias ? bias + c0 : NULL;
      if (k == 0) {
        for (int64_t r = 0; r < rows; r++) memset(pc + r * ldc, 0, (size_t)cols * sizeof(float));
      } else {
        if (own && own(trans_a, trans_b, rows, cols, k, pa, lda, pb, ldb, pc, ldc, pbias)) continue;
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)rows, (blasint)cols, (blasint)k, 1.0f, pa, (blasint)lda, pb,
                    (blasint)ldb, 0.0f, pc, (blasint)ldc);
      }
      if (pbias) add_bias_tile(pc, rows, cols, ldc, pbias);
    }
  }
}
