/**
 * The pass budget that follows measured costs (lib/generate/pass_budget.ts): the fit, the
 * rule, and a Session using it: a lone prompt is one pass, a prompt next to a running stream
 * never takes a pass without that stream's step, tokens equal solo runs, and on a streamed
 * trunk the passes measure their reads.
 */
import assert from "node:assert/strict";
import { generate, type GenerateStep } from "../../lib/generate/decode.ts";
import {
  COST_WINDOW,
  fitCosts,
  PassBudget,
  type PassSample,
  passSample,
  promptRoom,
} from "../../lib/generate/pass_budget.ts";
import { Session } from "../../lib/generate/session.ts";
import type { Model } from "../../lib/model/model.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";
import { openUnder } from "../support/spec_helpers.ts";

const close = (a: number, b: number) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));

/** A pass of `tokens` tokens that computes fixed + per x tokens and reads `read` seconds. */
function sample(tokens: number, fixed: number, per: number, read = 0, stall = 0): PassSample {
  return { tokens, seconds: fixed + per * tokens + stall, readSeconds: read, stallSeconds: stall };
}

Deno.test("fitCosts: fixed and per-token compute from passes of different sizes, stalls left out", () => {
  assert.equal(fitCosts([]), undefined);
  const costs = fitCosts([
    sample(3, 0.01, 0.002, 0.5, 0.2),
    sample(67, 0.01, 0.002, 0.7, 0),
    sample(3, 0.01, 0.002, 0.6, 0.4),
    sample(35, 0.01, 0.002, 0.6, 0.1),
  ])!;
  assert.ok(close(costs.fixedSeconds, 0.01), `fixed ${costs.fixedSeconds}`);
  assert.ok(close(costs.tokenSeconds, 0.002), `per token ${costs.tokenSeconds}`);
  assert.ok(close(costs.readSeconds, 0.6), `read ${costs.readSeconds}`);
  // One size only: everything is charged per token (an overstatement: smaller prompt shares).
  const one = fitCosts([sample(4, 0.02, 0.005), sample(4, 0.02, 0.005)])!;
  assert.equal(one.fixedSeconds, 0);
  assert.ok(close(one.tokenSeconds, (0.02 + 0.02) / 4));
});

Deno.test("promptRoom: a lone prompt is one pass; fixed budget beside steps; by cost, what the pass pays for", () => {
  const base = { configured: 64, cap: 4096 };
  // Nobody waits on the pass: the whole pass, whether the budget is fixed or by cost.
  assert.equal(promptRoom({ ...base, byCost: false, stepTokens: 0 }), 4096);
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 0 }), 4096);
  const streamed = { readSeconds: 1, fixedSeconds: 0.05, tokenSeconds: 0.002 };
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 0, costs: streamed }), 4096);
  // Fixed (--pass-tokens): the budget less the steps, a quarter of it at least, measured or not.
  assert.equal(promptRoom({ ...base, byCost: false, stepTokens: 3 }), 61);
  assert.equal(promptRoom({ ...base, byCost: false, stepTokens: 60 }), 16);
  assert.equal(promptRoom({ ...base, byCost: false, stepTokens: 3, costs: streamed }), 61);
  // By cost, unmeasured: the configured budget.
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 3 }), 61);
  // A streamed trunk: 1 s of reading per pass, 2 ms a token. The steps' pass costs 1 s; the
  // prompt may add as much compute: 500 tokens (capped by one pass of the forward).
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 3, costs: streamed }), 500);
  assert.equal(
    promptRoom({ ...base, cap: 128, byCost: true, stepTokens: 3, costs: streamed }),
    125,
  );
  // Resident: nothing read; the steps' pass is 10 ms + 4 x 1 ms, which pays for 14 prompt
  // tokens, less than the fixed budget: the fixed budget (60), never slower than --pass-tokens.
  const resident = { readSeconds: 0, fixedSeconds: 0.01, tokenSeconds: 0.001 };
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 4, costs: resident }), 60);
  // A pass that pays for more than the fixed budget gets it: 100 ms fixed, 100 tokens.
  const heavy = { readSeconds: 0, fixedSeconds: 0.1, tokenSeconds: 0.001 };
  assert.equal(promptRoom({ ...base, byCost: true, stepTokens: 4, costs: heavy }), 104);
  // Never less than one token: the prompt always moves.
  const tiny = { readSeconds: 0, fixedSeconds: 0, tokenSeconds: 1 };
  assert.equal(promptRoom({ ...base, cap: 2, byCost: true, stepTokens: 8, costs: tiny }), 1);
});

Deno.test("PassBudget keeps the last passes; passSample takes counter differences", () => {
  const b = new PassBudget(64, true);
  assert.equal(b.costs, undefined);
  for (let i = 0; i < COST_WINDOW + 8; i++) b.observe(sample(i < 8 ? 1000 : 10, 0, 1));
  // The 1000-token passes fell out of the window: only 10-token passes remain.
  assert.ok(close(b.costs!.tokenSeconds, 1));
  assert.equal(b.room(0, 512), 512);
  // Two steps' pass computes 2 s (1 s a token, nothing read): it pays for 2 prompt tokens,
  // less than the fixed budget, so the fixed budget (64 - 2).
  assert.equal(b.room(2, 512), 62);
  const s = passSample(
    5,
    2,
    { readSeconds: 10, stallSeconds: 4 },
    { readSeconds: 11.5, stallSeconds: 4.25 },
  );
  assert.deepEqual(s, { tokens: 5, seconds: 2, readSeconds: 1.5, stallSeconds: 0.25 });
  assert.deepEqual(passSample(5, 2), { tokens: 5, seconds: 2, readSeconds: 0, stallSeconds: 0 });
});

async function tokensOf(steps: AsyncIterable<GenerateStep>, each?: (i: number) => void) {
  const tokens: number[] = [], logits: Float32Array[] = [];
  for await (const s of steps) {
    tokens.push(s.token);
    logits.push(s.logits);
    each?.(s.index);
  }
  return { tokens, logits };
}

const promptOf = (n: number, salt: number) =>
  Array.from({ length: n }, (_, i) => (i * 37 + salt * 101 + 7) % 1000);

/** Every forward call's sequences: [ids per sequence]. */
function watchPasses(model: Model): number[][] {
  const passes: number[][] = [];
  const forward = model.forward, run = forward.forwardMany.bind(forward);
  forward.forwardMany = (seqs, options) => {
    passes.push(seqs.map((q) => q.ids.length));
    return run(seqs, options);
  };
  return passes;
}

Deno.test("a Session by cost: a lone prompt is one pass; a stream gets its step in every pass", async () => {
  const model = await openUnder(await tinyModel(), undefined);
  try {
    const solo = async (p: number[], n: number) =>
      await tokensOf(generate(model, p, { maxTokens: n, stopIds: [] }));
    const long = promptOf(300, 2), short = promptOf(6, 1);
    const wantLong = await solo(long, 4), wantShort = await solo(short, 40);
    const passes = watchPasses(model);
    // retain 0: the second run of the long prompt prefills it again.
    const session = new Session(model, { retain: 0 });
    assert.equal(session.status().pass_budget, "cost");

    // Alone: the 300-token prompt is one pass, then one pass per token.
    const alone = await tokensOf(session.generate(long, { maxTokens: 4, stopIds: [] }));
    assert.deepEqual(alone.tokens, wantLong.tokens);
    assert.deepEqual(passes.slice(0, 1), [[300]]);
    assert.equal(passes.length, 4);

    // A stream decoding; the long prompt arrives after its third token.
    passes.length = 0;
    let late: Promise<{ tokens: number[]; logits: Float32Array[] }> | undefined;
    const first = tokensOf(
      session.generate(short, { maxTokens: 40, stopIds: [] }),
      (i) => {
        if (i === 2) late = tokensOf(session.generate(long, { maxTokens: 4, stopIds: [] }));
      },
    );
    const a = await first, b = await late!;
    assert.deepEqual(a.tokens, wantShort.tokens);
    assert.deepEqual(b.tokens, wantLong.tokens);
    a.logits.forEach((l, i) => assert.ok(sameBytes(l, wantShort.logits[i]), `stream ${i}`));
    // While the stream runs, every pass that carries prompt tokens carries its step too; once
    // it has ended, what is left of the prompt is one pass (nobody waits on it).
    const rest = passes.slice(1);
    const lone = rest.findIndex((p) => p.length === 1 && p[0] > 1);
    const during = (lone < 0 ? rest : rest.slice(0, lone)).filter((p) => p.some((n) => n > 1));
    assert.ok(during.length >= 1, JSON.stringify(rest));
    assert.ok(during.every((p) => p.length === 2 && p.includes(1)), JSON.stringify(during));
    // After a lone prompt pass only the long request's own decode steps run: the stream was done.
    if (lone >= 0) assert.deepEqual(rest.slice(lone + 1), [[1], [1], [1]], JSON.stringify(rest));
    // Every prompt token ran once: 300 alone, then 6 and 300.
    assert.equal(session.batcher.stats.prefillTokens, 300 + 6 + 300);
    assert.ok(session.batcher.budget.costs!.tokenSeconds > 0);
  } finally {
    model.close();
  }
});

Deno.test("a Session with a fixed budget: a lone prompt is one pass; beside a stream, at most the budget", async () => {
  const model = await openUnder(await tinyModel(), undefined);
  try {
    const long = promptOf(300, 2), short = promptOf(6, 1);
    const wantLong = await tokensOf(generate(model, long, { maxTokens: 4, stopIds: [] }));
    const passes = watchPasses(model);
    const session = new Session(model, { passTokens: 16, retain: 0 });
    assert.equal(session.status().pass_budget, "fixed");
    const alone = await tokensOf(session.generate(long, { maxTokens: 4, stopIds: [] }));
    assert.deepEqual(alone.tokens, wantLong.tokens);
    assert.deepEqual(passes.slice(0, 1), [[300]], "alone, the whole prompt in one pass");

    passes.length = 0;
    let late: Promise<{ tokens: number[]; logits: Float32Array[] }> | undefined;
    await tokensOf(session.generate(short, { maxTokens: 30, stopIds: [] }), (i) => {
      if (i === 2) late = tokensOf(session.generate(long, { maxTokens: 4, stopIds: [] }));
    });
    const b = await late!;
    assert.deepEqual(b.tokens, wantLong.tokens);
    b.logits.forEach((l, i) => assert.ok(sameBytes(l, wantLong.logits[i]), `long ${i}`));
    // Beside the stream's step, 15 prompt tokens a pass (the budget of 16 less the step).
    const shared = passes.filter((p) => p.length === 2 && p.some((n) => n > 1));
    assert.ok(shared.length >= 3, JSON.stringify(passes));
    assert.ok(shared.every((p) => p.includes(1) && Math.max(...p) <= 15), JSON.stringify(shared));
    assert.ok(shared.filter((p) => p.includes(15)).length >= 3, JSON.stringify(shared));
  } finally {
    model.close();
  }
});

Deno.test("a Session by cost on a streamed trunk measures what its passes read", async () => {
  const model = await openUnder(await tinyModel(), { pinLayers: 0, ringSlots: 1, cacheSlots: 1 });
  try {
    const session = new Session(model);
    await tokensOf(session.generate(promptOf(20, 3), { maxTokens: 3, stopIds: [] }));
    assert.ok(session.batcher.budget.costs!.readSeconds > 0);
  } finally {
    model.close();
  }
});
