/**
 * Child process of tests/kernels/codec.test.ts: runs the coded kernel on fixed inputs (every
 * T from 1 to 9, odd shapes and tails, escapes in every lane) and prints the ISA and, per
 * case, the SHA-256 of y or the error code, so that runs under different K3_ISA values can be
 * compared byte for byte. Each case also checks itself against k3_matmul_bf16 on the decoded
 * weights and exits 1 on a difference; damaged buffers must give the decoder's error code or,
 * when it decodes them, the bytes of k3_matmul_bf16 on what it decoded.
 */
import { k3, k3Isa } from "../../ffi/library.ts";
import { Rng } from "./kernel_refs.ts";
import { decode, encode, matmulCoded, normalBf16 } from "./codec_weights.ts";

const lib = k3(), rng = new Rng(77), out: Record<string, string> = {};

async function sha(a: Float32Array): Promise<string> {
  const d = new Uint8Array(
    await crypto.subtle.digest("SHA-256", new Uint8Array(a.slice().buffer)),
  );
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Weights whose exponents spread wide (escapes everywhere) or normal ones. */
function weights(rows: number, cols: number, wide: boolean): Uint16Array<ArrayBuffer> {
  if (!wide) return normalBf16(rng, rows * cols, 1 / Math.sqrt(cols));
  return Uint16Array.from({ length: rows * cols }, () => {
    const e = 100 + rng.int(40), m = rng.int(256); // 40 exponents: many escapes
    return ((m & 0x80) << 8) | (e << 7) | (m & 0x7f);
  });
}

const shapes: [number, number, number, boolean][] = [
  [67, 203, 16, false],
  [5, 7, 4, true],
  [150, 96, 64, true],
  [9, 1000, 8, false],
  [66, 512, 12, false],
  [33, 1536, 7, true],
  [4, 8, 1, false],
  [130, 64, 128, true],
  [300, 4096, 64, false], // big enough for a thread team
  [41, 1001, 16, true], // a partial last group after many full ones, escapes in every lane
];
for (const [rows, cols, blockRows, wide] of shapes) {
  const w = weights(rows, cols, wide), coded = encode(w, rows, cols, blockRows);
  const back = decode(coded, rows * cols);
  if (typeof back === "number" || back.some((v, i) => v !== w[i])) {
    console.error(`round trip failed: ${[rows, cols, blockRows]}`);
    Deno.exit(1);
  }
  for (let T = 1; T <= 9; T++) {
    const x = rng.f32(T * cols, -2, 2), want = new Float32Array(T * rows);
    lib.k3_matmul_bf16(want, Deno.UnsafePointer.of(w), x, rows, cols, T);
    const y = matmulCoded(coded, x, rows, T);
    if (typeof y === "number" || (await sha(y)) !== (await sha(want))) {
      console.error(
        `coded kernel differs from bf16: ${[rows, cols, blockRows, T]} -> ${
          typeof y === "number" ? y : "bytes"
        }`,
      );
      Deno.exit(1);
    }
    out[`coded ${[rows, cols, blockRows, wide, T]}`] = await sha(y);
  }
}
/** Damaged codes: the same buffers refused with the same error on every path, the others
 * giving the decoder's bytes (wide exponents, so most groups have escapes to miscount). */
async function tampered(rows: number, cols: number) {
  const w = weights(rows, cols, true), coded = encode(w, rows, cols, 8), G = Math.ceil(cols / 8);
  const main = 32 + 8 * Math.ceil(rows / 8) + Math.ceil(4 * (rows + 1) / 8) * 8;
  const cases: Uint8Array<ArrayBuffer>[] = [];
  for (let trial = 0; trial < 40; trial++) {
    const b = coded.slice();
    for (let k = 1 + rng.int(3); k > 0; k--) b[main + rng.int(rows * 11 * G)] ^= 1 << rng.int(8);
    cases.push(b);
  }
  // Every code of the last row an escape: its escape reads run furthest past the stream.
  const all = coded.slice(), last = main + (rows - 1) * 11 * G + 8 * G;
  all.fill(0xff, last, last + 3 * G);
  cases.push(all);
  for (const [i, b] of cases.entries()) {
    const T = 1 + (i % 9), x = rng.f32(T * cols, -2, 2), back = decode(b, rows * cols);
    const y = matmulCoded(b, x, rows, T);
    let want: number | string = typeof back === "number" ? back : "";
    if (typeof back !== "number") {
      const bf = new Float32Array(T * rows);
      lib.k3_matmul_bf16(bf, Deno.UnsafePointer.of(back), x, rows, cols, T);
      want = await sha(bf);
    }
    const got = typeof y === "number" ? y : await sha(y);
    if (got !== want) {
      console.error(`damaged codes: ${[rows, cols, i, T]}: kernel ${got}, decoder ${want}`);
      Deno.exit(1);
    }
    out[`tampered ${[rows, cols, i, T]}`] = String(got);
  }
}
await tampered(20, 203);
await tampered(9, 64);
console.log(JSON.stringify({ isa: k3Isa(), out }));
