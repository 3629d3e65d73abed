/* Norms and element-wise operations on fp32 activations. Threads split tokens; every
 * sum of squares is the 8-lane dot (reduce.h), so a token's result does not depend on T. */
#include "k3.h"
#include "parallel.h"
#include "reduce.h"
#include "simd.h"

/* Element counts below which the element-wise kernels stay on the calling thread. */
#define K3_PARALLEL_MIN_ELEMENTS 65536

/* One token: y = (x * r) * w with r = 1/rms(x). y may alias x. */
static void k3_rmsnorm_row(const K3Simd *simd, float *y, const float *x, const float *w, int n,
                           float eps) {
  const float r = 1.0f / k3_rms_of(simd->dot_f32(x, x, n), n, eps);
  for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* RMSNorm of T tokens [T][n] with gain w [n]. y may alias x. */
typedef struct {
  const K3Simd *simd;
  float *y;
  const float *x, *w;
  int n;
  float eps, scale;
} k3_rows_job;

static void k3_rmsnorm_rows(void *ctx, int64_t t0, int64_t t1) {
  const k3_rows_job *j = (const k3_rows_job *)ctx;
  for (int64_t t = t0; t < t1; t++) {
    k3_rmsnorm_row(j->simd, j->y + t * j->n, j->x + t * j->n, j->w, j->n, j->eps);
  }
}

void k3_rmsnorm(float *y, const float *x, const float *w, int n, float eps, int T) {
  k3_rows_job job = {k3_simd(), y, x, w, n, eps, 0.0f};
  k3_parallel_for(T, (int64_t)T * n >= K3_PARALLEL_MIN_ELEMENTS, k3_rmsnorm_rows, &job);
}

/* In place per head of dim values: x = (x / sqrt(dot8(x, x) + eps)) * scale (sum, not
 * mean). x is [T][heads*dim]. */
static void k3_l2norm_rows(void *ctx, int64_t th0, int64_t th1) {
  const k3_rows_job *j = (const k3_rows_job *)ctx;
  const int dim = j->n;
  for (int64_t th = th0; th < th1; th++) {
    float *v = j->y + th * dim;
    const float d = sqrtf(j->simd->dot_f32(v, v, dim) + j->eps);
    for (int i = 0; i < dim; i++) v[i] = (v[i] / d) * j->scale;
  }
}

void k3_l2norm_heads(float *x, int heads, int dim, float eps, float scale, int T) {
  const int64_t n = (int64_t)T * heads;
  k3_rows_job job = {k3_simd(), x, NULL, NULL, dim, eps, scale};
  k3_parallel_for(n, n * dim >= K3_PARALLEL_MIN_ELEMENTS, k3_l2norm_rows, &job);
}

/* SiTU-GLU over [T][n] (k3_situf of mathf.h); out may alias gate or up. Threads split
 * the tokens. */
typedef struct {
  const K3Simd *simd;
  float *out;
  const float *gate, *up;
  int n;
  float b1, b2;
} k3_glu_job;

static void k3_situ_glu_rows(void *ctx, int64_t t0, int64_t t1) {
  const k3_glu_job *j = (const k3_glu_job *)ctx;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t at = t * j->n;
    j->simd->situ_glu(j->out + at, j->gate + at, j->up + at, j->n, j->b1, j->b2);
  }
}

void k3_situ_glu(float *out, const float *gate, const float *up, int n, float b1, float b2,
                 int T) {
  k3_glu_job job = {k3_simd(), out, gate, up, n, b1, b2};
  k3_parallel_for(T, (int64_t)T * n >= K3_PARALLEL_MIN_ELEMENTS, k3_situ_glu_rows, &job);
}

/* y[i] += x[i]. */
void k3_add(float *y, const float *x, int n) {
  for (int i = 0; i < n; i++) y[i] += x[i];
}

/* y[i] *= sigmoid(g[i]). */
void k3_mul_sigmoid(float *y, const float *g, int n) { k3_simd()->mul_sigmoid(y, g, n); }

/* y[i] = sigmoid(x[i]); y may alias x. */
void k3_sigmoid(float *y, const float *x, int n) { k3_simd()->sigmoid(y, x, n); }

/* out[t] = widened table row ids[t]; table BF16 [vocab][H]. Checks every id first and
 * returns -1 (writing nothing) if one is outside [0, vocab). */
int k3_embed_bf16(float *out, const uint16_t *table, const int32_t *ids, int vocab, int H,
                  int T) {
  for (int t = 0; t < T; t++) {
    if (ids[t] < 0 || ids[t] >= vocab) return -1;
  }
  for (int t = 0; t < T; t++) {
    const uint16_t *row = table + (int64_t)ids[t] * H;
    for (int i = 0; i < H; i++) out[(int64_t)t * H + i] = k3_bf16(row[i]);
  }
  return 0;
}
