/** Parsing and checking of flag values, shared by the subcommands. */
import { setThreads } from "../../ffi/library.ts";
import { badInput } from "../errors.ts";

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
    throw badInput(`--${name} wants a whole number from ${min} to ${max}, got '${value}'`);
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
    throw badInput(`--${name} wants a number from ${min} to ${max}, got '${value}'`);
  }
  return n;
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

/** The positional model directory, or a clear error. */
export function modelDirArg(positionals: string[], command: string): string {
  if (positionals.length !== 1) {
    throw badInput(`usage: k3 ${command} MODEL_DIR [options] (see k3 ${command} --help)`);
  }
  return positionals[0];
}
