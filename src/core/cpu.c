/* Which flash kernel set runs (src/core/cpu.h): the best one the CPU supports
 * (cpuid through __builtin_cpu_supports, which also checks that the OS saves
 * the AVX / AVX-512 registers), or the one ATTN_CPU names. Chosen once; the
 * pointer is then only read. */
#include <pthread.h>
#include <stddef.h>
#include <string.h>

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
