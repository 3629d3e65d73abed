/**
 * The calibration of `make-tiny --routing skewed` (lib/synth/routing.ts), printed, not a test.
 *
 * Target: kimi-k3-in-c's trace of the real model, 100,096 expert requests touching 10,010 of
 * 82,432 experts. The run re-prefilled its prefix at every step: 5 prompt tokens and 8 steps
 * give 5 + 6 + ... + 12 = 68 evaluations of 12 positions (100,096 = 68 x 16 x 92 exactly),
 * so per MoE layer 12 tokens x 16 picks touched 10,010 / 92 = ~109 experts (the 90% repeats
 * are mostly the re-evaluations). Uniform routing touches ~174.
 *
 * Model of the router: a token's logits are independent N(0, 1) per expert (on the full-size
 * layout they are the real router rows, std 1/sqrt(H), against the RMS-normalised embedding
 * row, and measured so in bench/prefill.ts); choice = sigmoid(logit) + bias, top 16 of 896.
 * With the same random logits for every strength (so the curve is smooth), it bisects for the
 * strength at which 12 tokens touch 109 experts, then prints distinct experts per layer for
 * longer prompts at uniform, the calibrated strength and the shipped SKEWED_STRENGTH.
 *
 * With --measure UNIFORM_DIR,SKEWED_DIR (two full-size layouts, e.g. build/bench-prefill's),
 * it also measures the routing the engine does on them, from the files: on that layout the
 * trunk is holes, so every layer adds zero and a token's router input is its embedding row,
 * RMS-normalised (the AttnRes mixes only scale it; the norm gains are 1). For the prompts of
 * bench/prefill.ts (distinct ids) it reads the embedding rows and each sampled layer's router
 * and bias, computes logits with the engine's BF16 kernel, picks the top 16 of sigmoid + bias
 * (ties to the lower id, as csrc/moe.c) and prints distinct experts per layer. The engine's
 * own count (bench/prefill.ts, expert floor) checks this model of the router.
 *
 * Usage: deno run -A bench/routing.ts [--reps N (0: measure only)] [--measure U,S] [--tokens 12,256,2000]
 *        [--sample-layers 1,2,3,4]
 */
import { XorShift128 } from "../lib/synth/numerics.ts";
import { fillSkewedBias, SKEWED_STRENGTH } from "../lib/synth/routing.ts";
import { K3_EXPERTS, K3_TOP_K } from "../lib/synth/full.ts";
import * as path from "node:path";
import { k3 as lib } from "../ffi/library.ts";
import { readSafetensorsHeader } from "../lib/checkpoint/safetensors.ts";
import { bf16ToF32 } from "../lib/synth/numerics.ts";
import { distinctIds } from "./common.ts";

const E = K3_EXPERTS, K = K3_TOP_K;
const TARGET_TOKENS = 12, TARGET_DISTINCT = 10_010 / 92;
const args = Deno.args;
const repsAt = args.indexOf("--reps");
const reps = repsAt >= 0 ? Number(args[repsAt + 1]) : 400;

/** n tokens' logits, [n][E], standard normal (Box-Muller), from `seed`. */
function gaussianLogits(seed: number, n: number): Float32Array {
  const rng = new XorShift128(seed), out = new Float32Array(n * E);
  for (let i = 0; i < out.length; i += 2) {
    const u = rng.nextUnit() + 2 ** -25, v = rng.nextUnit();
    const r = Math.sqrt(-2 * Math.log(u));
    out[i] = r * Math.cos(2 * Math.PI * v);
    if (i + 1 < out.length) out[i + 1] = r * Math.sin(2 * Math.PI * v);
  }
  return out;
}

/** Distinct experts the n tokens of `logits` pick under `bias` (top K of sigmoid + bias). */
function distinctExperts(logits: Float32Array, bias: Float32Array): number {
  const seen = new Uint8Array(E), choice = new Float64Array(E);
  const order = Array.from({ length: E }, (_, e) => e);
  for (let t = 0; t < logits.length / E; t++) {
    for (let e = 0; e < E; e++) choice[e] = 1 / (1 + Math.exp(-logits[t * E + e])) + bias[e];
    order.sort((a, b) => choice[b] - choice[a] || a - b);
    for (let j = 0; j < K; j++) seen[order[j]] = 1;
  }
  return seen.reduce((a, b) => a + b, 0);
}

/** Mean distinct experts per layer over `count` layers (each its own logits and bias). */
function meanDistinct(strength: number, tokens: number, count: number): number {
  let sum = 0;
  for (let r = 0; r < count; r++) {
    const bias = new Float32Array(E);
    if (strength > 0) fillSkewedBias(new XorShift128(1000 + r), bias, strength);
    else bias.fill(0); // uniform's noise of std 0.01 is far below a token's logit spread
    sum += distinctExperts(gaussianLogits(r, tokens), bias);
  }
  return sum / count;
}

function calibrate(): number {
  let lo = 0, hi = 2;
  for (let i = 0; i < 16; i++) {
    const mid = (lo + hi) / 2;
    if (meanDistinct(mid, TARGET_TOKENS, reps) > TARGET_DISTINCT) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/** The simulated calibration and the table of longer prompts (skipped with --reps 0). */
function simulate(): void {
  const fitted = calibrate();
  console.log(
    `target: ${TARGET_TOKENS} tokens touch ${TARGET_DISTINCT.toFixed(1)} of ${E} experts per ` +
      `layer (top ${K}); fitted strength ${fitted.toFixed(3)} over ${reps} layers; shipped ` +
      `SKEWED_STRENGTH ${SKEWED_STRENGTH}`,
  );
  console.log("\n| tokens | uniform | fitted | shipped | requests repeated (shipped) |");
  console.log("|---|---|---|---|---|");
  for (const n of [TARGET_TOKENS, 68, 256, 2000, 8000]) {
    const count = Math.max(3, Math.round(reps * TARGET_TOKENS / n));
    const [u, f, s] = [0, fitted, SKEWED_STRENGTH].map((x) => meanDistinct(x, n, count));
    const repeated = 100 * (1 - s / (n * K));
    console.log(
      `| ${n} | ${u.toFixed(1)} | ${f.toFixed(1)} | ${s.toFixed(1)} | ${repeated.toFixed(1)}% |`,
    );
  }
}

if (reps > 0) simulate();

// ---------------------------------------------------------------------------------------------
// Measured on the full-size layout

/** Bytes of tensor `name` in the checkpoint at `dir` (through its index). */
async function tensorBytes(dir: string, name: string, rows?: { ids: number[]; width: number }) {
  const index = JSON.parse(await Deno.readTextFile(path.join(dir, "model.safetensors.index.json")));
  const file = path.join(dir, index.weight_map[name]);
  const header = await readSafetensorsHeader(file);
  const e = header.entries.find((x) => x.name === name)!;
  const f = await Deno.open(file);
  try {
    const readAt = async (at: number, out: Uint8Array) => {
      await f.seek(header.dataStart + e.begin + at, Deno.SeekMode.Start);
      for (let got = 0; got < out.length;) got += (await f.read(out.subarray(got))) ?? 0;
    };
    if (!rows) {
      const out = new Uint8Array(e.end - e.begin);
      await readAt(0, out);
      return out;
    }
    const out = new Uint8Array(rows.ids.length * rows.width);
    for (const [t, id] of rows.ids.entries()) {
      await readAt(id * rows.width, out.subarray(t * rows.width, (t + 1) * rows.width));
    }
    return out;
  } finally {
    f.close();
  }
}

/** The RMS-normalised embedding rows of `ids` (gain 1), [T][H] fp32. */
async function routerInputs(dir: string, ids: number[], H: number): Promise<Float32Array> {
  const raw = await tensorBytes(dir, "language_model.model.embed_tokens.weight", {
    ids,
    width: H * 2,
  });
  const bf = new Uint16Array(raw.buffer), x = new Float32Array(ids.length * H);
  for (let t = 0; t < ids.length; t++) {
    let ss = 0;
    for (let h = 0; h < H; h++) ss += bf16ToF32(bf[t * H + h]) ** 2;
    const inv = 1 / Math.sqrt(ss / H + 1e-5);
    for (let h = 0; h < H; h++) x[t * H + h] = bf16ToF32(bf[t * H + h]) * inv;
  }
  return x;
}

/** Distinct experts layer `layer` routes the T tokens of `x` to (top K of sigmoid + bias). */
async function measuredDistinct(dir: string, layer: number, x: Float32Array, H: number) {
  const p = `language_model.model.layers.${layer}.block_sparse_moe.gate.`;
  const w = await tensorBytes(dir, `${p}weight`);
  const bias = new Float32Array((await tensorBytes(dir, `${p}e_score_correction_bias`)).buffer);
  const T = x.length / H, logits = new Float32Array(T * E);
  const native = lib().k3_alloc(BigInt(w.length))!;
  try {
    new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(native, w.length)).set(w);
    lib().k3_matmul_bf16(logits, native, x, E, H, T);
  } finally {
    lib().k3_free(native);
  }
  return distinctExperts(logits, bias);
}

async function measure(dirs: string[]): Promise<void> {
  const tokenCounts = (flagValue("--tokens") ?? "12,256,2000").split(",").map(Number);
  const layers = (flagValue("--sample-layers") ?? "1,2,3,4").split(",").map(Number);
  const H = 7168;
  console.log(
    `\nmeasured on the full-size layout (router input = RMS-normalised embedding row), ` +
      `distinct experts per layer, layers ${layers.join(", ")} (mean, min-max):`,
  );
  console.log(`| tokens | ${dirs.map((d) => path.basename(d)).join(" | ")} |`);
  console.log(`|---|${dirs.map(() => "---|").join("")}`);
  for (const n of tokenCounts) {
    const cells: string[] = [];
    for (const dir of dirs) {
      const x = await routerInputs(dir, distinctIds(n), H);
      const counts: number[] = [];
      for (const layer of layers) counts.push(await measuredDistinct(dir, layer, x, H));
      const mean = counts.reduce((a, b) => a + b, 0) / counts.length;
      cells.push(`${mean.toFixed(1)} (${Math.min(...counts)}-${Math.max(...counts)})`);
    }
    console.log(`| ${n} | ${cells.join(" | ")} |`);
  }
}

function flagValue(name: string): string | undefined {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}

const measureDirs = flagValue("--measure");
if (measureDirs) await measure(measureDirs.split(","));
