/**
 * The SIMD path gives the bytes of the portable path: every kernel on random shapes with
 * odd sizes and tails, and whole-model logits, run in child processes with K3_ISA=scalar
 * and with the automatic choice. On an x86-64 CPU with AVX2 and FMA the automatic choice
 * must be "avx2" ("avx512" with AVX-512 F, BW and VL), so the comparison cannot silently be
 * scalar against scalar.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const repo = fileURLToPath(new URL("../..", import.meta.url));

/** Runs every kernel on fixed random inputs; prints the ISA and one SHA-256 per case. */
const PROBE = `
import { k3, k3Isa } from ${JSON.stringify(new URL("../../ffi/library.ts", import.meta.url).href)};
import { Rng } from ${JSON.stringify(new URL("../support/kernel_refs.ts", import.meta.url).href)};
const lib = k3(), rng = new Rng(2024), ptr = (a) => Deno.UnsafePointer.of(a), out = {};
const sha = async (...arrays) => {
  const parts = arrays.map((a) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { all.set(p, at); at += p.length; }
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
};
for (const [rows, cols, T] of [[67, 203, 1], [67, 203, 5], [5, 7, 2], [150, 96, 4], [9, 1000, 7], [3, 16, 1], [67, 203, 3], [66, 203, 2], [65, 45, 3], [4099, 128, 2]]) {
  const w = rng.bf16(rows * cols), x = rng.f32(T * cols, -2, 2), y = new Float32Array(T * rows);
  lib.k3_matmul_bf16(y, ptr(w), x, rows, cols, T);
  out["bf16 " + [rows, cols, T]] = await sha(y);
}
for (const [rows, cols, group, T] of [[37, 96, 32, 1], [37, 96, 32, 4], [150, 128, 64, 5], [7, 64, 32, 3], [5, 40, 8, 2], [130, 3584, 32, 1], [9, 160, 32, 1], [6, 32, 32, 3], [67, 3072, 32, 7]]) {
  const packed = Uint8Array.from({ length: rows * cols / 2 }, () => rng.int(256));
  const scales = Uint8Array.from({ length: rows * cols / group }, () => rng.int(8) === 0 ? rng.int(3) : 110 + rng.int(30));
  const x = rng.f32(T * cols, -3, 3), y = new Float32Array(T * rows);
  const rc = lib.k3_matmul_mxfp4(y, ptr(packed), ptr(scales), x, rows, cols, group, T);
  out["mxfp4 " + [rows, cols, group, T]] = rc + " " + await sha(y);
}
for (const [n, T] of [[45, 3], [7168, 2], [5, 1]]) {
  const x = rng.f32(T * n, -3, 3), w = rng.f32(n), y = new Float32Array(T * n);
  lib.k3_rmsnorm(y, x, w, n, 1e-5, T);
  const g = rng.f32(T * n, -30, 30), u = rng.f32(T * n, -100, 100), s = new Float32Array(T * n);
  lib.k3_situ_glu(s, g, u, n, 4, 25, T);
  const sg = new Float32Array(T * n), m = x.slice();
  lib.k3_sigmoid(sg, g, T * n);
  lib.k3_mul_sigmoid(m, g, T * n);
  out["norm+map " + [n, T]] = await sha(y, s, sg, m);
}
for (const [heads, dim, T] of [[3, 40, 3], [2, 9, 2], [4, 128, 2], [5, 16, 1]]) {
  const C = heads * dim, q = rng.f32(T * C), k = rng.f32(T * C), v = rng.f32(T * C, -2, 2);
  lib.k3_l2norm_heads(q, heads, dim, 1e-6, 1 / Math.sqrt(dim), T);
  lib.k3_l2norm_heads(k, heads, dim, 1e-6, 1, T);
  const alpha = new Float32Array(T * C);
  lib.k3_kda_gate(alpha, rng.f32(T * C, -4, 4), rng.f32(C), rng.f32(heads), heads, dim, -5, T);
  const S = rng.f32(heads * dim * dim, -0.5, 0.5), o = new Float32Array(T * C);
  lib.k3_kda_recurrence(o, S, q, k, v, alpha, rng.f32(T * heads, 0, 1), heads, dim, T);
  const y = new Float32Array(T * C);
  lib.k3_gated_rmsnorm_heads(y, o, rng.f32(dim), rng.f32(T * C, -4, 4), heads, dim, 1e-5, T);
  const hist = rng.f32(3 * C), conv = new Float32Array(T * C);
  lib.k3_kda_conv(conv, hist, v, rng.f32(C * 4), C, 4, T);
  out["kda " + [heads, dim, T]] = await sha(q, k, alpha, o, S, y, conv, hist);
}
for (const [nh, dn, dr, dv, rkv, pos0, T] of [[3, 5, 3, 6, 11, 4, 3], [4, 16, 8, 16, 40, 9, 5], [2, 8, 4, 8, 64, 0, 1]]) {
  const P = pos0 + T, width = rkv + dr, cache = rng.f32(P * width, -1, 1), kvB = rng.bf16(nh * (dn + dv) * rkv);
  const qAbs = new Float32Array(T * nh * width), oLat = new Float32Array(T * nh * rkv), o = new Float32Array(T * nh * dv);
  lib.k3_mla_absorb_q(qAbs, rng.f32(T * nh * (dn + dr), -2, 2), ptr(kvB), nh, dn, dr, dv, rkv, T);
  const rc = lib.k3_mla_attend(oLat, qAbs, cache, pos0, T, nh, rkv, dr, 0.2);
  lib.k3_mla_expand_o(o, oLat, ptr(kvB), nh, dn, dv, rkv, T);
  out["mla " + [nh, dn, dr, dv, rkv, pos0, T]] = rc + " " + await sha(qAbs, oLat, o);
}
for (const [H, nb, T] of [[45, 3, 2], [7168, 12, 1], [29, 0, 1]]) {
  const bank = rng.f32(T * nb * H, -2, 2), p = rng.f32(T * H, -2, 2), outv = new Float32Array(T * H);
  lib.k3_attn_res(outv, bank, nb, nb, p, rng.f32(H), H, 1e-5, T);
  const acc = new Float32Array(H);
  lib.k3_moe_combine(acc, rng.f32(5 * H), rng.f32(5), 5, H);
  out["attn_res+combine " + [H, nb, T]] = await sha(outv, acc);
}
console.log(JSON.stringify({ isa: k3Isa(), out }));
`;

/** Runs the probe with extra environment; returns its ISA and per-case digests. */
async function probe(env: Record<string, string>) {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--quiet", PROBE],
    env: { OMP_NUM_THREADS: "2", ...env },
    cwd: repo,
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
  return JSON.parse(new TextDecoder().decode(stdout)) as {
    isa: string;
    out: Record<string, string>;
  };
}

/** The ISA the automatic choice must make on this machine. */
function expectedIsa(): string {
  if (Deno.build.arch === "aarch64") return "neon";
  // Deno refuses /proc without --allow-all; grep reads it.
  const grep = new Deno.Command("grep", { args: ["-m1", "^flags", "/proc/cpuinfo"] }).outputSync();
  assert.equal(grep.code, 0, "cannot read the CPU flags from /proc/cpuinfo");
  const line = new TextDecoder().decode(grep.stdout);
  const flags = new Set(line.slice(line.indexOf(":") + 1).trim().split(/\s+/));
  const avx2 = flags.has("avx2") && flags.has("fma");
  if (avx2 && ["avx512f", "avx512bw", "avx512vl"].every((f) => flags.has(f))) return "avx512";
  return avx2 ? "avx2" : "scalar";
}

Deno.test("every kernel: the SIMD path gives the bytes of the scalar path", async () => {
  const [scalar, auto] = await Promise.all([probe({ K3_ISA: "scalar" }), probe({})]);
  assert.equal(scalar.isa, "scalar");
  assert.equal(auto.isa, expectedIsa(), "automatic ISA choice");
  assert.ok(Object.keys(scalar.out).length >= 20, "the probe ran every case");
  for (const [name, digest] of Object.entries(scalar.out)) {
    assert.equal(auto.out[name], digest, `${name}: ${auto.isa} differs from scalar`);
  }
  // Scale bytes 255 are not in the inputs, so every MXFP4 and MLA call returned 0.
  for (const [name, digest] of Object.entries(scalar.out)) {
    if (name.startsWith("mxfp4") || name.startsWith("mla")) assert.match(digest, /^0 /, name);
  }
});

Deno.test("whole-model logits: byte-identical with K3_ISA=scalar and the automatic path", async () => {
  const dir = await tinyModel({ seed: 11 });
  const out = tempDir();
  const dumps: Uint8Array[] = [];
  for (const [name, env] of [["scalar", { K3_ISA: "scalar" }], ["auto", {}]] as const) {
    const file = path.join(out, `logits-${name}.bin`);
    const r = await runK3(
      ["run", dir, "--ids", "5,17,300,42,7", "--gen", "4", "--ignore-eos", "--dump-logits", file],
      { OMP_NUM_THREADS: "2", ...env },
    );
    assert.equal(r.code, 0, r.stderr);
    dumps.push(await Deno.readFile(file));
  }
  assert.ok(dumps[0].length > 0);
  assert.deepEqual(dumps[1], dumps[0]);
});
