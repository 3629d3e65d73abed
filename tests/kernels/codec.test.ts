/**
 * The lossless BF16 codec (csrc/codec.c) and the coded matrix kernel: every BF16 pattern
 * round-trips, normal weights of every trunk width round-trip and code to at most 0.72 of
 * their BF16 bytes, the kernel gives the bytes of k3_matmul_bf16 on the decoded weights on
 * every ISA path and thread count (and is close to a float64 reference), and a damaged
 * buffer is refused with its error code: never a crash, never a read outside it.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { k3 } from "../../ffi/library.ts";
import { matmulRef, Rng } from "../support/kernel_refs.ts";
import { decode, encode, matmulCoded, normalBf16 } from "../support/codec_weights.ts";
import { ARM_TOOLS, requireTools, skipWithout } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");

const E = { truncated: -10, magic: -11, shape: -12, table: -13, index: -14, escapes: -15 };

/** Every pattern 0..65535 once, in a shuffled order (seeded). */
function allPatterns(rng: Rng): Uint16Array<ArrayBuffer> {
  const p = Uint16Array.from({ length: 65536 }, (_, i) => i);
  for (let i = p.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [p[i], p[j]] = [p[j], p[i]];
  }
  return p;
}

Deno.test("codec: all 65,536 BF16 patterns round-trip (NaN payloads, infinities, subnormals, signed zeros)", () => {
  const inOrder = Uint16Array.from({ length: 65536 }, (_, i) => i);
  const back = decode(encode(inOrder, 256, 256, 64), 65536);
  assert.ok(typeof back !== "number", `decode failed: ${back}`);
  assert.deepEqual(back, inOrder);
  // Shuffled, in rows with a partial last group and blocks that do not divide the rows.
  const rng = new Rng(5), rows = 65, cols = 1009;
  const w = new Uint16Array(rows * cols);
  w.set(allPatterns(rng));
  for (let i = 65536; i < w.length; i++) w[i] = rng.int(65536);
  const back2 = decode(encode(w, rows, cols, 16), w.length);
  assert.ok(typeof back2 !== "number", `decode failed: ${back2}`);
  assert.deepEqual(back2, w);
  // A matrix of one pattern per row block, the extremes alone.
  for (const bits of [0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0xffff, 0x0001, 0x807f]) {
    const one = new Uint16Array(3 * 11).fill(bits);
    assert.deepEqual(decode(encode(one, 3, 11, 2), one.length), one, bits.toString(16));
  }
});

/** The trunk's fan-ins (docs/MODEL.md §3): H, the dense MLP, the attention, shared experts,
 * the latent, q_a rank and kv_a rank. */
const TRUNK_COLS = [7168, 33792, 12288, 6144, 3584, 1536, 512];

Deno.test("codec: normal weights of every trunk width round-trip and code to at most 0.72x", () => {
  const rng = new Rng(9);
  for (const cols of TRUNK_COLS) {
    const rows = 48, w = normalBf16(rng, rows * cols, 1 / Math.sqrt(cols));
    const coded = encode(w, rows, cols, 16);
    assert.equal(k3().k3_codec_check(coded, BigInt(coded.length)), 0);
    assert.deepEqual(decode(coded, w.length), w, `cols ${cols}`);
    const ratio = coded.length / (2 * w.length);
    assert.ok(ratio <= 0.72, `cols ${cols}: coded ${ratio.toFixed(4)} of BF16`);
    assert.ok(
      ratio >= 0.6,
      `cols ${cols}: ${ratio.toFixed(4)} is below the entropy (a lossy code?)`,
    );
  }
});

Deno.test("coded kernel: the bytes of k3_matmul_bf16 on the decoded weights, near the float64 reference", () => {
  const lib = k3(), rng = new Rng(31);
  for (
    const [rows, cols, T] of [[37, 203, 1], [37, 203, 4], [12, 7168, 3], [9, 1001, 7], [64, 96, 2]]
  ) {
    const w = normalBf16(rng, rows * cols, 1 / Math.sqrt(cols)), coded = encode(w, rows, cols, 8);
    const x = rng.f32(T * cols, -2, 2), y = matmulCoded(coded, x, rows, T);
    assert.ok(typeof y !== "number", `kernel failed: ${y}`);
    const want = new Float32Array(T * rows);
    lib.k3_matmul_bf16(want, Deno.UnsafePointer.of(w), x, rows, cols, T);
    assert.deepEqual(y, want, `${[rows, cols, T]}`);
    const wv = new Float32Array(new Uint32Array(Array.from(w, (b) => b << 16)).buffer);
    const ref = matmulRef(wv, x, rows, cols, T);
    for (let i = 0; i < ref.length; i++) {
      assert.ok(
        Math.abs(y[i] - ref[i]) <= 1e-4 * (1 + Math.abs(ref[i])),
        `${[rows, cols, T]}[${i}]`,
      );
    }
  }
});

Deno.test("coded kernel: a matrix coded in row blocks writes each block into its place", () => {
  const lib = k3(), rng = new Rng(8), rows = 45, cols = 520, T = 3, cut = 17;
  const w = normalBf16(rng, rows * cols, 1 / Math.sqrt(cols)), x = rng.f32(T * cols, -2, 2);
  const want = new Float32Array(T * rows), y = new Float32Array(T * rows).fill(NaN);
  lib.k3_matmul_bf16(want, Deno.UnsafePointer.of(w), x, rows, cols, T);
  for (const [r0, n] of [[0, cut], [cut, rows - cut]]) {
    const part = encode(w.subarray(r0 * cols, (r0 + n) * cols), n, cols, 8);
    const at = y.subarray(r0);
    assert.equal(
      lib.k3_matmul_coded_rows(at, Deno.UnsafePointer.of(part), BigInt(part.length), x, T, rows),
      0,
    );
    assert.equal(
      lib.k3_matmul_coded_rows(at, Deno.UnsafePointer.of(part), BigInt(part.length), x, T, n - 1),
      E.shape,
    );
  }
  assert.deepEqual(y, want);
});

/** The CPU's flags (empty off Linux x86-64). */
function cpuFlags(): Set<string> {
  if (Deno.build.arch !== "x86_64" || Deno.build.os !== "linux") return new Set();
  const grep = new Deno.Command("grep", { args: ["-m1", "^flags", "/proc/cpuinfo"] }).outputSync();
  return new Set(new TextDecoder().decode(grep.stdout).split(/\s+/));
}
const FLAGS = cpuFlags();
const HAS_AVX2 = FLAGS.has("avx2") && FLAGS.has("fma");
const HAS_AVX512 = HAS_AVX2 && ["avx512f", "avx512bw", "avx512vl"].every((f) => FLAGS.has(f));

/** The ISA the automatic choice must make here (as tests/kernels/simd.test.ts asks it). */
function expectedIsa(): string {
  if (Deno.build.arch === "aarch64") return "neon";
  return HAS_AVX512 ? "avx512" : HAS_AVX2 ? "avx2" : "scalar";
}

/** The probe's digests under the given environment. */
async function probe(env: Record<string, string>) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", path.join(repo, "tests", "support", "codec_probe.ts")],
    env,
    cwd: repo,
  }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, dec.decode(out.stderr));
  return JSON.parse(dec.decode(out.stdout)) as { isa: string; out: Record<string, string> };
}

/** The probe's digests against the portable path's, on `isa` at 1 and 2 threads: every T from 1
 * to 9, odd column counts, damaged codes refused with the same error. */
async function sameAsScalar(isa: string) {
  const runs = await Promise.all([
    probe({ K3_ISA: "scalar", OMP_NUM_THREADS: "1" }),
    probe({ K3_ISA: isa, OMP_NUM_THREADS: "1" }),
    probe({ K3_ISA: isa, OMP_NUM_THREADS: "2" }),
  ]);
  assert.equal(runs[0].isa, "scalar");
  assert.ok(Object.keys(runs[0].out).length >= 150, "every case ran");
  assert.ok(Object.keys(runs[0].out).some((k) => k.startsWith("tampered")), "damaged cases ran");
  assert.ok(Object.values(runs[0].out).includes("-15"), "some damaged buffer was refused");
  for (const run of runs.slice(1)) {
    assert.equal(run.isa, isa);
    assert.deepEqual(run.out, runs[0].out, `${run.isa} differs from scalar`);
  }
}

Deno.test("coded kernel: the automatic ISA choice is the widest path the CPU has", async () => {
  assert.equal((await probe({ OMP_NUM_THREADS: "1" })).isa, expectedIsa());
});

const AVX2 = "coded kernel: the AVX2 path (K3_ISA=avx2), 1 or 2 threads, gives the portable bytes";
Deno.test({
  name: HAS_AVX2 ? AVX2 : `${AVX2} (SKIPPED: this CPU has no AVX2+FMA)`,
  ignore: !HAS_AVX2,
}, () => sameAsScalar("avx2"));

const AVX512 =
  "coded kernel: the AVX-512 path (K3_ISA=avx512), 1 or 2 threads, gives the portable bytes";
Deno.test(
  {
    name: HAS_AVX512 ? AVX512 : `${AVX512} (SKIPPED: this CPU has no AVX-512 F/BW/VL)`,
    ignore: !HAS_AVX512,
  },
  () => sameAsScalar("avx512"),
);

/** A small coded matrix with escapes in it, its weights and a token. */
function sample() {
  const rng = new Rng(3), rows = 20, cols = 64;
  const w = normalBf16(rng, rows * cols, 0.125);
  w[5] = 0x7f80, w[70] = 0x0001, w[200] = 0xffc3; // exponents outside the tables: escapes
  return { w, rows, cols, coded: encode(w, rows, cols, 8), x: rng.f32(cols) };
}

Deno.test("codec: damaged headers, tables and indexes are refused by name, before any work", () => {
  const lib = k3(), { rows, cols, coded, x } = sample();
  const check = (b: Uint8Array) => lib.k3_codec_check(b, BigInt(b.length));
  const edit = (at: number, bytes: number[]) => {
    const b = coded.slice();
    b.set(bytes, at);
    return b;
  };
  const dv = new DataView(coded.buffer);
  const blocks = Math.ceil(rows / 8), index = 32 + 8 * blocks;
  const cases: [string, Uint8Array, number][] = [
    ["empty", new Uint8Array(0), E.truncated],
    ["header only", coded.slice(0, 32), E.truncated],
    ["last byte cut", coded.slice(0, coded.length - 1), E.truncated],
    ["magic", edit(0, [0x4b, 0x33, 0x43, 0x32]), E.magic],
    ["rows 0", edit(4, [0, 0, 0, 0]), E.shape],
    ["rows + 1", edit(4, [rows + 1, 0, 0, 0]), E.shape],
    ["cols", edit(8, [cols - 8, 0, 0, 0]), E.shape],
    [
      "rows and cols near 2^31 (sizes past int64)",
      edit(4, [0xfe, 0xff, 0xff, 0x7f, 0xf7, 0xff, 0xff, 0x7f]),
      E.shape,
    ],
    ["block rows 0", edit(12, [0, 0, 0, 0]), E.shape],
    ["escapes + 1 (index disagrees)", edit(16, [dv.getUint8(16) + 1]), E.index],
    ["escapes + 64 (size disagrees)", edit(16, [dv.getUint8(16) + 64]), E.shape],
    ["size", edit(24, [dv.getUint8(24) + 8]), E.shape],
    ["table repeats an exponent", edit(32 + 1, [coded[32]]), E.table],
    ["table last byte", edit(32 + 7, [1]), E.table],
    ["index does not start at 0", edit(index, [1]), E.index],
    ["index decreases", edit(index + 4 * 2, [0xff, 0xff, 0, 0]), E.index],
  ];
  for (const [name, bytes, code] of cases) {
    assert.equal(check(bytes), code, name);
    assert.equal(decode(bytes, rows * cols), code, `decode: ${name}`);
    assert.equal(matmulCoded(bytes, x, rows, 1), code, `kernel: ${name}`);
  }
  assert.match(
    new Deno.UnsafePointerView(lib.k3_codec_strerror(E.index)!).getCString(),
    /escape index/,
  );
});

Deno.test("coded kernel: damaged codes give the decoder's answer or its error, never another", () => {
  const lib = k3(), { rows, cols, coded } = sample(), rng = new Rng(12);
  const blocks = Math.ceil(rows / 8), main = 32 + 8 * blocks + Math.ceil(4 * (rows + 1) / 8) * 8;
  let refused = 0;
  for (let trial = 0; trial < 300; trial++) {
    const b = coded.slice();
    // Flips in the sign-mantissa and code bytes (11 per 8 columns).
    for (let k = 1 + rng.int(3); k > 0; k--) {
      b[main + rng.int(rows * cols * 11 / 8)] ^= 1 << rng.int(8);
    }
    const T = 1 + rng.int(5), x = rng.f32(T * cols, -2, 2);
    const back = decode(b, rows * cols), y = matmulCoded(b, x, rows, T);
    if (typeof back === "number") {
      assert.equal(back, E.escapes);
      assert.equal(y, E.escapes, "the kernel refuses what the decoder refuses");
      refused++;
      continue;
    }
    assert.ok(typeof y !== "number", `the kernel refused a decodable buffer (${y})`);
    const want = new Float32Array(T * rows);
    lib.k3_matmul_bf16(want, Deno.UnsafePointer.of(back), x, rows, cols, T);
    assert.deepEqual(y, want);
  }
  assert.ok(refused >= 5, `only ${refused} of 300 damaged buffers changed an escape count`);
  // Every code of the last row an escape: its escape reads run furthest past the stream.
  const G = cols / 8, last = main + (rows - 1) * 11 * G + 8 * G, b = coded.slice();
  b.fill(0xff, last, last + 3 * G);
  assert.equal(decode(b, rows * cols), E.escapes);
  for (let T = 1; T <= 5; T++) assert.equal(matmulCoded(b, rng.f32(T * cols), rows, T), E.escapes);
});

const NEON = "coded kernel: NEON under qemu gives the portable path's bytes (csrc/tests/harness.c)";

Deno.test({ name: NEON, ignore: skipWithout(NEON, ARM_TOOLS) }, async () => {
  requireTools(ARM_TOOLS);
  const out = await new Deno.Command("make", { args: ["-s", "harness-arm"], cwd: repo }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, dec.decode(out.stdout) + dec.decode(out.stderr));
  const read = (name: string) => Deno.readTextFile(path.join(repo, "build", `harness-${name}.sha`));
  assert.match(await read("scalar"), /^[0-9a-f]{64}/);
  assert.equal(await read("arm64-pool"), await read("scalar"));
});
