/* Aligned allocation and exact reads. A read that comes back short is reported as short,
 * never as success: the caller turns that into RUN INVALID. What differs between operating
 * systems is in platform.c; this file is the same everywhere. */
#include "k3.h"
#include "block.h"
#include "platform.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

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
  void *p = k3_os_alloc_pages(n);
  if (!p) return NULL;
  /* Pre-fault: first touch of fresh pages is slow on these VMs; pay it once here. */
  memset(p, 0, n);
  if (block_add((char *)p, n) != 0) {
    k3_os_free_pages(p);
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
  k3_os_free_pages(b->base);
  free(b);
}

int k3_open_read(const char *path, int direct) { return k3_os_open_read(path, direct); }

int k3_close(int fd) { return k3_os_close(fd); }

int64_t k3_file_size(int fd) { return k3_os_file_size(fd); }

int64_t k3_pread_loop(int fd, void *dst, int64_t offset, int64_t nbytes, int stop_unaligned) {
  int64_t got = 0;
  while (got < nbytes) {
    const int64_t r = k3_os_pread(fd, (char *)dst + got, nbytes - got, offset + got);
    if (r < 0) return r;
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

int64_t k3_peak_rss_bytes(void) { return k3_os_peak_rss(); }

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

int64_t k3_mem_available_bytes(void) { return k3_os_mem_available(); }

int64_t k3_cgroup_memory_max_bytes(void) { return k3_os_memory_limit(); }
