/* SHA-256 (FIPS 180-4) over caller-owned state. `k3 download` hashes a file in order as its
 * pieces land and saves the eight state words with its progress record, so a resumed
 * download continues the hash where it stopped instead of re-reading what is on disk.
 * Two compressors give the same words: the portable one below, and the x86 SHA extensions
 * (SHA-NI) when CPUID reports them; K3_ISA=scalar forces the portable one. */
#include <stdlib.h>
#include <string.h>

#include "k3.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* The portable compressor: FIPS 180-4 section 6.2.2, one 64-byte block at a time. */
static void sha256_blocks_scalar(uint32_t s[8], const uint8_t *p, int64_t nblocks) {
  for (; nblocks > 0; nblocks--, p += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
      w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
             (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    for (int i = 0; i < 64; i++) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] +
                    w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s[0] += a, s[1] += b, s[2] += c, s[3] += d, s[4] += e, s[5] += f, s[6] += g, s[7] += h;
  }
}

#if defined(__x86_64__)
/* The SHA-NI compressor. The state lives in two registers as ABEF and CDGH; each group of
 * four message words is scheduled with sha256msg1/msg2 from the previous four groups. */
__attribute__((target("sha,sse4.1,ssse3"))) static void sha256_blocks_shani(
    uint32_t s[8], const uint8_t *p, int64_t nblocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&s[0]), 0xB1); /* CDAB */
  __m128i st1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&s[4]), 0x1B); /* EFGH */
  __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);                                     /* ABEF */
  st1 = _mm_blend_epi16(st1, tmp, 0xF0);                                          /* CDGH */
  for (; nblocks > 0; nblocks--, p += 64) {
    const __m128i abef = st0, cdgh = st1;
    __m128i w[4]; /* w[g % 4] holds message group g, g = 0..15 */
#pragma GCC unroll 16
    for (int g = 0; g < 16; g++) {
      if (g < 4) {
        w[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
      } else {
        __m128i m = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
        m = _mm_add_epi32(m, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
        w[g & 3] = _mm_sha256msg2_epu32(m, w[(g + 3) & 3]);
      }
      __m128i msg = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
      st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
      st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(msg, 0x0E));
    }
    st0 = _mm_add_epi32(st0, abef);
    st1 = _mm_add_epi32(st1, cdgh);
  }
  tmp = _mm_shuffle_epi32(st0, 0x1B);  /* FEBA */
  st1 = _mm_shuffle_epi32(st1, 0xB1);  /* DCHG */
  st0 = _mm_blend_epi16(tmp, st1, 0xF0); /* DCBA */
  st1 = _mm_alignr_epi8(st1, tmp, 8);  /* HGFE */
  _mm_storeu_si128((__m128i *)&s[0], st0);
  _mm_storeu_si128((__m128i *)&s[4], st1);
}

static int cpu_has_shani(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (!(c & bit_SSSE3) || !(c & bit_SSE4_1)) return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (b & bit_SHA) != 0;
}
#endif

/* The compressor in use, decided from the environment and CPUID on each call (cheap next
 * to a block of 64 bytes x thousands; no global state). */
static int use_shani(void) {
#if defined(__x86_64__)
  const char *forced = getenv("K3_ISA");
  if (forced != NULL && strcmp(forced, "scalar") == 0) return 0;
  return cpu_has_shani();
#else
  return 0;
#endif
}

const char *k3_sha256_impl(void) { return use_shani() ? "sha-ni" : "scalar"; }

void k3_sha256_init(uint32_t state[8]) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(state, iv, sizeof iv);
}

int k3_sha256_blocks(uint32_t state[8], const uint8_t *data, int64_t nbytes) {
  if (nbytes < 0 || nbytes % 64 != 0) return -1;
#if defined(__x86_64__)
  if (use_shani()) {
    sha256_blocks_shani(state, data, nbytes / 64);
    return 0;
  }
#endif
  sha256_blocks_scalar(state, data, nbytes / 64);
  return 0;
}

int k3_sha256_final(uint32_t state[8], const uint8_t *tail, int64_t tail_len, int64_t total_len,
                    uint8_t out[32]) {
  if (tail_len < 0 || total_len < tail_len || (total_len - tail_len) % 64 != 0) return -1;
  int64_t whole = tail_len - tail_len % 64;
  k3_sha256_blocks(state, tail, whole);
  uint8_t last[128] = {0};
  int64_t rest = tail_len - whole;
  memcpy(last, tail + whole, (size_t)rest);
  last[rest] = 0x80;
  int64_t padded = rest + 9 <= 64 ? 64 : 128;
  uint64_t bits = (uint64_t)total_len * 8;
  for (int i = 0; i < 8; i++) last[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
  k3_sha256_blocks(state, last, padded);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(state[i] >> 24), out[4 * i + 1] = (uint8_t)(state[i] >> 16);
    out[4 * i + 2] = (uint8_t)(state[i] >> 8), out[4 * i + 3] = (uint8_t)state[i];
  }
  return 0;
}
