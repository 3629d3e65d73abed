/* Checks k3_fmaf_exact (csrc/fmaf.h) against the C library's fmaf on cases that catch a
 * double rounding: random bit patterns (NaN, inf and subnormals included), near-total
 * cancellation, and addends at and around half an ulp of the product. Prints the case
 * count, how many libm results differ from k3's, and a digest of k3's results.
 * On glibc (correctly rounded) the count must be 0; on Windows the digest must match
 * Linux's while mingw's libm may differ (that count is the measured reason fmaf.h exists). */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "../fmaf.h"

static uint64_t rng = 0x9e3779b97f4a7c15u;

/* xorshift64: integer steps only, the same numbers everywhere. */
static uint32_t next_u32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 32);
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* A finite float with a random sign and significand and an exponent in [lo, hi]. */
static float random_float(int lo, int hi) {
  const int e = lo + (int)(next_u32() % (uint32_t)(hi - lo + 1));
  return from_bits((next_u32() & 0x807fffffu) | ((uint32_t)e << 23));
}

static uint64_t digest = 0xcbf29ce484222325u; /* FNV-1a over k3's result bits */
static long cases = 0, differ = 0;

static void check(float a, float b, float c) {
  const float mine = k3_fmaf_exact(a, b, c);
  const float theirs = (fmaf)(a, b, c); /* the C library's, even where fmaf.h replaces it */
  uint32_t m = to_bits(mine);
  if (isnan(mine)) m = 0x7fc00000u; /* NaN payloads are not specified */
  const int same = isnan(mine) ? isnan(theirs) : m == to_bits(theirs);
  cases++;
  differ += !same;
  for (int i = 0; i < 4; i++) digest = (digest ^ ((m >> (8 * i)) & 0xffu)) * 0x100000001b3u;
}

int main(void) {
  for (int i = 0; i < 1000000; i++) check(from_bits(next_u32()), from_bits(next_u32()),
                                          from_bits(next_u32()));
  for (int i = 0; i < 1000000; i++) { /* cancellation: c close to -a*b */
    const float a = random_float(64, 190), b = random_float(64, 190);
    const float c = -(a * b) * (1.0f + (float)((int)(next_u32() % 65) - 32) * 0x1p-23f);
    check(a, b, c);
  }
  for (int i = 0; i < 2000000; i++) { /* c near half an ulp of the product, either sign */
    const float a = random_float(100, 154), b = random_float(100, 154);
    const float p = a * b;
    const int shift = 20 + (int)(next_u32() % 12);
    const float c = ldexpf(random_float(127, 127), ilogbf(p) - shift);
    check(a, b, (next_u32() & 1) ? c : -c);
  }
  for (int i = 0; i < 2000000; i++) { /* a*b often exactly halfway between two floats, c tiny */
    const float a = random_float(110, 144), b = (float)(3 + 2 * (int)(next_u32() % 127));
    const float c = ldexpf(random_float(127, 127), ilogbf(a * b) - 25 - (int)(next_u32() % 60));
    check(a, b, (next_u32() & 1) ? c : -c);
  }
  for (int i = 0; i < 1000000; i++) { /* results in and near the subnormal range */
    check(random_float(1, 70), random_float(1, 70), random_float(0, 5));
  }
  printf("fma cases %ld, libm differs from k3 in %ld, k3 digest %016llx\n", cases, differ,
         (unsigned long long)digest);
  return 0;
}
