/* Aligned allocation and exact reads. A read that comes back short is reported as short,
 * never as success: the caller turns that into RUN INVALID. */
#define _GNU_SOURCE
#include "k3.h"
#include "block.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define K3_PAGE 4096

/* ---- the block registry ---------------------------------------------------------------
 * Every block k3_alloc hands out is recorded here (base, size, reads in flight), sorted by
 * base. A read may only land inside one recorded block, and k3_free waits for the reads
 * still landing in the block it frees. Lookups are a binary search under one mutex: a few
 * hundred nanoseconds against reads of kilobytes to megabytes. */

static pthread_mutex_t blocks_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t blocks_idle = PTHREAD_COND_INITIALIZER; /* a block's reads ended */
static k3_block **blocks = NULL;                              /* sorted by base */
static size_t nblocks = 0, blocks_cap = 0;

/* Index of the last block whose base is <= p, or -1. Caller holds blocks_mu. */
static long block_below(uintptr_t p) {
  long lo = 0, hi = (long)nblocks - 1, found = -1;
  while (lo <= hi) {
    long mid = lo + (hi - lo) / 2;
    if ((uintptr_t)blocks[mid]->base <= p) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

/* Records a fresh block; 0, or -1 when the registry cannot grow. */
static int block_add(char *base, size_t size) {
  k3_block *b = (k3_block *)malloc(sizeof *b);
  if (!b) return -1;
  b->base = base;
  b->size = size;
  b->inflight = 0;
  pthread_mutex_lock(&blocks_mu);
  if (nblocks == blocks_cap) {
    size_t cap = blocks_cap ? 2 * blocks_cap : 64;
    k3_block **grown = (k3_block **)realloc(blocks, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&blocks_mu);
      free(b);
      return -1;
    }
    blocks = grown;
    blocks_cap = cap;
  }
  size_t at = (size_t)(block_below((uintptr_t)base) + 1);
  memmove(blocks + at + 1, blocks + at, (nblocks - at) * sizeof *blocks);
  blocks[at] = b;
  nblocks++;
  pthread_mutex_unlock(&blocks_mu);
  return 0;
}

k3_block *k3_block_acquire(const void *dst, int64_t nbytes) {
  if (!dst || nbytes < 0) return NULL;
  uintptr_t p = (uintptr_t)dst;
  pthread_mutex_lock(&blocks_mu);
  long i = block_below(p);
  k3_block *b = NULL;
  if (i >= 0) {
    k3_block *c = blocks[i];
    uintptr_t off = p - (uintptr_t)c->base; /* p >= base */
    if (off <= c->size && (uint64_t)nbytes <= (uint64_t)(c->size - off)) {
      b = c;
      b->inflight++;
    }
  }
  pthread_mutex_unlock(&blocks_mu);
  return b;
}

void k3_block_release(k3_block *b) {
  pthread_mutex_lock(&blocks_mu);
  if (--b->inflight == 0) pthread_cond_broadcast(&blocks_idle);
  pthread_mutex_unlock(&blocks_mu);
}

void *k3_alloc(int64_t bytes) {
  if (bytes <= 0) bytes = K3_PAGE;
  if ((uint64_t)bytes > (uint64_t)SIZE_MAX - K3_PAGE) return NULL;
  size_t n = ((size_t)bytes + K3_PAGE - 1) & ~(size_t)(K3_PAGE - 1);
  void *p = NULL;
  if (posix_memalign(&p, K3_PAGE, n) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  if (n >= (size_t)2 << 20) madvise(p, n, MADV_HUGEPAGE);
#endif
  /* Pre-fault: first touch of fresh pages is slow on these VMs; pay it once here. */
  memset(p, 0, n);
  if (block_add((char *)p, n) != 0) {
    free(p);
    return NULL;
  }
  return p;
}

void k3_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&blocks_mu);
  long i = block_below((uintptr_t)p);
  if (i < 0 || blocks[i]->base != (char *)p) { /* not a block of ours: never free it */
    pthread_mutex_unlock(&blocks_mu);
    return;
  }
  k3_block *b = blocks[i];
  while (b->inflight > 0) pthread_cond_wait(&blocks_idle, &blocks_mu);
  i = block_below((uintptr_t)p); /* the array may have moved while we waited */
  memmove(blocks + i, blocks + i + 1, (nblocks - (size_t)i - 1) * sizeof *blocks);
  nblocks--;
  pthread_mutex_unlock(&blocks_mu);
  free(b->base);
  free(b);
}

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
  if (offset < 0 || nbytes < 0) return -EINVAL;
  k3_block *b = k3_block_acquire(dst, nbytes);
  if (!b) return -EFAULT; /* would not fit in one block of k3_alloc */
  int64_t r = k3_fault_next_read() ? -EIO : k3_pread_loop(fd, dst, offset, nbytes, 0);
  k3_block_release(b);
  return r;
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
