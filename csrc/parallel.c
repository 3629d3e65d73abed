/* Thread teams for the kernels (parallel.h): OpenMP's when compiled with -fopenmp, else a
 * small pool of pthreads owned by libk3 (macOS has no OpenMP in its toolchain; winpthreads
 * serves on Windows). Both split work the same way, so either gives the same bytes. */
#define _GNU_SOURCE
#include "parallel.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#else
#include <pthread.h>
#include "platform.h"
#endif

void k3_static_block(int64_t n, int id, int nthreads, int64_t *i0, int64_t *i1) {
  const int64_t per = n / nthreads, extra = n % nthreads;
  *i0 = (int64_t)id * per + (id < extra ? id : extra);
  *i1 = *i0 + per + (id < extra ? 1 : 0);
}

typedef struct {
  int64_t n;
  k3_range_body body;
  void *ctx;
} k3_loop;

static void k3_loop_member(void *arg, int id, int nthreads) {
  const k3_loop *loop = (const k3_loop *)arg;
  int64_t i0, i1;
  k3_static_block(loop->n, id, nthreads, &i0, &i1);
  if (i0 < i1) loop->body(loop->ctx, i0, i1);
}

void k3_parallel_for(int64_t n, int worth, k3_range_body body, void *ctx) {
  if (n <= 0) return;
  k3_loop loop = {n, body, ctx};
  k3_parallel(worth && n > 1, k3_loop_member, &loop);
}

#ifdef _OPENMP

int k3_team_size(void) { return omp_get_max_threads(); }

void k3_parallel(int worth, k3_team_body body, void *ctx) {
#pragma omp parallel if (worth)
  body(ctx, omp_get_thread_num(), omp_get_num_threads());
}

#else /* the pool */

#define K3_POOL_MAX 256

/* One team at a time: `call` is held by the thread whose team runs. Workers sleep on `go`
 * until `generation` moves, run the body, and the last one to finish signals `done`. */
static struct {
  pthread_mutex_t call, mu;
  pthread_cond_t go, done;
  int size;      /* team size, caller included; 1 until the workers exist */
  int running;   /* members of the current team still in the body */
  uint64_t generation;
  k3_team_body body;
  void *ctx;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 1, 0, 0, NULL, NULL};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static __thread int in_team = 0; /* a team member asking for a team runs alone (no nesting) */

/* OMP_NUM_THREADS's first number, as OpenMP reads it (so one variable sets either
 * backend), else one thread per CPU this process may use. */
static int wanted_team_size(void) {
  const char *v = getenv("OMP_NUM_THREADS");
  if (v != NULL) {
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (end != v && n >= 1) return n > K3_POOL_MAX ? K3_POOL_MAX : (int)n;
  }
  int cpus = k3_cpu_count();
  if (cpus < 1) cpus = 1;
  return cpus > K3_POOL_MAX ? K3_POOL_MAX : cpus;
}

/* How long an idle worker polls for the next team before it sleeps: kernels come in quick
 * succession during a forward pass, and waking a sleeping thread costs tens of microseconds.
 * The same order as the spin the OpenMP build is given (GOMP_SPINCOUNT, ffi/library.ts). */
#define K3_POOL_SPINS 10000

static void pool_spin_until_moved(uint64_t seen) {
  for (int i = 0; i < K3_POOL_SPINS; i++) {
    if (__atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE) != seen) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
  }
}

static void *pool_worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  in_team = 1;
  uint64_t seen = 0; /* generation starts at 0 and moves only once every worker exists */
  for (;;) {
    pool_spin_until_moved(seen);
    pthread_mutex_lock(&pool.mu);
    while (pool.generation == seen) pthread_cond_wait(&pool.go, &pool.mu);
    seen = pool.generation;
    k3_team_body body = pool.body;
    void *ctx = pool.ctx;
    const int size = pool.size;
    pthread_mutex_unlock(&pool.mu);
    body(ctx, id, size);
    pthread_mutex_lock(&pool.mu);
    if (--pool.running == 0) pthread_cond_signal(&pool.done);
    pthread_mutex_unlock(&pool.mu);
  }
  return NULL;
}

/* Starts the workers once. A worker the system refuses shrinks the team; never fatal. The
 * workers live as long as the process (the library is never unloaded: -z nodelete). */
static void pool_start(void) {
  const int wanted = wanted_team_size();
  int started = 1;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* Kernels keep small VLAs (a head's dim floats) on the stack: 1 MiB is ample. */
  pthread_attr_setstacksize(&attr, (size_t)1 << 20);
  for (int id = 1; id < wanted; id++) {
    pthread_t t;
    if (pthread_create(&t, &attr, pool_worker, (void *)(intptr_t)id) != 0) break;
    started++;
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_lock(&pool.mu);
  pool.size = started;
  pthread_mutex_unlock(&pool.mu);
}

int k3_team_size(void) {
  pthread_once(&pool_once, pool_start);
  return pool.size;
}

void k3_parallel(int worth, k3_team_body body, void *ctx) {
  if (worth && !in_team && k3_team_size() > 1 && pthread_mutex_trylock(&pool.call) == 0) {
    pthread_mutex_lock(&pool.mu);
    pool.body = body;
    pool.ctx = ctx;
    pool.running = pool.size - 1;
    __atomic_add_fetch(&pool.generation, 1, __ATOMIC_RELEASE); /* spinning workers see it */
    const int size = pool.size;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);
    in_team = 1;
    body(ctx, 0, size);
    in_team = 0;
    pthread_mutex_lock(&pool.mu);
    while (pool.running > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.call);
    return;
  }
  body(ctx, 0, 1);
}

#endif
