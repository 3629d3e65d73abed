/* The per-ISA inner kernels of libk3, chosen once at run time (isa.c).
 *
 * The public kernels (linear.c, norm.c, kda.c, mla.c, ...) own the contracts, argument
 * checks and the OpenMP split; they call these inner loops through k3_simd(). Every entry
 * computes exactly the canonical order of k3.h, so the scalar, AVX2 and NEON tables give
 * the same bytes (tests/kernels/simd.test.ts and csrc/tests/harness.c check it).
 */
#ifndef K3_SIMD_H
#define K3_SIMD_H

#include <stdint.h>

struct K3Coded;

typedef struct K3Simd {
  const char *name;
  /* y[t*rows + r] = dot8(w[r], x[t]) for rows r0 <= r < r1 (w BF16 [..][cols]); `rows` is
   * only the row stride of y, so a row block of a larger matrix can write into its place. */
  void (*matmul_bf16)(float *y, const uint16_t *w, const float *x, int r0, int r1, int rows,
                      int cols, int T);
  /* The MXFP4 rows r0 <= r < r1 of k3_matmul_mxfp4 (group and cols already checked).
   * Returns -1 when one of their scale bytes is 255 (y then undefined), else 0. */
  int (*matmul_mxfp4)(float *y, const uint8_t *packed, const uint8_t *scales, const float *x,
                       int r0, int r1, int rows, int cols, int group, int T);
  /* The coded rows r0 <= r < r1 of k3_matmul_coded (the view already checked): y[t*y_stride
   * + r]. Returns -1 when a row's escapes do not match its index (y then undefined). */
  int (*matmul_coded)(float *y, const struct K3Coded *c, const float *x, int r0, int r1,
                      int y_stride, int T);
  /* dot8(a, b) over n fp32 values; dot8(w, x) with w BF16. */
  float (*dot_f32)(const float *a, const float *b, int n);
  float (*dot_bf16)(const uint16_t *w, const float *x, int n);
  /* out[s] = dot8(q, rows + s*stride) for s < count, each over n values. */
  void (*dots)(float *out, const float *q, const float *rows, int64_t stride, int count, int n);
  /* out[j] = sequential fma over s < count of w[s] * rows[s*stride + j], for j < n, starting
   * from 0 (from_zero != 0) or from the current out[j]. */
  void (*wsum)(float *out, const float *w, const float *rows, int64_t stride, int count, int n,
               int from_zero);
  /* y[j] = fma(bf16(w[j]), a, y[j]) for j < n. */
  void (*axpy_bf16)(float *y, float a, const uint16_t *w, int n);
  /* One KDA delta-rule step of one head (see kda.c). u is scratch of dim floats. */
  void (*delta_step)(float *o, float *S, float *u, const float *q, const float *kk,
                     const float *v, const float *alpha, float beta, int dim);
  /* Element-wise maps of mathf.h over n values (see k3.h for the formulas). */
  void (*situ_glu)(float *out, const float *gate, const float *up, int64_t n, float b1,
                   float b2);
  void (*sigmoid)(float *y, const float *x, int64_t n);
  void (*mul_sigmoid)(float *y, const float *g, int64_t n);
  void (*decay)(float *alpha, const float *g, const float *dt_bias, float a, float lb, int n);
} K3Simd;

/* The table in use (scalar when K3_ISA=scalar or the CPU lacks the SIMD path). */
const K3Simd *k3_simd(void);

/* The portable inner kernels (linear.c, kda.c), also the fallback of the SIMD paths when a
 * scratch allocation fails: they give the same bytes. */
void k3_matmul_bf16_scalar(float *y, const uint16_t *w, const float *x, int r0, int r1,
                           int rows, int cols, int T);
int k3_matmul_mxfp4_scalar(float *y, const uint8_t *packed, const uint8_t *scales,
                            const float *x, int r0, int r1, int rows, int cols, int group,
                            int T);
int k3_matmul_coded_scalar(float *y, const struct K3Coded *c, const float *x, int r0, int r1,
                           int y_stride, int T);
void k3_delta_step_scalar(float *o, float *S, float *u, const float *q, const float *kk,
                          const float *v, const float *alpha, float beta, int dim);
/* The same step for value columns j0 <= j < j1 only (the tail of a SIMD block loop). */
void k3_delta_cols(float *o, float *S, float *u, const float *q, const float *kk, const float *v,
                   const float *alpha, float beta, int dim, int j0, int j1);

extern const K3Simd k3_simd_scalar;
#if defined(__x86_64__)
extern const K3Simd k3_simd_avx2;
/* The coded kernel of the AVX-512 path (simd_avx512.c); isa.c builds that path's table from
 * the AVX2 one with this entry. */
int k3_matmul_coded_avx512(float *y, const struct K3Coded *c, const float *x, int r0, int r1,
                           int y_stride, int T);
/* By escape mask m (bit l: lane l is an escape): the byte shuffle that puts escape number k
 * of a group (its 8 bytes broadcast to both 128-bit halves) at byte 3 of its lane, zeros
 * elsewhere; its byte 0 (a zeroing index: bit 7 set) is 128 + the number of escapes, so one
 * index finds both. Defined in simd_avx2.c. */
extern const uint8_t k3_cx_place[256][32];
#endif
#if defined(__aarch64__)
extern const K3Simd k3_simd_neon;
#endif

#endif
