/* Deterministic fp32 transcendental functions for libk3.
 *
 * libm's expf/tanhf differ between C libraries and versions, and SIMD paths cannot call
 * them. These are written only with float +, -, *, /, fmaf, floorf and bit moves (all
 * exactly specified by IEEE 754), so a scalar, AVX2 or NEON version that performs the
 * same steps produces the same bytes. Each is accurate to a few ulp over the whole float
 * range (tests/kernels/kernels.test.ts measures it). NaN in, NaN out.
 */
#ifndef K3_MATHF_H
#define K3_MATHF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fmaf.h"

/* The float whose IEEE bits are `bits` (memcpy is the portable type pun). */
static inline float k3_float_from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* 2^k for k in [-126, 127], built from the exponent field (always a normal float). */
static inline float k3_pow2i(int k) { return k3_float_from_bits((uint32_t)(k + 127) << 23); }

/* e^x. Cody-Waite reduction x = k*ln2 + r with |r| <= ln2/2, a degree-7 polynomial for
 * e^r (Cephes expf coefficients), then the scale 2^k applied in two exact halves so that
 * results down in the subnormal range are rounded once. Overflows to +inf above ~88.72,
 * underflows to 0 below ~-103.97. */
static inline float k3_expf(float x) {
  if (x != x) return x;
  if (x > 89.0f) x = 89.0f;   /* e^89 overflows anyway: keeps k in range */
  if (x < -104.0f) x = -104.0f; /* e^-104 rounds to 0 anyway */
  const float kf = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
  float r = fmaf(kf, -0.693359375f, x); /* ln2 high part: 9 bits, so k*hi is exact */
  r = fmaf(kf, 2.12194440e-4f, r);      /* minus the low part of ln2 */
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r) + 1.0f;
  const int k = (int)kf; /* in [-150, 128] */
  const int k1 = k / 2;  /* both halves in [-75, 64]: each 2^half is a normal float */
  return (p * k3_pow2i(k1)) * k3_pow2i(k - k1);
}

/* tanh(x). |x| < 0.625: odd polynomial x + x^3*P(x^2) (relative least-squares fit, error
 * 1.4e-9 before rounding); above: 1 - 2/(e^(2|x|) + 1), which has no cancellation there;
 * |x| >= 10 is +-1 in fp32. The sign is restored at the end (tanh is odd). */
static inline float k3_tanhf(float x) {
  const float a = fabsf(x);
  float t;
  if (a < 0.625f) {
    const float z = a * a;
    float p = 2.1780235692858696e-3f;
    p = fmaf(p, z, -8.214971981942654e-3f);
    p = fmaf(p, z, 2.1715553477406502e-2f);
    p = fmaf(p, z, -5.3949397057294846e-2f);
    p = fmaf(p, z, 1.333322674036026e-1f);
    p = fmaf(p, z, -3.333333134651184e-1f);
    t = fmaf(a * z, p, a);
  } else if (a < 10.0f) {
    t = 1.0f - 2.0f / (k3_expf(2.0f * a) + 1.0f);
  } else {
    t = (a == a) ? 1.0f : a; /* NaN stays NaN */
  }
  return copysignf(t, x);
}

/* 1 / (1 + e^-x), computed from e = e^-|x| <= 1 so it never overflows and stays accurate
 * for large negative x (where the result is e^x, possibly subnormal). */
static inline float k3_sigmoidf(float x) {
  const float e = k3_expf(-fabsf(x));
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

/* SiLU: x * sigmoid(x). */
static inline float k3_siluf(float x) { return x * k3_sigmoidf(x); }

/* ---- element-wise maps ----------------------------------------------------------------
 * Written once here; every ISA table (isa.c, simd_*.c) wraps them. They stay scalar C:
 * compiled with -mfma each fmaf is one instruction instead of a libm call, and the bytes
 * cannot differ because every step is an exactly rounded IEEE operation. */

/* SiTU-GLU of one element: ((b1*tanh(g/b1)) * sigmoid(g)) * (b2*tanh(u/b2)). The sigmoid
 * sees the uncapped gate; |result| < b1*b2. */
static inline float k3_situf(float g, float u, float b1, float b2) {
  const float a = (b1 * k3_tanhf(g / b1)) * k3_sigmoidf(g);
  return a * (b2 * k3_tanhf(u / b2));
}

/* out[i] = situ(gate[i], up[i]); out may alias gate or up. */
static inline void k3_situ_glu_map(float *out, const float *gate, const float *up, int64_t n,
                                   float b1, float b2) {
  for (int64_t i = 0; i < n; i++) out[i] = k3_situf(gate[i], up[i], b1, b2);
}

/* y[i] = sigmoid(x[i]); y may alias x. */
static inline void k3_sigmoid_map(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = k3_sigmoidf(x[i]);
}

/* y[i] *= sigmoid(g[i]). */
static inline void k3_mul_sigmoid_map(float *y, const float *g, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] *= k3_sigmoidf(g[i]);
}

/* KDA decay of one head: alpha[d] = exp(lb * sigmoid(a * (g[d] + dt_bias[d]))). */
static inline void k3_decay_map(float *alpha, const float *g, const float *dt_bias, float a,
                                float lb, int n) {
  for (int d = 0; d < n; d++) alpha[d] = k3_expf(lb * k3_sigmoidf(a * (g[d] + dt_bias[d])));
}

#endif
