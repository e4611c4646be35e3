/* The options of scaled dot-product attention from Lua, one parser for every
 * SDPA entry point: the plain call attn.scaled_dot_product_attention and the
 * recorded forward attn.core.autograd.sdpa_forward (src/binding/lua_attention.c),
 * and the backward attn.core.autograd.sdpa_backward
 * (src/binding/lua_sdpa_backward.c). The options themselves are one table in
 * src/binding/lua_sdpa_options.c. */
#ifndef ATTN_LUA_SDPA_OPTIONS_H
#define ATTN_LUA_SDPA_OPTIONS_H

#include "attn_lua.h"
#include "sdpa_common.h"

/* Which entry point parses: the forward ones (plain and recorded) or the backward. */
#define ATTNL_SDPA_FORWARD 1
#define ATTNL_SDPA_BACKWARD 2

/* A parsed options table: the core's options and what the binding itself
 * reads. Tensors and other values it points to stay on the Lua stack. */
typedef struct attnL_sdpa_call {
  attn_sdpa_opts o;             /* scale already 1/sqrt(E) unless given */
  attn_sdpa_kernel kernel;      /* ATTN_SDPA_AUTO unless given */
  int need_weights, return_lse; /* forward */
  int bias_grad;                /* backward: 1 unless given false */
  int draw_idx;                 /* backward: the stack slot of dropout_draw, 0 when absent */
  const attn_tensor *dweights;  /* backward: NULL unless given */
  attn_score_mod *score_mod;    /* NULL, or this call's copy of option score_mod (on the stack), tables filled */
  int table_grads_idx;          /* backward: the stack slot of score_mod_grads, 0 when absent */
} attnL_sdpa_call;

/* The attn.ScoreMod at idx (a score_mod, or a mask_mod when is_mask) copied
 * for one call into a userdata pushed on the stack, with its captured
 * tensors' current data and strides; raises naming fname and option for
 * anything else, or a tensor whose shape changed since tracing. */
/* 1 when the value at idx is the result of attn.mask_mod. */
int attnL_is_mask_mod(lua_State *L, int idx);

attn_score_mod *attnL_score_mod_for_call(lua_State *L, int idx, const char *fname, const char *option, int is_mask);

/* The options table at arg (none or nil: the defaults) for direction
 * (ATTNL_SDPA_FORWARD or ATTNL_SDPA_BACKWARD) into c; q gives the default
 * scale 1/sqrt(E). Every given option's value is left on the stack (so it
 * stays alive whatever happens to the table); errors name fname. Raises for
 * an unknown option, a value of the wrong type or range, flash with the
 * weights (forward), and a backward without kernel, or with dropout_p > 0
 * and no dropout_draw. */
void attnL_sdpa_parse_options(lua_State *L, int arg, const char *fname, int direction, const attn_tensor *q,
                              attnL_sdpa_call *c);

#endif
