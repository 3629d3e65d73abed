/* The codec study and kernel benchmark behind `make bench-codec` (bench/codec.ts runs it and
 * formats the table). Built on its own against libk3, never into it.
 *
 * On a BF16 matrix of normal weights (std 1/sqrt(cols), seeded) it prints one JSON object:
 *  - the measured entropy of the exponent byte, and of sign + exponent;
 *  - the chosen code (csrc/codec.c: 3-bit exponent codes by row block with escapes): coded
 *    size over BF16 size, escape rate, and its portable decoder's speed into memory;
 *  - the alternative, a table-driven entropy code: a canonical Huffman code of the exponent
 *    byte per tensor (lengths at most 12, one 4096-entry lookup per weight), raw
 *    sign-mantissa bytes, a 32-bit bit offset per row: its size ratio and decoder speed;
 *  - k3_matmul_bf16 against k3_matmul_coded at T = 1 and T = 4, medians of `reps` runs.
 * Usage: codec_bench ROWS COLS REPS [kernels]  (kernels: skip the single-threaded decoders) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../k3.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}
static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) * 0x1p-53; }

/* Nearest BF16 (ties to even) of a finite float. */
static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

/* n normal weights with the given std (Box-Muller). */
static void normal_bf16(uint16_t *w, int64_t n, double std) {
  for (int64_t i = 0; i < n; i += 2) {
    const double m = sqrt(-2.0 * log(uniform01())) * std, a = 6.283185307179586 * uniform01();
    w[i] = to_bf16((float)(m * cos(a)));
    if (i + 1 < n) w[i + 1] = to_bf16((float)(m * sin(a)));
  }
}

static double entropy(const int64_t *count, int symbols, int64_t n) {
  double h = 0;
  for (int s = 0; s < symbols; s++) {
    if (count[s] > 0) h -= (double)count[s] / (double)n * log2((double)count[s] / (double)n);
  }
  return h;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[n / 2];
}

/* ---- the entropy-code alternative ----------------------------------------------------- */

#define HUFF_MAX 12

/* Huffman code lengths of 256 symbols (O(n^2) merging, fine for 256), limited to HUFF_MAX
 * by clamping and then lengthening the longest codes still below the limit until the Kraft
 * sum fits. */
static void huff_lengths(const int64_t *count, uint8_t *len) {
  int64_t weight[512];
  int parent[512], nodes = 256, alive[512];
  for (int s = 0; s < 256; s++) weight[s] = count[s] > 0 ? count[s] : 0, alive[s] = count[s] > 0;
  for (int i = 0; i < 512; i++) parent[i] = -1;
  for (;;) {
    int a = -1, b = -1;
    for (int i = 0; i < nodes; i++) {
      if (!alive[i]) continue;
      if (a < 0 || weight[i] < weight[a]) b = a, a = i;
      else if (b < 0 || weight[i] < weight[b]) b = i;
    }
    if (b < 0) break;
    weight[nodes] = weight[a] + weight[b], alive[nodes] = 1, alive[a] = alive[b] = 0;
    parent[a] = parent[b] = nodes++;
  }
  for (int s = 0; s < 256; s++) {
    int d = 0;
    for (int i = s; parent[i] >= 0; i = parent[i]) d++;
    len[s] = (uint8_t)(count[s] > 0 ? (d > HUFF_MAX ? HUFF_MAX : (d == 0 ? 1 : d)) : 0);
  }
  for (;;) {
    double kraft = 0;
    for (int s = 0; s < 256; s++) kraft += len[s] ? ldexp(1.0, -len[s]) : 0;
    if (kraft <= 1.0) break;
    int pick = -1;
    for (int s = 0; s < 256; s++) {
      if (len[s] && len[s] < HUFF_MAX && (pick < 0 || len[s] > len[pick])) pick = s;
    }
    len[pick]++;
  }
}

/* Canonical codes (bit-reversed, for an LSB-first reader) and the decode table. */
static void huff_codes(const uint8_t *len, uint16_t *code, uint16_t *lut) {
  uint16_t next = 0;
  for (int l = 1; l <= HUFF_MAX; l++) {
    for (int s = 0; s < 256; s++) {
      if (len[s] != l) continue;
      uint16_t rev = 0;
      for (int b = 0; b < l; b++) rev |= (uint16_t)(((next >> b) & 1) << (l - 1 - b));
      code[s] = rev;
      for (int fill = rev; fill < (1 << HUFF_MAX); fill += 1 << l) {
        lut[fill] = (uint16_t)(s | l << 8);
      }
      next++;
    }
    next <<= 1;
  }
}

typedef struct {
  uint8_t *sm;      /* [n] sign << 7 | mantissa */
  uint8_t *bits;    /* exponent codes, each row from a byte boundary */
  int64_t *row_at;  /* byte offset of each row's codes */
  int64_t bytes;    /* size: sm + codes + offsets + table */
  uint16_t lut[1 << HUFF_MAX];
} huff_coded;

static void huff_encode(huff_coded *h, const uint16_t *w, int rows, int cols) {
  int64_t count[256] = {0};
  const int64_t n = (int64_t)rows * cols;
  for (int64_t i = 0; i < n; i++) count[(w[i] >> 7) & 0xFF]++;
  uint8_t len[256];
  uint16_t code[256] = {0};
  huff_lengths(count, len);
  huff_codes(len, code, h->lut);
  h->sm = malloc((size_t)n);
  h->bits = calloc((size_t)(n * HUFF_MAX / 8 + 16 * rows + 64), 1);
  h->row_at = malloc(sizeof(int64_t) * (size_t)(rows + 1));
  int64_t at = 0;
  for (int r = 0; r < rows; r++) {
    h->row_at[r] = at;
    uint64_t acc = 0;
    int fill = 0;
    for (int c = 0; c < cols; c++) {
      const uint16_t b = w[(int64_t)r * cols + c];
      const int e = (b >> 7) & 0xFF;
      h->sm[(int64_t)r * cols + c] = (uint8_t)(((b >> 8) & 0x80) | (b & 0x7F));
      acc |= (uint64_t)code[e] << fill, fill += len[e];
      while (fill >= 8) h->bits[at++] = (uint8_t)acc, acc >>= 8, fill -= 8;
    }
    if (fill > 0) h->bits[at++] = (uint8_t)acc;
  }
  h->row_at[rows] = at;
  h->bytes = n + at + 4 * (int64_t)rows + 256;
}

/* Decodes every row into w: one table lookup per weight, the bit buffer refilled by bytes. */
static void huff_decode(const huff_coded *h, uint16_t *w, int rows, int cols) {
  for (int r = 0; r < rows; r++) {
    const uint8_t *p = h->bits + h->row_at[r];
    const uint8_t *sm = h->sm + (int64_t)r * cols;
    uint16_t *out = w + (int64_t)r * cols;
    uint64_t acc = 0;
    int fill = 0;
    for (int c = 0; c < cols; c++) {
      if (fill < HUFF_MAX) {
        uint64_t more;
        memcpy(&more, p, 8);
        acc |= more << fill;
        p += (63 - fill) >> 3;
        fill |= 56;
      }
      const uint16_t e = h->lut[acc & ((1u << HUFF_MAX) - 1)];
      acc >>= e >> 8, fill -= e >> 8;
      out[c] = (uint16_t)(((sm[c] & 0x80u) << 8) | ((unsigned)(e & 0xFF) << 7) | (sm[c] & 0x7Fu));
    }
  }
}

/* ---- the run --------------------------------------------------------------------------- */

/* Median seconds of `reps` products (T tokens), bf16 (coded == NULL) or coded. */
static double time_matmul(const uint16_t *w, const uint8_t *coded, int64_t size, const float *x,
                          float *y, int rows, int cols, int T, int reps) {
  double t[16];
  for (int i = 0; i < reps; i++) {
    const double t0 = now();
    if (coded == NULL) k3_matmul_bf16(y, w, x, rows, cols, T);
    else if (k3_matmul_coded(y, coded, size, x, T) != 0) fprintf(stderr, "coded kernel failed\n"), exit(1);
    t[i] = now() - t0;
  }
  return median(t, reps);
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) return fprintf(stderr, "usage: codec_bench ROWS COLS REPS [kernels]\n"), 2;
  const int study = argc == 4;
  const int rows = atoi(argv[1]), cols = atoi(argv[2]), reps = atoi(argv[3]);
  if (rows < 1 || cols < 8 || reps < 1 || reps > 16) return fprintf(stderr, "bad arguments\n"), 2;
  const int64_t n = (int64_t)rows * cols;
  uint16_t *w = k3_alloc(2 * n), *back = k3_alloc(2 * n);
  normal_bf16(w, n, 1.0 / sqrt((double)cols));
  int64_t ecount[256] = {0}, secount[512] = {0};
  for (int64_t i = 0; i < n; i++) ecount[(w[i] >> 7) & 0xFF]++, secount[w[i] >> 7]++;

  const int64_t cap = k3_codec_bound(rows, cols, 64);
  uint8_t *coded = k3_alloc(cap);
  double t0 = now();
  const int64_t size = k3_codec_encode(coded, cap, w, rows, cols, 64);
  const double encode_s = now() - t0;
  int64_t escapes;
  memcpy(&escapes, coded + 16, 8);
  double decode_s = 0, huff_s = 0;
  int64_t huff_bytes = 0;
  if (study) {
    t0 = now();
    if (k3_codec_decode(back, coded, size) != 0 || memcmp(back, w, (size_t)(2 * n)) != 0) {
      return fprintf(stderr, "round trip failed\n"), 1;
    }
    decode_s = now() - t0;
    huff_coded *h = malloc(sizeof *h);
    huff_encode(h, w, rows, cols);
    memset(back, 0, (size_t)(2 * n));
    t0 = now();
    huff_decode(h, back, rows, cols);
    huff_s = now() - t0;
    huff_bytes = h->bytes;
    if (memcmp(back, w, (size_t)(2 * n)) != 0) return fprintf(stderr, "huffman round trip failed\n"), 1;
  }

  float *x = malloc(sizeof(float) * 4 * (size_t)cols), *y = malloc(sizeof(float) * 4 * (size_t)rows);
  for (int i = 0; i < 4 * cols; i++) x[i] = (float)(2 * uniform01() - 1);
  double bf[2], cx[2];
  for (int k = 0; k < 2; k++) {
    const int T = k == 0 ? 1 : 4;
    bf[k] = time_matmul(w, NULL, 0, x, y, rows, cols, T, reps);
    cx[k] = time_matmul(NULL, coded, size, x, y, rows, cols, T, reps);
  }
  /* Decode speed with no memory limit: the first rows that fit in L2 (1.5 MB of BF16), the
   * fastest of many runs. */
  const int l2_rows = (int)(768 * 1024 / cols) < rows ? (int)(768 * 1024 / cols) : rows;
  const int64_t l2_cap = k3_codec_bound(l2_rows, cols, 64);
  uint8_t *l2 = k3_alloc(l2_cap);
  const int64_t l2_size = k3_codec_encode(l2, l2_cap, w, l2_rows, cols, 64);
  double l2_bf = 1e9, l2_cx = 1e9;
  for (int i = 0; i < 400; i++) {
    double a = time_matmul(w, NULL, 0, x, y, l2_rows, cols, 1, 1);
    double b = time_matmul(NULL, l2, l2_size, x, y, l2_rows, cols, 1, 1);
    l2_bf = a < l2_bf ? a : l2_bf, l2_cx = b < l2_cx ? b : l2_cx;
  }
  printf("{\"isa\":\"%s\",\"threads\":%d,\"rows\":%d,\"cols\":%d,\"bf16_bytes\":%lld,"
         "\"exponent_entropy\":%.4f,\"sign_exponent_entropy\":%.4f,"
         "\"coded_bytes\":%lld,\"escape_rate\":%.5f,\"encode_s\":%.3f,\"decode_s\":%.4f,"
         "\"huffman_bytes\":%lld,\"huffman_decode_s\":%.4f,"
         "\"bf16_t1_s\":%.5f,\"coded_t1_s\":%.5f,\"bf16_t4_s\":%.5f,\"coded_t4_s\":%.5f,"
         "\"cache_weights\":%lld,\"bf16_cache_t1_s\":%.7f,\"coded_cache_t1_s\":%.7f}\n",
         k3_isa(), k3_num_threads(), rows, cols, (long long)(2 * n), entropy(ecount, 256, n),
         entropy(secount, 512, n), (long long)size, (double)escapes / (double)n, encode_s,
         decode_s, (long long)huff_bytes, huff_s, bf[0], cx[0], bf[1], cx[1], (long long)l2_rows * cols, l2_bf, l2_cx);
  return 0;
}
