/*
 * Test-only write-fault injection (not part of libk3), loaded with LD_PRELOAD into a k3 child
 * process. Writes to files whose path contains K3_FAULT_MATCH fail the way a full or
 * read-only disk makes them fail, so tests prove that every write failure is a clean exit 2
 * naming the path, and that a chat history never keeps a torn line, without a real full disk.
 *
 *   K3_FAULT_MATCH  substring of the file's path (required: without it nothing is faulted)
 *   K3_FAULT_ERRNO  ENOSPC (default), EROFS, EACCES, EDQUOT; anything else is EIO
 *   K3_FAULT_AFTER  bytes written to matching files before the fault (default 0): the write
 *                   that crosses it is cut short there, and the next one fails
 *   K3_FAULT_OPEN   1: opening a matching file for writing fails instead
 *
 * Build: cc -shared -fPIC -o build/libk3fault.so csrc/tests/fault.c -ldl (make does it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* libc's definition of `name`, looked up once. */
#define REAL(name, type) \
  static type real_##name; \
  if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

static atomic_long written;

static const char *match(void) {
  const char *m = getenv("K3_FAULT_MATCH");
  return m && *m ? m : NULL;
}

static int fault_errno(void) {
  const char *e = getenv("K3_FAULT_ERRNO");
  if (!e || !strcmp(e, "ENOSPC")) return ENOSPC;
  if (!strcmp(e, "EROFS")) return EROFS;
  if (!strcmp(e, "EACCES")) return EACCES;
  if (!strcmp(e, "EDQUOT")) return EDQUOT;
  return EIO;
}

/* True when fd is open on a file whose path contains K3_FAULT_MATCH. */
static int fd_matches(int fd) {
  const char *m = match();
  if (!m || fd <= 2) return 0;
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = 0;
  return strstr(target, m) != NULL;
}

/* How many of `n` bytes a write to fd may do: n, fewer (cut at the limit), or -1 (faulted). */
static ssize_t allowed(int fd, size_t n) {
  if (!fd_matches(fd)) return (ssize_t)n;
  const char *a = getenv("K3_FAULT_AFTER");
  long after = a ? atol(a) : 0;
  long done = atomic_load(&written);
  if (done >= after) {
    errno = fault_errno();
    return -1;
  }
  size_t room = (size_t)(after - done);
  size_t ok = n < room ? n : room;
  atomic_fetch_add(&written, (long)ok);
  return (ssize_t)ok;
}

ssize_t write(int fd, const void *buf, size_t n) {
  REAL(write, write_fn);
  ssize_t ok = allowed(fd, n);
  return ok < 0 ? -1 : real_write(fd, buf, (size_t)ok);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite, pwrite_fn);
  ssize_t ok = allowed(fd, n);
  return ok < 0 ? -1 : real_pwrite(fd, buf, (size_t)ok, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite64, pwrite_fn);
  ssize_t ok = allowed(fd, n);
  return ok < 0 ? -1 : real_pwrite64(fd, buf, (size_t)ok, off);
}

/* A vectored write to a matching file does its first buffer only (a short write). */
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
  REAL(writev, writev_fn);
  if (cnt <= 0 || !fd_matches(fd)) return real_writev(fd, iov, cnt);
  return write(fd, iov[0].iov_base, iov[0].iov_len);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
  REAL(pwritev, pwritev_fn);
  if (cnt <= 0 || !fd_matches(fd)) return real_pwritev(fd, iov, cnt, off);
  return pwrite(fd, iov[0].iov_base, iov[0].iov_len, off);
}

/* True when opening `path` with `flags` is to fail (K3_FAULT_OPEN, opened for writing). */
static int open_faults(const char *path, int flags) {
  const char *m = match(), *o = getenv("K3_FAULT_OPEN");
  if (!m || !o || strcmp(o, "1") || !path || !strstr(path, m)) return 0;
  if ((flags & O_ACCMODE) == O_RDONLY && !(flags & O_CREAT)) return 0;
  errno = fault_errno();
  return 1;
}

/* The mode argument of an open that creates. */
#define MODE_ARG(flags, mode) \
  mode_t mode = 0; \
  if ((flags) & (O_CREAT | __O_TMPFILE)) { \
    va_list ap; \
    va_start(ap, flags); \
    mode = (mode_t)va_arg(ap, int); \
    va_end(ap); \
  }

int open(const char *path, int flags, ...) {
  REAL(open, open_fn);
  MODE_ARG(flags, mode);
  return open_faults(path, flags) ? -1 : real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
  REAL(open64, open_fn);
  MODE_ARG(flags, mode);
  return open_faults(path, flags) ? -1 : real_open64(path, flags, mode);
}

int openat(int dir, const char *path, int flags, ...) {
  REAL(openat, openat_fn);
  MODE_ARG(flags, mode);
  return open_faults(path, flags) ? -1 : real_openat(dir, path, flags, mode);
}

int openat64(int dir, const char *path, int flags, ...) {
  REAL(openat64, openat_fn);
  MODE_ARG(flags, mode);
  return open_faults(path, flags) ? -1 : real_openat64(dir, path, flags, mode);
}
