/**
 * Child process of tests/kernels/codec.test.ts: runs the coded kernel on fixed inputs (every
 * T from 1 to 9, odd shapes and tails, escapes in every lane) and prints the ISA and, per
 * case, the SHA-256 of y or the error code, so that runs under different K3_ISA values can be
 * compared byte for byte. Each case also checks itself against k3_matmul_bf16 on the decoded
 * weights and exits 1 on a difference.
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
console.log(JSON.stringify({ isa: k3Isa(), out }));
