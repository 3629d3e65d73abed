/**
 * Continuous batching in the Session (lib/generate/session.ts, lib/generate/batch.ts): generations that share
 * forward passes give, step for step, the tokens and logits each gives alone, whatever joins
 * or leaves, however a prompt is cut across passes, greedy or seeded, with speculation or
 * without; cancelled ones leave at the next pass; a full batch makes requests wait; n
 * choices prefill once. The solo reference is the plain decode loop on the model itself.
 */
import assert from "node:assert/strict";
import { generate, type GenerateStep, type TokenPicker } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { type RequestOptions, Session } from "../../lib/generate/session.ts";
import { Sampler, type SamplingOptions } from "../../lib/text/sampler.ts";
import { type BatchRequest, openModel } from "../../mod.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";

interface Run {
  tokens: number[];
  logits: Float32Array[];
}

async function collect(steps: AsyncIterable<GenerateStep>, each?: (i: number) => void) {
  const run: Run = { tokens: [], logits: [] };
  for await (const s of steps) {
    run.tokens.push(s.token);
    run.logits.push(s.logits);
    each?.(s.index);
  }
  return run;
}

function assertSame(got: Run, want: Run, what: string): void {
  assert.deepEqual(got.tokens, want.tokens, `${what}: tokens`);
  got.logits.forEach((l, i) => assert.ok(sameBytes(l, want.logits[i]), `${what}: logits ${i}`));
}

/** A prompt of `n` ids below the tiny vocabulary, different per `salt`. */
function promptOf(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (i * 37 + salt * 101 + 7) % 1000);
}

interface Case {
  prompt: number[];
  maxTokens: number;
  sampling?: SamplingOptions;
}

function pickerOf(c: Case): TokenPicker | undefined {
  return c.sampling ? new Sampler(c.sampling) : undefined;
}

async function solo(model: Model, c: Case): Promise<Run> {
  return await collect(
    generate(model, c.prompt, { maxTokens: c.maxTokens, stopIds: [], picker: pickerOf(c) }),
  );
}

/** The solo runs, one after another (a model runs one forward call at a time). */
async function soloAll(model: Model, cases: Case[]): Promise<Run[]> {
  const out: Run[] = [];
  for (const c of cases) out.push(await solo(model, c));
  return out;
}

function request(c: Case, extra: Partial<RequestOptions> = {}): RequestOptions {
  return { maxTokens: c.maxTokens, stopIds: [], picker: pickerOf(c), ...extra };
}

const SEEDED: SamplingOptions = {
  temperature: 1,
  topP: 0.9,
  seed: 3,
  repetitionPenalty: 1.3,
  presencePenalty: 0.4,
};

async function withModel(fn: (model: Model) => Promise<void>): Promise<void> {
  const model = await Model.open(await tinyModel({ seed: 11 }));
  try {
    await fn(model);
  } finally {
    model.close();
  }
}

Deno.test("1, 2, 4 and 8 sequences in one batch each equal their solo run (greedy and seeded)", async () => {
  await withModel(async (model) => {
    for (const n of [1, 2, 4, 8]) {
      for (const seeded of [false, true]) {
        const cases: Case[] = Array.from({ length: n }, (_, i) => ({
          prompt: promptOf(3 + 11 * i, i + n),
          maxTokens: 6 + (i % 3) * 4,
          sampling: seeded ? { ...SEEDED, seed: 100 + i } : undefined,
        }));
        const want = await soloAll(model, cases);
        // Room for every prompt in the first pass, so all n then decode together.
        const session = new Session(model, { maxBatch: n, passTokens: 512 });
        const got = await Promise.all(
          cases.map((c) => collect(session.generate(c.prompt, request(c)))),
        );
        got.forEach((g, i) => assertSame(g, want[i], `n ${n} seeded ${seeded} request ${i}`));
        // The check is only worth something if the steps really shared passes.
        assert.equal(session.batcher.stats.maxSequences, n, `n ${n}: sequences in one pass`);
        assert.ok(session.batcher.stats.prefillTokens > 0);
      }
    }
  });
});

Deno.test("sequences joining and leaving mid-stream, prompts cut across passes, equal solo", async () => {
  await withModel(async (model) => {
    // Prompts longer than the pass budget, so they prefill over several passes while the
    // earlier ones decode; each starts after the previous one's third token.
    const cases: Case[] = [
      { prompt: promptOf(5, 1), maxTokens: 24 },
      { prompt: promptOf(40, 2), maxTokens: 5, sampling: { ...SEEDED, seed: 9 } },
      { prompt: promptOf(23, 3), maxTokens: 12 },
      { prompt: promptOf(61, 4), maxTokens: 3, sampling: { ...SEEDED, seed: 10 } },
      { prompt: promptOf(2, 5), maxTokens: 9 },
    ];
    const want = await soloAll(model, cases);
    const session = new Session(model, { passTokens: 8 });
    const runs: Promise<Run>[] = [];
    const launch = (k: number) => {
      if (k >= cases.length) return;
      runs[k] = collect(
        session.generate(cases[k].prompt, request(cases[k])),
        (i) => i === 2 && launch(k + 1),
      );
    };
    launch(0);
    // Every run's promise exists once the chain reached it; wait for all of them.
    for (let k = 0; k < cases.length; k++) {
      while (!runs[k]) await new Promise((r) => setTimeout(r, 1));
      assertSame(await runs[k], want[k], `request ${k}`);
    }
    const s = session.batcher.stats;
    assert.ok(s.maxSequences >= 3, `at most ${s.maxSequences} sequences shared a pass`);
    assert.ok(s.passes > 0 && s.prefillTokens === cases.reduce((a, c) => a + c.prompt.length, 0));
  });
});

Deno.test("speculation and batching compose: verify passes share passes with decode steps", async () => {
  await withModel(async (model) => {
    // Prompts holding a good share of the tiny vocabulary: the tokens the model emits mostly
    // occurred before, so the n-gram drafter has drafts to verify.
    const cases: Case[] = [
      { prompt: promptOf(300, 1), maxTokens: 16 },
      { prompt: promptOf(9, 7), maxTokens: 16, sampling: { ...SEEDED, seed: 4 } },
      { prompt: promptOf(200, 2), maxTokens: 12, sampling: { ...SEEDED, seed: 5 } },
    ];
    const want = await soloAll(model, cases);
    // Watch the passes: a verify pass should share one with the other sequences' steps.
    let mixed = 0;
    const forward = model.forward, run = forward.forwardMany.bind(forward);
    forward.forwardMany = (seqs, options) => {
      if (seqs.length > 1 && seqs.some((q) => q.record)) mixed++;
      return run(seqs, options);
    };
    const session = new Session(model, { passTokens: 256 });
    const always = { method: "ngram" as const, draftMax: 3, policy: "always" as const };
    const got = await Promise.all(
      cases.map((c, i) =>
        collect(session.generate(c.prompt, request(c, { speculation: i === 1 ? null : always })))
      ),
    );
    got.forEach((g, i) => assertSame(g, want[i], `request ${i}`));
    const s = session.batcher.stats;
    assert.ok(s.verifyTokens > 0, "verify passes ran");
    assert.ok(s.verifyTokens > s.passes / 4, `verify tokens ${s.verifyTokens}, passes ${s.passes}`);
    assert.ok(mixed > 0, "a verify pass shared a pass with other sequences");
  });
});

Deno.test("a cancelled sequence leaves at the next pass; the others are unaffected", async () => {
  await withModel(async (model) => {
    const cases: Case[] = [
      { prompt: promptOf(6, 1), maxTokens: 20 },
      { prompt: promptOf(8, 2), maxTokens: 200 },
      { prompt: promptOf(4, 3), maxTokens: 20, sampling: SEEDED },
    ];
    const want = [await solo(model, cases[0]), undefined, await solo(model, cases[2])];
    const session = new Session(model);
    const gone = new AbortController();
    let passesAtAbort = 0, passesAtEnd = 0;
    const runs = cases.map((c, i) => {
      const extra = i === 1 ? { signal: gone.signal } : {};
      return collect(session.generate(c.prompt, request(c, extra)), (step) => {
        if (i === 1 && step === 4) {
          gone.abort();
          passesAtAbort = session.batcher.stats.passes;
        }
      }).then((r) => {
        if (i === 1) passesAtEnd = session.batcher.stats.passes;
        return r;
      });
    });
    const [a, cancelled, c] = await Promise.all(runs);
    assertSame(a, want[0]!, "request 0");
    assertSame(c, want[2]!, "request 2");
    assert.equal(cancelled.tokens.length, 5, "no step after the abort");
    assert.ok(passesAtEnd - passesAtAbort <= 1, `left after ${passesAtEnd - passesAtAbort} passes`);
    assert.equal(session.batchSize, 0);
  });
});

Deno.test("a prompt cancelled mid-prefill leaves at the next pass; a full batch makes requests wait", async () => {
  await withModel(async (model) => {
    const session = new Session(model, { maxBatch: 2, passTokens: 8, passCap: 8, retain: 0 });
    // A long prompt that takes many passes, cancelled after two of them.
    const gone = new AbortController();
    const long = collect(session.generate(promptOf(400, 1), { maxTokens: 4, signal: gone.signal }));
    while (session.batcher.stats.passes < 2) await new Promise((r) => setTimeout(r, 1));
    gone.abort();
    const at = session.batcher.stats.passes;
    assert.deepEqual((await long).tokens, [], "no token after a cancelled prefill");
    assert.ok(session.batcher.stats.passes - at <= 1);
    assert.ok(session.batcher.stats.prefillTokens < 400, "the prefill stopped");

    // Two running, a third waits (and a fourth leaves the queue when cancelled); tokens are
    // still each one's solo tokens.
    const cases: Case[] = [0, 1, 2].map((i) => ({ prompt: promptOf(5 + i, i), maxTokens: 6 }));
    const want = await soloAll(model, cases);
    const quit = new AbortController();
    const runs = cases.map((c) => collect(session.generate(c.prompt, request(c))));
    const waiting = collect(
      session.generate(promptOf(9, 9), { maxTokens: 3, signal: quit.signal }),
    );
    const status = session.status();
    assert.equal(status.sequences, 2);
    assert.equal(status.queue.length, 2, "two wait for a free sequence");
    quit.abort();
    await new Promise((r) => setTimeout(r, 0));
    assert.equal(session.status().queue.length, 1, "the cancelled one left the queue");
    (await Promise.all(runs)).forEach((g, i) => assertSame(g, want[i], `request ${i}`));
    assert.deepEqual((await waiting).tokens, []);
    assert.equal(session.batcher.stats.maxSequences, 2);
  });
});

Deno.test("n choices prefill once and equal solo runs with seeds s, s+1, s+2", async () => {
  await withModel(async (model) => {
    const prompt = promptOf(30, 4);
    const cases: Case[] = [0, 1, 2].map((i) => ({
      prompt,
      maxTokens: 8,
      sampling: { ...SEEDED, seed: 50 + i },
    }));
    const want = await soloAll(model, cases);
    const session = new Session(model, { passTokens: 8 });
    const reused: number[] = [];
    const steps = session.choices(
      prompt,
      cases.map((c) => request(c)),
      (r) => reused.push(r.reusedTokens),
    );
    const got = await Promise.all(steps.map((s) => collect(s)));
    got.forEach((g, i) => assertSame(g, want[i], `choice ${i}`));
    assert.equal(session.batcher.stats.prefillTokens, prompt.length, "the prompt ran once");
    assert.deepEqual(reused, [0]);
    assert.equal(session.batchSize, 0, "every choice freed its sequence");
    // Again: the prompt's state was retained with its logits, so nothing is prefilled.
    const again = await Promise.all(
      session.choices(prompt, cases.map((c) => request(c))).map((s) => collect(s)),
    );
    again.forEach((g, i) => assertSame(g, want[i], `choice ${i}, retained`));
    assert.equal(session.batcher.stats.prefillTokens, prompt.length);
  });
});

Deno.test("mod.ts: generateBatch runs several prompts at once, each as generate alone", async () => {
  const dir = await tinyModel({ seed: 11 });
  const model = await openModel(dir, { maxBatch: 3, context: 512 });
  try {
    const requests: BatchRequest[] = [
      { ids: promptOf(7, 1), options: { maxTokens: 9 } },
      { ids: promptOf(30, 2), options: { maxTokens: 5, sampling: { ...SEEDED, seed: 8 } } },
      { ids: promptOf(3, 3), options: { maxTokens: 12 } },
      { ids: promptOf(11, 4), options: { maxTokens: 4, sampling: { ...SEEDED, seed: 9 } } },
    ];
    const alone: Run[] = [];
    for (const r of requests) alone.push(await collect(model.generate(r.ids, r.options)));
    const got: Run[] = requests.map(() => ({ tokens: [], logits: [] }));
    for await (const step of model.generateBatch(requests)) {
      got[step.request].tokens.push(step.token);
      got[step.request].logits.push(step.logits);
    }
    got.forEach((g, i) => assertSame(g, alone[i], `request ${i}`));
    assert.match(model.plan.text, /KDA state .*3 sequences/);
    const session = (model as unknown as { session: Session }).session;
    assert.equal(session.batcher.stats.maxSequences, 3, "three at once (the fourth waited)");
    // Leaving the loop early cancels the others.
    let n = 0;
    for await (const _ of model.generateBatch(requests)) if (++n === 3) break;
    const again = await collect(model.generate(requests[0].ids, requests[0].options));
    assertSame(again, alone[0], "after an early break");
  } finally {
    model.close();
  }
});
