/* The canonical reductions of libk3, written once (see "8-lane order" in k3.h).
 *
 * Lane l (0..7) accumulates the products of elements i with i % 8 == l, in increasing i,
 * one fmaf per step, from 0; a tail shorter than 8 continues the same lanes. The lanes
 * are combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), which is what an 8-wide SIMD
 * register folded in halves computes, so scalar and SIMD paths agree byte for byte.
 */
#ifndef K3_REDUCE_H
#define K3_REDUCE_H

#include <math.h>
#include <stdint.h>

#include "mathf.h"

/* BF16 bits -> float: the upper half of an IEEE float, widened exactly. */
static inline float k3_bf16(uint16_t bits) { return k3_float_from_bits((uint32_t)bits << 16); }

/* Folds the 8 lanes in the canonical tree. */
static inline float k3_lanes_sum(const float lane[8]) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
         ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

/* lane[i % 8] += a[i] * b[i] for i < n (fp32 a and b). */
static inline void k3_lanes_f32(float lane[8], const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++) lane[i & 7] = fmaf(a[i], b[i], lane[i & 7]);
}

/* lane[i % 8] += w[i] * x[i] for i < n (BF16 w). */
static inline void k3_lanes_bf16(float lane[8], const uint16_t *w, const float *x, int n) {
  for (int i = 0; i < n; i++) lane[i & 7] = fmaf(k3_bf16(w[i]), x[i], lane[i & 7]);
}

/* dot(a, b) over n fp32 values in 8-lane order. */
static inline float k3_dot_f32(const float *a, const float *b, int n) {
  float lane[8] = {0};
  k3_lanes_f32(lane, a, b, n);
  return k3_lanes_sum(lane);
}

/* dot(w, x) over n values, w BF16, in 8-lane order. */
static inline float k3_dot_bf16(const uint16_t *w, const float *x, int n) {
  float lane[8] = {0};
  k3_lanes_bf16(lane, w, x, n);
  return k3_lanes_sum(lane);
}

/* sqrt(sumsq/n + eps) from sumsq = dot8(x, x): the denominator of every RMS norm. */
static inline float k3_rms_of(float sumsq, int n, float eps) {
  return sqrtf(sumsq / (float)n + eps);
}

/* out[s] = dot8(q, rows + s*stride) for s < count. */
static inline void k3_dots(float *out, const float *q, const float *rows, int64_t stride,
                           int count, int n) {
  for (int s = 0; s < count; s++) out[s] = k3_dot_f32(q, rows + s * stride, n);
}

/* out[j] = sequential fma over s < count of w[s] * rows[s*stride + j], from 0 when
 * from_zero, else continuing from out[j]. */
static inline void k3_wsum(float *out, const float *w, const float *rows, int64_t stride,
                           int count, int n, int from_zero) {
  if (from_zero) {
    for (int j = 0; j < n; j++) out[j] = 0.0f;
  }
  for (int s = 0; s < count; s++) {
    const float *row = rows + s * stride;
    for (int j = 0; j < n; j++) out[j] = fmaf(w[s], row[j], out[j]);
  }
}

/* y[j] = fma(bf16(w[j]), a, y[j]). */
static inline void k3_axpy_bf16(float *y, float a, const uint16_t *w, int n) {
  for (int j = 0; j < n; j++) y[j] = fmaf(k3_bf16(w[j]), a, y[j]);
}

/* ---- MXFP4 (see "MXFP4 group order" in k3.h) ------------------------------------------
 * A code is decoded to twice its E2M1 value, an integer in [-12, 12] (exact in every
 * format, so SIMD paths may build it from byte lookups), and the group scale to
 * 2^(s-128): the same numbers, with the factor 2 moved from the weight into the scale. */

/* 2 * E2M1 value by 4-bit code: bit 3 is the sign (code 8 is -0). */
static const float k3_e2m1_x2[16] = {0.0f,  1.0f,  2.0f,  3.0f,  4.0f,  6.0f,  8.0f,  12.0f,
                                     -0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

/* E8M0 scale byte s (< 255) -> 2^(s-128), exact: s = 0 and 1 give subnormals. */
static inline float k3_e8m0_half(uint8_t s) {
  return k3_float_from_bits(s < 2 ? (uint32_t)1 << (21 + s) : (uint32_t)(s - 1) << 23);
}

/* One MXFP4 row times x in the MXFP4 group order: per group four fresh partials (column
 * offset o goes to partial (o mod 16) / 4), each folded into acc lane 4*(g mod 2) + p with
 * one fma by the group's scale; then the 8-lane fold. */
static inline float k3_dot_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x,
                                 int cols, int group) {
  float acc[8] = {0};
  for (int g0 = 0, g = 0; g0 < cols; g0 += group, g++) {
    float q[4] = {0};
    for (int o = 0; o < group; o += 2) { /* a byte: columns o (low nibble) and o + 1 */
      const uint8_t b = packed[(g0 + o) / 2];
      float *part = q + ((o & 15) >> 2);
      *part = fmaf(k3_e2m1_x2[b & 15], x[g0 + o], *part);
      *part = fmaf(k3_e2m1_x2[b >> 4], x[g0 + o + 1], *part);
    }
    const float scale = k3_e8m0_half(scales[g]);
    float *lane = acc + 4 * (g & 1);
    for (int p = 0; p < 4; p++) lane[p] = fmaf(q[p], scale, lane[p]);
  }
  return k3_lanes_sum(acc);
}

/* Softmax in place over n scores: subtract the max, k3_expf, sequential sum, divide. */
static inline void k3_softmax(float *s, int n) {
  float max = s[0];
  for (int i = 1; i < n; i++) max = s[i] > max ? s[i] : max;
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    s[i] = k3_expf(s[i] - max);
    sum += s[i];
  }
  for (int i = 0; i < n; i++) s[i] /= sum;
}

#endif
