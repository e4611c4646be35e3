/* The thread cap of threads.h. */
#include "threads.h"

#include <omp.h>
#include <unistd.h>

/* The ceiling from the online CPUs, read once: sysconf reads /sys on every call, too slow for
 * every elementwise op. A race on first use is benign (both threads store
 * the same value). */
static int thread_ceiling(void) {
  static int cached;
  int n = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (n > 0) return n;
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  n = c < ATTN_MIN_THREAD_CEILING ? ATTN_MIN_THREAD_CEILING : c > ATTN_MAX_THREADS ? ATTN_MAX_THREADS : (int)c;
  __atomic_store_n(&cached, n, __ATOMIC_RELAXED);
  return n;
}

int attn_threads_for(int64_t items) {
  if (items < 2 || omp_in_parallel()) return 1;
  int n = omp_get_max_threads();
  int ceiling = thread_ceiling();
  if (n > ceiling) n = ceiling;
  if (n < 1) n = 1;
  if (items < n) n = (int)items;
  return n;
}
