/* attn.dist_core: the Open MPI layer under attn.dist (lua/attn/dist/init.lua).
 *
 * A module of its own (build/attn/dist_core.so, compiled with mpicc's flags)
 * so that attn builds and runs without Open MPI. It sees attn tensors through
 * the registry's "attn.Tensor" metatable and the attn_tensor layout
 * (src/core/tensor.h) only: every function here takes contiguous tensors
 * (the Lua layer packs and unpacks strided ones) and moves their floats.
 *
 * Every collective first all-gathers a small header (which collective, its
 * op and root, the tensor's shape) and compares the ranks' headers, so a
 * shape or call that differs across ranks raises the same error on every
 * rank instead of hanging or reading the wrong bytes. Point-to-point
 * messages send the same header ahead of the data for the receiver to check.
 * MPI errors are returned (MPI_ERRORS_RETURN) and raised as Lua errors;
 * all MPI calls are made from the thread that called init (MPI_THREAD_FUNNELED). */
#include <limits.h>
#include <stdarg.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "storage_version.h"
#include "tensor.h"

#define TENSOR_MT "attn.Tensor"
#define REQUEST_MT "attn.dist.Request"
#define SENTINEL_KEY "attn.dist.finalizer"
#define PENDING_KEY "attn.dist.pending"

/* header: kind, op, root, is_bool, ndim, size[ATTN_MAX_DIMS] */
enum { H_KIND, H_OP, H_ROOT, H_BOOL, H_NDIM, H_SIZE, H_LEN = H_SIZE + ATTN_MAX_DIMS };

enum { K_BARRIER = 1, K_ALL_REDUCE, K_BROADCAST, K_ALL_GATHER, K_P2P };
static const char *const kind_names[] = {"?", "dist.barrier", "dist.all_reduce", "dist.broadcast",
                                         "dist.all_gather", "dist.send"};

enum { OP_SUM, OP_AVG, OP_MAX, OP_MIN };
static const char *const op_names[] = {"sum", "avg", "max", "min", NULL};

static int initialized_here; /* this module called MPI_Init_thread */

/* The position of the user's call, skipping the Lua layer's frames (those
 * whose source starts with the prefix attn.caller registers), as the
 * binding's attnL_where does. */
static void push_where(lua_State *L) {
  lua_Debug ar;
  size_t plen = 0;
  lua_getfield(L, LUA_REGISTRYINDEX, "attn.lua_source_prefix");
  const char *prefix = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &plen) : NULL;
  int level = 1;
  for (; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "S", &ar)) break;
    if (ar.what[0] == 'C' || !prefix || strncmp(ar.source, prefix, plen) != 0) break;
  }
  lua_pop(L, 1);
  luaL_where(L, level);
}

static int dist_error(lua_State *L, const char *fname, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  push_where(L);
  lua_pushfstring(L, "%s: %s", fname, msg);
  lua_concat(L, 2);
  return lua_error(L);
}

static void check_mpi(lua_State *L, int rc, const char *fname) {
  if (rc == MPI_SUCCESS) return;
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
  dist_error(L, fname, "MPI failed: %s", s);
}

static int is_running(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

static void check_running(lua_State *L, const char *fname) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) dist_error(L, fname, "called after dist.finalize()");
  if (!is_running()) dist_error(L, fname, "call dist.init() first");
}

static int world_size(void) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

static int my_rank(void) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

static attn_tensor *test_tensor(lua_State *L, int arg) {
  return (attn_tensor *)luaL_testudata(L, arg, TENSOR_MT);
}

static const char *shape_str(int ndim, const int64_t *size, char *buf, size_t len) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, len - n, "[");
  for (int i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, i ? ", %lld" : "%lld", (long long)size[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
  return buf;
}

static int is_contiguous(const attn_tensor *t) {
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->size[i] == 0) return 1;
    if (t->size[i] != 1 && t->stride[i] != expect) return 0;
    expect *= t->size[i];
  }
  return 1;
}

static int64_t numel_of(const attn_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->size[i];
  return n;
}

/* The contiguous tensor at arg, with a count MPI can take (an int). */
static attn_tensor *check_buffer(lua_State *L, int arg, const char *fname, const char *what, int *count) {
  attn_tensor *t = test_tensor(L, arg);
  if (!t) dist_error(L, fname, "bad argument #%d '%s' (expected attn.Tensor, got %s)", arg, what, luaL_typename(L, arg));
  if (!is_contiguous(t)) dist_error(L, fname, "bad argument #%d '%s' (expected a contiguous tensor)", arg, what);
  int64_t n = numel_of(t);
  if (n > INT_MAX)
    dist_error(L, fname, "bad argument #%d '%s' (%lld elements; at most %d per call)", arg, what, (long long)n, INT_MAX);
  *count = (int)n;
  return t;
}

static int check_peer(lua_State *L, int arg, const char *fname, const char *what) {
  if (!lua_isinteger(L, arg))
    dist_error(L, fname, "bad argument #%d '%s' (expected a rank, an integer in 1..%d, got %s)", arg, what,
               world_size(), luaL_typename(L, arg));
  lua_Integer r = lua_tointeger(L, arg);
  if (r < 1 || r > world_size())
    dist_error(L, fname, "bad argument #%d '%s' (expected a rank in 1..%d, got %lld)", arg, what, world_size(),
               (long long)r);
  return (int)(r - 1);
}

static void fill_header(int64_t *h, int kind, int op, int root, const attn_tensor *t) {
  memset(h, 0, sizeof(int64_t) * H_LEN);
  h[H_KIND] = kind;
  h[H_OP] = op;
  h[H_ROOT] = root;
  if (t) {
    h[H_BOOL] = t->is_bool;
    h[H_NDIM] = t->ndim;
    for (int i = 0; i < t->ndim; i++) h[H_SIZE + i] = t->size[i];
  }
}

/* All-gather the headers and raise, on every rank alike, when they differ. */
static void agree(lua_State *L, const int64_t *mine, const char *fname) {
  int n = world_size();
  int64_t *all = lua_newuserdatauv(L, sizeof(int64_t) * H_LEN * (size_t)n, 0);
  check_mpi(L, MPI_Allgather(mine, H_LEN, MPI_INT64_T, all, H_LEN, MPI_INT64_T, MPI_COMM_WORLD), fname);
  for (int r = 1; r < n; r++) {
    const int64_t *a = all, *b = all + (size_t)r * H_LEN;
    if (memcmp(a, b, sizeof(int64_t) * H_LEN) == 0) continue;
    if (a[H_KIND] != b[H_KIND]) {
      int ka = (int)a[H_KIND], kb = (int)b[H_KIND];
      dist_error(L, fname, "the ranks called different collectives (rank 1 called %s, rank %d called %s)",
                 kind_names[ka >= 1 && ka <= K_P2P ? ka : 0], r + 1, kind_names[kb >= 1 && kb <= K_P2P ? kb : 0]);
    }
    if (a[H_OP] != b[H_OP])
      dist_error(L, fname, "the ranks gave different ops (rank 1 '%s', rank %d '%s')", op_names[a[H_OP] & 3], r + 1,
                 op_names[b[H_OP] & 3]);
    if (a[H_ROOT] != b[H_ROOT])
      dist_error(L, fname, "the ranks gave different roots (rank 1 gave %lld, rank %d gave %lld)",
                 (long long)a[H_ROOT] + 1, r + 1, (long long)b[H_ROOT] + 1);
    char sa[160], sb[160];
    if (a[H_NDIM] != b[H_NDIM] || memcmp(a + H_SIZE, b + H_SIZE, sizeof(int64_t) * ATTN_MAX_DIMS) != 0)
      dist_error(L, fname, "tensor shapes differ across ranks (rank 1 has %s, rank %d has %s)",
                 shape_str((int)a[H_NDIM], a + H_SIZE, sa, sizeof sa), r + 1,
                 shape_str((int)b[H_NDIM], b + H_SIZE, sb, sizeof sb));
    dist_error(L, fname, "tensor kinds differ across ranks (rank 1 has a %s tensor, rank %d a %s one)",
               a[H_BOOL] ? "bool" : "float", r + 1, b[H_BOOL] ? "bool" : "float");
  }
  lua_pop(L, 1);
}

/* ---- lifetime -------------------------------------------------------------- */

static int finalize_now(lua_State *L) {
  (void)L;
  if (is_running() && initialized_here) MPI_Finalize();
  return 0;
}

static int l_init(lua_State *L) {
  int init = 0, fin = 0;
  MPI_Finalized(&fin);
  if (fin) dist_error(L, "dist.init", "MPI was finalized (dist.finalize()); it cannot be started again");
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) dist_error(L, "dist.init", "MPI_Init_thread failed (code %d)", rc);
    initialized_here = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* finalize at exit: lua_close collects this sentinel (a script that ends
     * without dist.finalize()) */
    lua_newuserdatauv(L, 1, 0);
    lua_newtable(L);
    lua_pushcfunction(L, finalize_now);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, SENTINEL_KEY);
  }
  return 0;
}

static int l_is_initialized(lua_State *L) {
  lua_pushboolean(L, is_running());
  return 1;
}

static int l_is_finalized(lua_State *L) {
  int fin = 0;
  MPI_Finalized(&fin);
  lua_pushboolean(L, fin);
  return 1;
}

static int l_finalize(lua_State *L) {
  finalize_now(L);
  return 0;
}

static int l_abort(lua_State *L) {
  int code = (int)luaL_optinteger(L, 1, 1);
  if (is_running()) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

static int l_rank(lua_State *L) {
  check_running(L, "dist.rank");
  lua_pushinteger(L, my_rank() + 1);
  return 1;
}

static int l_world_size(lua_State *L) {
  check_running(L, "dist.world_size");
  lua_pushinteger(L, world_size());
  return 1;
}

/* ---- collectives ----------------------------------------------------------- */

static int l_barrier(lua_State *L) {
  check_running(L, "dist.barrier");
  int64_t h[H_LEN];
  fill_header(h, K_BARRIER, 0, 0, NULL);
  agree(L, h, "dist.barrier"); /* the all-gather is the barrier */
  return 0;
}

/* all_reduce(t, op): t contiguous, reduced in place. Sums are reduced to
 * rank 1 and broadcast from it, so every rank holds the same bits (an
 * all-reduce may add in a different order on each rank), in an order fixed
 * by the message size and world size, hence the same bits from run to run. */
static int l_all_reduce(lua_State *L) {
  const char *fname = "dist.all_reduce";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int op = luaL_checkoption(L, 2, "sum", op_names);
  if (t->is_bool && (op == OP_SUM || op == OP_AVG))
    dist_error(L, fname, "bad argument #1 't' (a bool tensor cannot be reduced with '%s'; use 'max' or 'min')",
               op_names[op]);
  int64_t h[H_LEN];
  fill_header(h, K_ALL_REDUCE, op, 0, t);
  agree(L, h, fname);
  if (count > 0) {
    if (op == OP_MAX || op == OP_MIN) {
      check_mpi(L, MPI_Allreduce(MPI_IN_PLACE, t->data, count, MPI_FLOAT, op == OP_MAX ? MPI_MAX : MPI_MIN,
                                 MPI_COMM_WORLD), fname);
    } else {
      int root = 0;
      if (my_rank() == root)
        check_mpi(L, MPI_Reduce(MPI_IN_PLACE, t->data, count, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD), fname);
      else
        check_mpi(L, MPI_Reduce(t->data, NULL, count, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD), fname);
      check_mpi(L, MPI_Bcast(t->data, count, MPI_FLOAT, root, MPI_COMM_WORLD), fname);
      if (op == OP_AVG) {
        float n = (float)world_size();
        for (int i = 0; i < count; i++) t->data[i] /= n;
      }
    }
  }
  attn_storage_bump_version(L, 1, fname);
  return 0;
}

static int l_broadcast(lua_State *L) {
  const char *fname = "dist.broadcast";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int root = check_peer(L, 2, fname, "root");
  int64_t h[H_LEN];
  fill_header(h, K_BROADCAST, 0, root, t);
  agree(L, h, fname);
  if (count > 0) check_mpi(L, MPI_Bcast(t->data, count, MPI_FLOAT, root, MPI_COMM_WORLD), fname);
  if (my_rank() != root) attn_storage_bump_version(L, 1, fname);
  return 0;
}

/* all_gather(t, out): out contiguous [world, ...t.shape], made by the caller. */
static int l_all_gather(lua_State *L) {
  const char *fname = "dist.all_gather";
  check_running(L, fname);
  int count, out_count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  attn_tensor *out = check_buffer(L, 2, fname, "out", &out_count);
  if ((int64_t)count * world_size() != (int64_t)out_count)
    dist_error(L, fname, "bad argument #2 'out' (expected %lld elements, got %d)",
               (long long)count * world_size(), out_count);
  int64_t h[H_LEN];
  fill_header(h, K_ALL_GATHER, 0, 0, t);
  agree(L, h, fname);
  if (count > 0)
    check_mpi(L, MPI_Allgather(t->data, count, MPI_FLOAT, out->data, count, MPI_FLOAT, MPI_COMM_WORLD), fname);
  attn_storage_bump_version(L, 2, fname);
  return 0;
}

/* ---- point to point ---------------------------------------------------------
 * Message `tag` (0-based, user's) is two MPI messages: the header on tag
 * 2*tag, the floats on 2*tag+1; MPI keeps both in order per (source, tag). */

static int check_tag(lua_State *L, int arg, const char *fname) {
  if (lua_isnoneornil(L, arg)) return 0;
  if (!lua_isinteger(L, arg))
    dist_error(L, fname, "bad argument #%d 'tag' (expected an integer, got %s)", arg, luaL_typename(L, arg));
  lua_Integer tag = lua_tointeger(L, arg);
  int *ub = NULL, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  lua_Integer max = flag && ub ? (*ub - 1) / 2 : 16383;
  if (tag < 0 || tag > max)
    dist_error(L, fname, "bad argument #%d 'tag' (expected an integer in 0..%lld, got %lld)", arg, (long long)max,
               (long long)tag);
  return (int)tag;
}

static void check_header(lua_State *L, const int64_t *got, const attn_tensor *t, int src, const char *fname) {
  int64_t want[H_LEN];
  fill_header(want, K_P2P, 0, 0, t);
  /* a bool tensor's 0/1 floats may land in a float one, not other floats in a bool one */
  if (!t->is_bool) want[H_BOOL] = got[H_BOOL];
  if (got[H_KIND] != K_P2P || got[H_NDIM] < 0 || got[H_NDIM] > ATTN_MAX_DIMS)
    dist_error(L, fname, "rank %d sent a message that is not a tensor from dist.send/isend", src + 1);
  if (want[H_BOOL] != got[H_BOOL])
    dist_error(L, fname, "rank %d sent a float tensor, the receiving tensor is a bool one", src + 1);
  if (memcmp(want, got, sizeof want) != 0) {
    char sa[160], sb[160];
    dist_error(L, fname, "shape mismatch: rank %d sent %s, the receiving tensor is %s", src + 1,
               shape_str((int)got[H_NDIM], got + H_SIZE, sa, sizeof sa), shape_str(t->ndim, t->size, sb, sizeof sb));
  }
}

static int l_send(lua_State *L) {
  const char *fname = "dist.send";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int dst = check_peer(L, 2, fname, "dst");
  int tag = check_tag(L, 3, fname);
  int64_t h[H_LEN];
  fill_header(h, K_P2P, 0, 0, t);
  check_mpi(L, MPI_Send(h, H_LEN, MPI_INT64_T, dst, 2 * tag, MPI_COMM_WORLD), fname);
  check_mpi(L, MPI_Send(t->data, count, MPI_FLOAT, dst, 2 * tag + 1, MPI_COMM_WORLD), fname);
  return 0;
}

static int l_recv(lua_State *L) {
  const char *fname = "dist.recv";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int src = check_peer(L, 2, fname, "src");
  int tag = check_tag(L, 3, fname);
  int64_t h[H_LEN];
  check_mpi(L, MPI_Recv(h, H_LEN, MPI_INT64_T, src, 2 * tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), fname);
  int64_t want[H_LEN];
  fill_header(want, K_P2P, 0, 0, t);
  if (!t->is_bool) want[H_BOOL] = h[H_BOOL];
  if (memcmp(want, h, sizeof want) != 0) {
    /* take the data message off the queue (into scratch the collector owns)
     * so that a caller who catches the error can go on */
    MPI_Status st;
    int n = 0;
    check_mpi(L, MPI_Probe(src, 2 * tag + 1, MPI_COMM_WORLD, &st), fname);
    MPI_Get_count(&st, MPI_FLOAT, &n);
    void *scratch = lua_newuserdatauv(L, sizeof(float) * (size_t)(n > 0 ? n : 1), 0);
    check_mpi(L, MPI_Recv(scratch, n, MPI_FLOAT, src, 2 * tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), fname);
    check_header(L, h, t, src, fname);
  }
  check_mpi(L, MPI_Recv(t->data, count, MPI_FLOAT, src, 2 * tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), fname);
  attn_storage_bump_version(L, 1, fname);
  return 0;
}

/* A pending isend/irecv: the header and data requests. The request is kept
 * in the registry's pending table (with the tensor as its user value) until
 * waited, so the collector never frees memory MPI still writes or reads. */
typedef struct request {
  MPI_Request req[2];
  int64_t header[H_LEN];
  int is_recv, peer, done;
} request;

static request *push_request(lua_State *L, int tensor_arg, int is_recv, int peer) {
  request *r = lua_newuserdatauv(L, sizeof(request), 1);
  r->req[0] = r->req[1] = MPI_REQUEST_NULL;
  r->is_recv = is_recv;
  r->peer = peer;
  r->done = 0;
  luaL_setmetatable(L, REQUEST_MT);
  lua_pushvalue(L, tensor_arg);
  lua_setiuservalue(L, -2, 1);
  return r;
}

static void set_pending(lua_State *L, int req_idx, int on) {
  req_idx = lua_absindex(L, req_idx);
  lua_getfield(L, LUA_REGISTRYINDEX, PENDING_KEY);
  lua_pushvalue(L, req_idx);
  lua_pushboolean(L, on);
  if (!on) {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

static int l_isend(lua_State *L) {
  const char *fname = "dist.isend";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int dst = check_peer(L, 2, fname, "dst");
  int tag = check_tag(L, 3, fname);
  request *r = push_request(L, 1, 0, dst);
  fill_header(r->header, K_P2P, 0, 0, t);
  check_mpi(L, MPI_Isend(r->header, H_LEN, MPI_INT64_T, dst, 2 * tag, MPI_COMM_WORLD, &r->req[0]), fname);
  set_pending(L, -1, 1);
  check_mpi(L, MPI_Isend(t->data, count, MPI_FLOAT, dst, 2 * tag + 1, MPI_COMM_WORLD, &r->req[1]), fname);
  return 1;
}

static int l_irecv(lua_State *L) {
  const char *fname = "dist.irecv";
  check_running(L, fname);
  int count;
  attn_tensor *t = check_buffer(L, 1, fname, "t", &count);
  int src = check_peer(L, 2, fname, "src");
  int tag = check_tag(L, 3, fname);
  request *r = push_request(L, 1, 1, src);
  check_mpi(L, MPI_Irecv(r->header, H_LEN, MPI_INT64_T, src, 2 * tag, MPI_COMM_WORLD, &r->req[0]), fname);
  set_pending(L, -1, 1);
  check_mpi(L, MPI_Irecv(t->data, count, MPI_FLOAT, src, 2 * tag + 1, MPI_COMM_WORLD, &r->req[1]), fname);
  return 1;
}

static request *check_request(lua_State *L, int arg, const char *fname) {
  request *r = luaL_testudata(L, arg, REQUEST_MT);
  if (!r)
    dist_error(L, fname, "bad argument #%d 'req' (expected a request from dist.isend or dist.irecv, got %s)", arg,
               luaL_typename(L, arg));
  return r;
}

/* req:wait(): completes the request (again: nothing); a receive checks the
 * header it got against its tensor. */
static int l_wait(lua_State *L) {
  const char *fname = "dist.wait";
  request *r = check_request(L, 1, fname);
  if (r->done) return 0;
  check_running(L, fname);
  MPI_Status st[2];
  int rc = MPI_Waitall(2, r->req, st);
  r->done = 1;
  set_pending(L, 1, 0);
  if (r->is_recv) {
    lua_getiuservalue(L, 1, 1);
    attn_tensor *t = test_tensor(L, -1);
    if (rc == MPI_SUCCESS || st[0].MPI_ERROR == MPI_SUCCESS) check_header(L, r->header, t, r->peer, fname);
    check_mpi(L, rc, fname);
    attn_storage_bump_version(L, -1, fname);
    lua_pop(L, 1);
  } else {
    check_mpi(L, rc, fname);
  }
  return 0;
}

static int l_test(lua_State *L) {
  const char *fname = "dist.test";
  request *r = check_request(L, 1, fname);
  if (!r->done) {
    check_running(L, fname);
    int flag = 0;
    check_mpi(L, MPI_Testall(2, r->req, &flag, MPI_STATUSES_IGNORE), fname);
    if (!flag) {
      lua_pushboolean(L, 0);
      return 1;
    }
    /* completed: wait() finishes the bookkeeping and the header check */
    r->req[0] = r->req[1] = MPI_REQUEST_NULL;
    r->done = 0;
    l_wait(L);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_request_tostring(lua_State *L) {
  request *r = check_request(L, 1, "tostring");
  lua_pushfstring(L, "attn.dist.Request(%s rank %d, %s)", r->is_recv ? "irecv from" : "isend to", r->peer + 1,
                  r->done ? "done" : "pending");
  return 1;
}

static int l_bump_version(lua_State *L) {
  if (!test_tensor(L, 1)) dist_error(L, "dist.bump_version", "bad argument #1 (expected attn.Tensor)");
  attn_storage_bump_version(L, 1, luaL_optstring(L, 2, "dist"));
  return 0;
}

int luaopen_attn_dist_core(lua_State *L);
__attribute__((visibility("default"))) int luaopen_attn_dist_core(lua_State *L) {
  lua_newtable(L);
  lua_setfield(L, LUA_REGISTRYINDEX, PENDING_KEY);
  if (luaL_newmetatable(L, REQUEST_MT)) {
    lua_newtable(L);
    lua_pushcfunction(L, l_wait);
    lua_setfield(L, -2, "wait");
    lua_pushcfunction(L, l_test);
    lua_setfield(L, -2, "test");
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_request_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  static const luaL_Reg fns[] = {
      {"init", l_init},           {"is_initialized", l_is_initialized},
      {"finalize", l_finalize},   {"is_finalized", l_is_finalized}, {"abort", l_abort},
      {"rank", l_rank},           {"world_size", l_world_size},
      {"barrier", l_barrier},     {"all_reduce", l_all_reduce},
      {"broadcast", l_broadcast}, {"all_gather", l_all_gather},
      {"send", l_send},           {"recv", l_recv},
      {"isend", l_isend},         {"irecv", l_irecv},
      {"wait", l_wait},           {"test", l_test},
      {"bump_version", l_bump_version}, {NULL, NULL}};
  luaL_newlib(L, fns);
  return 1;
}
