/* A correctly rounded fmaf of libk3's own, used where the C library's is not: mingw-w64's
 * fmaf (Windows builds) rounds twice and differs from IEEE 754 in the last bit, which made
 * Windows kernels disagree with Linux byte for byte. Code compiled with FMA instructions
 * (-mfma, aarch64) gets one instruction from the compiler and never calls either.
 *
 * How: a*b is exact in double (24 + 24 significant bits fit in 53), so a*b + c is one
 * rounding away in double. That rounding is done "to odd" (the two-sum error tells whether
 * it was exact; if not, the last bit is forced to 1), which keeps the sticky information
 * that a second rounding to float (24 bits, at most 53 - 2) needs to be correct. */
#ifndef K3_FMAF_H
#define K3_FMAF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float k3_fmaf_exact(float a, float b, float c) {
  const double p = (double)a * (double)b;
  const double cd = (double)c;
  const double s = p + cd;
  if (!isfinite(s)) return (float)s; /* inf or NaN: one rounding, nothing to keep */
  /* Knuth's two-sum: err is exactly (p + c) - s. */
  const double pv = s - cd;
  const double err = (p - pv) + (cd - (s - pv));
  if (err != 0.0) {
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);
    /* s != 0 here (an inexact sum never rounds to zero). Even last bit: step to the odd
     * neighbour on err's side, the one between s and the exact sum. */
    if ((bits & 1) == 0) bits += ((err > 0.0) == (s > 0.0)) ? 1 : (uint64_t)-1;
    double odd;
    memcpy(&odd, &bits, sizeof odd);
    return (float)odd;
  }
  return (float)s;
}

#if defined(_WIN32) && !defined(__FMA__) && !defined(__aarch64__)
#define fmaf(a, b, c) k3_fmaf_exact(a, b, c)
#endif

#endif
