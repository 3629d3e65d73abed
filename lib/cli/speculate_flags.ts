/** The speculation flags shared by `run`, `chat` and `serve`, and the line the reports print. */
import { badInput } from "../errors.ts";
import {
  DEFAULT_DRAFT_MAX,
  MAX_DRAFT_MAX,
  SPECULATE_METHODS,
  type SpeculateMethod,
  type SpeculationConfig,
  type SpeculationStats,
} from "../speculate/speculate.ts";
import { intFlag } from "./flags.ts";

/** parseArgs option specs of the speculation flags. */
export const SPECULATE_OPTIONS = {
  speculate: { type: "string" },
  "draft-max": { type: "string" },
  "draft-policy": { type: "string" },
} as const;

export const SPECULATE_HELP =
  `speculation (the same tokens and logits; fewer trunk reads per token):
  --speculate ngram     draft tokens from the prompt and output so far (prompt lookup) and
                        verify them in one forward pass
  --draft-max K         most draft tokens per verify pass (default ${DEFAULT_DRAFT_MAX}, 1..${MAX_DRAFT_MAX})
  --draft-policy P      cost (default): draft only when the measured cost of an extra
                        position says it pays; always: verify every draft (measurements)`;

interface Values {
  speculate?: string;
  "draft-max"?: string;
  "draft-policy"?: string;
}

/** The speculation the flags ask for, or undefined when --speculate is absent. */
export function speculationFlags(values: Values): SpeculationConfig | undefined {
  const method = values.speculate;
  if (method === undefined) {
    for (const f of ["draft-max", "draft-policy"] as const) {
      if (values[f] !== undefined) throw badInput(`--${f} needs --speculate ngram`);
    }
    return undefined;
  }
  if (!(SPECULATE_METHODS as readonly string[]).includes(method)) {
    throw badInput(
      `--speculate: unknown method '${method}'; choose ${SPECULATE_METHODS.join(", ")}`,
    );
  }
  const policy = values["draft-policy"] ?? "cost";
  if (policy !== "cost" && policy !== "always") {
    throw badInput(`--draft-policy wants cost or always, got '${policy}'`);
  }
  return {
    method: method as SpeculateMethod,
    draftMax: intFlag("draft-max", values["draft-max"], DEFAULT_DRAFT_MAX, 1, MAX_DRAFT_MAX),
    policy,
  };
}

/** One report line: drafts proposed and accepted, tokens per pass, trunk GB per token. */
export function formatSpeculation(
  config: SpeculationConfig,
  stats: SpeculationStats,
  tokens: number,
  trunkBytes: number,
): string {
  const passes = stats.verifyPasses + stats.decodeSteps;
  const pct = stats.verified ? ((100 * stats.accepted) / stats.verified).toFixed(1) : "0.0";
  return `speculation ${config.method}, draft max ${config.draftMax} (${
    config.policy ?? "cost"
  } policy): ` +
    `drafts proposed ${stats.proposed}, verified ${stats.verified}, accepted ${stats.accepted} ` +
    `(${pct}%); ${passes} passes for ${tokens} tokens after the first: ` +
    `${passes ? (tokens / passes).toFixed(2) : "0.00"} tokens per pass; ` +
    `trunk ${(tokens ? trunkBytes / tokens / 1e9 : 0).toFixed(3)} GB read per generated token`;
}
