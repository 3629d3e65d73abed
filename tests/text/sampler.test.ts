/**
 * Sampler (greedy, seeded sampling, top-k / top-p / min-p, penalties and logit bias) and
 * stop-string matching.
 */

import assert from "node:assert/strict";
import { K3Error } from "../../lib/errors.ts";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import {
  argmax,
  Sampler,
  type SamplingOptions,
  splitmix64,
  type TokenHistory,
  uniformAt,
} from "../../lib/text/sampler.ts";
import { tinyModel } from "../support/helpers.ts";
import { StopMatcher } from "../../lib/text/stops.ts";

/** Test-only generator for logits (its own PRNG, so tests do not lean on the one under test). */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
}

function randomLogits(rand: () => number, n: number): Float32Array {
  return Float32Array.from({ length: n }, () => (rand() - 0.5) * 20);
}

function counts(options: SamplingOptions, logits: Float32Array, draws: number): number[] {
  const sampler = new Sampler(options);
  const seen = new Array(logits.length).fill(0);
  for (let i = 0; i < draws; i++) seen[sampler.next(logits)]++;
  return seen;
}

const isBadInput = (e: unknown) => e instanceof K3Error && e.exitCode === 2;

Deno.test("splitmix64 matches the published sequence for seed 0", () => {
  // splitmix64(0): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4 (Vigna's reference implementation).
  const next = splitmix64(0);
  assert.equal(next(), Number(0xe220a8397b1dcdafn >> 11n) / 2 ** 53);
  assert.equal(next(), Number(0x6e789e6aa1b965f4n >> 11n) / 2 ** 53);
});

Deno.test("greedy: argmax with ties to the lowest id, for temperature 0 or absent", () => {
  const logits = new Float32Array([1, 5, -Infinity, 5, 2]);
  assert.equal(new Sampler().next(logits), 1);
  assert.equal(new Sampler({ temperature: 0, topK: 3, seed: 9 }).next(logits), 1);
  assert.equal(argmax(new Float32Array([-Infinity, -3, -3])), 1);
});

Deno.test("top-k = 1 is greedy, for any temperature and seed", () => {
  const rand = lcg(1);
  for (let trial = 0; trial < 50; trial++) {
    const logits = randomLogits(rand, 300);
    logits[Math.floor(rand() * 300)] = logits[Math.floor(rand() * 300)]; // plant a possible tie
    const expected = logits.indexOf(Math.max(...logits));
    const sampler = new Sampler({ temperature: 0.1 + rand() * 3, topK: 1, seed: trial });
    assert.equal(sampler.next(logits), expected);
  }
});

Deno.test("a seed gives the same tokens every run; another seed differs", () => {
  const logits = randomLogits(lcg(2), 1000);
  const run = (seed: number) => {
    const s = new Sampler({ temperature: 1, topP: 0.95, seed });
    return Array.from({ length: 200 }, () => s.next(logits));
  };
  assert.deepEqual(run(42), run(42));
  assert.notDeepEqual(run(42), run(43));
});

Deno.test("draws follow softmax(logits / T)", () => {
  const probs = [0.5, 0.3, 0.15, 0.05];
  const logits = Float32Array.from(probs, Math.log);
  const n = 40_000;
  const seen = counts({ temperature: 1, seed: 7 }, logits, n);
  probs.forEach((p, i) =>
    assert.ok(Math.abs(seen[i] / n - p) < 0.01, `id ${i}: ${seen[i] / n} vs ${p}`)
  );
  // T = 0.5 squares the odds: p_i^2 / sum p^2.
  const sq = probs.map((p) => p * p);
  const z = sq.reduce((a, b) => a + b);
  const cold = counts({ temperature: 0.5, seed: 8 }, logits, n);
  sq.forEach((q, i) => assert.ok(Math.abs(cold[i] / n - q / z) < 0.01, `id ${i} at T=0.5`));
});

Deno.test("top-k, top-p and min-p cut the tail", () => {
  const logits = Float32Array.from([0.05, 0.3, 0.5, 0.15], Math.log); // by probability: 2, 1, 3, 0
  const used = (o: SamplingOptions) =>
    counts({ temperature: 1, seed: 3, ...o }, logits, 4000).flatMap((c, id) => c > 0 ? [id] : []);
  assert.deepEqual(used({}), [0, 1, 2, 3]);
  assert.deepEqual(used({ topK: 2 }), [1, 2]);
  assert.deepEqual(used({ topP: 0.45 }), [2]);
  assert.deepEqual(used({ topP: 0.75 }), [1, 2]);
  assert.deepEqual(used({ topP: 0.85 }), [1, 2, 3]);
  assert.deepEqual(used({ minP: 0.5 }), [1, 2]); // threshold 0.25
  assert.deepEqual(used({ minP: 0.2, topK: 3 }), [1, 2, 3]);
  // top-p keeps the right proportions among the survivors: 0.5 : 0.3.
  const seen = counts({ temperature: 1, topP: 0.75, seed: 5 }, logits, 40_000);
  assert.ok(Math.abs(seen[2] / 40_000 - 0.625) < 0.012, `${seen[2] / 40_000}`);
});

Deno.test("options are validated; bad logits are a failed run", () => {
  for (
    const bad of [
      { temperature: -1 },
      { temperature: NaN },
      { topP: 0 },
      { topP: 1.5 },
      { topK: 1.5 },
      { topK: -1 },
      { minP: 2 },
      { seed: 0.5 },
      { presencePenalty: 3 },
      { frequencyPenalty: -2.5 },
      { repetitionPenalty: 0 },
      { repetitionPenalty: 101 },
      { logitBias: { 1: 101 } },
      { logitBias: { "-1": 5 } as Record<number, number> },
      { logitBias: { 1.5: 5 } },
    ]
  ) {
    assert.throws(() => new Sampler(bad), isBadInput, JSON.stringify(bad));
  }
  const sampler = new Sampler({ temperature: 1 });
  assert.throws(
    () => sampler.next(new Float32Array([0, NaN])),
    (e) => e instanceof K3Error && e.exitCode === 4,
  );
  assert.throws(
    () => new Sampler().next(new Float32Array([Infinity])),
    (e) => e instanceof K3Error && e.exitCode === 4,
  );
  assert.throws(() => new Sampler({ logitBias: { 7: 1 } }).next(new Float32Array(3)), isBadInput);
});

// ---- temperature, top-k, top-p, min-p against a plain reference ----

/**
 * The plain reference, straight from the definitions (docs/CLI.md "Sampling and stops"): rank
 * the ids by falling logit (ties: lower id first) with a comparator sort, keep the first k,
 * p = softmax(logit / T) over those, keep the shortest prefix whose mass reaches top_p and the
 * ids with p >= min_p * p_max, then invert the CDF of the survivors, renormalised, at u.
 * Returns the id and how close u * total came to a CDF step (for float-rounding slack).
 */
function referencePick(
  logits: Float32Array,
  o: { temperature: number; topK?: number; topP?: number; minP?: number },
  u: number,
): { id: number; margin: number; kept: number[] } {
  const ranked = [...logits.keys()].filter((id) => logits[id] !== -Infinity)
    .sort((a, b) => logits[b] - logits[a] || a - b);
  const top = o.topK ? ranked.slice(0, o.topK) : ranked;
  const weights = top.map((id) => Math.exp((logits[id] - logits[top[0]]) / o.temperature));
  const z = weights.reduce((a, b) => a + b, 0);
  const p = weights.map((w) => w / z);
  let keep = p.length, mass = 0;
  for (let i = 0; i < p.length; i++) {
    mass += p[i];
    if (mass >= (o.topP ?? 1) && (o.topP ?? 1) < 1) {
      keep = i + 1;
      break;
    }
  }
  const kept = top.slice(0, keep).filter((_, i) => p[i] >= (o.minP ?? 0) * p[0]);
  const q = p.slice(0, kept.length);
  const total = q.reduce((a, b) => a + b, 0);
  let cdf = 0, margin = Infinity;
  for (let i = 0; i < kept.length; i++) {
    cdf += q[i];
    margin = Math.min(margin, Math.abs(u * total - cdf));
    if (u * total < cdf) return { id: kept[i], margin, kept };
  }
  return { id: kept[kept.length - 1], margin, kept };
}

Deno.test("temperature, top-k, top-p and min-p draw exactly as defined (vs a plain reference)", () => {
  const rand = lcg(31);
  let cut = 0;
  for (let trial = 0; trial < 400; trial++) {
    const vocab = 2 + Math.floor(rand() * 200);
    const logits = randomLogits(rand, vocab);
    // Ties (rounded logits) and ruled-out ids, so the ranking rules are exercised.
    if (rand() < 0.5) logits.forEach((l, i) => (logits[i] = Math.round(l)));
    for (let k = Math.floor(rand() * 3); k > 0 && vocab > 2; k--) {
      logits[Math.floor(rand() * vocab)] = -Infinity;
    }
    if (logits.every((l) => l === -Infinity)) logits[0] = 0;
    const options = {
      temperature: [0.05, 0.7, 1, 1.9][Math.floor(rand() * 4)],
      topK: rand() < 0.5 ? Math.floor(rand() * 12) : undefined,
      topP: rand() < 0.5 ? 0.05 + rand() * 0.95 : undefined,
      minP: rand() < 0.5 ? rand() * 0.6 : undefined,
      seed: trial,
    };
    const sampler = new Sampler(options);
    for (let index = 0; index < 25; index++) {
      const u = uniformAt(trial, index);
      const want = referencePick(logits, options, u);
      const got = sampler.next(logits);
      assert.ok(want.kept.includes(got), `id ${got} is not kept: ${JSON.stringify(options)}`);
      if (want.margin > 1e-12) assert.equal(got, want.id, JSON.stringify({ options, index }));
      if (want.kept.length < logits.filter((l) => l !== -Infinity).length) cut++;
    }
  }
  assert.ok(cut > 2000, `the filters cut the tail in ${cut} of 10000 draws`);
});

// ---- penalties and logit bias ----

/**
 * The plain reference, straight from the definitions: repetition penalty (CTRL / Hugging Face)
 * on every id of the sequence, then OpenAI's mu[j] - c[j] * alpha_frequency -
 * float(c[j] > 0) * alpha_presence over the generated ids, then the bias. Float64 throughout.
 */
function referenceAdjust(
  logits: Float32Array,
  history: TokenHistory,
  o: SamplingOptions,
): Float64Array {
  const mu = Float64Array.from(logits);
  const r = o.repetitionPenalty ?? 1;
  for (const id of new Set(history.tokens)) mu[id] = mu[id] > 0 ? mu[id] / r : mu[id] * r;
  const c = new Array(logits.length).fill(0);
  for (const id of history.tokens.slice(history.promptLength)) c[id]++;
  for (let j = 0; j < mu.length; j++) {
    if (c[j] > 0) {
      mu[j] = mu[j] - c[j] * (o.frequencyPenalty ?? 0) - 1 * (o.presencePenalty ?? 0);
    }
  }
  for (const [id, bias] of Object.entries(o.logitBias ?? {})) mu[Number(id)] += bias;
  return mu;
}

function randomCase(rand: () => number, vocab: number) {
  const tokens = Array.from({ length: Math.floor(rand() * 30) }, () => Math.floor(rand() * vocab));
  const history = { tokens, promptLength: Math.floor(rand() * (tokens.length + 1)) };
  const some = (x: number) => (rand() < 0.7 ? x : undefined);
  const logitBias: Record<number, number> = {};
  for (let k = Math.floor(rand() * 4); k > 0; k--) {
    logitBias[Math.floor(rand() * vocab)] = Math.round((rand() - 0.5) * 200);
  }
  const options: SamplingOptions = {
    repetitionPenalty: some(0.5 + rand() * 2),
    presencePenalty: some((rand() - 0.5) * 4),
    frequencyPenalty: some((rand() - 0.5) * 4),
    logitBias,
  };
  return { history, options };
}

Deno.test("penalties and logit bias change the logits exactly as defined (vs a plain reference)", () => {
  const rand = lcg(21);
  for (let trial = 0; trial < 300; trial++) {
    const vocab = 5 + Math.floor(rand() * 60);
    const logits = randomLogits(rand, vocab);
    const { history, options } = randomCase(rand, vocab);
    const got = new Sampler(options).adjust(logits, history);
    const want = Float32Array.from(referenceAdjust(logits, history, options), Math.fround);
    assert.deepEqual([...got], [...want], JSON.stringify({ history, options }));
  }
  // By hand: r = 2 on ids 0 and 1 (seen), then id 1 generated twice: -2 * 2 - 2 * 0.25 - 0.5.
  const hand = new Sampler({
    repetitionPenalty: 2,
    frequencyPenalty: 0.25,
    presencePenalty: 0.5,
    logitBias: { 3: 10 },
  }).adjust(new Float32Array([2, -2, 1, 0.5]), { tokens: [0, 1, 1], promptLength: 1 });
  assert.deepEqual([...hand], [1, -5, 1, 10.5]);
  // Presence and frequency look at generated ids only; repetition at the prompt too.
  const promptOnly = { tokens: [0, 0, 2], promptLength: 3 };
  const l = new Float32Array([4, 4, 4]);
  assert.deepEqual([...new Sampler({ presencePenalty: 1 }).adjust(l, promptOnly)], [4, 4, 4]);
  assert.deepEqual([...new Sampler({ repetitionPenalty: 4 }).adjust(l, promptOnly)], [1, 4, 1]);
  // A ruled-out id stays ruled out whatever the bias.
  const out = new Sampler({ logitBias: { 0: 100 } }).adjust(new Float32Array([-Infinity, 0]), {
    tokens: [],
    promptLength: 0,
  });
  assert.equal(out[0], -Infinity);
});

Deno.test("with penalties, greedy and seeded draws are those of the adjusted logits", () => {
  const rand = lcg(22);
  for (let trial = 0; trial < 100; trial++) {
    const vocab = 20 + Math.floor(rand() * 100);
    const logits = randomLogits(rand, vocab);
    const { history, options } = randomCase(rand, vocab);
    const adjusted = Float32Array.from(referenceAdjust(logits, history, options), Math.fround);
    assert.equal(new Sampler(options).next(logits, history), argmax(adjusted), "greedy");
    // The draw is keyed by the position (the history's length), so each draw gets a seed.
    for (let i = 0; i < 20; i++) {
      const sampling = { temperature: 0.5 + rand(), topK: 10, topP: 0.9, seed: trial * 20 + i };
      const penalised = new Sampler({ ...options, ...sampling });
      const plain = new Sampler(sampling);
      assert.equal(penalised.next(logits, history), plain.next(adjusted, history), `draw ${i}`);
    }
  }
});

Deno.test("no penalty and no bias: the model's logits are used as they are", () => {
  const logits = randomLogits(lcg(23), 100);
  const history = { tokens: [1, 2, 3, 3], promptLength: 2 };
  for (const o of [{}, { repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0 }]) {
    const s = new Sampler(o);
    assert.equal(s.adjustsLogits, false);
    assert.equal(s.next(logits, history), argmax(logits));
  }
  assert.equal(new Sampler({ logitBias: {} }).adjustsLogits, false);
  assert.equal(new Sampler({ presencePenalty: 0.1 }).adjustsLogits, true);
});

Deno.test("the decode loop hands the picker the sequence so far", async () => {
  const model = await Model.open(await tinyModel({ seed: 5 }));
  try {
    const seen: { tokens: number[]; promptLength: number }[] = [];
    const spy = {
      next(logits: Float32Array, h: TokenHistory) {
        seen.push({ tokens: [...h.tokens], promptLength: h.promptLength });
        return argmax(logits);
      },
    };
    const prompt = [5, 6, 7];
    const ids: number[] = [];
    for await (const s of generate(model, prompt, { maxTokens: 4, picker: spy })) ids.push(s.token);
    assert.deepEqual(
      seen,
      ids.map((_, i) => ({ tokens: [...prompt, ...ids.slice(0, i)], promptLength: 3 })),
    );
    // A strong frequency penalty changes a greedy answer that repeats itself.
    const repeat = new Sampler({ logitBias: { 9: 30 } });
    const same: number[] = [];
    for await (const s of generate(model, prompt, { maxTokens: 3, picker: repeat })) {
      same.push(s.token);
    }
    assert.deepEqual(same, [9, 9, 9]);
    const penalised = new Sampler({
      logitBias: { 9: 30 },
      frequencyPenalty: 2,
      presencePenalty: 2,
    });
    const varied: number[] = [];
    for await (const s of generate(model, prompt, { maxTokens: 40, picker: penalised })) {
      varied.push(s.token);
    }
    assert.equal(varied[0], 9);
    assert.ok(varied.some((id) => id !== 9), "the penalty overcomes the bias once 9 repeats");
  } finally {
    model.close();
  }
});

// ---- stop strings ----

/** Push pieces; return everything emitted (plus the flush if no stop) and whether it stopped. */
function runStops(
  stops: string[],
  pieces: string[],
): { text: string; stopped: boolean; emits: string[] } {
  const m = new StopMatcher(stops);
  const emits: string[] = [];
  let stopped = false;
  for (const piece of pieces) {
    const r = m.push(piece);
    emits.push(r.emit);
    stopped ||= r.stopped;
  }
  if (!stopped) emits.push(m.flush());
  return { text: emits.join(""), stopped, emits };
}

/** Reference: scan end positions; cut at the first stop to complete (longest on ties). */
function referenceStop(stops: string[], text: string): { text: string; stopped: boolean } {
  for (let end = 1; end <= text.length; end++) {
    const done = stops.filter((s) => text.slice(0, end).endsWith(s)).sort((a, b) =>
      b.length - a.length
    );
    if (done.length > 0) return { text: text.slice(0, end - done[0].length), stopped: true };
  }
  return { text, stopped: false };
}

Deno.test("a stop string split across tokens is caught and never emitted", () => {
  const r = runStops(["</end>"], ["Hello </", "en", "d> more"]);
  assert.deepEqual(r, { text: "Hello ", stopped: true, emits: ["Hello ", "", ""] });
  // A partial match that fails is released at once.
  assert.deepEqual(runStops(["</end>"], ["a </", "ex", "it"]).emits, ["a ", "</ex", "it", ""]);
  // Without a stop, flush releases the held tail.
  assert.deepEqual(runStops(["STOP"], ["go ST"]), {
    text: "go ST",
    stopped: false,
    emits: ["go ", "ST"],
  });
  // After a stop nothing more comes out.
  const m = new StopMatcher(["x"]);
  assert.deepEqual(m.push("abxcd"), { emit: "ab", stopped: true, stop: "x" });
  assert.deepEqual(m.push("more"), { emit: "", stopped: true });
  assert.equal(m.flush(), "");
  assert.deepEqual(runStops([], ["a", "b"]).text, "ab");
  assert.throws(() => new StopMatcher(["ok", ""]), isBadInput);
});

Deno.test("stop matching does not depend on how the text is split (vs a reference)", () => {
  const rand = lcg(11);
  const alphabet = "abc😀 ";
  const pick = (n: number) =>
    Array.from({ length: n }, () => Array.from(alphabet)[Math.floor(rand() * 5)]).join("");
  for (let trial = 0; trial < 300; trial++) {
    const stops = Array.from(
      { length: 1 + Math.floor(rand() * 3) },
      () => pick(1 + Math.floor(rand() * 3)),
    );
    const chars = Array.from(pick(30));
    const pieces: string[] = [];
    for (let i = 0; i < chars.length;) {
      const n = Math.floor(rand() * 4);
      pieces.push(chars.slice(i, i + n).join(""));
      i += n;
    }
    const { text, stopped } = runStops(stops, pieces);
    assert.deepEqual(
      { text, stopped },
      referenceStop(stops, chars.join("")),
      JSON.stringify({ stops, pieces }),
    );
  }
});

Deno.test("the draw of position i is splitmix64's i-th output, in any call order", () => {
  const next = splitmix64(-42);
  for (let i = 0; i < 5; i++) assert.equal(uniformAt(-42, i), next());
  const logits = Float32Array.from({ length: 50 }, (_, i) => Math.sin(i) * 2);
  const options = { temperature: 1.5, topP: 0.95, seed: 99 };
  const inOrder = new Sampler(options);
  const tokens = Array.from({ length: 12 }, () => inOrder.next(logits));
  // Out of order and repeated: the position comes from the history (generated ids after a
  // 3-id prompt), whatever was drawn before.
  const keyed = new Sampler(options);
  for (const i of [7, 3, 11, 0, 3, 5, 1, 2, 4, 6, 8, 9, 10, 7]) {
    const history: TokenHistory = { tokens: new Array(3 + i).fill(1), promptLength: 3 };
    assert.equal(keyed.next(logits, history), tokens[i], `index ${i}`);
  }
  assert.ok(new Set(tokens).size > 1, "the draws differ between positions");
});
