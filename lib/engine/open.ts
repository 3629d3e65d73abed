/**
 * The one way to open a model, for the command line and the library alike: the tokenizer
 * and the checkpoint (each checked against the other), then the memory plan (refused with
 * exit 3 before anything is allocated), then the weights loaded or streamed as it says.
 * Options are typed values; a command maps its flags to them, and the messages here name
 * what to change in words (the command line adds its flag to each remedy).
 */
import { existsSync } from "node:fs";
import * as path from "node:path";
import { setThreads } from "../../ffi/library.ts";
import { badInput } from "../errors.ts";
import { type Checkpoint, openCheckpoint } from "../checkpoint/checkpoint.ts";
import type { K3Config } from "../checkpoint/config.ts";
import { openTrunkPack, packCodedSizes } from "../layout/pack.ts";
import type { CodedSizes } from "../layout/block.ts";
import {
  defaultBatch,
  formatPlan,
  type MemoryPlan,
  type MemoryRequest,
  planMemory,
  type RunShape,
  tryPlan,
} from "../memory/plan.ts";
import { presetByName } from "../memory/presets.ts";
import { type EvictionPolicy, POLICIES } from "../memory/policy.ts";
import { type LoadOptions, Model } from "../model/model.ts";
import { DEFAULT_MAX_BATCH, DEFAULT_RETAIN } from "../generate/session.ts";
import { Tokenizer } from "../text/tokenizer.ts";

/** Prompt + completion tokens a chat, server or script may use when nothing says otherwise. */
export const DEFAULT_CONTEXT = 32768;

/** Prompt tokens per forward pass when nothing says otherwise (a preset may allow fewer). */
export const PREFILL_CHUNK = 512;

/** The expert-cache eviction policies, by name. */
export const CACHE_POLICIES: readonly string[] = Object.keys(POLICIES);

/** How weights are held: every budget gives the same bytes out, more memory only buys speed. */
export interface MemoryOptions {
  /** A preset's name (`ultra` .. `max`), or `auto` (the default: this machine's memory). */
  preset?: string;
  /** Refuse a plan above this many GB (1e9 bytes); above 0. */
  memoryMaxGb?: number;
  /** Trunk budget in GB: pinned layers and the ring the rest streams through. */
  trunkGb?: number;
  /** Expert cache budget in GB. */
  cacheGb?: number;
  /** Pin the first N layers (overrides the planner). */
  pinLayers?: number;
  /** Ring slots for the streamed layers (overrides the planner); at least 1. */
  ringSlots?: number;
  /** An expert cache of N slots (overrides the planner); at least 1. */
  cacheSlots?: number;
  /** Expert eviction policy (one of {@link CACHE_POLICIES}; default `lru`). */
  cachePolicy?: string;
  /** The trunk streams in pieces of at most this many MB (1e6 bytes). */
  pieceMb?: number;
  /** Keep lm_head resident or stream it (overrides the planner). */
  lmHead?: "resident" | "stream";
  /** Read the trunk from the pack in this folder (one read per layer) instead of the shards. */
  trunkPack?: string;
  /** Check each packed layer's SHA-256 the first time it is read. */
  verifyPack?: boolean;
}

/** Everything opening a model takes besides its folder. */
export interface EngineOptions extends MemoryOptions {
  /** Positions (prompt + generated tokens) the plan reserves state for. */
  context?: number;
  /**
   * Prompt tokens to prefill in one layer-major pass (each trunk piece and each expert read
   * once for all of them) when the budget holds them. Default: the context, within
   * {@link PREFILL_SHARE} of the budget (the prompts are not known yet); a caller that knows
   * its prompt passes its length and the pass may take the whole budget; 0: no wide pass.
   */
  prefillTokens?: number;
  /** Most prompt tokens per forward pass (default {@link PREFILL_CHUNK}, at most `context`). */
  prefillChunk?: number;
  /** Drafts a verify pass may check when speculating: the plan keeps what such a pass holds. */
  draftMax?: number;
  /** Sequences generating at once, or `auto`: as many as a quarter of the budget holds. */
  sequences?: number | "auto";
  /** Prompt states kept for reuse, or `auto`: as many as an eighth of the budget holds. */
  retained?: number | "auto";
  /** Bytes the caller keeps besides the model (e.g. every step's logits), counted in the plan. */
  extraBytes?: number;
  /**
   * Passes may stop within a layer (a chat's Ctrl-C, a client leaving): the plan keeps the
   * copy of a KDA state such a pass puts back.
   */
  stoppable?: boolean;
  /** Bind only the first N layers (diagnostics: the output is then not the model's). */
  layers?: number;
  /**
   * OpenMP threads (applied by {@link openEngine} before anything is opened; the first
   * model opened in a process fixes it).
   */
  threads?: number;
  /** Receives the plan before loading. */
  log?: (line: string) => void;
  /** Load hooks (progress, expert tracing). */
  load?: Pick<LoadOptions, "trace" | "onLoad" | "onLayer">;
}

/** A checkpoint and its tokenizer, opened and checked against each other; nothing loaded. */
export interface ModelFiles {
  checkpoint: Checkpoint;
  /** Absent only when it was optional and missing, unusable or of another vocabulary. */
  tokenizer?: Tokenizer;
  /** Why an optional tokenizer was not used. */
  tokenizerNote?: string;
  /** Seconds to open the tokenizer and the checkpoint. */
  openSeconds: number;
}

/** A model loaded under its plan. */
export interface LoadedModel {
  model: Model;
  plan: MemoryPlan;
  /** What the planner was asked (the budget `memoryMaxGb` included). */
  request: MemoryRequest;
  /** Positions the plan reserved. */
  context: number;
  /** Sequences that may generate at once, and prompt states kept for reuse. */
  batch: { sequences: number; retained: number };
  /** Ids that end an answer: `eos_token_id`, `[EOS]` and `<|end_of_msg|>`. */
  stopIds: number[];
  /** The pack the trunk is read from, when there is one. */
  packPath?: string;
}

/** An opened engine: the loaded model and its tokenizer. Close it to free both. */
export interface Engine extends LoadedModel {
  checkpoint: Checkpoint;
  tokenizer: Tokenizer;
  /** Seconds to open the files, and to open, plan and load in all. */
  openSeconds: number;
  loadSeconds: number;
  close(): void;
}

/**
 * Opens the checkpoint in `dir` with its tokenizer, plans memory for `options`, and loads.
 * @throws K3Error: exit 2 (bad files or options), 3 (the plan does not fit; nothing allocated)
 */
export async function openEngine(dir: string, options: EngineOptions = {}): Promise<Engine> {
  const t0 = performance.now();
  checkEngineOptions(options);
  const files = await openModelFiles(dir, {
    layers: options.layers,
    threads: options.threads,
    tokenizer: "required",
  });
  const tokenizer = files.tokenizer!;
  try {
    const loaded = await loadModel(files, options);
    return {
      ...loaded,
      checkpoint: files.checkpoint,
      tokenizer,
      openSeconds: files.openSeconds,
      loadSeconds: (performance.now() - t0) / 1000,
      close() {
        loaded.model.close();
        tokenizer.free();
      },
    };
  } catch (e) {
    tokenizer.free();
    throw e;
  }
}

/**
 * The tokenizer, then the checkpoint. A required tokenizer must load and cover the
 * model's vocabulary exactly; an optional one (ids in, ids out) that is missing, unusable or
 * of another vocabulary is left out, with the reason in `tokenizerNote`.
 */
export async function openModelFiles(
  dir: string,
  options: { layers?: number; threads?: number; tokenizer: "required" | "optional" },
): Promise<ModelFiles> {
  const t0 = performance.now();
  // OpenMP reads the thread count once, when libk3 loads: before anything is opened.
  if (options.threads !== undefined) {
    checkWhole("threads", options.threads, 1);
    setThreads(options.threads);
  }
  const required = options.tokenizer === "required";
  let note: string | undefined;
  // An optional tokenizer only decodes for display: any failure just leaves it out.
  let tokenizer = await loadTokenizer(dir, required).catch((e) => {
    if (required) throw e;
    note = (e as Error).message;
    return undefined;
  });
  try {
    if (options.layers !== undefined) checkWhole("layers", options.layers, 1);
    const checkpoint = await openCheckpoint(dir, { layers: options.layers });
    const mismatch = tokenizer && vocabularyMismatch(dir, tokenizer, checkpoint.config);
    if (mismatch && required) throw badInput(mismatch);
    if (mismatch) {
      note = mismatch;
      tokenizer!.free();
      tokenizer = undefined;
    }
    return {
      checkpoint,
      tokenizer,
      tokenizerNote: note,
      openSeconds: (performance.now() - t0) / 1000,
    };
  } catch (e) {
    tokenizer?.free();
    throw e;
  }
}

/** The tokenizer beside the checkpoint; undefined when optional and there is none. */
async function loadTokenizer(dir: string, required: boolean): Promise<Tokenizer | undefined> {
  if (!required && !existsSync(path.join(dir, "tiktoken.model"))) return undefined;
  return await Tokenizer.load(dir);
}

/** Why a tokenizer does not fit the checkpoint, or undefined when it does. */
function vocabularyMismatch(dir: string, t: Tokenizer, config: K3Config): string | undefined {
  if (t.vocabSize === config.vocabSize) return undefined;
  return `${dir}: the tokenizer has ${t.vocabSize} ids but config.json says ` +
    `vocab_size ${config.vocabSize}; they must come from the same release`;
}

/** Plans memory for `options` against the opened files, then loads as planned. */
export async function loadModel(files: ModelFiles, options: EngineOptions): Promise<LoadedModel> {
  checkEngineOptions(options);
  const ckpt = files.checkpoint;
  const policy = policyOf(options.cachePolicy);
  const context = contextOf(options);
  const request = memoryRequestOf(options);
  const batch = batchOf(ckpt, context, options, request);
  const shape = runShapeOf(options, batch);
  checkPositions(ckpt.config, shape.positions);
  const pack = options.trunkPack === undefined
    ? undefined
    : await openTrunkPack(options.trunkPack, ckpt);
  // A coded pack's layers are smaller: the plan counts the sizes its index gives.
  const coded = pack ? packCodedSizes(pack.index) : undefined;
  const plan = planMemory(
    ckpt.config,
    ckpt.refs,
    shape,
    coded ? { ...request, trunkCoded: coded } : request,
    baselineBytes(),
  );
  options.log?.(formatPlan(plan));
  const model = Model.load(ckpt, {
    plan,
    pack,
    verifyPack: options.verifyPack,
    policy,
    ...options.load,
  });
  return {
    model,
    plan,
    request,
    context,
    batch,
    stopIds: stopIdsOf(model, files.tokenizer),
    packPath: pack?.bin,
  };
}

/**
 * The plan `options` would get, or its refusal, without loading (for `doctor`, which shows
 * refused plans too). `baseline` is the process's resident memory to count; `coded`: the
 * coded chunk sizes of a coded trunk pack (with `trunkPack` set).
 */
export function tryPlanFor(
  ckpt: Checkpoint,
  options: EngineOptions,
  baseline: number,
  coded?: CodedSizes[],
): ReturnType<typeof tryPlan> {
  checkEngineOptions(options);
  const context = contextOf(options);
  const request = memoryRequestOf(options);
  const shape = runShapeOf(options, batchOf(ckpt, context, options, request));
  return tryPlan(ckpt.config, ckpt.refs, shape, { ...request, trunkCoded: coded }, baseline);
}

/**
 * The process's resident memory before loading: what every plan counts as its baseline,
 * measured after the checkpoint and the tokenizer are open and before any weight is read.
 */
export function baselineBytes(): number {
  return Deno.memoryUsage().rss;
}

/** The context `options` asks for: its own, else its preset's, else {@link DEFAULT_CONTEXT}. */
export function contextOf(options: Pick<EngineOptions, "context" | "preset">): number {
  if (options.context !== undefined) return options.context;
  const preset = options.preset;
  return preset && preset !== "auto" ? presetByName(preset).context : DEFAULT_CONTEXT;
}

/** The memory options as a request to the planner. */
export function memoryRequestOf(o: MemoryOptions & { trunkPack?: string }): MemoryRequest {
  return {
    preset: o.preset,
    trunkGb: o.trunkGb,
    cacheGb: o.cacheGb,
    memoryMaxGb: o.memoryMaxGb,
    pinLayers: o.pinLayers,
    ringSlots: o.ringSlots,
    cacheSlots: o.cacheSlots,
    pieceMb: o.pieceMb,
    lmHead: o.lmHead,
    trunkFrom: o.trunkPack === undefined ? "shards" : "pack",
  };
}

/** The batch the plan holds: as asked, else (`auto`) what the budget holds. */
function batchOf(
  ckpt: Checkpoint,
  context: number,
  options: EngineOptions,
  request: MemoryRequest,
): { sequences: number; retained: number } {
  const sequences = options.sequences ?? 1, retained = options.retained ?? 0;
  if (sequences !== "auto" && retained !== "auto") return { sequences, retained };
  const layers = ckpt.refs.layers.length;
  const auto = defaultBatch(
    ckpt.config,
    layers,
    context,
    request,
    DEFAULT_MAX_BATCH,
    DEFAULT_RETAIN,
  );
  return {
    sequences: sequences === "auto" ? auto.sequences : sequences,
    retained: retained === "auto" ? auto.retained : retained,
  };
}

/**
 * The share of the budget above the floor a chat, server or script gives its prefill pass (a
 * prompt up to the context in one layer-major pass): the prompts are not known when it plans,
 * so three quarters stay for resident trunk and expert cache, which every decode step reads.
 */
export const PREFILL_SHARE = 0.25;

/**
 * The run shape of a chat, server or script with `context` positions, one sequence at a time:
 * a prompt in one layer-major pass computed {@link PREFILL_CHUNK} tokens at a time, passes
 * that may stop within a layer.
 */
export function contextShape(context: number, verifyPositions?: number): RunShape {
  const draftMax = verifyPositions === undefined ? undefined : verifyPositions - 1;
  return runShapeOf({ context, draftMax, stoppable: true }, { sequences: 1, retained: 0 });
}

/** The run the plan is for. */
function runShapeOf(
  options: EngineOptions,
  batch: { sequences: number; retained: number },
): RunShape {
  const context = contextOf(options);
  return {
    positions: context,
    // A prompt up to the context in one layer-major pass, within PREFILL_SHARE of the budget.
    prefill: options.prefillTokens ?? context,
    prefillShare: options.prefillTokens === undefined ? PREFILL_SHARE : 1,
    maxBatch: Math.min(context, options.prefillChunk ?? PREFILL_CHUNK),
    extraBytes: options.extraBytes ?? 0,
    // A verify pass keeps its rewind record and logits, and room for its tokens.
    verifyPositions: options.draftMax === undefined ? undefined : 1 + options.draftMax,
    sequences: batch.sequences,
    retained: batch.retained,
    stoppable: options.stoppable,
  };
}

/** The eviction policy called `name` (own keys only: "constructor" is not a policy). */
function policyOf(name = "lru"): EvictionPolicy {
  if (!Object.hasOwn(POLICIES, name)) {
    throw badInput(
      `unknown policy '${name}' for the expert cache; choose ${CACHE_POLICIES.join(", ")}`,
    );
  }
  return POLICIES[name]();
}

/**
 * max_position_embeddings is a ceiling: a context past the model's positions is refused
 * before anything is planned.
 */
function checkPositions(config: K3Config, positions: number): void {
  const max = config.maxPositions;
  if (max === undefined || positions <= max) return;
  const words = "a shorter context: fewer tokens to generate or a shorter prompt";
  throw badInput(
    `the run needs ${positions} positions (prompt + tokens to generate, or the context), but ` +
      `max_position_embeddings in ${config.source} is ${max}: the model has no positions ` +
      `past it; ${words}`,
    { remedies: [{ option: "context", words }] },
  );
}

/** Stop ids: eos_token_id from the config, plus [EOS] and <|end_of_msg|> from the tokenizer. */
export function stopIdsOf(
  model: { config: Pick<K3Config, "eosTokenIds"> },
  tokenizer?: Tokenizer,
): number[] {
  const ids = new Set(model.config.eosTokenIds);
  for (const name of ["[EOS]", "<|end_of_msg|>"]) {
    const id = tokenizer?.specialId(name);
    if (id !== undefined) ids.add(id);
  }
  return [...ids];
}

/** Every numeric option in its range, named as the options name it. */
export function checkEngineOptions(o: EngineOptions): void {
  for (const name of ["trunkGb", "cacheGb", "memoryMaxGb", "pieceMb", "extraBytes"] as const) {
    const v = o[name];
    if (v !== undefined && (typeof v !== "number" || !Number.isFinite(v) || v < 0)) {
      throw badInput(`${name} must be a number >= 0, got ${v}`);
    }
  }
  if (o.memoryMaxGb === 0) throw badInput("memoryMaxGb must be above 0 GB, got 0");
  if (o.pieceMb !== undefined && o.pieceMb < 0.004096) {
    throw badInput(`pieceMb must be at least 0.004096 (4096 bytes), got ${o.pieceMb}`);
  }
  const counts = [
    ["pinLayers", 0],
    ["ringSlots", 1],
    ["cacheSlots", 1],
    ["prefillChunk", 1],
    [
      "draftMax",
      1,
    ],
    ["threads", 1],
    ["layers", 1],
  ] as const;
  for (const [name, min] of counts) if (o[name] !== undefined) checkWhole(name, o[name], min);
  if (o.context !== undefined) checkWhole("context", o.context, 2, 1 << 24);
  for (const name of ["sequences", "retained"] as const) {
    const v = o[name];
    if (v !== undefined && v !== "auto") checkWhole(name, v, name === "sequences" ? 1 : 0);
  }
  if (o.lmHead !== undefined && o.lmHead !== "resident" && o.lmHead !== "stream") {
    throw badInput(`lmHead must be "resident" or "stream", got ${JSON.stringify(o.lmHead)}`);
  }
}

function checkWhole(name: string, value: unknown, min: number, max = Number.MAX_SAFE_INTEGER) {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `from ${min} to ${max}`;
    throw badInput(`${name} must be a whole number ${range}, got ${value}`);
  }
}
