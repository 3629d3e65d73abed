/* The aarch64 NEON inner kernels. The 8 canonical lanes are two float32x4 registers
 * (lanes 0-3 and 4-7); vfmaq_f32 is one fused step of four lanes, and the fold is the
 * tree of k3.h, so the bytes are those of the portable table. Kernels without a NEON body
 * here use the portable loops, which on aarch64 already compile fmaf to one instruction.
 */
#if defined(__aarch64__)
#include <arm_neon.h>

#include "codec.h"
#include "reduce.h"
#include "simd.h"

/* Two registers of lanes 0-3 and 4-7, folded as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float k3_fold2(float32x4_t lo, float32x4_t hi) {
  const float32x4_t s = vaddq_f32(lo, hi); /* l0+l4, l1+l5, l2+l6, l3+l7 */
  return (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) +
         (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
}

/* Folds after continuing the lanes over a tail (fp32 or BF16 weights). */
static inline float k3_finish(float32x4_t lo, float32x4_t hi, const uint16_t *w, const float *a,
                              const float *b, int n) {
  float lane[8];
  vst1q_f32(lane, lo);
  vst1q_f32(lane + 4, hi);
  if (w != NULL) k3_lanes_bf16(lane, w, b, n);
  else k3_lanes_f32(lane, a, b, n);
  return k3_lanes_sum(lane);
}

/* 8 BF16 values widened exactly, as lanes 0-3 and 4-7. */
static inline void k3_widen8(const uint16_t *w, float32x4_t *lo, float32x4_t *hi) {
  const uint16x8_t h = vld1q_u16(w);
  *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
  *hi = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16));
}

static float k3_dot_f32_neon(const float *a, const float *b, int n) {
  const int c8 = n & ~7;
  float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
  for (int c = 0; c < c8; c += 8) {
    lo = vfmaq_f32(lo, vld1q_f32(a + c), vld1q_f32(b + c));
    hi = vfmaq_f32(hi, vld1q_f32(a + c + 4), vld1q_f32(b + c + 4));
  }
  if (c8 == n) return k3_fold2(lo, hi);
  return k3_finish(lo, hi, NULL, a + c8, b + c8, n - c8);
}

static float k3_dot_bf16_neon(const uint16_t *w, const float *x, int n) {
  const int c8 = n & ~7;
  float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
  for (int c = 0; c < c8; c += 8) {
    float32x4_t wl, wh;
    k3_widen8(w + c, &wl, &wh);
    lo = vfmaq_f32(lo, wl, vld1q_f32(x + c));
    hi = vfmaq_f32(hi, wh, vld1q_f32(x + c + 4));
  }
  if (c8 == n) return k3_fold2(lo, hi);
  return k3_finish(lo, hi, w + c8, NULL, x + c8, n - c8);
}

static void k3_matmul_bf16_neon(float *y, const uint16_t *w, const float *x, int r0, int r1,
                                int rows, int cols, int T) {
  for (int r = r0; r < r1; r++) {
    for (int t = 0; t < T; t++) {
      y[(int64_t)t * rows + r] = k3_dot_bf16_neon(w + (int64_t)r * cols, x + (int64_t)t * cols, cols);
    }
  }
}

/* 16 packed bytes (32 columns) -> code2 values as the 8 steps of the MXFP4 group order:
 * step 4h + j holds, in lane p, column 16h + 4p + j. Byte i holds columns 2i (low nibble)
 * and 2i + 1, so bytes 8h + 2p hold steps 4h and 4h + 1, bytes 8h + 2p + 1 steps 4h + 2 and
 * 4h + 3: the bytes are first permuted into runs of four by step. */
static inline void k3_decode_steps(const uint8_t *p, float32x4_t step[8]) {
  static const int8_t lut_bytes[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  static const uint8_t order[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
  const int8x16_t lut = vld1q_s8(lut_bytes);
  const uint8x16_t b = vqtbl1q_u8(vld1q_u8(p), vld1q_u8(order));
  const int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(b, vdupq_n_u8(15))); /* steps 0, 2, 4, 6 */
  const int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));            /* steps 1, 3, 5, 7 */
  const int16x8_t lo0 = vmovl_s8(vget_low_s8(lo)), lo1 = vmovl_s8(vget_high_s8(lo));
  const int16x8_t hi0 = vmovl_s8(vget_low_s8(hi)), hi1 = vmovl_s8(vget_high_s8(hi));
  step[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo0)));
  step[1] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi0)));
  step[2] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo0)));
  step[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi0)));
  step[4] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo1)));
  step[5] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi1)));
  step[6] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo1)));
  step[7] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi1)));
}

/* One MXFP4 row in the MXFP4 group order: per group of 32 one register of four partials
 * (vld4q_f32 loads x in the same step layout), folded with the scale into the lanes 0-3
 * (even groups) or 4-7 (odd groups). */
static float k3_dot_mxfp4_neon(const uint8_t *packed, const uint8_t *scales, const float *x,
                               int cols, int group) {
  float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int g0 = 0, g = 0; g0 < cols; g0 += group, g++) {
    float32x4_t q = vdupq_n_f32(0.0f);
    for (int c = g0; c < g0 + group; c += 32) {
      float32x4_t step[8];
      k3_decode_steps(packed + c / 2, step);
      for (int h = 0; h < 2; h++) {
        const float32x4x4_t xs = vld4q_f32(x + c + 16 * h); /* val[j][p] = x[16h + 4p + j] */
        for (int j = 0; j < 4; j++) q = vfmaq_f32(q, step[4 * h + j], xs.val[j]);
      }
    }
    acc[g & 1] = vfmaq_f32(acc[g & 1], q, vdupq_n_f32(k3_e8m0_half(scales[g])));
  }
  return k3_fold2(acc[0], acc[1]);
}

/* Groups that are not a multiple of 32 columns take the portable path. */
static int k3_matmul_mxfp4_neon(float *y, const uint8_t *packed, const uint8_t *scales,
                                const float *x, int r0, int r1, int rows, int cols, int group,
                                int T) {
  if (group % 32 != 0) {
    return k3_matmul_mxfp4_scalar(y, packed, scales, x, r0, r1, rows, cols, group, T);
  }
  const int groups = cols / group;
  for (int64_t i = (int64_t)r0 * groups; i < (int64_t)r1 * groups; i++) {
    if (scales[i] == 255) return -1;
  }
  for (int r = r0; r < r1; r++) {
    for (int t = 0; t < T; t++) {
      y[(int64_t)t * rows + r] = k3_dot_mxfp4_neon(packed + (int64_t)r * (cols / 2),
                                                   scales + (int64_t)r * groups,
                                                   x + (int64_t)t * cols, cols, group);
    }
  }
  return 0;
}

/* ---- coded BF16 matrix (codec.h) ----------------------------------------------------
 * A group of 8 weights decoded in registers: the 3-bit codes spread to bytes by per-lane
 * shifts, the exponents looked up in the block table (vtbl), the sign-mantissa bytes put back
 * in lane order (vtbl), escapes patched from the row's cursor when the group has any, and the
 * BF16 words widened as k3_widen8 does; the lanes are those of k3_dot_bf16_neon. */

typedef struct {
  const uint8_t *sm, *codes, *esc;
  int64_t used, n;
  uint8x8_t table; /* codes 0..6, and 0 for the escape code */
} k3_nx_row;

static void k3_nx_open(k3_nx_row *q, const K3Coded *c, int r) {
  q->sm = c->main + (int64_t)r * c->row_bytes;
  q->codes = q->sm + 8 * (int64_t)c->groups;
  q->esc = k3_coded_escape_at(c, r);
  q->used = 0;
  q->n = k3_coded_escape_at(c, r + 1) - q->esc;
  q->table = vld1_u8(c->tables + 8 * (int64_t)(r / c->block_rows)); /* byte 7 is 0 */
}

/* Group g as lanes 0-3 and 4-7 of floats. */
static inline void k3_nx_group(k3_nx_row *q, int g, float32x4_t *lo, float32x4_t *hi) {
  static const int32_t shift_lo[4] = {0, -3, -6, -9}, shift_hi[4] = {-12, -15, -18, -21};
  static const uint8_t sm_order[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* K3_CODEC_SM_POS */
  const uint8_t *p = q->codes + 3 * (int64_t)g;
  const uint32x4_t bits = vdupq_n_u32(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16);
  const uint32x4_t c0 = vshlq_u32(bits, vld1q_s32(shift_lo)), c1 = vshlq_u32(bits, vld1q_s32(shift_hi));
  const uint8x8_t codes =
      vand_u8(vmovn_u16(vcombine_u16(vmovn_u32(c0), vmovn_u32(c1))), vdup_n_u8(7));
  uint8x8_t e = vtbl1_u8(q->table, codes);
  uint8x8_t sm = vtbl1_u8(vld1_u8(q->sm + 8 * (int64_t)g), vld1_u8(sm_order));
  const uint8x8_t esc = vceq_u8(codes, vdup_n_u8(K3_CODEC_ESCAPE));
  if (vget_lane_u64(vreinterpret_u64_u8(esc), 0) != 0) {
    uint8_t ev[8], cv[8];
    vst1_u8(ev, e);
    vst1_u8(cv, codes);
    for (int l = 0; l < 8; l++) {
      if (cv[l] == K3_CODEC_ESCAPE) ev[l] = q->esc[q->used++]; /* inside the pad: <= 8G */
    }
    e = vld1_u8(ev);
    sm = veor_u8(sm, vand_u8(esc, vdup_n_u8(0x80))); /* stored inverted for escapes */
  }
  const uint16x8_t s16 = vmovl_u8(sm), e16 = vmovl_u8(e);
  const uint16x8_t w = vorrq_u16(vorrq_u16(vshlq_n_u16(vandq_u16(s16, vdupq_n_u16(0x80)), 8),
                                           vshlq_n_u16(e16, 7)),
                                 vandq_u16(s16, vdupq_n_u16(0x7F)));
  *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(w), 16));
  *hi = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(w), 16));
}

/* Row r for nt <= 4 tokens (x stride cols): each group decoded once, then every token's
 * lanes; the tail and fold as k3_dot_bf16_neon. Returns -1 when the escapes do not match. */
static int k3_nx_row_tokens(float *y, int ldy, const K3Coded *c, int r, const float *x, int nt) {
  const int c8 = c->cols & ~7;
  k3_nx_row q;
  k3_nx_open(&q, c, r);
  float32x4_t lo[4], hi[4];
  for (int t = 0; t < nt; t++) lo[t] = hi[t] = vdupq_n_f32(0.0f);
  for (int g = 0; g < c8 / 8; g++) {
    float32x4_t wl, wh;
    k3_nx_group(&q, g, &wl, &wh);
    for (int t = 0; t < nt; t++) {
      const float *xt = x + (int64_t)t * c->cols + 8 * g;
      lo[t] = vfmaq_f32(lo[t], wl, vld1q_f32(xt));
      hi[t] = vfmaq_f32(hi[t], wh, vld1q_f32(xt + 4));
    }
  }
  uint16_t tail[8];
  if (c8 < c->cols) {
    if (q.used > q.n) return -1;
    const uint8_t *cur = q.esc + q.used;
    if (k3_coded_group(c, r, c8 / 8, tail, &cur, q.esc + q.n) != 0) return -1;
    q.used = cur - q.esc;
  }
  if (q.used != q.n) return -1;
  for (int t = 0; t < nt; t++) {
    y[(int64_t)t * ldy] = c8 == c->cols ? k3_fold2(lo[t], hi[t])
                                        : k3_finish(lo[t], hi[t], tail, NULL,
                                                    x + (int64_t)t * c->cols + c8, c->cols - c8);
  }
  return 0;
}

static int k3_matmul_coded_neon(float *y, const K3Coded *c, const float *x, int r0, int r1,
                                int y_stride, int T) {
  int bad = 0;
  for (int r = r0; r < r1; r++) {
    for (int t = 0; t < T; t += 4) {
      const int nt = T - t < 4 ? T - t : 4;
      bad |= k3_nx_row_tokens(y + (int64_t)t * y_stride + r, y_stride, c, r,
                              x + (int64_t)t * c->cols, nt);
    }
  }
  return bad ? -1 : 0;
}

static void k3_dots_neon(float *out, const float *q, const float *rows, int64_t stride,
                         int count, int n) {
  for (int s = 0; s < count; s++) out[s] = k3_dot_f32_neon(q, rows + s * stride, n);
}

/* k3_delta_cols (kda.c) by blocks of 16 value columns: a column's u, delta and o depend
 * only on that column, and each element sees the same operations in the same order
 * (multiply, fused multiply-add, subtract, multiply then add, fused multiply-add). */
static void k3_delta_step_neon(float *o, float *S, float *u, const float *q, const float *kk,
                               const float *v, const float *alpha, float beta, int dim) {
  int j = 0;
  for (; j + 16 <= dim; j += 16) {
    float32x4_t uu[4], oo[4];
    for (int i = 0; i < 4; i++) uu[i] = vdupq_n_f32(0.0f);
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim + j;
      const float32x4_t a = vdupq_n_f32(alpha[k]), kv = vdupq_n_f32(kk[k]);
      for (int i = 0; i < 4; i++) {
        const float32x4_t s = vmulq_f32(vld1q_f32(row + 4 * i), a);
        vst1q_f32(row + 4 * i, s);
        uu[i] = vfmaq_f32(uu[i], s, kv);
      }
    }
    for (int i = 0; i < 4; i++) {
      uu[i] = vsubq_f32(vld1q_f32(v + j + 4 * i), uu[i]);
      oo[i] = vdupq_n_f32(0.0f);
    }
    for (int k = 0; k < dim; k++) {
      float *row = S + (int64_t)k * dim + j;
      const float32x4_t kb = vdupq_n_f32(kk[k] * beta), qv = vdupq_n_f32(q[k]);
      for (int i = 0; i < 4; i++) {
        const float32x4_t s = vaddq_f32(vld1q_f32(row + 4 * i), vmulq_f32(kb, uu[i]));
        vst1q_f32(row + 4 * i, s);
        oo[i] = vfmaq_f32(oo[i], s, qv);
      }
    }
    for (int i = 0; i < 4; i++) vst1q_f32(o + j + 4 * i, oo[i]);
  }
  k3_delta_cols(o, S, u, q, kk, v, alpha, beta, dim, j, dim); /* the tail */
}

static void k3_decay_neon(float *alpha, const float *g, const float *dt_bias, float a, float lb,
                          int n) {
  k3_decay_map(alpha, g, dt_bias, a, lb, n);
}

const K3Simd k3_simd_neon = {
    .name = "neon",
    .matmul_bf16 = k3_matmul_bf16_neon,
    .matmul_mxfp4 = k3_matmul_mxfp4_neon,
    .matmul_coded = k3_matmul_coded_neon,
    .dot_f32 = k3_dot_f32_neon,
    .dot_bf16 = k3_dot_bf16_neon,
    .dots = k3_dots_neon,
    .wsum = k3_wsum,
    .axpy_bf16 = k3_axpy_bf16,
    .delta_step = k3_delta_step_neon,
    .situ_glu = k3_situ_glu_map,
    .sigmoid = k3_sigmoid_map,
    .mul_sigmoid = k3_mul_sigmoid_map,
    .decay = k3_decay_neon,
};

#else
/* Not aarch64: nothing to build (ISO C wants at least one declaration). */
typedef int k3_no_neon;
#endif
