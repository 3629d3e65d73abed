/* Multi-head latent attention over the latent cache (MODEL.md §4.6, absorbed form).
 * kv_b is BF16 [nh*(dn+dv)][rkv]: per head dn key rows (W_UK) then dv value rows (W_UV).
 * Threads split (token, head) pairs. */
#include <stdlib.h>

#include "k3.h"
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
void k3_mla_absorb_q(float *q_abs, const float *q, const uint16_t *kv_b, int nh, int dn,
                     int dr, int dv, int rkv, int T) {
  const int64_t n = (int64_t)T * nh;
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if (n * dn * rkv >= 1048576)
  for (int64_t th = 0; th < n; th++) {
    const int h = (int)(th % nh);
    k3_absorb_head(simd, q_abs + th * (rkv + dr), q + th * (dn + dr),
                   kv_b + (int64_t)h * (dn + dv) * rkv, dn, dr, rkv);
  }
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
int k3_mla_attend(float *o_lat, const float *q_abs, const float *cache, int pos0, int T,
                  int nh, int rkv, int dr, float scale) {
  const int64_t n = (int64_t)T * nh;
  const K3Simd *simd = k3_simd();
  int status = 0;
#pragma omp parallel if (n * (pos0 + T) * (rkv + dr) >= 1048576) reduction(min : status)
  {
    float *p = malloc(sizeof(float) * ((size_t)pos0 + (size_t)T));
    if (p == NULL) status = -1;
#pragma omp for schedule(static, 1)
    for (int64_t th = 0; th < n; th++) {
      if (p == NULL) continue;
      const int t = (int)(th / nh);
      k3_attend_head(simd, o_lat + th * rkv, p, q_abs + th * (rkv + dr), cache, pos0 + t, rkv,
                     dr, scale);
    }
    free(p);
  }
  return status;
}

/* o[t][h][i] = dot8(W_UV_h[i], o_lat[t][h]) over rkv; o is [T][nh][dv]. */
void k3_mla_expand_o(float *o, const float *o_lat, const uint16_t *kv_b, int nh, int dn,
                     int dv, int rkv, int T) {
  const int64_t n = (int64_t)T * nh;
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if (n * dv * rkv >= 1048576)
  for (int64_t th = 0; th < n; th++) {
    const int h = (int)(th % nh);
    const uint16_t *w_uv = kv_b + ((int64_t)h * (dn + dv) + dn) * rkv;
    for (int i = 0; i < dv; i++) {
      o[th * dv + i] = simd->dot_bf16(w_uv + (int64_t)i * rkv, o_lat + th * rkv, rkv);
    }
  }
}
