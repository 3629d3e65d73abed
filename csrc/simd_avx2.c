/* The AVX2 + FMA inner kernels (x86-64), compiled alone with -mavx2 -mfma and used only
 * when CPUID reports both (isa.c). Every loop is the canonical order of k3.h written with
 * 8-wide registers: one register is the 8 lanes, one _mm256_fmadd_ps is one step of every
 * lane, and the lanes fold in the fixed tree; tails continue the same lanes with fmaf
 * (reduce.h). So each kernel gives the bytes of the portable table.
 *
 * MXFP4 rows have their own order (k3.h), the one its decoder produces (see "MXFP4
 * matrix" below).
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
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

/* 1 < T: NR BF16 rows (stride cols) widened in registers as they stream, times NT tokens
 * of x (stride ldx), whole rows; NR*NT independent chains; y[t*ldy + r]. Each weight is
 * loaded once per token group and meets all its tokens while in a register; nothing is
 * written back widened. Each lane sums its columns in increasing order and the tail
 * continues the lanes, as the T = 1 kernel does: the same bytes whatever T. */
K3_INLINE void k3_bf16_micro(float *y, int ldy, const uint16_t *w, const float *x, int ldx,
                             int cols, const int NR, const int NT) {
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
      const __m256 wv = k3_widen(w + (int64_t)r * cols + c);
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < NR; r++) {
    for (int t = 0; t < NT; t++) {
      float lane[8];
      _mm256_storeu_ps(lane, acc[r][t]);
      k3_lanes_bf16(lane, w + (int64_t)r * cols + c8, x + (int64_t)t * ldx + c8, cols - c8);
      y[(int64_t)t * ldy + r] = k3_lanes_sum(lane);
    }
  }
}

/* The micro kernel for nr <= 4 rows and nt <= 3 tokens (constant shapes, unrolled). */
static void k3_bf16_micro_any(float *y, int ldy, const uint16_t *w, const float *x, int ldx,
                              int cols, int nr, int nt) {
#define K3_CASE(R, N)                                                                      \
  case (R) * 4 + (N):                                                                      \
    k3_bf16_micro(y, ldy, w, x, ldx, cols, R, N);                                          \
    break;
  switch (nr * 4 + nt) {
    K3_CASE(4, 3) K3_CASE(4, 2) K3_CASE(4, 1) K3_CASE(3, 3) K3_CASE(3, 2) K3_CASE(3, 1)
    K3_CASE(2, 3) K3_CASE(2, 2) K3_CASE(2, 1) K3_CASE(1, 3) K3_CASE(1, 2) K3_CASE(1, 1)
  }
#undef K3_CASE
}

/* T = 1: the gemv above. T > 1: 4 rows at a time, the T tokens in balanced groups of at
 * most 3 (4 rows x 3 tokens = 12 sums, 3 x and one row: the 16 registers); the rows of a
 * group are read from memory once and from L1 for the next token group. Measured against
 * a widened-panel kernel and a 2-row column-blocked one (12288 x 7168, 1 thread): faster
 * for every T from 2 to 64. */
static void k3_matmul_bf16_avx2(float *y, const uint16_t *w, const float *x, int r0, int r1,
                                int rows, int cols, int T) {
  if (T == 1) {
    k3_bf16_gemv(y, w, x, r0, r1, cols);
    return;
  }
  const int groups = (T + 2) / 3;
  for (int r = r0; r < r1; r += 4) {
    const int nr = r1 - r < 4 ? r1 - r : 4;
    for (int g = 0, t = 0; g < groups; g++) {
      const int nt = (T - t + (groups - g) - 1) / (groups - g);
      k3_bf16_micro_any(y + (int64_t)t * rows + r, rows, w + (int64_t)r * cols,
                        x + (int64_t)t * cols, cols, cols, nr, nt);
      t += nt;
    }
  }
}

/* Rows per panel (the MXFP4 kernel's decoded rows): about 256 KiB of fp32 (stays in L2
 * while every token of the call passes over it), a multiple of 4, at least 4. */
static int k3_panel_rows(int cols) {
  int p = (int)((256 * 1024) / ((int64_t)cols * 4)) & ~3;
  return p < 4 ? 4 : (p > 64 ? 64 : p);
}

/* ---- MXFP4 matrix ------------------------------------------------------------------ */

/* A row is read 32 bytes (64 columns: two groups of 32) at a time. Each nibble goes
 * through two byte lookups that give the two bytes of the bf16 pattern of its code2;
 * interleaving them makes 16-bit words, and a shift or a mask of each 32-bit lane turns a
 * word into its float, so 64 columns become 8 registers without int-to-float conversions.
 * Register k = 4h + j holds at position 4q + p column 32q + 16h + 4p + j of the chunk: the
 * lower half is group g, the upper half group g + 1, and position p of a half gets the
 * group offsets o with (o mod 16) / 4 == p. Registers 0..7 fused in order are therefore the
 * partials of the MXFP4 group order for both groups at once. x is reordered into the same
 * layout once per call (k3_mx_reorder).
 * Cost on Zen 5: 29 vector ops per row and chunk, about 10 cycles (~21 G weights/s per core,
 * as fast from L2 as from DRAM, so compute-bound). Tried, no gain beyond noise: F16C decode
 * (vcvtph2ps runs 1.3 per cycle, and 8 per chunk cost more than this whole decode), 6 or 8
 * rows per pass, two rows' fma steps interleaved, per-chunk scale vectors without the blend.
 * Still open: AVX-512 (same decode on two rows per zmm, ~30 G weights/s per core; the AVX-512
 * table of isa.c uses this kernel for now). */

/* Columns per chunk: two groups of 32. */
#define K3_MX_CHUNK 64

/* Floats of a reordered vector or decoded row of `cols` columns (whole chunks). */
static int64_t k3_mx_width(int cols) {
  return (int64_t)(cols + K3_MX_CHUNK - 1) / K3_MX_CHUNK * K3_MX_CHUNK;
}

/* dst = x in the chunk layout (4x4 transposes); a last half chunk is padded with zeros.
 * cols is a multiple of 32. */
static void k3_mx_reorder(float *dst, const float *x, int cols) {
  for (int c0 = 0; c0 < cols; c0 += K3_MX_CHUNK) {
    float *d = dst + c0;
    for (int q = 0; q < 2; q++) {
      for (int h = 0; h < 2; h++) {
        const float *s = x + c0 + 32 * q + 16 * h;
        __m128 r0 = _mm_setzero_ps(), r1 = r0, r2 = r0, r3 = r0;
        if (c0 + 32 * q < cols) {
          r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + 4), r2 = _mm_loadu_ps(s + 8);
          r3 = _mm_loadu_ps(s + 12);
        }
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3); /* r_j = columns 4p + j, p = 0..3 */
        _mm_storeu_ps(d + 8 * (4 * h + 0) + 4 * q, r0);
        _mm_storeu_ps(d + 8 * (4 * h + 1) + 4 * q, r1);
        _mm_storeu_ps(d + 8 * (4 * h + 2) + 4 * q, r2);
        _mm_storeu_ps(d + 8 * (4 * h + 3) + 4 * q, r3);
      }
    }
  }
}

/* 32 packed bytes (one chunk) -> its 8 registers of code2 floats. Code 8 (-0) gives -0. */
K3_INLINE void k3_mx_decode(__m256i v, __m256 f[8]) {
  /* Bytes 2 and 3 of the float bits of code2, by code (0, 1, 2, 3, 4, 6, 8, 12, -0, ...). */
#define K3_MX_B2 0, -128, 0, 64, -128, -64, 0, 64, 0, -128, 0, 64, -128, -64, 0, 64
#define K3_MX_B3 0, 63, 64, 64, 64, 64, 65, 65, -128, -65, -64, -64, -64, -64, -63, -63
  const __m256i b2 = _mm256_setr_epi8(K3_MX_B2, K3_MX_B2);
  const __m256i b3 = _mm256_setr_epi8(K3_MX_B3, K3_MX_B3);
#undef K3_MX_B2
#undef K3_MX_B3
  const __m256i low4 = _mm256_set1_epi8(15), upper = _mm256_set1_epi32((int)0xFFFF0000u);
  const __m256i lo = _mm256_and_si256(v, low4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  const __m256i lo2 = _mm256_shuffle_epi8(b2, lo), lo3 = _mm256_shuffle_epi8(b3, lo);
  const __m256i hi2 = _mm256_shuffle_epi8(b2, hi), hi3 = _mm256_shuffle_epi8(b3, hi);
  /* Words of columns 2i (lo) and 2i+1 (hi): i = 0..7 in la/ha, i = 8..15 in lb/hb. */
  const __m256i la = _mm256_unpacklo_epi8(lo2, lo3), lb = _mm256_unpackhi_epi8(lo2, lo3);
  const __m256i ha = _mm256_unpacklo_epi8(hi2, hi3), hb = _mm256_unpackhi_epi8(hi2, hi3);
  f[0] = _mm256_castsi256_ps(_mm256_slli_epi32(la, 16)); /* columns 4p     */
  f[1] = _mm256_castsi256_ps(_mm256_slli_epi32(ha, 16)); /* columns 4p + 1 */
  f[2] = _mm256_castsi256_ps(_mm256_and_si256(la, upper));
  f[3] = _mm256_castsi256_ps(_mm256_and_si256(ha, upper));
  f[4] = _mm256_castsi256_ps(_mm256_slli_epi32(lb, 16)); /* columns 16 + 4p */
  f[5] = _mm256_castsi256_ps(_mm256_slli_epi32(hb, 16));
  f[6] = _mm256_castsi256_ps(_mm256_and_si256(lb, upper));
  f[7] = _mm256_castsi256_ps(_mm256_and_si256(hb, upper));
}

/* The last, odd group of a row: 16 bytes in the lower half, zeros above. */
K3_INLINE __m256i k3_mx_load_half(const uint8_t *p) {
  return _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

/* One chunk's partials: the 8 decoded registers times the reordered x, fused in order. */
K3_INLINE __m256 k3_mx_partial(const __m256 f[8], const float *xc) {
  __m256 part = _mm256_mul_ps(f[0], _mm256_loadu_ps(xc)); /* = fma from +0, up to -0 */
#pragma GCC unroll 8
  for (int k = 1; k < 8; k++) part = _mm256_fmadd_ps(f[k], _mm256_loadu_ps(xc + 8 * k), part);
  return part;
}

/* acc + part * scales of groups 2k (lower half) and 2k + 1 (upper half); for a last odd
 * group (odd != 0) only the lower half changes. sf holds one float per group. */
K3_INLINE __m256 k3_mx_fold(__m256 acc, __m256 part, const float *sf, int k, int odd) {
  if (odd) {
    return _mm256_blend_ps(acc, _mm256_fmadd_ps(part, _mm256_broadcast_ss(sf + 2 * k), acc), 0x0F);
  }
  const __m256 s = _mm256_blend_ps(_mm256_broadcast_ss(sf + 2 * k),
                                   _mm256_broadcast_ss(sf + 2 * k + 1), 0xF0);
  return _mm256_fmadd_ps(part, s, acc);
}

/* 8 scale bytes -> 2^(s-128) as floats (k3_e8m0_half); *bad gets all ones where s = 255. */
K3_INLINE __m256 k3_mx_scales8(const uint8_t *s, __m256i *bad) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
  /* s = 0, 1: the subnormals 2^-128, 2^-127; for s >= 2 this is 2^-126, below normal. */
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(1 << 21),
                                         _mm256_min_epu32(v, _mm256_set1_epi32(2)));
  *bad = _mm256_or_si256(*bad, _mm256_cmpeq_epi32(v, _mm256_set1_epi32(255)));
  return _mm256_castsi256_ps(_mm256_max_epi32(normal, tiny));
}

/* sf[g] = 2^(s_g-128) for the `groups` scale bytes of one row (sf has room for a multiple
 * of 8). Returns nonzero when a byte is 255. */
static int k3_mx_scale_row(float *sf, const uint8_t *s, int groups) {
  __m256i bad = _mm256_setzero_si256();
  int g = 0;
  for (; g + 8 <= groups; g += 8) _mm256_storeu_ps(sf + g, k3_mx_scales8(s + g, &bad));
  if (g < groups) {
    uint8_t last[8] = {0};
    memcpy(last, s + g, (size_t)(groups - g));
    _mm256_storeu_ps(sf + g, k3_mx_scales8(last, &bad));
  }
  return !_mm256_testz_si256(bad, bad);
}

/* Floats of one row's scale buffer: groups rounded up to 8. */
static int k3_mx_lds(int groups) { return (groups + 7) & ~7; }

/* T = 1: NR rows (packed stride half, scales sf stride lds) against the reordered x. */
K3_INLINE void k3_mx_gemv_rows(float *y, const uint8_t *packed, int half, const float *sf,
                               int lds, const float *xr, int cols, const int NR) {
  const int pairs = cols / K3_MX_CHUNK, odd = (cols / 32) & 1;
  __m256 acc[4];
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) acc[i] = _mm256_setzero_ps();
  for (int k = 0; k < pairs; k++) {
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
      __m256 f[8];
      k3_mx_decode(_mm256_loadu_si256((const __m256i *)(packed + (int64_t)i * half + 32 * k)), f);
      acc[i] = k3_mx_fold(acc[i], k3_mx_partial(f, xr + K3_MX_CHUNK * k), sf + i * lds, k, 0);
    }
  }
  for (int i = 0; odd && i < NR; i++) {
    __m256 f[8];
    k3_mx_decode(k3_mx_load_half(packed + (int64_t)i * half + 32 * pairs), f);
    acc[i] = k3_mx_fold(acc[i], k3_mx_partial(f, xr + K3_MX_CHUNK * pairs), sf + i * lds, pairs, 1);
  }
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) y[i] = k3_fold(acc[i]);
}

/* T = 1 over rows r0..r1, four at a time (their scales converted first into sf, 4 rows of
 * k3_mx_lds floats). Returns -1 on a scale byte 255. */
static int k3_mx_gemv(float *y, const uint8_t *packed, const uint8_t *scales, const float *xr,
                      float *sf, int r0, int r1, int cols) {
  const int groups = cols / 32, half = cols / 2, lds = k3_mx_lds(groups);
  int bad = 0;
  for (int r = r0; r < r1; r += 4) {
    const int nr = r1 - r < 4 ? r1 - r : 4;
    for (int i = 0; i < nr; i++) {
      bad |= k3_mx_scale_row(sf + i * lds, scales + (int64_t)(r + i) * groups, groups);
    }
    const uint8_t *p = packed + (int64_t)r * half;
    if (nr == 4) {
      k3_mx_gemv_rows(y + r, p, half, sf, lds, xr, cols, 4);
    } else {
      for (int i = 0; i < nr; i++) {
        k3_mx_gemv_rows(y + r + i, p + (int64_t)i * half, half, sf + i * lds, lds, xr, cols, 1);
      }
    }
  }
  return bad ? -1 : 0;
}

/* 1 < T <= 4 (a decode pass where a few sequences chose the same expert): each chunk of a
 * row is decoded once in registers and run against every token, exactly as the T = 1
 * kernel runs it against one, so the decode (most of the cost) is shared and nothing is
 * written back decoded. NT tokens of reordered x (stride ldx); y[t*ldy]. */
K3_INLINE void k3_mx_small_row(float *y, int ldy, const uint8_t *packed, const float *sf,
                               const float *xr, int64_t ldx, int cols, const int NT) {
  const int pairs = cols / K3_MX_CHUNK, odd = (cols / 32) & 1;
  __m256 acc[4];
#pragma GCC unroll 4
  for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
  for (int k = 0; k < pairs + odd; k++) {
    __m256 f[8];
    const uint8_t *p = packed + 32 * k;
    k3_mx_decode(k < pairs ? _mm256_loadu_si256((const __m256i *)p) : k3_mx_load_half(p), f);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
      const __m256 part = k3_mx_partial(f, xr + t * ldx + K3_MX_CHUNK * k);
      acc[t] = k3_mx_fold(acc[t], part, sf, k, k == pairs);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < NT; t++) y[(int64_t)t * ldy] = k3_fold(acc[t]);
}

/* Rows r0..r1 for 1 < T <= 4; sf holds one row's scales. Returns -1 on a scale byte 255. */
static int k3_mx_small(float *y, const uint8_t *packed, const uint8_t *scales, const float *xr,
                       float *sf, int r0, int r1, int rows, int cols, int T) {
  const int groups = cols / 32, half = cols / 2;
  const int64_t w = k3_mx_width(cols);
  int bad = 0;
  for (int r = r0; r < r1; r++) {
    bad |= k3_mx_scale_row(sf, scales + (int64_t)r * groups, groups);
    const uint8_t *p = packed + (int64_t)r * half;
    if (T == 2) k3_mx_small_row(y + r, rows, p, sf, xr, w, cols, 2);
    else if (T == 3) k3_mx_small_row(y + r, rows, p, sf, xr, w, cols, 3);
    else k3_mx_small_row(y + r, rows, p, sf, xr, w, cols, 4);
  }
  return bad ? -1 : 0;
}

/* T > 1: NR decoded rows (panel, stride ldp; scales sc, stride lds) times NT reordered
 * tokens (stride ldx); y[t*ldy + r]. */
K3_INLINE void k3_mx_micro(float *y, int ldy, const float *panel, int64_t ldp, const float *sc,
                           int lds, const float *xr, int64_t ldx, int cols, const int NR,
                           const int NT) {
  const int pairs = cols / K3_MX_CHUNK, odd = (cols / 32) & 1;
  __m256 acc[2][3];
#pragma GCC unroll 2
  for (int r = 0; r < NR; r++) {
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
  }
  for (int k = 0; k < pairs + odd; k++) {
    const int64_t c = (int64_t)K3_MX_CHUNK * k;
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
      __m256 f[8];
#pragma GCC unroll 8
      for (int m = 0; m < 8; m++) f[m] = _mm256_loadu_ps(panel + r * ldp + c + 8 * m);
#pragma GCC unroll 3
      for (int t = 0; t < NT; t++) {
        const __m256 part = k3_mx_partial(f, xr + t * ldx + c);
        acc[r][t] = k3_mx_fold(acc[r][t], part, sc + r * lds, k, k == pairs);
      }
    }
  }
  for (int r = 0; r < NR; r++) {
    for (int t = 0; t < NT; t++) y[(int64_t)t * ldy + r] = k3_fold(acc[r][t]);
  }
}

static void k3_mx_micro_any(float *y, int ldy, const float *panel, int64_t ldp, const float *sc,
                            int lds, const float *xr, int64_t ldx, int cols, int nr, int nt) {
#define K3_CASE(R, T)                                                                      \
  case (R) * 4 + (T):                                                                      \
    k3_mx_micro(y, ldy, panel, ldp, sc, lds, xr, ldx, cols, R, T);                         \
    break;
  switch (nr * 4 + nt) {
    K3_CASE(2, 3) K3_CASE(2, 2) K3_CASE(2, 1) K3_CASE(1, 3) K3_CASE(1, 2) K3_CASE(1, 1)
  }
#undef K3_CASE
}

/* Decodes np rows into the panel (chunk layout, stride ldp) and their scales into sc
 * (stride lds); returns -1 on a scale byte 255. */
static int k3_mx_decode_panel(float *panel, int64_t ldp, float *sc, int lds,
                              const uint8_t *packed, const uint8_t *scales, int np, int cols) {
  const int groups = cols / 32, pairs = cols / K3_MX_CHUNK, odd = groups & 1;
  int bad = 0;
  for (int r = 0; r < np; r++) {
    const uint8_t *src = packed + (int64_t)r * (cols / 2);
    float *dst = panel + r * ldp;
    for (int k = 0; k < pairs + odd; k++) {
      __m256 f[8];
      const uint8_t *p = src + 32 * k;
      k3_mx_decode(k < pairs ? _mm256_loadu_si256((const __m256i *)p) : k3_mx_load_half(p), f);
      for (int m = 0; m < 8; m++) _mm256_storeu_ps(dst + K3_MX_CHUNK * k + 8 * m, f[m]);
    }
    bad |= k3_mx_scale_row(sc + r * lds, scales + (int64_t)r * groups, groups);
  }
  return bad ? -1 : 0;
}

/* T > 1: a panel of rows decoded once, then 2 rows x 3 tokens at a time from cache. */
static int k3_mx_gemm(float *y, const uint8_t *packed, const uint8_t *scales, const float *xr,
                      float *panel, float *sc, int r0, int r1, int rows, int cols, int T) {
  const int P = k3_panel_rows(cols), lds = k3_mx_lds(cols / 32);
  const int64_t w = k3_mx_width(cols);
  int status = 0;
  for (int p0 = r0; p0 < r1 && status == 0; p0 += P) {
    const int np = r1 - p0 < P ? r1 - p0 : P;
    status = k3_mx_decode_panel(panel, w, sc, lds, packed + (int64_t)p0 * (cols / 2),
                                scales + (int64_t)p0 * (cols / 32), np, cols);
    for (int t = 0; t < T; t += 3) {
      const int nt = T - t < 3 ? T - t : 3;
      for (int r = 0; r < np; r += 2) {
        const int nr = np - r < 2 ? np - r : 2;
        k3_mx_micro_any(y + (int64_t)t * rows + p0 + r, rows, panel + r * w, w, sc + r * lds,
                        lds, xr + t * w, w, cols, nr, nt);
      }
    }
  }
  return status;
}

/* Groups other than 32 (none in K3) take the portable path. */
static int k3_matmul_mxfp4_avx2(float *y, const uint8_t *packed, const uint8_t *scales,
                                const float *x, int r0, int r1, int rows, int cols, int group,
                                int T) {
  if (group != 32) {
    return k3_matmul_mxfp4_scalar(y, packed, scales, x, r0, r1, rows, cols, group, T);
  }
  const int64_t w = k3_mx_width(cols), lds = k3_mx_lds(cols / 32);
  const int P = T == 1 ? 4 : k3_panel_rows(cols);
  const size_t floats = (size_t)(T * w + (T == 1 ? 0 : P * w) + P * lds);
  float *xr = malloc(sizeof(float) * floats);
  if (xr == NULL) return k3_matmul_mxfp4_scalar(y, packed, scales, x, r0, r1, rows, cols, group, T);
  for (int t = 0; t < T; t++) k3_mx_reorder(xr + t * w, x + (int64_t)t * cols, cols);
  float *panel = xr + T * w, *sf = panel + (T == 1 ? 0 : P * w);
  const int status =
      T == 1   ? k3_mx_gemv(y, packed, scales, xr, sf, r0, r1, cols)
      : T <= 4 ? k3_mx_small(y, packed, scales, xr, sf, r0, r1, rows, cols, T)
               : k3_mx_gemm(y, packed, scales, xr, panel, sf, r0, r1, rows, cols, T);
  free(xr);
  return status;
}

/* ---- coded BF16 matrix (codec.h) --------------------------------------------------- */

/* A group of 8 weights is decoded in one register with no branch on the data:
 *  - sign and mantissa: the group's 8 bytes broadcast to every 64-bit quarter; one byte
 *    shuffle puts lane l's byte (K3_CODEC_SM_POS) at bytes 2 and 3 of its dword and a mask
 *    keeps the sign (bit 31) and the mantissa (bits 16..22);
 *  - exponent: the 24 code bits broadcast and shifted by lane index a permute of the block
 *    table (exponents at bits 23..30; the escape entry is the sign bit alone);
 *  - escapes: movemask of that sign bit names the escape lanes; 8 bytes loaded at the row's
 *    escape cursor are placed by a byte shuffle chosen by the mask (k3_cx_place: escape
 *    number k of the group goes to byte 3 of its lane, others zero) and shifted to bits
 *    23..30; the encoder stored those lanes' signs inverted, so xor with the table entry
 *    restores them.
 * The register is then exactly k3_widen of the decoded BF16 group, so the kernels
 * (coded_simd.h) are the BF16 kernels above with k3_widen replaced. 10 vector operations per
 * group with the fma: the kernel is bound by them, not by memory (docs/CODEC.md §3).
 * AVX-512 (simd_avx512.c, chosen at run time where the CPU has F, BW and VL) runs the same
 * decode on 256-bit registers with vpternlogd (mask, exponent and sign flip in one operation)
 * and 32 registers: 9 operations. Tried for it, on paper and not written: 512-bit registers
 * with two rows each (a row's lanes must keep the 8-lane order, so the two halves need their
 * own tables, escape cursors and shuffle controls: about 15 operations per 16 weights on the
 * two 512-bit ports, no better), and vpexpandb in place of the shuffle table (no fewer
 * operations once the byte mask and the escape count are built). */

/* Popcount of m & ((1 << l) - 1): escape number of lane l under mask m. */
#define K3_B(m, l) (((m) >> (l)) & 1)
#define K3_PC(x)                                                                           \
  (K3_B(x, 0) + K3_B(x, 1) + K3_B(x, 2) + K3_B(x, 3) + K3_B(x, 4) + K3_B(x, 5) + K3_B(x, 6) + \
   K3_B(x, 7))
#define K3_LANE3(m, l) (K3_B(m, l) ? K3_PC((m) & ((1 << (l)) - 1)) : 128)
#define K3_LANE(m, l) 128, 128, 128, K3_LANE3(m, l)
/* Byte 0 (lane 0's low byte, always zeroed: bit 7 set) is 128 + the escapes of the mask. */
#define K3_PLACE(m)                                                                        \
  {128 + K3_PC(m), 128, 128, K3_LANE3(m, 0), K3_LANE(m, 1), K3_LANE(m, 2), K3_LANE(m, 3),  \
   K3_LANE(m, 4), K3_LANE(m, 5), K3_LANE(m, 6), K3_LANE(m, 7)}
#define K3_PLACE4(m) K3_PLACE(m), K3_PLACE(m + 1), K3_PLACE(m + 2), K3_PLACE(m + 3)
#define K3_PLACE16(m) K3_PLACE4(m), K3_PLACE4(m + 4), K3_PLACE4(m + 8), K3_PLACE4(m + 12)
#define K3_PLACE64(m) K3_PLACE16(m), K3_PLACE16(m + 16), K3_PLACE16(m + 32), K3_PLACE16(m + 48)
/* Shuffle control by escape mask (the 8 escape bytes sit in both 128-bit halves); also read
 * by simd_avx512.c. */
const uint8_t k3_cx_place[256][32] __attribute__((aligned(32))) = {
    K3_PLACE64(0), K3_PLACE64(64), K3_PLACE64(128), K3_PLACE64(192)};
#undef K3_PLACE64
#undef K3_PLACE16
#undef K3_PLACE4
#undef K3_PLACE
#undef K3_LANE
#undef K3_LANE3
#undef K3_PC
#undef K3_B

#include "coded_load.h"

/* Group g of the row as 8 floats (the exact widening of its BF16 weights): 10 vector
 * operations with the fma (srlv, permd, movemask, 2 pshufb, srli, and, xor, or). */
K3_INLINE __m256 k3_cx_group(const uint8_t *sm_p, const uint8_t *codes, const uint8_t **esc,
                             __m256i table) {
  const __m256i code_shift = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i keep = _mm256_set1_epi32((int)0x807F0000u);
  uint32_t bits;
  memcpy(&bits, codes, 4);
  const __m256i e =
      _mm256_permutevar8x32_epi32(table, _mm256_srlv_epi32(_mm256_set1_epi32((int)bits), code_shift));
  const int m = _mm256_movemask_ps(_mm256_castsi256_ps(e));
  const __m256i x = _mm256_srli_epi32(
      _mm256_shuffle_epi8(k3_cx_load8(*esc), _mm256_load_si256((const __m256i *)k3_cx_place[m])), 1);
  *esc += k3_cx_place[m][0] - 128;
  const __m256i sm = _mm256_and_si256(_mm256_shuffle_epi8(k3_cx_load8(sm_p), K3_CX_SM_SPREAD), keep);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_xor_si256(sm, e), x));
}

#define K3_CX_LINKAGE static
#define K3_CX_ENTRY k3_matmul_coded_avx2
#include "coded_simd.h"
#undef K3_CX_ENTRY
#undef K3_CX_LINKAGE

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
  k3_delta_cols(o, S, u, q, kk, v, alpha, beta, dim, j, dim); /* the tail */
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
    .matmul_coded = k3_matmul_coded_avx2,
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
