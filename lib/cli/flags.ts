/** Parsing and checking of flag values, shared by the subcommands. */
import { parseArgs, type ParseArgsConfig } from "node:util";
import { setThreads } from "../../ffi/library.ts";
import { badInput } from "../errors.ts";
import { resolveModelDir } from "../hub/cache.ts";
import type { SamplingOptions } from "../text/sampler.ts";

/** An integer flag in [min, max], or `fallback` when absent. */
export function intFlag(
  name: string,
  value: string | undefined,
  fallback: number,
  min = 0,
  max = Number.MAX_SAFE_INTEGER,
): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!/^-?\d+$/.test(value.trim()) || n < min || n > max) {
    throw badInput(`--${name} wants ${rangeText(min, max, true)}, got '${value}'`);
  }
  return n;
}

/** A decimal flag in [min, max], or undefined when absent. */
export function numberFlag(
  name: string,
  value: string | undefined,
  min = 0,
  max = Number.MAX_VALUE,
): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < min || n > max) {
    throw badInput(`--${name} wants ${rangeText(min, max, false)}, got '${value}'`);
  }
  return n;
}

/**
 * A range as a person reads it: "a whole number from 1 to 1,024", "a number >= 0", "a whole
 * number from 0 to 2^53 - 1" (not 9007199254740991, nor 1.7976931348623157e+308 for "no limit").
 */
export function rangeText(min: number, max: number, whole: boolean): string {
  const n = (x: number) =>
    Math.abs(x) >= Number.MAX_SAFE_INTEGER
      ? (x < 0 ? "-(2^53 - 1)" : "2^53 - 1")
      : x.toLocaleString("en-US", { maximumFractionDigits: 20 });
  if (whole) return `a whole number from ${n(min)} to ${n(max)}`;
  return max >= Number.MAX_VALUE ? `a number >= ${n(min)}` : `a number from ${n(min)} to ${n(max)}`;
}

/**
 * `--seed -3` as `--seed=-3`. node:util's parseArgs refuses an option value that starts with
 * "-" unless it is joined with "="; no k3 flag is a digit, so a negative number right after
 * a flag can only be its value. (After a boolean flag, parseArgs then says it takes none.)
 */
export function joinNegativeValues(args: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i], next = args[i + 1];
    if (a === "--") return [...out, ...args.slice(i)];
    if (/^--[^=]+$/.test(a) && next !== undefined && /^-\.?\d/.test(next)) {
      out.push(`${a}=${next}`);
      i++;
    } else out.push(a);
  }
  return out;
}

/** A comma-separated list of token ids. */
export function idsFlag(value: string): number[] {
  const parts = value.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (parts.length === 0) throw badInput("--ids wants a comma-separated list of token ids");
  return parts.map((p) => {
    if (!/^\d+$/.test(p)) throw badInput(`--ids: '${p}' is not a token id`);
    return Number(p);
  });
}

/** Applies --threads (before libk3 loads: OpenMP reads it once). */
export function applyThreads(value: string | undefined): void {
  if (value !== undefined) setThreads(intFlag("threads", value, 1, 1, 1024));
}

/**
 * The positional model directory, or a clear error. A repo id (`owner/name[@rev]`) that is
 * not a path means its snapshot in the Hub cache (lib/hub/cache.ts).
 */
export function modelDirArg(positionals: string[], command: string): string {
  if (positionals.length !== 1) {
    throw badInput(`usage: k3 ${command} MODEL_DIR|REPO [options] (see k3 ${command} --help)`);
  }
  return resolveModelDir(positionals[0]);
}

/**
 * parseArgs options for sampling and stops, shared by `run`, `chat` and the server. Spread
 * them into a command's options; read them back with {@link samplingFlags},
 * {@link stopFlags} and {@link maxTokensFlag}.
 */
export const SAMPLING_OPTIONS = {
  temperature: { type: "string" },
  "top-p": { type: "string" },
  "top-k": { type: "string" },
  "min-p": { type: "string" },
  seed: { type: "string" },
  "presence-penalty": { type: "string" },
  "frequency-penalty": { type: "string" },
  "repetition-penalty": { type: "string" },
  "logit-bias": { type: "string", multiple: true },
  stop: { type: "string", multiple: true },
  "max-tokens": { type: "string" },
} as const;

/** Help lines for {@link SAMPLING_OPTIONS}. */
export const SAMPLING_HELP = `sampling (greedy, ties to the lowest id, unless --temperature > 0):
  --temperature T       sampling temperature (default 0 = greedy)
  --top-k K             keep the K most likely tokens (default 0 = all)
  --top-p P             keep the smallest set whose probability reaches P, in (0, 1] (default 1)
  --min-p P             drop tokens below P x the top probability, in [0, 1] (default 0)
  --seed S              sampler seed (default 0): same seed, same tokens, run to run
penalties and bias (act in greedy decoding too; see docs/CLI.md for the exact rules):
  --repetition-penalty R  divide positive, multiply negative logits of every id already in
                        the sequence, prompt included, by R in (0, 100] (default 1 = off)
  --presence-penalty P  subtract P in [-2, 2] from the logit of every id generated so far
  --frequency-penalty F subtract F in [-2, 2] per time an id was generated so far
  --logit-bias ID=B     add B in [-100, 100] to the logit of token ID (repeatable, or
                        comma-separated: 17=-100,42=5)
stops:
  --stop STRING         end when the visible text contains STRING, even across tokens; the
                        string itself is not printed (repeatable). Markup (chat channel
                        markers, special tokens' names) is never matched`;

/** The values parseArgs returns for {@link SAMPLING_OPTIONS}. */
export interface SamplingFlagValues {
  temperature?: string;
  "top-p"?: string;
  "top-k"?: string;
  "min-p"?: string;
  seed?: string;
  "presence-penalty"?: string;
  "frequency-penalty"?: string;
  "repetition-penalty"?: string;
  "logit-bias"?: string[];
  stop?: string[];
  "max-tokens"?: string;
}

/** Sampler options from the flags; each value is range-checked and names its flag. */
export function samplingFlags(values: SamplingFlagValues): SamplingOptions {
  const topP = numberFlag("top-p", values["top-p"], 0, 1);
  if (topP === 0) throw badInput("--top-p must be greater than 0 (1 turns it off)");
  const limit = Number.MAX_SAFE_INTEGER;
  return {
    temperature: numberFlag("temperature", values.temperature, 0),
    topP,
    topK: values["top-k"] === undefined ? undefined : intFlag("top-k", values["top-k"], 0, 0),
    minP: numberFlag("min-p", values["min-p"], 0, 1),
    seed: values.seed === undefined ? undefined : intFlag("seed", values.seed, 0, -limit, limit),
    presencePenalty: numberFlag("presence-penalty", values["presence-penalty"], -2, 2),
    frequencyPenalty: numberFlag("frequency-penalty", values["frequency-penalty"], -2, 2),
    repetitionPenalty: positiveFlag("repetition-penalty", values["repetition-penalty"], 100),
    logitBias: logitBiasFlags(values["logit-bias"]),
  };
}

/** A number in (0, max], or undefined when absent. */
function positiveFlag(name: string, value: string | undefined, max: number): number | undefined {
  const n = numberFlag(name, value, 0, max);
  if (n === 0) throw badInput(`--${name} must be greater than 0`);
  return n;
}

/** --logit-bias ID=B (repeatable, or comma-separated) as an id -> bias table. */
export function logitBiasFlags(values: string[] | undefined): Record<number, number> | undefined {
  if (values === undefined) return undefined;
  const bias: Record<number, number> = {};
  for (const item of values.flatMap((v) => v.split(","))) {
    const m = /^\s*(\d+)\s*[=:]\s*(\S+)\s*$/.exec(item);
    if (!m) throw badInput(`--logit-bias wants ID=BIAS (e.g. 17=-100), got '${item}'`);
    bias[Number(m[1])] = numberFlag(`logit-bias ${m[1]}`, m[2], -100, 100)!;
  }
  return bias;
}

/** Sampling flags given without --temperature > 0, where they change nothing (for a warning). */
export function ignoredSamplingFlags(values: SamplingFlagValues): string[] {
  if ((samplingFlags(values).temperature ?? 0) > 0) return [];
  return (["top-p", "top-k", "min-p", "seed"] as const)
    .filter((name) => values[name] !== undefined)
    .map((name) => `--${name}`);
}

/** The --stop strings (none when absent); an empty one is bad input. */
export function stopFlags(values: SamplingFlagValues): string[] {
  const stops = values.stop ?? [];
  if (stops.some((s) => s === "")) throw badInput("--stop wants a non-empty string");
  return stops;
}

/** --max-tokens, or its alias `--gen` where a command has it; both given must agree. */
export function maxTokensFlag(
  values: SamplingFlagValues & { gen?: string },
  fallback: number,
): number {
  const max = intFlag("max-tokens", values["max-tokens"], fallback, 1, 1 << 20);
  const gen = intFlag("gen", values.gen, max, 1, 1 << 20);
  if (values["max-tokens"] !== undefined && values.gen !== undefined && gen !== max) {
    throw badInput(`--gen ${gen} and --max-tokens ${max} disagree; give one of them`);
  }
  return gen;
}

/** A subcommand's parseArgs option specs. */
export type OptionSpecs = NonNullable<ParseArgsConfig["options"]>;

/**
 * A subcommand's arguments, parsed strictly against `options` (unknown flags and missing
 * values are errors); undefined when -h/--help was given, after printing `help`. Without
 * `positionals`, an argument that is not a flag is an error too.
 */
export function parseCommand<const O extends OptionSpecs>(
  args: string[],
  options: O,
  help: string,
  { positionals = true }: { positionals?: boolean } = {},
) {
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: positionals, strict: true });
  } catch (e) {
    // Flags were checked by main.ts (flag_check.ts); what is left is an argument too many.
    const code = (e as { code?: string }).code;
    if (code !== "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL") throw e;
    const command = /^usage: (k3 \S+)/.exec(help)?.[1] ?? "this command";
    const { tokens } = parseArgs({ args, options, strict: false, tokens: true });
    const extra = tokens.find((t) => t.kind === "positional")?.value;
    throw badInput(`${command} takes no arguments, got '${extra}' (${command} --help)`);
  }
  if ((parsed.values as { help?: boolean }).help !== true) return parsed;
  console.log(help);
  return undefined;
}
