/**
 * The matrix kernels of a decode pass of a few sequences (T = 2..9 tokens: the small-T
 * BF16 and MXFP4 paths of csrc/simd_avx2.c, and the panels past them) give, token for
 * token, the bytes of T single-token calls: with column tails, odd row counts, odd MXFP4
 * group counts, and sizes that split rows over the thread team. tests/kernels/simd.test.ts checks
 * the same kernels against the portable path.
 */
import assert from "node:assert/strict";
import { k3 } from "../../ffi/library.ts";
import { Rng } from "../support/kernel_refs.ts";

const lib = k3();
const ptr = (a: BufferSource) => Deno.UnsafePointer.of(a as Uint8Array);

function sameBytes(a: Float32Array, b: Float32Array): boolean {
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return x.length === y.length && x.every((v, i) => v === y[i]);
}

/** `call(y, x, T)` on T tokens at once against T calls of one token each. */
function checkBatched(
  what: string,
  rows: number,
  cols: number,
  call: (y: Float32Array, x: Float32Array, T: number) => void,
  rng: Rng,
): void {
  for (let T = 2; T <= 9; T++) {
    const x = rng.f32(T * cols, -2, 2);
    const batched = new Float32Array(T * rows);
    call(batched, x, T);
    for (let t = 0; t < T; t++) {
      const one = new Float32Array(rows);
      call(one, x.subarray(t * cols, (t + 1) * cols), 1);
      assert.ok(
        sameBytes(batched.subarray(t * rows, (t + 1) * rows), one),
        `${what} T ${T} t ${t}`,
      );
    }
  }
}

Deno.test("BF16 matrix x T tokens = T single-token products, T = 2..9", () => {
  const rng = new Rng(77);
  // Small (one thread), a column tail, odd rows; then large enough for the thread team.
  for (const [rows, cols] of [[7, 45], [37, 203], [33, 8], [301, 1029], [1024, 2048]]) {
    const w = rng.bf16(rows * cols);
    checkBatched(
      `bf16 ${rows}x${cols}`,
      rows,
      cols,
      (y, x, T) => lib.k3_matmul_bf16(y, ptr(w), x, rows, cols, T),
      rng,
    );
  }
});

Deno.test("MXFP4 matrix x T tokens = T single-token products, T = 2..9", () => {
  const rng = new Rng(78);
  // Odd group counts (96, 160 columns: 3 and 5 groups of 32), odd rows, the expert shape.
  for (const [rows, cols] of [[5, 96], [37, 160], [130, 256], [67, 3584], [3072, 3584]]) {
    const group = 32;
    const packed = Uint8Array.from({ length: rows * cols / 2 }, () => rng.int(256));
    const scales = Uint8Array.from(
      { length: rows * cols / group },
      () => (rng.int(8) === 0 ? rng.int(3) : 110 + rng.int(30)),
    );
    checkBatched(`mxfp4 ${rows}x${cols}`, rows, cols, (y, x, T) => {
      assert.equal(lib.k3_matmul_mxfp4(y, ptr(packed), ptr(scales), x, rows, cols, group, T), 0);
    }, rng);
    // A NaN scale is refused whatever T.
    scales[scales.length - 1] = 255;
    for (const T of [1, 2, 4, 5]) {
      const y = new Float32Array(T * rows), x = rng.f32(T * cols);
      assert.equal(lib.k3_matmul_mxfp4(y, ptr(packed), ptr(scales), x, rows, cols, group, T), -1);
    }
  }
});
