/* Aligned allocation and exact reads. A read that comes back short is reported as short,
 * never as success: the caller turns that into RUN INVALID. */
#define _GNU_SOURCE
#include "k3.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define K3_PAGE 4096

void *k3_alloc(int64_t bytes) {
  if (bytes <= 0) bytes = K3_PAGE;
  size_t n = ((size_t)bytes + K3_PAGE - 1) & ~(size_t)(K3_PAGE - 1);
  void *p = NULL;
  if (posix_memalign(&p, K3_PAGE, n) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  if (n >= (size_t)2 << 20) madvise(p, n, MADV_HUGEPAGE);
#endif
  /* Pre-fault: first touch of fresh pages is slow on these VMs; pay it once here. */
  memset(p, 0, n);
  return p;
}

void k3_free(void *p) { free(p); }

int k3_open_read(const char *path, int direct) {
  int flags = O_RDONLY | O_CLOEXEC;
#ifdef O_DIRECT
  if (direct) {
    int fd = open(path, flags | O_DIRECT);
    if (fd >= 0) return fd;
    if (errno != EINVAL) return -errno;
  }
#else
  (void)direct;
#endif
  int fd = open(path, flags);
  return fd >= 0 ? fd : -errno;
}

int k3_close(int fd) { return close(fd) == 0 ? 0 : -errno; }

int64_t k3_file_size(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  return (int64_t)st.st_size;
}

int64_t k3_pread_full(int fd, void *dst, int64_t offset, int64_t nbytes) {
  int64_t got = 0;
  while (got < nbytes) {
    ssize_t r = pread(fd, (char *)dst + got, (size_t)(nbytes - got), (off_t)(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break; /* EOF: short */
    got += r;
  }
  return got;
}
