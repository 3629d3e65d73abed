/* Lossless BF16 coding by row block (layout in codec.h): the encoder, the checks every
 * reader runs first, a whole-matrix decoder, the portable coded kernel and the threaded
 * entry k3_matmul_coded. */
#include <string.h>

#include "codec.h"
#include "k3.h"
#include "parallel.h"
#include "reduce.h"
#include "simd.h"

/* ---- layout arithmetic -------------------------------------------------------------- */

static uint32_t k3_le32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t k3_le64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static int64_t k3_round8(int64_t n) { return (n + 7) & ~(int64_t)7; }

/* Section offsets of a coded matrix; sizes in bytes. */
typedef struct {
  int64_t blocks, tables, index, main, escapes, size;
} k3_codec_sections;

/* Offsets for the given shape; 0, or -1 when a size is out of range. */
static int k3_codec_layout(k3_codec_sections *s, int64_t rows, int64_t cols, int64_t block_rows,
                           int64_t escapes) {
  if (rows < 1 || cols < 1 || block_rows < 1 || rows > INT32_MAX - 1 || cols > INT32_MAX - 8) {
    return -1;
  }
  const int64_t groups = (cols + 7) / 8;
  /* 2^40 weights (a trunk matrix has about 2^30) keeps every size below in int64_t. */
  if (rows * groups * 8 > ((int64_t)1 << 40)) return -1;
  if (escapes < 0 || escapes > rows * groups * 8) return -1;
  s->blocks = (rows + block_rows - 1) / block_rows;
  s->tables = K3_CODEC_HEADER;
  s->index = s->tables + 8 * s->blocks;
  s->main = s->index + k3_round8(4 * (rows + 1));
  s->escapes = s->main + k3_round8(rows * groups * 11 + K3_CODEC_PAD);
  s->size = s->escapes + k3_round8(escapes + 8 * groups + 8);
  return 0;
}

int64_t k3_codec_bound(int rows, int cols, int block_rows) {
  k3_codec_sections s;
  if (k3_codec_layout(&s, rows, cols, block_rows, 0) != 0) return -2;
  return s.size + k3_round8((int64_t)rows * cols);
}

/* ---- encoder ------------------------------------------------------------------------ */

/* The seven most frequent exponents of rows [r0, r1) (ties: the lower exponent), in
 * decreasing frequency; exponents that never occur fill the rest. */
static void k3_codec_table(uint8_t table[8], const uint16_t *w, int64_t r0, int64_t r1,
                           int cols) {
  int64_t count[256] = {0};
  for (int64_t i = r0 * cols; i < r1 * cols; i++) count[(w[i] >> 7) & 0xFF]++;
  uint8_t taken[256] = {0};
  for (int k = 0; k < 7; k++) {
    int best = -1;
    for (int e = 0; e < 256; e++) {
      if (!taken[e] && (best < 0 || count[e] > count[best])) best = e;
    }
    taken[best] = 1;
    table[k] = (uint8_t)best;
  }
  table[7] = 0;
}

/* Writes row r (its main bytes and escapes); returns the escapes written. */
static int64_t k3_codec_row(uint8_t *main, uint8_t *esc, const uint16_t *row, int cols,
                            const uint8_t code_of[256]) {
  const int groups = (cols + 7) / 8;
  uint8_t *codes = main + 8 * (int64_t)groups;
  int64_t n = 0;
  for (int g = 0; g < groups; g++) {
    uint32_t bits = 0;
    for (int l = 0; l < 8; l++) {
      const int c = 8 * g + l;
      uint32_t code = 0;
      uint8_t sm = 0;
      if (c < cols) {
        const uint16_t b = row[c];
        const uint8_t e = (uint8_t)(b >> 7);
        sm = (uint8_t)(((b >> 8) & 0x80) | (b & 0x7F));
        code = code_of[e];
        if (code == K3_CODEC_ESCAPE) {
          esc[n++] = e;
          sm ^= 0x80;
        }
      }
      main[8 * g + K3_CODEC_SM_POS(l)] = sm;
      bits |= code << (3 * l);
    }
    codes[3 * g] = (uint8_t)bits;
    codes[3 * g + 1] = (uint8_t)(bits >> 8);
    codes[3 * g + 2] = (uint8_t)(bits >> 16);
  }
  return n;
}

static void k3_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void k3_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Codes every row into dst (escapes first written at the end of the bound, then moved
 * down behind the main section once their count is known). */
int64_t k3_codec_encode(uint8_t *dst, int64_t capacity, const uint16_t *w, int rows, int cols,
                        int block_rows) {
  const int64_t bound = k3_codec_bound(rows, cols, block_rows);
  if (bound < 0) return -2;
  if (capacity < bound) return -3;
  k3_codec_sections s;
  k3_codec_layout(&s, rows, cols, block_rows, 0);
  memset(dst, 0, (size_t)s.escapes);
  const int64_t row_bytes = 11 * (int64_t)((cols + 7) / 8);
  uint8_t *esc = dst + s.escapes; /* room for rows*cols escapes before the final move */
  int64_t n = 0;
  for (int64_t b = 0; b < s.blocks; b++) {
    const int64_t r0 = b * block_rows, r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
    uint8_t *table = dst + s.tables + 8 * b, code_of[256];
    k3_codec_table(table, w, r0, r1, cols);
    memset(code_of, K3_CODEC_ESCAPE, sizeof code_of);
    for (int k = 0; k < 7; k++) code_of[table[k]] = (uint8_t)k;
    for (int64_t r = r0; r < r1; r++) {
      k3_put32(dst + s.index + 4 * r, (uint32_t)n);
      n += k3_codec_row(dst + s.main + r * row_bytes, esc + n, w + r * cols, cols, code_of);
    }
  }
  k3_put32(dst + s.index + 4 * (int64_t)rows, (uint32_t)n);
  k3_codec_layout(&s, rows, cols, block_rows, n);
  memset(esc + n, 0, (size_t)(s.size - s.escapes - n));
  k3_put32(dst, K3_CODEC_MAGIC);
  k3_put32(dst + 4, (uint32_t)rows);
  k3_put32(dst + 8, (uint32_t)cols);
  k3_put32(dst + 12, (uint32_t)block_rows);
  k3_put64(dst + 16, (uint64_t)n);
  k3_put64(dst + 24, (uint64_t)s.size);
  return s.size;
}

/* ---- checks ------------------------------------------------------------------------- */

/* Each table names seven distinct exponents and ends in a zero byte: one decoding per code
 * (a table naming an exponent twice would give two codings of one matrix). */
static int k3_codec_tables_ok(const uint8_t *t, int64_t blocks) {
  for (int64_t b = 0; b < blocks; b++, t += 8) {
    if (t[7] != 0) return 0;
    for (int i = 0; i < 7; i++) {
      for (int j = i + 1; j < 7; j++) {
        if (t[i] == t[j]) return 0;
      }
    }
  }
  return 1;
}

/* The escape index starts at 0, never decreases, ends at `escapes`, and no row holds more
 * escapes than columns. */
static int k3_codec_index_ok(const uint8_t *p, int64_t rows, int64_t cols, uint64_t escapes) {
  uint32_t prev = k3_le32(p);
  if (prev != 0) return 0;
  for (int64_t r = 1; r <= rows; r++) {
    const uint32_t v = k3_le32(p + 4 * r);
    if (v < prev || v - prev > cols) return 0;
    prev = v;
  }
  return prev == escapes;
}

int k3_codec_check(const uint8_t *src, int64_t size) {
  if (size < K3_CODEC_HEADER) return K3_CODEC_ETRUNCATED;
  if (k3_le32(src) != K3_CODEC_MAGIC) return K3_CODEC_EMAGIC;
  const int64_t rows = k3_le32(src + 4), cols = k3_le32(src + 8), br = k3_le32(src + 12);
  const uint64_t escapes = k3_le64(src + 16), declared = k3_le64(src + 24);
  k3_codec_sections s;
  if (escapes > (uint64_t)INT64_MAX || k3_codec_layout(&s, rows, cols, br, (int64_t)escapes)) {
    return K3_CODEC_ESHAPE;
  }
  if (declared != (uint64_t)s.size) return K3_CODEC_ESHAPE;
  if (size < s.size) return K3_CODEC_ETRUNCATED;
  if (!k3_codec_tables_ok(src + s.tables, s.blocks)) return K3_CODEC_ETABLE;
  if (!k3_codec_index_ok(src + s.index, rows, cols, escapes)) return K3_CODEC_EINDEX;
  return 0;
}

int k3_coded_view(K3Coded *c, const uint8_t *src, int64_t size) {
  const int rc = k3_codec_check(src, size);
  if (rc != 0) return rc;
  k3_codec_sections s;
  c->rows = (int)k3_le32(src + 4);
  c->cols = (int)k3_le32(src + 8);
  c->block_rows = (int)k3_le32(src + 12);
  k3_codec_layout(&s, c->rows, c->cols, c->block_rows, (int64_t)k3_le64(src + 16));
  c->groups = (c->cols + 7) / 8;
  c->row_bytes = 11 * (int64_t)c->groups;
  c->tables = src + s.tables;
  c->index = src + s.index;
  c->main = src + s.main;
  c->escapes = src + s.escapes;
  return 0;
}

const char *k3_codec_strerror(int code) {
  switch (code) {
  case 0: return "ok";
  case K3_CODEC_ETRUNCATED: return "coded matrix truncated (shorter than its header says)";
  case K3_CODEC_EMAGIC: return "not a coded matrix (bad magic)";
  case K3_CODEC_ESHAPE: return "coded matrix header out of range (rows, cols, block rows, sizes)";
  case K3_CODEC_ETABLE: return "coded matrix exponent table invalid";
  case K3_CODEC_EINDEX: return "coded matrix escape index invalid";
  case K3_CODEC_EESCAPES: return "coded matrix row escapes do not match its index";
  default: return "unknown coded matrix error";
  }
}

/* ---- decoding ----------------------------------------------------------------------- */

int k3_coded_group(const K3Coded *c, int r, int g, uint16_t out[8], const uint8_t **cursor,
                   const uint8_t *end) {
  const uint8_t *row = c->main + (int64_t)r * c->row_bytes;
  const uint8_t *code = row + 8 * (int64_t)c->groups + 3 * (int64_t)g;
  const uint32_t bits = code[0] | (uint32_t)code[1] << 8 | (uint32_t)code[2] << 16;
  const uint8_t *table = c->tables + 8 * (int64_t)(r / c->block_rows);
  for (int l = 0; l < 8; l++) {
    const unsigned k = (bits >> (3 * l)) & 7;
    uint8_t sm = row[8 * (int64_t)g + K3_CODEC_SM_POS(l)], e;
    if (k == K3_CODEC_ESCAPE) {
      if (*cursor >= end) return -1;
      e = *(*cursor)++;
      sm ^= 0x80;
    } else {
      e = table[k];
    }
    out[l] = k3_codec_join(sm, e);
  }
  return 0;
}

int k3_codec_decode(uint16_t *w, const uint8_t *src, int64_t size) {
  K3Coded c;
  const int rc = k3_coded_view(&c, src, size);
  if (rc != 0) return rc;
  for (int r = 0; r < c.rows; r++) {
    const uint8_t *cur = k3_coded_escape_at(&c, r), *end = k3_coded_escape_at(&c, r + 1);
    for (int g = 0; g < c.groups; g++) {
      uint16_t v[8];
      if (k3_coded_group(&c, r, g, v, &cur, end) != 0) return K3_CODEC_EESCAPES;
      const int n = c.cols - 8 * g < 8 ? c.cols - 8 * g : 8;
      memcpy(w + (int64_t)r * c.cols + 8 * g, v, sizeof(uint16_t) * (size_t)n);
    }
    if (cur != end) return K3_CODEC_EESCAPES;
  }
  return 0;
}

/* ---- portable kernel ---------------------------------------------------------------- */

/* One coded row times x in 8-lane order (the dot of k3_dot_bf16 on the decoded row).
 * Returns -1 when the row's escapes do not match its index. */
static int k3_coded_dot(float *out, const K3Coded *c, int r, const float *x) {
  const uint8_t *cur = k3_coded_escape_at(c, r), *end = k3_coded_escape_at(c, r + 1);
  float lane[8] = {0};
  for (int g = 0; g < c->groups; g++) {
    uint16_t v[8];
    if (k3_coded_group(c, r, g, v, &cur, end) != 0) return -1;
    const int n = c->cols - 8 * g < 8 ? c->cols - 8 * g : 8;
    k3_lanes_bf16(lane, v, x + 8 * (int64_t)g, n);
  }
  if (cur != end) return -1;
  *out = k3_lanes_sum(lane);
  return 0;
}

int k3_matmul_coded_scalar(float *y, const K3Coded *c, const float *x, int r0, int r1,
                           int y_stride, int T) {
  for (int r = r0; r < r1; r++) {
    for (int t = 0; t < T; t++) {
      if (k3_coded_dot(y + (int64_t)t * y_stride + r, c, r, x + (int64_t)t * c->cols) != 0) {
        return -1;
      }
    }
  }
  return 0;
}

/* ---- threaded entry ----------------------------------------------------------------- */

typedef struct {
  const K3Simd *simd;
  const K3Coded *c;
  float *y;
  const float *x;
  int T, y_stride;
  int status; /* K3_CODEC_EESCAPES once any member met a bad row */
} k3_coded_job;

static void k3_coded_member(void *ctx, int id, int n) {
  k3_coded_job *j = (k3_coded_job *)ctx;
  int64_t r0, r1;
  k3_static_block(j->c->rows, id, n, &r0, &r1);
  if (r0 < r1 && j->simd->matmul_coded(j->y, j->c, j->x, (int)r0, (int)r1, j->y_stride, j->T)) {
    __atomic_store_n(&j->status, K3_CODEC_EESCAPES, __ATOMIC_RELAXED);
  }
}

static int k3_coded_rows(float *y, const uint8_t *src, int64_t size, const float *x, int T,
                         int y_stride) {
  K3Coded c;
  const int rc = k3_coded_view(&c, src, size);
  if (rc != 0) return rc;
  if (T < 0 || (y_stride != 0 && y_stride < c.rows)) return K3_CODEC_ESHAPE;
  k3_coded_job job = {k3_simd(), &c, y, x, T, y_stride ? y_stride : c.rows, 0};
  const int worth = (int64_t)c.rows * c.cols * T >= (1 << 20);
  k3_parallel(worth, k3_coded_member, &job);
  return job.status;
}

int k3_matmul_coded(float *y, const uint8_t *src, int64_t size, const float *x, int T) {
  return k3_coded_rows(y, src, size, x, T, 0);
}

int k3_matmul_coded_rows(float *y, const uint8_t *src, int64_t size, const float *x, int T,
                         int y_stride) {
  if (y_stride < 1) return K3_CODEC_ESHAPE;
  return k3_coded_rows(y, src, size, x, T, y_stride);
}
