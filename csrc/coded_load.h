/* What both x86 group decoders of the coded BF16 matrix (simd_avx2.c, simd_avx512.c) load
 * a group with. Included after the file's K3_INLINE, so the helper takes that file's target. */
#ifndef K3_CODED_LOAD_H
#define K3_CODED_LOAD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"

/* 8 bytes at p in every 64-bit quarter: vbroadcastsd straight from memory (a load, no
 * shuffle). AddressSanitizer does not see loads inside that builtin, so sanitized builds read
 * through memcpy, which it checks (`make asan` then proves no read leaves the buffer). */
K3_INLINE __m256i k3_cx_load8(const uint8_t *p) {
#if defined(__SANITIZE_ADDRESS__)
  int64_t v;
  memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
#else
  return _mm256_castpd_si256(_mm256_broadcast_sd((const double *)(const void *)p));
#endif
}

/* Lane l's sign-mantissa byte (K3_CODEC_SM_POS(l) of the group's 8, which k3_cx_load8 puts in
 * both 128-bit halves) at bytes 2 and 3 of its dword: sign at bit 31, mantissa at 16..22
 * once the exponent bits 23..30 are masked off. A byte shuffle control, 8 lanes. */
#define K3_SM(l) -128, -128, K3_CODEC_SM_POS(l), K3_CODEC_SM_POS(l)
#define K3_CX_SM_SPREAD                                                                    \
  _mm256_setr_epi8(K3_SM(0), K3_SM(1), K3_SM(2), K3_SM(3), K3_SM(4), K3_SM(5), K3_SM(6),    \
                   K3_SM(7))

#endif
