/* The one way kernels use threads: a team runs a body, each member told its id and the team
 * size. Which threads make the team is chosen at build time: OpenMP when the library is
 * compiled with -fopenmp, else libk3's own pool of pthreads (parallel.c). Kernels split
 * independent outputs by id, so their bytes never depend on the team size or the backend. */
#ifndef K3_PARALLEL_H
#define K3_PARALLEL_H

#include <stdint.h>

/* One member's share of a team's work: id in [0, nthreads). */
typedef void (*k3_team_body)(void *ctx, int id, int nthreads);
/* The items [i0, i1) of a parallel loop. */
typedef void (*k3_range_body)(void *ctx, int64_t i0, int64_t i1);

/* Runs body(ctx, id, n) once for each id < n and returns when every member has. The team is
 * one thread (the caller) when `worth` is 0, when the caller is itself a team member, or
 * when another thread's team holds the pool. */
void k3_parallel(int worth, k3_team_body body, void *ctx);

/* A loop over [0, n) split into contiguous blocks, one per member, in member order (the
 * static schedule): body(ctx, i0, i1) per non-empty block. */
void k3_parallel_for(int64_t n, int worth, k3_range_body body, void *ctx);

/* Member id's block of [0, n) when n items go to nthreads members in contiguous blocks:
 * the first n % nthreads members take one item more. */
void k3_static_block(int64_t n, int id, int nthreads, int64_t *i0, int64_t *i1);

/* Team size a parallel region gets: OMP_NUM_THREADS (read once) or one per CPU. */
int k3_team_size(void);

#endif
