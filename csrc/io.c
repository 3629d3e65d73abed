/* Aligned allocation and exact reads. A read that comes back short is reported as short,
 * never as success: the caller turns that into RUN INVALID. */
#define _GNU_SOURCE
#include "k3.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

int64_t k3_pread_loop(int fd, void *dst, int64_t offset, int64_t nbytes, int stop_unaligned) {
  int64_t got = 0;
  while (got < nbytes) {
    ssize_t r = pread(fd, (char *)dst + got, (size_t)(nbytes - got), (off_t)(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break; /* EOF: short */
    got += r;
    if (stop_unaligned && (got & 4095) != 0) break;
  }
  return got;
}

int64_t k3_pread_full(int fd, void *dst, int64_t offset, int64_t nbytes) {
  if (k3_fault_next_read()) return -EIO;
  return k3_pread_loop(fd, dst, offset, nbytes, 0);
}

/* Peak resident set size of this process in bytes (VmHWM), from getrusage. */
int64_t k3_peak_rss_bytes(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -errno;
#ifdef __APPLE__
  return (int64_t)ru.ru_maxrss;
#else
  return (int64_t)ru.ru_maxrss * 1024;
#endif
}

/* ---- test-only fault hook and memory limits ------------------------------------------ */

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static long fault_at = -1; /* -1: not read yet; 0: off */
static long fault_count = 0;

int k3_fault_next_read(void) {
  pthread_mutex_lock(&fault_mu);
  if (fault_at < 0) {
    const char *v = getenv("K3_FAULT_READ");
    fault_at = v ? strtol(v, NULL, 10) : 0;
    if (fault_at < 0) fault_at = 0;
  }
  int fail = fault_at > 0 && ++fault_count == fault_at;
  pthread_mutex_unlock(&fault_mu);
  return fail;
}

/* The first number after `key` in the text file `path`, times `scale`; -1 when absent. */
static int64_t read_number(const char *path, const char *key, int64_t scale) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  int64_t out = -1;
  while (fgets(line, sizeof line, f)) {
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0) continue;
    char *end = NULL;
    long long v = strtoll(line + k, &end, 10);
    if (end != line + k) out = (int64_t)v * scale;
    break;
  }
  fclose(f);
  return out;
}

int64_t k3_mem_available_bytes(void) {
  return read_number("/proc/meminfo", "MemAvailable:", 1024);
}

int64_t k3_cgroup_memory_max_bytes(void) {
  int64_t v2 = read_number("/sys/fs/cgroup/memory.max", "", 1);
  if (v2 > 0) return v2;
  int64_t v1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", "", 1);
  /* cgroup v1 reports "no limit" as a huge page-rounded number. */
  if (v1 > 0 && v1 < ((int64_t)1 << 60)) return v1;
  return -1;
}
