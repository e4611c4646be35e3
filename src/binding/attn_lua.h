/* What the binding files share: the attn.Tensor userdata and argument checks.
 * Only the binding (src/binding/lua_*.c) includes Lua headers and raises Lua errors;
 * 1-based Lua dims and indices become 0-based here, once. */
#ifndef ATTN_LUA_H
#define ATTN_LUA_H

#include <lauxlib.h>
#include <lua.h>

#include "rng.h"
#include "tensor.h"

#define ATTN_TENSOR_NAME "attn.Tensor"

/* The userdata is an attn_tensor; its user value 1 is the storage (a plain
 * full userdata holding the floats, so the garbage collector sees the bytes).
 * Views share the storage object, which keeps it alive. User value 2 is the
 * serial of its history family when the tensor was made (nil = 0), 3 its own
 * family (nil: the storage is): see attnL_history_stale. */
#define TENSOR_USER_VALUES 3

attn_tensor *attnL_test(lua_State *L, int arg);
/* attnL_test for a function that checks several arguments: the address of
 * the tensor metatable (one registry look-up; valid while the state lives),
 * then attnL_test_mt per argument (its metatable's address compared). */
const void *attnL_tensor_mt(lua_State *L);
attn_tensor *attnL_test_mt(lua_State *L, int arg, const void *mt);
/* Makes the table at idx the tensor metatable of attnL_test and new tensors (once, at load). */
void attnL_register_tensor_mt(lua_State *L, int idx);
/* The tensor at arg, or an error "fname: bad argument #arg 'what' (expected attn.Tensor, got T)". */
attn_tensor *attnL_check(lua_State *L, int arg, const char *fname, const char *what);

/* What the value at arg is, for messages: its __name ("attn.Tensor") or Lua
 * type; a table or userdata whose metatable claims "attn.Tensor" without being
 * one is "table (not an attn.Tensor)". */
const char *attnL_typename(lua_State *L, int arg, char *buf, size_t len);

/* Push a new contiguous tensor of this shape, zero-filled. Raises (naming fname
 * and the bytes) on overflowing sizes and on allocation failure. */
attn_tensor *attnL_push_new(lua_State *L, int ndim, const int64_t *size, const char *fname);
/* Same, uninitialised: for kernels that write every element. */
attn_tensor *attnL_push_uninit(lua_State *L, int ndim, const int64_t *size, const char *fname);
/* Push a view described by `view` that shares the storage of the tensor at base. */
attn_tensor *attnL_push_view(lua_State *L, int base, const attn_tensor *view);
/* Push a contiguous copy of t if it is not contiguous, else t itself; returns the pushed one. */
attn_tensor *attnL_push_contiguous(lua_State *L, int arg, const char *fname);

/* Raise the core's last error: "fname: message". */
int attnL_core_error(lua_State *L, const char *fname);
/* luaL_error with "fname: " in front. */
/* Push the position of the user's call ("file:line: ", or "" when unknown),
 * skipping the frames of the Lua layer, as luaL_where does for one level. */
void attnL_where(lua_State *L);
int attnL_error(lua_State *L, const char *fname, const char *fmt, ...);

/* Raise "fname: bad argument #(max+1) (no more than max arguments expected, got n)":
 * extra arguments are a mistake (t:max(1, true, 3)), never silently ignored. */
void attnL_check_nargs(lua_State *L, int max, const char *fname);
/* An optional boolean argument (nil or absent: false); anything else raises. */
int attnL_checkboolean_opt(lua_State *L, int arg, const char *fname, const char *what);

/* A 1-based (or negative, from the end) dim of a tensor with ndim dims; 0-based result. */
int attnL_checkdim(lua_State *L, int arg, int ndim, const char *fname);
/* An integer argument (a float with an integral value is accepted). */
int64_t attnL_checkinteger(lua_State *L, int arg, const char *fname, const char *what);
/* A number argument. */
double attnL_checknumber(lua_State *L, int arg, const char *fname, const char *what);
/* Sizes given as varargs from `first`, or as one table at `first`; -1 allowed once if
 * allow_infer (returned as -1). Returns the count of dims. */
int attnL_checksizes(lua_State *L, int first, int64_t *size, int allow_infer, const char *fname);
/* Raise unless t can be written in place: the one writability check of every
 * in-place output whose written values can differ between its elements. An
 * expanded (stride-0) dim of size > 1 makes several elements share one memory
 * location, so the result would depend on the order of the writes (PyTorch
 * refuses the same; it would also make a huge expanded view run for ages).
 * Fills (fill_, zero_, t[i] = number) write one value everywhere and skip it. */
void attnL_check_writable(lua_State *L, const attn_tensor *t, const char *fname);
/* A path argument: a string without an embedded NUL byte (which the C
 * library would silently cut the path at). */
const char *attnL_checkpath(lua_State *L, int arg, const char *fname, const char *what);
/* Push a guard for a file descriptor: a userdata marked to-be-closed whose
 * __close (and __gc) closes the descriptor it holds, so that an error raised
 * while a file is open (an allocation refused) closes it. Returns where to
 * store the descriptor (-1: none). attnL_close_fd closes it now. */
int *attnL_push_fd_guard(lua_State *L);
void attnL_close_fd(lua_State *L, int idx);
/* copy_'s semantics: src (broadcast to dst's shape) copied into dst as if it
 * were copied out first when the two share memory; dst must be writable. */
void attnL_copy_into(lua_State *L, attn_tensor *dst, const attn_tensor *src, const char *fname);
/* "[2, 3]" of a tensor, for messages. */
const char *attnL_shape(const attn_tensor *t, char *buf, size_t len);

/* Every in-place write bumps the version of the tensor's storage (shared by
 * its views), PyTorch's version counter: autograd compares it with the
 * version a recorded op saved. fname names the writer in later messages. */
void attnL_bump_version(lua_State *L, int arg, const char *fname);
/* A history family is the tensors that share memory and autograd history: a
 * storage's tensors, except that a detached alias and its views are a family
 * of their own (PyTorch's detach() starts a new base). A family's serial
 * counts the in-place writes autograd recorded on it (a write that gave the
 * written tensor new history). A tensor of the family made before such a write
 * (a view and its base) no longer has the history PyTorch would give it: it
 * is stale. */
int attnL_history_stale(lua_State *L, int arg);
/* After a recorded in-place write on the tensor at arg: bump its family's
 * serial and make arg current. */
void attnL_history_wrote(lua_State *L, int arg);
/* Make the tensor at arg current (its history was rebuilt). */
void attnL_history_fresh(lua_State *L, int arg);
/* Give the tensor at arg (a detached alias) a family of its own. */
void attnL_history_new_family(lua_State *L, int arg);
/* The version of the storage of the tensor at arg (0 when never written in place). */
lua_Integer attnL_version(lua_State *L, int arg);
/* Push the version of the tensor at arg and the name of its last in-place
 * writer (nil when none); returns 2. */
int attnL_push_version(lua_State *L, int arg);

/* Registration of each binding file's functions into the module table on top of the stack. */
void attnL_open_tensor(lua_State *L);
void attnL_open_math(lua_State *L);
void attnL_open_attention(lua_State *L);
void attnL_open_rope(lua_State *L);
/* attn.core._lse_merge: ring attention's log-sum-exp merge (lua_lse_merge.c). */
void attnL_open_lse_merge(lua_State *L);
void attnL_open_rng(lua_State *L);
/* This Lua state's random generator (torch's default CPU generator): one per
 * state, kept in the registry and created by luaopen, shared by the state's
 * coroutines. Two states (e.g. on two OS threads) never share one. */
struct attn_generator *attnL_generator(lua_State *L);
/* The draw of one dropout call (0 < p < 1) over numel elements in row-major
 * order (attention: the weights [B..., Lq, Lk]), from this state's generator
 * in the stream attn.set_dropout_stream selected: the one function every
 * dropout consumer draws through. Pushes one value holding the default
 * stream's keep flags (nil for MKL): keep it on the stack while the draw is used.
 * numel < 0: more elements than int64 counts (an error for the default stream). */
struct attn_dropout_draw attnL_draw_dropout(lua_State *L, double p, int64_t numel, const char *fname);
/* attn.multinomial, randint, randperm (lua_sampling.c) */
void attnL_open_sampling(lua_State *L);
void attnL_open_io(lua_State *L);
void attnL_open_safetensors(lua_State *L);
void attnL_open_sys(lua_State *L);
/* attn.cpu_info, and the kernel choice (ATTN_CPU): raises when it is not available. */
void attnL_open_cpu(lua_State *L);
/* attn.core.modules: the fused module forwards (a table, not copied into attn). */
void attnL_open_modules(lua_State *L);
/* attn.core.train: the raw training kernels (a table, not copied into attn). */
void attnL_open_train(lua_State *L);
/* attn.core._autograd_*: the autograd bookkeeping of recorded calls
 * (src/binding/lua_autograd.c); expects [module, methods, metatable] on top. */
void attnL_open_autograd(lua_State *L);
/* Pushes t's sizes as a Lua list. */
void attnL_push_sizes(lua_State *L, const attn_tensor *t);
/* attn.core.autograd: the raw SDPA forward (src/binding/lua_attention.c) and
 * backward (attnL_sdpa_backward, src/binding/lua_sdpa_backward.c). */
void attnL_open_sdpa_autograd(lua_State *L);
int attnL_sdpa_backward(lua_State *L);
/* attn.block_mask and the attn.BlockMask userdata (lua_block_mask.c). */
void attnL_open_block_mask(lua_State *L);
/* attn.core.tokenizer: the GPT-2 tokenizer (lua_tokenizer.c). */
void attnL_open_tokenizer(lua_State *L);
/* attn.core._score_program and the attn.ScoreMod userdata (lua_score_mod.c). */
void attnL_open_score_mod(lua_State *L);
/* The attn.BlockMask at idx, or NULL. */
const struct attn_block_mask *attnL_test_block_mask(lua_State *L, int idx);
/* A dropout draw handed to Lua for a backward: pushes the MKL stream's draw
 * (an integer), or the value at holder (the default stream's keep flags,
 * attnL_draw_dropout's holder; 0: none). */
void attnL_push_dropout_draw(lua_State *L, attn_dropout_draw d, int holder);
/* The draw at idx, as attnL_push_dropout_draw pushed it, for a call over
 * numel elements (-1: more than int64 counts); raises "bad argument"/"bad
 * option" naming `what` otherwise. The keep flags stay owned by the value at idx. */
attn_dropout_draw attnL_check_dropout_draw(lua_State *L, int idx, int64_t numel, const char *fname, const char *what);
/* clamp, var/std, where, cumsum, index_select, gather, scatter_add_, chunk, split,
 * repeat_interleave, topk, sort, argsort (lua_ops.c); after attnL_open_tensor. */
void attnL_open_ops(lua_State *L);

#endif
