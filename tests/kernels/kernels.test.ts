/**
 * libk3 kernels against the float64 references in kernel_refs.ts (written from docs/MODEL.md),
 * plus the properties the contracts in csrc/k3.h promise: the 8-lane order, batched ==
 * token-by-token, MXFP4 edge cases, carried state, accuracy of our expf/tanh/sigmoid, and
 * the same bytes for any thread count.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { k3 } from "../../ffi/library.ts";
import {
  attnResRef,
  bf16Values,
  combineRef,
  decodeMxfp4,
  gatedRmsnormRef,
  kdaConvRef,
  kdaGateRef,
  kdaRecurrenceRef,
  l2normHeadsRef,
  matmulRef,
  mlaExpandedRef,
  type MlaShape,
  rmsnormRef,
  Rng,
  routerRef,
  sigmoid,
  situGluRef,
} from "../support/kernel_refs.ts";

const lib = k3();
const ptr = (a: BufferSource) => Deno.UnsafePointer.of(a);
const RTOL = 1e-5;

/** Root mean square of a vector (the scale for tolerances on near-zero elements). */
function rms(v: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < v.length; i++) s += v[i] * v[i];
  return Math.sqrt(s / Math.max(1, v.length));
}

/** |actual - expected| <= rtol·(|expected| + rms(expected)) element by element. */
function assertClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  what: string,
  rtol = RTOL,
) {
  assert.equal(actual.length, expected.length, `${what}: length`);
  const floor = rms(expected);
  for (let i = 0; i < expected.length; i++) {
    const err = Math.abs(actual[i] - expected[i]);
    if (!(err <= rtol * (Math.abs(expected[i]) + floor))) {
      assert.fail(`${what}[${i}]: got ${actual[i]}, want ${expected[i]} (err ${err})`);
    }
  }
}

/** Same bytes (bit-identical floats, including -0 and NaN payloads). */
function assertSameBytes(a: ArrayBufferView, b: ArrayBufferView, what: string) {
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  assert.equal(x.length, y.length, `${what}: length`);
  for (let i = 0; i < x.length; i++) {
    if (x[i] !== y[i]) assert.fail(`${what}: bytes differ at ${i}`);
  }
}

/** Distance in units in the last place of fp32 at `want` (subnormal ulp below 2^-126). */
function ulps(got: number, want: number): number {
  if (got === want) return 0;
  const exp = Math.max(Math.floor(Math.log2(Math.abs(want))), -126);
  return Math.abs(got - want) / 2 ** (exp - 23);
}

/** Token t's slice [t*n, (t+1)*n) of a token-major array. */
function tokenOf<A extends Float32Array | Int32Array>(a: A, t: number, n: number): A {
  return a.subarray(t * n, (t + 1) * n) as A;
}

// ---- linear ----------------------------------------------------------------------------

function bf16Matmul(
  w: Uint16Array<ArrayBuffer>,
  x: Float32Array,
  rows: number,
  cols: number,
  T: number,
) {
  const y = new Float32Array(T * rows);
  lib.k3_matmul_bf16(y, ptr(w), x, rows, cols, T);
  return y;
}

Deno.test("matmul_bf16 matches the f64 reference (tails, T = 1 and 3)", () => {
  const rng = new Rng(1);
  for (const [rows, cols] of [[13, 37], [5, 5], [9, 64]]) {
    for (const T of [1, 3]) {
      const w = rng.bf16(rows * cols);
      const x = rng.f32(T * cols);
      const want = matmulRef(bf16Values(w), x, rows, cols, T);
      assertClose(bf16Matmul(w, x, rows, cols, T), want, `bf16 ${rows}x${cols} T=${T}`);
    }
  }
});

Deno.test("matmul_bf16_rows: row blocks at a stride give the whole product's bytes", () => {
  const rng = new Rng(7);
  // 4096 x 64 x 3 crosses the thread-team threshold, so the threaded split is covered too.
  for (const [rows, cols, T] of [[37, 29, 1], [37, 29, 3], [4096, 64, 3]]) {
    const w = rng.bf16(rows * cols);
    const x = rng.f32(T * cols);
    const whole = bf16Matmul(w, x, rows, cols, T);
    // Uneven blocks (1, then 4, 7, 10, ... rows), each written at its rows of y.
    const y = new Float32Array(T * rows).fill(NaN);
    for (let r0 = 0, n = 1; r0 < rows; r0 += n, n += 3) {
      const m = Math.min(n, rows - r0);
      const block = w.subarray(r0 * cols, (r0 + m) * cols);
      assert.equal(lib.k3_matmul_bf16_rows(y.subarray(r0), ptr(block), x, m, cols, T, rows), 0);
    }
    assertSameBytes(y, whole, `${rows}x${cols} T=${T} in row blocks`);
    assertClose(y, matmulRef(bf16Values(w), x, rows, cols, T), `${rows}x${cols} T=${T} reference`);
  }
  // It writes only its rows at the stride, and refuses a stride below its rows.
  const w = rng.bf16(2 * 8), x = rng.f32(2 * 8);
  const y = new Float32Array(2 * 5).fill(7);
  assert.equal(lib.k3_matmul_bf16_rows(y.subarray(1), ptr(w), x, 2, 8, 2, 5), 0);
  const product = bf16Matmul(w, x, 2, 8, 2);
  const written = [1, 2, 6, 7];
  y.forEach((v, i) => {
    const at = written.indexOf(i);
    assert.equal(v, at < 0 ? 7 : product[at], `y[${i}]`);
  });
  const before = y.slice();
  assert.equal(lib.k3_matmul_bf16_rows(y, ptr(w), x, 2, 8, 2, 1), -1);
  assertSameBytes(y, before, "a refused call writes nothing");
});

Deno.test("matmul_bf16: every T (token groups of 1..3, row tails) = T single-token calls", () => {
  const rng = new Rng(21);
  // Rows 1..3 past a multiple of 4 (the row block), columns with and without a tail, T with
  // every mix of token-group sizes up to a prefill chunk; 4099 x 128 crosses the thread-team
  // threshold.
  const shapes = [[1, 45], [6, 64], [7, 203], [13, 37], [64, 8], [4099, 128]];
  for (const [rows, cols] of shapes) {
    for (const T of rows > 1000 ? [2, 3, 4] : [2, 3, 4, 5, 7, 8, 9, 10, 17, 64]) {
      const w = rng.bf16(rows * cols), x = rng.f32(T * cols, -2, 2);
      const single = new Float32Array(T * rows);
      for (let t = 0; t < T; t++) {
        single.set(bf16Matmul(w, x.subarray(t * cols, (t + 1) * cols), rows, cols, 1), t * rows);
      }
      assertSameBytes(bf16Matmul(w, x, rows, cols, T), single, `${rows}x${cols} T=${T}`);
    }
  }
});

Deno.test("matmul_bf16 sums in the canonical 8-lane order, tail included", () => {
  // Lane l holds elements i % 8 == l; lanes fold as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
  // With 2^25 in lane 0, -2^25 in lane 4 and 1 in lane 1 that gives exactly 1; a plain
  // left-to-right sum loses the 1 (ulp(2^25) = 4) and gives 0.
  const one = 0x3f80; // bf16 bits of 1.0
  for (const [cols, big, minus] of [[16, 8, 4], [13, 0, 12]]) {
    const w = new Uint16Array(cols).fill(one);
    const x = new Float32Array(cols);
    x[big] = 2 ** 25;
    x[minus] = -(2 ** 25);
    x[1] = 1;
    assert.equal(bf16Matmul(w, x, 1, cols, 1)[0], 1, `cols=${cols}`);
  }
});

function mxfp4Matmul(
  packed: Uint8Array<ArrayBuffer>,
  scales: Uint8Array<ArrayBuffer>,
  x: Float32Array,
  rows: number,
  cols: number,
  group: number,
  T: number,
) {
  const y = new Float32Array(T * rows);
  const rc = lib.k3_matmul_mxfp4(y, ptr(packed), ptr(scales), x, rows, cols, group, T);
  return { rc, y };
}

Deno.test("matmul_mxfp4 matches the decoded f64 reference (groups 32 and 8, T = 1 and 3)", () => {
  const rng = new Rng(2);
  for (const [rows, cols, group] of [[7, 96, 32], [5, 40, 8]]) {
    for (const T of [1, 3]) {
      const packed = Uint8Array.from({ length: rows * cols / 2 }, () => rng.int(256));
      const scales = Uint8Array.from({ length: rows * cols / group }, () => 120 + rng.int(15));
      const x = rng.f32(T * cols);
      const { rc, y } = mxfp4Matmul(packed, scales, x, rows, cols, group, T);
      assert.equal(rc, 0);
      const want = matmulRef(decodeMxfp4(packed, scales, rows, cols, group), x, rows, cols, T);
      assertClose(y, want, `mxfp4 ${rows}x${cols}/${group} T=${T}`);
    }
  }
});

Deno.test("matmul_mxfp4 sums in the MXFP4 group order (k3.h), partials and pairs included", () => {
  // Every weight is 1.0 (code 2, scale 2^0); x holds 2^25 at column 0 and -2^25 at `minus`
  // (which cancel only when the order keeps them apart from the 1 at `one`). Column offset
  // o of group g goes to partial (o mod 16) / 4 of lane block g mod 2; lanes fold as
  // ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)). A 1 that shares a partial with 2^25 is lost.
  const cols = 96;
  const packed = new Uint8Array(cols / 2).fill(0x22);
  const scales = new Uint8Array(cols / 32).fill(127);
  for (
    const [minus, one, want] of [
      [32, 8, 1], // offset 8: partial 2, apart from offset 0 (an 8-lane order would lose it)
      [32, 4, 1], // offset 4: partial 1
      [32, 1, 0], // offset 1: partial 0, with 2^25
      [32, 16, 0], // offset 16: partial 0 again
      [64, 32, 1], // group 2 shares lanes 0-3 with group 0 and cancels there; group 1 is apart
    ]
  ) {
    const x = new Float32Array(cols);
    x[0] = 2 ** 25;
    x[minus] = -(2 ** 25);
    x[one] = 1;
    for (const T of [1, 2]) {
      const xt = new Float32Array(T * cols);
      for (let t = 0; t < T; t++) xt.set(x, t * cols);
      const { y } = mxfp4Matmul(packed, scales, xt, 1, cols, 32, T);
      for (let t = 0; t < T; t++) {
        assert.equal(y[t], want, `-2^25 at ${minus}, 1 at ${one}, T=${T}`);
      }
    }
  }
});

Deno.test("matmul_mxfp4 edge cases: nibble order, -0, scales 0 / 254 / 255, bad group", () => {
  const cols = 32;
  /** y of a one-row, one-group matrix: packed bytes `bytes` (then zeros) and `scale`. */
  const row = (bytes: number[], scale: number, x: Float32Array) => {
    const packed = new Uint8Array(cols / 2);
    packed.set(bytes);
    return mxfp4Matmul(packed, Uint8Array.of(scale), x, 1, cols, cols, 1).y[0];
  };
  const unit = (c: number) => {
    const x = new Float32Array(cols);
    x[c] = 1;
    return x;
  };
  const ones = new Float32Array(cols).fill(1);
  // Byte 0x72: low nibble (code 2 = 1.0) is column 0, high nibble (code 7 = 6.0) column 1.
  assert.equal(row([0x72], 127, unit(0)), 1);
  assert.equal(row([0x72], 127, unit(1)), 6);
  // The sign is bit 3; code 8 is -0, so a row of them sums to +0.
  assert.equal(row([0x09], 127, ones), -0.5);
  assert.equal(row([0xf0], 128, ones), -12);
  assert.ok(Object.is(row(new Array(16).fill(0x88), 127, ones), 0));
  // Scale 0 is 2^-127, a subnormal that must not be flushed; scale 254 is 2^127.
  assert.equal(row([0x02], 0, ones), 2 ** -127);
  assert.equal(row([0x03], 0, ones), 1.5 * 2 ** -127);
  assert.equal(row([0x02], 254, ones), 2 ** 127);
  assert.equal(row([0x03], 254, ones), 1.5 * 2 ** 127);

  const status = (rows: number, cols: number, group: number, scales: Uint8Array<ArrayBuffer>) => {
    const packed = new Uint8Array(rows * cols / 2);
    return mxfp4Matmul(packed, scales, new Float32Array(cols), rows, cols, group, 1).rc;
  };
  // Scale 255 (E8M0 NaN) is an integrity error, wherever it is in the matrix.
  const scales = new Uint8Array(3 * 2).fill(127);
  assert.equal(status(3, 64, 32, scales), 0);
  scales[5] = 255;
  assert.equal(status(3, 64, 32, scales), -1);
  // Unsupported layouts: a group that is not a multiple of 8, or does not divide cols.
  assert.equal(status(1, 24, 12, new Uint8Array(2)), -2);
  assert.equal(status(1, 40, 32, new Uint8Array(2)), -2);
});

// ---- norms and element-wise ------------------------------------------------------------

Deno.test("rmsnorm, l2norm_heads and gated_rmsnorm_heads match the references", () => {
  const rng = new Rng(3);
  for (const T of [1, 3]) {
    const n = 45;
    const x = rng.f32(T * n, -3, 3);
    const w = rng.f32(n, 0.5, 1.5);
    const y = new Float32Array(T * n);
    lib.k3_rmsnorm(y, x, w, n, 1e-5, T);
    assertClose(y, rmsnormRef(x, w, n, 1e-5, T), `rmsnorm T=${T}`);

    const [heads, dim] = [3, 13];
    const v = rng.f32(T * heads * dim, -2, 2);
    const want = l2normHeadsRef(v, heads, dim, 1e-6, 0.25, T);
    lib.k3_l2norm_heads(v, heads, dim, 1e-6, 0.25, T);
    assertClose(v, want, `l2norm T=${T}`);

    const o = rng.f32(T * heads * dim, -2, 2);
    const gw = rng.f32(dim, 0.5, 1.5);
    const gate = rng.f32(T * heads * dim, -4, 4);
    const out = new Float32Array(T * heads * dim);
    lib.k3_gated_rmsnorm_heads(out, o, gw, gate, heads, dim, 1e-5, T);
    assertClose(out, gatedRmsnormRef(o, gw, gate, heads, dim, 1e-5, T), `gated T=${T}`);
  }
});

Deno.test("rmsnorm may run in place (y aliases x)", () => {
  const rng = new Rng(4);
  const x = rng.f32(3 * 19);
  const w = rng.f32(19);
  const apart = new Float32Array(x.length);
  lib.k3_rmsnorm(apart, x, w, 19, 1e-6, 3);
  lib.k3_rmsnorm(x, x, w, 19, 1e-6, 3);
  assertSameBytes(x, apart, "in place");
});

Deno.test("situ_glu, add, mul_sigmoid, sigmoid match the references", () => {
  const rng = new Rng(5);
  const n = 2 * 37;
  const gate = rng.f32(n, -30, 30);
  const up = rng.f32(n, -120, 120);
  const out = new Float32Array(n);
  lib.k3_situ_glu(out, gate, up, 37, 4, 25, 2);
  assertClose(out, situGluRef(gate, up, 4, 25), "situ_glu");

  const y = rng.f32(n);
  const x = rng.f32(n);
  const sum = Float64Array.from(y, (v, i) => v + x[i]);
  lib.k3_add(y, x, n);
  assertClose(y, sum, "add");

  const g = rng.f32(n, -10, 10);
  const prod = Float64Array.from(y, (v, i) => v * sigmoid(g[i]));
  lib.k3_mul_sigmoid(y, g, n);
  assertClose(y, prod, "mul_sigmoid");

  const s = new Float32Array(n);
  lib.k3_sigmoid(s, g, n);
  assertClose(s, Float64Array.from(g, sigmoid), "sigmoid");
});

Deno.test("embed_bf16 widens rows exactly and refuses ids outside [0, vocab)", () => {
  const rng = new Rng(6);
  const [vocab, H] = [11, 9];
  const table = rng.bf16(vocab * H);
  const wide = bf16Values(table);
  const ids = Int32Array.of(10, 0, 4);
  const out = new Float32Array(3 * H);
  assert.equal(lib.k3_embed_bf16(out, ptr(table), ids, vocab, H, 3), 0);
  ids.forEach((id, t) =>
    assert.deepEqual(Array.from(tokenOf(out, t, H)), Array.from(wide.subarray(id * H, id * H + H)))
  );
  for (const bad of [11, -1]) {
    assert.equal(lib.k3_embed_bf16(out, ptr(table), Int32Array.of(0, bad), vocab, H, 2), -1);
  }
});

// ---- AttnRes ---------------------------------------------------------------------------

Deno.test("attn_res matches AR() of MODEL.md §4.1 (bank rows then p, strided bank)", () => {
  const rng = new Rng(7);
  const [H, nb, stride] = [29, 3, 5];
  for (const T of [1, 3]) {
    const bank = rng.f32(T * stride * H, -2, 2);
    const p = rng.f32(T * H, -2, 2);
    const sw = rng.f32(H, -1, 1);
    const out = new Float32Array(T * H);
    lib.k3_attn_res(out, bank, nb, stride, p, sw, H, 1e-5, T);
    for (let t = 0; t < T; t++) {
      const rows = [0, 1, 2].map((v) =>
        bank.subarray((t * stride + v) * H, (t * stride + v + 1) * H)
      );
      rows.push(tokenOf(p, t, H));
      assertClose(tokenOf(out, t, H), attnResRef(rows, sw, H, 1e-5), `attn_res T=${T} t=${t}`);
    }
  }
});

// ---- KDA -------------------------------------------------------------------------------

Deno.test("kda_conv with carried history equals the conv over the whole sequence", () => {
  const rng = new Rng(8);
  const [C, K, total] = [11, 4, 7];
  const x = rng.f32(total * C, -2, 2);
  const w = rng.f32(C * K, -1, 1);
  const want = kdaConvRef(x, w, C, K, total);
  const hist = new Float32Array((K - 1) * C);
  const out = new Float32Array(total * C);
  // Chunks of 1, 3, 1, 2 tokens: shorter and longer than the K-1 history rows.
  let t0 = 0;
  for (const T of [1, 3, 1, 2]) {
    lib.k3_kda_conv(out.subarray(t0 * C), hist, x.subarray(t0 * C, (t0 + T) * C), w, C, K, T);
    t0 += T;
  }
  assertClose(out, want, "conv");
  assert.deepEqual(
    Array.from(hist),
    Array.from(x.subarray((total - K + 1) * C)),
    "history = last K-1 inputs",
  );
});

Deno.test("kda_gate matches the decay formula", () => {
  const rng = new Rng(9);
  const [heads, dim] = [3, 7];
  for (const T of [1, 3]) {
    const g = rng.f32(T * heads * dim, -4, 4);
    const dt = rng.f32(heads * dim, -1, 1);
    const aLog = rng.f32(heads + 2, -1, 1); // longer than heads: only the first `heads` count
    const alpha = new Float32Array(T * heads * dim);
    lib.k3_kda_gate(alpha, g, dt, aLog, heads, dim, -5, T);
    assertClose(alpha, kdaGateRef(g, dt, aLog, heads, dim, -5, T), `gate T=${T}`);
  }
});

/** Random KDA step inputs: q, k unit per head (q scaled), alpha in (e^-5, 1), beta in (0, 1). */
function kdaInputs(rng: Rng, heads: number, dim: number, T: number) {
  const q = rng.f32(T * heads * dim);
  const k = rng.f32(T * heads * dim);
  const normalise = (a: Float32Array, scale: number) => {
    const unit = l2normHeadsRef(a, heads, dim, 0, scale, T);
    a.set(unit);
  };
  normalise(q, 1 / Math.sqrt(dim));
  normalise(k, 1);
  return {
    q,
    k,
    v: rng.f32(T * heads * dim, -2, 2),
    alpha: rng.f32(T * heads * dim, Math.exp(-5), 1),
    beta: rng.f32(T * heads, 0, 1),
  };
}

Deno.test("kda_recurrence: decay, read, delta write, read, over steps with carried state", () => {
  const rng = new Rng(10);
  const [heads, dim] = [2, 9];
  const S = new Float32Array(heads * dim * dim);
  const S64 = new Float64Array(S.length);
  for (const T of [3, 1, 2]) {
    const { q, k, v, alpha, beta } = kdaInputs(rng, heads, dim, T);
    const o = new Float32Array(T * heads * dim);
    lib.k3_kda_recurrence(o, S, q, k, v, alpha, beta, heads, dim, T);
    const want = kdaRecurrenceRef(S64, q, k, v, alpha, beta, heads, dim, T);
    assertClose(o, want, `recurrence T=${T}`);
    assertClose(S, S64, `state after T=${T}`);
  }
});

// ---- MLA -------------------------------------------------------------------------------

Deno.test("MLA absorbed attention over the latent cache equals the expanded form", () => {
  const rng = new Rng(11);
  const shape: MlaShape = { nh: 3, dn: 5, dr: 3, dv: 6, rkv: 11 };
  const { nh, dn, dr, dv, rkv } = shape;
  const scale = 1 / Math.sqrt(dn + dr);
  for (const [pos0, T] of [[0, 1], [4, 3]]) {
    const P = pos0 + T;
    const latent = rng.f32(P * rkv, -1, 1);
    const kpe = rng.f32(P * dr, -1, 1);
    const cache = new Float32Array(P * (rkv + dr));
    for (let s = 0; s < P; s++) {
      cache.set(latent.subarray(s * rkv, (s + 1) * rkv), s * (rkv + dr));
      cache.set(kpe.subarray(s * dr, (s + 1) * dr), s * (rkv + dr) + rkv);
    }
    const kvB = rng.bf16(nh * (dn + dv) * rkv);
    const q = rng.f32(T * nh * (dn + dr), -2, 2);
    const qAbs = new Float32Array(T * nh * (rkv + dr));
    const oLat = new Float32Array(T * nh * rkv);
    const o = new Float32Array(T * nh * dv);
    lib.k3_mla_absorb_q(qAbs, q, ptr(kvB), nh, dn, dr, dv, rkv, T);
    lib.k3_mla_attend(oLat, qAbs, cache, pos0, T, nh, rkv, dr, scale);
    lib.k3_mla_expand_o(o, oLat, ptr(kvB), nh, dn, dv, rkv, T);
    const want = mlaExpandedRef(shape, q, latent, kpe, bf16Values(kvB), pos0, T, scale);
    assertClose(o, want, `mla pos0=${pos0} T=${T}`);
  }
});

// ---- MoE -------------------------------------------------------------------------------

function route(
  logits: Float32Array,
  bias: Float32Array,
  E: number,
  k: number,
  renorm: number,
  scale: number,
  T: number,
) {
  const ids = new Int32Array(T * k);
  const weights = new Float32Array(T * k);
  lib.k3_router_topk(ids, weights, logits, bias, E, k, renorm, scale, T);
  return { ids, weights };
}

Deno.test("router_topk matches the reference on random logits (ids ascending)", () => {
  const rng = new Rng(12);
  const [E, k, T] = [37, 5, 3];
  const logits = rng.f32(T * E, -4, 4);
  const bias = rng.f32(E, -0.5, 0.5);
  const got = route(logits, bias, E, k, 1, 2.5, T);
  for (let t = 0; t < T; t++) {
    const want = routerRef(tokenOf(logits, t, E), bias, k, true, 2.5);
    assert.deepEqual(Array.from(tokenOf(got.ids, t, k)), want.ids, `ids t=${t}`);
    assertClose(tokenOf(got.weights, t, k), want.weights, `weights t=${t}`);
  }
});

Deno.test("router_topk breaks ties to the lowest expert id", () => {
  // Experts 2, 5, 6, 9 tie on the choice (same logit and bias); k = 3 takes 2, 5, 6.
  const E = 12;
  const logits = new Float32Array(E).fill(-3);
  const bias = new Float32Array(E);
  for (const e of [2, 5, 6, 9]) logits[e] = 1;
  assert.deepEqual(Array.from(route(logits, bias, E, 3, 0, 1, 1).ids), [2, 5, 6]);
  // The bias decides selection: 9 overtakes the others, yet 9's weight is the unbiased s.
  bias[9] = 0.25;
  const { ids, weights } = route(logits, bias, E, 3, 0, 1, 1);
  assert.deepEqual(Array.from(ids), [2, 5, 9]);
  assertClose(weights, [sigmoid(1), sigmoid(1), sigmoid(1)], "unbiased weights");
});

Deno.test("router_topk: renormalisation and routed_scaling_factor, each on its own", () => {
  const E = 8;
  const logits = Float32Array.of(0.5, -1, 2, 0, -2, 1, -0.5, 3);
  const bias = new Float32Array(E);
  const picked = [2, 5, 7]; // the three largest logits
  const s = picked.map((e) => sigmoid(logits[e]));
  const sum = s.reduce((a, b) => a + b, 0);
  const cases: [number, number, number[]][] = [
    [0, 1, s],
    [0, 2.5, s.map((v) => v * 2.5)],
    [1, 1, s.map((v) => v / (sum + 1e-20))],
    [1, 2.5, s.map((v) => v / (sum + 1e-20) * 2.5)],
  ];
  for (const [renorm, scale, want] of cases) {
    const got = route(logits, bias, E, 3, renorm, scale, 1);
    assert.deepEqual(Array.from(got.ids), picked);
    assertClose(got.weights, want, `renorm=${renorm} scale=${scale}`);
  }
  // Renormalised weights sum to one (then scale): the property the latent norm hides.
  const w = route(logits, bias, E, 3, 1, 1, 1).weights;
  assert.ok(Math.abs(w[0] + w[1] + w[2] - 1) < 1e-6);
});

Deno.test("moe_combine is the weighted sum of expert rows", () => {
  const rng = new Rng(13);
  const [k, n] = [4, 23];
  const y = rng.f32(k * n, -3, 3);
  const w = rng.f32(k, 0, 1);
  const acc = new Float32Array(n).fill(99); // overwritten, not accumulated into
  lib.k3_moe_combine(acc, y, w, k, n);
  assertClose(acc, combineRef(y, w, k, n), "combine");
});

// ---- batched == token by token ---------------------------------------------------------

Deno.test("T tokens at once give the same bytes as T single-token calls", () => {
  const rng = new Rng(14);
  const T = 3;
  /** Runs `call(T, offset)` once batched and T times with one token each. */
  const same = (
    what: string,
    n: number,
    call: (out: Float32Array, t0: number, T: number) => void,
  ) => {
    const batched = new Float32Array(T * n);
    call(batched, 0, T);
    const single = new Float32Array(T * n);
    for (let t = 0; t < T; t++) call(single.subarray(t * n, (t + 1) * n), t, 1);
    assertSameBytes(batched, single, what);
  };
  const [rows, cols] = [11, 45];
  const x = rng.f32(T * cols);
  const w = rng.bf16(rows * cols);
  same(
    "matmul_bf16",
    rows,
    (y, t0, n) => lib.k3_matmul_bf16(y, ptr(w), x.subarray(t0 * cols), rows, cols, n),
  );
  const [mcols, group] = [64, 32];
  const mx = rng.f32(T * mcols);
  const packed = Uint8Array.from({ length: rows * mcols / 2 }, () => rng.int(256));
  const scales = Uint8Array.from({ length: rows * mcols / group }, () => 118 + rng.int(20));
  same("matmul_mxfp4", rows, (y, t0, n) => {
    assert.equal(
      lib.k3_matmul_mxfp4(
        y,
        ptr(packed),
        ptr(scales),
        mx.subarray(t0 * mcols),
        rows,
        mcols,
        group,
        n,
      ),
      0,
    );
  });
  const gain = rng.f32(cols);
  same(
    "rmsnorm",
    cols,
    (y, t0, n) => lib.k3_rmsnorm(y, x.subarray(t0 * cols), gain, cols, 1e-5, n),
  );
  same("l2norm_heads", cols, (y, t0, n) => {
    y.set(x.subarray(t0 * cols, (t0 + n) * cols));
    lib.k3_l2norm_heads(y, 5, 9, 1e-6, 0.5, n);
  });
  const up = rng.f32(T * cols, -50, 50);
  same(
    "situ_glu",
    cols,
    (y, t0, n) => lib.k3_situ_glu(y, x.subarray(t0 * cols), up.subarray(t0 * cols), cols, 4, 25, n),
  );
  const g = rng.f32(T * cols, -3, 3);
  same(
    "gated_rmsnorm_heads",
    cols,
    (y, t0, n) =>
      lib.k3_gated_rmsnorm_heads(
        y,
        x.subarray(t0 * cols),
        gain.subarray(0, 9),
        g.subarray(t0 * cols),
        5,
        9,
        1e-5,
        n,
      ),
  );
  const dt = rng.f32(cols);
  same(
    "kda_gate",
    cols,
    (y, t0, n) =>
      lib.k3_kda_gate(
        y,
        g.subarray(t0 * cols),
        dt,
        Float32Array.of(0.3, -0.2, 0.1, 0.5, -1),
        5,
        9,
        -5,
        n,
      ),
  );
  const [nb, stride] = [2, 4];
  const bank = rng.f32(T * stride * cols);
  same(
    "attn_res",
    cols,
    (y, t0, n) =>
      lib.k3_attn_res(
        y,
        bank.subarray(t0 * stride * cols),
        nb,
        stride,
        x.subarray(t0 * cols),
        gain,
        cols,
        1e-5,
        n,
      ),
  );
  const ids = Int32Array.of(3, 0, 7);
  const table = rng.bf16(8 * cols);
  same(
    "embed_bf16",
    cols,
    (y, t0, n) => assert.equal(lib.k3_embed_bf16(y, ptr(table), ids.subarray(t0), 8, cols, n), 0),
  );
  const E = 19;
  const logits = rng.f32(T * E, -3, 3);
  const bias = rng.f32(E, -0.2, 0.2);
  same(
    "router_topk weights",
    4,
    (y, t0, n) =>
      lib.k3_router_topk(new Int32Array(n * 4), y, logits.subarray(t0 * E), bias, E, 4, 1, 2, n),
  );
});

Deno.test("stateful kernels: T at once equals T steps with carried state, bytes included", () => {
  const rng = new Rng(15);
  const T = 3;
  // Conv: output and history.
  const [C, K] = [13, 4];
  const x = rng.f32(T * C);
  const w = rng.f32(C * K);
  const start = rng.f32((K - 1) * C);
  const histA = start.slice();
  const outA = new Float32Array(T * C);
  lib.k3_kda_conv(outA, histA, x, w, C, K, T);
  const histB = start.slice();
  const outB = new Float32Array(T * C);
  for (let t = 0; t < T; t++) {
    lib.k3_kda_conv(tokenOf(outB, t, C), histB, tokenOf(x, t, C), w, C, K, 1);
  }
  assertSameBytes(outA, outB, "conv out");
  assertSameBytes(histA, histB, "conv history");
  // Recurrence: output and state.
  const [heads, dim] = [3, 10];
  const { q, k, v, alpha, beta } = kdaInputs(rng, heads, dim, T);
  const S0 = rng.f32(heads * dim * dim, -0.1, 0.1);
  const SA = S0.slice();
  const oA = new Float32Array(T * heads * dim);
  lib.k3_kda_recurrence(oA, SA, q, k, v, alpha, beta, heads, dim, T);
  const SB = S0.slice();
  const oB = new Float32Array(T * heads * dim);
  const n = heads * dim;
  for (let t = 0; t < T; t++) {
    lib.k3_kda_recurrence(
      tokenOf(oB, t, n),
      SB,
      tokenOf(q, t, n),
      tokenOf(k, t, n),
      tokenOf(v, t, n),
      tokenOf(alpha, t, n),
      tokenOf(beta, t, heads),
      heads,
      dim,
      1,
    );
  }
  assertSameBytes(oA, oB, "recurrence out");
  assertSameBytes(SA, SB, "recurrence state");
  // MLA: prefill of T tokens after pos0 == T decode steps.
  const [nh, dn, dr, dv, rkv, pos0] = [2, 4, 3, 5, 10, 2];
  const width = rkv + dr;
  const cache = rng.f32((pos0 + T) * width);
  const kvB = rng.bf16(nh * (dn + dv) * rkv);
  const qm = rng.f32(T * nh * (dn + dr));
  const qAbsA = new Float32Array(T * nh * width);
  lib.k3_mla_absorb_q(qAbsA, qm, ptr(kvB), nh, dn, dr, dv, rkv, T);
  const latA = new Float32Array(T * nh * rkv);
  lib.k3_mla_attend(latA, qAbsA, cache, pos0, T, nh, rkv, dr, 0.3);
  const oMA = new Float32Array(T * nh * dv);
  lib.k3_mla_expand_o(oMA, latA, ptr(kvB), nh, dn, dv, rkv, T);
  const qAbsB = new Float32Array(T * nh * width);
  const latB = new Float32Array(T * nh * rkv);
  const oMB = new Float32Array(T * nh * dv);
  for (let t = 0; t < T; t++) {
    const qa = tokenOf(qAbsB, t, nh * width);
    const lat = tokenOf(latB, t, nh * rkv);
    lib.k3_mla_absorb_q(qa, tokenOf(qm, t, nh * (dn + dr)), ptr(kvB), nh, dn, dr, dv, rkv, 1);
    lib.k3_mla_attend(lat, qa, cache, pos0 + t, 1, nh, rkv, dr, 0.3);
    lib.k3_mla_expand_o(tokenOf(oMB, t, nh * dv), lat, ptr(kvB), nh, dn, dv, rkv, 1);
  }
  assertSameBytes(qAbsA, qAbsB, "mla q_abs");
  assertSameBytes(latA, latB, "mla o_lat");
  assertSameBytes(oMA, oMB, "mla o");
});

// ---- our expf / tanh / sigmoid -----------------------------------------------------------

/** Points spread over [lo, hi] plus the edges of the fp32 range. */
function sweep(lo: number, hi: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => Math.fround(lo + (hi - lo) * i / (n - 1)));
}

Deno.test("expf is within 2 ulp of exp over [-104, 89], subnormals and overflow included", () => {
  // kda_gate with g huge gives alpha = exp(lb * sigmoid(1000)) = exp(lb) exactly.
  const g = new Float32Array(1).fill(1000);
  const alpha = new Float32Array(1);
  let worst = 0;
  for (const x of [...sweep(-104, 89, 1501), -87.5, -100, -103.9, 88.7, 88.72].map(Math.fround)) {
    lib.k3_kda_gate(alpha, g, new Float32Array(1), new Float32Array(1), 1, 1, x, 1);
    const want = Math.exp(x);
    if (Math.fround(want) === Infinity) {
      assert.equal(alpha[0], Infinity, `exp(${x})`);
      continue;
    }
    worst = Math.max(worst, ulps(alpha[0], want));
  }
  assert.ok(worst <= 2, `worst ${worst} ulp`);
});

Deno.test("tanh and sigmoid are within a few ulp; SiTU stays capped for |x| up to 1000", () => {
  // situ_glu(g = 1000, u; b1 = b2 = 1) = (1·tanh(1000))·sigmoid(1000)·(1·tanh(u)) = tanh(u).
  const xs = Float32Array.from([...sweep(-12, 12, 4001), ...sweep(-1000, 1000, 101), 1e-30, -3e-8]);
  const n = xs.length;
  const out = new Float32Array(n);
  lib.k3_situ_glu(out, new Float32Array(n).fill(1000), xs, n, 1, 1, 1);
  let worst = 0;
  xs.forEach((x, i) => worst = Math.max(worst, ulps(out[i], Math.tanh(x))));
  assert.ok(worst <= 3, `tanh worst ${worst} ulp`);

  const wide = Float32Array.from([...sweep(-120, 120, 4001), -1000, 1000]);
  const s = new Float32Array(wide.length);
  lib.k3_sigmoid(s, wide, wide.length);
  worst = 0;
  wide.forEach((x, i) => worst = Math.max(worst, ulps(s[i], 1 / (1 + Math.exp(-x)))));
  assert.ok(worst <= 4, `sigmoid worst ${worst} ulp`);

  const big = Float32Array.from(sweep(-1000, 1000, 2001));
  const shuffled = big.slice().reverse();
  const situ = new Float32Array(big.length);
  lib.k3_situ_glu(situ, big, shuffled, big.length, 4, 25, 1);
  situ.forEach((v, i) =>
    assert.ok(Number.isFinite(v) && Math.abs(v) <= 100, `situ(${big[i]}, ${shuffled[i]}) = ${v}`)
  );
  assertClose(situ, situGluRef(big, shuffled, 4, 25), "situ wide");
});

// ---- thread count ------------------------------------------------------------------------

/** A script that runs a few threaded kernels on fixed inputs and prints a SHA-256. */
const FINGERPRINT = `
import { k3 } from ${JSON.stringify(new URL("../../ffi/library.ts", import.meta.url).href)};
import { Rng } from ${JSON.stringify(new URL("../support/kernel_refs.ts", import.meta.url).href)};
const lib = k3(), rng = new Rng(99), T = 5, out = [];
const [rows, cols] = [67, 203];
const w = rng.bf16(rows * cols), x = rng.f32(T * cols);
const y = new Float32Array(T * rows);
lib.k3_matmul_bf16(y, Deno.UnsafePointer.of(w), x, rows, cols, T); out.push(y);
const packed = Uint8Array.from({ length: rows * 128 / 2 }, () => rng.int(256));
const scales = Uint8Array.from({ length: rows * 4 }, () => 120 + rng.int(14));
const xm = rng.f32(T * 128), ym = new Float32Array(T * rows);
lib.k3_matmul_mxfp4(ym, Deno.UnsafePointer.of(packed), Deno.UnsafePointer.of(scales), xm, rows, 128, 32, T); out.push(ym);
const S = new Float32Array(7 * 16 * 16), o = new Float32Array(T * 7 * 16);
lib.k3_kda_recurrence(o, S, rng.f32(T * 112), rng.f32(T * 112), rng.f32(T * 112), rng.f32(T * 112, 0.1, 1), rng.f32(T * 7, 0, 1), 7, 16, T);
out.push(o, S);
const cache = rng.f32(9 * 20), lat = new Float32Array(T * 6 * 16);
lib.k3_mla_attend(lat, rng.f32(T * 6 * 20), cache, 4, T, 6, 16, 4, 0.2); out.push(lat);
const bytes = new Uint8Array(out.reduce((n, a) => n + a.byteLength, 0));
let at = 0;
for (const a of out) { bytes.set(new Uint8Array(a.buffer), at); at += a.byteLength; }
const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
console.log(lib.k3_num_threads(), Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join(""));
`;

Deno.test("the same bytes with 1 and 3 OpenMP threads", async () => {
  const run = async (threads: number) => {
    const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--quiet", FINGERPRINT],
      env: { OMP_NUM_THREADS: String(threads) },
      cwd: fileURLToPath(new URL("../..", import.meta.url)),
    }).output();
    assert.equal(code, 0, new TextDecoder().decode(stderr));
    return new TextDecoder().decode(stdout).trim();
  };
  const [one, three] = await Promise.all([run(1), run(3)]);
  const [threadsOne, hashOne] = one.split(" ");
  const [threadsThree, hashThree] = three.split(" ");
  assert.deepEqual([threadsOne, threadsThree], ["1", "3"], "OMP_NUM_THREADS took effect");
  assert.match(hashOne, /^[0-9a-f]{64}$/);
  assert.equal(hashOne, hashThree);
});
