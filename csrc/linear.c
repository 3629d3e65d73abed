/* Matrix times T vectors with the weights as stored: BF16 or MXFP4, decoded exactly on
 * the fly. Threads split the weight rows in contiguous blocks (each weight is streamed
 * once, by one thread); each dot runs whole in one thread, in the 8-lane or MXFP4 group
 * order, so the result does not depend on T, on the thread count or on the ISA table. */
#include "k3.h"
#include "parallel.h"
#include "reduce.h"
#include "simd.h"

/* Below this many multiply-adds a matrix runs on the calling thread: waking the team
 * costs more than it saves (tens of microseconds when the cores are busy). */
#define K3_PARALLEL_MIN_FMAS (1 << 20)

/* Rows of thread `id` of `n`: contiguous blocks, multiples of 4 rows (the SIMD row block),
 * in thread order; a static schedule written out so that both paths split alike. */
static void k3_thread_rows(int rows, int id, int n, int *r0, int *r1) {
  int per = (rows + n - 1) / n;
  per = (per + 3) & ~3;
  const int64_t a = (int64_t)id * per, b = a + per;
  *r0 = (int)(a < rows ? a : rows);
  *r1 = (int)(b < rows ? b : rows);
}

/* Portable: y[t][r] = dot8(w[r], x[t]) for r0 <= r < r1. */
void k3_matmul_bf16_scalar(float *y, const uint16_t *w, const float *x, int r0, int r1,
                           int rows, int cols, int T) {
  for (int r = r0; r < r1; r++) {
    const uint16_t *row = w + (int64_t)r * cols;
    for (int t = 0; t < T; t++) {
      y[(int64_t)t * rows + r] = k3_dot_bf16(row, x + (int64_t)t * cols, cols);
    }
  }
}

/* Portable: the MXFP4 rows r0 <= r < r1. Returns -1 if a scale byte is 255, else 0. */
int k3_matmul_mxfp4_scalar(float *y, const uint8_t *packed, const uint8_t *scales,
                            const float *x, int r0, int r1, int rows, int cols, int group,
                            int T) {
  const int groups = cols / group;
  const uint8_t *first = scales + (int64_t)r0 * groups, *end = scales + (int64_t)r1 * groups;
  for (const uint8_t *s = first; s < end; s++) {
    if (*s == 255) return -1;
  }
  for (int r = r0; r < r1; r++) {
    const uint8_t *row = packed + (int64_t)r * (cols / 2);
    const uint8_t *row_scales = scales + (int64_t)r * groups;
    for (int t = 0; t < T; t++) {
      const float *xt = x + (int64_t)t * cols;
      y[(int64_t)t * rows + r] = k3_dot_mxfp4(row, row_scales, xt, cols, group);
    }
  }
  return 0;
}

/* True when a rows x cols x T product is worth a thread team. */
static int k3_worth_threads(int rows, int cols, int T) {
  return (int64_t)rows * cols * T >= K3_PARALLEL_MIN_FMAS;
}

/* y[t*y_stride + r] = dot(w[r], x[t]) in 8-lane order; w BF16 [rows][cols], x [T][cols].
 * The inner kernels take the row stride of y as their `rows` argument. */
typedef struct {
  const K3Simd *simd;
  float *y;
  const uint16_t *w;
  const float *x;
  int rows, cols, T, y_stride;
} k3_bf16_job;

static void k3_bf16_member(void *ctx, int id, int n) {
  const k3_bf16_job *j = (const k3_bf16_job *)ctx;
  int r0, r1;
  k3_thread_rows(j->rows, id, n, &r0, &r1);
  if (r0 < r1) j->simd->matmul_bf16(j->y, j->w, j->x, r0, r1, j->y_stride, j->cols, j->T);
}

static void k3_bf16_rows(float *y, const uint16_t *w, const float *x, int rows, int cols, int T,
                         int y_stride) {
  k3_bf16_job job = {k3_simd(), y, w, x, rows, cols, T, y_stride};
  k3_parallel(k3_worth_threads(rows, cols, T), k3_bf16_member, &job);
}

/* y [T][rows]. */
void k3_matmul_bf16(float *y, const uint16_t *w, const float *x, int rows, int cols, int T) {
  k3_bf16_rows(y, w, x, rows, cols, T, rows);
}

/* Refuses a stride below the block's rows (outputs would overlap) before any work. */
int k3_matmul_bf16_rows(float *y, const uint16_t *w, const float *x, int rows, int cols, int T,
                        int y_stride) {
  if (rows < 0 || cols < 0 || T < 0 || y_stride < rows) return -1;
  k3_bf16_rows(y, w, x, rows, cols, T, y_stride);
  return 0;
}

/* Refuses (-2) a group that is not a positive multiple of 8 dividing cols before any
 * work, and (-1) any scale byte 255 (E8M0 NaN), found by the row kernels as they stream
 * the scales (so they are read once); y is then undefined. */
typedef struct {
  const K3Simd *simd;
  float *y;
  const uint8_t *packed, *scales;
  const float *x;
  int rows, cols, group, T;
  int status; /* -1 once any member met a NaN scale */
} k3_mxfp4_job;

static void k3_mxfp4_member(void *ctx, int id, int n) {
  k3_mxfp4_job *j = (k3_mxfp4_job *)ctx;
  int r0, r1;
  k3_thread_rows(j->rows, id, n, &r0, &r1);
  if (r0 < r1 && j->simd->matmul_mxfp4(j->y, j->packed, j->scales, j->x, r0, r1, j->rows,
                                        j->cols, j->group, j->T) != 0) {
    __atomic_store_n(&j->status, -1, __ATOMIC_RELAXED);
  }
}

int k3_matmul_mxfp4(float *y, const uint8_t *packed, const uint8_t *scales, const float *x,
                    int rows, int cols, int group, int T) {
  if (group <= 0 || group % 8 != 0 || cols <= 0 || cols % group != 0) return -2;
  k3_mxfp4_job job = {k3_simd(), y, packed, scales, x, rows, cols, group, T, 0};
  k3_parallel(k3_worth_threads(rows, cols, T), k3_mxfp4_member, &job);
  return job.status;
}
