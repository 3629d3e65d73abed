/* Cross-ISA check: runs every libk3 kernel on fixed pseudo-random inputs (odd sizes and
 * tails included) and writes all output bytes to stdout. The x86-64 build (with K3_ISA=
 * scalar and with AVX2) and the aarch64 build (NEON, under qemu) must write the same bytes:
 * `make test-arm` compares their SHA-256. Built on its own, never into libk3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../k3.h"

#ifdef _WIN32
#include <fcntl.h>
#include <io.h>
#endif

static uint32_t rng_state = 12345u;

/* xorshift32: integer steps only, so every platform draws the same numbers. */
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}

/* n floats uniform in [lo, hi) (exact: a 24-bit integer scaled by a power of two). */
static float *floats(int64_t n, float lo, float hi) {
  float *a = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * (float)(next_u32() >> 8) * 0x1p-24f;
  return a;
}

static uint16_t *bf16s(int64_t n) {
  uint16_t *a = malloc(sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    const float f = -1.0f + 2.0f * (float)(next_u32() >> 8) * 0x1p-24f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    a[i] = (uint16_t)(bits >> 16);
  }
  return a;
}

static uint8_t *bytes(int64_t n, int lo, int span) {
  uint8_t *a = malloc((size_t)n);
  for (int64_t i = 0; i < n; i++) a[i] = (uint8_t)(lo + (int)(next_u32() % (uint32_t)span));
  return a;
}

static void emit(const void *p, int64_t n) { fwrite(p, 1, (size_t)n, stdout); }

static void linear(void) {
  const int shapes[][3] = {{67, 203, 1}, {67, 203, 5}, {5, 7, 2},    {150, 96, 4},
                           {9, 1000, 7}, {67, 203, 3}, {66, 203, 2}, {65, 45, 3}};
  for (int i = 0; i < 8; i++) {
    const int rows = shapes[i][0], cols = shapes[i][1], T = shapes[i][2];
    uint16_t *w = bf16s((int64_t)rows * cols);
    float *x = floats((int64_t)T * cols, -2, 2), *y = calloc((size_t)T * rows, sizeof(float));
    k3_matmul_bf16(y, w, x, rows, cols, T);
    emit(y, sizeof(float) * (int64_t)T * rows);
    free(w), free(x), free(y);
  }
  const int mx[][4] = {{37, 96, 32, 1}, {37, 96, 32, 4}, {150, 128, 64, 5}, {5, 40, 8, 2},
                       {130, 3584, 32, 1}, {9, 160, 32, 1}, {6, 32, 32, 3}, {67, 3072, 32, 7}};
  for (int i = 0; i < 8; i++) {
    const int rows = mx[i][0], cols = mx[i][1], group = mx[i][2], T = mx[i][3];
    uint8_t *packed = bytes((int64_t)rows * cols / 2, 0, 256);
    uint8_t *scales = bytes((int64_t)rows * cols / group, 110, 30);
    scales[0] = 0, scales[1] = 1; /* the subnormal scales */
    float *x = floats((int64_t)T * cols, -3, 3), *y = calloc((size_t)T * rows, sizeof(float));
    const int rc = k3_matmul_mxfp4(y, packed, scales, x, rows, cols, group, T);
    emit(&rc, sizeof rc);
    emit(y, sizeof(float) * (int64_t)T * rows);
    free(packed), free(scales), free(x), free(y);
  }
}

/* The coded kernel on normal-ish weights (sums of uniforms) with escapes in every lane. */
static void coded(void) {
  const int shapes[][4] = {{67, 203, 16, 1}, {67, 203, 16, 4}, {9, 1000, 8, 7}, {33, 96, 4, 2}};
  for (int i = 0; i < 4; i++) {
    const int rows = shapes[i][0], cols = shapes[i][1], br = shapes[i][2], T = shapes[i][3];
    uint16_t *w = bf16s((int64_t)rows * cols);
    for (int64_t k = 0; k < (int64_t)rows * cols; k += 13) w[k] ^= (uint16_t)((next_u32() & 0x3F) << 7);
    const int64_t cap = k3_codec_bound(rows, cols, br);
    uint8_t *c = malloc((size_t)cap);
    const int64_t size = k3_codec_encode(c, cap, w, rows, cols, br);
    float *x = floats((int64_t)T * cols, -2, 2), *y = calloc((size_t)T * rows, sizeof(float));
    const int rc = k3_matmul_coded(y, c, size, x, T);
    emit(&size, sizeof size), emit(&rc, sizeof rc);
    emit(c, size), emit(y, sizeof(float) * (int64_t)T * rows);
    free(w), free(c), free(x), free(y);
  }
}

static void elementwise(void) {
  const int n = 45, T = 3;
  float *x = floats(n * T, -3, 3), *w = floats(n, 0.5f, 1.5f), *y = calloc(n * T, sizeof(float));
  k3_rmsnorm(y, x, w, n, 1e-5f, T);
  emit(y, sizeof(float) * n * T);
  float *g = floats(n * T, -30, 30), *u = floats(n * T, -100, 100);
  k3_situ_glu(y, g, u, n, 4, 25, T);
  emit(y, sizeof(float) * n * T);
  k3_sigmoid(y, g, n * T);
  emit(y, sizeof(float) * n * T);
  k3_mul_sigmoid(x, g, n * T);
  emit(x, sizeof(float) * n * T);
  float *bank = floats(4 * n * T, -2, 2), *p = floats(n * T, -2, 2);
  k3_attn_res(y, bank, 3, 4, p, w, n, 1e-5f, T);
  emit(y, sizeof(float) * n * T);
  k3_moe_combine(y, bank, w, 4, n);
  emit(y, sizeof(float) * n);
  int32_t ids[3 * 4];
  float weights[3 * 4];
  k3_router_topk(ids, weights, g, u, 15, 4, 1, 2.5f, 3);
  emit(ids, sizeof ids), emit(weights, sizeof weights);
  free(x), free(w), free(y), free(g), free(u), free(bank), free(p);
}

static void kda(void) {
  const int heads = 3, dim = 40, T = 3, C = heads * dim;
  float *q = floats(C * T, -1, 1), *k = floats(C * T, -1, 1), *v = floats(C * T, -2, 2);
  k3_l2norm_heads(q, heads, dim, 1e-6f, 0.158f, T);
  k3_l2norm_heads(k, heads, dim, 1e-6f, 1, T);
  float *g = floats(C * T, -4, 4), *dt = floats(C, -1, 1), *alog = floats(heads, -1, 1);
  float *alpha = calloc(C * T, sizeof(float)), *beta = floats(heads * T, 0, 1);
  k3_kda_gate(alpha, g, dt, alog, heads, dim, -5, T);
  float *S = floats((int64_t)heads * dim * dim, -0.5f, 0.5f), *o = calloc(C * T, sizeof(float));
  k3_kda_recurrence(o, S, q, k, v, alpha, beta, heads, dim, T);
  float *hist = floats(3 * C, -1, 1), *cw = floats(4 * C, -1, 1), *conv = calloc(C * T, sizeof(float));
  k3_kda_conv(conv, hist, v, cw, C, 4, T);
  k3_gated_rmsnorm_heads(v, o, cw, g, heads, dim, 1e-5f, T);
  emit(q, 4 * C * T), emit(k, 4 * C * T), emit(alpha, 4 * C * T), emit(o, 4 * C * T);
  emit(S, 4 * heads * dim * dim), emit(conv, 4 * C * T), emit(hist, 4 * 3 * C), emit(v, 4 * C * T);
  free(q), free(k), free(v), free(g), free(dt), free(alog), free(alpha), free(beta);
  free(S), free(o), free(hist), free(cw), free(conv);
}

static void mla(void) {
  const int nh = 4, dn = 16, dr = 8, dv = 16, rkv = 40, pos0 = 9, T = 5, width = rkv + dr;
  float *cache = floats((pos0 + T) * width, -1, 1), *q = floats(T * nh * (dn + dr), -2, 2);
  uint16_t *kvb = bf16s((int64_t)nh * (dn + dv) * rkv);
  float *qabs = calloc(T * nh * width, sizeof(float)), *olat = calloc(T * nh * rkv, sizeof(float));
  float *o = calloc(T * nh * dv, sizeof(float));
  k3_mla_absorb_q(qabs, q, kvb, nh, dn, dr, dv, rkv, T);
  const int rc = k3_mla_attend(olat, qabs, cache, pos0, T, nh, rkv, dr, 0.2f);
  k3_mla_expand_o(o, olat, kvb, nh, dn, dv, rkv, T);
  emit(&rc, sizeof rc);
  emit(qabs, 4 * T * nh * width), emit(olat, 4 * T * nh * rkv), emit(o, 4 * T * nh * dv);
  free(cache), free(q), free(kvb), free(qabs), free(olat), free(o);
}

int main(void) {
#ifdef _WIN32
  _setmode(_fileno(stdout), _O_BINARY); /* raw bytes: no newline translation */
#endif
  fprintf(stderr, "k3 harness: %s\n", k3_isa());
  linear();
  coded();
  elementwise();
  kda();
  mla();
  return 0;
}
