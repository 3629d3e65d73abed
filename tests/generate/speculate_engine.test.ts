/**
 * Speculative decoding is exact: with drafts that are always right, always wrong or mixed,
 * greedy and seeded sampling give plain decoding's tokens and logits byte for byte, the
 * state after every step (every partial accept) equals plain decoding's, and stops, max
 * tokens and cancellation land on the same token. On the reference-test configs and under
 * several memory budgets.
 */
import assert from "node:assert/strict";
import { generate, type GenerateOptions, type GenerateStep } from "../../lib/generate/decode.ts";
import type { Model } from "../../lib/model/model.ts";
import type { SequenceState } from "../../lib/model/state.ts";
import { NgramDrafter, ScriptedDrafter } from "../../lib/speculate/drafter.ts";
import { CostPolicy, FixedPolicy } from "../../lib/speculate/policy.ts";
import { Sampler, type SamplingOptions } from "../../lib/text/sampler.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";
import { BUDGETS, CONFIGS, openUnder, sameState } from "../support/spec_helpers.ts";

interface Run {
  tokens: number[];
  logits: Float32Array[];
  states: SequenceState[];
  steps: GenerateStep[];
}

async function collect(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
  onStep?: (s: GenerateStep) => void,
): Promise<Run> {
  const run: Run = { tokens: [], logits: [], states: [], steps: [] };
  for await (const s of generate(model, prompt, options)) {
    run.tokens.push(s.token);
    run.logits.push(s.logits);
    run.states.push(s.state!.snapshot());
    run.steps.push(s);
    onStep?.(s);
  }
  return run;
}

/** Drafts from a known continuation: right, wrong everywhere, or wrong at every third. */
function draftersFor(prompt: number[], truth: number[], vocab: number) {
  const next = (ctx: readonly number[], max: number) =>
    truth.slice(ctx.length - prompt.length, ctx.length - prompt.length + max);
  const wrong = (t: number) => (t + 1) % vocab;
  return {
    right: () => new ScriptedDrafter(next),
    wrong: () => new ScriptedDrafter((ctx, max) => next(ctx, max).map(wrong)),
    mixed: () =>
      new ScriptedDrafter((ctx, max) =>
        next(ctx, max).map((t, i) => ((ctx.length + i) % 3 === 2 ? wrong(t) : t))
      ),
  };
}

/** Asserts a speculative run equals the plain one: tokens, logits, state after each step. */
function assertSame(spec: Run, plain: Run, what: string): void {
  assert.deepEqual(spec.tokens, plain.tokens, `${what}: tokens`);
  spec.logits.forEach((l, i) => assert.ok(sameBytes(l, plain.logits[i]), `${what}: logits ${i}`));
  spec.states.forEach((s, i) => sameState(s, plain.states[i], `${what}: state after step ${i}`));
}

/** Verify passes of a run (the first token of each), and the tokens they accepted. */
function passes(run: Run) {
  const p = run.steps.filter((s) => s.drafted !== undefined);
  return { count: p.length, accepted: p.reduce((a, s) => a + s.accepted!, 0) };
}

const STEPS = 14;

for (const cfg of CONFIGS) {
  Deno.test(`speculative greedy equals plain, every budget and draft kind: ${cfg.name}`, async () => {
    const dir = await tinyModel(cfg.options);
    for (const budget of BUDGETS) {
      const model = await openUnder(dir, budget.request);
      try {
        const plain = await collect(model, cfg.prompt, { maxTokens: STEPS, stopIds: [] });
        const drafters = draftersFor(cfg.prompt, plain.tokens, model.config.vocabSize);
        for (const [kind, make] of Object.entries(drafters)) {
          for (const k of [1, 4]) {
            const spec = await collect(model, cfg.prompt, {
              maxTokens: STEPS,
              stopIds: [],
              speculate: { drafter: make(), draftMax: k, policy: new FixedPolicy(k) },
            });
            const what = `${budget.name}, ${kind} drafts, k ${k}`;
            assertSame(spec, plain, what);
            const p = passes(spec);
            assert.ok(p.count > 0, `${what}: no verify pass ran`);
            if (kind === "right") {
              assert.ok(p.accepted >= p.count, `${what}: accepted ${p.accepted}`);
            }
            if (kind === "wrong") assert.equal(p.accepted, 0, `${what}`);
            if (kind === "mixed" && k === 4) {
              assert.ok(p.accepted > 0 && p.accepted < p.count * k, `${what}: ${p.accepted}`);
            }
          }
        }
      } finally {
        model.close();
      }
    }
  });
}

const SAMPLINGS: SamplingOptions[] = [
  { temperature: 1.3, topP: 0.95, seed: 12345 },
  // Penalties look back at the history: each verified position must see plain decoding's.
  {
    temperature: 0.9,
    topK: 40,
    seed: -7,
    presencePenalty: 0.5,
    frequencyPenalty: 0.7,
    repetitionPenalty: 1.3,
    logitBias: { 3: 2 },
  },
];

Deno.test("seeded sampling gives the same tokens with and without speculation", async () => {
  for (
    const [cfg, sampling] of [[CONFIGS[0], SAMPLINGS[0]], [CONFIGS[1], SAMPLINGS[1]], [
      CONFIGS[0],
      SAMPLINGS[1],
    ]] as const
  ) {
    const model = await openUnder(await tinyModel(cfg.options));
    try {
      const plain = await collect(model, cfg.prompt, {
        maxTokens: STEPS,
        stopIds: [],
        picker: new Sampler(sampling),
      });
      assert.ok(new Set(plain.tokens).size > 3, "sampling should vary");
      const drafters = draftersFor(cfg.prompt, plain.tokens, model.config.vocabSize);
      for (const [kind, make] of Object.entries(drafters)) {
        const spec = await collect(model, cfg.prompt, {
          maxTokens: STEPS,
          stopIds: [],
          picker: new Sampler(sampling),
          speculate: { drafter: make(), draftMax: 3, policy: new FixedPolicy(3) },
        });
        assertSame(spec, plain, `${cfg.name}, sampled, ${kind} drafts`);
      }
      // A different seed gives different tokens: the test can tell seeds apart.
      const other = await collect(model, cfg.prompt, {
        maxTokens: STEPS,
        stopIds: [],
        picker: new Sampler({ ...sampling, seed: 1 }),
      });
      assert.notDeepEqual(other.tokens, plain.tokens);
    } finally {
      model.close();
    }
  }
});

Deno.test("stops, max tokens and cancellation land on the same token", async () => {
  const cfg = CONFIGS[1];
  const model = await openUnder(await tinyModel(cfg.options), BUDGETS[1].request);
  try {
    const free = await collect(model, cfg.prompt, { maxTokens: STEPS, stopIds: [] });
    const drafters = draftersFor(cfg.prompt, free.tokens, model.config.vocabSize);
    const speculate = (make: () => ScriptedDrafter) => ({
      drafter: make(),
      draftMax: 4,
      policy: new FixedPolicy(4),
    });
    for (const [kind, make] of Object.entries(drafters)) {
      // A stop id in the middle of the output: drafts run past it, the stop still ends it.
      for (const at of [1, 6, 9]) {
        const stopIds = [free.tokens[at]];
        const plain = await collect(model, cfg.prompt, { maxTokens: STEPS, stopIds });
        const spec = await collect(model, cfg.prompt, {
          maxTokens: STEPS,
          stopIds,
          speculate: speculate(make),
        });
        assertSame(spec, plain, `${kind} drafts, stop at ${at}`);
        assert.ok(spec.steps.at(-1)!.stop);
      }
      // Max tokens anywhere inside a verify pass.
      for (let max = 1; max <= 9; max++) {
        const plain = await collect(model, cfg.prompt, { maxTokens: max, stopIds: [] });
        const spec = await collect(model, cfg.prompt, {
          maxTokens: max,
          stopIds: [],
          speculate: speculate(make),
        });
        assertSame(spec, plain, `${kind} drafts, max ${max}`);
        assert.equal(spec.tokens.length, max);
      }
      // Cancellation after the consumer saw token `at`, and a consumer that stops reading.
      for (const at of [0, 2, 5]) {
        const run = async (spec: boolean) => {
          const abort = new AbortController();
          const options: GenerateOptions = {
            maxTokens: STEPS,
            stopIds: [],
            signal: abort.signal,
            ...(spec ? { speculate: speculate(make) } : {}),
          };
          return await collect(model, cfg.prompt, options, (s) => {
            if (s.index === at) abort.abort();
          });
        };
        const plain = await run(false), spec = await run(true);
        assertSame(spec, plain, `${kind} drafts, cancelled at ${at}`);
        assert.equal(spec.tokens.length, at + 1);

        const state = model.newState(64);
        for await (
          const s of generate(model, cfg.prompt, {
            maxTokens: STEPS,
            stopIds: [],
            state,
            speculate: speculate(make),
          })
        ) if (s.index === at) break;
        sameState(state, plain.states[at], `${kind} drafts, consumer stopped at ${at}`);
      }
    }
  } finally {
    model.close();
  }
});

Deno.test("n-gram drafts under the cost model: the same tokens, and drafts that pay", async () => {
  const cfg = CONFIGS[0];
  const model = await openUnder(await tinyModel(cfg.options));
  try {
    // A repetitive prompt: the n-gram drafter finds matches from the first step.
    const prompt = [5, 17, 300, 42, 5, 17, 300, 42, 5, 17, 300, 42, 5, 17];
    const plain = await collect(model, prompt, { maxTokens: 24, stopIds: [] });
    for (const policy of [new FixedPolicy(4), new CostPolicy()]) {
      const spec = await collect(model, prompt, {
        maxTokens: 24,
        stopIds: [],
        speculate: { drafter: new NgramDrafter(), draftMax: 4, policy },
      });
      assertSame(spec, plain, `n-gram drafts, ${policy.constructor.name}`);
    }
  } finally {
    model.close();
  }
});

Deno.test("speculation refuses recompute; drafts outside the vocabulary are cut", async () => {
  const cfg = CONFIGS[2];
  const model = await openUnder(await tinyModel(cfg.options));
  try {
    const speculate = {
      drafter: new ScriptedDrafter(() => [1, model.config.vocabSize + 5, 2]),
      draftMax: 3,
      policy: new FixedPolicy(3),
    };
    await assert.rejects(
      () => collect(model, cfg.prompt, { maxTokens: 4, recompute: true, speculate }),
      /recompute/,
    );
    const plain = await collect(model, cfg.prompt, { maxTokens: 6, stopIds: [] });
    const spec = await collect(model, cfg.prompt, { maxTokens: 6, stopIds: [], speculate });
    assertSame(spec, plain, "out-of-vocabulary drafts");
    assert.ok(spec.steps.every((s) => s.drafted === undefined || s.drafted <= 1));
  } finally {
    model.close();
  }
});

Deno.test("the memory plan counts a verify pass: its rewind record, logits and batch", async () => {
  const { openCheckpoint } = await import("../../lib/checkpoint/checkpoint.ts");
  const { planMemory } = await import("../../lib/memory/plan.ts");
  const { PassRecord, passRecordBytes } = await import("../../lib/model/rewind.ts");
  for (const cfg of CONFIGS) {
    const ckpt = await openCheckpoint(await tinyModel(cfg.options));
    const c = ckpt.config, layers = ckpt.refs.layers.length;
    const shape = { positions: 64, maxBatch: 2 };
    const plain = planMemory(c, ckpt.refs, shape, {}, 0);
    const spec = planMemory(c, ckpt.refs, { ...shape, verifyPositions: 9 }, {}, 0);
    const item = spec.items.find((i) => i.name === "speculation")!;
    assert.equal(item.bytes, passRecordBytes(c, layers, 9) + 9 * c.vocabSize * 4);
    assert.equal(new PassRecord(c, 9).bytes(), passRecordBytes(c, layers, 9), cfg.name);
    assert.ok(spec.batch >= 9 && plain.batch === 2);
    assert.ok(!plain.items.some((i) => i.name === "speculation"));
    // Latent rows a verify pass writes past the last kept position are planned too.
    const mla = (p: typeof plain) => p.items.find((i) => i.name === "MLA cache")!.bytes;
    if (c.layerKinds.includes("mla")) assert.ok(mla(spec) > mla(plain));
  }
});
