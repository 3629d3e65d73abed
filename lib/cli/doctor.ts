/**
 * `k3 doctor [MODEL_DIR]`: what this machine is, and which presets fit it, before a long
 * download or a long run. With a model folder, every preset is planned for real against it,
 * from the same baseline `run` measures (checkpoint and tokenizer open, nothing loaded).
 */
import { k3Isa, k3Threads, k3Version } from "../../ffi/library.ts";
import { badInput, ExitCode, K3Error } from "../errors.ts";
import {
  baselineBytes,
  DEFAULT_CONTEXT,
  type ModelFiles,
  openModelFiles,
  tryPlanFor,
} from "../engine/open.ts";
import type { MemoryPlan } from "../memory/plan.ts";
import { openTrunkPack, packCodec, packCodedSizes, type TrunkPack } from "../layout/pack.ts";
import { machineMemory, PRESETS } from "../memory/presets.ts";
import { formatBytes } from "../io/sizes.ts";
import { VERSION } from "../version.ts";
import { applyThreads, intFlag, parseCommand } from "./flags.ts";
import { withFlagNames } from "./remedies.ts";

const HELP = `usage: k3 doctor [MODEL_DIR] [--trunk DIR] [--context N] [--threads N]

Prints the machine (SIMD path, threads, memory, cgroup limit). With MODEL_DIR, plans every
preset against that checkpoint: the plan's total and its parts, the context it reserves
(each preset's own, or --context N for all) and the most it could hold, and why a preset
that does not fit here does not.

options:
  --trunk DIR   plan with this trunk pack (k3 pack), as run --trunk DIR does: a coded
                pack's layers are smaller, so a budget pins more of them
  --context N   positions every preset reserves (default: each preset's own)
  --threads N   OpenMP threads (default: OMP_NUM_THREADS or all cores)
`;

/** The flags `k3 doctor` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  trunk: { type: "string" },
  context: { type: "string" },
  threads: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

export async function doctorCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  applyThreads(values.threads);
  if (positionals.length === 0 && values.trunk !== undefined) {
    throw badInput(
      "k3 doctor: --trunk DIR plans with a trunk pack, so it needs the checkpoint it was " +
        "packed from: k3 doctor MODEL_DIR --trunk DIR",
    );
  }
  const mem = machineMemory();
  const known = (n: number) => (n > 0 ? formatBytes(n) : "none");
  console.log(`k3 ${VERSION} (${k3Version()}) on ${Deno.build.os}/${Deno.build.arch}`);
  console.log(`kernels      ${k3Isa()} path, ${k3Threads()} OpenMP threads`);
  console.log(
    `memory       MemAvailable ${known(mem.memAvailable)}, cgroup limit ${known(mem.cgroupMax)}`,
  );
  if (positionals.length === 0) return ExitCode.ok;
  const fixed = values.context === undefined
    ? undefined
    : intFlag("context", values.context, DEFAULT_CONTEXT, 2, 1 << 24);
  // The tokenizer too, as run, chat and serve have it loaded when they plan.
  const files = await openModelFiles(positionals[0], { tokenizer: "optional" });
  try {
    const pack = values.trunk === undefined
      ? undefined
      : await openTrunkPack(values.trunk, files.checkpoint);
    const baseline = baselineBytes();
    printModel(files, baseline);
    if (pack) printPack(pack);
    printPlans(files, fixed, baseline, pack);
  } finally {
    files.tokenizer?.free();
  }
  return ExitCode.ok;
}

/** The checkpoint's shape and size, and the baseline every plan counts. */
function printModel(files: ModelFiles, baseline: number): void {
  const ckpt = files.checkpoint, c = ckpt.config;
  const shards = ckpt.shards.reduce((a, f) => a + Deno.statSync(f).size, 0);
  console.log(
    `model        ${c.numLayers} layers, hidden ${c.hiddenSize}, ${c.numExperts} experts ` +
      `top-${c.topK}, ${ckpt.shards.length} shards, ${formatBytes(shards)}; ` +
      `opened in ${files.openSeconds.toFixed(2)} s`,
  );
  console.log(
    `baseline     ${formatBytes(baseline)} resident after opening (every plan counts ` +
      `it, as run does)`,
  );
}

/** The trunk pack the plans use. */
function printPack(pack: TrunkPack): void {
  const codec = packCodec(pack.index);
  console.log(
    `trunk pack   ${pack.dir}: codec ${codec}${
      codec === "none" ? " (BF16 as in the shards)" : " (the plans count its coded sizes)"
    }`,
  );
}

/**
 * Every preset planned for real against the checkpoint (and its trunk pack, if given),
 * fitting or not, and why not.
 */
function printPlans(
  files: ModelFiles,
  fixed: number | undefined,
  baseline: number,
  pack?: TrunkPack,
): void {
  const ckpt = files.checkpoint;
  const coded = pack ? packCodedSizes(pack.index) : undefined;
  console.log(
    `plans        ${
      fixed === undefined ? "each preset for its own context" : `for ${fixed} positions`
    }, against this machine's memory:`,
  );
  for (const p of [...PRESETS, undefined]) {
    const name = p?.name ?? "auto";
    try {
      const options = { preset: name, context: fixed, stoppable: true, trunkPack: pack?.dir };
      const r = tryPlanFor(ckpt, options, baseline, coded);
      const verdict = r.refusal ? "no  " : "fits";
      console.log(
        `  ${name.padEnd(12)} ${verdict} ${formatBytes(r.plan.total).padStart(10)}  ` +
          summary(r.plan, ckpt.refs.layers.length),
      );
      console.log(`  ${"".padEnd(12)}      ${parts(r.plan)}`);
      if (r.reason) console.log(`  ${"".padEnd(12)}      why not: ${r.reason}`);
    } catch (e) {
      if (!(e instanceof K3Error)) throw e;
      console.log(`  ${name.padEnd(12)} no   ${withFlagNames(e).split("\n")[0]}`);
    }
  }
}

/** Context, trunk, cache and prefill of a plan, on one line. */
function summary(plan: MemoryPlan, layers: number): string {
  const t = plan.trunk, e = plan.experts;
  const room = plan.maxPositions >= Number.MAX_SAFE_INTEGER ? "any" : String(plan.maxPositions);
  return `context ${plan.positions} (room for ${room}); ` +
    `trunk ${t.pinned}/${layers} pinned, lm_head ${t.headResident ? "resident" : "streamed"}` +
    (t.ringSlots ? `, ring ${t.ringSlots} x ${formatBytes(t.slotBytes)}` : "") +
    `; experts ${e.mode === "cache" ? `${e.slots} cache slots` : "resident"}` +
    `; prefill ${plan.batch} per pass`;
}

/** The plan's items that hold memory, on one line. */
function parts(plan: MemoryPlan): string {
  return plan.items.filter((i) => i.bytes > 0).map((i) => `${i.name} ${formatBytes(i.bytes)}`)
    .join(", ");
}
