/**
 * Named memory budgets. A preset fixes the trunk and expert-cache budgets (GB = 1e9 bytes);
 * `auto` sizes both from what this machine has free (see plan.ts). A budget larger than the
 * model simply keeps that part resident, so on a small model every preset runs resident.
 */
import { k3 } from "../../ffi/library.ts";
import { badInput } from "../errors.ts";

export interface Preset {
  name: string;
  trunkGb: number;
  cacheGb: number;
  note: string;
}

export const PRESETS: Preset[] = [
  {
    name: "ultra",
    trunkGb: 2.5,
    cacheGb: 0.31,
    note: "~3 GB plus state; trunk streamed. Slowest.",
  },
  { name: "laptop", trunkGb: 3, cacheGb: 1, note: "fits an 8 GB machine." },
  { name: "desktop", trunkGb: 16, cacheGb: 10, note: "for 32 GB machines." },
  {
    name: "workstation",
    trunkGb: 60,
    cacheGb: 30,
    note: "for 96 GB+; the expert cache starts to matter.",
  },
  { name: "server", trunkGb: 110, cacheGb: 13, note: "for 128 GB+; most trunk layers pinned." },
  {
    name: "max",
    trunkGb: 110,
    cacheGb: 109,
    note: "for 224 GB+; trunk pinned, large expert cache.",
  },
];

/** The preset called `name`, or bad input listing the choices. */
export function presetByName(name: string): Preset {
  const p = PRESETS.find((x) => x.name === name);
  if (!p) {
    throw badInput(
      `--preset: unknown preset '${name}'; choose one of ${
        PRESETS.map((x) => x.name).join(", ")
      }, auto`,
    );
  }
  return p;
}

/** The --list-presets text. */
export function formatPresets(): string {
  const rows = PRESETS.map((p) =>
    `  ${p.name.padEnd(12)} ${p.trunkGb.toFixed(2).padStart(7)} / ${
      p.cacheGb.toFixed(2).padEnd(7)
    } ${p.note}`
  );
  const avail = machineMemory();
  return [
    "presets (trunk / expert cache, in GB = 1e9 bytes):",
    ...rows,
    `  ${"auto".padEnd(12)} sizes both from free memory: ${formatGb(avail.usable)} usable here` +
    ` (MemAvailable ${formatGb(avail.memAvailable)}, cgroup limit ${
      avail.cgroupMax < 0 ? "none" : formatGb(avail.cgroupMax)
    })`,
    "A budget larger than the model keeps that part resident. --trunk-gb, --cache-gb and",
    "--memory-max override a preset (decimals allowed).",
  ].join("\n");
}

function formatGb(n: number): string {
  return n < 0 ? "unknown" : `${(n / 1e9).toFixed(2)} GB`;
}

/** What this machine can give: MemAvailable and the cgroup limit; -1 when unknown. */
export interface MachineMemory {
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
