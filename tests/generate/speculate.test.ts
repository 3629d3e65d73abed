/**
 * The pieces of speculative decoding that need no forward pass: the n-gram drafter, the
 * drafting policy's cost model, and the KDA replay that makes a rewind exact.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { k3 } from "../../ffi/library.ts";
import { readConfig } from "../../lib/checkpoint/config.ts";
import { PassRecord, shiftHistory } from "../../lib/model/rewind.ts";
import { SequenceState } from "../../lib/model/state.ts";
import { NgramDrafter, ScriptedDrafter } from "../../lib/speculate/drafter.ts";
import {
  AcceptanceStats,
  bestLength,
  CostPolicy,
  expectedTokens,
  FixedPolicy,
  PassCost,
} from "../../lib/speculate/policy.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";

Deno.test("n-gram drafter: the longest suffix's most recent earlier match, continued", () => {
  const d = new NgramDrafter({ maxNgram: 3 });
  // "5 6 7" occurred before, followed by 8 9; the suffix "6 7" also matches there.
  assert.deepEqual(d.propose([1, 5, 6, 7, 8, 9, 2, 5, 6, 7], 2), {
    tokens: [8, 9],
    kind: "ngram:3",
  });
  // Growing the context reuses the index: the suffix "6 7 8" was followed by 9 2 5.
  assert.deepEqual(d.propose([1, 5, 6, 7, 8, 9, 2, 5, 6, 7, 8], 3), {
    tokens: [9, 2, 5],
    kind: "ngram:3",
  });
  // The most recent occurrence wins: "4" was followed by 1 earlier and by 2 later.
  assert.deepEqual(new NgramDrafter().propose([4, 1, 4, 2, 4], 1).tokens, [2]);
  // No earlier match, no draft; a draft never proposes more than asked.
  assert.deepEqual(new NgramDrafter().propose([1, 2, 3], 4).tokens, []);
  assert.deepEqual(new NgramDrafter().propose([1, 2, 1], 0).tokens, []);
});

Deno.test("n-gram drafter: a periodic match repeats its period past the context's end", () => {
  const d = new NgramDrafter({ maxNgram: 2 });
  assert.deepEqual(d.propose([3, 1, 2, 1, 2], 5), { tokens: [1, 2, 1, 2, 1], kind: "ngram:2" });
  assert.deepEqual(new NgramDrafter().propose([7, 7, 7], 3).tokens, [7, 7, 7]);
});

Deno.test("n-gram drafter: a context that is not an extension rebuilds the index", () => {
  const d = new NgramDrafter();
  assert.deepEqual(d.propose([1, 2, 3, 1], 2).tokens, [2, 3]);
  assert.deepEqual(d.propose([9, 8, 9], 1).tokens, [8]);
  assert.deepEqual(d.propose([5, 5], 1).tokens, [5]);
});

Deno.test("scripted drafter: guesses capped at the asked length, labelled", () => {
  const d = new ScriptedDrafter((ctx) => [ctx.length, ctx.length + 1, ctx.length + 2], "x");
  assert.deepEqual(d.propose([1, 2], 2), { tokens: [2, 3], kind: "x" });
});

Deno.test("cost model: expected tokens and the best draft length", () => {
  assert.equal(expectedTokens(0.5, 0), 1);
  assert.equal(expectedTokens(0.5, 3), 1 + 0.5 + 0.25 + 0.125);
  assert.equal(expectedTokens(1, 4), 5);
  // Perfect drafts and cheap positions: draft the most allowed.
  assert.equal(bestLength(1, 0.1, 4), 4);
  // Drafts that never match: never draft, whatever the cost.
  assert.equal(bestLength(0, 0.01, 8), 0);
  // A position as dear as a token: drafting cannot pay.
  assert.equal(bestLength(0.9, 1, 8), 0);
  // Middling acceptance: a short draft pays, a long one does not.
  const k = bestLength(0.6, 0.2, 8);
  assert.ok(k >= 1 && k <= 3, `best length ${k}`);
});

Deno.test("pass cost: beta from timed decode steps and verify passes", () => {
  const c = new PassCost();
  assert.equal(c.beta, PassCost.PRIOR);
  c.timed(5, 0.2); // no decode step timed yet: nothing to compare with
  assert.equal(c.calibrated, false);
  c.timed(1, 0.1);
  c.timed(5, 0.14); // 4 extra positions cost 40 % of a step: beta 0.1
  assert.ok(Math.abs(c.beta - 0.1) < 1e-12, `${c.beta}`);
});

/** Runs `policy` for `steps` steps where a pass over T positions costs 1 + beta (T - 1). */
function simulate(
  beta: number,
  right: (k: number) => number,
  steps: number,
  kinds = 1,
): { tokensPerCost: number; drafted: number } {
  const policy = new CostPolicy();
  let cost = 0, tokens = 0, drafted = 0;
  for (let s = 0; s < steps; s++) {
    const kind = `ngram:${1 + (s % kinds)}`;
    const k = policy.length({ tokens: [1, 2, 3, 4], kind }, 4);
    const passCost = 1 + beta * k;
    policy.timed(1 + k, 0.01 * passCost);
    const m = k > 0 ? right(k) : 0;
    if (k > 0) policy.accepted(kind, k, m);
    drafted += k;
    cost += passCost;
    tokens += 1 + m;
  }
  return { tokensPerCost: tokens / cost, drafted };
}

Deno.test("cost policy: drafts that never match lose under 3 %, perfect ones approach 1 + k", () => {
  for (const beta of [0.01, 0.05, 0.15, 0.3, 1]) {
    for (const kinds of [1, 4]) {
      const never = simulate(beta, () => 0, 4000, kinds);
      assert.ok(never.tokensPerCost > 0.97, `beta ${beta}: ${never.tokensPerCost}`);
    }
    const perfect = simulate(beta, (k) => k, 2000);
    const ideal = 5 / (1 + 4 * beta);
    if (ideal > 1.1) {
      assert.ok(perfect.tokensPerCost > 0.95 * ideal, `beta ${beta}: ${perfect.tokensPerCost}`);
    }
  }
  // With no decode step timed, the policy takes a plain step first.
  assert.equal(new CostPolicy().length({ tokens: [1, 2], kind: "x" }, 2), 0);
});

Deno.test("acceptance stats: learned per kind, fading toward the prior when idle", () => {
  const s = new AcceptanceStats();
  assert.equal(s.rate("a"), AcceptanceStats.PRIOR);
  for (let i = 0; i < 20; i++) s.record("a", 4, 0);
  const low = s.rate("a");
  assert.ok(low < 0.1, `${low}`);
  assert.equal(s.rate("b"), AcceptanceStats.PRIOR, "kinds are separate");
  for (let i = 0; i < 500; i++) s.idle("a");
  assert.ok(s.rate("a") > low && s.rate("a") < AcceptanceStats.PRIOR);
});

Deno.test("fixed policy: every draft token up to its count and the limit", () => {
  const p = new FixedPolicy(3);
  assert.equal(p.length({ tokens: [1, 2, 3, 4], kind: "x" }, 8), 3);
  assert.equal(p.length({ tokens: [1, 2, 3, 4], kind: "x" }, 2), 2);
  assert.equal(p.length({ tokens: [1], kind: "x" }, 8), 1);
});

Deno.test("conv history shift equals what the conv kernel leaves behind", () => {
  const C = 5, K = 4;
  for (const n of [1, 2, 3, 4, 6]) {
    const hist = Float32Array.from({ length: (K - 1) * C }, (_, i) => i * 0.25 - 1);
    const x = Float32Array.from({ length: n * C }, (_, i) => Math.sin(i + 1));
    const w = Float32Array.from({ length: C * K }, (_, i) => Math.cos(i));
    const viaKernel = hist.slice();
    k3().k3_kda_conv(new Float32Array(n * C), viaKernel, x, w, C, K, n);
    const shifted = hist.slice();
    shiftHistory(shifted, x, C);
    assert.ok(sameBytes(shifted, viaKernel), `n = ${n}`);
  }
});

Deno.test("replaying kept positions gives the recurrence's state byte for byte", async () => {
  const c = await readConfig(path.join(await tinyModel({ seed: 11 }), "config.json"));
  const nh = c.kda.numHeads, d = c.kda.headDim, C = nh * d, K = c.kda.convKernel, T = 5;
  const layer = c.layerKinds.indexOf("kda");
  let seed = 1;
  const rnd = (n: number, scale = 1) =>
    Float32Array.from({ length: n }, () => scale * Math.sin(seed++ * 12.9898));
  const normalise = (a: Float32Array) => {
    for (let t = 0; t < a.length / d; t++) {
      const row = a.subarray(t * d, (t + 1) * d);
      const n = Math.hypot(...row);
      row.forEach((v, i) => (row[i] = v / n));
    }
    return a;
  };
  const start = new SequenceState(c, 0);
  const s0 = start.kda.get(layer)!;
  s0.S.set(rnd(s0.S.length, 0.3));
  s0.histQ.set(rnd(s0.histQ.length));
  s0.histK.set(rnd(s0.histK.length));
  s0.histV.set(rnd(s0.histV.length));
  const q = normalise(rnd(T * C)), k = normalise(rnd(T * C)), v = rnd(T * C);
  const alpha = rnd(T * C).map((x) => 0.5 + 0.4 * x), beta = rnd(T * nh).map((x) => 0.5 + x / 3);
  const rawQ = rnd(T * C), rawK = rnd(T * C), rawV = rnd(T * C);
  const convW = rnd(C * K);

  // Plain decoding of the first n positions, one at a time, straight on the state.
  const plain = (n: number) => {
    const s = start.snapshot().kda.get(layer)!;
    const o = new Float32Array(C), out = new Float32Array(C);
    for (let t = 0; t < n; t++) {
      const at = (a: Float32Array, w: number) => a.subarray(t * w, (t + 1) * w);
      k3().k3_kda_recurrence(
        o,
        s.S,
        at(q, C),
        at(k, C),
        at(v, C),
        at(alpha, C),
        at(beta, nh),
        nh,
        d,
        1,
      );
      k3().k3_kda_conv(out, s.histQ, at(rawQ, C), convW, C, K, 1);
      k3().k3_kda_conv(out, s.histK, at(rawK, C), convW, C, K, 1);
      k3().k3_kda_conv(out, s.histV, at(rawV, C), convW, C, K, 1);
    }
    return s;
  };

  for (const steps of [[1], [3], [5], [2, 4], [1, 2, 5]]) {
    const state = start.snapshot();
    const record = new PassRecord(c, T);
    record.begin(state, [10, 11, 12, 13, 14]);
    const r = record.layer(layer);
    Object.entries({ k, v, alpha, beta, rawQ, rawK, rawV }).forEach(([name, a]) =>
      (r as unknown as Record<string, Float32Array>)[name].set(a)
    );
    record.logits = Array.from({ length: T }, (_, i) => Float32Array.of(i));
    for (const n of steps) record.advance(state, n);
    const n = steps.at(-1)!;
    const want = plain(n), got = state.kda.get(layer)!;
    assert.ok(sameBytes(got.S, want.S), `S after ${steps}`);
    assert.ok(sameBytes(got.histQ, want.histQ), `q history after ${steps}`);
    assert.ok(sameBytes(got.histK, want.histK), `k history after ${steps}`);
    assert.ok(sameBytes(got.histV, want.histV), `v history after ${steps}`);
    assert.equal(state.position, n);
    assert.deepEqual(state.tokens, [10, 11, 12, 13, 14].slice(0, n));
    assert.equal(state.lastLogits![0], n - 1);
  }
});
