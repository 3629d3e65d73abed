/**
 * A failed expert fetch is the forward pass's error (RUN INVALID, exit 4 in the CLI), also
 * when it fails while the layer's other kernels run: the pass starts the fetch, computes the
 * latent projection and the shared experts (which give the event loop turns), and only then
 * awaits the experts. A rejection in between must not end the process as unhandled.
 */
import assert from "node:assert/strict";
import { type K3Error, runInvalid } from "../../lib/errors.ts";
import { OFF_THREAD_WORK } from "../../lib/model/kernel.ts";
import { Forward } from "../../lib/model/forward.ts";
import { Model } from "../../lib/model/model.ts";
import type { ExpertSource, ReadyExpert } from "../../lib/memory/sources.ts";
import { tinyModel } from "../support/helpers.ts";

/** An expert source whose every fetch fails at once. */
function failingExperts(failure: K3Error): ExpertSource {
  return {
    fetch(): AsyncIterable<ReadyExpert> {
      return {
        [Symbol.asyncIterator]: () => ({
          next: () => Promise.reject(failure),
          return: () => Promise.resolve({ done: true, value: undefined }),
        }),
      };
    },
    release() {},
    close() {},
  };
}

Deno.test("a failed expert fetch is the pass's error, even while the layer computes", async () => {
  const model = await Model.open(await tinyModel({ seed: 3 }));
  try {
    const failure = runInvalid("expert 1 of layer 1: an injected read failure");
    const forward = new Forward(
      model.config,
      { ...model.forward.sources, experts: failingExperts(failure) },
      model.forward.layers,
    );
    // Enough tokens that the latent projection runs off this thread: the event loop turns
    // (and looks for unhandled rejections) while the failed fetch waits to be awaited.
    const c = model.config, T = Math.ceil(OFF_THREAD_WORK / (c.hiddenSize * c.latentSize)) + 1;
    const ids = Array.from({ length: T }, (_, i) => (i * 37 + 1) % c.vocabSize);
    await assert.rejects(forward.forward(model.newState(ids.length), ids), (e) => e === failure);
    // The model's own forward still works after the failed one.
    const logits = await model.forward.forward(model.newState(ids.length), ids);
    assert.ok(logits.every(Number.isFinite));
  } finally {
    model.close();
  }
});
