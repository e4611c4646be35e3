/* sort and topk along a dim, giving PyTorch 1.13's indices for ties.
 *
 * Algorithm. Each line a[.., :, ..] of n values (shape (n,) along d) is copied
 * into a scratch array of (value, position) pairs, ordered with the comparison
 * PyTorch uses (ascending: a < b, NaN above every number; descending: a > b,
 * NaN first), and written out: values and 0-based positions (as floats) for
 * the caller to shift.
 *
 * Contract: PyTorch 1.13's CPU kernels order the pairs with libstdc++'s
 * std::sort (sort, and topk's final ordering), std::nth_element and
 * std::partial_sort (topk, partial_sort when k * 64 <= n), none of which is
 * stable: among equal values the order of their positions is whatever those
 * algorithms leave. To give the same indices, this file ports the three
 * algorithms from GCC 12's bits/stl_algo.h and bits/stl_heap.h step for step
 * (introsort with median-of-three pivots and a final insertion sort of
 * 16-element threshold, heap select, introselect), comparing only the
 * values, as PyTorch's comparators do. spec/indexing_stats_ops_spec.lua checks the indices
 * against torch 1.13 on lines full of ties. Values are copied, never computed:
 * they are exact.
 *
 * Threads: lines are independent and each is ordered by one thread, so the
 * result does not depend on how lines are spread over threads. */
#include "sort.h"

#include <stdlib.h>

#include "iter.h"

typedef struct keyed {
  float v;
  int64_t i;
} keyed;

typedef int (*keyed_less)(const keyed *a, const keyed *b);

/* PyTorch's KeyValueCompAsc / topk(largest = false): NaN above every number */
static int less_ascending(const keyed *a, const keyed *b) {
  return (a->v == a->v && b->v != b->v) || a->v < b->v;
}
/* KeyValueCompDesc / topk(largest = true): NaN before every number */
static int less_descending(const keyed *a, const keyed *b) {
  return (a->v != a->v && b->v == b->v) || a->v > b->v;
}

static void swap_keyed(keyed *a, keyed *b) {
  keyed t = *a;
  *a = *b;
  *b = t;
}

static int64_t floor_log2(int64_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

/* ---- bits/stl_heap.h ---- */

static void push_heap(keyed *first, int64_t hole, int64_t top, keyed value, keyed_less less) {
  int64_t parent = (hole - 1) / 2;
  while (hole > top && less(first + parent, &value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

static void adjust_heap(keyed *first, int64_t hole, int64_t len, keyed value, keyed_less less) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (less(first + child, first + (child - 1))) child--;
    first[hole] = first[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    first[hole] = first[child - 1];
    hole = child - 1;
  }
  push_heap(first, hole, top, value, less);
}

static void pop_heap(keyed *first, keyed *last, keyed *result, keyed_less less) {
  keyed value = *result;
  *result = *first;
  adjust_heap(first, 0, last - first, value, less);
}

static void make_heap(keyed *first, keyed *last, keyed_less less) {
  int64_t len = last - first;
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; parent--) {
    adjust_heap(first, parent, len, first[parent], less);
    if (parent == 0) return;
  }
}

static void sort_heap(keyed *first, keyed *last, keyed_less less) {
  while (last - first > 1) {
    --last;
    pop_heap(first, last, last, less);
  }
}

/* ---- bits/stl_algo.h ---- */

static void heap_select(keyed *first, keyed *middle, keyed *last, keyed_less less) {
  make_heap(first, middle, less);
  for (keyed *i = middle; i < last; ++i)
    if (less(i, first)) pop_heap(first, middle, i, less);
}

static void partial_sort(keyed *first, keyed *middle, keyed *last, keyed_less less) {
  heap_select(first, middle, last, less);
  sort_heap(first, middle, less);
}

static void unguarded_linear_insert(keyed *last, keyed_less less) {
  keyed value = *last;
  keyed *next = last - 1;
  while (less(&value, next)) {
    *last = *next;
    last = next;
    --next;
  }
  *last = value;
}

static void insertion_sort(keyed *first, keyed *last, keyed_less less) {
  if (first == last) return;
  for (keyed *i = first + 1; i != last; ++i) {
    if (less(i, first)) {
      keyed value = *i;
      for (keyed *p = i; p != first; --p) p[0] = p[-1];
      *first = value;
    } else {
      unguarded_linear_insert(i, less);
    }
  }
}

enum { SORT_THRESHOLD = 16 };

static void final_insertion_sort(keyed *first, keyed *last, keyed_less less) {
  if (last - first > SORT_THRESHOLD) {
    insertion_sort(first, first + SORT_THRESHOLD, less);
    for (keyed *i = first + SORT_THRESHOLD; i != last; ++i) unguarded_linear_insert(i, less);
  } else {
    insertion_sort(first, last, less);
  }
}

static void move_median_to_first(keyed *result, keyed *a, keyed *b, keyed *c, keyed_less less) {
  if (less(a, b)) {
    if (less(b, c)) swap_keyed(result, b);
    else if (less(a, c)) swap_keyed(result, c);
    else swap_keyed(result, a);
  } else if (less(a, c)) {
    swap_keyed(result, a);
  } else if (less(b, c)) {
    swap_keyed(result, c);
  } else {
    swap_keyed(result, b);
  }
}

static keyed *unguarded_partition(keyed *first, keyed *last, keyed *pivot, keyed_less less) {
  for (;;) {
    while (less(first, pivot)) ++first;
    --last;
    while (less(pivot, last)) --last;
    if (!(first < last)) return first;
    swap_keyed(first, last);
    ++first;
  }
}

static keyed *unguarded_partition_pivot(keyed *first, keyed *last, keyed_less less) {
  keyed *mid = first + (last - first) / 2;
  move_median_to_first(first, first + 1, mid, last - 1, less);
  return unguarded_partition(first + 1, last, first, less);
}

static void introsort_loop(keyed *first, keyed *last, int64_t depth_limit, keyed_less less) {
  while (last - first > SORT_THRESHOLD) {
    if (depth_limit == 0) {
      partial_sort(first, last, last, less);
      return;
    }
    --depth_limit;
    keyed *cut = unguarded_partition_pivot(first, last, less);
    introsort_loop(cut, last, depth_limit, less);
    last = cut;
  }
}

/* std::sort */
static void std_sort(keyed *first, keyed *last, keyed_less less) {
  if (first == last) return;
  introsort_loop(first, last, floor_log2(last - first) * 2, less);
  final_insertion_sort(first, last, less);
}

/* std::nth_element */
static void nth_element(keyed *first, keyed *nth, keyed *last, keyed_less less) {
  if (first == last || nth == last) return;
  int64_t depth_limit = floor_log2(last - first) * 2;
  while (last - first > 3) {
    if (depth_limit == 0) {
      heap_select(first, nth + 1, last, less);
      swap_keyed(first, nth);
      return;
    }
    --depth_limit;
    keyed *cut = unguarded_partition_pivot(first, last, less);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(first, last, less);
}

/* ---- lines ---- */

typedef struct order_ctx {
  int64_t n, k;             /* line length in a; values written per line */
  int64_t in_stride, val_stride, idx_stride;
  int topk, descending, sorted;
  int *failed;              /* set when scratch could not be had */
} order_ctx;

/* One call: n line starts (operands: values, indices, a). */
static void order_lines(int64_t count, float *const *p, const int64_t *s, const void *vctx) {
  const order_ctx *c = vctx;
  keyed *q = malloc((size_t)c->n * sizeof *q);
  if (!q) {
    __atomic_store_n(c->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  keyed_less less = c->descending ? less_descending : less_ascending;
  for (int64_t line = 0; line < count; line++) {
    float *vals = p[0] + line * s[0], *idx = p[1] + line * s[1];
    const float *x = p[2] + line * s[2];
    for (int64_t j = 0; j < c->n; j++) {
      q[j].v = x[j * c->in_stride];
      q[j].i = j;
    }
    if (!c->topk) {
      std_sort(q, q + c->n, less);
    } else if (c->k * 64 <= c->n) { /* PyTorch's choice of algorithm, which decides the tie order */
      partial_sort(q, q + c->k, q + c->n, less);
    } else {
      nth_element(q, q + c->k - 1, q + c->n, less);
      if (c->sorted) std_sort(q, q + c->k - 1, less); /* the k-th is in place already */
    }
    for (int64_t j = 0; j < c->k; j++) {
      vals[j * c->val_stride] = q[j].v;
      idx[j * c->idx_stride] = (float)q[j].i;
    }
  }
  free(q);
}

static attn_status order(const attn_tensor *a, int d, int64_t k, int topk, int descending, int sorted,
                         attn_tensor *values, attn_tensor *indices) {
  if (d < 0 || d >= a->ndim) return attn_fail(ATTN_EARG, "dim %d out of range for %d dims", d, a->ndim);
  int64_t n = a->size[d];
  if (k < 0 || k > n) return attn_fail(ATTN_EARG, "k = %lld is out of range for a dim of size %lld", (long long)k, (long long)n);
  if (n > (int64_t)1 << 24)
    return attn_fail(ATTN_EARG, "a dim of %lld elements cannot be ordered: its indices (above 2^24) would not be "
                     "exact in float32", (long long)n);
  for (int t = 0; t < 2; t++) {
    const attn_tensor *o = t ? indices : values;
    if (o->ndim != a->ndim) return attn_fail(ATTN_ESHAPE, "output rank differs from the input's");
    for (int j = 0; j < a->ndim; j++)
      if (o->size[j] != (j == d ? k : a->size[j])) return attn_fail(ATTN_ESHAPE, "output shape does not fit");
  }
  if (k == 0 || attn_numel(values) == 0) return ATTN_OK;
  attn_tensor vs = *values, is = *indices, as = *a;
  vs.size[d] = is.size[d] = as.size[d] = 1;
  int failed = 0;
  order_ctx c = {n, k, a->stride[d], values->stride[d], indices->stride[d], topk, descending, sorted, &failed};
  const attn_tensor *ops[3] = {&vs, &is, &as};
  attn_foreach(3, ops, order_lines, &c);
  if (failed)
    return attn_fail(ATTN_ENOMEM, "cannot allocate %lld bytes of sort scratch", (long long)(n * (int64_t)sizeof(keyed)));
  return ATTN_OK;
}

attn_status attn_sort(const attn_tensor *a, int d, int descending, attn_tensor *values, attn_tensor *indices) {
  return order(a, d, d >= 0 && d < a->ndim ? a->size[d] : 0, 0, descending, 1, values, indices);
}

attn_status attn_topk(const attn_tensor *a, int d, int64_t k, int largest, int sorted, attn_tensor *values,
                      attn_tensor *indices) {
  return order(a, d, k, 1, largest, sorted, values, indices);
}
