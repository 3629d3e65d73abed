/**
 * Weights distributed as trained weights are (normal, std 1/sqrt(fan-in)) as BF16 bit
 * patterns, and the coded-matrix FFI calls the codec tests share.
 */
import { k3 } from "../../ffi/library.ts";
import { NativeBuffer } from "../../ffi/native.ts";
import type { Rng } from "./kernel_refs.ts";

/** The nearest BF16 pattern (ties to even) of each fp32 value; NaN stays a quiet NaN. */
export function toBf16(f: Float32Array): Uint16Array<ArrayBuffer> {
  const bits = new Uint32Array(f.buffer, f.byteOffset, f.length);
  const out = new Uint16Array(f.length);
  for (let i = 0; i < f.length; i++) {
    const b = bits[i];
    out[i] = (b & 0x7fffffff) > 0x7f800000
      ? (b >>> 16) | 0x40
      : (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return out;
}

/** n BF16 weights ~ N(0, std²) (Box-Muller on the seeded generator). */
export function normalBf16(rng: Rng, n: number, std: number): Uint16Array<ArrayBuffer> {
  const f = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    const u = 1 - rng.next(), v = rng.next();
    const m = Math.sqrt(-2 * Math.log(u)) * std;
    f[i] = m * Math.cos(2 * Math.PI * v);
    if (i + 1 < n) f[i + 1] = m * Math.sin(2 * Math.PI * v);
  }
  return toBf16(f);
}

/** w (BF16 [rows][cols]) coded by blocks of blockRows rows; throws on an error code. */
export function encode(
  w: Uint16Array,
  rows: number,
  cols: number,
  blockRows: number,
): Uint8Array<ArrayBuffer> {
  const lib = k3();
  const bound = Number(lib.k3_codec_bound(rows, cols, blockRows));
  if (bound < 0) throw new Error(`k3_codec_bound: ${bound}`);
  const dst = new Uint8Array(bound);
  const size = Number(lib.k3_codec_encode(dst, BigInt(bound), w, rows, cols, blockRows));
  if (size < 0) throw new Error(`k3_codec_encode: ${size}`);
  return dst.slice(0, size);
}

/** The BF16 matrix a coded buffer holds, or the codec's error code. */
export function decode(src: Uint8Array, count: number): Uint16Array<ArrayBuffer> | number {
  const w = new Uint16Array(Math.max(1, count));
  const rc = k3().k3_codec_decode(w, src, BigInt(src.length));
  return rc === 0 ? w.subarray(0, count) : rc;
}

/**
 * y [T][rows] = coded W times x [T][cols], or the codec's error code. The coded bytes are
 * copied to the end of a native block, so that under `make asan` a read past them is
 * reported.
 */
export function matmulCoded(src: Uint8Array, x: Float32Array, rows: number, T: number) {
  const y = new Float32Array(Math.max(1, T * rows));
  // k3_alloc hands out whole pages: the bytes go at the end of the block, so that its end is
  // theirs.
  const room = Math.max(4096, Math.ceil(src.length / 4096) * 4096), at = room - src.length;
  const block = NativeBuffer.alloc(room);
  try {
    block.view(at, src.length).set(src);
    const rc = k3().k3_matmul_coded(y, block.at(at), BigInt(src.length), x, T);
    return rc === 0 ? y.subarray(0, T * rows) : rc;
  } finally {
    block.free();
  }
}
