/**
 * Layer-major prefill on the full-size layout with 4 layers (`make-tiny --shape full --layers
 * 4`, shared with tests/memory/full_budgets.test.ts: tests/support/shared_fixtures.ts): real widths (hidden 7168, 896 experts of 17.5 MB,
 * top-16), so the plan's numbers are the released model's per layer. The trunk and the
 * experts are sparse holes that read as zeros without touching the disk (so the bytes read
 * are counted, not timed); the embedding, lm_head and routers are random, so tokens and
 * logits are not degenerate and the router picks many experts.
 *
 * - ultra plans a 1,500-token prompt as one pass: its scratch holds every token's hidden
 *   state and AttnRes bank (and a layer's activations) within the 2.9 GB budget;
 * - `k3 run --preset ultra`: the prompt's prefill reads the trunk once (<= 1.1 x one pass
 *   over the streamed trunk) and each expert at most once (<= distinct experts x expert
 *   read), and --prefill-chunk 8 reads the same and gives the same tokens and logits;
 * - a prompt over ultra's context exits 2 before anything is read.
 *
 * The prompt of the runs is short (a full-width forward over 1,500 tokens takes minutes on
 * 2 cores): tests/memory/prefill.test.ts proves the reads and the bytes against today's
 * passes on a 600-token prompt with a small model.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { passScratchFloats } from "../../lib/layout/state.ts";
import { tryPlan } from "../../lib/memory/plan.ts";
import { trunkBlocks } from "../../lib/memory/sources.ts";
import { runK3, runRecorded, sameBytes, tempDir } from "../support/helpers.ts";
import { sharedFullSparse } from "../support/shared_fixtures.ts";

const GB = 1e9;
const PROMPT = Array.from({ length: 48 }, (_, i) => (i * 7919 + 13) % 163000 + 100);

Deno.test({
  name: "full-size layout, 4 layers: a long prompt is one pass at ultra, one read of each weight",
  fn: async (t) => {
    const dir = await sharedFullSparse(4);
    {
      const ckpt = await openCheckpoint(dir);
      const c = ckpt.config, L = ckpt.refs.layers.length;

      await t.step("ultra plans 1,500 prompt tokens as one pass within 2.9 GB", () => {
        const shape = { positions: 1502, maxBatch: 1500, prefill: 1500 };
        const { plan, refusal } = tryPlan(c, ckpt.refs, shape, { preset: "ultra" }, 180e6);
        assert.equal(refusal, undefined);
        assert.equal(plan.batch, 1500, "one pass for the whole prompt");
        assert.equal(plan.chunk, 32, "computed 32 at a time (ultra's chunk)");
        // Every token's hidden state and bank row (28 KB each at full width), and more.
        const wide = 4 * passScratchFloats(c, L).wide;
        assert.ok(wide >= 2 * 4 * c.hiddenSize, `${wide} bytes per token`);
        const buffers = plan.items.find((i) => i.name === "buffers")!.bytes;
        assert.ok(buffers >= 1500 * wide, `buffers ${buffers}`);
        assert.ok(plan.total <= 2.9 * GB, `plan ${plan.total}`);
      });

      await t.step("a prompt over ultra's context exits 2 before reading anything", async () => {
        const ids = Array.from({ length: 4096 }, (_, i) => i + 1).join(",");
        const r = await runK3(["run", dir, "--ids", ids, "--gen", "1", "--preset", "ultra"]);
        assert.equal(r.code, 2, r.stderr);
        assert.match(r.stderr, /4097 positions, over preset ultra's context of 4096/);
        assert.ok(!r.stderr.includes("memory plan") && !r.stderr.includes("loading"), r.stderr);
      });

      await t.step(
        "k3 run at ultra: one trunk read, each expert once, chunk-free bytes",
        async () => {
          const cycle = trunkBlocks(ckpt.refs).reduce((a, b) => a + b.bytes, 0);
          const traces = tempDir();
          const runs = [];
          for (const chunk of [undefined, "8"]) {
            const trace = path.join(traces, chunk ?? "default");
            const flags = ["--preset", "ultra", "--dump-cache-trace", trace];
            if (chunk) flags.push("--prefill-chunk", chunk);
            const r = await runRecorded(dir, PROMPT.join(","), "1", flags);
            const plan = r.record.memory.plan;
            assert.equal(plan.pass_tokens, PROMPT.length, "the prompt is one pass");
            assert.equal(plan.chunk_tokens, chunk ? 8 : 32);
            assert.ok(r.record.peak_rss_bytes <= plan.total_bytes, r.stderr);
            const step = r.record.steps[0];
            assert.ok(
              step.trunk_gb_read * GB <= 1.1 * cycle,
              `prefill read ${step.trunk_gb_read} GB of trunk, one pass is ${cycle / GB} GB`,
            );
            const lines = (await Deno.readTextFile(path.join(trace, "expert_trace.jsonl")))
              .trim().split("\n").map((l) => JSON.parse(l));
            const pairs = new Set(
              lines.slice(1).flatMap((r: { layer: number; ids: number[] }) =>
                r.ids.map((id) => `${r.layer}:${id}`)
              ),
            );
            const slot = plan.experts.slotBytes;
            assert.ok(
              step.expert_gb_read * GB <= pairs.size * slot,
              `${step.expert_gb_read} GB of experts for ${pairs.size} distinct experts`,
            );
            // Many experts: per-pass re-reads would have shown.
            assert.ok(pairs.size > 3 * c.topK, `${pairs.size} distinct experts`);
            runs.push(r);
          }
          const [one, eight] = runs;
          assert.deepEqual(eight.ids, one.ids);
          assert.ok(sameBytes(eight.logits, one.logits), "--prefill-chunk 8 changed the logits");
          assert.ok(one.logits.some((x) => x !== 0), "logits are not all zero");
        },
      );
    }
  },
});
