/* Which flash kernel set runs (src/core/cpu.h): the best one the CPU supports
 * (cpuid through __builtin_cpu_supports, which also checks that the OS saves
 * the AVX / AVX-512 registers), or the one ATTN_CPU names. Chosen once; the
 * pointer is then only read. */
#include <omp.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cpu.h"

static const attn_flash_kernels *chosen;
static const char *forced; /* the ATTN_CPU value that forced `chosen` */
static pthread_mutex_t choose_lock = PTHREAD_MUTEX_INITIALIZER;

/* The sets this CPU runs, best last. */
static const attn_flash_kernels *const *runnable(int *n) {
  static const attn_flash_kernels *sets[3];
  static int count = -1;
  if (count < 0) { /* under choose_lock */
    int c = 0;
    sets[c++] = &attn_kernels_scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) sets[c++] = &attn_kernels_avx2;
    if (__builtin_cpu_supports("avx512f")) sets[c++] = &attn_kernels_avx512;
#endif
    count = c;
  }
  *n = count;
  return sets;
}

static const char *const *runnable_names(void) {
  int n;
  const attn_flash_kernels *const *sets = runnable(&n);
  static const char *names[4];
  for (int i = 0; i < n; i++) names[i] = sets[i]->name;
  names[n] = NULL;
  return names;
}

static attn_status select_locked(const char *choice) {
  int n;
  const attn_flash_kernels *const *sets = runnable(&n);
  const attn_flash_kernels *want = NULL;
  int automatic = choice == NULL || choice[0] == '\0' || strcmp(choice, "auto") == 0;
  if (automatic) {
    want = sets[n - 1];
  } else {
    for (int i = 0; i < n; i++)
      if (strcmp(choice, sets[i]->name) == 0) want = sets[i];
    if (!want) {
      char list[64] = "";
      for (int i = 0; i < n; i++) {
        strcat(list, sets[i]->name);
        strcat(list, ", ");
      }
      int known = strcmp(choice, "scalar") == 0 || strcmp(choice, "avx2") == 0 || strcmp(choice, "avx512") == 0;
      if (known)
        return attn_fail(ATTN_EARG, "ATTN_CPU=%s: this CPU or build cannot run the %s kernels (it can run: %sor auto)",
                         choice, choice, list);
      return attn_fail(ATTN_EARG, "ATTN_CPU=%.40s%s: unknown kernel choice (expected one of %sor auto)", choice,
                       strlen(choice) > 40 ? "..." : "", list);
    }
  }
  if (chosen && chosen != want)
    return attn_fail(ATTN_EARG, "ATTN_CPU=%s: the %s kernels were already chosen in this process", choice ? choice : "",
                     chosen->name);
  __atomic_store_n(&chosen, want, __ATOMIC_RELEASE);
  if (!automatic) forced = want->name;
  return ATTN_OK;
}

attn_status attn_cpu_select(const char *choice) {
  pthread_mutex_lock(&choose_lock);
  attn_status st = select_locked(choice);
  pthread_mutex_unlock(&choose_lock);
  return st;
}

const attn_flash_kernels *attn_cpu_kernels(void) {
  const attn_flash_kernels *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
  if (k) return k;
  pthread_mutex_lock(&choose_lock);
  if (!chosen) select_locked(NULL);
  k = chosen;
  pthread_mutex_unlock(&choose_lock);
  return k;
}

const char *const *attn_cpu_available(void) {
  pthread_mutex_lock(&choose_lock);
  const char *const *names = runnable_names();
  pthread_mutex_unlock(&choose_lock);
  return names;
}

const char *attn_cpu_forced(void) {
  pthread_mutex_lock(&choose_lock);
  const char *f = forced;
  pthread_mutex_unlock(&choose_lock);
  return f;
}

const attn_flash_kernels *attn_cpu_kernels_named(const char *name) {
  const attn_flash_kernels *found = NULL;
  pthread_mutex_lock(&choose_lock);
  int n;
  const attn_flash_kernels *const *sets = runnable(&n);
  for (int i = 0; i < n; i++)
    if (name && strcmp(name, sets[i]->name) == 0) found = sets[i];
  pthread_mutex_unlock(&choose_lock);
  return found;
}

int attn_cpu_avx512_full_width(void) {
#if defined(__x86_64__)
  int n;
  pthread_mutex_lock(&choose_lock);
  runnable(&n); /* initialises __builtin_cpu_supports */
  pthread_mutex_unlock(&choose_lock);
  if (!__builtin_cpu_supports("avx512f")) return 0;
  if (__builtin_cpu_is("amd")) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    unsigned family = (eax >> 8) & 0xF;
    if (family == 0xF) family += (eax >> 20) & 0xFF;
    return family >= 0x1A; /* Zen 4 (0x19) splits a 512-bit FMA in two halves; Zen 5 (0x1A) does not */
  }
  return 1; /* Intel (and others) with AVX-512F: assumed two full-width ports */
#else
  return 0;
#endif
}

/* Most lanes any set's fma_chains uses. */
#define FMA_MAX_LANES 512

/* One round of fma_chains, n steps on every thread: wall seconds; *team gets
 * the threads that ran, *checksum the sum of their final lanes. */
static double fma_round(const attn_flash_kernels *k, int threads, int64_t n, int *team, double *checksum) {
  double sum = 0.0;
  int ran = 1;
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    float x[FMA_MAX_LANES];
    int t = omp_get_thread_num();
    if (t == 0) ran = omp_get_num_threads();
    /* distinct starting values per lane and thread; x = x / 2 + 1 stays
     * normal (it tends to 2), so no subnormal slows a lane down */
    for (int i = 0; i < k->fma_lanes; i++) x[i] = 1.0f + (float)((i + t) % 8) * 0.125f;
    k->fma_chains(x, n, 0.5f, 1.0f);
    for (int i = 0; i < k->fma_lanes; i++) sum += (double)x[i];
  }
  double dt = omp_get_wtime() - t0;
  *team = ran;
  *checksum = sum;
  return dt;
}

attn_fma_peak attn_cpu_fma_peak(double round_seconds, int rounds, int threads) {
  const attn_flash_kernels *k = attn_cpu_kernels();
  attn_fma_peak r = {0.0, 0.0, 0.0, 0, 0, k->fma_lanes};
  if (k->fma_lanes > FMA_MAX_LANES) return r; /* no set is wider: cannot happen */
  if (threads <= 0) threads = omp_get_max_threads();
  if (!(round_seconds > 0.0)) round_seconds = 0.01;
  if (rounds < 1) rounds = 1;
  /* the steps per round: doubled from 2^16 while the faster of two rounds
   * stays under round_seconds (one round slowed by a thread waiting for its
   * core on a shared machine would otherwise stop the doubling early and
   * leave rounds that time the threads' wake-up, not the FMAs) */
  int64_t n = (int64_t)1 << 16;
  int team = 1;
  double sum = 0.0;
  for (; n < ((int64_t)1 << 40); n *= 2) {
    double t1 = fma_round(k, threads, n, &team, &sum);
    double t2 = fma_round(k, threads, n, &team, &sum);
    if ((t1 < t2 ? t1 : t2) >= round_seconds) break;
  }
  for (int i = 0; i < rounds; i++) {
    double dt = fma_round(k, threads, n, &team, &sum);
    double gflops = 2.0 * (double)k->fma_lanes * (double)n * team / (dt > 0.0 ? dt : 1e-9) / 1e9;
    if (gflops > r.gflops) {
      r.gflops = gflops;
      r.seconds = dt;
    }
  }
  r.checksum = sum;
  r.steps = n;
  r.threads = team;
  return r;
}
