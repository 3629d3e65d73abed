/* The AVX-512 inner kernels (x86-64): the coded BF16 matrix (codec.h) with AVX-512 VL/BW
 * instructions on 256-bit registers; every other entry of its table is the AVX2 one (isa.c).
 * Used only when CPUID and the OS (XCR0) report AVX-512 F, BW and VL (isa.c).
 *
 * Why 256-bit registers: on the cores measured (Sapphire Rapids class) a 512-bit operation
 * takes ports 0 and 1 together, so 512-bit code has two vector ports where 256-bit code has
 * three; the coded kernel is bound by its decode operations, not by the width of its FMAs.
 * What AVX-512 brings to the decode is vpternlogd (the mask, the exponent and the sign flip in
 * one operation), 32 registers (four rows' state, the constants and the sums never spill)
 * and the opmask registers.
 *
 * The target is set for this file alone by pragma, so it compiles with the flags of any other
 * file (every build of libk3 compiles it, as the AVX2 file); nothing here runs unless chosen.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "codec.h"
#include "reduce.h"
#include "simd.h"

/* Every function defined below (not the headers' declarations above) gets the target. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl")
#endif

#define K3_INLINE static inline __attribute__((always_inline))

#include "coded_load.h"

/* vpternlogd truth table of (a & c) ^ b: a the spread sign-mantissa bytes, b the table entry
 * (exponent, or the escape's sign flip), c the mask 0x807F0000. */
#define K3_AND_XOR (((0xF0 & 0xAA) ^ 0xCC) & 0xFF)

/* Group g of the row as 8 floats: srlv and permd (the exponent or escape flag), movemask,
 * a byte shuffle and a shift (the escapes), a byte shuffle (sign and mantissa), one
 * vpternlogd and an or: 8 vector operations and the fma. */
K3_INLINE __m256 k3_cx_group(const uint8_t *sm_p, const uint8_t *codes, const uint8_t **esc,
                             __m256i table) {
  const __m256i code_shift = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i keep = _mm256_set1_epi32((int)0x807F0000u);
  const __m256i spread = K3_CX_SM_SPREAD;
  uint32_t bits;
  memcpy(&bits, codes, 4);
  const __m256i e =
      _mm256_permutexvar_epi32(_mm256_srlv_epi32(_mm256_set1_epi32((int)bits), code_shift), table);
  const int m = _mm256_movemask_ps(_mm256_castsi256_ps(e));
  const __m256i x = _mm256_srli_epi32(
      _mm256_shuffle_epi8(k3_cx_load8(*esc), _mm256_load_si256((const __m256i *)k3_cx_place[m])), 1);
  *esc += k3_cx_place[m][0] - 128;
  const __m256i sm = _mm256_shuffle_epi8(k3_cx_load8(sm_p), spread);
  return _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_ternarylogic_epi32(sm, e, keep, K3_AND_XOR), x));
}

#define K3_CX_LINKAGE
#define K3_CX_ENTRY k3_matmul_coded_avx512
#include "coded_simd.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
/* Not x86-64: nothing to build (ISO C wants at least one declaration). */
typedef int k3_no_avx512;
#endif
