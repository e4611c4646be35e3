/* Times ggml's CPU ggml_flash_attn_ext on one attention case of scripts/bench.lua
 * and prints one JSON line with bench.lua's fields. Built and run by
 * scripts/bench_ggml.sh against a ggml checkout; not part of attn's build.
 *
 *   bench_ggml CASE THREADS REPS COMMIT
 *
 * CASE is A, A_causal, B, B_causal or C_causal (bench.lua's shapes). Q, K, V
 * are F32 in ggml's layout [E, L, H, B]; the op runs at GGML_PREC_F32 with
 * scale 1/sqrt(E); causal cases pass ggml's F16 mask [Lk, Lq] (0 visible,
 * -inf hidden), as llama.cpp does. One graph, work buffer and threadpool are
 * made once and reused, as in a long-running process; ms is the best of REPS
 * timed calls after one warm-up call. After timing, rows of the output are
 * checked against a double-precision softmax(q k^T / sqrt(E)) v computed here,
 * so the timed call is known to compute the same attention as attn's. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ggml.h"
#include "ggml-cpu.h"

struct bench_case {
    const char *name;
    int64_t b, h, n, e;
    int causal;
};

static const struct bench_case bench_cases[] = {
    { "A", 4, 12, 1024, 64, 0 },       { "A_causal", 4, 12, 1024, 64, 1 },
    { "B", 1, 8, 4096, 64, 0 },        { "B_causal", 1, 8, 4096, 64, 1 },
    { "C_causal", 1, 8, 16384, 64, 1 },
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec * 1e-6;
}

/* inputs: a fixed LCG mapped to roughly N(0, 1) (sum of four uniforms), so
 * every run times the same numbers */
static uint64_t lcg_state = 0x2545F4914F6CDD1DULL;

static float next_gaussianish(void) {
    double sum = 0.0;
    for (int i = 0; i < 4; i++) {
        lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
        sum += (double) (lcg_state >> 40) / (double) (1ULL << 24);
    }
    return (float) ((sum - 2.0) * 1.7320508075688772); /* variance 4/12 -> 1 */
}

static void fill(struct ggml_tensor *t) {
    float *p = (float *) t->data;
    int64_t count = ggml_nelements(t);
    for (int64_t i = 0; i < count; i++) p[i] = next_gaussianish();
}

/* element (e, l, h, b) of a contiguous F32 tensor laid out [E, L, H, B] */
static float at(const struct ggml_tensor *t, int64_t e, int64_t l, int64_t h, int64_t b) {
    return *(const float *) ((const char *) t->data + e * t->nb[0] + l * t->nb[1] + h * t->nb[2] + b * t->nb[3]);
}

/* largest |ggml - reference| over output row `row` of head `head`, batch `batch`;
 * the output is [E, H, L, B] (ggml permutes it) */
static double row_error(const struct ggml_tensor *q, const struct ggml_tensor *k, const struct ggml_tensor *v,
                        const struct ggml_tensor *out, const struct bench_case *c, int64_t batch, int64_t head,
                        int64_t row, double *scores, double *want) {
    int64_t visible = c->causal ? row + 1 : c->n;
    double scale = 1.0 / sqrt((double) c->e), max_score = -INFINITY, total = 0.0, worst = 0.0;
    for (int64_t j = 0; j < visible; j++) {
        double dot = 0.0;
        for (int64_t d = 0; d < c->e; d++) dot += (double) at(q, d, row, head, batch) * (double) at(k, d, j, head, batch);
        scores[j] = dot * scale;
        if (scores[j] > max_score) max_score = scores[j];
    }
    for (int64_t j = 0; j < visible; j++) {
        scores[j] = exp(scores[j] - max_score);
        total += scores[j];
    }
    for (int64_t d = 0; d < c->e; d++) want[d] = 0.0;
    for (int64_t j = 0; j < visible; j++)
        for (int64_t d = 0; d < c->e; d++) want[d] += scores[j] / total * (double) at(v, d, j, head, batch);
    for (int64_t d = 0; d < c->e; d++) {
        double got = (double) at(out, d, head, row, batch);
        double err = fabs(got - want[d]);
        if (!(err <= worst)) worst = err; /* NaN counts as the worst */
    }
    return worst;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: bench_ggml CASE THREADS REPS COMMIT\n");
        return 2;
    }
    const struct bench_case *c = NULL;
    for (size_t i = 0; i < sizeof bench_cases / sizeof bench_cases[0]; i++)
        if (strcmp(argv[1], bench_cases[i].name) == 0) c = &bench_cases[i];
    int threads = atoi(argv[2]), reps = atoi(argv[3]);
    const char *commit = argv[4];
    if (c == NULL || threads < 1 || reps < 1) {
        fprintf(stderr, "bench_ggml: unknown case '%s' or bad THREADS/REPS ('%s', '%s')\n", argv[1], argv[2], argv[3]);
        return 2;
    }

    size_t qkv_bytes = (size_t) (c->b * c->h * c->n * c->e) * sizeof(float);
    size_t mask_bytes = c->causal ? (size_t) (c->n * c->n) * sizeof(ggml_fp16_t) : 0;
    struct ggml_init_params init = {
        .mem_size = 4 * qkv_bytes + mask_bytes + ggml_graph_overhead() + 8 * ggml_tensor_overhead() + (1 << 20),
        .mem_buffer = NULL,
        .no_alloc = false,
    };
    struct ggml_context *ctx = ggml_init(init);
    if (ctx == NULL) {
        fprintf(stderr, "bench_ggml: ggml_init could not allocate %zu bytes\n", init.mem_size);
        return 1;
    }
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->e, c->n, c->h, c->b);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->e, c->n, c->h, c->b);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->e, c->n, c->h, c->b);
    fill(q);
    fill(k);
    fill(v);
    struct ggml_tensor *mask = NULL;
    if (c->causal) {
        /* one [Lk, Lq] mask broadcast over heads and batches */
        mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, c->n, c->n);
        ggml_fp16_t visible = ggml_fp32_to_fp16(0.0f), hidden = ggml_fp32_to_fp16(-INFINITY);
        ggml_fp16_t *m = (ggml_fp16_t *) mask->data;
        for (int64_t i = 0; i < c->n; i++)
            for (int64_t j = 0; j < c->n; j++) m[i * c->n + j] = j <= i ? visible : hidden;
    }
    struct ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float) c->e), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);

    struct ggml_threadpool_params pool_params = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&pool_params);
    struct ggml_cplan plan = ggml_graph_plan(graph, threads, pool);
    uint8_t *work = plan.work_size > 0 ? malloc(plan.work_size) : NULL;
    if (plan.work_size > 0 && work == NULL) {
        fprintf(stderr, "bench_ggml: cannot allocate %zu bytes of work buffer\n", plan.work_size);
        return 1;
    }
    plan.work_data = work;

    double best = INFINITY;
    for (int rep = 0; rep <= reps; rep++) { /* rep 0 is the warm-up */
        double t0 = now_ms();
        if (ggml_graph_compute(graph, &plan) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "bench_ggml: ggml_graph_compute failed\n");
            return 1;
        }
        double dt = now_ms() - t0;
        if (rep > 0 && dt < best) best = dt;
    }

    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double peak_rss_mb = (double) usage.ru_maxrss / 1024.0;

    /* check rows: first, last and a spread between, in the first and last head and batch */
    double *scores = malloc((size_t) c->n * sizeof(double)), *want = malloc((size_t) c->e * sizeof(double));
    if (scores == NULL || want == NULL) {
        fprintf(stderr, "bench_ggml: cannot allocate the check's scratch\n");
        return 1;
    }
    double worst = 0.0;
    int64_t rows[] = { 0, 1, 15, 16, 63, 64, c->n / 3, c->n / 2 + 7, c->n - 2, c->n - 1 };
    int64_t heads[] = { 0, c->h - 1 }, batches[] = { 0, c->b - 1 };
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t hi = 0; hi < 2; hi++)
            for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                double err = row_error(q, k, v, out, c, batches[bi], heads[hi], rows[ri], scores, want);
                if (!(err <= worst)) worst = err;
            }
    free(scores);
    free(want);
    if (!(worst <= 1e-4)) {
        fprintf(stderr, "bench_ggml: %s: ggml's output differs from the reference by %g (limit 1e-4)\n", c->name, worst);
        return 1;
    }

    printf("{\"case\": \"%s\", \"kernel\": \"ggml\", \"b\": %lld, \"h\": %lld, \"lq\": %lld, \"lk\": %lld, \"e\": %lld, "
           "\"causal\": %s, \"threads\": %d, \"ms\": %.4g, \"gflops\": %.4g, \"ggml_commit\": \"%s\", "
           "\"max_abs_error\": %.3g, \"peak_rss_mb\": %.4g}\n",
           c->name, (long long) c->b, (long long) c->h, (long long) c->n, (long long) c->n, (long long) c->e,
           c->causal ? "true" : "false", threads, best,
           4.0 * (double) (c->b * c->h * c->n * c->n * c->e) / (best * 1e6), commit, worst, peak_rss_mb);

    free(work);
    ggml_threadpool_free(pool);
    ggml_free(ctx);
    return 0;
}
