/**
 * k3 for Deno scripts: the same engine as the `k3` CLI. {@link openModel} plans memory with
 * the CLI's planner and options (refusing a plan over budget before anything is allocated),
 * then gives a {@link Model}: chat with reasoning and content streamed separately, raw
 * completion, token-level generation, the plan, the run report and cache statistics.
 *
 * Run a script that imports it with plain `deno run` from any folder, no deno.json needed:
 *
 *     deno run --allow-ffi --allow-read --allow-env script.ts
 *
 * (`--allow-ffi` loads libk3, the C kernels, built by `make` in the k3 checkout;
 * `--allow-read` reads the checkpoint and the tokenizer's WASM core; `--allow-env` passes
 * the thread count to OpenMP.) A missing permission is named in the error.
 *
 * @example Chat, reasoning and answer streamed apart
 * ```ts
 * import { openModel } from "./mod.ts";
 * const model = await openModel("/models/k3", { preset: "laptop" });
 * const reply = model.chat([{ role: "user", content: "Name a prime." }], { maxTokens: 64 });
 * for await (const delta of reply) {
 *   if (delta.reasoning) console.error(delta.reasoning);
 *   if (delta.content) console.log(delta.content);
 * }
 * console.log((await reply.result).finish);
 * model.close();
 * ```
 *
 * @example The same tokens, several per trunk read when n-gram drafts are right
 * ```ts
 * import { openModel } from "./mod.ts";
 * const model = await openModel("/models/k3", { speculation: { method: "ngram", draftMax: 4 } });
 * const answer = model.complete("1, 2, 3, 1, 2, 3,", { maxTokens: 16 });
 * for await (const piece of answer) console.log(piece);
 * console.log((await answer.result).speculation);
 * model.close();
 * ```
 * @module
 */
import { LibraryLoadError, setThreads } from "./ffi/library.ts";
import { ChannelView } from "./lib/chat/display.ts";
import { type FinishReason, runTurn } from "./lib/chat/turn.ts";
import { openCheckpoint } from "./lib/checkpoint/checkpoint.ts";
import {
  contextFlag,
  contextShape,
  loadPlanned,
  memoryRequest,
  PREFILL_CHUNK,
} from "./lib/cli/memory_flags.ts";
import { stopIdsOf } from "./lib/cli/run.ts";
import { badInput } from "./lib/errors.ts";
import { checkTokenIds } from "./lib/generate/decode.ts";
import { defaultBatch, formatPlan, type MemoryPlan } from "./lib/memory/plan.ts";
import type { CacheStats } from "./lib/memory/experts.ts";
import { type IoSnapshot, streamReport, takeSnapshot } from "./lib/memory/stats.ts";
import type { Model as Engine } from "./lib/model/model.ts";
import type { SequenceState } from "./lib/model/state.ts";
import { checkpointIdentity, readStateFile, writeStateFile } from "./lib/model/state_file.ts";
import { peakRssBytes } from "./lib/io/sizes.ts";
import { DEFAULT_MAX_BATCH, DEFAULT_RETAIN, Session } from "./lib/generate/session.ts";
import {
  checkSpeculationConfig,
  newSpeculationStats,
  type SpeculationConfig,
  type SpeculationStats,
} from "./lib/speculate/speculate.ts";
import {
  type ChatMessage,
  renderChatIds,
  type RenderOptions,
  type ResponseFormat,
  type ThinkingEffort,
  type ToolCall,
  type ToolChoice,
} from "./lib/text/chat.ts";
import { Sampler, type SamplingOptions } from "./lib/text/sampler.ts";
import { TextStream } from "./lib/text/stream.ts";
import { Tokenizer } from "./lib/text/tokenizer.ts";
import { generateText } from "./lib/generate/text.ts";

export { ExitCode, K3Error } from "./lib/errors.ts";
export type { ExitCodeValue } from "./lib/errors.ts";
export { renderChat } from "./lib/text/chat.ts";
export type {
  ChatMessage,
  ContentPart,
  RenderOptions,
  ResponseFormat,
  Segment,
  ThinkingEffort,
  ToolCall,
  ToolChoice,
} from "./lib/text/chat.ts";
export { parseOutput } from "./lib/text/parse.ts";
export type { ParsedOutput, ParsedToolCall } from "./lib/text/parse.ts";
export { StopMatcher } from "./lib/text/stops.ts";
export type { StopResult } from "./lib/text/stops.ts";
export { argmax } from "./lib/text/sampler.ts";
export type { SamplingOptions } from "./lib/text/sampler.ts";
export { Tokenizer } from "./lib/text/tokenizer.ts";
export type { EncodeOptions } from "./lib/text/tokenizer.ts";
export type { FinishReason } from "./lib/chat/turn.ts";
export type { CacheStats } from "./lib/memory/experts.ts";
export type {
  SpeculateMethod,
  SpeculationConfig,
  SpeculationStats,
} from "./lib/speculate/speculate.ts";
export { VERSION } from "./lib/version.ts";

/**
 * How to open a model: the memory options of `k3 run`/`chat`/`serve` (docs/CLI.md), as
 * numbers. Budgets are in GB (1e9 bytes). Every budget gives the same bytes out.
 */
export interface OpenModelOptions {
  /** `ultra`, `laptop`, `desktop`, `workstation`, `server`, `max`, or `auto` (default). */
  preset?: string;
  /** Refuse a plan above this many GB (`--memory-max`). */
  memoryMax?: number;
  /** A trunk pack made by `k3 pack` (`--trunk`): one read per layer. */
  trunk?: string;
  /** Check each packed layer's SHA-256 the first time it is read (`--verify-pack`). */
  verifyPack?: boolean;
  /** Trunk budget in GB: pinned layers + ring (`--trunk-gb`). */
  trunkGb?: number;
  /** Expert cache budget in GB (`--cache-gb`). */
  cacheGb?: number;
  /** Positions (prompt + answer tokens) the plan reserves state for (`--context`). */
  context?: number;
  /** OpenMP threads; must be set before the first model opens in this process. */
  threads?: number;
  /**
   * Speculative decoding for every call that does not choose (`--speculate ngram
   * --draft-max K`): the same tokens and logits, several verified per forward pass. The plan
   * counts what a verify pass keeps; a call may lower `draftMax` or turn it off, not raise it.
   */
  speculation?: SpeculationConfig;
  /**
   * Sequences that may generate at once (`--max-batch`): overlapping calls, and
   * `generateBatch`, share each forward pass (one read of every weight for all of them); the
   * plan holds that many sequence states, and a call past them waits. Default: up to 8, as
   * many as a quarter of the budget holds at `context` positions.
   */
  maxBatch?: number;
  /** Expert eviction policy (`--cache-policy`, default `lru`). */
  cachePolicy?: string;
  /** Bind only the first N layers (diagnostics: the output is then not the model's). */
  layers?: number;
  /** Receives the plan and other status lines (default: nothing is printed). */
  log?: (line: string) => void;
}

/** The parts of the checkpoint's config.json a script usually wants. */
export interface ModelConfig {
  /** The config.json it came from. */
  readonly source: string;
  /** Token ids 0..vocabSize-1. */
  readonly vocabSize: number;
  /** Width of the residual stream. */
  readonly hiddenSize: number;
  /** Decoder layers. */
  readonly numLayers: number;
  /** Per layer (0-based): linear attention (`kda`) or latent attention (`mla`). */
  readonly layerKinds: readonly ("kda" | "mla")[];
  /** Routed experts per MoE layer, and how many each token uses. */
  readonly numExperts: number;
  /** Experts chosen per token. */
  readonly topK: number;
  /** `eos_token_id` from the config (possibly empty). */
  readonly eosTokenIds: readonly number[];
}

/** The memory plan the model was loaded under, as the CLI prints it and as numbers. */
export interface PlanSummary {
  /** The plan table, as `k3 run` prints it. */
  text: string;
  /** `auto`, a preset name, or `flags`. */
  source: string;
  /** What the plan adds up to, and the limit it was checked against, in bytes. */
  totalBytes: number;
  /** The limit (0 when unknown). */
  budgetBytes: number;
  /** Where the limit came from. */
  budgetSource: string;
  /** Positions of sequence state reserved (the context). */
  positions: number;
  /** Each line of the plan: what, bytes, and a note. */
  items: { name: string; bytes: number; note: string }[];
}

/** The run report of `k3 run`, for everything generated since the model opened. */
export interface RunReport {
  /** The report lines, as the CLI prints them. */
  text: string;
  /** The same numbers (the `memory` field of `k3 run --out`). */
  json: Record<string, unknown>;
  /** Peak resident memory of this process (VmHWM). */
  peakRssBytes: number;
  /** Set when the peak exceeded `memoryMax`. */
  warning?: string;
}

/** Options of {@link Model.generate}. */
export interface GenerateOptions {
  /** Stop after this many new tokens. */
  maxTokens: number;
  /** Ids that end generation (yielded, then the loop ends); default none. */
  stopIds?: readonly number[];
  /** Greedy (ties to the lowest id) unless `temperature` > 0. */
  sampling?: SamplingOptions;
  /** Aborting ends generation after the current step. */
  signal?: AbortSignal;
  /** Speculation for this call: the model's (absent), another `draftMax` up to it, or off (null). */
  speculation?: SpeculationConfig | null;
  /** Filled in with drafts proposed and accepted, when the call speculates. */
  speculationStats?: SpeculationStats;
}

/** One request of {@link Model.generateBatch}. */
export interface BatchRequest {
  /** The prompt ids. */
  ids: number[];
  /** How to generate after it (as {@link Model.generate} takes them). */
  options: GenerateOptions;
}

/** A step of one request of {@link Model.generateBatch}. */
export interface BatchStep extends GenerateStep {
  /** Which request (its index in the list). */
  request: number;
}

/** One generated token. */
export interface GenerateStep {
  /** 0-based index of the generated token. */
  index: number;
  /** The token id. */
  token: number;
  /** The distribution it was picked from (fp32, vocab); step 0: after the prompt. */
  logits: Float32Array;
  /** Wall-clock seconds of this step (step 0 includes the prefill). */
  seconds: number;
  /** Tokens run through the model in this step (the prompt minus any reused prefix, or 1). */
  fed: number;
  /** True when the token is one of `stopIds`. */
  stop: boolean;
}

/** Options of {@link Model.chat}. */
export interface ChatOptions {
  /** The think channel (default true). */
  thinking?: boolean;
  /** Thinking effort (default `max`). */
  effort?: ThinkingEffort;
  /** Tools the model may call (OpenAI function specs). */
  tools?: unknown[];
  /** Whether the model may, must or must not call tools. */
  toolChoice?: ToolChoice;
  /** Ask for JSON output. */
  responseFormat?: ResponseFormat;
  /** Tokens to generate at most (default 4096, never past the context). */
  maxTokens?: number;
  /** Greedy unless `temperature` > 0; a fresh sampler per call. */
  sampling?: SamplingOptions;
  /** Stop strings, matched on the visible reasoning and answer. */
  stop?: string[];
  /** Aborting ends the answer after the current step (the result says `interrupted`). */
  signal?: AbortSignal;
  /** Speculation for this call: the model's (absent), another `draftMax` up to it, or off (null). */
  speculation?: SpeculationConfig | null;
}

/** New text in each channel of a streamed answer. */
export interface ChatDelta {
  /** Text of the think channel. */
  reasoning: string;
  /** Text of the answer. */
  content: string;
}

/** The assistant message of an answer, ready to append to the conversation. */
export interface AssistantMessage {
  /** Always `assistant`. */
  role: "assistant";
  /** The answer. */
  content: string;
  /** The thinking, when the think channel was on. */
  reasoning_content?: string;
  /** Calls the model made in its tools channel. */
  tool_calls?: ToolCall[];
  /** Set when the answer was cut short by the signal. */
  interrupted?: boolean;
}

/** How an answer or completion went. */
export interface UsageInfo {
  /** Why it ended. */
  finish: FinishReason;
  /** Generated ids, a stop id included. */
  ids: number[];
  /** Prompt tokens, and how many came from a retained state instead of a prefill. */
  promptTokens: number;
  /** Prompt tokens reused from the previous call's state. */
  reusedTokens: number;
  /** Wall-clock seconds. */
  seconds: number;
  /** Drafts proposed and accepted, and the passes they took, when the call speculated. */
  speculation?: SpeculationStats;
}

/** The end of {@link Model.chat}. */
export interface ChatResult extends UsageInfo {
  /** The parsed answer. */
  message: AssistantMessage;
  /** Problems found in the tools channel (one line each). */
  malformedToolCalls: string[];
}

/** A streamed answer: iterate for deltas; `result` settles when it ends. */
export interface ChatStream extends AsyncIterable<ChatDelta> {
  /** The whole answer, once generation ends (rejects on an error). */
  readonly result: Promise<ChatResult>;
}

/** Options of {@link Model.complete}. */
export interface CompleteOptions {
  /** Tokens to generate at most (default 256, never past the context). */
  maxTokens?: number;
  /** Greedy unless `temperature` > 0. */
  sampling?: SamplingOptions;
  /** Stop strings. */
  stop?: string[];
  /** Also stop at the model's end ids (default true). */
  stopAtEos?: boolean;
  /** Aborting ends generation after the current step. */
  signal?: AbortSignal;
  /** Speculation for this call: the model's (absent), another `draftMax` up to it, or off (null). */
  speculation?: SpeculationConfig | null;
}

/** What {@link Model.saveState} wrote. */
export interface SavedState {
  /** Token ids (positions) in the state. */
  tokens: number;
  /** Size of the file. */
  bytes: number;
  /** Of them, tokens that came from a retained state instead of a prefill. */
  reusedTokens: number;
}

/** What {@link Model.loadState} found: the state's length, or why it was refused. */
export type StateLoad = { ok: true; tokens: number } | { ok: false; reason: string };

/** The end of {@link Model.complete}. */
export interface CompletionResult extends UsageInfo {
  /** The generated text (special tokens as their names), without a stop string. */
  text: string;
}

/** A streamed completion: iterate for text pieces; `result` settles when it ends. */
export interface CompletionStream extends AsyncIterable<string> {
  /** The whole completion, once generation ends (rejects on an error). */
  readonly result: Promise<CompletionResult>;
}

/**
 * An open model. Calls that overlap generate together (their steps share forward passes, up
 * to `maxBatch` at once, later ones wait in call order), each with the tokens it gets alone;
 * a prompt that extends an earlier one resumes from its retained state. Close it to free its
 * memory.
 */
export interface Model {
  /** The checkpoint folder. */
  readonly dir: string;
  /** The checkpoint's configuration. */
  readonly config: ModelConfig;
  /** The model's tokenizer (from `tiktoken.model` and `tokenizer_config.json`). */
  readonly tokenizer: Tokenizer;
  /** Ids that end an answer: `eos_token_id`, `[EOS]` and `<|end_of_msg|>`. */
  readonly stopIds: readonly number[];
  /** Positions of state the plan reserved: prompt + generated tokens must fit. */
  readonly context: number;
  /** The memory plan it was loaded under. */
  readonly plan: PlanSummary;
  /** A conversation as prompt ids (K3's XTML format; with the generation prompt by default). */
  renderChat(messages: ChatMessage[], options?: RenderOptions): number[];
  /** Answers `messages`, streaming reasoning and content separately. */
  chat(messages: ChatMessage[], options?: ChatOptions): ChatStream;
  /** Continues `text` (special token names are plain text). */
  complete(text: string, options?: CompleteOptions): CompletionStream;
  /** Generates after `ids`, one step at a time. Bad ids throw K3Error (exit code 2). */
  generate(ids: number[], options: GenerateOptions): AsyncGenerator<GenerateStep>;
  /**
   * Generates after several prompts at once: their steps share forward passes (each weight
   * read once per pass for all of them; `maxBatch` at a time, the rest wait), and each gets
   * the tokens and logits it gets alone. Yields every step, tagged with its request, as it
   * comes; leaving the loop early cancels the rest. Bad ids throw K3Error (exit code 2).
   */
  generateBatch(requests: BatchRequest[]): AsyncGenerator<BatchStep>;
  /** Logits (fp32, vocab) after running `ids`. */
  logits(ids: number[]): Promise<Float32Array>;
  /**
   * Writes the state after `ids` to `file`, atomically (the format of `k3 run --save-state`):
   * a later process's {@link Model.loadState} resumes any prompt that extends `ids`. For a
   * conversation, `ids` = `renderChat(messages, { addGenerationPrompt: false })` with the
   * thinking options `chat` is called with: every next turn's prompt extends it.
   */
  saveState(file: string, ids: number[]): Promise<SavedState>;
  /**
   * Offers a state file to later calls: a prompt that extends its tokens prefills only the
   * rest. A missing, stale, truncated, damaged or foreign file is refused with the reason
   * (never thrown), and prompts are then prefilled in full.
   */
  loadState(file: string): Promise<StateLoad>;
  /** Expert cache counters, or undefined when every expert is resident. */
  cacheStats(): CacheStats | undefined;
  /** The run report for everything generated since the model opened. */
  report(): RunReport;
  /** Frees native memory and closes files. */
  close(): void;
}

/** @deprecated The old name of {@link Model}. */
export type K3Model = Model;

/**
 * Opens the checkpoint in `dir` (config.json, safetensors shards, tokenizer files) under a
 * memory plan, exactly as the CLI does.
 *
 * @throws K3Error with `exitCode` 2 (bad input: permissions, files, options, libk3 not
 * built) or 3 (the plan does not fit the budget; nothing was allocated).
 */
export async function openModel(dir: string, options: OpenModelOptions = {}): Promise<Model> {
  checkPermissions(dir);
  if (options.threads !== undefined) {
    if (!Number.isInteger(options.threads) || options.threads < 1) {
      throw badInput(`openModel: threads must be a whole number >= 1, got ${options.threads}`);
    }
    setThreads(options.threads);
  }
  const values = memoryValues(options);
  const speculation = options.speculation &&
    checkSpeculationConfig(options.speculation, "openModel: speculation");
  const ckpt = await openCheckpoint(dir, { layers: options.layers });
  const tokenizer = await Tokenizer.load(ckpt.dir);
  try {
    if (tokenizer.vocabSize !== ckpt.config.vocabSize) {
      throw badInput(
        `${dir}: the tokenizer has ${tokenizer.vocabSize} ids but config.json says ` +
          `vocab_size ${ckpt.config.vocabSize}; they must come from the same release`,
      );
    }
    const context = contextFlag(values.context as string | undefined, values);
    // The plan holds every sequence that may generate at once and the retained states.
    const batch = defaultBatch(
      ckpt.config,
      ckpt.refs.layers.length,
      context,
      memoryRequest(values),
      DEFAULT_MAX_BATCH,
      DEFAULT_RETAIN,
    );
    if (options.maxBatch !== undefined) {
      if (!Number.isInteger(options.maxBatch) || options.maxBatch < 1) {
        throw badInput(`openModel: maxBatch must be a whole number >= 1, got ${options.maxBatch}`);
      }
      batch.sequences = options.maxBatch;
    }
    const { model, plan, request } = await loadPlanned(ckpt, values, {
      shape: {
        ...contextShape(context, speculation && 1 + speculation.draftMax),
        sequences: batch.sequences,
        retained: batch.retained,
      },
      log: options.log,
    });
    return new OpenedModel(
      model,
      tokenizer,
      plan,
      context,
      request.memoryMaxGb,
      batch,
      speculation,
    );
  } catch (e) {
    tokenizer.free();
    if (e instanceof LibraryLoadError) throw badInput(e.message, { cause: e });
    throw e;
  }
}

/** Bad input naming each permission a script was started without. */
function checkPermissions(dir: string): void {
  const wanted: [Deno.PermissionDescriptor, string, string][] = [
    [{ name: "ffi" }, "--allow-ffi", "to load libk3"],
    [{ name: "read", path: dir }, "--allow-read", "to read the checkpoint"],
    [{ name: "env" }, "--allow-env", "to pass the thread count to OpenMP"],
  ];
  const missing = wanted.filter(([d]) => Deno.permissions.querySync(d).state !== "granted");
  if (missing.length > 0) {
    throw badInput(
      `openModel needs ${missing.map(([, flag, why]) => `${flag} (${why})`).join(", ")}: ` +
        `run the script with deno run --allow-ffi --allow-read --allow-env`,
    );
  }
}

/** The options as the CLI's flag values, so the CLI's parser checks them the same way. */
function memoryValues(o: OpenModelOptions): Record<string, unknown> {
  const num = (name: string, v: number | undefined) => {
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw badInput(`openModel: ${name} must be a number >= 0, got ${v}`);
    }
    return String(v);
  };
  return {
    preset: o.preset,
    "memory-max": num("memoryMax", o.memoryMax),
    trunk: o.trunk,
    "verify-pack": o.verifyPack,
    "trunk-gb": num("trunkGb", o.trunkGb),
    "cache-gb": num("cacheGb", o.cacheGb),
    context: num("context", o.context),
    "cache-policy": o.cachePolicy,
  };
}

/** An async iterable of what `run` pushes, plus its result; `run` starts at once. */
function streamOf<T, R>(
  run: (push: (item: T) => void) => Promise<R>,
): AsyncIterable<T> & { result: Promise<R> } {
  const queue: T[] = [];
  let wake: (() => void) | undefined;
  let done = false;
  let failure: unknown;
  const result = run((item) => {
    queue.push(item);
    wake?.();
  }).then((r) => {
    done = true;
    wake?.();
    return r;
  }, (e) => {
    done = true;
    failure = e;
    wake?.();
    throw e;
  });
  result.catch(() => {}); // reported through the iterator or `result`, whichever is used
  return {
    result,
    async *[Symbol.asyncIterator]() {
      for (;;) {
        if (queue.length > 0) yield queue.shift()!;
        else if (done) {
          if (failure !== undefined) throw failure;
          return;
        } else await new Promise<void>((r) => (wake = r));
      }
    },
  };
}

const DEFAULT_CHAT_TOKENS = 4096;
const DEFAULT_COMPLETE_TOKENS = 256;

class OpenedModel implements Model {
  readonly session: Session;
  readonly stopIds: readonly number[];
  readonly plan: PlanSummary;
  readonly #ioStart: IoSnapshot;
  #seconds = 0;
  #closed = false;
  #identityOnce?: Promise<string>;

  constructor(
    readonly engine: Engine,
    readonly tokenizer: Tokenizer,
    readonly memoryPlan: MemoryPlan,
    readonly context: number,
    readonly memoryMaxGb: number | undefined,
    batch: { sequences: number; retained: number },
    readonly speculation?: SpeculationConfig,
  ) {
    this.session = new Session(engine, {
      prefillChunk: PREFILL_CHUNK,
      speculation,
      draftLimit: speculation?.draftMax,
      maxBatch: batch.sequences,
      retain: batch.retained,
      // A prompt no other stream waits beside is one layer-major pass as wide as the plan holds.
      lonePassTokens: engine.forward.maxTokens,
    });
    this.stopIds = stopIdsOf(engine, tokenizer);
    this.plan = {
      text: formatPlan(memoryPlan),
      source: memoryPlan.source,
      totalBytes: memoryPlan.total,
      budgetBytes: memoryPlan.budget,
      budgetSource: memoryPlan.budgetSource,
      positions: memoryPlan.positions,
      items: memoryPlan.items.map((i) => ({ name: i.name, bytes: i.bytes, note: i.note })),
    };
    this.#ioStart = takeSnapshot(engine);
  }

  get dir(): string {
    return this.engine.checkpoint.dir;
  }

  get config(): ModelConfig {
    return this.engine.config;
  }

  renderChat(messages: ChatMessage[], options: RenderOptions = {}): number[] {
    return renderChatIds(this.tokenizer, messages, options).ids;
  }

  /**
   * A call's speculation: undefined takes the model's, null is off; one the plan did not make
   * room for (a model opened without speculation) is bad input.
   */
  #speculation(asked: SpeculationConfig | null | undefined): SpeculationConfig | null | undefined {
    if (asked === undefined || asked === null) return asked;
    const config = checkSpeculationConfig(asked, "speculation");
    if (!this.speculation) {
      throw badInput(
        "speculation: the model was opened without it; pass openModel's speculation option " +
          "so the memory plan holds what a verify pass keeps",
      );
    }
    return config;
  }

  /** `{ speculation: stats }` when the call speculated, else nothing. */
  #stats(asked: SpeculationConfig | null | undefined, stats: SpeculationStats) {
    const on = asked === undefined ? this.speculation : asked;
    return on ? { speculation: stats } : {};
  }

  /** `maxTokens` checked and capped so prompt + answer fit the planned context. */
  #budget(prompt: number, maxTokens: number | undefined, fallback: number): number {
    if (prompt >= this.context) {
      throw badInput(
        `the prompt has ${prompt} tokens; the model was opened with context ${this.context} ` +
          `(openModel's context option)`,
      );
    }
    const n = maxTokens ?? fallback;
    if (!Number.isInteger(n) || n < 1) throw badInput(`maxTokens must be >= 1, got ${n}`);
    return Math.min(n, this.context - prompt);
  }

  async *generate(ids: number[], options: GenerateOptions): AsyncGenerator<GenerateStep> {
    checkTokenIds(ids, this.config.vocabSize);
    const maxTokens = this.#budget(ids.length, options.maxTokens, options.maxTokens);
    for await (
      const step of this.session.generate(ids, {
        maxTokens,
        stopIds: [...(options.stopIds ?? [])],
        picker: new Sampler(options.sampling ?? {}),
        signal: options.signal,
        speculation: this.#speculation(options.speculation),
        speculationStats: options.speculationStats,
      })
    ) {
      this.#seconds += step.seconds;
      // No event-loop turn here: the Session's scheduler gives one between passes, and an
      // extra one would make this call miss passes that others share.
      yield step;
    }
  }

  async *generateBatch(requests: BatchRequest[]): AsyncGenerator<BatchStep> {
    for (const r of requests) checkTokenIds(r.ids, this.config.vocabSize);
    const stop = new AbortController();
    // Every request is consumed here, concurrently, so their steps share passes whatever
    // the caller does with each step.
    const steps = streamOf<BatchStep, void>(async (push) => {
      await Promise.all(requests.map(async (r, request) => {
        const signal = r.options.signal
          ? AbortSignal.any([r.options.signal, stop.signal])
          : stop.signal;
        for await (const step of this.generate(r.ids, { ...r.options, signal })) {
          push({ ...step, request });
        }
      }));
    });
    try {
      yield* steps;
    } finally {
      stop.abort();
      await steps.result.catch(() => {});
    }
  }

  async logits(ids: number[]): Promise<Float32Array> {
    for await (const step of this.generate(ids, { maxTokens: 1 })) return step.logits;
    throw new Error("no step was generated");
  }

  chat(messages: ChatMessage[], options: ChatOptions = {}): ChatStream {
    const render: RenderOptions = {
      thinking: options.thinking ?? true,
      thinkingEffort: options.effort,
      tools: options.tools,
      toolChoice: options.toolChoice,
      responseFormat: options.responseFormat,
    };
    const prompt = this.renderChat(messages, render);
    const maxTokens = this.#budget(prompt.length, options.maxTokens, DEFAULT_CHAT_TOKENS);
    return streamOf<ChatDelta, ChatResult>(async (push) => {
      const view = new ChannelView(render.thinking!);
      const send = (d: ChatDelta) => (d.reasoning || d.content) && push(d);
      const stats = newSpeculationStats();
      const turn = await runTurn(this.session, this.tokenizer, messages, {
        render,
        sampling: options.sampling ?? {},
        stopIds: [...this.stopIds],
        stops: options.stop ?? [],
        maxTokens,
        signal: options.signal,
        speculation: this.#speculation(options.speculation),
        speculationStats: stats,
        onText: (piece) => void send(view.push(piece)),
      });
      send(view.flush());
      this.#seconds += turn.seconds;
      const { role: _, ...rest } = turn.message;
      const message = { role: "assistant" as const, ...rest } as AssistantMessage;
      return {
        message,
        malformedToolCalls: turn.malformed,
        finish: turn.finish,
        ids: turn.ids,
        promptTokens: turn.prompt.length,
        reusedTokens: turn.reuse.reusedTokens,
        seconds: turn.seconds,
        ...this.#stats(options.speculation, stats),
      };
    });
  }

  complete(text: string, options: CompleteOptions = {}): CompletionStream {
    const prompt = this.tokenizer.encode(text, { allowSpecial: false });
    if (prompt.length === 0) throw badInput("complete: the text is empty after tokenization");
    const maxTokens = this.#budget(prompt.length, options.maxTokens, DEFAULT_COMPLETE_TOKENS);
    return streamOf<string, CompletionResult>(async (push) => {
      const t0 = performance.now();
      const stats = newSpeculationStats();
      const out = await generateText(this.session, prompt, {
        maxTokens,
        picker: new Sampler(options.sampling ?? {}),
        stopIds: options.stopAtEos === false ? [] : [...this.stopIds],
        stream: new TextStream(this.tokenizer, { stops: options.stop ?? [] }),
        signal: options.signal,
        speculation: this.#speculation(options.speculation),
        speculationStats: stats,
        onText: (piece) => push(piece),
      });
      const seconds = (performance.now() - t0) / 1000;
      this.#seconds += seconds;
      return {
        text: out.text,
        finish: out.finish === "aborted" ? "interrupted" : out.finish,
        ids: out.ids,
        promptTokens: prompt.length,
        reusedTokens: out.reuse.reusedTokens,
        seconds,
        ...this.#stats(options.speculation, stats),
      };
    });
  }

  async saveState(file: string, ids: number[]): Promise<SavedState> {
    checkTokenIds(ids, this.config.vocabSize);
    if (ids.length === 0) throw badInput("saveState: no token ids");
    this.#budget(ids.length, 1, 1);
    let state: SequenceState | undefined, reused = 0;
    for await (
      const step of this.session.generate(ids, { maxTokens: 1, speculation: null }, (r) => {
        reused = r.reusedTokens;
      })
    ) state = step.state;
    if (!state || state.position !== ids.length) throw new Error("saveState: no state after ids");
    const bytes = await writeStateFile(file, state, await this.#identity());
    return { tokens: state.position, bytes, reusedTokens: reused };
  }

  async loadState(file: string): Promise<StateLoad> {
    const got = await readStateFile(file, this.engine.config, await this.#identity());
    if (!got.ok) return got;
    if (got.state.position >= this.context) {
      return {
        ok: false,
        reason: `its ${got.state.position} tokens do not fit the context ${this.context}`,
      };
    }
    this.session.prefixes.remember(got.state);
    return { ok: true, tokens: got.state.position };
  }

  #identity(): Promise<string> {
    return this.#identityOnce ??= checkpointIdentity(this.engine.checkpoint);
  }

  cacheStats(): CacheStats | undefined {
    const s = this.engine.stream?.cache?.stats;
    return s && { ...s };
  }

  report(): RunReport {
    const peak = peakRssBytes();
    const max = this.memoryMaxGb === undefined ? undefined : this.memoryMaxGb * 1e9;
    const r = streamReport(
      this.engine,
      this.memoryPlan,
      this.#ioStart,
      takeSnapshot(this.engine),
      this.#seconds,
      peak,
      max,
    );
    return { text: r.text, json: r.json, peakRssBytes: peak, warning: r.warning };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.session.prefixes.clear();
    this.engine.close();
    this.tokenizer.free();
  }
}
