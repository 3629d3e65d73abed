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
 * Usage: deno run -A bench/routing.ts [--reps N]
 */
import { XorShift128 } from "../lib/synth/numerics.ts";
import { fillSkewedBias, SKEWED_STRENGTH } from "../lib/synth/routing.ts";
import { K3_EXPERTS, K3_TOP_K } from "../lib/synth/full.ts";

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
