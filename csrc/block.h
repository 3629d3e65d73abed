/* The registry of k3_alloc's blocks (io.c), shared with the reader pool (stream.c). Not
 * exported to TypeScript: it is how C checks, by itself, where a read may land. */
#ifndef K3_BLOCK_H
#define K3_BLOCK_H

#include <stddef.h>
#include <stdint.h>

typedef struct k3_block {
  char *base;
  size_t size;  /* the allocation, rounded up to a page */
  int inflight; /* reads landing in it now; k3_free waits for 0 */
} k3_block;

/* The block of k3_alloc that holds all of [dst, dst + nbytes), with one more read in flight,
 * or NULL when no single block holds it (the read must then be refused). */
k3_block *k3_block_acquire(const void *dst, int64_t nbytes);
/* Ends a read taken by k3_block_acquire. */
void k3_block_release(k3_block *b);

#endif
