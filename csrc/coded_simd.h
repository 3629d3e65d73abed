/* The coded BF16 matrix kernels (codec.h) around a group decoder, shared by the x86 paths:
 * simd_avx2.c and simd_avx512.c each define, before including this file,
 *   K3_INLINE     the attributes of an always-inlined helper (with that file's target);
 *   K3_CX_ENTRY   the name of the K3Simd.matmul_coded entry to define, K3_CX_LINKAGE its
 *                 linkage (static, or empty for an entry isa.c names);
 *   k3_cx_group   __m256 k3_cx_group(const uint8_t *sm, const uint8_t *codes,
 *                                    const uint8_t **esc, __m256i table):
 *                 the group at sm (8 sign-mantissa bytes) and codes (its 24 code bits) as 8
 *                 floats, exactly k3_widen of its decoded BF16 weights, reading its escapes at
 *                 *esc and advancing *esc past them; `table` is k3_cx_table of the row's block.
 * The kernels are then the BF16 kernels of simd_avx2.c with k3_widen replaced by the decoder:
 * the canonical 8-lane order, so every path gives the bytes of k3_matmul_bf16 on the decoded
 * weights. A row's escapes are read without a bound check, at most 8 per group: the zeros after
 * the escape stream (codec.h) cover a whole row of them, and the count is checked at its end.
 */
#ifndef K3_CODED_SIMD_H
#define K3_CODED_SIMD_H

/* Tuning, overridable with -D to measure others (docs/CODEC.md §3.2): the sign-mantissa bytes
 * are prefetched K3_CX_AHEAD bytes ahead (their codes 3/8 as far) once per K3_CX_EVERY groups
 * (a prefetch never faults, so one past the buffer is harmless); T = 1 decodes K3_T1_ROWS rows
 * side by side. 1 to 4 rows and 512 to 3072 bytes ahead measured the same within the noise of
 * the machine measured on, and so did no prefetch at all from DRAM at one thread; it is kept
 * because it costs 2 instructions per row and 8 groups and the streams cross pages. */
#ifndef K3_CX_AHEAD
#define K3_CX_AHEAD 512
#endif
#ifndef K3_CX_EVERY
#define K3_CX_EVERY 8
#endif
#ifndef K3_T1_ROWS
#define K3_T1_ROWS 4
#endif

/* The row block's exponents at bits 23..30 of lanes 0..6; lane 7, the escape, is the sign
 * bit alone (the decoder's escape flag, and the xor that restores an escape's stored sign). */
K3_INLINE __m256i k3_cx_table(const K3Coded *c, int r) {
  const uint8_t *t = c->tables + 8 * (int64_t)(r / c->block_rows);
  return _mm256_setr_epi32(t[0] << 23, t[1] << 23, t[2] << 23, t[3] << 23, t[4] << 23,
                           t[5] << 23, t[6] << 23, (int)0x80000000u);
}

/* Folds one row's lanes after continuing them over its last partial group (decoded by the
 * portable decoder from the same cursor). Returns -1 when the row's escapes do not match. */
K3_INLINE int k3_cx_finish(float *out, float lane[8], const uint8_t *cur, const K3Coded *c,
                           int r, const float *x) {
  const uint8_t *end = k3_coded_escape_at(c, r + 1);
  const int c8 = c->cols & ~7;
  if (c8 < c->cols) {
    if (cur > end) return -1;
    uint16_t v[8];
    if (k3_coded_group(c, r, c8 / 8, v, &cur, end) != 0) return -1;
    k3_lanes_bf16(lane, v, x + c8, c->cols - c8);
  }
  if (cur != end) return -1;
  *out = k3_lanes_sum(lane);
  return 0;
}

/* NR rows r.. and NT tokens (x stride cols), y[t*ldy + i]; the coded twin of the BF16 micro
 * kernel (T = 1 is NT = 1). Each group is decoded once and meets every token in registers.
 * The rows' state lives in locals of constant index (the loops are unrolled) so that it stays
 * in registers: no accumulator or cursor goes through the stack inside the column loop. */
K3_INLINE int k3_cx_micro(float *y, int ldy, const K3Coded *c, int r, const float *x,
                          const int NR, const int NT) {
  const int G8 = c->cols / 8;
  const int64_t rb = c->row_bytes;
  /* Row i's group g: sign-mantissa bytes at sm + i*rb, codes at codes + i*rb (one pointer
   * pair for all rows, so that the rows' state fits the general registers). */
  const uint8_t *sm = c->main + (int64_t)r * rb, *codes = sm + 8 * (int64_t)c->groups;
  const uint8_t *esc[4];
  __m256i table[4];
  __m256 acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) {
    esc[i] = k3_coded_escape_at(c, r + i);
    table[i] = k3_cx_table(c, r + i);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
  }
  const float *xg = x;
  for (int g = 0; g < G8; g++, sm += 8, codes += 3, xg += 8) {
    __m256 xv[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(xg + (int64_t)t * c->cols);
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
      if (K3_CX_EVERY == 1 || (g & (K3_CX_EVERY - 1)) == 0) {
        _mm_prefetch((const char *)(sm + i * rb + K3_CX_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)(codes + i * rb + 3 * K3_CX_AHEAD / 8), _MM_HINT_T0);
      }
      const __m256 wv = k3_cx_group(sm + i * rb, codes + i * rb, &esc[i], table[i]);
#pragma GCC unroll 4
      for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
    }
  }
  float lane[4][4][8];
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(lane[i][t], acc[i][t]);
  }
  int bad = 0;
#pragma GCC unroll 4
  for (int i = 0; i < NR; i++) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) { /* the tail group, re-read per token from the same cursor */
      bad |= k3_cx_finish(y + (int64_t)t * ldy + i, lane[i][t], esc[i], c, r + i,
                          x + (int64_t)t * c->cols);
    }
  }
  return bad ? -1 : 0;
}

/* The micro kernel for a constant shape: 4 rows for one token (four chains hide the fma
 * latency), 2 rows for 2 to 4 tokens (8 sums, the decode shared by every token). */
K3_INLINE int k3_cx_micro_any(float *y, int ldy, const K3Coded *c, int r, const float *x,
                              int nr, int nt) {
#define K3_CASE(R, N)                                                                      \
  case (R) * 8 + (N):                                                                      \
    return k3_cx_micro(y, ldy, c, r, x, R, N);
  switch (nr * 8 + nt) {
    K3_CASE(4, 1) K3_CASE(3, 1) K3_CASE(2, 1) K3_CASE(1, 1) K3_CASE(2, 4) K3_CASE(2, 3)
    K3_CASE(2, 2) K3_CASE(1, 4) K3_CASE(1, 3) K3_CASE(1, 2)
  }
#undef K3_CASE
  return -1;
}

/* Tokens in balanced groups of at most 4, rows 4 (T = 1) or 2 at a time. The weights are
 * decoded once per token group, so a group as wide as the registers allow. */
K3_CX_LINKAGE int K3_CX_ENTRY(float *y, const K3Coded *c, const float *x, int r0, int r1,
                              int y_stride, int T) {
  const int groups = (T + 3) / 4, step = T == 1 ? K3_T1_ROWS : 2;
  int bad = 0;
  for (int r = r0; r < r1; r += step) {
    const int nr = r1 - r < step ? r1 - r : step;
    for (int g = 0, t = 0; g < groups; g++) {
      const int nt = (T - t + (groups - g) - 1) / (groups - g);
      bad |= k3_cx_micro_any(y + (int64_t)t * y_stride + r, y_stride, c, r,
                             x + (int64_t)t * c->cols, nr, nt);
      t += nt;
    }
  }
  return bad ? -1 : 0;
}

#endif
