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

/* sqrt(dot8(x, x)/n + eps): the root-mean-square denominator of every RMS norm. */
static inline float k3_rms(const float *x, int n, float eps) {
  return sqrtf(k3_dot_f32(x, x, n) / (float)n + eps);
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
