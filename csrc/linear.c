/* Matrix times T vectors with the weights as stored: BF16 or MXFP4, decoded exactly on
 * the fly. Threads split the weight rows; each dot runs whole in one thread, in 8-lane
 * order, so the result does not depend on T or on the thread count. */
#include "k3.h"
#include "reduce.h"

/* MXFP4 E2M1 values by 4-bit code: bit 3 is the sign (code 8 is -0). */
static const float k3_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0 scale byte s (< 255) -> 2^(s-127), exact: s = 0 gives the subnormal 2^-127. */
static float k3_e8m0(uint8_t s) {
  return k3_float_from_bits(s == 0 ? (uint32_t)1 << 22 : (uint32_t)s << 23);
}

/* y[t][r] = dot(w[r], x[t]) in 8-lane order; w BF16 [rows][cols], x [T][cols], y [T][rows]. */
void k3_matmul_bf16(float *y, const uint16_t *w, const float *x, int rows, int cols, int T) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++) {
    const uint16_t *row = w + (int64_t)r * cols;
    for (int t = 0; t < T; t++) {
      y[(int64_t)t * rows + r] = k3_dot_bf16(row, x + (int64_t)t * cols, cols);
    }
  }
}

/* One MXFP4 row times x: per group a fresh 8-lane partial of code * x, then each lane is
 * folded into the row's lanes with one fma by the group's scale. */
static float k3_dot_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x,
                          int cols, int group) {
  float acc[8] = {0};
  for (int g0 = 0; g0 < cols; g0 += group) {
    float part[8] = {0};
    for (int c = g0; c < g0 + group; c += 2) {
      const uint8_t b = packed[c / 2];
      part[c & 7] = fmaf(k3_e2m1[b & 15], x[c], part[c & 7]);
      part[(c + 1) & 7] = fmaf(k3_e2m1[b >> 4], x[c + 1], part[(c + 1) & 7]);
    }
    const float scale = k3_e8m0(scales[g0 / group]);
    for (int l = 0; l < 8; l++) acc[l] = fmaf(part[l], scale, acc[l]);
  }
  return k3_lanes_sum(acc);
}

/* Refuses (-2) a group that is not a positive multiple of 8 dividing cols, and (-1) any
 * scale byte 255 (E8M0 NaN), checked for the whole matrix before anything is computed. */
int k3_matmul_mxfp4(float *y, const uint8_t *packed, const uint8_t *scales, const float *x,
                    int rows, int cols, int group, int T) {
  if (group <= 0 || group % 8 != 0 || cols <= 0 || cols % group != 0) return -2;
  const int groups = cols / group;
  const int64_t nscales = (int64_t)rows * groups;
  for (int64_t i = 0; i < nscales; i++) {
    if (scales[i] == 255) return -1;
  }
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++) {
    const uint8_t *row = packed + (int64_t)r * (cols / 2);
    const uint8_t *row_scales = scales + (int64_t)r * groups;
    for (int t = 0; t < T; t++) {
      const float *xt = x + (int64_t)t * cols;
      y[(int64_t)t * rows + r] = k3_dot_mxfp4(row, row_scales, xt, cols, group);
    }
  }
  return 0;
}
