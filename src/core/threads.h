/* How many OpenMP threads a parallel region may use: the one place that caps
 * every `#pragma omp parallel` of the core (via num_threads(...)), so that a
 * hostile OMP_NUM_THREADS (100000: libgomp overflows its stack creating the
 * team; 20000: thread start-up costs hundreds of times the work) can neither
 * crash nor stall a call. Results never depend on the count (work is split
 * into fixed tiles or per-element rows), so capping changes no bits. */
#ifndef ATTN_THREADS_H
#define ATTN_THREADS_H

#include <stdint.h>

/* Threads for a region of `items` independent work items: 1 inside a
 * parallel region or for fewer than 2 items, else the least of
 * omp_get_max_threads(), items and the ceiling: the number of online CPUs,
 * but at least ATTN_MIN_THREAD_CEILING (so that the thread-count checks of
 * spec/determinism_spec.lua still split work on a 1-CPU machine) and at most
 * ATTN_MAX_THREADS. Always >= 1. */
int attn_threads_for(int64_t items);

#define ATTN_MIN_THREAD_CEILING 8
#define ATTN_MAX_THREADS 1024

#endif
