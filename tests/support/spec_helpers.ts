/** Fixtures shared by the multi-sequence and speculation tests. */
import assert from "node:assert/strict";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { type MemoryRequest, planMemory } from "../../lib/memory/plan.ts";
import { Model } from "../../lib/model/model.ts";
import type { SequenceState } from "../../lib/model/state.ts";
import { mlaRowWidth } from "../../lib/layout/state.ts";
import { REFERENCE_CONFIGS, sameBytes } from "./helpers.ts";

/** The configs of the reference tests. */
export const CONFIGS = REFERENCE_CONFIGS;

/** Memory budgets that route every weight differently (resident, streamed, partly pinned). */
export const BUDGETS: { name: string; request?: MemoryRequest }[] = [
  { name: "resident" },
  {
    name: "0 pinned, 1-slot ring, 1-slot cache",
    request: { pinLayers: 0, ringSlots: 1, cacheSlots: 1 },
  },
  {
    name: "2 pinned, 2-slot ring, 5-slot cache",
    request: { pinLayers: 2, ringSlots: 2, cacheSlots: 5 },
  },
];

/**
 * Opens the model in `dir`, resident or under a plan built from `request` (which passes at
 * most `maxBatch` tokens per forward pass).
 */
export async function openUnder(
  dir: string,
  request?: MemoryRequest,
  maxBatch = 64,
): Promise<Model> {
  const ckpt = await openCheckpoint(dir);
  if (!request) return Model.load(ckpt);
  const plan = planMemory(ckpt.config, ckpt.refs, { positions: 256, maxBatch }, request, 0);
  return Model.load(ckpt, { plan });
}

/** Asserts two states hold the same position, tokens, KDA S, conv history and MLA rows. */
export function sameState(a: SequenceState, b: SequenceState, what: string): void {
  assert.equal(a.position, b.position, `${what}: position`);
  assert.deepEqual(a.tokens, b.tokens, `${what}: tokens`);
  for (const [i, k] of b.kda) {
    const g = a.kda.get(i)!;
    assert.ok(sameBytes(g.S, k.S), `${what}: KDA S of layer ${i}`);
    assert.ok(sameBytes(g.histQ, k.histQ), `${what}: q conv history of layer ${i}`);
    assert.ok(sameBytes(g.histK, k.histK), `${what}: k conv history of layer ${i}`);
    assert.ok(sameBytes(g.histV, k.histV), `${what}: v conv history of layer ${i}`);
  }
  const used = b.position * mlaRowWidth(b.config);
  for (const [i, m] of b.mla) {
    const g = a.mla.get(i)!;
    assert.ok(sameBytes(g.cache.subarray(0, used), m.cache.subarray(0, used)), `${what}: MLA ${i}`);
  }
}
