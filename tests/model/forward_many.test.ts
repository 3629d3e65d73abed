/**
 * The engine core shared by speculation and batching: several sequences in one forward call
 * equal each run alone, and the logits of every position equal step-by-step decode, byte for
 * byte; a verify pass leaves the state untouched until it is advanced.
 */
import assert from "node:assert/strict";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { PassRecord } from "../../lib/model/rewind.ts";
import type { SequenceState } from "../../lib/model/state.ts";
import { argmax } from "../../lib/text/sampler.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";
import { CONFIGS, openUnder, sameState } from "../support/spec_helpers.ts";

/** Greedy decoding of `prompt`, alone: tokens and the logits of every step. */
async function solo(model: Model, prompt: number[], n: number) {
  const tokens: number[] = [], logits: Float32Array[] = [];
  for await (const s of generate(model, prompt, { maxTokens: n, stopIds: [] })) {
    tokens.push(s.token);
    logits.push(s.logits);
  }
  return { tokens, logits };
}

for (const cfg of CONFIGS) {
  Deno.test(`several sequences in one call equal each alone: ${cfg.name}`, async () => {
    const model = await Model.open(await tinyModel(cfg.options));
    try {
      const prompts = [cfg.prompt, [3, 1, 4, 1, 5], [cfg.prompt[0]], [900, 2, 77, 8, 8, 8, 8]];
      const steps = 6;
      const alone: { tokens: number[]; logits: Float32Array[] }[] = [];
      for (const p of prompts) alone.push(await solo(model, p, steps));

      // Prefill all prompts in one call, then decode all sequences together.
      const states = prompts.map((p) => model.newState(p.length + steps));
      let logits = (await model.forward.forwardMany(
        prompts.map((ids, n) => ({ state: states[n], ids })),
      )).map((l) => l[0]);
      for (let step = 0; step < steps; step++) {
        const next = logits.map((l) => argmax(l));
        prompts.forEach((_, n) => {
          assert.ok(sameBytes(logits[n], alone[n].logits[step]), `seq ${n} step ${step}`);
          assert.equal(next[n], alone[n].tokens[step], `seq ${n} step ${step}`);
        });
        // Sequences join and leave: on odd steps sequence 1 sits out.
        const active = prompts.map((_, n) => n).filter((n) => step % 2 === 0 || n !== 1);
        const out = await model.forward.forwardMany(
          active.map((n) => ({ state: states[n], ids: [next[n]] })),
        );
        if (step % 2 === 1) {
          // Sequence 1 runs alone, in a call of its own.
          const [l1] = await model.forward.forwardMany([{ state: states[1], ids: [next[1]] }]);
          out.splice(1, 0, l1);
        }
        logits = out.map((l) => l[0]);
      }
    } finally {
      model.close();
    }
  });
}

Deno.test("the logits of every position equal step-by-step decode", async () => {
  for (const cfg of CONFIGS) {
    const model = await Model.open(await tinyModel(cfg.options));
    try {
      const plain = await solo(model, cfg.prompt, 8);
      // The prompt and the generated tokens but the last, as one call: row i is step i's
      // logits from the prompt's last position on.
      const all = [...cfg.prompt, ...plain.tokens.slice(0, -1)];
      const [rows] = await model.forward.forwardMany([{
        state: model.newState(all.length),
        ids: all,
        logits: "all",
      }]);
      assert.equal(rows.length, all.length);
      plain.logits.forEach((l, i) => {
        assert.ok(sameBytes(rows[cfg.prompt.length - 1 + i], l), `${cfg.name}: step ${i}`);
      });
    } finally {
      model.close();
    }
  }
});

Deno.test("a verify pass leaves the state alone; advancing it equals plain feeding", async () => {
  const cfg = CONFIGS[1];
  for (const budget of [undefined, { pinLayers: 0, ringSlots: 1, cacheSlots: 1 }]) {
    const model = await openUnder(await tinyModel(cfg.options), budget);
    try {
      const prompt = cfg.prompt, extra = [44, 45, 46, 47, 48];
      const base = model.newState(64);
      await model.forward.forward(base, prompt);
      for (const n of [1, 2, 5]) {
        const state = base.snapshot(), before = base.snapshot();
        const record = new PassRecord(model.config, extra.length);
        // A verify pass batched with an ordinary sequence.
        const other = model.newState(8);
        const [rows, [otherLogits]] = await model.forward.forwardMany([
          { state, ids: extra, logits: "all", record },
          { state: other, ids: [7, 8, 9] },
        ]);
        sameState(state, before, "a verify pass moved the state");
        record.advance(state, n);
        const plain = base.snapshot();
        const plainLogits: Float32Array[] = [];
        for (const id of extra.slice(0, n)) {
          plainLogits.push(await model.forward.forward(plain, [id]));
        }
        sameState(state, plain, `advanced by ${n}`);
        plainLogits.forEach((l, i) => assert.ok(sameBytes(rows[i], l), `row ${i}`));
        assert.ok(sameBytes(state.lastLogits!, plainLogits[n - 1]));
        const alone = model.newState(8);
        assert.ok(sameBytes(otherLogits, await model.forward.forward(alone, [7, 8, 9])));
      }
    } finally {
      model.close();
    }
  }
});

Deno.test("sequences split across passes of the plan's batch equal each alone", async () => {
  const cfg = CONFIGS[1];
  const dir = await tinyModel(cfg.options);
  const resident = await openUnder(dir);
  const small = await openUnder(dir, { pinLayers: 1, ringSlots: 2, cacheSlots: 4 }, 3);
  try {
    assert.equal(small.forward.maxTokens, 3);
    const prompts = [cfg.prompt.slice(0, 5), [9], [4, 5, 6, 7]];
    const expect: Float32Array[][] = [];
    for (const p of prompts) {
      const [rows] = await resident.forward.forwardMany([{
        state: resident.newState(8),
        ids: p,
        logits: "all",
      }]);
      expect.push(rows);
    }
    // 10 tokens through passes of 3: sequences split and share passes; one verify pass of 3.
    const states = prompts.map(() => small.newState(8));
    const record = new PassRecord(small.config, 3);
    const verifyBase = small.newState(8);
    await small.forward.forward(verifyBase, [1, 2]);
    const got = await small.forward.forwardMany([
      ...prompts.map((ids, n) => ({ state: states[n], ids, logits: "all" as const })),
      { state: verifyBase, ids: [3, 4, 5], record },
    ]);
    prompts.forEach((p, n) => {
      assert.equal(got[n].length, p.length);
      got[n].forEach((l, i) => assert.ok(sameBytes(l, expect[n][i]), `seq ${n} row ${i}`));
      assert.equal(states[n].position, p.length);
    });
    const plain = resident.newState(8);
    const [want] = await resident.forward.forwardMany([{
      state: plain,
      ids: [1, 2, 3, 4, 5],
      logits: "all",
    }]);
    got[3].forEach((l, i) => assert.ok(sameBytes(l, want[2 + i]), `verify row ${i}`));
    // Only the last-position logits when asked so, and the state keeps them.
    const s = small.newState(8);
    const [[only]] = await small.forward.forwardMany([{ state: s, ids: prompts[0] }]);
    assert.ok(sameBytes(only, expect[0][4]) && sameBytes(s.lastLogits!, only));
    await assert.rejects(
      () =>
        small.forward.forwardMany([{
          state: small.newState(8),
          ids: [1, 2, 3, 4],
          record: new PassRecord(small.config, 4),
        }]),
      /exceeds the plan's 3 tokens per pass/,
    );
  } finally {
    resident.close();
    small.close();
  }
});

Deno.test("forwardMany refuses an empty call, an empty sequence and a state given twice", async () => {
  const model = await Model.open(await tinyModel(CONFIGS[0].options));
  try {
    const s: SequenceState = model.newState(4);
    await assert.rejects(() => model.forward.forwardMany([]), /at least one sequence/);
    await assert.rejects(() => model.forward.forwardMany([{ state: s, ids: [] }]), /one token/);
    await assert.rejects(
      () => model.forward.forwardMany([{ state: s, ids: [1] }, { state: s, ids: [2] }]),
      /twice/,
    );
    assert.equal(s.position, 0);
  } finally {
    model.close();
  }
});
