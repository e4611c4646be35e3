/* luaopen_attn_core: the module table of attn.core, the attn.Tensor
 * metatable and its methods table. */
#include <malloc.h>
#include <stdlib.h>

#include "attn_lua.h"

#define ATTN_EXPORT __attribute__((visibility("default")))

ATTN_EXPORT int luaopen_attn_core(lua_State *L);

/* Activations and kernel scratch of tens of MiB are freed and asked for again
 * on every forward. glibc's defaults hand such blocks back to the kernel (heap
 * trim above 2x the mmap threshold, or munmap), so the next call page-faults
 * them in anew, which costs more than the arithmetic on some VMs (mha: 240 ->
 * 147 ms here). Keep up to 64 MiB of freed heap and serve blocks below 32 MiB
 * from it (128 MiB kept too much between repeated large calls: the C_causal_bwd
 * bench's peak RSS read 265 MiB at 5 reps, 241 with 64; mha unchanged). A
 * process that sets glibc's own MALLOC_* variables or tunables, or
 * ATTN_NO_MALLOC_TUNING, keeps its settings. */
static void tune_malloc(void) {
  static int done;
  if (done) return;
  done = 1;
  if (getenv("ATTN_NO_MALLOC_TUNING") || getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
      getenv("GLIBC_TUNABLES"))
    return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

int luaopen_attn_core(lua_State *L) {
  tune_malloc();
  lua_newtable(L);                       /* module */
  lua_newtable(L);                       /* methods */
  luaL_newmetatable(L, ATTN_TENSOR_NAME); /* metatable, with __name */
  attnL_register_tensor_mt(L, -1);
  attnL_open_tensor(L);
  attnL_open_math(L);
  attnL_open_attention(L);
  attnL_open_rope(L);
  attnL_open_lse_merge(L);
  attnL_open_rng(L);
  attnL_open_sampling(L);
  attnL_open_io(L);
  attnL_open_safetensors(L);
  attnL_open_sys(L);
  attnL_open_cpu(L);
  attnL_open_modules(L);
  attnL_open_train(L);
  attnL_open_sdpa_autograd(L);
  attnL_open_ops(L);
  attnL_open_block_mask(L);
  attnL_open_score_mod(L);
  attnL_open_tokenizer(L);
  lua_setfield(L, -3, "Tensor_mt");
  lua_setfield(L, -2, "Tensor");
  return 1;
}
