/**
 * The memory flags shared by `run`, `chat` and `serve`, mapped to the engine's typed
 * {@link MemoryOptions}; each value is checked here, so that a bad one names its flag.
 */
import { badInput, K3Error } from "../errors.ts";
import {
  CACHE_POLICIES,
  DEFAULT_CONTEXT,
  type MemoryOptions,
  PREFILL_CHUNK,
} from "../engine/open.ts";
import { formatPresets, presetByName } from "../memory/presets.ts";
import { intFlag, numberFlag } from "./flags.ts";

export { DEFAULT_CONTEXT, PREFILL_CHUNK };

/** parseArgs option specs of the memory flags. */
export const MEMORY_OPTIONS = {
  preset: { type: "string" },
  "list-presets": { type: "boolean" },
  trunk: { type: "string" },
  "verify-pack": { type: "boolean" },
  "trunk-gb": { type: "string" },
  "cache-gb": { type: "string" },
  "memory-max": { type: "string" },
  "pin-layers": { type: "string" },
  "ring-slots": { type: "string" },
  "cache-slots": { type: "string" },
  "cache-policy": { type: "string" },
  "piece-mb": { type: "string" },
  "lm-head": { type: "string" },
} as const;

export const MEMORY_HELP =
  `memory (GB = 1e9 bytes; decimals allowed; more memory only buys speed, never other bytes):
  --preset NAME         ultra laptop desktop workstation server max, or auto (default)
  --list-presets        show the presets and what auto would use here
  --trunk DIR           read the trunk from a pack made by \`k3 pack\` (one read per layer)
  --verify-pack         check each packed layer's SHA-256 the first time it is read
  --trunk-gb X          trunk budget: pinned layers + ring slots
  --cache-gb X          expert cache budget
  --memory-max X        refuse a plan above X GB; the peak RSS is checked against it at the end
  --pin-layers N        override the planner: pin the first N layers
  --ring-slots N        override the planner: N ring slots for the streamed layers
  --cache-slots N       override the planner: an expert cache of N slots
  --cache-policy NAME   expert eviction policy (${CACHE_POLICIES.join(", ")}; default lru)
  --piece-mb X          the trunk streams in pieces of at most X MB (default 134.2, 128 MiB)
  --lm-head MODE        override the planner: keep lm_head resident, or stream it`;

/** What --context defaults to, as the help says it: a named preset brings its own. */
export const CONTEXT_DEFAULT_HELP =
  `default: a named --preset's context (--list-presets), else ${DEFAULT_CONTEXT}`;

type Values = Record<string, unknown>;

/**
 * --context: the positions the plan reserves sequence state for (chat and serve). Without
 * it, the context the preset leaves room for, else DEFAULT_CONTEXT.
 */
export function contextFlag(value: string | undefined, values: Values = {}): number {
  const preset = presetFlag(values.preset as string | undefined);
  const fallback = preset && preset !== "auto" ? presetByName(preset).context : DEFAULT_CONTEXT;
  return intFlag("context", value, fallback, 2, 1 << 24);
}

/** The memory flags as the engine's options. */
export function memoryFlags(values: Values): MemoryOptions {
  const str = (k: string) => values[k] as string | undefined;
  const count = (k: string, min: number) =>
    str(k) === undefined ? undefined : intFlag(k, str(k), min, min);
  return {
    preset: presetFlag(str("preset")),
    trunkGb: numberFlag("trunk-gb", str("trunk-gb"), 0),
    cacheGb: numberFlag("cache-gb", str("cache-gb"), 0),
    memoryMaxGb: memoryMaxFlag(str("memory-max")),
    pinLayers: count("pin-layers", 0),
    ringSlots: count("ring-slots", 1),
    cacheSlots: count("cache-slots", 1),
    pieceMb: numberFlag("piece-mb", str("piece-mb"), 0.004096),
    lmHead: lmHeadFlag(str("lm-head")),
    cachePolicy: cachePolicyFlag(str("cache-policy")),
    trunkPack: str("trunk"),
    verifyPack: values["verify-pack"] as boolean | undefined,
  };
}

/** --preset: a preset's name or auto. */
function presetFlag(value: string | undefined): string | undefined {
  if (value === undefined || value === "auto") return value;
  try {
    presetByName(value);
  } catch (e) {
    if (e instanceof K3Error) throw badInput(`--preset: ${e.message}`);
    throw e;
  }
  return value;
}

/** --memory-max in GB: finite and above 0 (0 used to switch the budget check off). */
function memoryMaxFlag(value: string | undefined): number | undefined {
  const gb = numberFlag("memory-max", value, 0);
  if (gb === 0) throw badInput(`--memory-max wants a number of GB above 0, got '${value}'`);
  return gb;
}

function lmHeadFlag(value: string | undefined): "resident" | "stream" | undefined {
  if (value === undefined || value === "resident" || value === "stream") return value;
  throw badInput(`--lm-head wants resident or stream, got '${value}'`);
}

/** --cache-policy: own keys only ("constructor" or "__proto__" is not a policy). */
function cachePolicyFlag(value: string | undefined): string | undefined {
  if (value === undefined || CACHE_POLICIES.includes(value)) return value;
  throw badInput(
    `--cache-policy: unknown policy '${value}'; choose ${CACHE_POLICIES.join(", ")}`,
  );
}

/** Handles --list-presets: prints them and returns true when it was given. */
export function listPresetsIfAsked(values: Values): boolean {
  if (!values["list-presets"]) return false;
  console.log(formatPresets({ context: DEFAULT_CONTEXT, batch: PREFILL_CHUNK }));
  return true;
}
