/* Block Attention Residual mix (MODEL.md §4.1 "AR"). Threads split tokens. */
#include "k3.h"
#include "parallel.h"
#include "reduce.h"
#include "simd.h"

/* One token. rows[v] are the nb bank rows then p. Scores s_v = dot8(v, sw) / rms(v);
 * weights = k3_softmax(s); out[i] = sequential fma over rows of w_v * v[i], from 0 (the
 * bank rows, then p as the last step). The score buffer is a VLA of nb+1 floats (nb is
 * the bank size, at most a dozen). */
static void k3_attn_res_token(const K3Simd *simd, float *out, const float *bank, int nb,
                              const float *p, const float *sw, int H, float eps) {
  const int n = nb + 1;
  float weight[n];
  for (int v = 0; v < n; v++) {
    const float *row = v < nb ? bank + (int64_t)v * H : p;
    weight[v] = simd->dot_f32(row, sw, H) / k3_rms_of(simd->dot_f32(row, row, H), H, eps);
  }
  k3_softmax(weight, n);
  simd->wsum(out, weight, bank, H, nb, H, 1);
  simd->wsum(out, weight + nb, p, H, 1, H, 0);
}

/* bank [T][bank_stride][H] (rows 0..nb-1 used), p [T][H], sw [H], out [T][H]; out must
 * not alias the inputs. */
typedef struct {
  const K3Simd *simd;
  float *out;
  const float *bank, *p, *sw;
  int nb, bank_stride, H;
  float eps;
} k3_attn_res_job;

static void k3_attn_res_tokens(void *ctx, int64_t t0, int64_t t1) {
  const k3_attn_res_job *j = (const k3_attn_res_job *)ctx;
  const int64_t H = j->H;
  for (int64_t t = t0; t < t1; t++) {
    k3_attn_res_token(j->simd, j->out + t * H, j->bank + t * j->bank_stride * H, j->nb,
                      j->p + t * H, j->sw, j->H, j->eps);
  }
}

void k3_attn_res(float *out, const float *bank, int nb, int bank_stride, const float *p,
                 const float *sw, int H, float eps, int T) {
  k3_attn_res_job job = {k3_simd(), out, bank, p, sw, nb, bank_stride, H, eps};
  k3_parallel_for(T, (int64_t)T * (nb + 1) * H >= 262144, k3_attn_res_tokens, &job);
}
