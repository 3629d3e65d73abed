/* The AVX2 + FMA inner kernels (x86-64), compiled alone with -mavx2 -mfma and used only
 * when CPUID reports both (isa.c). Every loop is the canonical order of k3.h written with
 * 8-wide registers: one register is the 8 lanes, one _mm256_fmadd_ps is one step of every
 * lane, and the lanes fold in the fixed tree; tails continue the same lanes with fmaf
 * (reduce.h). So each kernel gives the bytes of the portable table.
 *
 * MXFP4 decodes 16 packed bytes (32 columns) at a time with one byte lookup; the codes of
 * bytes 4k..4k+3 (columns 8k..8k+7) land in register positions holding canonical lanes
 * {0,2,4,6,1,3,5,7}, so x is reordered once per call the same way (k3_reorder) and the
 * lanes fold in that order at the end.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>

#include "reduce.h"
#include "simd.h"

#define K3_INLINE static inline __attribute__((always_inline))

/* ---- lanes ------------------------------------------------------------------------- */

/* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) of a register in natural lane order. */
K3_INLINE float k3_fold(__m256 v) {
  float lane[8];
  _mm256_storeu_ps(lane, v);
  return k3_lanes_sum(lane);
}

/* The same tree for a register holding lanes {0,2,4,6,1,3,5,7} (the MXFP4 order). */
K3_INLINE float k3_fold_mx(__m256 v) {
  float p[8];
  _mm256_storeu_ps(p, v);
  return ((p[0] + p[2]) + (p[1] + p[3])) + ((p[4] + p[6]) + (p[5] + p[7]));
}

/* 8 BF16 values widened exactly. */
K3_INLINE __m256 k3_widen(const uint16_t *w) {
  const __m128i h = _mm_loadu_si128((const __m128i *)w);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Folds the register, then continues its lanes over the fp32 tail a[c8..n) x b[c8..n). */
K3_INLINE float k3_finish_f32(__m256 acc, const float *a, const float *b, int c8, int n) {
  float lane[8];
  _mm256_storeu_ps(lane, acc);
  k3_lanes_f32(lane, a + c8, b + c8, n - c8);
  return k3_lanes_sum(lane);
}

/* ---- dots and sums ----------------------------------------------------------------- */

static float k3_dot_f32_avx2(const float *a, const float *b, int n) {
  const int c8 = n & ~7;
  __m256 acc = _mm256_setzero_ps();
  for (int c = 0; c < c8; c += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), acc);
  }
  return k3_finish_f32(acc, a, b, c8, n);
}

static float k3_dot_bf16_avx2(const uint16_t *w, const float *x, int n) {
  const int c8 = n & ~7;
  __m256 acc = _mm256_setzero_ps();
  for (int c = 0; c < c8; c += 8) acc = _mm256_fmadd_ps(k3_widen(w + c), _mm256_loadu_ps(x + c), acc);
  float lane[8];
  _mm256_storeu_ps(lane, acc);
  k3_lanes_bf16(lane, w + c8, x + c8, n - c8);
  return k3_lanes_sum(lane);
}

/* Four rows against one q at once: four independent chains hide the FMA latency. */
static void k3_dots_avx2(float *out, const float *q, const float *rows, int64_t stride,
                         int count, int n) {
  const int c8 = n & ~7;
  int s = 0;
  for (; s + 4 <= count; s += 4) {
    const float *r0 = rows + s * stride, *r1 = r0 + stride, *r2 = r1 + stride, *r3 = r2 + stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < c8; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0 + c), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1 + c), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r2 + c), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r3 + c), a3);
    }
    out[s] = k3_finish_f32(a0, q, r0, c8, n);
    out[s + 1] = k3_finish_f32(a1, q, r1, c8, n);
    out[s + 2] = k3_finish_f32(a2, q, r2, c8, n);
    out[s + 3] = k3_finish_f32(a3, q, r3, c8, n);
  }
  for (; s < count; s++) out[s] = k3_dot_f32_avx2(q, rows + s * stride, n);
}

/* Columns in blocks of 32 (four chains), each block summed over all rows in order. */
static void k3_wsum_avx2(float *out, const float *w, const float *rows, int64_t stride,
                         int count, int n, int from_zero) {
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256 a[4];
    for (int i = 0; i < 4; i++) a[i] = from_zero ? _mm256_setzero_ps() : _mm256_loadu_ps(out + j + 8 * i);
    for (int s = 0; s < count; s++) {
      const __m256 ws = _mm256_set1_ps(w[s]);
      const float *row = rows + s * stride + j;
      for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(ws, _mm256_loadu_ps(row + 8 * i), a[i]);
    }
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + j + 8 * i, a[i]);
  }
  for (; j < n; j++) {
    float acc = from_zero ? 0.0f : out[j];
    for (int s = 0; s < count; s++) acc = fmaf(w[s], rows[s * stride + j], acc);
    out[j] = acc;
  }
}

static void k3_axpy_bf16_avx2(float *y, float a, const uint16_t *w, int n) {
  const __m256 av = _mm256_set1_ps(a);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(k3_widen(w + j), av, _mm256_loadu_ps(y + j)));
  }
  for (; j < n; j++) y[j] = fmaf(k3_bf16(w[j]), a, y[j]);
}

/* ---- BF16 matrix ------------------------------------------------------------------- */

/* T = 1: four rows stream side by side against one x; the tail continues the lanes. */
static void k3_bf16_gemv(float *y, const uint16_t *w, const float *x, int r0, int r1,
                         int cols) {
  const int c8 = cols & ~7;
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    const uint16_t *w0 = w + (int64_t)r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < c8; c += 8) {
      const __m256 xv = _mm256_loadu_ps(x + c);
      a0 = _mm256_fmadd_ps(k3_widen(w0 + c), xv, a0);
      a1 = _mm256_fmadd_ps(k3_widen(w1 + c), xv, a1);
      a2 = _mm256_fmadd_ps(k3_widen(w2 + c), xv, a2);
      a3 = _mm256_fmadd_ps(k3_widen(w3 + c), xv, a3);
    }
    const __m256 acc[4] = {a0, a1, a2, a3};
    const uint16_t *wr[4] = {w0, w1, w2, w3};
    for (int i = 0; i < 4; i++) {
      float lane[8];
      _mm256_storeu_ps(lane, acc[i]);
      k3_lanes_bf16(lane, wr[i] + c8, x + c8, cols - c8);
      y[r + i] = k3_lanes_sum(lane);
    }
  }
  for (; r < r1; r++) y[r] = k3_dot_bf16_avx2(w + (int64_t)r * cols, x, cols);
}

/* NR rows of a widened panel (stride ldp) times NT tokens of x (stride ldx), whole rows:
 * NR*NT independent chains; y[t*ldy + r]. */
K3_INLINE void k3_micro_f32(float *y, int ldy, const float *panel, int ldp, const float *x,
                            int ldx, int cols, const int NR, const int NT) {
  const int c8 = cols & ~7;
  __m256 acc[4][3];
#pragma GCC unroll 4
  for (int r = 0; r < NR; r++) {
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
  }
  for (int c = 0; c < c8; c += 8) {
    __m256 xv[3];
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + (int64_t)t * ldx + c);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
      const __m256 wv = _mm256_loadu_ps(panel + (int64_t)r * ldp + c);
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < NR; r++) {
    for (int t = 0; t < NT; t++) {
      y[(int64_t)t * ldy + r] = k3_finish_f32(acc[r][t], panel + (int64_t)r * ldp,
                                              x + (int64_t)t * ldx, c8, cols);
    }
  }
}

/* The micro kernel for nr <= 4 rows and nt <= 3 tokens (constant shapes, unrolled). */
static void k3_micro_f32_any(float *y, int ldy, const float *panel, int ldp, const float *x,
                             int ldx, int cols, int nr, int nt) {
#define K3_CASE(R, T)                                                                      \
  case (R) * 4 + (T):                                                                      \
    k3_micro_f32(y, ldy, panel, ldp, x, ldx, cols, R, T);                                  \
    break;
  switch (nr * 4 + nt) {
    K3_CASE(4, 3) K3_CASE(4, 2) K3_CASE(4, 1) K3_CASE(3, 3) K3_CASE(3, 2) K3_CASE(3, 1)
    K3_CASE(2, 3) K3_CASE(2, 2) K3_CASE(2, 1) K3_CASE(1, 3) K3_CASE(1, 2) K3_CASE(1, 1)
  }
#undef K3_CASE
}

/* Rows per panel: about 256 KiB of widened weights (stays in L2 while every token of the
 * call passes over it), a multiple of 4, at least 4. */
static int k3_panel_rows(int cols) {
  int p = (int)((256 * 1024) / ((int64_t)cols * 4)) & ~3;
  return p < 4 ? 4 : (p > 64 ? 64 : p);
}

/* T > 1: widen a panel of rows once, then 4 rows x 3 tokens at a time from cache. */
static void k3_matmul_bf16_avx2(float *y, const uint16_t *w, const float *x, int r0, int r1,
                                int rows, int cols, int T) {
  if (T == 1) {
    k3_bf16_gemv(y, w, x, r0, r1, cols);
    return;
  }
  const int P = k3_panel_rows(cols);
  float *panel = malloc(sizeof(float) * (size_t)P * (size_t)cols);
  if (panel == NULL) {
    k3_matmul_bf16_scalar(y, w, x, r0, r1, rows, cols, T);
    return;
  }
  for (int p0 = r0; p0 < r1; p0 += P) {
    const int np = r1 - p0 < P ? r1 - p0 : P;
    for (int r = 0; r < np; r++) {
      const uint16_t *src = w + (int64_t)(p0 + r) * cols;
      float *dst = panel + (int64_t)r * cols;
      int c = 0;
      for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(dst + c, k3_widen(src + c));
      for (; c < cols; c++) dst[c] = k3_bf16(src[c]);
    }
    for (int t = 0; t < T; t += 3) {
      const int nt = T - t < 3 ? T - t : 3;
      for (int r = 0; r < np; r += 4) {
        const int nr = np - r < 4 ? np - r : 4;
        k3_micro_f32_any(y + (int64_t)t * rows + p0 + r, rows, panel + (int64_t)r * cols, cols,
                         x + (int64_t)t * cols, cols, cols, nr, nt);
      }
    }
  }
  free(panel);
}

/* ---- MXFP4 matrix ------------------------------------------------------------------ */

/* The permutation of the MXFP4 register positions: position p holds lane k3_mx_order[p]. */
#define K3_MX_ORDER 0, 2, 4, 6, 1, 3, 5, 7

/* dst = x with each 8 columns permuted into the MXFP4 register order. n % 8 == 0. */
static void k3_reorder(float *dst, const float *x, int64_t n) {
  const __m256i order = _mm256_setr_epi32(K3_MX_ORDER);
  for (int64_t c = 0; c < n; c += 8) {
    _mm256_storeu_ps(dst + c, _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + c), order));
  }
}

/* 16 packed bytes (32 columns) -> 4 registers of code2 values (twice E2M1, exact ints) in
 * the MXFP4 register order. Code 8 (-0) decodes to +0: a partial starts at +0 and fma
 * never turns +0 into -0 with a zero product, so the bytes do not change. */
K3_INLINE void k3_decode32(const uint8_t *p, __m256 out[4]) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(15);
  const __m128i b = _mm_loadu_si128((const __m128i *)p);
  const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, low4));
  const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
  const __m128i v01 = _mm_unpacklo_epi32(lo, hi), v23 = _mm_unpackhi_epi32(lo, hi);
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v01));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v01, v01)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v23));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v23, v23)));
}

/* T = 1: four rows at once against the reordered x; per group a fresh partial per row,
 * folded with the group scale. Returns -1 if a scale byte is 255. */
static int k3_mxfp4_gemv(float *y, const uint8_t *packed, const uint8_t *scales,
                         const float *xr, int r0, int r1, int cols, int group) {
  const int groups = cols / group, half = cols / 2;
  int bad = 0;
  for (int r = r0; r < r1; r += 4) {
    const int nr = r1 - r < 4 ? r1 - r : 4;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int g = 0; g < groups; g++) {
      __m256 part[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                        _mm256_setzero_ps()};
      for (int c = g * group; c < (g + 1) * group; c += 32) {
        const __m256 x0 = _mm256_loadu_ps(xr + c), x1 = _mm256_loadu_ps(xr + c + 8);
        const __m256 x2 = _mm256_loadu_ps(xr + c + 16), x3 = _mm256_loadu_ps(xr + c + 24);
        for (int i = 0; i < nr; i++) {
          __m256 d[4];
          k3_decode32(packed + (int64_t)(r + i) * half + c / 2, d);
          part[i] = _mm256_fmadd_ps(d[0], x0, part[i]);
          part[i] = _mm256_fmadd_ps(d[1], x1, part[i]);
          part[i] = _mm256_fmadd_ps(d[2], x2, part[i]);
          part[i] = _mm256_fmadd_ps(d[3], x3, part[i]);
        }
      }
      for (int i = 0; i < nr; i++) {
        const uint8_t s = scales[(int64_t)(r + i) * groups + g];
        bad |= s == 255;
        acc[i] = _mm256_fmadd_ps(part[i], _mm256_set1_ps(k3_e8m0_half(s)), acc[i]);
      }
    }
    for (int i = 0; i < nr; i++) y[r + i] = k3_fold_mx(acc[i]);
  }
  return bad ? -1 : 0;
}

/* NR decoded rows (panel, stride ldp, scales sc stride lds) times NT reordered tokens. */
K3_INLINE void k3_micro_mx(float *y, int ldy, const float *panel, int ldp, const float *sc,
                           int lds, const float *xr, int ldx, int cols, int group, const int NR,
                           const int NT) {
  __m256 acc[2][3];
#pragma GCC unroll 2
  for (int r = 0; r < NR; r++) {
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
  }
  for (int g0 = 0, g = 0; g0 < cols; g0 += group, g++) {
    __m256 part[2][3];
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) part[r][t] = _mm256_setzero_ps();
    }
    for (int c = g0; c < g0 + group; c += 8) {
      __m256 wv[2];
#pragma GCC unroll 2
      for (int r = 0; r < NR; r++) wv[r] = _mm256_loadu_ps(panel + (int64_t)r * ldp + c);
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) {
        const __m256 xv = _mm256_loadu_ps(xr + (int64_t)t * ldx + c);
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) part[r][t] = _mm256_fmadd_ps(wv[r], xv, part[r][t]);
      }
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
      const __m256 s = _mm256_broadcast_ss(sc + (int64_t)r * lds + g);
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(part[r][t], s, acc[r][t]);
    }
  }
  for (int r = 0; r < NR; r++) {
    for (int t = 0; t < NT; t++) y[(int64_t)t * ldy + r] = k3_fold_mx(acc[r][t]);
  }
}

static void k3_micro_mx_any(float *y, int ldy, const float *panel, int ldp, const float *sc,
                            int lds, const float *xr, int ldx, int cols, int group, int nr,
                            int nt) {
#define K3_CASE(R, T)                                                                      \
  case (R) * 4 + (T):                                                                      \
    k3_micro_mx(y, ldy, panel, ldp, sc, lds, xr, ldx, cols, group, R, T);                  \
    break;
  switch (nr * 4 + nt) {
    K3_CASE(2, 3) K3_CASE(2, 2) K3_CASE(2, 1) K3_CASE(1, 3) K3_CASE(1, 2) K3_CASE(1, 1)
  }
#undef K3_CASE
}

/* Decodes np rows of MXFP4 into the panel (code2 floats in register order) and their
 * scales into sc; returns -1 if a scale byte is 255. */
static int k3_decode_panel(float *panel, float *sc, const uint8_t *packed,
                           const uint8_t *scales, int np, int cols, int group) {
  const int groups = cols / group;
  int bad = 0;
  for (int r = 0; r < np; r++) {
    const uint8_t *src = packed + (int64_t)r * (cols / 2);
    float *dst = panel + (int64_t)r * cols;
    for (int c = 0; c < cols; c += 32) {
      __m256 d[4];
      k3_decode32(src + c / 2, d);
      for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + c + 8 * i, d[i]);
    }
    for (int g = 0; g < groups; g++) {
      const uint8_t s = scales[(int64_t)r * groups + g];
      bad |= s == 255;
      sc[(int64_t)r * groups + g] = k3_e8m0_half(s);
    }
  }
  return bad ? -1 : 0;
}

/* Groups that are not a multiple of 32 columns (none in K3) take the portable path. */
static int k3_matmul_mxfp4_avx2(float *y, const uint8_t *packed, const uint8_t *scales,
                                const float *x, int r0, int r1, int rows, int cols, int group,
                                int T) {
  if (group % 32 != 0) {
    return k3_matmul_mxfp4_scalar(y, packed, scales, x, r0, r1, rows, cols, group, T);
  }
  const int groups = cols / group, P = T == 1 ? 0 : k3_panel_rows(cols);
  const size_t floats = (size_t)T * cols + (size_t)P * cols + (size_t)P * groups;
  float *xr = malloc(sizeof(float) * floats);
  if (xr == NULL) return k3_matmul_mxfp4_scalar(y, packed, scales, x, r0, r1, rows, cols, group, T);
  k3_reorder(xr, x, (int64_t)T * cols);
  int status = 0;
  if (T == 1) {
    status = k3_mxfp4_gemv(y, packed, scales, xr, r0, r1, cols, group);
  } else {
    float *panel = xr + (size_t)T * cols, *sc = panel + (size_t)P * cols;
    for (int p0 = r0; p0 < r1 && status == 0; p0 += P) {
      const int np = r1 - p0 < P ? r1 - p0 : P;
      status = k3_decode_panel(panel, sc, packed + (int64_t)p0 * (cols / 2),
                               scales + (int64_t)p0 * groups, np, cols, group);
      for (int t = 0; t < T; t += 3) {
        const int nt = T - t < 3 ? T - t : 3;
        for (int r = 0; r < np; r += 2) {
          const int nr = np - r < 2 ? np - r : 2;
          k3_micro_mx_any(y + (int64_t)t * rows + p0 + r, rows, panel + (int64_t)r * cols, cols,
                          sc + (int64_t)r * groups, groups, xr + (int64_t)t * cols, cols, cols,
                          group, nr, nt);
        }
      }
    }
  }
  free(xr);
  return status;
}

/* ---- KDA --------------------------------------------------------------------------- */

/* k3_delta_step_scalar (kda.c) by blocks of 32 columns: a column's u, delta and o depend
 * only on that column, so each block runs both passes while its state is in L1. */
static void k3_delta_step_avx2(float *o, float *S, float *u, const float *q, const float *kk,
                               const float *v, const float *alpha, float beta, int dim) {
  int j = 0;
  for (; j + 32 <= dim; j += 32) {
    __m256 uu[4], oo[4];
    for (int i = 0; i < 4; i++) uu[i] = _mm256_setzero_ps();
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim + j;
      const __m256 a = _mm256_set1_ps(alpha[k]), kv = _mm256_set1_ps(kk[k]);
      for (int i = 0; i < 4; i++) {
        const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(row + 8 * i), a);
        _mm256_storeu_ps(row + 8 * i, s);
        uu[i] = _mm256_fmadd_ps(s, kv, uu[i]);
      }
    }
    for (int i = 0; i < 4; i++) {
      uu[i] = _mm256_sub_ps(_mm256_loadu_ps(v + j + 8 * i), uu[i]);
      oo[i] = _mm256_setzero_ps();
    }
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim + j;
      const __m256 kb = _mm256_set1_ps(kk[k] * beta), qv = _mm256_set1_ps(q[k]);
      for (int i = 0; i < 4; i++) {
        const __m256 s = _mm256_add_ps(_mm256_loadu_ps(row + 8 * i), _mm256_mul_ps(kb, uu[i]));
        _mm256_storeu_ps(row + 8 * i, s);
        oo[i] = _mm256_fmadd_ps(s, qv, oo[i]);
      }
    }
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + j + 8 * i, oo[i]);
  }
  if (j < dim) { /* the remaining columns, the same steps one at a time */
    for (int c = j; c < dim; c++) u[c] = 0.0f;
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim;
      for (int c = j; c < dim; c++) {
        row[c] *= alpha[k];
        u[c] = fmaf(row[c], kk[k], u[c]);
      }
    }
    for (int c = j; c < dim; c++) {
      u[c] = v[c] - u[c];
      o[c] = 0.0f;
    }
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim;
      const float kb = kk[k] * beta;
      for (int c = j; c < dim; c++) {
        row[c] += kb * u[c];
        o[c] = fmaf(row[c], q[k], o[c]);
      }
    }
  }
}

/* ---- element-wise: mathf.h's loops, compiled here with FMA instructions -------------- */

static void k3_situ_glu_avx2(float *out, const float *gate, const float *up, int64_t n,
                             float b1, float b2) {
  k3_situ_glu_map(out, gate, up, n, b1, b2);
}
static void k3_sigmoid_avx2(float *y, const float *x, int64_t n) { k3_sigmoid_map(y, x, n); }
static void k3_mul_sigmoid_avx2(float *y, const float *g, int64_t n) {
  k3_mul_sigmoid_map(y, g, n);
}
static void k3_decay_avx2(float *alpha, const float *g, const float *dt_bias, float a, float lb,
                          int n) {
  k3_decay_map(alpha, g, dt_bias, a, lb, n);
}

const K3Simd k3_simd_avx2 = {
    .name = "avx2",
    .matmul_bf16 = k3_matmul_bf16_avx2,
    .matmul_mxfp4 = k3_matmul_mxfp4_avx2,
    .dot_f32 = k3_dot_f32_avx2,
    .dot_bf16 = k3_dot_bf16_avx2,
    .dots = k3_dots_avx2,
    .wsum = k3_wsum_avx2,
    .axpy_bf16 = k3_axpy_bf16_avx2,
    .delta_step = k3_delta_step_avx2,
    .situ_glu = k3_situ_glu_avx2,
    .sigmoid = k3_sigmoid_avx2,
    .mul_sigmoid = k3_mul_sigmoid_avx2,
    .decay = k3_decay_avx2,
};

#else
/* Not x86-64: nothing to build (ISO C wants at least one declaration). */
typedef int k3_no_avx2;
#endif
