/**
 * `k3 bench kernels [--json FILE] [--threads 1,2]` and `k3 bench model [--layers N]`.
 */
import { badInput, ExitCode } from "../errors.ts";
import { benchKernels, runKernelsChild } from "./bench/kernels.ts";
import { benchModel, ensureBenchModel, formatModelBench } from "./bench/model.ts";
import { cacheDir } from "./demo.ts";
import { applyThreads, intFlag, parseCommand } from "./flags.ts";

const HELP = `usage: k3 bench kernels [--json FILE] [--threads 1,2]
       k3 bench model [--layers N] [--prefill T] [--steps N] [--threads N] [--cache-dir DIR]

kernels  the hot GEMV/GEMM kernels at K3's true shapes from buffers larger than the cache:
         GB/s of weights, fraction of the measured read bandwidth, GFLOP/s, and the speed-up
         over the portable scalar path; each thread count runs in its own process.
model    decode and prefill on a K3-width synthetic checkpoint (generated once in the cache
         folder, a few GB): time per token per layer against the bandwidth floor.

options:
  --json FILE       (kernels) write the results as JSON too
  --threads LIST    thread counts: kernels a comma list (default 1,2); model one number
                    (default: all cores)
  --layers N        (model) layers of the synthetic checkpoint, 2..8 (default 3)
  --prefill T       (model) prompt tokens of the prefill measured, 1..4096 (default 64)
  --steps N         (model) decode steps measured, 1..1000 (default 5)
  --cache-dir DIR   (model) where the checkpoint is generated (default: the k3 cache folder)
`;

/** Comma-separated thread counts, each 1..1024. */
function threadList(value: string): number[] {
  const list = value.split(",").map((s) => intFlag("threads", s.trim(), 1, 1, 1024));
  if (list.length === 0) throw badInput("--threads wants a list such as 1,2");
  return list;
}

/** The flags `k3 bench` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  json: { type: "string" },
  threads: { type: "string" },
  layers: { type: "string" },
  prefill: { type: "string" },
  steps: { type: "string" },
  "cache-dir": { type: "string" },
  child: { type: "boolean" },
  scalar: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

export async function benchCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  const what = positionals[0];
  if (what === "kernels" && values.child) {
    runKernelsChild(values.scalar ?? false);
    return ExitCode.ok;
  }
  if (what === "kernels") {
    await benchKernels(threadList(values.threads ?? "1,2"), values.json);
    return ExitCode.ok;
  }
  if (what === "model") {
    applyThreads(values.threads ?? String(navigator.hardwareConcurrency));
    const layers = intFlag("layers", values.layers, 3, 2, 8);
    const dir = await ensureBenchModel(values["cache-dir"] ?? cacheDir(), layers);
    const prefill = intFlag("prefill", values.prefill, 64, 1, 4096);
    const steps = intFlag("steps", values.steps, 5, 1, 1000);
    console.log(formatModelBench(await benchModel(dir, layers, prefill, steps)));
    return ExitCode.ok;
  }
  throw badInput(`usage: k3 bench kernels|model (see k3 bench --help), got '${what ?? ""}'`);
}
