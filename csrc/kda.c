/* Kimi Delta Attention (MODEL.md §4.4): short conv with carried history, decay gate, the
 * delta-rule recurrence and the gated output norm. Channel c = h*dim + d everywhere. */
#include "k3.h"
#include "reduce.h"
#include "simd.h"

/* One channel over T steps: y = sequential fma over taps j of w[j] * x(t-K+1+j), where
 * inputs before this call come from the history column (hist[j*C], oldest first); out = y
 * (the caller applies SiLU) and the history keeps the last K-1 inputs. x, out step by C. */
static void k3_conv_channel(float *out, float *hist, const float *x, const float *w, int C,
                            int K, int T) {
  const int past = K - 1; /* history length */
  for (int t = 0; t < T; t++) {
    float y = 0.0f;
    for (int j = 0; j < K; j++) {
      const int tau = t - past + j; /* input time, < 0 means history */
      const float in = tau >= 0 ? x[(int64_t)tau * C] : hist[(int64_t)(past + tau) * C];
      y = fmaf(w[j], in, y);
    }
    out[(int64_t)t * C] = y;
  }
  /* Shift: slot i takes input time T-past+i; ascending i only reads later slots. */
  for (int i = 0; i < past; i++) {
    const int tau = T - past + i;
    hist[(int64_t)i * C] = tau >= 0 ? x[(int64_t)tau * C] : hist[(int64_t)(i + T) * C];
  }
}

/* Depthwise causal conv + SiLU over x [T][C] with w [C][K], hist [K-1][C] updated in
 * place. Threads split channels. */
void k3_kda_conv(float *out, float *hist, const float *x, const float *w, int C, int K, int T) {
  const K3Simd *simd = k3_simd();
#pragma omp parallel if ((int64_t)C * T >= 65536)
  {
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      k3_conv_channel(out + c, hist + c, x + c, w + (int64_t)c * K, C, K, T);
    }
    /* SiLU: y *= sigmoid(y), per token row (the same steps as k3_siluf). */
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) simd->mul_sigmoid(out + (int64_t)t * C, out + (int64_t)t * C, C);
  }
}

/* alpha = exp(lb * sigmoid(exp(A_log[h]) * (g + dt_bias))), evaluated in that order. */
void k3_kda_gate(float *alpha, const float *g, const float *dt_bias, const float *A_log,
                 int heads, int dim, float lb, int T) {
  const int width = heads * dim;
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if ((int64_t)T * width >= 65536)
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < heads; h++) {
      const int64_t at = (int64_t)t * width + h * dim;
      simd->decay(alpha + at, g + at, dt_bias + h * dim, k3_expf(A_log[h]), lb, dim);
    }
  }
}

/* One head, one token, state S [dim][dim] indexed [k][v]. In this order:
 *   decay  S[k][:] *= alpha[k]
 *   read   u[v] = sequential fma over k of S[k][v] * kk[k]          (decayed state)
 *   write  S[k][v] += (kk[k] * beta) * (v[v] - u[v])   (plain C, not fused)
 *   read   o[v] = sequential fma over k of S[k][v] * q[k]            (updated state)
 * Decay is merged into the first read pass and the write into the second; the order of
 * operations on every element is unchanged. `u` is caller scratch of dim floats.
 * k3_delta_cols does it for the value columns j0 <= j < j1 only (columns are independent),
 * so SIMD paths can take whole vector blocks and hand the tail here. */
void k3_delta_cols(float *o, float *S, float *u, const float *q, const float *kk, const float *v,
                   const float *alpha, float beta, int dim, int j0, int j1) {
  for (int j = j0; j < j1; j++) u[j] = 0.0f;
  for (int k = 0; k < dim; k++) {
    float *row = S + (int64_t)k * dim;
    for (int j = j0; j < j1; j++) {
      row[j] *= alpha[k];
      u[j] = fmaf(row[j], kk[k], u[j]);
    }
  }
  for (int j = j0; j < j1; j++) {
    u[j] = v[j] - u[j]; /* u now holds the delta v - u */
    o[j] = 0.0f;
  }
  for (int k = 0; k < dim; k++) {
    float *row = S + (int64_t)k * dim;
    const float kb = kk[k] * beta;
    for (int j = j0; j < j1; j++) {
      row[j] += kb * u[j];
      o[j] = fmaf(row[j], q[k], o[j]);
    }
  }
}

void k3_delta_step_scalar(float *o, float *S, float *u, const float *q, const float *kk,
                          const float *v, const float *alpha, float beta, int dim) {
  k3_delta_cols(o, S, u, q, kk, v, alpha, beta, dim, 0, dim);
}

/* Delta-rule recurrence over T tokens, sequential in t; threads split heads (each head's
 * state is independent). S is [heads][dim][dim]. */
void k3_kda_recurrence(float *o, float *S, const float *q, const float *k, const float *v,
                       const float *alpha, const float *beta, int heads, int dim, int T) {
  const int width = heads * dim;
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if ((int64_t)T * heads * dim * dim >= 65536)
  for (int h = 0; h < heads; h++) {
    float u[dim];
    float *state = S + (int64_t)h * dim * dim;
    for (int t = 0; t < T; t++) {
      const int64_t at = (int64_t)t * width + h * dim;
      simd->delta_step(o + at, state, u, q + at, k + at, v + at, alpha + at,
                    beta[(int64_t)t * heads + h], dim);
    }
  }
}

/* Per head: y = ((o / rms(o)) * w) * sigmoid(gate); w [dim] shared by all heads.
 * y may alias o. */
void k3_gated_rmsnorm_heads(float *y, const float *o, const float *w, const float *gate,
                            int heads, int dim, float eps, int T) {
  const int64_t n = (int64_t)T * heads;
  const K3Simd *simd = k3_simd();
#pragma omp parallel for schedule(static) if (n * dim >= 65536)
  for (int64_t th = 0; th < n; th++) {
    const int64_t at = th * dim;
    const float d = k3_rms_of(simd->dot_f32(o + at, o + at, dim), dim, eps);
    for (int i = 0; i < dim; i++) y[at + i] = (o[at + i] / d) * w[i];
    simd->mul_sigmoid(y + at, gate + at, dim);
  }
}
