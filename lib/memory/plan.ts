/**
 * The memory plan: everything the run will hold, added up before anything is allocated.
 * Pinned trunk + ring, embed + lm_head, the expert cache (or every expert), KDA states, the
 * MLA latent cache for prompt + gen positions, scratch buffers, and the process as it stands
 * (measured RSS). A plan over the budget is refused (exit 3) before the first allocation.
 */
import type { ModelRefs } from "../checkpoint/types.ts";
import type { K3Config } from "../config.ts";
import { overBudget } from "../errors.ts";
import { kdaStateBytes, mlaRowWidth } from "../model/state.ts";
import { formatBytes } from "../report.ts";
import { expertSlotBytes } from "./experts.ts";
import { machineMemory, presetByName } from "./presets.ts";
import { expertBlockBytes, trunkBlockBytes } from "./sources.ts";
import type { TrunkPlan } from "./trunk.ts";

const GB = 1e9;
/** auto leaves this share of free memory to the rest of the machine. */
const AUTO_HEADROOM = 0.9;

export interface PlanItem {
  name: string;
  bytes: number;
  note: string;
}

/** How the experts are held: all resident, or a cache of `slots` slots. */
export interface ExpertPlan {
  mode: "resident" | "cache";
  slots: number;
  slotBytes: number;
}

export interface MemoryPlan {
  items: PlanItem[];
  total: number;
  /** The limit the plan was checked against, and where it came from. */
  budget: number;
  budgetSource: string;
  /** "auto", a preset name, or "flags". */
  source: string;
  trunk: TrunkPlan;
  experts: ExpertPlan;
}

/** What the user asked for; every field optional. */
export interface MemoryRequest {
  preset?: string;
  trunkGb?: number;
  cacheGb?: number;
  memoryMaxGb?: number;
  pinLayers?: number;
  ringSlots?: number;
  cacheSlots?: number;
}

/** The run the plan is for. */
export interface RunShape {
  /** Positions the sequence will hold (prompt + gen). */
  positions: number;
  /** Most tokens in one forward call (the prefill chunk, or the whole prompt). */
  maxBatch: number;
  /** Extra bytes the caller keeps (e.g. --dump-logits rows). */
  extraBytes?: number;
}

/** Bytes of the KDA states of the first `layers` layers. */
export function kdaBytes(c: K3Config, layers: number): number {
  return c.layerKinds.slice(0, layers).filter((k) => k === "kda").length * kdaStateBytes(c);
}

/** Bytes of the MLA latent cache of the first `layers` layers for `positions` positions. */
export function mlaBytes(c: K3Config, layers: number, positions: number): number {
  const mla = c.layerKinds.slice(0, layers).filter((k) => k === "mla").length;
  return mla * 4 * positions * mlaRowWidth(c);
}

/** Sequence state for `positions` positions: KDA states plus the MLA latent cache. */
export function stateBytes(c: K3Config, layers: number, positions: number): number {
  return kdaBytes(c, layers) + mlaBytes(c, layers, positions);
}

/** Scratch of one forward call over T tokens (forward.ts's buffers, fp32), plus logits. */
export function scratchBytes(c: K3Config, layers: number, T: number): number {
  const H = c.hiddenSize, C = c.kda.numHeads * c.kda.headDim, d = c.kda.headDim;
  const nh = c.numHeads, w = mlaRowWidth(c), L = c.latentSize, k = c.topK;
  const Is = c.numSharedExperts * c.moeIntermediateSize;
  const bankRows = Math.ceil(layers / c.attnResBlockSize);
  const perToken = H * (bankRows + 5) + // bank, p, h, xn, attn.out, moe.routed
    C * 6 + d + c.kda.numHeads + // KDA
    c.qLoraRank + nh * (c.qkNopeHeadDim + c.qkRopeHeadDim) + nh * w + nh * c.kvLoraRank +
    2 * nh * c.vHeadDim + // MLA
    2 * c.intermediateSize + H + // dense MLP
    c.numExperts + k + 2 * L + k * L + 2 * Is + H + // router, latent, shared MLP
    2 * L + 2 * c.moeIntermediateSize; // one expert's inputs and outputs
  return 4 * (T * perToken + 2 * c.vocabSize);
}

/** Bytes of every trunk layer's block. */
function trunkBlocks(refs: ModelRefs): number[] {
  return refs.layers.map(trunkBlockBytes);
}

/**
 * Pinned count and ring slot size depend on each other (the slot must hold the largest
 * streamed layer), so search for the fixed point: the most pinned layers whose pinned bytes
 * plus `ring` slots of the largest remaining layer fit in `budget`. Two ring slots (so the
 * next read overlaps the current layer) are preferred over one; everything fits: all pinned.
 */
export function planTrunk(
  blocks: number[],
  budget: number,
  force: { pin?: number; ring?: number } = {},
): TrunkPlan | null {
  const n = blocks.length;
  const pinnedBytes = (p: number) => blocks.slice(0, p).reduce((a, b) => a + b, 0);
  const slotOf = (p: number) => Math.max(0, ...blocks.slice(p));
  if (force.pin !== undefined) {
    const pinned = Math.min(force.pin, n);
    const ringSlots = pinned === n ? 0 : Math.min(force.ring ?? 2, n - pinned);
    return { pinned, ringSlots, slotBytes: slotOf(pinned) };
  }
  if (force.ring === undefined && pinnedBytes(n) <= budget) {
    return { pinned: n, ringSlots: 0, slotBytes: 0 };
  }
  for (const ring of force.ring !== undefined ? [force.ring] : [2, 1]) {
    for (let p = n - 1; p >= 0; p--) {
      const r = Math.min(ring, n - p);
      if (pinnedBytes(p) + r * slotOf(p) <= budget) {
        return { pinned: p, ringSlots: r, slotBytes: slotOf(p) };
      }
    }
  }
  return null;
}

/**
 * Plans the run. Throws exit 3 when the plan exceeds --memory-max (or, without it, the
 * memory this machine has available), naming the shortfall and the options.
 */
/**
 * What the Deno process itself grows by after loading (V8 heap, JIT code, I/O buffers): the
 * measured peak RSS ran 12-15 MB above the rest of the plan on the tiny model, so the plan
 * keeps 24 MB for it and --memory-max holds against the measured peak.
 */
export const RUNTIME_GROWTH_BYTES = 24e6;

export function planMemory(
  c: K3Config,
  refs: ModelRefs,
  run: RunShape,
  req: MemoryRequest,
  baselineBytes: number,
): MemoryPlan {
  const layers = refs.layers.length;
  const blocks = trunkBlocks(refs);
  const trunkTotal = blocks.reduce((a, b) => a + b, 0);
  const moeLayers = refs.layers.filter((l) => l.moe).length;
  const expertsTotal = moeLayers * c.numExperts * expertBlockBytes(refs);
  const slotBytes = moeLayers ? expertSlotBytes(refs) : 0;
  const head = refs.embed.nbytes + refs.lmHead.nbytes;
  const fixed: PlanItem[] = [
    { name: "embed + lm_head", bytes: head, note: "resident" },
    { name: "KDA state", bytes: kdaBytes(c, layers), note: "recurrent state + conv history" },
    {
      name: "MLA cache",
      bytes: mlaBytes(c, layers, run.positions),
      note: `latent cache for ${run.positions} positions`,
    },
    {
      name: "buffers",
      bytes: scratchBytes(c, layers, run.maxBatch) + (run.extraBytes ?? 0),
      note: `scratch for ${run.maxBatch} tokens per call`,
    },
    { name: "baseline", bytes: baselineBytes, note: "this process before loading (measured RSS)" },
    { name: "runtime growth", bytes: RUNTIME_GROWTH_BYTES, note: "JS heap and JIT during the run" },
  ];
  const fixedBytes = fixed.reduce((a, i) => a + i.bytes, 0);

  const machine = machineMemory();
  const budget = req.memoryMaxGb !== undefined ? req.memoryMaxGb * GB : machine.usable;
  const budgetSource = req.memoryMaxGb !== undefined
    ? "--memory-max"
    : machine.usable > 0
    ? "available memory (MemAvailable / cgroup memory.max)"
    : "unknown (no limit checked)";

  // Budgets for the two dials: flags, else the preset, else auto from what is left.
  const preset = req.preset && req.preset !== "auto" ? presetByName(req.preset) : undefined;
  const explicitTrunk = req.trunkGb !== undefined || preset !== undefined;
  const explicitCache = req.cacheGb !== undefined || preset !== undefined;
  let trunkBudget = req.trunkGb !== undefined
    ? req.trunkGb * GB
    : preset
    ? preset.trunkGb * GB
    : undefined;
  let cacheBudget = req.cacheGb !== undefined
    ? req.cacheGb * GB
    : preset
    ? preset.cacheGb * GB
    : undefined;
  const free = budget > 0
    ? (req.memoryMaxGb !== undefined ? budget : budget * AUTO_HEADROOM) - fixedBytes
    : Infinity;
  if (trunkBudget === undefined) {
    const cacheNeed = cacheBudget ??
      (trunkTotal + expertsTotal <= free ? expertsTotal : 2 * c.topK * slotBytes);
    trunkBudget = Math.max(0, free - cacheNeed);
  }
  // Without an explicit trunk budget, fall back to the smallest trunk (one ring slot): the
  // total check below then names the whole shortfall.
  const trunk = planTrunk(blocks, trunkBudget, { pin: req.pinLayers, ring: req.ringSlots }) ??
    (explicitTrunk ? null : planTrunk(blocks, 0, { pin: 0, ring: 1 }));
  if (!trunk) {
    throw overBudget(
      `the trunk budget ${formatBytes(trunkBudget)} cannot hold one ring slot ` +
        `(${formatBytes(Math.max(...blocks))}, the largest layer). Options: a larger --trunk-gb, ` +
        `a larger preset, or more --memory-max.`,
    );
  }
  const trunkBytes = blocks.slice(0, trunk.pinned).reduce((a, b) => a + b, 0) +
    trunk.ringSlots * trunk.slotBytes;
  cacheBudget ??= Math.max(0, free - trunkBytes);
  const experts = planExperts(
    c,
    moeLayers,
    expertsTotal,
    slotBytes,
    cacheBudget,
    req.cacheSlots ?? (explicitCache || cacheBudget >= slotBytes ? undefined : 1),
  );

  const items: PlanItem[] = [
    {
      name: "trunk pinned",
      bytes: trunkBytes - trunk.ringSlots * trunk.slotBytes,
      note: `${trunk.pinned}/${layers} layers resident`,
    },
    {
      name: "trunk ring",
      bytes: trunk.ringSlots * trunk.slotBytes,
      note: `${trunk.ringSlots} slot(s) x ${formatBytes(trunk.slotBytes)}`,
    },
    {
      name: experts.mode === "resident" ? "experts" : "expert cache",
      bytes: experts.mode === "resident" ? expertsTotal : experts.slots * experts.slotBytes,
      note: experts.mode === "resident"
        ? `${moeLayers} x ${c.numExperts} resident`
        : `${experts.slots} slots x ${formatBytes(experts.slotBytes)} of ${
          moeLayers * c.numExperts
        } experts`,
    },
    ...fixed,
  ];
  const total = items.reduce((a, i) => a + i.bytes, 0);
  const plan: MemoryPlan = {
    items,
    total,
    budget,
    budgetSource,
    source: req.trunkGb !== undefined || req.cacheGb !== undefined ? "flags" : req.preset ?? "auto",
    trunk,
    experts,
  };
  if (budget > 0 && total > budget) {
    throw overBudget(
      `${formatPlan(plan)}\nthe plan needs ${formatBytes(total)} but the budget is ` +
        `${formatBytes(budget)} (${budgetSource}): a shortfall of ${
          formatBytes(total - budget)
        }. ` +
        `Options: a smaller preset (see --list-presets), smaller --trunk-gb / --cache-gb, ` +
        `or more --memory-max. Nothing was allocated.`,
    );
  }
  return plan;
}

function planExperts(
  c: K3Config,
  moeLayers: number,
  expertsTotal: number,
  slotBytes: number,
  cacheBudget: number,
  forceSlots?: number,
): ExpertPlan {
  if (moeLayers === 0) return { mode: "resident", slots: 0, slotBytes: 0 };
  if (forceSlots !== undefined) return { mode: "cache", slots: forceSlots, slotBytes };
  if (expertsTotal <= cacheBudget) return { mode: "resident", slots: 0, slotBytes: 0 };
  const slots = Math.min(Math.floor(cacheBudget / slotBytes), moeLayers * c.numExperts);
  if (slots < 1) {
    throw overBudget(
      `the expert cache budget ${formatBytes(cacheBudget)} cannot hold one expert ` +
        `(${
          formatBytes(slotBytes)
        }). Options: a larger --cache-gb, a larger preset, or more --memory-max.`,
    );
  }
  return { mode: "cache", slots, slotBytes };
}

/** The plan as a small table. */
export function formatPlan(plan: MemoryPlan): string {
  const rows = plan.items.map((i) =>
    `  ${i.name.padEnd(16)} ${formatBytes(i.bytes).padStart(10)}   ${i.note}`
  );
  const budget = plan.budget > 0 ? formatBytes(plan.budget) : "unknown";
  return [
    `memory plan (${plan.source})`,
    ...rows,
    `  ${"TOTAL".padEnd(16)} ${formatBytes(plan.total).padStart(10)}`,
    `  ${"budget".padEnd(16)} ${budget.padStart(10)}   ${plan.budgetSource}`,
  ].join("\n");
}
