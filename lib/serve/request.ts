/**
 * Request bodies, whatever the API: the error every wire format answers with, the checks of
 * single fields, the sampling fields the APIs share, and the rule that nothing is silently
 * ignored: each body field is read by the parser, or is informational (accepted, and changes
 * nothing about the answer), or is a 400 that names it. No I/O here.
 */
import { ExitCode, K3Error } from "../errors.ts";
import type { SamplingOptions } from "../text/sampler.ts";

/**
 * A failure the client caused or sees, with its HTTP status and OpenAI's fields. `type` is
 * one of OpenAI's: `invalid_request_error` for the client's errors (401, 403 and 404
 * included, as OpenAI answers them), `server_error` for k3's. Anthropic's types follow from
 * the status (anthropic.ts).
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = "invalid_request_error",
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** A 400 about one request field. */
export function badField(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, "invalid_request_error", param);
}

/** A 400 for a field k3 does not support, naming it and saying what to do instead. */
export function unsupported(param: string, why: string): ApiError {
  return new ApiError(
    400,
    `${param}: ${why}`,
    "invalid_request_error",
    param,
    "unsupported_parameter",
  );
}

/** Any thrown value as an ApiError: k3's bad-input errors are the client's (400), the rest ours. */
export function apiErrorOf(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof K3Error && e.exitCode === ExitCode.badInput) return new ApiError(400, e.message);
  const message = e instanceof Error ? e.message : String(e);
  return new ApiError(500, `internal error: ${message}`, "server_error");
}

export type Body = Record<string, unknown>;

/** True for a plain JSON object. */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** Absent: undefined or null (OpenAI clients send null for "not set"). */
export function isAbsent(v: unknown): v is undefined | null {
  return v === undefined || v === null;
}

// ---- the field policy ----

/**
 * What an API does with each top-level field. `refused` maps a known field to a function that
 * returns why its value is refused (or null when that value is fine, e.g. `store: false`).
 * Any other field is refused as unknown.
 */
export interface FieldPolicy {
  /** Read by the API's parser, which checks the value. */
  handled: readonly string[];
  /** Accepted; they do not change the answer (documented in the README). */
  informational: readonly string[];
  refused?: Readonly<Record<string, (value: unknown) => string | null>>;
}

/** Refuses every field `policy` does not accept, naming it. `prefix` names a nested object. */
export function checkFields(body: Body, policy: FieldPolicy, prefix = ""): void {
  for (const [key, value] of Object.entries(body)) {
    if (isAbsent(value)) continue;
    if (policy.handled.includes(key) || policy.informational.includes(key)) continue;
    const refusal = policy.refused?.[key];
    const why = refusal ? refusal(value) : "is not a field k3 serve knows; remove it";
    if (why !== null) throw unsupported(prefix + key, why);
  }
}

/** A refusal for fields that are never supported. */
export function never(why: string): (value: unknown) => string {
  return () => why;
}

// ---- nesting ----

/** Deepest JSON nesting a body may have (the renderer recurses over tools and schemas). */
const MAX_JSON_DEPTH = 128;

/** Refuses JSON nested deeper than {@link MAX_JSON_DEPTH} (checked without recursion). */
export function checkDepth(value: unknown, limit = MAX_JSON_DEPTH): void {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    if (depth > limit) {
      throw new ApiError(
        400,
        `the request body nests JSON deeper than ${limit} levels; flatten it (tool schemas, ` +
          "messages)",
        "invalid_request_error",
        null,
        "too_deep",
      );
    }
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
}

// ---- single fields ----

/** `body[key]` if it has `type`, undefined when absent; anything else is a 400. */
export function optional<T extends string | number | boolean>(
  body: Body,
  key: string,
  type: "string" | "number" | "boolean",
  what: string,
  prefix = "",
): T | undefined {
  const v = body[key];
  if (isAbsent(v)) return undefined;
  const actual = typeof v;
  if (actual !== type) throw badField(prefix + key, `must be ${what}`);
  return v as T;
}

export function optionalNumber(
  body: Body,
  key: string,
  min: number,
  max: number,
  prefix = "",
): number | undefined {
  const v = optional<number>(body, key, "number", "a number", prefix);
  if (v !== undefined && !(v >= min && v <= max)) {
    throw badField(prefix + key, `must be from ${min} to ${max}, got ${v}`);
  }
  return v;
}

export function optionalInt(
  body: Body,
  key: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
  prefix = "",
): number | undefined {
  const v = optional<number>(body, key, "number", "a whole number", prefix);
  if (v !== undefined && (!Number.isSafeInteger(v) || v < min || v > max)) {
    const range = max === Number.MAX_SAFE_INTEGER ? `of at least ${min}` : `from ${min} to ${max}`;
    throw badField(prefix + key, `must be a whole number ${range}, got ${v}`);
  }
  return v;
}

/** An object field, or undefined when absent. */
export function optionalRecord(body: Body, key: string, prefix = ""): Body | undefined {
  const v = body[key];
  if (isAbsent(v)) return undefined;
  if (!isRecord(v)) throw badField(prefix + key, "must be an object");
  return v;
}

// ---- sampling, shared by the APIs ----

/** The fields {@link parseSampling} reads (every API takes them all). */
export const SAMPLING_FIELDS = [
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "logit_bias",
] as const;

/** Temperature ranges differ: OpenAI takes [0, 2], Anthropic [0, 1]. */
export function parseSampling(body: Body, maxTemperature = 2): SamplingOptions {
  return {
    temperature: optionalNumber(body, "temperature", 0, maxTemperature),
    topP: optionalNumber(body, "top_p", Number.MIN_VALUE, 1),
    topK: optionalInt(body, "top_k", 0),
    minP: optionalNumber(body, "min_p", 0, 1),
    seed: optionalInt(body, "seed", -Number.MAX_SAFE_INTEGER),
    presencePenalty: optionalNumber(body, "presence_penalty", -2, 2),
    frequencyPenalty: optionalNumber(body, "frequency_penalty", -2, 2),
    repetitionPenalty: positive(body, "repetition_penalty", 100),
    logitBias: parseLogitBias(body.logit_bias),
  };
}

function positive(body: Body, key: string, max: number): number | undefined {
  const v = optionalNumber(body, key, 0, max);
  if (v === 0) throw badField(key, "must be greater than 0 (1 turns it off)");
  return v;
}

/** `{"<token id>": bias}` with biases in [-100, 100]; ids are checked against the vocabulary later. */
function parseLogitBias(value: unknown): Record<number, number> | undefined {
  if (isAbsent(value)) return undefined;
  if (!isRecord(value)) throw badField("logit_bias", 'must be an object {"<token id>": bias}');
  const bias: Record<number, number> = {};
  for (const [key, b] of Object.entries(value)) {
    if (!/^\d+$/.test(key) || !Number.isSafeInteger(Number(key))) {
      throw badField("logit_bias", `${JSON.stringify(key)} is not a token id`);
    }
    if (typeof b !== "number" || !(b >= -100 && b <= 100)) {
      throw badField(
        `logit_bias.${key}`,
        `must be a number from -100 to 100, got ${JSON.stringify(b)}`,
      );
    }
    bias[Number(key)] = b;
  }
  return bias;
}

/** Stop strings: a string or a list of up to `max` non-empty strings. */
export function parseStops(value: unknown, param: string, max = 16): string[] {
  if (isAbsent(value)) return [];
  const list = typeof value === "string" ? [value] : value;
  if (
    !Array.isArray(list) || list.length > max ||
    list.some((s) => typeof s !== "string" || s === "")
  ) {
    throw badField(param, `must be a non-empty string or a list of up to ${max} of them`);
  }
  return list;
}
