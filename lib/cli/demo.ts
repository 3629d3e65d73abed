/**
 * `k3 demo`: text in, text out on the built-in tiny model, through the whole pipeline
 * (generator -> checkpoint reader -> tokenizer -> engine -> decoder). The tiny model's
 * weights are random, so its text is gibberish; what the demo proves is the pipeline.
 */
import { existsSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { ExitCode } from "../errors.ts";
import { makeTiny } from "../synth/tiny.ts";
import { intFlag, parseCommand } from "./flags.ts";
import { runCommand } from "./run.ts";

const HELP = `usage: k3 demo [--prompt TEXT] [--gen N] [--seed S] [--cache-dir DIR] [--threads N]

Generates (once) a tiny random-weight model in the K3 layout in the cache folder
($K3_CACHE, else $XDG_CACHE_HOME/k3, else ~/.cache/k3) and runs text in, text out.

options:
  --prompt TEXT     the prompt (default "The capital of France is")
  --gen N           tokens to generate (default 24)
  --seed S          which tiny model: its weights' seed (default 1)
  --cache-dir DIR   where the model is generated (default: the cache folder above)
  --threads N       OpenMP threads (default: OMP_NUM_THREADS or all cores)
`;

/** Bump when the generator's output changes, so stale cached models are not reused. */
const TINY_REVISION = 1;

/** The folder where k3 keeps generated models. */
export function cacheDir(): string {
  const env = Deno.env.get("K3_CACHE");
  if (env) return env;
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  return path.join(xdg ?? path.join(os.homedir(), ".cache"), "k3");
}

/** The tiny model for `seed`, generated on first use. */
export async function ensureTinyModel(seed: number, root = cacheDir()): Promise<string> {
  const dir = path.join(root, `tiny-r${TINY_REVISION}-seed${seed}`);
  if (!existsSync(path.join(dir, ".complete"))) {
    console.error(`generating the tiny model in ${dir} ...`);
    await Deno.mkdir(dir, { recursive: true });
    await makeTiny(dir, { seed });
    await Deno.writeTextFile(path.join(dir, ".complete"), "");
  }
  return dir;
}

/** The flags `k3 demo` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  prompt: { type: "string", default: "The capital of France is" },
  gen: { type: "string" },
  seed: { type: "string" },
  "cache-dir": { type: "string" },
  threads: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

export async function demoCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP, { positionals: false });
  if (!parsed) return ExitCode.ok;
  const { values } = parsed;
  const seed = intFlag("seed", values.seed, 1, 0, 2 ** 31 - 1);
  const dir = await ensureTinyModel(seed, values["cache-dir"] ?? cacheDir());
  console.error(
    "k3 demo: a tiny model with random weights, in the exact Kimi K3 checkpoint layout.\n" +
      "Its text is gibberish by construction (nothing was trained); what it shows is that\n" +
      "every stage runs: config and shard reading, tokenizer, KDA + MLA + LatentMoE forward,\n" +
      "greedy decoding and streaming detokenization. The tests check the same engine against\n" +
      "an independent float64 reference.\n",
  );
  const run = [dir, "--prompt", values.prompt!, "--gen", values.gen ?? "24", "--ignore-eos"];
  if (values.threads) run.push("--threads", values.threads);
  return await runCommand(run);
}
