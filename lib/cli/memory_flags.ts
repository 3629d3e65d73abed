/**
 * The memory flags shared by `run`, `chat` and `serve`, and the one way a command opens a
 * model under them: checkpoint -> plan (refused with exit 3 before anything is allocated)
 * -> weights loaded or streamed as the plan says.
 */
import { badInput } from "../errors.ts";
import type { Checkpoint } from "../checkpoint/checkpoint.ts";
import { openTrunkPack } from "../layout/pack.ts";
import {
  formatPlan,
  type MemoryPlan,
  type MemoryRequest,
  planMemory,
  type RunShape,
} from "../memory/plan.ts";
import { formatPresets, presetByName } from "../memory/presets.ts";
import { POLICIES } from "../memory/policy.ts";
import { type LoadOptions, Model } from "../model/model.ts";
import { intFlag, numberFlag } from "./flags.ts";

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
  --cache-policy NAME   expert eviction policy (${Object.keys(POLICIES).join(", ")}; default lru)
  --piece-mb X          the trunk streams in pieces of at most X MB (default 134.2, 128 MiB)
  --lm-head MODE        override the planner: keep lm_head resident, or stream it`;

type Values = Record<string, unknown>;

/** Prompt + completion tokens a chat or server request may use without --context or a preset. */
export const DEFAULT_CONTEXT = 32768;

/** Prompt tokens per forward call in chat and serve (a preset may allow fewer). */
export const PREFILL_CHUNK = 512;

/** The run shape of a chat or server with `context` positions. */
export function contextShape(context: number, verifyPositions?: number): RunShape {
  return {
    positions: context,
    maxBatch: Math.min(context, PREFILL_CHUNK),
    extraBytes: 0,
    verifyPositions,
    stoppable: true,
  };
}

/**
 * --context: the positions the plan reserves sequence state for (chat and serve). Without
 * it, the context the preset leaves room for, else DEFAULT_CONTEXT.
 */
export function contextFlag(value: string | undefined, values: Values = {}): number {
  const preset = values.preset as string | undefined;
  const fallback = preset && preset !== "auto" ? presetByName(preset).context : DEFAULT_CONTEXT;
  return intFlag("context", value, fallback, 2, 1 << 24);
}

/** The memory flags as a request to the planner. */
export function memoryRequest(values: Values): MemoryRequest {
  const str = (k: string) => values[k] as string | undefined;
  const count = (k: string, min: number) =>
    str(k) === undefined ? undefined : intFlag(k, str(k), min, min);
  return {
    preset: str("preset"),
    trunkGb: numberFlag("trunk-gb", str("trunk-gb"), 0),
    cacheGb: numberFlag("cache-gb", str("cache-gb"), 0),
    memoryMaxGb: memoryMaxFlag(str("memory-max")),
    pinLayers: count("pin-layers", 0),
    ringSlots: count("ring-slots", 1),
    cacheSlots: count("cache-slots", 1),
    pieceMb: numberFlag("piece-mb", str("piece-mb"), 0.004096),
    lmHead: lmHeadFlag(str("lm-head")),
  };
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

/**
 * The process's resident memory before loading: what every plan counts as its baseline.
 * `run`, `chat`, `serve` and `doctor` all measure it here, after opening the checkpoint and
 * the tokenizer and before any weight is read, so that they plan the same numbers.
 */
export function baselineBytes(): number {
  return Deno.memoryUsage().rss;
}

/** Handles --list-presets: prints them and returns true when it was given. */
export function listPresetsIfAsked(values: Values): boolean {
  if (!values["list-presets"]) return false;
  console.log(formatPresets({ context: DEFAULT_CONTEXT, batch: PREFILL_CHUNK }));
  return true;
}

/** What {@link loadPlanned} needs besides the flags. */
export interface PlannedLoad {
  /** The run the plan is for (positions, batch, extra buffers). */
  shape: RunShape;
  /** Prints the plan before loading. */
  log?: (line: string) => void;
  /** Load hooks (progress, tracing). */
  load?: Pick<LoadOptions, "trace" | "onLoad" | "onLayer">;
}

/**
 * max_position_embeddings is a ceiling (no position past it was trained): a run, chat or server whose
 * context (prompt + generated tokens, or --context) is past the model's positions is refused
 * before anything is planned.
 */
function checkPositions(config: Checkpoint["config"], positions: number): void {
  const max = config.maxPositions;
  if (max !== undefined && positions > max) {
    throw badInput(
      `the run needs ${positions} positions (prompt + tokens to generate, or --context), but ` +
        `max_position_embeddings in ${config.source} is ${max}: the model has no positions ` +
        `past it; lower --context, --gen/--max-tokens, or shorten the prompt`,
    );
  }
}

/** Loads `ckpt` under the memory flags in `values`: plan first, then load as planned. */
export async function loadPlanned(
  ckpt: Checkpoint,
  values: Values,
  options: PlannedLoad,
): Promise<{ model: Model; plan: MemoryPlan; request: MemoryRequest; packPath?: string }> {
  const request = memoryRequest(values);
  const policyName = (values["cache-policy"] as string | undefined) ?? "lru";
  // Own keys only: "constructor" or "__proto__" would be found on Object.prototype, not a policy.
  const policy = Object.hasOwn(POLICIES, policyName) ? POLICIES[policyName] : undefined;
  if (!policy) {
    throw badInput(
      `--cache-policy: unknown policy '${policyName}'; choose ${Object.keys(POLICIES).join(", ")}`,
    );
  }
  checkPositions(ckpt.config, options.shape.positions);
  const trunkDir = values.trunk as string | undefined;
  const pack = trunkDir === undefined ? undefined : await openTrunkPack(trunkDir, ckpt);
  const plan = planMemory(ckpt.config, ckpt.refs, options.shape, request, baselineBytes());
  options.log?.(formatPlan(plan));
  const model = Model.load(ckpt, {
    plan,
    pack,
    verifyPack: values["verify-pack"] as boolean | undefined,
    policy: policy(),
    ...options.load,
  });
  return { model, plan, request, packPath: pack?.bin };
}
