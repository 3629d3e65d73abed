/**
 * Memory budgets at scale, on the full-size layout (every tensor with its
 * released name, shape and dtype; `make-tiny --shape full`). The trunk and the experts are
 * sparse holes, so they read as zeros without touching the disk; the embedding, lm_head and
 * the routers are random, so tokens and logits are not degenerate.
 *
 * - 4 layers (shared with tests/memory/prefill_full.test.ts, made once per run by
 *   tests/support/shared_fixtures.ts): ultra, laptop and a larger budget give
 *   byte-identical tokens and logits; every plan holds against the measured peak RSS
 *   (VmHWM), ultra plans <= 2.9 GB and peaks <= 3.0 GB, laptop plans and peaks <= 8.0 GB;
 *   an over-budget plan exits 3 before allocating.
 *
 * doctor on the 93-layer layout (every preset planned, why one does not fit, the context each
 * allows) is a step of tests/memory/full.test.ts, which makes that layout once for all its checks.
 */
import assert from "node:assert/strict";
import { runK3, runRecorded, sameBytes } from "../support/helpers.ts";
import { sharedFullSparse } from "../support/shared_fixtures.ts";

const IDS = "5,17,250,3";
const GEN = "2";
const GB = 1e9;

Deno.test({
  name: "full-size layout, 4 layers: ultra, laptop and a larger budget give the same bytes " +
    "within their plans",
  fn: async (t) => {
    const model = { dir: await sharedFullSparse(4) };
    const budgets: [string, string[]][] = [
      ["ultra", ["--preset", "ultra"]],
      ["laptop", ["--preset", "laptop"]],
      // Everything in the trunk resident (no ring), a small expert cache.
      ["10 GB", ["--memory-max", "10", "--cache-slots", "16"]],
    ];
    const runs = [];
    for (const [name, flags] of budgets) {
      const r = await runRecorded(model.dir, IDS, GEN, flags);
      const plan = r.record.memory.plan, peak = r.record.peak_rss_bytes;
      assert(
        peak <= plan.total_bytes,
        `${name}: peak RSS ${peak} above the plan ${plan.total_bytes}\n${r.stderr}`,
      );
      runs.push({ name, ...r });
    }
    const [ultra, laptop, large] = runs;
    await t.step(
      "ultra is the floor: plans <= 2.9 GB, peaks <= 3.0 GB, streams everything",
      () => {
        const plan = ultra.record.memory.plan;
        assert(plan.total_bytes <= 2.9 * GB, `ultra plans ${plan.total_bytes}`);
        assert(
          ultra.record.peak_rss_bytes <= 3.0 * GB,
          `ultra peaks ${ultra.record.peak_rss_bytes}`,
        );
        assert.equal(plan.trunk.pinned, 0);
        assert.equal(plan.trunk.headResident, false, "lm_head streams");
        // No layer fits a slot: layer 0 alone is 2.34 GB; a slot holds one piece.
        assert(plan.trunk.slotBytes <= 135e6, `slot ${plan.trunk.slotBytes}`);
        const names = plan.items.map((i: { name: string }) => i.name);
        assert(!names.some((n: string) => /embed/.test(n)), `the embedding is never resident`);
        // Every pass reads the whole trunk and lm_head (about 8 GB of holes) once.
        assert(ultra.record.memory.io.trunk_bytes >= 2 * 7.9 * GB, "trunk read per pass");
      },
    );
    await t.step("laptop plans and peaks <= 8.0 GB and spends the rest on residency", () => {
      const plan = laptop.record.memory.plan;
      assert(plan.total_bytes <= 8.0 * GB && laptop.record.peak_rss_bytes <= 8.0 * GB);
      assert(plan.trunk.pinned + (plan.trunk.headResident ? 1 : 0) >= 2, "resident trunk");
      assert(plan.total_bytes >= 7.5 * GB, "laptop uses its budget");
    });
    await t.step("the larger budget keeps the whole trunk resident", () => {
      const plan = large.record.memory.plan;
      assert.equal(plan.trunk.ringSlots, 0);
      assert(plan.trunk.headResident && plan.trunk.pinned === 4);
    });
    await t.step("byte-identical tokens and logits under every budget", () => {
      for (const r of [laptop, large]) {
        assert.deepEqual(r.record.generated_ids, ultra.record.generated_ids, r.name);
        assert(sameBytes(r.logits, ultra.logits), `${r.name}: logits differ from ultra`);
      }
      assert.equal(ultra.logits.length, Number(GEN) * 163840);
      assert(ultra.logits.some((x) => x !== 0), "logits are not all zero");
    });
    await t.step("an over-budget plan exits 3 before allocating", async () => {
      // Below the floor (the process, one ring slot, one expert), and a trunk budget
      // below one piece.
      const cases: [string[], RegExp][] = [
        [["--memory-max", "0.3"], /shortfall of .*Nothing was allocated/s],
        [["--preset", "ultra", "--trunk-gb", "0.1"], /cannot hold one ring slot/],
      ];
      for (const [flags, why] of cases) {
        const r = await runK3(["run", model.dir, "--ids", IDS, "--gen", "1", ...flags]);
        assert.equal(r.code, 3, r.stderr);
        assert.match(r.stderr, why);
        assert(!r.stderr.includes("loading ["), "nothing was loaded");
      }
    });
  },
});
