/* llm.c's CPU GPT-2 training step (karpathy/llm.c train_gpt2.c, compiled
 * unchanged with -DTESTING so that its own main is left out) at the size of
 * scripts/bench.lua's train_gpt case, printing bench.lua's JSON fields.
 * Built and run by scripts/bench_llmc.sh:
 *   bench_llmc REPS LLMC_COMMIT CFLAGS
 * The model (vocab 256, context 128, 128 wide, 4 heads, 4 layers) gets random
 * weights in llm.c's checkpoint format (GPT-2's init: normal(0, 0.02), the
 * LayerNorms 1 and 0), written to a temporary file and read back by llm.c's
 * own gpt2_build_from_checkpoint. A step is llm.c's training loop's:
 * gpt2_forward with targets, gpt2_zero_grad, gpt2_backward, gpt2_update
 * (lr 1e-4, weight decay 0.1 as bench.lua's AdamW). ms is the best of REPS
 * steps after one warm-up step; gflops uses bench.lua's count for train_gpt. */
#define TESTING
#include "train_gpt2.c"

#include <fcntl.h>
#include <sys/resource.h>

enum { VOCAB = 256, CTX = 128, WIDTH = 128, HEADS = 4, LAYERS = 4, BATCH = 16 };

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

/* xorshift64*: uniform in (0, 1) */
static double uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((double) ((rng_state * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) / 9007199254740992.0;
}

static float normal(double std) {
    return (float) (std * sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

/* the header and parameters in gpt2_build_from_checkpoint's layout */
static void write_checkpoint(const char *path) {
    GPT2Config cfg = {.max_seq_len = CTX, .vocab_size = VOCAB, .padded_vocab_size = VOCAB, .num_layers = LAYERS,
                      .num_heads = HEADS, .channels = WIDTH};
    size_t sizes[NUM_PARAMETER_TENSORS];
    fill_in_parameter_sizes(sizes, cfg);
    int header[256] = {0};
    header[0] = 20240326;
    header[1] = 3;
    header[2] = CTX;
    header[3] = VOCAB;
    header[4] = LAYERS;
    header[5] = HEADS;
    header[6] = WIDTH;
    header[7] = VOCAB;
    FILE *f = fopenCheck(path, "wb");
    if (fwrite(header, sizeof(int), 256, f) != 256) { fprintf(stderr, "bench_llmc: writing %s failed\n", path); exit(1); }
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        /* ln1w, ln2w, lnfw: ones; ln1b, ln2b, lnfb and the biases: zeros; the rest normal(0, 0.02) */
        int ones = t == 2 || t == 8 || t == 14;
        int zeros = t == 3 || t == 5 || t == 7 || t == 9 || t == 11 || t == 13 || t == 15;
        for (size_t i = 0; i < sizes[t]; i++) {
            float x = ones ? 1.0f : zeros ? 0.0f : normal(0.02);
            if (fwrite(&x, sizeof x, 1, f) != 1) { fprintf(stderr, "bench_llmc: writing %s failed\n", path); exit(1); }
        }
    }
    fcloseCheck(f);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void step(GPT2 *model, int *inputs, int *targets, int t) {
    gpt2_forward(model, inputs, targets, BATCH, CTX);
    gpt2_zero_grad(model);
    gpt2_backward(model);
    gpt2_update(model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench_llmc REPS LLMC_COMMIT CFLAGS\n");
        return 2;
    }
    int reps = atoi(argv[1]);
    if (reps < 1) {
        fprintf(stderr, "bench_llmc: REPS wants a positive integer, got '%s'\n", argv[1]);
        return 2;
    }
    char path[] = "/tmp/bench_llmc_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("bench_llmc: mkstemp"); return 1; }
    close(fd);
    write_checkpoint(path);

    /* llm.c prints its config and sizes on stdout: keep stdout for the JSON line */
    fflush(stdout);
    int saved_stdout = dup(1);
    int devnull = open("/dev/null", O_WRONLY);
    if (saved_stdout < 0 || devnull < 0 || dup2(devnull, 1) < 0) { perror("bench_llmc: redirecting stdout"); return 1; }

    GPT2 model;
    gpt2_build_from_checkpoint(&model, path);
    remove(path);
    int inputs[BATCH * CTX], targets[BATCH * CTX];
    for (int i = 0; i < BATCH * CTX; i++) {
        inputs[i] = (int) (uniform() * VOCAB);
        targets[i] = (int) (uniform() * VOCAB);
    }
    step(&model, inputs, targets, 1); /* warm-up: allocates the activations, gradients and moments */
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        step(&model, inputs, targets, r + 2);
        double dt = now_ms() - t0;
        if (dt < best) best = dt;
    }
    float loss = model.mean_loss;
    gpt2_free(&model);

    fflush(stdout);
    if (dup2(saved_stdout, 1) < 0) { perror("bench_llmc: restoring stdout"); return 1; }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int threads = 1;
#ifdef OMP
    threads = omp_get_max_threads();
#endif
    /* bench.lua's count: 6 flops per weight and token in the Linear layers
     * (forward 2, backward 4), 12 per score and channel in the attention
     * (forward 4, backward 8, counted dense) */
    double linear = (double) LAYERS * 12 * WIDTH * WIDTH + (double) WIDTH * VOCAB;
    double flops = 6.0 * linear * BATCH * CTX + 12.0 * LAYERS * BATCH * HEADS * CTX * CTX * (WIDTH / HEADS);
    printf("{\"case\": \"train_gpt\", \"kernel\": \"llm.c\", \"b\": %d, \"h\": %d, \"lq\": %d, \"lk\": %d, \"e\": %d, "
           "\"causal\": true, \"threads\": %d, \"ms\": %.4g, \"gflops\": %.4g, \"cflags\": \"%s\", \"llmc_commit\": \"%s\", "
           "\"loss\": %.4g, \"peak_rss_mb\": %.4g, \"tokens_per_s\": %.4g}\n",
           BATCH, HEADS, CTX, CTX, WIDTH / HEADS, threads, best, flops / (best * 1e6), argv[3], argv[2], loss,
           ru.ru_maxrss / 1024.0, BATCH * CTX / (best / 1000));
    return 0;
}
