/**
 * What the decode loop needs to speculate (a drafter, a policy, a cap), how a user's choice
 * (`--speculate ngram --draft-max K`, a server request field) becomes it, and the counters
 * the run report prints.
 */
import { badInput } from "../errors.ts";
import type { Model } from "../model/model.ts";
import { type Drafter, NgramDrafter } from "./drafter.ts";
import { CostPolicy, type DraftPolicy, FixedPolicy, PassCost } from "./policy.ts";

/** Counters of one generation, filled in by the decode loop. */
export interface SpeculationStats {
  /** Draft tokens the drafter offered (before the policy cut them). */
  proposed: number;
  /** Draft tokens verified in a verify pass. */
  verified: number;
  /** Verified draft tokens the target confirmed (each one a token without its own pass). */
  accepted: number;
  /** Verify passes after the prompt (1 + k positions each). */
  verifyPasses: number;
  /** Plain decode steps after the prompt (one position each). */
  decodeSteps: number;
}

/** All counters zero. */
export function newSpeculationStats(): SpeculationStats {
  return { proposed: 0, verified: 0, accepted: 0, verifyPasses: 0, decodeSteps: 0 };
}

/** Speculative decoding for one generation: draft, then verify several positions per pass. */
export interface SpeculateOptions {
  /** Guesses the next tokens; a fresh one per generation. */
  drafter: Drafter;
  /** Most draft tokens per verify pass. */
  draftMax: number;
  /** When and how much to draft; the cost model (CostPolicy) when absent. */
  policy?: DraftPolicy;
  /** Counters to fill in. */
  stats?: SpeculationStats;
}

/** A drafting method a user can name. */
export type SpeculateMethod = "ngram";
/** The drafting methods a user can name. */
export const SPECULATE_METHODS: readonly SpeculateMethod[] = ["ngram"];

/** Default cap on draft tokens per verify pass. */
export const DEFAULT_DRAFT_MAX = 4;
/** Largest cap accepted (each position keeps its KDA replay record and its logits). */
export const MAX_DRAFT_MAX = 16;

/** A user's choice, as flags or a request field give it. */
export interface SpeculationConfig {
  /** Where drafts come from: `ngram` (prompt lookup over the prompt and output so far). */
  method: SpeculateMethod;
  /** Most draft tokens per verify pass (1..16). */
  draftMax: number;
  /** "cost" (default): draft only what is expected to pay; "always": verify every draft. */
  policy?: "cost" | "always";
}

/** `config` if it is a valid choice (a library caller's), else bad input naming `where`. */
export function checkSpeculationConfig(
  config: SpeculationConfig,
  where: string,
): SpeculationConfig {
  const bad = (why: string) => badInput(`${where}: ${why}`);
  if (typeof config !== "object" || config === null) throw bad("must be an object");
  if (!(SPECULATE_METHODS as readonly unknown[]).includes(config.method)) {
    throw bad(
      `method must be one of ${SPECULATE_METHODS.join(", ")}, got ${JSON.stringify(config.method)}`,
    );
  }
  const k = config.draftMax;
  if (!Number.isInteger(k) || k < 1 || k > MAX_DRAFT_MAX) {
    throw bad(`draftMax must be a whole number from 1 to ${MAX_DRAFT_MAX}, got ${k}`);
  }
  if (config.policy !== undefined && config.policy !== "cost" && config.policy !== "always") {
    throw bad(`policy must be "cost" or "always", got ${JSON.stringify(config.policy)}`);
  }
  return { method: config.method, draftMax: k, policy: config.policy };
}

const costs = new WeakMap<Model, PassCost>();

/** The measured cost of an extra position for `model`, shared by all its generations. */
function passCostOf(model: Model): PassCost {
  let c = costs.get(model);
  if (!c) costs.set(model, c = new PassCost());
  return c;
}

/** Fresh per-generation speculation options for `config` on `model`. */
export function speculateOptions(
  model: Model,
  config: SpeculationConfig,
  stats?: SpeculationStats,
): SpeculateOptions {
  return {
    drafter: new NgramDrafter(),
    draftMax: config.draftMax,
    policy: config.policy === "always"
      ? new FixedPolicy(config.draftMax)
      : new CostPolicy(passCostOf(model)),
    stats,
  };
}

/**
 * A request's `speculate` field. Absent: undefined (the server's default). false, null or
 * "off": null (off for this request). true or "ngram": n-gram drafts with the default cap.
 * An object { "method": "ngram", "draft_max": K, "policy": "cost" | "always" }, each key
 * optional. Anything else is bad input naming the field.
 */
export function parseSpeculateField(value: unknown): SpeculationConfig | null | undefined {
  if (value === undefined) return undefined;
  if (value === null || value === false || value === "off") return null;
  if (value === true || value === "ngram") return { method: "ngram", draftMax: DEFAULT_DRAFT_MAX };
  const bad = (why: string) => badInput(`speculate: ${why}`);
  if (typeof value !== "object" || Array.isArray(value)) {
    throw bad(`must be "ngram", "off", true, false or an object, got ${JSON.stringify(value)}`);
  }
  const o = value as Record<string, unknown>;
  for (const key of Object.keys(o)) {
    if (!["method", "draft_max", "policy"].includes(key)) {
      throw bad(`unknown key ${JSON.stringify(key)} (method, draft_max, policy)`);
    }
  }
  const method = o.method ?? "ngram";
  if (!(SPECULATE_METHODS as readonly unknown[]).includes(method)) {
    throw bad(
      `method must be one of ${SPECULATE_METHODS.join(", ")}, got ${JSON.stringify(method)}`,
    );
  }
  const draftMax = o.draft_max ?? DEFAULT_DRAFT_MAX;
  if (
    !Number.isInteger(draftMax) || (draftMax as number) < 1 || (draftMax as number) > MAX_DRAFT_MAX
  ) {
    throw bad(
      `draft_max must be a whole number from 1 to ${MAX_DRAFT_MAX}, got ${
        JSON.stringify(draftMax)
      }`,
    );
  }
  const policy = o.policy ?? "cost";
  if (policy !== "cost" && policy !== "always") {
    throw bad(`policy must be "cost" or "always", got ${JSON.stringify(policy)}`);
  }
  return { method: method as SpeculateMethod, draftMax: draftMax as number, policy };
}
