/**
 * Number formats and randomness for synthetic checkpoints: a seeded xorshift PRNG, bf16
 * rounding, and the MXFP4 (E2M1 codes + E8M0 scales) encoder. Everything here is
 * deterministic: the same seed gives the same bits on every machine.
 */

/**
 * A seeded xorshift128 generator (Marsaglia 2003). Fast, 32-bit, not cryptographic. Bulk
 * fills go through `fill`, one tight loop on local variables, so generating a GB stays quick.
 */
export class XorShift128 {
  #state = new Uint32Array(4);

  /** Seeds the four state words from `seed` with splitmix32, so nearby seeds diverge at once. */
  constructor(seed: number) {
    let s = seed >>> 0;
    for (let i = 0; i < 4; i++) {
      s = (s + 0x9e3779b9) >>> 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      this.#state[i] = z ^ (z >>> 16);
    }
    if (this.#state.every((w) => w === 0)) this.#state[3] = 1; // all-zero state is a fixed point
  }

  /** Fills `out` with the next out.length uniform 32-bit words. */
  fill(out: Uint32Array): void {
    const st = this.#state;
    let x = st[0], y = st[1], z = st[2], w = st[3];
    for (let i = 0; i < out.length; i++) {
      const t = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = (w ^ (w >>> 19) ^ (t ^ (t >>> 8))) >>> 0;
      out[i] = w;
    }
    st[0] = x;
    st[1] = y;
    st[2] = z;
    st[3] = w;
  }

  /** The next uniform 32-bit unsigned integer. */
  nextU32(): number {
    const one = new Uint32Array(1);
    this.fill(one);
    return one[0];
  }

  /** A uniform float in [0, 1) with 24 random bits. */
  nextUnit(): number {
    return (this.nextU32() >>> 8) * 2 ** -24;
  }
}

/** Grow-on-demand scratch arrays for the bulk fills (one JS thread, so one set suffices). */
let scratchWords = new Uint32Array(0);
let scratchFloats = new Float32Array(0);

function words(rng: XorShift128, n: number): Uint32Array {
  if (scratchWords.length < n) scratchWords = new Uint32Array(n);
  const w = scratchWords.subarray(0, n);
  rng.fill(w);
  return w;
}

function floats(n: number): Float32Array {
  if (scratchFloats.length < n) scratchFloats = new Float32Array(n);
  return scratchFloats.subarray(0, n);
}

/** FNV-1a hash of a string, used to give every tensor its own random stream. */
function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** A generator for one named stream under a global seed: independent of generation order. */
export function streamRng(seed: number, name: string): XorShift128 {
  return new XorShift128(Math.imul(seed >>> 0, 0x9e3779b1) ^ hashString(name));
}

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** Rounds a float32 bit pattern to bf16 bits, nearest-even; NaN stays a quiet NaN. */
function bf16BitsFromF32Bits(bits: number): number {
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) | 0x40) & 0xffff;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Rounds a number to bf16 (nearest-even) and returns the 16-bit pattern. */
export function f32ToBf16(x: number): number {
  f32Scratch[0] = x;
  return bf16BitsFromF32Bits(u32Scratch[0]);
}

/** The value of a bf16 bit pattern. */
export function bf16ToF32(bits: number): number {
  u32Scratch[0] = (bits & 0xffff) << 16;
  return f32Scratch[0];
}

/**
 * Fills `out` with bf16 patterns of uniform noise of standard deviation `std` around `mean`.
 * Each random word gives two values (16 bits each: plenty for bf16's 8-bit significand).
 */
export function fillBf16Uniform(rng: XorShift128, out: Uint16Array, mean: number, std: number) {
  const n = out.length;
  const half = std * Math.sqrt(3); // U(-a, a) has std a/sqrt(3)
  const step = (2 * half) / 65536, low = mean - half + step / 2;
  const w = words(rng, Math.ceil(n / 2));
  const f = floats(n);
  for (let i = 0; i + 1 < n; i += 2) {
    const u = w[i >>> 1];
    f[i] = low + (u & 0xffff) * step;
    f[i + 1] = low + (u >>> 16) * step;
  }
  if (n % 2 === 1) f[n - 1] = low + (w[n >>> 1] & 0xffff) * step;
  const bits = new Uint32Array(f.buffer, f.byteOffset, n);
  for (let i = 0; i < n; i++) {
    const b = bits[i]; // finite by construction: no NaN case
    out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
}

/** Angles of the Box-Muller transform: 2^16 steps of a turn, cosine and sine tabulated once. */
const ANGLE_BITS = 16;
let angleTable: Float64Array | undefined;

function angles(): Float64Array {
  if (!angleTable) {
    const n = 1 << ANGLE_BITS;
    angleTable = new Float64Array(2 * n);
    for (let k = 0; k < n; k++) {
      const theta = (2 * Math.PI * (k + 0.5)) / n;
      angleTable[2 * k] = Math.cos(theta);
      angleTable[2 * k + 1] = Math.sin(theta);
    }
  }
  return angleTable;
}

/**
 * Fills `out` with normal noise N(0, std^2), Box-Muller over pairs of random words (the
 * cosine, then the sine of each pair): a call of even length leaves the stream where the next
 * call's values follow on, so the same tensor comes out the same whatever its chunks. The
 * angle is one of 2^16 (a step of 1e-4 rad moves a value far less than a BF16 or E2M1 step)
 * and comes from a table: two transcendental calls fewer per pair.
 */
export function fillNormal(rng: XorShift128, out: Float32Array, std: number): void {
  const n = out.length, table = angles();
  const w = words(rng, 2 * Math.ceil(n / 2));
  for (let i = 0; i < n; i += 2) {
    const u1 = (w[i] + 0.5) * 2 ** -32; // in (0, 1): the log stays finite
    const k = 2 * (w[i + 1] >>> (32 - ANGLE_BITS));
    const r = std * Math.sqrt(-2 * Math.log(u1));
    out[i] = r * table[k];
    if (i + 1 < n) out[i + 1] = r * table[k + 1];
  }
}

/** Fills `out` with bf16 patterns of normal noise N(0, std^2) (nearest-even rounding). */
export function fillBf16Normal(rng: XorShift128, out: Uint16Array, std: number): void {
  const f = floats(out.length);
  fillNormal(rng, f, std);
  const bits = new Uint32Array(f.buffer, f.byteOffset, out.length);
  for (let i = 0; i < out.length; i++) {
    const b = bits[i]; // finite by construction
    out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
}

/** Fills `out` with float32 uniform noise of standard deviation `std` around `mean`. */
export function fillF32Uniform(rng: XorShift128, out: Float32Array, mean: number, std: number) {
  const half = std * Math.sqrt(3);
  const w = words(rng, out.length);
  for (let i = 0; i < out.length; i++) out[i] = mean + ((w[i] >>> 8) * 2 ** -23 - 1) * half;
}

/** Fills `out` with uniform random bytes (a little-endian view of the random words). */
export function fillRandomBytes(rng: XorShift128, out: Uint8Array): void {
  const w = words(rng, Math.ceil(out.length / 4));
  out.set(new Uint8Array(w.buffer, w.byteOffset, out.length));
}

/** FP4 E2M1 magnitudes indexed by the low three bits of a code; bit 3 is the sign. */
const E2M1_MAGNITUDES: readonly number[] = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

/** Root mean square of an E2M1 value whose code is uniform over all 16 codes. */
export const E2M1_RMS = Math.sqrt(
  E2M1_MAGNITUDES.reduce((s, m) => s + m * m, 0) / E2M1_MAGNITUDES.length,
);

/** E8M0 bias: a scale byte s means 2^(s - 127); 255 is NaN and never written. */
export const E8M0_BIAS = 127;

/** Midpoints between neighbouring E2M1 magnitudes: a magnitude above T[i] rounds past i. */
const E2M1_MIDPOINTS: readonly number[] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5];

/** The E2M1 magnitude index nearest to `a` >= 0 (ties to the even index). */
function e2m1IndexSlow(a: number): number {
  let i = 0;
  while (i < E2M1_MIDPOINTS.length && a > E2M1_MIDPOINTS[i]) i++;
  // On a midpoint, between index i and i + 1: the even one.
  if (i < E2M1_MIDPOINTS.length && a === E2M1_MIDPOINTS[i] && (i + 1) % 2 === 0) i++;
  return i;
}

/**
 * Every midpoint is a multiple of 1/4, so a quarter-wide bucket [k/4, (k+1)/4) rounds to one
 * index throughout, except at its left edge k/4, which may be a tie: two tables, same answers.
 */
const QUARTERS = 25; // magnitudes up to 6 (the scale keeps a group within it)
const E2M1_INSIDE = Uint8Array.from({ length: QUARTERS }, (_, k) => e2m1IndexSlow((k + 0.5) / 4));
const E2M1_EDGE = Uint8Array.from({ length: QUARTERS }, (_, k) => e2m1IndexSlow(k / 4));

/** The E2M1 code nearest to `x` (ties to the even code, i.e. the even magnitude index). */
function e2m1Code(x: number): number {
  const sign = x < 0 || (x === 0 && 1 / x < 0) ? 8 : 0;
  const q = Math.abs(x) * 4; // exact: a power of two
  if (!(q < QUARTERS)) return sign | e2m1IndexSlow(Math.abs(x));
  const k = Math.floor(q);
  return sign | (q === k ? E2M1_EDGE[k] : E2M1_INSIDE[k]);
}

/** The E8M0 exponent that makes a group's largest magnitude fit under 6 (E2M1's max). */
function e8m0ScaleFor(maxAbs: number): number {
  if (maxAbs === 0) return E8M0_BIAS; // any scale is exact for an all-zero group
  const e = Math.ceil(Math.log2(maxAbs / 6));
  return Math.min(254, Math.max(0, e + E8M0_BIAS));
}

/** An MXFP4 matrix as stored: packed codes [rows, cols/2] and E8M0 scales [rows, cols/group]. */
interface Mxfp4Encoded {
  packed: Uint8Array;
  scales: Uint8Array;
}

/**
 * Encodes a row-major float matrix [rows, cols] to MXFP4 (compressed-tensors layout): per
 * group of `groupSize` columns one E8M0 scale, then each value rounded to the nearest E2M1
 * code; byte j of a row holds column 2j in its low nibble and column 2j+1 in its high nibble.
 */
export function encodeMxfp4(
  values: Float32Array,
  rows: number,
  cols: number,
  groupSize: number,
): Mxfp4Encoded {
  if (cols % groupSize !== 0 || groupSize % 2 !== 0 || values.length !== rows * cols) {
    throw new RangeError(
      `encodeMxfp4: ${rows}x${cols} (${values.length} values) does not split into groups of ${groupSize}`,
    );
  }
  const packed = new Uint8Array((rows * cols) / 2);
  const scales = new Uint8Array((rows * cols) / groupSize);
  encodeMxfp4Groups(values, groupSize, packed, scales);
  return { packed, scales };
}

/**
 * Encodes consecutive groups of `groupSize` values (a row-major matrix's, as rows are whole
 * groups) to MXFP4: each group's E8M0 scale from its largest magnitude into `scales` (when
 * given), each value rounded to the nearest E2M1 code into `packed` (when given; low nibble
 * first).
 */
export function encodeMxfp4Groups(
  values: Float32Array,
  groupSize: number,
  packed: Uint8Array | null,
  scales: Uint8Array | null,
): void {
  for (let g = 0; g < values.length / groupSize; g++) {
    const start = g * groupSize;
    let maxAbs = 0;
    for (let k = 0; k < groupSize; k++) maxAbs = Math.max(maxAbs, Math.abs(values[start + k]));
    const s = e8m0ScaleFor(maxAbs);
    if (scales) scales[g] = s;
    if (!packed) continue;
    const inv = 2 ** (E8M0_BIAS - s);
    for (let k = 0; k < groupSize; k += 2) {
      const lo = e2m1Code(values[start + k] * inv);
      const hi = e2m1Code(values[start + k + 1] * inv);
      packed[(start + k) / 2] = lo | (hi << 4);
    }
  }
}
