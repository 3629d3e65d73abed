/**
 * `k3 doctor [MODEL_DIR]`: what this machine is, and which presets fit it, before a long
 * download or a long run. With a model folder, every preset is planned for real against it,
 * from the same baseline `run` measures (checkpoint and tokenizer open, nothing loaded).
 */
import { existsSync } from "node:fs";
import * as path from "node:path";
import { parseArgs } from "node:util";
import { k3Isa, k3Threads, k3Version } from "../../ffi/library.ts";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { ExitCode, K3Error } from "../errors.ts";
import { type MemoryPlan, tryPlan } from "../memory/plan.ts";
import { machineMemory, PRESETS } from "../memory/presets.ts";
import { formatBytes } from "../io/sizes.ts";
import { Tokenizer } from "../text/tokenizer.ts";
import { VERSION } from "../version.ts";
import { applyThreads, helpAsked, intFlag } from "./flags.ts";
import { baselineBytes, contextShape, DEFAULT_CONTEXT } from "./memory_flags.ts";

const HELP = `usage: k3 doctor [MODEL_DIR] [--context N] [--threads N]

Prints the machine (SIMD path, threads, memory, cgroup limit). With MODEL_DIR, plans every
preset against that checkpoint: the plan's total and its parts, the context it reserves
(each preset's own, or --context N for all) and the most it could hold, and why a preset
that does not fit here does not.
`;

/** The flags `k3 doctor` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  context: { type: "string" },
  threads: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

export async function doctorCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: OPTIONS,
  });
  if (helpAsked(values, HELP)) return ExitCode.ok;
  applyThreads(values.threads);
  const mem = machineMemory();
  const known = (n: number) => (n > 0 ? formatBytes(n) : "none");
  console.log(`k3 ${VERSION} (${k3Version()}) on ${Deno.build.os}/${Deno.build.arch}`);
  console.log(`kernels      ${k3Isa()} path, ${k3Threads()} OpenMP threads`);
  console.log(
    `memory       MemAvailable ${known(mem.memAvailable)}, cgroup limit ${known(mem.cgroupMax)}`,
  );
  if (positionals.length === 0) return ExitCode.ok;

  const dir = positionals[0];
  const t0 = performance.now();
  const ckpt = await openCheckpoint(dir);
  const openSeconds = (performance.now() - t0) / 1000;
  // The tokenizer too, as run, chat and serve have it loaded when they plan.
  const tokenizer = existsSync(path.join(dir, "tiktoken.model"))
    ? await Tokenizer.load(dir).catch(() => undefined)
    : undefined;
  try {
    const c = ckpt.config;
    const shards = ckpt.shards.reduce((a, f) => a + Deno.statSync(f).size, 0);
    const baseline = baselineBytes();
    console.log(
      `model        ${c.numLayers} layers, hidden ${c.hiddenSize}, ${c.numExperts} experts ` +
        `top-${c.topK}, ${ckpt.shards.length} shards, ${formatBytes(shards)}; ` +
        `opened in ${openSeconds.toFixed(2)} s`,
    );
    console.log(
      `baseline     ${formatBytes(baseline)} resident after opening (every plan counts it, ` +
        `as run does)`,
    );
    const fixed = values.context === undefined
      ? undefined
      : intFlag("context", values.context, DEFAULT_CONTEXT, 2, 1 << 24);
    console.log(
      `plans        ${
        fixed === undefined ? "each preset for its own context" : `for ${fixed} positions`
      }, against this machine's memory:`,
    );
    for (const p of [...PRESETS, undefined]) {
      const name = p?.name ?? "auto";
      const context = fixed ?? p?.context ?? DEFAULT_CONTEXT;
      try {
        const r = tryPlan(c, ckpt.refs, contextShape(context), { preset: name }, baseline);
        const verdict = r.refusal ? "no  " : "fits";
        console.log(
          `  ${name.padEnd(12)} ${verdict} ${formatBytes(r.plan.total).padStart(10)}  ` +
            summary(r.plan, ckpt.refs.layers.length),
        );
        console.log(`  ${"".padEnd(12)}      ${parts(r.plan)}`);
        if (r.reason) console.log(`  ${"".padEnd(12)}      why not: ${r.reason}`);
      } catch (e) {
        if (!(e instanceof K3Error)) throw e;
        console.log(`  ${name.padEnd(12)} no   ${e.message.split("\n")[0]}`);
      }
    }
  } finally {
    tokenizer?.free();
  }
  return ExitCode.ok;
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
