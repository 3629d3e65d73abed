/**
 * A forward call stopped at a layer boundary (its `signal`) commits nothing of the pass it
 * interrupts: the state is byte for byte what it was before that pass, and the model (ring,
 * expert cache) goes on giving the bytes an uninterrupted run gives.
 */
import assert from "node:assert/strict";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { contextShape } from "../../lib/engine/open.ts";
import { kdaBytes } from "../../lib/layout/state.ts";
import { planMemory } from "../../lib/memory/plan.ts";
import { Batcher } from "../../lib/generate/batch.ts";
import { ForwardAborted } from "../../lib/model/forward.ts";
import type { Model } from "../../lib/model/model.ts";
import type { SequenceState } from "../../lib/model/state.ts";
import { sameBytes, tinyModel } from "../support/helpers.ts";
import { BUDGETS, CONFIGS, openUnder, sameState } from "../support/spec_helpers.ts";

/**
 * Forward options whose signal aborts after the `n`-th layer (counting every layer of every
 * pass, from 1; 0: before the call).
 */
function stopAt(n: number) {
  const stop = new AbortController();
  let layers = 0;
  if (n === 0) stop.abort();
  return {
    signal: stop.signal,
    betweenLayers: () => {
      if (++layers === n) stop.abort();
      return Promise.resolve();
    },
    layers: () => layers,
  };
}

/** Asserts a ForwardAborted at `layer` (-1: before its pass). */
function abortedAt(layer: number) {
  return (e: unknown) => e instanceof ForwardAborted && e.layer === layer;
}

/** Logits after `ids` from an empty state, uninterrupted. */
async function fresh(model: Model, ids: number[]): Promise<Float32Array> {
  return await model.forward.forward(model.newState(ids.length), ids);
}

/** `state` equals `before` and holds the same last logits. */
function unchanged(state: SequenceState, before: SequenceState, what: string): void {
  sameState(state, before, what);
  assert.ok(sameBytes(state.lastLogits!, before.lastLogits!), `${what}: last logits`);
}

for (const cfg of CONFIGS) {
  for (const budget of BUDGETS) {
    Deno.test(`an aborted forward pass leaves the state as it was: ${cfg.name}, ${budget.name}`, async () => {
      const model = await openUnder(await tinyModel(cfg.options), budget.request);
      try {
        const layers = model.forward.layers;
        const head = [...cfg.prompt, 11, 12], tail = [901, 3, 77, 8, 250];
        const reference = await fresh(model, [...head, ...tail]);
        // Every boundary: before the pass, and after each layer (the last: before lm_head).
        for (let n = 0; n <= layers; n++) {
          const state = model.newState(head.length + tail.length);
          await model.forward.forward(state, head);
          const before = state.snapshot();
          const stop = stopAt(n);
          await assert.rejects(
            () => model.forward.forwardMany([{ state, ids: tail }], stop),
            abortedAt(n - 1),
          );
          assert.equal(stop.layers(), n, "no layer ran after the abort");
          unchanged(state, before, `stopped at boundary ${n}`);
          // The same call again, not stopped: the uninterrupted run's bytes.
          const logits = await model.forward.forward(state, tail);
          assert.ok(sameBytes(logits, reference), `boundary ${n}: logits after resuming`);
        }
        // A call that may stop but does not gives the same bytes and tests every boundary.
        const state = model.newState(head.length + tail.length);
        const never = stopAt(Infinity);
        const [[logits]] = await model.forward.forwardMany(
          [{ state, ids: [...head, ...tail] }],
          never,
        );
        assert.ok(sameBytes(logits, reference), "an abortable pass that runs to its end");
        assert.equal(never.layers(), layers);
      } finally {
        model.close();
      }
    });
  }
}

Deno.test("a call of several passes keeps the passes that completed before the stop", async () => {
  // Two tokens per pass: the call runs as passes of 2, 2, 1 tokens.
  const model = await openUnder(await tinyModel(CONFIGS[0].options), {}, 2);
  try {
    assert.equal(model.forward.maxTokens, 2);
    const ids = [5, 17, 300, 42, 7];
    const layers = model.forward.layers;
    const state = model.newState(ids.length);
    // Stops after the third layer of the second pass.
    await assert.rejects(
      () => model.forward.forwardMany([{ state, ids }], stopAt(layers + 3)),
      abortedAt(2),
    );
    const firstPass = model.newState(ids.length);
    await model.forward.forward(firstPass, ids.slice(0, 2));
    unchanged(state, firstPass, "after the first pass");
    const logits = await model.forward.forward(state, ids.slice(2));
    assert.ok(sameBytes(logits, await fresh(model, ids)), "resumed from the kept passes");
  } finally {
    model.close();
  }
});

Deno.test("the plan of a chat or server counts the KDA copy a stoppable pass keeps", async () => {
  const ckpt = await openCheckpoint(await tinyModel(CONFIGS[1].options));
  const c = ckpt.config, L = ckpt.refs.layers.length;
  const item = (shape: Parameters<typeof planMemory>[2]) =>
    planMemory(c, ckpt.refs, shape, {}, 0).items.find((i) => i.name === "KDA stop copy");
  assert.equal(item(contextShape(4096))?.bytes, kdaBytes(c, L));
  assert.equal(item({ positions: 4096, maxBatch: 64 }), undefined, "k3 run never stops a pass");
});

Deno.test("restore: false (a server's cancelled request) keeps no copy; the batcher passes it", async () => {
  const model = await openUnder(await tinyModel(CONFIGS[0].options), BUDGETS[0].request);
  try {
    const head = [...CONFIGS[0].prompt, 11, 12], tail = [901, 3, 77, 8, 250];
    const state = model.newState(head.length + tail.length);
    await model.forward.forward(state, head);
    const before = state.snapshot();
    // Stopped right after the first KDA layer: its state moved and is not put back (such a
    // state is discarded, never used again).
    const kda0 = Math.min(...state.kda.keys());
    const stop = stopAt(kda0 + 1);
    await assert.rejects(
      () => model.forward.forwardMany([{ state, ids: tail }], { ...stop, restore: false }),
      abortedAt(kda0),
    );
    assert.ok(
      !sameBytes(state.kda.get(kda0)!.S, before.kda.get(kda0)!.S) ||
        !sameBytes(state.kda.get(kda0)!.histK, before.kda.get(kda0)!.histK),
      "without restore the stopped pass left its first layer advanced",
    );
    // What the batcher hands the forward pass: restore unless the session says otherwise.
    const seen: (boolean | undefined)[] = [];
    const inner = model.forward.forwardMany.bind(model.forward);
    model.forward.forwardMany = (seqs, options) => {
      seen.push(options?.restore);
      return inner(seqs, options);
    };
    for (const restoreOnStop of [undefined, false]) {
      seen.length = 0;
      const batcher = new Batcher(model.forward, { passTokens: 8, restoreOnStop });
      const lane = batcher.lane(new AbortController().signal);
      await lane.forwardMany([{ state: model.newState(head.length), ids: head }]);
      assert.ok(seen.length > 0 && seen.every((r) => r === (restoreOnStop ?? true)), `${seen}`);
    }
  } finally {
    model.close();
  }
});
