/**
 * The memory plan holds a server's batch, at the released model's scale: on the 93-layer
 * full-size layout (headers only: `make-tiny --shape full --data none`) the plan counts N
 * sequence states (KDA state, MLA cache, verify record) and R retained states, the default
 * batch is what a quarter of the budget holds, and a batch the budget cannot hold is refused
 * (exit 3) naming --max-batch, by the planner and by `k3 serve` before anything is loaded.
 */
import assert from "node:assert/strict";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { kdaBytes, mlaBytes, stateBytes } from "../../lib/layout/state.ts";
import { defaultBatch, type RunShape, tryPlan } from "../../lib/memory/plan.ts";
import { makeFull } from "../../lib/synth/full.ts";
import { runK3 } from "../support/helpers.ts";

const GB = 1e9;

Deno.test("full-size layout: the plan holds the batch and the retained states, or refuses", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-full-batch-" });
  try {
    await makeFull(dir, { layers: 93, data: "none" });
    const ckpt = await openCheckpoint(dir);
    const c = ckpt.config, L = ckpt.refs.layers.length;
    const baseline = 150e6;
    const shape = (positions: number, sequences: number, retained: number): RunShape => ({
      positions,
      maxBatch: 64,
      verifyPositions: 5,
      sequences,
      retained,
    });
    const item = (items: { name: string; bytes: number }[], name: string) =>
      items.find((i) => i.name === name)?.bytes ?? 0;

    // Every part that is per sequence is counted N times, the retained states R times.
    const one = tryPlan(c, ckpt.refs, shape(4096, 1, 0), { memoryMaxGb: 1000 }, baseline).plan;
    const four = tryPlan(c, ckpt.refs, shape(4096, 4, 2), { memoryMaxGb: 1000 }, baseline).plan;
    assert.equal(item(four.items, "KDA state"), 4 * kdaBytes(c, L));
    assert.equal(item(four.items, "MLA cache"), 4 * mlaBytes(c, L, 4096 + 4));
    assert.equal(item(four.items, "speculation"), 4 * item(one.items, "speculation"));
    assert.equal(
      item(four.items, "retained states"),
      2 * (stateBytes(c, L, 4096 + 4) + 4 * c.vocabSize),
    );
    assert.equal(item(one.items, "retained states"), 0);
    assert.ok(four.batch >= 4 * 5, "a pass holds every sequence's verify pass");

    // K3's state is large (69 KDA layers of 6.3 MB, 55 KB per MLA position): a laptop holds
    // one sequence at its context, a server preset more.
    const laptop = defaultBatch(c, L, 16384, { preset: "laptop" }, 8, 4);
    const perSequence = stateBytes(c, L, 16384);
    assert.ok(perSequence > 1 * GB, `one sequence at 16384 positions is ${perSequence} bytes`);
    assert.deepEqual(laptop, { sequences: 1, retained: 0 });
    const server = defaultBatch(c, L, 16384, { preset: "server" }, 8, 4);
    assert.ok(server.sequences > 1 && server.sequences <= 8, JSON.stringify(server));
    const fits = tryPlan(c, ckpt.refs, shape(16384, 1, 0), { preset: "laptop" }, baseline);
    assert.equal(fits.refusal, undefined, fits.reason);

    // Eight sequences do not fit a laptop: refused before anything is allocated, naming the flag.
    const over = tryPlan(c, ckpt.refs, shape(16384, 8, 0), { preset: "laptop" }, baseline);
    assert.ok(over.refusal, "8 sequences on a laptop are refused");
    // The planner names the remedy in words and as an option; the CLI adds --max-batch.
    assert.match(over.refusal.message, /fewer sequences at once/);
    assert.ok(over.refusal.remedies.some((r) => r.option === "sequences/retained"));

    const cli = await runK3([
      "serve",
      dir,
      "--preset",
      "laptop",
      "--max-batch",
      "8",
      "--port",
      "0",
    ]);
    assert.equal(cli.code, 3, cli.stderr);
    assert.match(cli.stderr, /8 sequences: recurrent state/);
    assert.match(cli.stderr, /a smaller --max-batch or --retain/);
    const bad = await runK3(["serve", dir, "--max-batch", "0"]);
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /--max-batch wants a whole number from 1/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
