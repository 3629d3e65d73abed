/* Block Attention Residual mix (SPEC 4.1 "AR"). Threads split tokens. */
#include "k3.h"
#include "reduce.h"

/* One token. rows[v] are the nb bank rows then p. Scores s_v = dot8(v, sw) / k3_rms(v);
 * weights = k3_softmax(s); out[i] = sequential fma over rows of w_v * v[i], from 0.
 * The score buffer is a VLA of nb+1 floats (nb is the bank size, at most a dozen). */
static void k3_attn_res_token(float *out, const float *bank, int nb, const float *p,
                              const float *sw, int H, float eps) {
  const int n = nb + 1;
  float weight[n];
  for (int v = 0; v < n; v++) {
    const float *row = v < nb ? bank + (int64_t)v * H : p;
    weight[v] = k3_dot_f32(row, sw, H) / k3_rms(row, H, eps);
  }
  k3_softmax(weight, n);
  for (int i = 0; i < H; i++) out[i] = 0.0f;
  for (int v = 0; v < n; v++) {
    const float *row = v < nb ? bank + (int64_t)v * H : p;
    for (int i = 0; i < H; i++) out[i] = fmaf(weight[v], row[i], out[i]);
  }
}

/* bank [T][bank_stride][H] (rows 0..nb-1 used), p [T][H], sw [H], out [T][H]; out must
 * not alias the inputs. */
void k3_attn_res(float *out, const float *bank, int nb, int bank_stride, const float *p,
                 const float *sw, int H, float eps, int T) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    k3_attn_res_token(out + (int64_t)t * H, bank + (int64_t)t * bank_stride * H, nb,
                      p + (int64_t)t * H, sw, H, eps);
  }
}
