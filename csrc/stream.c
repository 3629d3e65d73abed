/* Background reads: a small pthread pool with two FIFO queues (urgent reads first, then
 * prefetches). The caller submits a read and gets a ticket; it waits on the ticket later,
 * so the read overlaps whatever the caller computes meanwhile. A read that fails or comes
 * back short is reported as such, never as success. The pool also measures how long reads
 * of each class were in flight (union of intervals), for the run report.
 *
 * Urgent reads own the disk: no prefetch starts while an urgent read is queued or running,
 * and prefetches use at most half the threads, so an urgent batch that arrives while the
 * disk is busy with prefetches gets the other half at once and the rest as soon as the
 * running prefetches end (they are never preempted, so the caller keeps them small). */
#define _GNU_SOURCE
#include "k3.h"
#include "block.h"
#include "platform.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define K3_IO_MAX_WORKERS 16
#define K3_IO_CAPACITY 8192 /* tickets outstanding at once */
#define K3_IO_CLASSES 2
#define K3_IO_URGENT (K3_IO_CLASSES - 1)

enum { JOB_FREE = 0, JOB_QUEUED, JOB_RUNNING, JOB_DONE };

typedef struct {
  int state;
  int klass;
  int fd;
  void *dst;
  k3_block *block; /* the k3_alloc block dst lies in, held until the read ends */
  int64_t offset, nbytes, result, ticket;
  int next; /* queue link, -1 at the end */
} k3_io_job;

struct k3_io_pool {
  pthread_mutex_t mu;
  pthread_cond_t work; /* a job was queued, or stop */
  pthread_cond_t done; /* a job finished */
  pthread_t threads[K3_IO_MAX_WORKERS];
  int nthreads, stop;
  k3_io_job jobs[K3_IO_CAPACITY];
  int head[K3_IO_CLASSES], tail[K3_IO_CLASSES];
  int64_t next_ticket;
  /* Busy accounting: per class and for any class, time with >= 1 read running. */
  int active[K3_IO_CLASSES + 1];
  int64_t since_ns[K3_IO_CLASSES + 1], busy_ns[K3_IO_CLASSES + 1];
  int64_t bytes[K3_IO_CLASSES], reads[K3_IO_CLASSES];
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Reads up to `nbytes`; stops early only at EOF. With O_DIRECT a short read that leaves an
 * unaligned position is EOF too (the next read would be refused). */
static int64_t read_span(int fd, void *dst, int64_t offset, int64_t nbytes) {
  if (k3_fault_next_read()) return -EIO;
  return k3_pread_loop(fd, dst, offset, nbytes, k3_os_read_aligned(fd));
}

static void mark_start(k3_io_pool *p, int klass) {
  int64_t t = now_ns();
  int ids[2] = {klass, K3_IO_CLASSES};
  for (int i = 0; i < 2; i++) {
    if (p->active[ids[i]]++ == 0) p->since_ns[ids[i]] = t;
  }
}

static void mark_end(k3_io_pool *p, int klass) {
  int64_t t = now_ns();
  int ids[2] = {klass, K3_IO_CLASSES};
  for (int i = 0; i < 2; i++) {
    if (--p->active[ids[i]] == 0) p->busy_ns[ids[i]] += t - p->since_ns[ids[i]];
  }
}

/* Whether a job of class `c` may start now: urgent always; a prefetch only while no urgent
 * read is queued or running, and while fewer than half the threads run prefetches. */
static int may_start(const k3_io_pool *p, int c) {
  if (c == K3_IO_URGENT) return 1;
  if (p->head[K3_IO_URGENT] >= 0 || p->active[K3_IO_URGENT] > 0) return 0;
  int prefetching = p->active[K3_IO_CLASSES] - p->active[K3_IO_URGENT];
  int cap = p->nthreads;
  return prefetching < cap;
}

/* Pops the next job that may start (urgent class first) or returns -1. Caller holds the
 * lock. */
static int pop_job(k3_io_pool *p) {
  for (int c = K3_IO_CLASSES - 1; c >= 0; c--) {
    int j = p->head[c];
    if (j < 0 || !may_start(p, c)) continue;
    p->head[c] = p->jobs[j].next;
    if (p->head[c] < 0) p->tail[c] = -1;
    return j;
  }
  return -1;
}

static void *worker(void *arg) {
  k3_io_pool *p = (k3_io_pool *)arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    int j = pop_job(p);
    if (j < 0) {
      if (p->stop) break;
      pthread_cond_wait(&p->work, &p->mu);
      continue;
    }
    k3_io_job *job = &p->jobs[j];
    job->state = JOB_RUNNING;
    mark_start(p, job->klass);
    pthread_mutex_unlock(&p->mu);
    int64_t r = read_span(job->fd, job->dst, job->offset, job->nbytes);
    k3_block_release(job->block);
    pthread_mutex_lock(&p->mu);
    mark_end(p, job->klass);
    job->result = r;
    job->state = JOB_DONE;
    if (r > 0) p->bytes[job->klass] += r;
    p->reads[job->klass]++;
    pthread_cond_broadcast(&p->done);
    /* A finished read may let a held-back prefetch start on an idle thread. */
    pthread_cond_broadcast(&p->work);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

k3_io_pool *k3_io_pool_new(int workers) {
  if (workers < 1) workers = 1;
  if (workers > K3_IO_MAX_WORKERS) workers = K3_IO_MAX_WORKERS;
  k3_io_pool *p = (k3_io_pool *)calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int c = 0; c < K3_IO_CLASSES; c++) p->head[c] = p->tail[c] = -1;
  for (int i = 0; i < workers; i++) {
    if (pthread_create(&p->threads[i], NULL, worker, p) != 0) break;
    p->nthreads++;
  }
  if (p->nthreads == 0) {
    k3_io_pool_free(p);
    return NULL;
  }
  return p;
}

void k3_io_pool_free(k3_io_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  /* Queued reads are dropped (their blocks let go); running ones finish before the threads
   * exit. */
  for (int c = 0; c < K3_IO_CLASSES; c++) {
    for (int j = p->head[c]; j >= 0; j = p->jobs[j].next) k3_block_release(p->jobs[j].block);
    p->head[c] = p->tail[c] = -1;
  }
  p->stop = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  free(p);
}

int64_t k3_io_submit(k3_io_pool *p, int klass, int fd, void *dst, int64_t offset,
                     int64_t nbytes) {
  if (!p || klass < 0 || klass >= K3_IO_CLASSES || nbytes < 0 || offset < 0) return -EINVAL;
  k3_block *block = k3_block_acquire(dst, nbytes);
  if (!block) return -EFAULT; /* would not fit in one block of k3_alloc */
  pthread_mutex_lock(&p->mu);
  int64_t ticket = p->next_ticket;
  int j = (int)(ticket % K3_IO_CAPACITY);
  if (p->jobs[j].state != JOB_FREE) {
    pthread_mutex_unlock(&p->mu);
    k3_block_release(block);
    return -EAGAIN;
  }
  p->next_ticket++;
  k3_io_job *job = &p->jobs[j];
  job->state = JOB_QUEUED;
  job->klass = klass;
  job->fd = fd;
  job->dst = dst;
  job->block = block;
  job->offset = offset;
  job->nbytes = nbytes;
  job->result = 0;
  job->ticket = ticket;
  job->next = -1;
  if (p->tail[klass] >= 0) p->jobs[p->tail[klass]].next = j;
  else p->head[klass] = j;
  p->tail[klass] = j;
  pthread_cond_signal(&p->work);
  pthread_mutex_unlock(&p->mu);
  return ticket;
}

int64_t k3_io_wait(k3_io_pool *p, int64_t ticket) {
  if (!p || ticket < 0) return -EINVAL;
  int j = (int)(ticket % K3_IO_CAPACITY);
  pthread_mutex_lock(&p->mu);
  k3_io_job *job = &p->jobs[j];
  if (job->ticket != ticket || job->state == JOB_FREE) {
    pthread_mutex_unlock(&p->mu);
    return -EINVAL;
  }
  while (job->state != JOB_DONE) pthread_cond_wait(&p->done, &p->mu);
  int64_t r = job->result;
  job->state = JOB_FREE;
  pthread_mutex_unlock(&p->mu);
  return r;
}

int k3_io_poll(k3_io_pool *p, int64_t ticket) {
  if (!p || ticket < 0) return -EINVAL;
  int j = (int)(ticket % K3_IO_CAPACITY);
  pthread_mutex_lock(&p->mu);
  k3_io_job *job = &p->jobs[j];
  int r = job->ticket != ticket || job->state == JOB_FREE ? -EINVAL : job->state == JOB_DONE;
  pthread_mutex_unlock(&p->mu);
  return r;
}

void k3_io_stats(k3_io_pool *p, int64_t *out) {
  pthread_mutex_lock(&p->mu);
  int64_t t = now_ns();
  for (int c = 0; c <= K3_IO_CLASSES; c++) {
    out[c] = p->busy_ns[c] + (p->active[c] > 0 ? t - p->since_ns[c] : 0);
  }
  for (int c = 0; c < K3_IO_CLASSES; c++) {
    out[K3_IO_CLASSES + 1 + c] = p->bytes[c];
    out[2 * K3_IO_CLASSES + 1 + c] = p->reads[c];
  }
  pthread_mutex_unlock(&p->mu);
}
