/* The SIMD path choice: the only global state in libk3, made once and read-only after.
 * Also the portable table, built from the canonical loops of reduce.h and mathf.h. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"
#include "reduce.h"
#include "simd.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

static float k3_dot_f32_scalar(const float *a, const float *b, int n) {
  return k3_dot_f32(a, b, n);
}
static float k3_dot_bf16_scalar(const uint16_t *w, const float *x, int n) {
  return k3_dot_bf16(w, x, n);
}
static void k3_decay_scalar(float *alpha, const float *g, const float *dt_bias, float a,
                            float lb, int n) {
  k3_decay_map(alpha, g, dt_bias, a, lb, n);
}

const K3Simd k3_simd_scalar = {
    .name = "scalar",
    .matmul_bf16 = k3_matmul_bf16_scalar,
    .matmul_mxfp4 = k3_matmul_mxfp4_scalar,
    .matmul_coded = k3_matmul_coded_scalar,
    .dot_f32 = k3_dot_f32_scalar,
    .dot_bf16 = k3_dot_bf16_scalar,
    .dots = k3_dots,
    .wsum = k3_wsum,
    .axpy_bf16 = k3_axpy_bf16,
    .delta_step = k3_delta_step_scalar,
    .situ_glu = k3_situ_glu_map,
    .sigmoid = k3_sigmoid_map,
    .mul_sigmoid = k3_mul_sigmoid_map,
    .decay = k3_decay_scalar,
};

static pthread_once_t k3_isa_once = PTHREAD_ONCE_INIT;
static const K3Simd *k3_table = &k3_simd_scalar;

#if defined(__x86_64__)
/* AVX2 and FMA in the CPU, and the OS saving the YMM registers across switches (OSXSAVE,
 * then XCR0 bits 1-2). Asked of CPUID directly rather than __builtin_cpu_supports, whose
 * runtime support library is missing from some toolchains (zig's for macOS). */
static int k3_cpu_has_avx2_fma(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const unsigned osxsave = 1u << 27, avx = 1u << 28, fma = 1u << 12;
  if ((c & osxsave) == 0 || (c & avx) == 0 || (c & fma) == 0) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (b & (1u << 5)) != 0; /* AVX2 */
}

/* AVX-512 F, BW and VL in the CPU (on top of AVX2 and FMA), and the OS saving the opmask
 * and ZMM state too (XCR0 bits 5-7): the AVX-512 path's instructions fault otherwise. */
static int k3_cpu_has_avx512(void) {
  unsigned a, b, c, d;
  if (!k3_cpu_has_avx2_fma()) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6u) != 0xE6u) return 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  const unsigned f = 1u << 16, bw = 1u << 30, vl = 1u << 31;
  return (b & f) && (b & bw) && (b & vl);
}

/* The AVX-512 path: the AVX2 table with the kernels that AVX-512 makes faster (measured:
 * docs/CODEC.md). Filled once, under the pthread_once of the choice. */
static K3Simd k3_simd_avx512;
static const K3Simd *k3_avx512_table(void) {
  k3_simd_avx512 = k3_simd_avx2;
  k3_simd_avx512.name = "avx512";
  k3_simd_avx512.matmul_coded = k3_matmul_coded_avx512;
  return &k3_simd_avx512;
}
#endif

/* K3_ISA=scalar forces the portable path, K3_ISA=avx2 the AVX2 path where the CPU has it.
 * Otherwise the widest the CPU has (asked of CPUID at run time: the library never needs
 * -march=native): on x86-64 AVX-512, else AVX2+FMA, else portable; NEON on aarch64 (always
 * present there). Other values of K3_ISA are ignored. */
static void k3_choose_isa(void) {
  const char *forced = getenv("K3_ISA");
  if (forced != NULL && strcmp(forced, "scalar") == 0) return;
#if defined(__x86_64__)
  const int avx2_only = forced != NULL && strcmp(forced, "avx2") == 0;
  if (!avx2_only && k3_cpu_has_avx512()) k3_table = k3_avx512_table();
  else if (k3_cpu_has_avx2_fma()) k3_table = &k3_simd_avx2;
#elif defined(__aarch64__)
  k3_table = &k3_simd_neon;
#endif
}

/* The inner-kernel table in use; chosen on first use. */
const K3Simd *k3_simd(void) {
  pthread_once(&k3_isa_once, k3_choose_isa);
  return k3_table;
}

/* "scalar", "avx2", "avx512" or "neon"; chosen on first use. */
const char *k3_isa(void) { return k3_simd()->name; }
