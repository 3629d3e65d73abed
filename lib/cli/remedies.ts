/**
 * The flags that carry each remedy a refusal names. The engine and the planner say what to
 * change in words ("a memory budget of at least 3.1 GB"); the command line adds its flag.
 * Kept apart from the commands so that printing an error loads nothing else.
 */
import type { K3Error } from "../errors.ts";

/** Remedy option -> the flag (or flags) that set it. */
const FLAGS: Record<string, string> = {
  preset: "--preset; see --list-presets",
  trunkGb: "--trunk-gb",
  cacheGb: "--cache-gb",
  "trunkGb/cacheGb": "--trunk-gb / --cache-gb",
  context: "--context, or --gen/--max-tokens",
  "sequences/retained": "a smaller --max-batch or --retain",
  memoryMaxGb: "--memory-max",
};

/** The error's message with the flag of each remedy after its words. */
export function withFlagNames(e: K3Error): string {
  let message = e.message;
  for (const r of e.remedies) {
    const flag = FLAGS[r.option];
    if (flag) message = message.replace(r.words, `${r.words} (${flag})`);
  }
  return message;
}
