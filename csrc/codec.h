/* The coded BF16 layout (codec.c writes and checks it; the matrix kernels read it).
 *
 * A BF16 weight is sign (1 bit), exponent (8) and mantissa (7). Trained weights and weights
 * drawn like them use few exponents, so the exponent is coded in 3 bits by row block: codes
 * 0..6 name the block's seven most frequent exponents (its table), code 7 is an escape whose
 * exponent byte follows in the escape stream. Sign and mantissa stay one raw byte. 8 + 3 bits
 * per weight, plus one byte per escape (docs/CODEC.md has the measurements behind the choice).
 *
 * Buffer, all integers little-endian, every section at a multiple of 8 bytes:
 *   header   32 bytes: magic "K3C1", rows, cols, block_rows (u32 each), escapes (u64, the
 *            length of the escape stream), size (u64, the whole buffer)
 *   tables   ceil(rows / block_rows) x 8 bytes: exponents of codes 0..6, then a zero byte
 *   index    (rows + 1) u32: where row r's escapes start in the escape stream; index[rows]
 *            = escapes. Padded to 8 bytes.
 *   main     rows x 11G bytes, G = ceil(cols / 8) groups of 8 columns per row: first the 8G
 *            sign-mantissa bytes of the row, then its 3G code bytes (group g's eight 3-bit
 *            codes as a 24-bit little-endian number, column 8g + l in bits 3l..3l+2).
 *            Then 8 zero bytes, so that 4- and 8-byte loads at any group stay inside.
 *   escapes  `escapes` exponent bytes in row and column order, then 8G + 8 zero bytes: a
 *            row's 8-byte escape loads stay inside even when tampered codes ask for more
 *            escapes than the row has (the kernels then refuse the row at its end).
 * The sign-mantissa byte of column 8g + l is byte 8g + K3_CODEC_SM_POS(l) of the row:
 * sign << 7 | mantissa, with the sign inverted when the exponent is an escape. Both choices
 * are for the AVX2 decoder: one 8-byte broadcast and a shift per lane put each byte in place,
 * and the escape flag (the sign bit of the table entry) flips the sign back.
 * Columns of a last partial group are coded as sign-mantissa 0 with code 0.
 * A row decodes alone from the index: threads take any rows, in any order.
 */
#ifndef K3_CODEC_H
#define K3_CODEC_H

#include <stdint.h>

#define K3_CODEC_MAGIC 0x3143334Bu /* "K3C1" */
#define K3_CODEC_HEADER 32
#define K3_CODEC_ESCAPE 7
/* Zero bytes after the main section: the widest load past a group's start. */
#define K3_CODEC_PAD 8
/* Where lane l's sign-mantissa byte sits in its group of 8. */
#define K3_CODEC_SM_POS(l) (4 * ((l) & 1) + ((l) >> 1))

/* A checked coded matrix, as pointers into its buffer. */
typedef struct K3Coded {
  int rows, cols, block_rows, groups; /* groups = G, per row */
  int64_t row_bytes;                  /* 11G */
  const uint8_t *tables;              /* [blocks][8] */
  const uint8_t *index;               /* [rows + 1] u32: read with k3_coded_escape_at */
  const uint8_t *main;                /* row r at main + r * row_bytes */
  const uint8_t *escapes;             /* index[rows] bytes + 8G + 8 */
} K3Coded;

/* Where row r's escapes start in the escape stream (r <= rows). */
static inline const uint8_t *k3_coded_escape_at(const K3Coded *c, int r) {
  const uint8_t *p = c->index + 4 * (int64_t)r;
  return c->escapes + (p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Fills `c` from a buffer of `size` bytes after checking every field (k3_codec_check). */
int k3_coded_view(K3Coded *c, const uint8_t *src, int64_t size);

/* The sign-mantissa byte and exponent back into BF16 bits. */
static inline uint16_t k3_codec_join(uint8_t sm, uint8_t e) {
  return (uint16_t)(((sm & 0x80u) << 8) | ((unsigned)e << 7) | (sm & 0x7Fu));
}

/* Decodes group g of row r into 8 BF16 patterns, consuming its escapes from *cursor
 * (at most `end`). Returns -1 when the group's escapes would pass `end`. */
int k3_coded_group(const K3Coded *c, int r, int g, uint16_t out[8], const uint8_t **cursor,
                   const uint8_t *end);

#endif
