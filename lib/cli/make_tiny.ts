/**
 * `k3 make-tiny DIR [--seed S] [--layers N] [--experts E] [--shape tiny|k3|full] [--data D]
 * [--routing uniform|skewed] [--weights uniform|normal]`:
 * writes a random-weight checkpoint in the released K3 layout (lib/synth/tiny.ts), or the
 * full-size layout as sparse files (lib/synth/full.ts).
 */

import { badInput, ExitCode, K3Error } from "../errors.ts";
import { parseCommand } from "./flags.ts";
import { type FullData, type FullOptions, makeFull } from "../synth/full.ts";
import { makeTiny, type TinyOptions, WEIGHTS, type Weights } from "../synth/tiny.ts";
import { type Routing, ROUTINGS } from "../synth/routing.ts";

const USAGE =
  `usage: k3 make-tiny DIR [--seed S] [--layers N] [--experts E] [--shape tiny|k3|full] [--data D]
                 [--routing uniform|skewed] [--weights uniform|normal]

Writes a random-weight checkpoint in the released K3 layout to DIR.
  --seed S       PRNG seed, 0..4294967295 (default 0); same seed, same bytes
  --layers N     decoder layers (default 8 for tiny, 4 for k3, 93 for full)
  --experts E    routed experts per MoE layer (default 13 for tiny, 32 for k3; full has 896)
  --shape        tiny: a few MB, all widths different (default)
                 k3: K3's true widths, several GB, for benchmarks
                 full: every tensor of the released text model (497,052 at 93 layers) with
                 its real name, shape and dtype, in 96 shards, as sparse files
  --data D       (full only) sparse: embedding, lm_head and routers random, norm gains 1.0,
                 all else holes, about 6 GB of real disk (default)
                 none: every tensor a hole, only headers on disk (for index and plan tests)
                 Holes read as zeros without touching the disk.
  --routing R    uniform: every router bias small noise, tokens pick experts almost
                 uniformly (default)
                 skewed: a Zipf-like popularity per layer (router biases), calibrated so that
                 12 tokens touch ~109 of 896 experts per layer, as a trace of the real model
                 did (uniform: ~174)
  --weights W    uniform: matrices uniform noise, MXFP4 experts uniform random codes (default)
                 normal: as trained weights are distributed: BF16 matrices and the
                 embedding N(0, 1/fan-in), MXFP4 experts quantized from such weights
                 (per-group scale from the largest magnitude, codes rounded to nearest);
                 norms and biases unchanged. With --shape full only the tensors that hold
                 data (embedding, lm_head, routers) change; the holes stay holes`;

/** A decimal integer flag; anything else is bad input naming the flag. */
function parseIntFlag(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value)) {
    throw badInput(
      `make-tiny: ${flag} must be a non-negative integer, got ${JSON.stringify(value)}`,
    );
  }
  return Number(value);
}

type Shape = TinyOptions["shape"] | "full";

function parseShape(value: string | undefined): Shape {
  if (value === undefined || value === "tiny" || value === "k3" || value === "full") return value;
  throw badInput(
    `make-tiny: --shape must be "tiny", "k3" or "full", got ${JSON.stringify(value)}`,
  );
}

function parseData(value: string | undefined): FullData | undefined {
  if (value === undefined || value === "sparse" || value === "none") return value;
  throw badInput(`make-tiny: --data must be "sparse" or "none", got ${JSON.stringify(value)}`);
}

function parseRouting(value: string | undefined): Routing | undefined {
  if (value === undefined || ROUTINGS.includes(value as Routing)) return value as Routing;
  throw badInput(
    `make-tiny: --routing must be "uniform" or "skewed", got ${JSON.stringify(value)}`,
  );
}

function parseWeights(value: string | undefined): Weights | undefined {
  if (value === undefined || WEIGHTS.includes(value as Weights)) return value as Weights;
  throw badInput(
    `make-tiny: --weights must be "uniform" or "normal", got ${JSON.stringify(value)}`,
  );
}

/** What to write: a small checkpoint or the full-size layout. */
export type MakeTinyRequest =
  | { dir: string; full: false; options: TinyOptions }
  | { dir: string; full: true; options: FullOptions };

/** The flags `k3 make-tiny` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  seed: { type: "string" },
  layers: { type: "string" },
  experts: { type: "string" },
  shape: { type: "string" },
  data: { type: "string" },
  routing: { type: "string" },
  weights: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** Parses the arguments into a directory and options; throws K3Error (bad input). */
export function parseMakeTinyArgs(args: string[]): MakeTinyRequest | "help" {
  let parsed;
  try {
    parsed = parseCommand(args, OPTIONS, USAGE);
  } catch (e) {
    throw badInput(`make-tiny: ${(e as Error).message}\n${USAGE}`, { cause: e });
  }
  if (!parsed) return "help";
  const { values, positionals } = parsed;
  if (positionals.length !== 1) {
    throw badInput(`make-tiny: expected exactly one DIR, got ${positionals.length}\n${USAGE}`);
  }
  const dir = positionals[0];
  const shape = parseShape(values.shape);
  const seed = parseIntFlag(values.seed, "--seed");
  const layers = parseIntFlag(values.layers, "--layers");
  const routing = parseRouting(values.routing);
  const weights = parseWeights(values.weights);
  if (shape === "full") {
    if (values.experts !== undefined) {
      throw badInput(
        "make-tiny: --shape full has the released 896 experts per layer; for fewer, use --shape k3",
      );
    }
    const data = parseData(values.data);
    return { dir, full: true, options: { seed, layers, data, routing, weights } };
  }
  if (values.data !== undefined) {
    throw badInput("make-tiny: --data applies to --shape full only (small shapes are all data)");
  }
  return {
    dir,
    full: false,
    options: {
      seed,
      layers,
      experts: parseIntFlag(values.experts, "--experts"),
      shape,
      routing,
      weights,
    },
  };
}

const GB = (n: number) => `${(n / 1e9).toFixed(2)} GB`;

/** The summary lines of a full-size checkpoint. */
async function runFull(dir: string, options: FullOptions): Promise<void> {
  const started = performance.now();
  const r = await makeFull(dir, options);
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  const { plan } = r;
  const census = Object.entries(plan.census)
    .sort((a, b) => b[1] - a[1])
    .map(([dtype, n]) => `${n.toLocaleString("en-US")} ${dtype}`)
    .join(", ");
  const real = options.data === "none"
    ? "every tensor is a hole (--data none)"
    : "real data: embedding, lm_head, routers, router biases, norm gains 1.0; the rest holes; " +
      `routing ${options.routing ?? "uniform"}, weights ${options.weights ?? "uniform"}`;
  console.log(
    [
      `make-tiny: full-size K3 text model, ${plan.shape.layers} layers: ` +
      `${
        plan.tensorCount.toLocaleString("en-US")
      } tensors (${census}) in ${plan.shards.length} shards`,
      `make-tiny: ${GB(plan.totalTensorBytes)} of tensors as sparse files; ${real}`,
      `make-tiny: holes read as zeros without touching the disk; wrote ${GB(r.writtenBytes)}, ` +
      `disk used ${GB(r.diskBytes)} (apparent ${GB(r.apparentBytes)}) in ${seconds} s ` +
      `(${r.configPath})`,
    ].join("\n"),
  );
}

/**
 * Runs `make-tiny` with the arguments after the subcommand name.
 * @returns the process exit code (0, or 2 for bad input)
 */
export async function makeTinyCommand(args: string[]): Promise<number> {
  try {
    const parsed = parseMakeTinyArgs(args);
    if (parsed === "help") return ExitCode.ok;
    if (parsed.full) {
      await runFull(parsed.dir, parsed.options);
      return ExitCode.ok;
    }
    const started = performance.now();
    const { configPath, bytes } = await makeTiny(parsed.dir, parsed.options);
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(`make-tiny: wrote ${(bytes / 1e6).toFixed(1)} MB in ${seconds} s (${configPath})`);
    return ExitCode.ok;
  } catch (e) {
    if (!(e instanceof K3Error)) throw e;
    console.error(`k3: ${e.message}`);
    return e.exitCode;
  }
}
