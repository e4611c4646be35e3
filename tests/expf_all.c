/* Every float bit pattern through each runnable kernel set's libm_exp_minus
 * (src/core/expf_glibc.h), against glibc's expf: the exhaustive form of
 * tests/core_test.c's stride (about a minute per vector set):
 *   make test-expf-all */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <math.h>

#include "cpu.h"

int main(void) {
  const char *const *names = attn_cpu_available();
  int bad_sets = 0;
  for (int si = 0; names[si]; si++) {
    const attn_flash_kernels *k = attn_cpu_kernels_named(names[si]);
    if (!k) continue;
    static float x[1 << 16], want[1 << 16];
    uint64_t differ = 0;
    for (uint64_t hi = 0; hi < (1ull << 16); hi++) {
      for (uint32_t lo = 0; lo < (1u << 16); lo++) {
        uint32_t b = (uint32_t)(hi << 16 | lo);
        memcpy(&x[lo], &b, sizeof b);
        want[lo] = expf(x[lo]);
      }
      k->libm_exp_minus(x, 1 << 16, 0.0f);
      for (uint32_t lo = 0; lo < (1u << 16); lo++) differ += memcmp(&x[lo], &want[lo], sizeof(float)) != 0;
    }
    printf("%s: %llu of 2^32 differ from expf\n", names[si], (unsigned long long)differ);
    bad_sets += differ != 0;
  }
  return bad_sets != 0;
}
