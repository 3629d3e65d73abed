/* Kimi Delta Attention (MODEL.md §4.4): short conv with carried history, decay gate, the
 * delta-rule recurrence and the gated output norm. Channel c = h*dim + d everywhere. */
#include "k3.h"
#include "parallel.h"
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
typedef struct {
  const K3Simd *simd;
  float *out, *hist;
  const float *x, *w;
  int C, K, T;
} k3_conv_job;

static void k3_conv_channels(void *ctx, int64_t c0, int64_t c1) {
  const k3_conv_job *j = (const k3_conv_job *)ctx;
  for (int64_t c = c0; c < c1; c++) {
    k3_conv_channel(j->out + c, j->hist + c, j->x + c, j->w + c * j->K, j->C, j->K, j->T);
  }
}

/* SiLU: y *= sigmoid(y), per token row (the same steps as k3_siluf). */
static void k3_conv_silu_rows(void *ctx, int64_t t0, int64_t t1) {
  const k3_conv_job *j = (const k3_conv_job *)ctx;
  for (int64_t t = t0; t < t1; t++) j->simd->mul_sigmoid(j->out + t * j->C, j->out + t * j->C, j->C);
}

void k3_kda_conv(float *out, float *hist, const float *x, const float *w, int C, int K, int T) {
  k3_conv_job job = {k3_simd(), out, hist, x, w, C, K, T};
  const int worth = (int64_t)C * T >= 65536;
  k3_parallel_for(C, worth, k3_conv_channels, &job);
  k3_parallel_for(T, worth, k3_conv_silu_rows, &job);
}

/* alpha = exp(lb * sigmoid(exp(A_log[h]) * (g + dt_bias))), evaluated in that order. */
typedef struct {
  const K3Simd *simd;
  float *alpha;
  const float *g, *dt_bias, *A_log;
  int heads, dim;
  float lb;
} k3_gate_job;

static void k3_kda_gate_rows(void *ctx, int64_t t0, int64_t t1) {
  const k3_gate_job *j = (const k3_gate_job *)ctx;
  const int width = j->heads * j->dim;
  for (int64_t t = t0; t < t1; t++) {
    for (int h = 0; h < j->heads; h++) {
      const int64_t at = t * width + h * j->dim;
      j->simd->decay(j->alpha + at, j->g + at, j->dt_bias + h * j->dim, k3_expf(j->A_log[h]),
                     j->lb, j->dim);
    }
  }
}

void k3_kda_gate(float *alpha, const float *g, const float *dt_bias, const float *A_log,
                 int heads, int dim, float lb, int T) {
  k3_gate_job job = {k3_simd(), alpha, g, dt_bias, A_log, heads, dim, lb};
  k3_parallel_for(T, (int64_t)T * heads * dim >= 65536, k3_kda_gate_rows, &job);
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
typedef struct {
  const K3Simd *simd;
  float *o, *S;
  const float *q, *k, *v, *alpha, *beta;
  int heads, dim, T;
} k3_recurrence_job;

static void k3_recurrence_heads(void *ctx, int64_t h0, int64_t h1) {
  const k3_recurrence_job *j = (const k3_recurrence_job *)ctx;
  const int dim = j->dim, width = j->heads * dim;
  float u[dim];
  for (int64_t h = h0; h < h1; h++) {
    float *state = j->S + h * dim * dim;
    for (int t = 0; t < j->T; t++) {
      const int64_t at = (int64_t)t * width + h * dim;
      j->simd->delta_step(j->o + at, state, u, j->q + at, j->k + at, j->v + at, j->alpha + at,
                          j->beta[(int64_t)t * j->heads + h], dim);
    }
  }
}

void k3_kda_recurrence(float *o, float *S, const float *q, const float *k, const float *v,
                       const float *alpha, const float *beta, int heads, int dim, int T) {
  k3_recurrence_job job = {k3_simd(), o, S, q, k, v, alpha, beta, heads, dim, T};
  k3_parallel_for(heads, (int64_t)T * heads * dim * dim >= 65536, k3_recurrence_heads, &job);
}

/* Per head: y = ((o / rms(o)) * w) * sigmoid(gate); w [dim] shared by all heads.
 * y may alias o. */
typedef struct {
  const K3Simd *simd;
  float *y;
  const float *o, *w, *gate;
  int dim;
  float eps;
} k3_gated_norm_job;

static void k3_gated_norm_rows(void *ctx, int64_t th0, int64_t th1) {
  const k3_gated_norm_job *j = (const k3_gated_norm_job *)ctx;
  const int dim = j->dim;
  for (int64_t th = th0; th < th1; th++) {
    const int64_t at = th * dim;
    const float d = k3_rms_of(j->simd->dot_f32(j->o + at, j->o + at, dim), dim, j->eps);
    for (int i = 0; i < dim; i++) j->y[at + i] = (j->o[at + i] / d) * j->w[i];
    j->simd->mul_sigmoid(j->y + at, j->gate + at, dim);
  }
}

void k3_gated_rmsnorm_heads(float *y, const float *o, const float *w, const float *gate,
                            int heads, int dim, float eps, int T) {
  const int64_t n = (int64_t)T * heads;
  k3_gated_norm_job job = {k3_simd(), y, o, w, gate, dim, eps};
  k3_parallel_for(n, n * dim >= 65536, k3_gated_norm_rows, &job);
}
