/**
 * `k3 make-tiny DIR [--seed S] [--layers N] [--experts E] [--shape tiny|k3]`: writes a
 * random-weight checkpoint in the released K3 layout (see lib/synth/tiny.ts).
 */

import { parseArgs } from "node:util";
import { badInput, ExitCode, K3Error } from "../errors.ts";
import { makeTiny, type TinyOptions } from "../synth/tiny.ts";

const USAGE = `usage: k3 make-tiny DIR [--seed S] [--layers N] [--experts E] [--shape tiny|k3]

Writes a random-weight checkpoint in the released K3 layout to DIR.
  --seed S       PRNG seed, 0..4294967295 (default 0); same seed, same bytes
  --layers N     decoder layers (default 8 for tiny, 4 for k3)
  --experts E    routed experts per MoE layer (default 13 for tiny, 32 for k3)
  --shape        tiny: a few MB, all widths different (default)
                 k3: K3's true widths, several GB, for benchmarks`;

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

function parseShape(value: string | undefined): TinyOptions["shape"] {
  if (value === undefined || value === "tiny" || value === "k3") return value;
  throw badInput(`make-tiny: --shape must be "tiny" or "k3", got ${JSON.stringify(value)}`);
}

/** Parses the arguments into a directory and options; throws K3Error (bad input). */
export function parseMakeTinyArgs(args: string[]): { dir: string; options: TinyOptions } | "help" {
  let parsed;
  try {
    parsed = parseArgs({
      args,
      allowPositionals: true,
      strict: true,
      options: {
        seed: { type: "string" },
        layers: { type: "string" },
        experts: { type: "string" },
        shape: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    throw badInput(`make-tiny: ${(e as Error).message}\n${USAGE}`, { cause: e });
  }
  const { values, positionals } = parsed;
  if (values.help) return "help";
  if (positionals.length !== 1) {
    throw badInput(`make-tiny: expected exactly one DIR, got ${positionals.length}\n${USAGE}`);
  }
  return {
    dir: positionals[0],
    options: {
      seed: parseIntFlag(values.seed, "--seed"),
      layers: parseIntFlag(values.layers, "--layers"),
      experts: parseIntFlag(values.experts, "--experts"),
      shape: parseShape(values.shape),
    },
  };
}

/**
 * Runs `make-tiny` with the arguments after the subcommand name.
 * @returns the process exit code (0, or 2 for bad input)
 */
export async function makeTinyCommand(args: string[]): Promise<number> {
  try {
    const parsed = parseMakeTinyArgs(args);
    if (parsed === "help") {
      console.log(USAGE);
      return ExitCode.ok;
    }
    const started = performance.now();
    const { configPath, bytes } = await makeTiny(parsed.dir, parsed.options);
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(`make-tiny: wrote ${(bytes / 1e6).toFixed(1)} MB in ${seconds} s (${configPath})`);
    return ExitCode.ok;
  } catch (e) {
    if (!(e instanceof K3Error)) throw e;
    console.error(e.message);
    return e.exitCode;
  }
}
