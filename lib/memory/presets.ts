/**
 * Named memory budgets. A preset is a machine class: the total the plan may use (GB = 1e9
 * bytes), the context it leaves room for, and the prefill chunk (tokens computed at a time
 * inside a pass). The planner (plan.ts) spends the budget the same way
 * for every preset: first the fixed part (process, state, scratch), then the floor (two
 * ring slots, one token's experts of a layer), then what is left on resident trunk bytes
 * (lm_head, pinned layers) and the expert cache. `auto` does the same with what this
 * machine has free. A budget larger than the model keeps everything resident, so on a
 * small model every preset runs resident.
 */
import { k3 } from "../../ffi/library.ts";
import { badInput } from "../errors.ts";

export interface Preset {
  name: string;
  /** The plan's total may not exceed this (GB). */
  budgetGb: number;
  /** Positions (prompt + completion) chat and serve reserve state for by default. */
  context: number;
  /**
   * The prefill chunk: tokens computed at a time inside a pass (MLA attention, an expert's
   * tokens). A prompt's pass is as wide as the rest of the budget holds (plan.ts).
   */
  batch: number;
  note: string;
}

export const PRESETS: Preset[] = [
  {
    name: "ultra",
    budgetGb: 2.9,
    context: 4096,
    batch: 32,
    note: "the floor: every layer and lm_head streamed. Slowest.",
  },
  {
    // 7.7, not 8: on an 8 GB machine (or an 8 GB memory cgroup) the kernel's share of the
    // process (page tables, slab: 149 MB measured in a cgroup on the 93-layer layout) and the
    // page cache of the reads in flight need room too. Planned at 7.99 GB, an 8 GB cgroup
    // killed the run (anon 7.84 GB + kmem 0.15 GB).
    name: "laptop",
    budgetGb: 7.7,
    context: 16384,
    batch: 128,
    note: "8 GB machines (0.3 GB left to the kernel).",
  },
  { name: "desktop", budgetGb: 16, context: 32768, batch: 512, note: "16 GB machines." },
  { name: "workstation", budgetGb: 32, context: 65536, batch: 512, note: "32 GB machines." },
  { name: "server", budgetGb: 64, context: 131072, batch: 512, note: "64 GB machines." },
  {
    name: "max",
    budgetGb: 128,
    context: 131072,
    batch: 512,
    note: "128 GB+: the whole trunk resident, the rest expert cache.",
  },
];

/** The preset called `name`, or bad input listing the choices. */
export function presetByName(name: string): Preset {
  const p = PRESETS.find((x) => x.name === name);
  if (!p) {
    throw badInput(
      `unknown preset '${name}'; choose one of ${PRESETS.map((x) => x.name).join(", ")}, auto`,
    );
  }
  return p;
}

/** auto plans with this share of the machine's usable memory, leaving the rest to it. */
export const AUTO_HEADROOM = 0.9;

/**
 * The --list-presets text. `auto` is the context and prefill chunk the caller uses without
 * a preset (chat and serve); its line shows the budget auto plans with on this machine.
 */
export function formatPresets(auto: { context: number; batch: number }): string {
  const row = (name: string, gb: string, context: number, batch: number, note: string) =>
    `  ${name.padEnd(12)} ${gb.padStart(6)} GB  context ${String(context).padStart(6)}  prefill ${
      String(batch).padStart(3)
    }  ${note}`;
  const rows = PRESETS.map((p) => row(p.name, p.budgetGb.toFixed(1), p.context, p.batch, p.note));
  const avail = machineMemory();
  const from = `MemAvailable ${formatGb(avail.memAvailable)}, cgroup limit ${
    avail.cgroupMax < 0 ? "none" : formatGb(avail.cgroupMax)
  }`;
  const budget = avail.usable * AUTO_HEADROOM / 1e9;
  const like = PRESETS.filter((p) => p.budgetGb <= budget).at(-1);
  const autoRow = avail.usable > 0
    ? row(
      "auto",
      budget.toFixed(1),
      auto.context,
      auto.batch,
      `here: ${AUTO_HEADROOM * 100}% of ${formatGb(avail.usable)} usable (${from})` +
        (like ? `; at least ${like.name}'s budget` : "; below every preset"),
    )
    : `  ${"auto".padEnd(12)} no memory limit known here (${from}): every part is resident`;
  return [
    "presets (total plan budget in GB = 1e9 bytes, positions reserved, tokens per pass):",
    ...rows,
    autoRow,
    "A budget larger than the model keeps that part resident. --memory-max, --trunk-gb and",
    "--cache-gb override a preset (decimals allowed). `k3 doctor MODEL` shows each plan.",
  ].join("\n");
}

function formatGb(n: number): string {
  return n < 0 ? "unknown" : `${(n / 1e9).toFixed(2)} GB`;
}

/** What this machine can give: MemAvailable and the cgroup limit; -1 when unknown. */
interface MachineMemory {
  memAvailable: number;
  cgroupMax: number;
  /** The smaller of the two known values (-1 when neither is known). */
  usable: number;
}

/** Reads MemAvailable and the cgroup memory limit (in libk3: no /proc permission needed). */
export function machineMemory(): MachineMemory {
  const memAvailable = Number(k3().k3_mem_available_bytes());
  const cgroupMax = Number(k3().k3_cgroup_memory_max_bytes());
  const known = [memAvailable, cgroupMax].filter((v) => v > 0);
  return { memAvailable, cgroupMax, usable: known.length ? Math.min(...known) : -1 };
}
