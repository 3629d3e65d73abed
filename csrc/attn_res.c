/* Block Attention Residual mix (MODEL.md §4.1 "AR"). Threads split tokens. */
#include "k3.h"
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
void k3_attn_res(float *out, const float *bank, int nb, int bank_stride, const float *p,
                 const float *sw, int H, float eps, int T) {
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if ((int64_t)T * (nb + 1) * H >= 262144)
  for (int t = 0; t < T; t++) {
    k3_attn_res_token(simd, out + (int64_t)t * H, bank + (int64_t)t * bank_stride * H, nb,
                      p + (int64_t)t * H, sw, H, eps);
  }
}
