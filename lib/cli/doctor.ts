/**
 * `k3 doctor [MODEL_DIR]`: what this machine is, and which presets fit it, before a long
 * download or a long run. With a model folder, every preset is planned for real against it.
 */
import { parseArgs } from "node:util";
import { k3Isa, k3Threads, k3Version } from "../../ffi/library.ts";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { ExitCode, K3Error } from "../errors.ts";
import { planMemory } from "../memory/plan.ts";
import { machineMemory, PRESETS } from "../memory/presets.ts";
import { formatBytes } from "../report.ts";
import { VERSION } from "../version.ts";
import { applyThreads, helpAsked, intFlag } from "./flags.ts";
import { contextShape } from "./memory_flags.ts";

const HELP = `usage: k3 doctor [MODEL_DIR] [--context N] [--threads N]

Prints the machine (SIMD path, threads, memory, cgroup limit). With MODEL_DIR, plans every
preset against that checkpoint and says which ones fit here, and by how much the others miss.
`;

export async function doctorCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: {
      context: { type: "string" },
      threads: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
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

  const ckpt = await openCheckpoint(positionals[0]);
  const c = ckpt.config;
  const shards = ckpt.shards.reduce((a, f) => a + Deno.statSync(f).size, 0);
  console.log(
    `model        ${c.numLayers} layers, hidden ${c.hiddenSize}, ${c.numExperts} experts ` +
      `top-${c.topK}, ${ckpt.shards.length} shards, ${formatBytes(shards)}`,
  );
  const context = intFlag("context", values.context, 4096, 2, 1 << 24);
  console.log(`plans        for ${context} positions (--context), against this machine's memory:`);
  for (const p of [...PRESETS.map((x) => x.name), "auto"]) {
    try {
      const plan = planMemory(
        c,
        ckpt.refs,
        contextShape(context),
        { preset: p },
        Deno.memoryUsage().rss,
      );
      const t = plan.trunk;
      console.log(
        `  ${p.padEnd(12)} fits   ${formatBytes(plan.total).padStart(10)}  ` +
          `${t.pinned} pinned + ring ${t.ringSlots}, experts ${plan.experts.mode}` +
          (plan.experts.mode === "cache" ? ` (${plan.experts.slots} slots)` : ""),
      );
    } catch (e) {
      if (!(e instanceof K3Error)) throw e;
      console.log(`  ${p.padEnd(12)} no     ${e.message.split("\n")[0]}`);
    }
  }
  return ExitCode.ok;
}
