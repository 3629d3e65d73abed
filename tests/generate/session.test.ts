/**
 * Retained state: a follow-up prompt that extends an earlier one resumes from a snapshot
 * and gives exactly the tokens a full re-prefill gives (batching: tests/generate/batch.test.ts).
 */
import assert from "node:assert/strict";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { Session } from "../../lib/generate/session.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";

async function collect(it: AsyncIterable<{ token: number; logits: Float32Array }>) {
  const tokens: number[] = [], logits: Float32Array[] = [];
  for await (const s of it) {
    tokens.push(s.token);
    logits.push(s.logits);
  }
  return { tokens, logits };
}

Deno.test("retained-state turns equal full re-prefill, byte for byte", async () => {
  const model = await Model.open(await tinyModel({ seed: 11 }));
  try {
    const session = new Session(model);
    let history = [7, 8, 9, 10];
    const reused: number[] = [];
    for (const user of [[11, 12], [13, 14, 15], [16]]) {
      history = [...history, ...user];
      const retained = await collect(
        session.generate(
          history,
          { maxTokens: 5, stopIds: [] },
          (r) => reused.push(r.reusedTokens),
        ),
      );
      const fresh = await collect(generate(model, history, { maxTokens: 5, stopIds: [] }));
      assert.deepEqual(retained.tokens, fresh.tokens);
      retained.logits.forEach((l, i) => assert.ok(sameBytes(l, fresh.logits[i]), `step ${i}`));
      history = [...history, ...retained.tokens];
    }
    assert.equal(reused[0], 0);
    assert.equal(reused[1], 6, "turn 2 resumes after turn 1's prompt");
    assert.equal(reused[2], 14, "turn 3 resumes after turn 2's prompt");
  } finally {
    model.close();
  }
});

Deno.test("an identical prompt resumes from its retained logits: nothing is prefilled again", async () => {
  const model = await Model.open(await tinyModel({ seed: 11 }));
  try {
    const session = new Session(model);
    const prompt = [21, 22, 23, 24, 25];
    const reused: number[] = [];
    const fed: number[] = [];
    const runs: { tokens: number[]; logits: Float32Array[] }[] = [];
    for (let i = 0; i < 2; i++) {
      const tokens: number[] = [], logits: Float32Array[] = [];
      for await (
        const s of session.generate(
          prompt,
          { maxTokens: 4, stopIds: [] },
          (r) => reused.push(r.reusedTokens),
        )
      ) {
        tokens.push(s.token);
        logits.push(s.logits);
        if (s.index === 0) fed.push(s.fed);
      }
      runs.push({ tokens, logits });
    }
    assert.deepEqual(reused, [0, prompt.length]);
    assert.deepEqual(fed, [prompt.length, 0]);
    assert.deepEqual(runs[1].tokens, runs[0].tokens);
    runs[1].logits.forEach((l, i) => assert.ok(sameBytes(l, runs[0].logits[i]), `step ${i}`));
  } finally {
    model.close();
  }
});
