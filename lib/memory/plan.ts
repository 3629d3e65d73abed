/**
 * The memory plan: everything the run will hold, added up before anything is allocated.
 * The resident trunk (pinned layers, lm_head when there is room) and the ring the rest
 * streams through, the expert cache (or every expert), KDA states, the MLA latent cache for
 * the positions of the run, the scratch of one forward pass, the process as it stands
 * (measured RSS) and what the runtime grows by. A plan over the budget is refused (exit 3)
 * before the first allocation.
 */
import type { ModelRefs } from "../checkpoint/types.ts";
import type { K3Config } from "../checkpoint/config.ts";
import { type K3Error, overBudget, type Remedy } from "../errors.ts";
import {
  type BlockLayout,
  type CodedSizes,
  largestPieceRoom,
  PIECE_BYTES,
  type Placement,
} from "../layout/block.ts";
import {
  kdaBytes,
  mlaBytes,
  mlaPositionBytes,
  passRecordBytes,
  passScratchBytes,
  passScratchFloats,
  scratchBytes,
  stateBytes,
} from "../layout/state.ts";
import { formatBytes } from "../io/sizes.ts";
import { expertSlotBytes } from "./experts.ts";
import { AUTO_HEADROOM, machineMemory, type Preset, presetByName } from "./presets.ts";
import { trunkBlocks } from "./sources.ts";
import type { TrunkPlan } from "./trunk.ts";

export { kdaBytes, mlaBytes, scratchBytes, stateBytes };

const GB = 1e9;
/** Ring slots when the planner chooses: one piece computes while the next is read. */
const RING_SLOTS = 2;

/**
 * What the process grows by after planning (V8 heap and JIT code, the widened vectors of
 * streamed layers until they are collected, per-thread allocator arenas, I/O buffers). The
 * plan keeps this so that --memory-max holds against the measured peak (VmHWM).
 */
export const RUNTIME_GROWTH_BYTES = 64e6;

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
  /** How the decoder layers' blocks are placed: for a trunk pack, or for the shards. */
  placement: Placement;
  experts: ExpertPlan;
  /**
   * Most tokens per forward pass (the scratch is sized for it): a pass reads each trunk
   * piece once and each routed expert a layer picks at most once, for all its tokens.
   */
  batch: number;
  /** Tokens computed at a time inside a pass (MLA attention, a routed expert's tokens). */
  chunk: number;
  /** Positions of sequence state reserved. */
  positions: number;
  /** Positions the budget would hold with the trunk and the cache at their floor. */
  maxPositions: number;
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
  /** Piece size in MB (1e6 bytes). */
  pieceMb?: number;
  /** Keep lm_head resident or stream it (default: the planner decides). */
  lmHead?: "resident" | "stream";
  /** Where the trunk is read from (default the shards): its blocks are placed for that. */
  trunkFrom?: "shards" | "pack";
  /** The coded chunk sizes of each layer, when the trunk comes from a coded pack. */
  trunkCoded?: CodedSizes[];
}

/** The run the plan is for. */
export interface RunShape {
  /** Positions the sequence will hold (prompt + gen). */
  positions: number;
  /**
   * The scratch chunk: tokens computed at a time inside a pass (the prefill chunk, or the
   * prompt); without `prefill`, also the most tokens per pass.
   */
  maxBatch: number;
  /**
   * Prompt tokens the caller wants in one layer-major pass (one read of the trunk and of
   * each expert for all of them): the pass is that wide as far as the budget allows, and
   * never narrower than the chunk. Its scratch grows by the hidden states, AttnRes bank and
   * layer activations of every token (layout/state.ts passScratchFloats).
   */
  prefill?: number;
  /**
   * The share (0..1, default 1) of the budget left after the floor (the fixed part, two ring
   * slots, one token's experts) that the pass may take: a caller that does not know its
   * prompts yet (chat, serve) leaves the rest to resident trunk and expert cache.
   */
  prefillShare?: number;
  /** Extra bytes the caller keeps (e.g. --dump-logits rows). */
  extraBytes?: number;
  /**
   * Positions of one verify pass when speculating (1 + draft max): the plan keeps its rewind
   * record and logits rows, and passes at least that many tokens.
   */
  verifyPositions?: number;
  /**
   * Sequences held at once (a server's batch; default 1): each its own KDA state, MLA cache
   * of `positions` positions and, when speculating, verify record.
   */
  sequences?: number;
  /** Prompt states retained for reuse (`--retain`; default 0), each up to `positions`. */
  retained?: number;
  /**
   * Passes may stop within a layer (chat and serve: Ctrl-C, a client leaving): such a pass
   * keeps a copy of its sequence's KDA state to put back when it stops.
   */
  stoppable?: boolean;
}

/** Bytes a resident block holds besides its own: its vectors widened to fp32, kept in JS. */
export function widenedBytes(b: BlockLayout): number {
  let n = 0;
  for (const e of b.entries) {
    if (e.kind !== "vector") continue;
    n += 4 * (e.ref.nbytes / (e.ref.dtype === "F32" ? 4 : 2));
  }
  // Plus the two folded AttnRes score vectors.
  const h = b.entries.find((e) => e.role === "attnRes.norm");
  return n + (h ? 2 * 4 * (h.ref.nbytes / (h.ref.dtype === "F32" ? 4 : 2)) : 0);
}

/** Bytes of a block kept resident. */
function residentBytes(b: BlockLayout): number {
  return b.bytes + widenedBytes(b);
}

/**
 * The trunk plan for `layers` (decoder blocks) and `head` (lm_head) within `budget`: the
 * pinned prefix and lm_head residency that keep the most bytes resident (each one is a byte
 * not read per token), plus ring slots of the largest streamed piece. Two slots (so the
 * next read overlaps the current piece) are preferred over one. Null when nothing fits.
 */
export function planTrunk(
  layers: BlockLayout[],
  head: BlockLayout,
  budget: number,
  pieceBytes: number,
  force: { pin?: number; ring?: number; head?: boolean } = {},
): TrunkPlan | null {
  const n = layers.length;
  const pinned = [0];
  for (const l of layers) pinned.push(pinned[pinned.length - 1] + residentBytes(l));
  const headBytes = residentBytes(head);
  const shape = (p: number, h: boolean, ring: number) => {
    const streamed = [...layers.slice(p), ...(h ? [] : [head])];
    const slotBytes = largestPieceRoom(streamed);
    const ringSlots = streamed.length === 0 ? 0 : ring;
    const plan: TrunkPlan = { pinned: p, headResident: h, ringSlots, slotBytes, pieceBytes };
    return { plan, cost: pinned[p] + (h ? headBytes : 0) + ringSlots * slotBytes };
  };
  const heads = force.head === undefined ? [true, false] : [force.head];
  if (force.pin !== undefined) {
    const p = Math.min(force.pin, n);
    const ring = force.ring ?? RING_SLOTS;
    const fits = heads.map((h) => shape(p, h, ring)).filter((s) => s.cost <= budget);
    return (fits[0] ?? shape(p, heads[heads.length - 1], ring)).plan;
  }
  for (const ring of force.ring !== undefined ? [force.ring] : [RING_SLOTS, 1]) {
    let best: { plan: TrunkPlan; kept: number } | null = null;
    for (const h of heads) {
      for (let p = n; p >= 0; p--) {
        const s = shape(p, h, ring);
        if (s.cost > budget) continue;
        const kept = pinned[p] + (h ? headBytes : 0);
        if (!best || kept > best.kept) best = { plan: s.plan, kept };
        break; // fewer pinned layers keep fewer bytes
      }
    }
    if (best) return best.plan;
  }
  return null;
}

/** Bytes a trunk plan holds: resident blocks and the ring. */
function trunkPlanBytes(layers: BlockLayout[], head: BlockLayout, t: TrunkPlan): number {
  let n = t.ringSlots * t.slotBytes + (t.headResident ? residentBytes(head) : 0);
  for (let i = 0; i < t.pinned; i++) n += residentBytes(layers[i]);
  return n;
}

/** The limit a plan is checked against, and where it came from. */
function budgetOf(req: MemoryRequest, preset?: Preset): { bytes: number; source: string } {
  if (req.memoryMaxGb !== undefined) {
    return { bytes: req.memoryMaxGb * GB, source: "the memory maximum given" };
  }
  if (preset) return { bytes: preset.budgetGb * GB, source: `preset ${preset.name}` };
  const usable = machineMemory().usable;
  return usable > 0
    ? { bytes: usable, source: "available memory (MemAvailable / cgroup memory.max)" }
    : { bytes: 0, source: "unknown (no limit checked)" };
}

/** Shares of the budget the default batch's sequence states and the retained states take. */
const BATCH_SHARE = 0.25;
const RETAIN_SHARE = 0.125;

/**
 * The batch and the retained prompt states a server plans for when the flags do not say: as
 * many sequences (at most `most`) as a quarter of the budget holds at `positions` positions
 * each, at least one; as many retained states (at most `retainMost`) as an eighth holds.
 * Without a known budget, the most. The rest of the budget stays for the trunk and experts.
 */
export function defaultBatch(
  c: K3Config,
  layers: number,
  positions: number,
  req: MemoryRequest,
  most: number,
  retainMost: number,
): { sequences: number; retained: number } {
  const preset = req.preset && req.preset !== "auto" ? presetByName(req.preset) : undefined;
  const budget = budgetOf(req, preset).bytes;
  if (budget <= 0) return { sequences: most, retained: retainMost };
  const one = stateBytes(c, layers, positions) + 4 * c.vocabSize;
  const fit = (share: number) => Math.floor((share * budget) / one);
  return {
    sequences: Math.max(1, Math.min(most, fit(BATCH_SHARE))),
    retained: Math.max(0, Math.min(retainMost, fit(RETAIN_SHARE))),
  };
}

/**
 * Plans the run. Throws exit 3 when the plan exceeds its budget (--memory-max, else the
 * preset's class, else the memory this machine has available) or the memory this machine
 * has, naming the shortfall and the options.
 */
export function planMemory(
  c: K3Config,
  refs: ModelRefs,
  run: RunShape,
  req: MemoryRequest,
  baselineBytes: number,
): MemoryPlan {
  const { plan, refusal } = tryPlan(c, refs, run, req, baselineBytes);
  if (refusal) throw refusal;
  return plan;
}

/**
 * The plan, and the exit-3 error that refuses it when it is over its budget or this
 * machine (for `doctor`, which shows refused plans too). Still throws exit 3 when no plan
 * can be made at all (a trunk budget below one ring slot, a cache below one expert).
 */
export function tryPlan(
  c: K3Config,
  refs: ModelRefs,
  run: RunShape,
  req: MemoryRequest,
  baselineBytes: number,
): { plan: MemoryPlan; refusal?: K3Error; reason?: string } {
  const basis = planBasis(c, refs, run, req);
  // A verify pass writes latent rows up to its draft count past the last kept position.
  const statePositions = run.positions + Math.max(0, basis.verify - 1);
  const budget = budgetOf(req, basis.preset);
  const machine = machineMemory().usable;
  const sizing = budget.bytes > 0
    ? (basis.preset || req.memoryMaxGb !== undefined ? budget.bytes : budget.bytes * AUTO_HEADROOM)
    : Infinity;
  const b = {
    ...basis,
    batch: prefillPassTokens(basis, run, req, baselineBytes, statePositions, sizing),
  };
  const fixed = fixedItems(b, run, baselineBytes, statePositions);
  const free = sizing - sumBytes(fixed);
  const trunk = chooseTrunk(b, req, free);
  const trunkBytes = trunkPlanBytes(b.layers, b.head, trunk);
  const cacheBudget = req.cacheGb !== undefined ? req.cacheGb * GB : Math.max(0, free - trunkBytes);
  const experts = planExperts(
    b.allExperts,
    b.expertsTotal,
    b.slotBytes,
    cacheBudget,
    req.cacheSlots ?? (req.cacheGb !== undefined || cacheBudget >= b.slotBytes ? undefined : 1),
  );
  const items = [...trunkAndExpertItems(b, trunk, trunkBytes, experts), ...fixed];
  const total = sumBytes(items);
  const limit = Math.min(...[budget.bytes, machine].filter((x) => x > 0), Infinity);
  const plan: MemoryPlan = {
    items,
    total,
    budget: budget.bytes,
    budgetSource: budget.source,
    source: req.trunkGb !== undefined || req.cacheGb !== undefined ? "flags" : req.preset ?? "auto",
    trunk,
    placement: b.placement,
    experts,
    batch: b.batch,
    chunk: b.chunk,
    positions: run.positions,
    maxPositions: maxPositionsWithin(b, run, baselineBytes, limit),
  };
  if (budget.bytes > 0 && total > budget.bytes) {
    return refuseOver(plan, b, budget.bytes, budget.source);
  }
  if (machine > 0 && total > machine && req.memoryMaxGb === undefined) {
    return refuseOver(plan, b, machine, "available memory (MemAvailable / cgroup memory.max)");
  }
  return { plan };
}

/** What a plan is made from: the checkpoint's trunk blocks and experts, and the run's shape. */
interface PlanBasis {
  c: K3Config;
  nLayers: number;
  pieceBytes: number;
  placement: Placement;
  blocks: BlockLayout[];
  /** The decoder blocks, and lm_head (the last block). */
  layers: BlockLayout[];
  head: BlockLayout;
  trunkTotal: number;
  moeLayers: number;
  allExperts: number;
  expertsTotal: number;
  slotBytes: number;
  /** The floor of the expert cache: one token's experts of one layer. */
  cacheFloor: number;
  preset?: Preset;
  verify: number;
  seqs: number;
  retained: number;
  /** Tokens computed at a time inside a pass (MLA attention, a routed expert's tokens). */
  chunk: number;
  /** Most tokens per forward pass: the chunk, or a layer-major prefill pass as wide as fits. */
  batch: number;
}

function planBasis(c: K3Config, refs: ModelRefs, run: RunShape, req: MemoryRequest): PlanBasis {
  const nLayers = refs.layers.length;
  const pieceBytes = req.pieceMb !== undefined ? Math.round(req.pieceMb * 1e6) : PIECE_BYTES;
  const placement: Placement = req.trunkFrom === "pack" ? "packed" : "file";
  const blocks = trunkBlocks(refs, pieceBytes, placement, req.trunkCoded);
  const moeLayers = refs.layers.filter((l) => l.moe).length;
  const allExperts = moeLayers * c.numExperts;
  const slotBytes = moeLayers ? expertSlotBytes(refs) : 0;
  // Resident experts load into blocks of their own, as cache slots do (memory/loading_experts.ts).
  const expertsTotal = allExperts * slotBytes;
  const preset = req.preset && req.preset !== "auto" ? presetByName(req.preset) : undefined;
  const verify = run.verifyPositions ?? 0;
  const seqs = Math.max(1, run.sequences ?? 1);
  // One pass holds every sequence's decode step (or verify pass).
  const chunk = Math.max(
    1,
    seqs * Math.max(1, verify),
    Math.min(run.maxBatch, preset?.batch ?? Infinity),
  );
  return {
    c,
    nLayers,
    pieceBytes,
    placement,
    blocks,
    layers: blocks.slice(0, nLayers),
    head: blocks[nLayers],
    trunkTotal: blocks.reduce((a, b) => a + residentBytes(b), 0),
    moeLayers,
    allExperts,
    expertsTotal,
    slotBytes,
    cacheFloor: Math.min(c.topK, allExperts) * slotBytes,
    preset,
    verify,
    seqs,
    retained: Math.max(0, run.retained ?? 0),
    chunk,
    batch: chunk,
  };
}

function sumBytes(items: PlanItem[]): number {
  return items.reduce((a, i) => a + i.bytes, 0);
}

/** What the plan holds whatever the trunk and experts: states, buffers, the process itself. */
function fixedItems(
  b: PlanBasis,
  run: RunShape,
  baselineBytes: number,
  positions: number,
): PlanItem[] {
  const { c, nLayers, seqs, retained, verify, batch, chunk } = b;
  const times = seqs > 1 ? `${seqs} x ` : "";
  return [
    {
      name: "KDA state",
      bytes: seqs * kdaBytes(c, nLayers),
      note: `${seqs > 1 ? `${seqs} sequences: ` : ""}recurrent state + conv history`,
    },
    ...(run.stoppable
      ? [{
        name: "KDA stop copy",
        bytes: kdaBytes(c, nLayers),
        note: "KDA state a pass that Ctrl-C may stop keeps to put back",
      }]
      : []),
    {
      name: "MLA cache",
      bytes: seqs * mlaBytes(c, nLayers, positions),
      note: `latent cache for ${times}${positions} positions`,
    },
    ...(retained > 0
      ? [{
        name: "retained states",
        bytes: retained * (stateBytes(c, nLayers, positions) + 4 * c.vocabSize),
        note: `${retained} prompt states kept for reuse, up to ${positions} positions`,
      }]
      : []),
    {
      name: "buffers",
      bytes: passScratchBytes(c, nLayers, batch, chunk) + (run.extraBytes ?? 0),
      note: batch > chunk
        ? `scratch for ${batch} tokens per pass (hidden states, bank, activations), ` +
          `${chunk} at a time per expert and attention, embedding rows, logits`
        : `scratch for ${batch} tokens per pass, embedding rows, logits`,
    },
    ...(verify > 0
      ? [{
        name: "speculation",
        bytes: seqs * (passRecordBytes(c, nLayers, verify) + verify * c.vocabSize * 4),
        note: `rewind record and logits of ${times}a ${verify}-position verify pass`,
      }]
      : []),
    { name: "baseline", bytes: baselineBytes, note: "this process before loading (measured RSS)" },
    { name: "runtime growth", bytes: RUNTIME_GROWTH_BYTES, note: "JS heap, JIT, arenas" },
  ];
}

/**
 * The trunk within `free` bytes less what the experts need (the flags' trunk budget when
 * given). Throws exit 3 when an explicit trunk budget cannot hold one ring slot.
 */
function chooseTrunk(b: PlanBasis, req: MemoryRequest, free: number): TrunkPlan {
  const { layers, head, pieceBytes } = b;
  const explicitTrunk = req.trunkGb !== undefined;
  let trunkBudget = req.trunkGb !== undefined ? req.trunkGb * GB : undefined;
  if (trunkBudget === undefined) {
    const cacheNeed = req.cacheGb !== undefined
      ? req.cacheGb * GB
      : b.trunkTotal + b.expertsTotal <= free
      ? b.expertsTotal
      : b.cacheFloor;
    trunkBudget = Math.max(0, free - cacheNeed);
  }
  const force = {
    pin: req.pinLayers,
    ring: req.ringSlots,
    head: req.lmHead === undefined ? undefined : req.lmHead === "resident",
  };
  // Without an explicit trunk budget, fall back to the smallest trunk (one ring slot): the
  // total check then names the whole shortfall.
  const trunk = planTrunk(layers, head, trunkBudget, pieceBytes, force) ??
    (explicitTrunk ? null : planTrunk(layers, head, 0, pieceBytes, {
      pin: force.pin ?? 0,
      ring: force.ring ?? 1,
      head: force.head ?? false,
    }));
  if (!trunk) {
    const slot = largestPieceRoom(b.blocks);
    throw refuse(
      `the trunk budget ${formatBytes(trunkBudget)} cannot hold one ring slot ` +
        `(${formatBytes(slot)}, the largest piece).`,
      [
        { option: "trunkGb", words: `a trunk budget of at least ${formatBytes(slot)}` },
        LARGER_PRESET,
        LARGER_BUDGET,
      ],
    );
  }
  return trunk;
}

/** The plan's rows for the trunk (pinned, lm_head, ring) and the experts. */
function trunkAndExpertItems(
  b: PlanBasis,
  trunk: TrunkPlan,
  trunkBytes: number,
  experts: ExpertPlan,
): PlanItem[] {
  const { c, head } = b;
  const expertBytes = experts.mode === "resident" ? b.expertsTotal : experts.slots * b.slotBytes;
  const pinnedBytes = trunkBytes - trunk.ringSlots * trunk.slotBytes -
    (trunk.headResident ? residentBytes(head) : 0);
  return [
    {
      name: "trunk pinned",
      bytes: pinnedBytes,
      note: `${trunk.pinned}/${b.nLayers} layers resident`,
    },
    {
      name: "lm_head",
      bytes: trunk.headResident ? residentBytes(head) : 0,
      note: trunk.headResident
        ? "resident"
        : `streamed through the ring in ${head.pieces.length} row block(s)`,
    },
    {
      name: "trunk ring",
      bytes: trunk.ringSlots * trunk.slotBytes,
      note: `${trunk.ringSlots} slot(s) x ${formatBytes(trunk.slotBytes)} ` +
        `(pieces of at most ${formatBytes(b.pieceBytes)})`,
    },
    {
      name: experts.mode === "resident" ? "experts" : "expert cache",
      bytes: expertBytes,
      note: experts.mode === "resident"
        ? `${b.moeLayers} x ${c.numExperts} resident`
        : `${experts.slots} slots x ${formatBytes(experts.slotBytes)} of ${b.allExperts} experts`,
    },
  ];
}

/**
 * Positions of context `limit` bytes would hold with the same fixed part and the smallest
 * trunk and cache; every sequence and retained state may hold that many.
 */
function maxPositionsWithin(
  b: PlanBasis,
  run: RunShape,
  baselineBytes: number,
  limit: number,
): number {
  const { layers, head, pieceBytes } = b;
  const floorTrunk = planTrunk(layers, head, 0, pieceBytes, { pin: 0, ring: 1, head: false })!;
  const floorBytes = sumBytes(fixedItems(b, run, baselineBytes, 0)) +
    trunkPlanBytes(layers, head, floorTrunk) + Math.min(b.cacheFloor, b.expertsTotal);
  const perPosition = (b.seqs + b.retained) * mlaPositionBytes(b.c, b.nLayers);
  return perPosition === 0 || limit === Infinity
    ? Number.MAX_SAFE_INTEGER
    : Math.max(0, Math.floor((limit - floorBytes) / perPosition));
}

/** The refusal of a plan over `limitBytes`, naming the shortfall and what to change. */
function refuseOver(
  plan: MemoryPlan,
  b: PlanBasis,
  limitBytes: number,
  source: string,
): { plan: MemoryPlan; refusal: K3Error; reason: string } {
  const total = plan.total;
  const reason = `the plan needs ${formatBytes(total)} but the budget is ` +
    `${formatBytes(limitBytes)} (${source}): a shortfall of ${formatBytes(total - limitBytes)}`;
  const refusal = refuse(`${formatPlan(plan)}\n${reason}.`, [
    { option: "preset", words: "a smaller preset" },
    { option: "trunkGb/cacheGb", words: "a smaller trunk or expert cache budget" },
    { option: "context", words: "a shorter context" },
    ...(b.seqs > 1 || b.retained > 0
      ? [{ option: "sequences/retained", words: "fewer sequences at once or retained states" }]
      : []),
    { option: "memoryMaxGb", words: `a memory budget of at least ${formatBytes(total)}` },
  ]);
  return { plan, refusal, reason };
}

/**
 * Tokens of the plan's pass: the chunk, or for a layer-major prefill of `run.prefill` tokens as
 * many as `run.prefillShare` of what the budget leaves above the floor (the fixed part with a
 * pass of one chunk, the smallest trunk and cache) holds, never fewer than the chunk.
 */
function prefillPassTokens(
  b: PlanBasis,
  run: RunShape,
  req: MemoryRequest,
  baselineBytes: number,
  statePositions: number,
  sizing: number,
): number {
  if (run.prefill === undefined || run.prefill <= b.chunk) return b.chunk;
  const floor = sumBytes(fixedItems(b, run, baselineBytes, statePositions)) +
    (req.trunkGb !== undefined
      ? req.trunkGb * GB
      : ringFloorBytes(b.layers, b.head, b.pieceBytes)) +
    (req.cacheGb !== undefined ? req.cacheGb * GB : Math.min(b.cacheFloor, b.expertsTotal));
  const share = Math.max(0, Math.min(1, run.prefillShare ?? 1));
  let room = sizing - floor;
  // Every decode step reads what is not resident: where the whole trunk fits, a pass of a
  // prompt not known yet (share < 1) takes its share of what is left beyond it, never a
  // pinned layer; where it does not fit, its share of everything above the floor.
  const wholeTrunk = b.trunkTotal - ringFloorBytes(b.layers, b.head, b.pieceBytes);
  if (share < 1 && req.trunkGb === undefined && room > wholeTrunk) room -= wholeTrunk;
  return prefillWidth(
    run.prefill,
    b.chunk,
    4 * passScratchFloats(b.c, b.nLayers).wide,
    share * room,
  );
}

/** Bytes of the smallest trunk the planner prefers: nothing pinned, two ring slots. */
function ringFloorBytes(layers: BlockLayout[], head: BlockLayout, pieceBytes: number): number {
  const floor = planTrunk(layers, head, 0, pieceBytes, { pin: 0, ring: RING_SLOTS, head: false });
  return trunkPlanBytes(layers, head, floor!);
}

/**
 * Tokens of a layer-major pass: `prefill` when `room` (bytes beyond the chunk's plan) holds
 * their scratch at `perToken` bytes each, else as many as it holds, never fewer than `chunk`.
 */
export function prefillWidth(prefill: number, chunk: number, perToken: number, room: number) {
  if (room === Infinity) return prefill;
  return Math.max(chunk, Math.min(prefill, chunk + Math.floor(Math.max(0, room) / perToken)));
}

function planExperts(
  allExperts: number,
  expertsTotal: number,
  slotBytes: number,
  cacheBudget: number,
  forceSlots?: number,
): ExpertPlan {
  if (allExperts === 0) return { mode: "resident", slots: 0, slotBytes: 0 };
  if (forceSlots !== undefined) return { mode: "cache", slots: forceSlots, slotBytes };
  if (expertsTotal <= cacheBudget) return { mode: "resident", slots: 0, slotBytes: 0 };
  const slots = Math.min(Math.floor(cacheBudget / slotBytes), allExperts);
  if (slots < 1) {
    throw refuse(
      `the expert cache budget ${formatBytes(cacheBudget)} cannot hold one expert ` +
        `(${formatBytes(slotBytes)}).`,
      [
        {
          option: "cacheGb",
          words: `an expert cache budget of at least ${formatBytes(slotBytes)}`,
        },
        LARGER_PRESET,
        LARGER_BUDGET,
      ],
    );
  }
  return { mode: "cache", slots, slotBytes };
}

const LARGER_PRESET: Remedy = { option: "preset", words: "a larger preset" };
const LARGER_BUDGET: Remedy = { option: "memoryMaxGb", words: "a larger memory budget" };

/**
 * The exit-3 refusal: what is wrong, then each change that would help, in words (the CLI
 * adds its flag to each; a script sees the option's name in `remedies`).
 */
function refuse(what: string, remedies: Remedy[]): K3Error {
  const last = remedies.length - 1;
  const list = remedies.map((r, i) => (i === last && i > 0 ? `or ${r.words}` : r.words));
  return overBudget(`${what} Options: ${list.join(", ")}. Nothing was allocated.`, { remedies });
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
