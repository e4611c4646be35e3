/* Shared file helpers of the .npy and safetensors formats (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int attn_host_is_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

uint32_t attn_load_u32le(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

uint64_t attn_load_u64le(const unsigned char *b) {
  return (uint64_t)attn_load_u32le(b) | (uint64_t)attn_load_u32le(b + 4) << 32;
}

float attn_f64_to_f32(double d) {
  if (d > (double)FLT_MAX) return INFINITY;
  if (d < -(double)FLT_MAX) return -INFINITY;
  return (float)d;
}

int attn_open_regular(const char *path, int64_t *size, attn_file_problem *problem) {
  struct stat sb;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *problem = ATTN_FILE_CANNOT_OPEN;
    return -1;
  }
  if (fstat(fd, &sb) != 0) {
    int err = errno; /* the caller's message names fstat's errno, not close's */
    *problem = ATTN_FILE_CANNOT_STAT;
    close(fd);
    errno = err;
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    *problem = S_ISDIR(sb.st_mode) ? ATTN_FILE_IS_DIRECTORY : ATTN_FILE_NOT_REGULAR;
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = (int64_t)sb.st_size;
  return fd;
}

int64_t attn_read_at(int fd, void *buf, size_t n, int64_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) break;
    done += (size_t)got;
  }
  return (int64_t)done;
}

/* ---- saving through a temporary file -------------------------------------- */

/* Open path as it is, for a device or FIFO: never created, truncated or
 * removed; O_NONBLOCK so that a FIFO without a reader fails (ENXIO) instead
 * of blocking. */
static int open_in_place(const char *path, attn_out_file *of) {
  int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return 0;
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  of->f = fdopen(fd, "wb");
  if (!of->f) {
    int err = errno;
    close(fd);
    errno = err;
    return 0;
  }
  return 1;
}

int attn_out_open(const char *path, attn_out_file *of) {
  static unsigned counter;
  struct stat sb, lsb;
  of->f = NULL;
  of->tmp_path = of->final_path = NULL;
  if (!*path) { /* as fopen(""): no temporary file beside nothing */
    errno = ENOENT;
    return 0;
  }
  int exists = stat(path, &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) {
    errno = EISDIR;
    return 0;
  }
  if (exists && !S_ISREG(sb.st_mode)) return open_in_place(path, of);
  /* a symlink is followed: its target is what gets replaced */
  if (lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode)) of->final_path = realpath(path, NULL);
  if (!of->final_path) of->final_path = strdup(path);
  if (!of->final_path) return 0;
  const char *target = of->final_path;
  const char *slash = strrchr(target, '/');
  size_t dir_len = slash ? (size_t)(slash - target) + 1 : 0;
  const char *base = target + dir_len;
  size_t cap = dir_len + 256;
  of->tmp_path = malloc(cap);
  if (!of->tmp_path) {
    free(of->final_path);
    of->final_path = NULL;
    errno = ENOMEM;
    return 0;
  }
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned k = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED);
    /* a hidden name beside the target; long names are cut to stay under NAME_MAX */
    snprintf(of->tmp_path, cap, "%.*s.%.180s.tmp-%ld-%u-%lx", (int)dir_len, target, base, (long)getpid(), k,
             (unsigned long)ts.tv_nsec);
    fd = open(of->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd >= 0 && exists) fchmod(fd, sb.st_mode & 07777); /* keep the replaced file's permissions */
  if (fd >= 0) of->f = fdopen(fd, "wb");
  if (!of->f) {
    int err = errno;
    if (fd >= 0) {
      close(fd);
      unlink(of->tmp_path);
    }
    free(of->tmp_path);
    free(of->final_path);
    of->tmp_path = of->final_path = NULL;
    errno = err;
    return 0;
  }
  return 1;
}

int attn_out_finish(attn_out_file *of, int ok) {
  int err = ok ? 0 : errno;
  if (ok && fflush(of->f) != 0) ok = 0, err = errno;
  /* on disk before the rename: a crash right after it must not leave an empty file */
  if (ok && of->tmp_path && fsync(fileno(of->f)) != 0) ok = 0, err = errno;
  if (fclose(of->f) != 0 && ok) ok = 0, err = errno;
  if (ok && of->tmp_path && rename(of->tmp_path, of->final_path) != 0) ok = 0, err = errno;
  if (!ok && of->tmp_path) unlink(of->tmp_path);
  free(of->tmp_path);
  free(of->final_path);
  of->f = NULL;
  of->tmp_path = of->final_path = NULL;
  if (!ok) errno = err;
  return ok;
}

#define WRITE_CHUNK 4096 /* floats converted per fwrite when t is strided or the host big-endian */

int attn_write_bool(FILE *f, const attn_tensor *t) {
  int64_t numel = attn_numel(t);
  unsigned char raw[WRITE_CHUNK];
  int64_t idx[ATTN_MAX_DIMS] = {0};
  size_t k = 0;
  for (int64_t e = 0; e < numel; e++) {
    raw[k] = *attn_at(t, idx) != 0.0f;
    if (++k == WRITE_CHUNK || e + 1 == numel) {
      if (fwrite(raw, 1, k, f) != k) return 0;
      k = 0;
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->size[d]) break;
      idx[d] = 0;
    }
  }
  return 1;
}

int attn_write_elements(FILE *f, const attn_tensor *t) {
  return t->is_bool ? attn_write_bool(f, t) : attn_write_f32le(f, t);
}

int attn_write_f32le(FILE *f, const attn_tensor *t) {
  int64_t numel = attn_numel(t);
  if (numel == 0) return 1;
  if (attn_is_contiguous(t) && attn_host_is_little_endian())
    return fwrite(t->data, 4, (size_t)numel, f) == (size_t)numel;
  unsigned char raw[WRITE_CHUNK * 4];
  int64_t idx[ATTN_MAX_DIMS] = {0};
  size_t k = 0;
  for (int64_t e = 0; e < numel; e++) {
    float v = *attn_at(t, idx);
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int j = 0; j < 4; j++) raw[4 * k + (size_t)j] = (unsigned char)(u >> (8 * j));
    if (++k == WRITE_CHUNK || e + 1 == numel) {
      if (fwrite(raw, 4, k, f) != k) return 0;
      k = 0;
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->size[d]) break;
      idx[d] = 0;
    }
  }
  return 1;
}
