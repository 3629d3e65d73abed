/* Multi-head latent attention over the latent cache (MODEL.md §4.6, absorbed form).
 * kv_b is BF16 [nh*(dn+dv)][rkv]: per head dn key rows (W_UK) then dv value rows (W_UV).
 * Threads split (token, head) pairs. */
#include <stdlib.h>

#include "k3.h"
#include "parallel.h"
#include "reduce.h"
#include "simd.h"

/* q_abs = W_UK^T q_nope (sequential fma over d for each j), then q_pe copied after it. */
static void k3_absorb_head(const K3Simd *simd, float *q_abs, const float *q,
                           const uint16_t *w_uk, int dn, int dr, int rkv) {
  for (int j = 0; j < rkv; j++) q_abs[j] = 0.0f;
  for (int d = 0; d < dn; d++) simd->axpy_bf16(q_abs, q[d], w_uk + (int64_t)d * rkv, rkv);
  for (int e = 0; e < dr; e++) q_abs[rkv + e] = q[dn + e];
}

/* q [T][nh][dn+dr] -> q_abs [T][nh][rkv+dr]. */
typedef struct {
  const K3Simd *simd;
  float *out;
  const float *in;
  const uint16_t *kv_b;
  int nh, dn, dr, dv, rkv;
} k3_heads_job;

static void k3_absorb_heads(void *ctx, int64_t th0, int64_t th1) {
  const k3_heads_job *j = (const k3_heads_job *)ctx;
  const int dn = j->dn, dr = j->dr, rkv = j->rkv;
  for (int64_t th = th0; th < th1; th++) {
    const int h = (int)(th % j->nh);
    k3_absorb_head(j->simd, j->out + th * (rkv + dr), j->in + th * (dn + dr),
                   j->kv_b + (int64_t)h * (dn + j->dv) * rkv, dn, dr, rkv);
  }
}

void k3_mla_absorb_q(float *q_abs, const float *q, const uint16_t *kv_b, int nh, int dn,
                     int dr, int dv, int rkv, int T) {
  const int64_t n = (int64_t)T * nh;
  k3_heads_job job = {k3_simd(), q_abs, q, kv_b, nh, dn, dr, dv, rkv};
  k3_parallel_for(n, n * dn * rkv >= 1048576, k3_absorb_heads, &job);
}

/* One head of one query over cache rows 0..last: score_s = dot8(q_abs, cache[s]) * scale,
 * k3_softmax, o_lat[j] = sequential fma over s of p_s * cache[s][j] (j < rkv). `p` is
 * caller scratch of last+1 floats. */
static void k3_attend_head(const K3Simd *simd, float *o_lat, float *p, const float *q_abs,
                           const float *cache, int last, int rkv, int dr, float scale) {
  const int width = rkv + dr;
  simd->dots(p, q_abs, cache, width, last + 1, width);
  for (int s = 0; s <= last; s++) p[s] *= scale;
  k3_softmax(p, last + 1);
  simd->wsum(o_lat, p, cache, width, last + 1, rkv, 1);
}

/* Causal attention of T queries at positions pos0.. over the cache; o_lat [T][nh][rkv].
 * Each thread allocates one score buffer of pos0+T floats; returns -1 if one of those
 * allocations fails (o_lat is then incomplete), else 0. (t, h) pairs go to the threads
 * round-robin, so the longer causal rows of late tokens are shared evenly. */
typedef struct {
  const K3Simd *simd;
  float *o_lat;
  const float *q_abs, *cache;
  int pos0, T, nh, rkv, dr;
  float scale;
  int status; /* -1 once any member could not allocate its scores */
} k3_attend_job;

static void k3_attend_member(void *ctx, int id, int nthreads) {
  k3_attend_job *j = (k3_attend_job *)ctx;
  const int64_t n = (int64_t)j->T * j->nh;
  float *p = malloc(sizeof(float) * ((size_t)j->pos0 + (size_t)j->T));
  if (p == NULL) {
    __atomic_store_n(&j->status, -1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t th = id; th < n; th += nthreads) { /* round-robin */
    const int t = (int)(th / j->nh);
    k3_attend_head(j->simd, j->o_lat + th * j->rkv, p, j->q_abs + th * (j->rkv + j->dr),
                   j->cache, j->pos0 + t, j->rkv, j->dr, j->scale);
  }
  free(p);
}

int k3_mla_attend(float *o_lat, const float *q_abs, const float *cache, int pos0, int T,
                  int nh, int rkv, int dr, float scale) {
  const int64_t n = (int64_t)T * nh;
  k3_attend_job job = {k3_simd(), o_lat, q_abs, cache, pos0, T, nh, rkv, dr, scale, 0};
  k3_parallel(n * (pos0 + T) * (rkv + dr) >= 1048576, k3_attend_member, &job);
  return job.status;
}

/* o[t][h][i] = dot8(W_UV_h[i], o_lat[t][h]) over rkv; o is [T][nh][dv]. */
static void k3_expand_heads(void *ctx, int64_t th0, int64_t th1) {
  const k3_heads_job *j = (const k3_heads_job *)ctx;
  const int dv = j->dv, rkv = j->rkv;
  for (int64_t th = th0; th < th1; th++) {
    const int h = (int)(th % j->nh);
    const uint16_t *w_uv = j->kv_b + ((int64_t)h * (j->dn + dv) + j->dn) * rkv;
    for (int i = 0; i < dv; i++) {
      j->out[th * dv + i] = j->simd->dot_bf16(w_uv + (int64_t)i * rkv, j->in + th * rkv, rkv);
    }
  }
}

void k3_mla_expand_o(float *o, const float *o_lat, const uint16_t *kv_b, int nh, int dn,
                     int dv, int rkv, int T) {
  const int64_t n = (int64_t)T * nh;
  k3_heads_job job = {k3_simd(), o, o_lat, kv_b, nh, dn, 0, dv, rkv};
  k3_parallel_for(n, n * dv * rkv >= 1048576, k3_expand_heads, &job);
}
