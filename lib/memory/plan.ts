/**
 * The memory plan: everything the run will hold, added up before anything is allocated.
 */
import type { ModelRefs } from "../checkpoint/types.ts";
import type { K3Config } from "../config.ts";
import { kdaStateBytes, mlaRowWidth } from "../model/state.ts";
import { formatBytes } from "../report.ts";
import { expertBlockBytes, trunkBlockBytes } from "./sources.ts";

export interface PlanItem {
  name: string;
  bytes: number;
  note: string;
}

export interface MemoryPlan {
  items: PlanItem[];
  total: number;
}

/** Sequence state for `positions` positions: KDA states plus the MLA latent cache. */
export function stateBytes(c: K3Config, layers: number, positions: number): number {
  let n = 0;
  for (let i = 0; i < layers; i++) {
    n += c.layerKinds[i] === "kda" ? kdaStateBytes(c) : 4 * positions * mlaRowWidth(c);
  }
  return n;
}

/** Plan for a fully resident run of `positions` positions. */
export function planResident(c: K3Config, refs: ModelRefs, positions: number): MemoryPlan {
  const trunk = refs.layers.reduce((a, l) => a + trunkBlockBytes(l), 0);
  const moeLayers = refs.layers.filter((l) => l.moe).length;
  const experts = moeLayers * c.numExperts * expertBlockBytes(refs);
  const items: PlanItem[] = [
    { name: "trunk", bytes: trunk, note: `${refs.layers.length} layers resident` },
    {
      name: "embed + lm_head",
      bytes: refs.embed.nbytes + refs.lmHead.nbytes,
      note: "resident",
    },
    { name: "experts", bytes: experts, note: `${moeLayers} x ${c.numExperts} resident` },
    {
      name: "sequence state",
      bytes: stateBytes(c, refs.layers.length, positions),
      note: `KDA states + MLA latent cache for ${positions} positions`,
    },
  ];
  return { items, total: items.reduce((a, i) => a + i.bytes, 0) };
}

/** The plan as a small table. */
export function formatPlan(plan: MemoryPlan): string {
  const rows = plan.items.map((i) =>
    `  ${i.name.padEnd(16)} ${formatBytes(i.bytes).padStart(10)}   ${i.note}`
  );
  return ["memory plan", ...rows, `  ${"TOTAL".padEnd(16)} ${formatBytes(plan.total).padStart(10)}`]
    .join("\n");
}
