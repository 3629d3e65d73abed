/**
 * The library's model: {@link openModel} opens a checkpoint with the engine the CLI uses
 * (lib/engine/open.ts) and gives a {@link Model} whose calls share one Session.
 */
import { LibraryLoadError } from "../../ffi/library.ts";
import { ChannelView } from "../chat/display.ts";
import { type FinishReason as TurnFinish, runTurn } from "../chat/turn.ts";
import { badInput, type K3Error } from "../errors.ts";
import { type Engine, type EngineOptions, openEngine, PREFILL_CHUNK } from "../engine/open.ts";
import { checkTokenIds, type TokenStep as GenerateStep } from "../generate/decode.ts";
import { Session } from "../generate/session.ts";
import { generateText } from "../generate/text.ts";
import { peakRssBytes } from "../io/sizes.ts";
import { formatPlan } from "../memory/plan.ts";
import type { CacheStats } from "../memory/experts.ts";
import { type IoSnapshot, streamReport, takeSnapshot } from "../memory/stats.ts";
import type { SequenceState } from "../model/state.ts";
import { checkpointIdentity, readStateFile, writeStateFile } from "../model/state_file.ts";
import {
  checkSpeculationConfig,
  newSpeculationStats,
  type SpeculationConfig,
  type SpeculationStats,
} from "../speculate/speculate.ts";
import {
  type ChatMessage,
  endThinking,
  renderChatIds,
  type RenderOptions,
  segmentIds,
} from "../text/chat.ts";
import { ConstrainedPicker, GrammarEngine, type GrammarSpec } from "../text/grammar.ts";
import { Sampler, type SamplingOptions } from "../text/sampler.ts";
import { TextStream } from "../text/stream.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import type {
  AssistantMessage,
  BatchRequest,
  BatchStep,
  ChatDelta,
  ChatOptions,
  ChatResult,
  ChatStream,
  CompleteOptions,
  CompletionResult,
  CompletionStream,
  FinishReason,
  GenerateOptions,
  Model,
  ModelConfig,
  OpenModelOptions,
  PlanSummary,
  RunReport,
  SavedState,
  StateLoad,
} from "./types.ts";

/**
 * Opens the checkpoint in `dir` (config.json, safetensors shards, tokenizer files) under a
 * memory plan, exactly as the CLI does.
 *
 * @throws K3Error with `exitCode` 2 (bad input: permissions, files, options, libk3 not
 * built) or 3 (the plan does not fit the budget; nothing was allocated).
 */
export async function openModel(dir: string, options: OpenModelOptions = {}): Promise<Model> {
  checkPermissions(dir);
  const speculation = options.speculation &&
    checkSpeculationConfig(options.speculation, "openModel: speculation");
  try {
    const engine = await openEngine(dir, engineOptions(options, speculation));
    return new OpenedModel(engine, speculation);
  } catch (e) {
    if (e instanceof LibraryLoadError) throw badInput(e.message, { cause: e });
    throw e;
  }
}

/**
 * The environment variables the library reads or sets: where libk3 is (K3_LIB), the kernels'
 * thread count and OpenMP's idle spin, both read by libgomp when libk3 loads.
 */
export const LIBRARY_ENV = ["K3_LIB", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"];

/**
 * Bad input naming each permission a script was started without, as narrowly as the library
 * uses it: env and read may be scoped (`--allow-env=VARS`, `--allow-read=MODEL,...`); ffi may
 * not, because Deno checks its pointer calls against the whole --allow-ffi, not a path.
 */
function checkPermissions(dir: string): void {
  const granted = (d: Deno.PermissionDescriptor) =>
    Deno.permissions.querySync(d).state === "granted";
  const missing: string[] = [];
  if (!granted({ name: "ffi" })) {
    missing.push("--allow-ffi (unscoped: Deno checks libk3's pointer calls against all of it)");
  }
  if (LIBRARY_ENV.some((variable) => !granted({ name: "env", variable }))) {
    missing.push(
      `--allow-env (or --allow-env=${LIBRARY_ENV.join(",")}) to find libk3 and ` +
        "set its threads",
    );
  }
  if (!granted({ name: "read", path: dir })) {
    missing.push(`--allow-read (or --allow-read=${dir},...) to read the checkpoint`);
  }
  if (missing.length > 0) {
    throw badInput(
      `openModel needs ${missing.join(", ")}: run the script with deno run --allow-ffi ` +
        `--allow-read --allow-env, or the scoped flags in k3's README`,
    );
  }
}

/** The options as the engine's, each checked under the name a script gave it. */
function engineOptions(o: OpenModelOptions, speculation?: SpeculationConfig): EngineOptions {
  const num = (name: string, v: number | undefined) => {
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw badInput(`openModel: ${name} must be a number >= 0, got ${v}`);
    }
    return v;
  };
  const whole = (name: string, v: number | undefined) => {
    if (v !== undefined && (!Number.isInteger(v) || v < 1)) {
      throw badInput(`openModel: ${name} must be a whole number >= 1, got ${v}`);
    }
    return v;
  };
  const memoryMaxGb = num("memoryMax", o.memoryMax);
  if (memoryMaxGb === 0) throw badInput("openModel: memoryMax must be above 0 GB, got 0");
  return {
    preset: o.preset,
    memoryMaxGb,
    trunkPack: o.trunk,
    verifyPack: o.verifyPack,
    trunkGb: num("trunkGb", o.trunkGb),
    cacheGb: num("cacheGb", o.cacheGb),
    context: num("context", o.context),
    cachePolicy: o.cachePolicy,
    layers: o.layers,
    threads: whole("threads", o.threads),
    draftMax: speculation?.draftMax,
    // The plan holds every sequence that may generate at once and the retained states.
    sequences: whole("maxBatch", o.maxBatch) ?? "auto",
    retained: "auto",
    stoppable: true,
    log: o.log,
  };
}

/** The K3Error of a call on a closed model, or one the model was closed under. */
function closedError(): K3Error {
  return badInput("the model was closed: open it again with openModel");
}

/**
 * An async iterable of what `run` pushes, plus its result; `run` starts at once. Leaving the
 * iteration early (break, return, a throw in the loop) aborts `run`'s signal and waits for it
 * to end, so the generation behind it stops and frees its batch slot before the loop is left.
 */
function streamOf<T, R>(
  run: (push: (item: T) => void, cancel: AbortSignal) => Promise<R>,
): AsyncIterable<T> & { result: Promise<R> } {
  const queue: T[] = [];
  const cancel = new AbortController();
  let wake: (() => void) | undefined;
  let done = false;
  let failure: unknown;
  const result = run((item) => {
    queue.push(item);
    wake?.();
  }, cancel.signal).then((r) => {
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
      try {
        for (;;) {
          if (queue.length > 0) yield queue.shift()!;
          else if (done) {
            if (failure !== undefined) throw failure;
            return;
          } else await new Promise<void>((r) => (wake = r));
        }
      } finally {
        if (!done) {
          cancel.abort();
          await result.catch(() => {});
        }
      }
    },
  };
}

/** The finish a call reports: one its caller cancelled by leaving the loop says so. */
function finishOf(finish: TurnFinish, cancel: AbortSignal): FinishReason {
  return finish === "interrupted" && cancel.aborted ? "cancelled" : finish;
}

const DEFAULT_CHAT_TOKENS = 4096;
const DEFAULT_COMPLETE_TOKENS = 256;

/**
 * A Model on an opened engine. Closing while calls run ends them after their current step
 * (each then rejects with "the model was closed") and frees the engine once the last has
 * left, so a forward pass never reads freed weights.
 */
class OpenedModel implements Model {
  readonly session: Session;
  readonly plan: PlanSummary;
  readonly #ioStart: IoSnapshot;
  #seconds = 0;
  #closed = false;
  /** Aborted by close(): every running call ends after its current step. */
  readonly #closing = new AbortController();
  /** Calls that may be in a forward pass; the engine is freed when the last one leaves. */
  #running = 0;
  #freed = false;
  #identityOnce?: Promise<string>;

  constructor(readonly engine: Engine, readonly speculation?: SpeculationConfig) {
    this.session = new Session(engine.model, {
      prefillChunk: PREFILL_CHUNK,
      speculation,
      draftLimit: speculation?.draftMax,
      maxBatch: engine.batch.sequences,
      retain: engine.batch.retained,
    });
    const plan = engine.plan;
    this.plan = {
      text: formatPlan(plan),
      source: plan.source,
      totalBytes: plan.total,
      budgetBytes: plan.budget,
      budgetSource: plan.budgetSource,
      positions: plan.positions,
      items: plan.items.map((i) => ({ name: i.name, bytes: i.bytes, note: i.note })),
    };
    this.#ioStart = takeSnapshot(engine.model);
  }

  get dir(): string {
    return this.engine.checkpoint.dir;
  }

  get config(): ModelConfig {
    return this.engine.model.config;
  }

  get tokenizer(): Tokenizer {
    this.#checkOpen(); // its WASM core is freed with the model
    return this.engine.tokenizer;
  }

  get stopIds(): readonly number[] {
    return this.engine.stopIds;
  }

  get context(): number {
    return this.engine.context;
  }

  /** xgrammar over this model's vocabulary, made on the first call that asks for a grammar. */
  #grammars?: Promise<GrammarEngine>;

  /**
   * A sampler, constrained to `grammar` when there is one (from `thinkEnd` on, if given). The
   * picker's matcher is freed by `release` once the call ends.
   */
  async #picker(
    sampling: SamplingOptions | undefined,
    grammar: GrammarSpec | undefined,
    thinkEnd?: number[],
  ): Promise<{ picker: Sampler | ConstrainedPicker; release: () => void }> {
    const sampler = new Sampler(sampling ?? {});
    if (!grammar) return { picker: sampler, release: () => {} };
    this.#grammars ??= GrammarEngine.create(
      this.tokenizer,
      this.config.vocabSize,
      [...this.stopIds],
    );
    const grammars = await this.#grammars;
    const picker = new ConstrainedPicker(
      sampler,
      await grammars.matcher(await grammars.compile(grammar)),
      { thinkEnd },
    );
    return { picker, release: () => picker.dispose() };
  }

  renderChat(messages: ChatMessage[], options: RenderOptions = {}): number[] {
    this.#checkOpen();
    return renderChatIds(this.tokenizer, messages, options).ids;
  }

  #checkOpen(): void {
    if (this.#closed) throw closedError();
  }

  /**
   * Runs `call` as a running call: refused on a closed model, ended by close() after its
   * current step (then rejected, unless the caller's own signal ended it), counted so that
   * the engine is freed only once no call is left in it.
   */
  async #run<T>(
    signals: (AbortSignal | undefined)[],
    call: (signal: AbortSignal) => Promise<T>,
  ) {
    this.#checkOpen();
    this.#running++;
    try {
      const own = signals.filter((s) => s !== undefined);
      const result = await call(AbortSignal.any([...own, this.#closing.signal]));
      if (this.#closed && !own.some((s) => s.aborted)) throw closedError();
      return result;
    } finally {
      this.#leave();
    }
  }

  #leave(): void {
    this.#running--;
    if (this.#closed && this.#running === 0) this.#free();
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
    this.#checkOpen();
    checkTokenIds(ids, this.config.vocabSize);
    const maxTokens = this.#budget(ids.length, options.maxTokens, options.maxTokens);
    const stopIds = [...(options.stopIds ?? (options.grammar ? this.stopIds : []))];
    if (options.grammar && this.stopIds.some((id) => !stopIds.includes(id))) {
      throw badInput(`a grammar ends at the model's stop ids: stopIds must hold ${this.stopIds}`);
    }
    const { picker, release } = await this.#picker(options.sampling, options.grammar);
    this.#running++;
    try {
      const signal = options.signal
        ? AbortSignal.any([options.signal, this.#closing.signal])
        : this.#closing.signal;
      for await (
        const step of this.session.generate(ids, {
          maxTokens,
          stopIds,
          picker,
          signal,
          speculation: this.#speculation(options.speculation),
          speculationStats: options.speculationStats,
        })
      ) {
        this.#seconds += step.seconds;
        // No event-loop turn here: the Session's scheduler gives one between passes, and an
        // extra one would make this call miss passes that others share.
        yield step;
        if (this.#closed) break;
      }
      if (this.#closed && !options.signal?.aborted) throw closedError();
    } finally {
      release();
      this.#leave();
    }
  }

  async *generateBatch(requests: BatchRequest[]): AsyncGenerator<BatchStep> {
    this.#checkOpen();
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
    const speculation = this.#speculation(options.speculation);
    return streamOf<ChatDelta, ChatResult>((push, cancel) =>
      this.#run([options.signal, cancel], async (signal) => {
        const view = new ChannelView(render.thinking!);
        const send = (d: ChatDelta) => (d.reasoning || d.content) && push(d);
        const stats = newSpeculationStats();
        const thinkEnd = render.thinking ? segmentIds(this.tokenizer, endThinking()) : undefined;
        const { picker, release } = await this.#picker(options.sampling, options.grammar, thinkEnd);
        const turn = await runTurn(this.session, this.tokenizer, messages, {
          render,
          sampling: options.sampling ?? {},
          picker,
          stopIds: [...this.stopIds],
          stops: options.stop ?? [],
          maxTokens,
          signal,
          speculation,
          speculationStats: stats,
          onText: (piece) => void send(view.push(piece)),
        }).finally(release);
        send(view.flush());
        this.#seconds += turn.seconds;
        const { role: _, ...rest } = turn.message;
        const message = { role: "assistant" as const, ...rest } as AssistantMessage;
        return {
          message,
          malformedToolCalls: turn.malformed,
          finish: finishOf(turn.finish, cancel),
          ids: turn.ids,
          promptTokens: turn.prompt.length,
          reusedTokens: turn.reuse.reusedTokens,
          seconds: turn.seconds,
          ...this.#stats(options.speculation, stats),
        };
      })
    );
  }

  complete(text: string, options: CompleteOptions = {}): CompletionStream {
    this.#checkOpen();
    const prompt = this.tokenizer.encode(text, { allowSpecial: false });
    if (prompt.length === 0) throw badInput("complete: the text is empty after tokenization");
    const maxTokens = this.#budget(prompt.length, options.maxTokens, DEFAULT_COMPLETE_TOKENS);
    const speculation = this.#speculation(options.speculation);
    if (options.grammar && options.stopAtEos === false) {
      throw badInput("complete: a grammar ends at the model's end ids; drop stopAtEos: false");
    }
    return streamOf<string, CompletionResult>((push, cancel) =>
      this.#run([options.signal, cancel], async (signal) => {
        const t0 = performance.now();
        const stats = newSpeculationStats();
        const { picker, release } = await this.#picker(options.sampling, options.grammar);
        const out = await generateText(this.session, prompt, {
          maxTokens,
          picker,
          stopIds: options.stopAtEos === false ? [] : [...this.stopIds],
          stream: new TextStream(this.tokenizer, { stops: options.stop ?? [] }),
          signal,
          speculation,
          speculationStats: stats,
          onText: (piece) => push(piece),
        }).finally(release);
        const seconds = (performance.now() - t0) / 1000;
        this.#seconds += seconds;
        return {
          text: out.text,
          finish: finishOf(out.finish === "aborted" ? "interrupted" : out.finish, cancel),
          ids: out.ids,
          promptTokens: prompt.length,
          reusedTokens: out.reuse.reusedTokens,
          seconds,
          ...this.#stats(options.speculation, stats),
        };
      })
    );
  }

  async saveState(file: string, ids: number[]): Promise<SavedState> {
    this.#checkOpen();
    checkTokenIds(ids, this.config.vocabSize);
    if (ids.length === 0) throw badInput("saveState: no token ids");
    this.#budget(ids.length, 1, 1);
    const identity = await this.#identity();
    return await this.#run([], async (signal) => {
      let state: SequenceState | undefined, reused = 0;
      const steps = this.session.generate(ids, { maxTokens: 1, speculation: null, signal }, (r) => {
        reused = r.reusedTokens;
      });
      for await (const step of steps) state = step.state;
      if (this.#closed) throw closedError();
      if (!state || state.position !== ids.length) throw new Error("saveState: no state after ids");
      const bytes = await writeStateFile(file, state, identity);
      return { tokens: state.position, bytes, reusedTokens: reused };
    });
  }

  async loadState(file: string): Promise<StateLoad> {
    this.#checkOpen();
    const got = await readStateFile(file, this.engine.model.config, await this.#identity());
    if (!got.ok) return got;
    this.#checkOpen();
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
    this.#checkOpen();
    const s = this.engine.model.stream?.cache?.stats;
    return s && { ...s };
  }

  report(): RunReport {
    this.#checkOpen();
    const peak = peakRssBytes();
    const maxGb = this.engine.request.memoryMaxGb;
    const model = this.engine.model;
    const r = streamReport(
      model,
      this.engine.plan,
      this.#ioStart,
      takeSnapshot(model),
      this.#seconds,
      peak,
      maxGb === undefined ? undefined : maxGb * 1e9,
    );
    return { text: r.text, json: r.json, peakRssBytes: peak, warning: r.warning };
  }

  [Symbol.dispose](): void {
    this.close();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#closing.abort();
    if (this.#running === 0) this.#free();
  }

  #free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.session.prefixes.clear();
    this.engine.close();
    this.#grammars?.then((g) => g.dispose(), () => {});
  }
}
