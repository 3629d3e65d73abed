/** sim-cache replays a hand-made trace with the textbook LRU and Belady answers. */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { simulateBelady, simulateLru, simulatePinnedLru } from "../../lib/memory/simulate.ts";
import { runK3, tempDir } from "../support/helpers.ts";

// The classic reference string (Silberschatz et al.): with 3 frames LRU takes 12 faults and
// the optimal policy 9; with 4 frames both take 8.
const REF = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];

Deno.test("LRU and Belady give the textbook fault counts", () => {
  assertEquals(simulateLru(REF, 3), { hits: 8, misses: 12 });
  assertEquals(simulateBelady(REF, 3), { hits: 11, misses: 9 });
  assertEquals(simulateLru(REF, 4), { hits: 12, misses: 8 });
  assertEquals(simulateBelady(REF, 4), { hits: 12, misses: 8 });
  // Pinning the first layer's 4 keys (layer = key / 4) in 8 slots: keys 0..3 never leave.
  const pin = simulatePinnedLru(REF, 8, 4);
  assert(pin.hits <= simulateBelady(REF, 8).hits);
});

Deno.test("k3 sim-cache on a hand-made trace file", async () => {
  const dir = tempDir();
  const lines = [
    JSON.stringify({
      format: "k3-expert-trace",
      version: 1,
      layers: 1,
      experts: 8,
      expert_bytes: 1000,
    }),
    ...REF.map((id, i) => JSON.stringify({ step: Math.floor(i / 5), layer: 0, ids: [id] })),
  ];
  await Deno.writeTextFile(path.join(dir, "expert_trace.jsonl"), lines.join("\n") + "\n");
  const r = await runK3(["sim-cache", dir, "--sizes", "3,4", "--json"]);
  assertEquals(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  assertEquals(out.requests, 20);
  assertEquals(out.compulsory_misses, 6);
  assertEquals(out.rows.map((x: any) => [x.slots, x.lru_hits, x.belady_hits]), [[3, 8, 11], [
    4,
    12,
    12,
  ]]);
  // GB read per token: 12 misses x 1000 B over 4 tokens.
  assertEquals(out.rows[0].lru_gb_per_token, (12 * 1000) / 1e9 / 4);
  const text = await runK3(["sim-cache", path.join(dir, "expert_trace.jsonl"), "--sizes", "3"]);
  assert(/compulsory misses: 6/.test(text.stdout), text.stdout);
  const bad = await runK3(["sim-cache", path.join(dir, "nope.jsonl")]);
  assertEquals(bad.code, 2);
});
