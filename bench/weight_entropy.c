/* A table-driven prefix-code decoder for 4-bit MXFP4 codes, timed (bench/weight_entropy.ts
 * builds and runs it; not part of libk3). It answers one question: what would entropy-coding
 * the experts' codes cost to decode, per code, on this CPU?
 *
 * Input (stdin, binary, little-endian): 16 float64 code frequencies, an int64 N, then the N
 * codes (one a byte). The program builds
 * a length-limited prefix code (Huffman, lengths capped at 12 bits) for the frequencies,
 * encodes the codes into a bit stream, then decodes it with a 12-bit lookup table (one symbol
 * per lookup: peek 12 bits, table gives symbol and length), the fastest simple scalar form.
 * It checks the decode round-trips and prints: coded bits per code, decode ns per code
 * (thread CPU time, best of 5), and codes per second. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SYMBOLS 16
#define MAX_LEN 12

/* CPU time of this thread: on a shared, loaded machine wall time would count the waits. */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Huffman code lengths for `freq` (package-free: repeated merging of the two lightest
 * nodes), then capped at MAX_LEN by flattening (rarely needed at 16 symbols). */
static void code_lengths(const double *freq, int *len) {
  double w[2 * SYMBOLS];
  int parent[2 * SYMBOLS], alive[2 * SYMBOLS], n = SYMBOLS;
  for (int i = 0; i < SYMBOLS; i++) {
    w[i] = freq[i] > 0 ? freq[i] : 1e-12;
    alive[i] = 1;
  }
  for (int step = 0; step < SYMBOLS - 1; step++) {
    int a = -1, b = -1;
    for (int i = 0; i < n; i++) {
      if (!alive[i]) continue;
      if (a < 0 || w[i] < w[a]) {
        b = a;
        a = i;
      } else if (b < 0 || w[i] < w[b]) {
        b = i;
      }
    }
    alive[a] = alive[b] = 0;
    w[n] = w[a] + w[b];
    alive[n] = 1;
    parent[a] = parent[b] = n;
    n++;
  }
  for (int i = 0; i < SYMBOLS; i++) {
    int d = 0;
    for (int j = i; j != n - 1; j = parent[j]) d++;
    len[i] = d > MAX_LEN ? MAX_LEN : d;
  }
}

/* Canonical codes from lengths. */
static void canonical(const int *len, uint32_t *code) {
  uint32_t next = 0;
  for (int l = 1; l <= MAX_LEN; l++) {
    for (int s = 0; s < SYMBOLS; s++) {
      if (len[s] == l) code[s] = next++;
    }
    next <<= 1;
  }
}

int main(void) {
  double freq[SYMBOLS];
  int64_t n64;
  if (fread(freq, sizeof freq, 1, stdin) != 1 || fread(&n64, 8, 1, stdin) != 1 || n64 <= 0) {
    return 2;
  }
  long n = (long)n64;
  uint8_t *sym = malloc((size_t)n), *out = malloc((size_t)n);
  uint64_t *bits = calloc((size_t)(n * MAX_LEN / 64 + 2), 8);
  if (!sym || !out || !bits) return 3;
  if (fread(sym, 1, (size_t)n, stdin) != (size_t)n) return 2;
  for (long i = 0; i < n; i++) {
    if (sym[i] >= SYMBOLS) return 2;
  }
  int len[SYMBOLS];
  uint32_t code[SYMBOLS];
  code_lengths(freq, len);
  canonical(len, code);
  /* Encode MSB-first into 64-bit words. */
  uint64_t pos = 0;
  for (long i = 0; i < n; i++) {
    uint32_t c = code[sym[i]];
    for (int k = len[sym[i]] - 1; k >= 0; k--, pos++) {
      if ((c >> k) & 1) bits[pos >> 6] |= 1ull << (63 - (pos & 63));
    }
  }
  /* The lookup table: every 12-bit prefix -> symbol and length. */
  static uint8_t tsym[1 << MAX_LEN], tlen[1 << MAX_LEN];
  for (int s = 0; s < SYMBOLS; s++) {
    uint32_t first = code[s] << (MAX_LEN - len[s]), count = 1u << (MAX_LEN - len[s]);
    for (uint32_t j = 0; j < count; j++) {
      tsym[first + j] = (uint8_t)s;
      tlen[first + j] = (uint8_t)len[s];
    }
  }
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now_s();
    uint64_t p = 0;
    for (long i = 0; i < n; i++) {
      uint64_t w = bits[p >> 6], w2 = bits[(p >> 6) + 1];
      int sh = (int)(p & 63);
      uint64_t win = sh ? (w << sh) | (w2 >> (64 - sh)) : w;
      uint32_t peek = (uint32_t)(win >> (64 - MAX_LEN));
      out[i] = tsym[peek];
      p += tlen[peek];
    }
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  if (memcmp(out, sym, (size_t)n) != 0) {
    fprintf(stderr, "decode mismatch\n");
    return 4;
  }
  printf("%.4f %.4f %.4e\n", (double)pos / (double)n, 1e9 * best / (double)n, (double)n / best);
  free(sym);
  free(out);
  free(bits);
  return 0;
}
