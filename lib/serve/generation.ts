/**
 * One generation request in k3's terms, whatever API it came from: the prompt ids (a rendered
 * chat, or raw text), the job the engine runs, and what came out (reasoning, answer, tool
 * calls, log probabilities, usage), both step by step for streaming and at the end.
 * The engine side (queueing, decoding) is runner.ts; the wire formats are openai.ts,
 * responses.ts and anthropic.ts.
 */
import type { TokenPicker } from "../generate/decode.ts";
import {
  type ChatMessage,
  endThinking,
  leastChatTokens,
  renderChatIdsYielding,
  type RenderOptions,
  segmentIds,
  toolCallPrefill,
} from "../text/chat.ts";
import type { ParsedToolCall } from "../text/parse.ts";
import {
  checkLogitBias,
  Sampler,
  type SamplingOptions,
  type TokenHistory,
} from "../text/sampler.ts";
import {
  type CompiledGrammar,
  ConstrainedPicker,
  GrammarEngine,
  type GrammarMatcher,
  type GrammarSpec,
} from "../text/grammar.ts";
import { type StreamEvent, TextStream } from "../text/stream.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import { ApiError, badField } from "./request.ts";
import { ExitCode, K3Error } from "../errors.ts";
import { type Engine, type Job, type JobResult, type RequestTiming, runJobs } from "./runner.ts";
import type { SpeculationConfig } from "../speculate/speculate.ts";

/** What to generate, as the API parsers produce it. */
export interface GenerationSpec {
  input:
    | {
      kind: "chat";
      messages: ChatMessage[];
      render: RenderOptions;
      /** Force a call of this tool: the prompt is pre-filled up to the call's opening. */
      forceTool?: string;
      /** At most this many thinking tokens: then k3 writes the think channel's end itself. */
      thinkingBudget?: number;
    }
    | { kind: "text"; prompt: string }
    /** Token ids as they are (completions with a list of ids). */
    | { kind: "ids"; ids: number[] };
  /** Absent: up to the end of the context budget. */
  maxTokens?: number;
  /** The request field that set maxTokens, for errors (max_tokens, max_output_tokens). */
  maxTokensField: string;
  stops: string[];
  sampling: SamplingOptions;
  /** Log probabilities of the chosen tokens plus this many alternatives; absent: none. */
  logprobs?: number;
  /** Stop once this many tool calls are complete. */
  maxToolCalls?: number;
  /** `speculate` (a k3 extension): undefined takes the server's, null turns it off. */
  speculation?: SpeculationConfig | null;
  /** Constrain the answer (after the think channel) to this grammar. */
  grammar?: { spec: GrammarSpec; field: string };
}

/** A spec turned into token ids, checked against the context budget. */
export interface PreparedGeneration {
  spec: GenerationSpec;
  /** The rendered prompt, followed by any pre-fill. */
  promptIds: number[];
  /** The tail of promptIds that pre-fills the assistant's answer (a forced tool call). */
  prefill: number[];
  maxTokens: number;
  /** Chat: the generation prompt opened the think channel. Null for raw text. */
  thinking: boolean | null;
}

/** A log probability (natural log) and its alternatives, of one generated token. */
export interface TokenLogprob {
  /** The token's text (its bytes decoded alone; U+FFFD for part of a character). */
  token: string;
  bytes: number[];
  logprob: number;
  /** The most likely tokens at that step, by falling probability (ties: lowest id). */
  top: { token: string; bytes: number[]; logprob: number }[];
}

/** A tool call with the id k3 gave it; prefix the id per API (call_, toolu_, fc_). */
export interface ToolCallOut extends ParsedToolCall {
  /** Unique within the server's life. */
  id: string;
  /** The arguments as a JSON string (a raw json block is passed through as written). */
  json: string;
}

/** What one token step added (the unit of streaming). */
export interface GenerationDelta {
  reasoning: string;
  content: string;
  /** Raw text output (completions): the text of this step. */
  text: string;
  /** Log probabilities of this step's answer tokens (raw output: of every token). */
  logprobs: TokenLogprob[];
  toolCalls: ToolCallOut[];
}

/** How a generation ended. */
type Ended = "stop_id" | "stop_string" | "tool_limit" | "length" | "cancelled";

export interface GenerationResult {
  prepared: PreparedGeneration;
  /** Null when thinking is off (or for raw text). */
  reasoning: string | null;
  /** The answer (raw text output: all of it). */
  content: string;
  toolCalls: ToolCallOut[];
  /** Problems in the tools channel (a call the model wrote wrong is left out). */
  malformed: string[];
  ended: Ended;
  /** The stop string that ended it. */
  stop: string | null;
  /** Answer tokens (raw output: every token), in order, when logprobs were asked for. */
  logprobs: TokenLogprob[];
  /** Character offsets of each logprobs token in `content` (raw output; code points). */
  textOffsets: number[];
  usage: { prompt: number; completion: number; cached: number; reasoning: number };
  completionIds: number[];
  timing: RequestTiming;
  /** Draft tokens verified in passes, and how many of them the model accepted. */
  speculation: { drafted: number; accepted: number };
}

/**
 * Renders (or encodes) the prompt, appends a forced call's pre-fill, and fixes the completion
 * budget. Client mistakes are ApiErrors (400) naming the field.
 */
export async function prepareGeneration(
  tokenizer: Tokenizer,
  spec: GenerationSpec,
  contextTokens: number,
): Promise<PreparedGeneration> {
  // A prompt far over the context is refused before it is encoded (8 MiB: seconds of work).
  const least = leastPromptTokens(tokenizer, spec);
  completionBudget(least, spec.maxTokens, contextTokens, spec.maxTokensField, "at least ");
  let promptIds: number[];
  let prefill: number[] = [];
  let thinking: boolean | null = null;
  if (spec.input.kind === "chat") {
    const { messages, render, forceTool } = spec.input;
    thinking = render.thinking ?? true;
    promptIds = (await renderChatIdsYielding(tokenizer, messages, render)).ids;
    if (forceTool !== undefined) {
      prefill = segmentIds(tokenizer, toolCallPrefill(forceTool, thinking));
      promptIds = [...promptIds, ...prefill];
    }
  } else if (spec.input.kind === "ids") {
    promptIds = spec.input.ids;
  } else {
    promptIds = await tokenizer.encodeYielding(spec.input.prompt, { allowSpecial: false });
    if (promptIds.length === 0) throw badField("prompt", "is empty after tokenization");
  }
  try {
    checkLogitBias(spec.sampling, tokenizer.vocabSize);
  } catch (e) {
    throw badField("logit_bias", (e as Error).message.replace(/^logit_bias: /, ""));
  }
  const maxTokens = completionBudget(
    promptIds.length,
    spec.maxTokens,
    contextTokens,
    spec.maxTokensField,
  );
  return { spec, promptIds, prefill, maxTokens, thinking };
}

/**
 * A lower bound on the prompt's tokens, without encoding it: a token covers at most the
 * longest token's bytes, and text has at least as many UTF-8 bytes as UTF-16 units.
 */
function leastPromptTokens(tokenizer: Tokenizer, spec: GenerationSpec): number {
  const input = spec.input;
  if (input.kind === "ids") return input.ids.length;
  if (input.kind === "text") return Math.ceil(input.prompt.length / tokenizer.maxTokenBytes);
  return leastChatTokens(tokenizer, input.messages, input.render);
}

/**
 * Completion tokens allowed: the request's maximum, or the rest of the context. A prompt
 * that leaves no room, or a maximum past the budget, is a 400 saying how many tokens fit.
 * @param atLeast "at least " when `prompt` is a lower bound (the prompt not yet encoded)
 */
function completionBudget(
  prompt: number,
  requested: number | undefined,
  context: number,
  field = "max_tokens",
  atLeast = "",
): number {
  if (prompt >= context) {
    throw new ApiError(
      400,
      `the prompt is ${atLeast}${prompt} tokens but the context budget is ${context} tokens: ` +
        `at most ${context - 1} prompt tokens fit (leaving room for one completion token)`,
      "invalid_request_error",
      "messages",
      "context_length_exceeded",
    );
  }
  const room = context - prompt;
  if (requested !== undefined && requested > room) {
    throw new ApiError(
      400,
      `the prompt (${atLeast}${prompt} tokens) plus ${field} (${requested}) exceeds the ` +
        `context budget ` +
        `of ${context} tokens: at most ${room} completion tokens fit after this prompt`,
      "invalid_request_error",
      field,
      "context_length_exceeded",
    );
  }
  return requested ?? room;
}

/** Each engine's grammar compiler, made on the first request that asks for a grammar. */
const grammarEngines = new WeakMap<Engine, Promise<GrammarEngine>>();

function grammarEngineOf(engine: Engine): Promise<GrammarEngine> {
  let made = grammarEngines.get(engine);
  if (!made) {
    made = GrammarEngine.create(
      engine.tokenizer,
      engine.session.model.config.vocabSize,
      engine.stopIds,
    );
    grammarEngines.set(engine, made);
  }
  return made;
}

/**
 * The request's grammar, compiled (or from the cache), before anything is queued or streamed:
 * a schema the engine refuses is a 400 naming the field and the keyword.
 */
export async function compileGrammar(
  engine: Engine,
  spec: GenerationSpec,
): Promise<CompiledGrammar | undefined> {
  if (!spec.grammar) return undefined;
  const grammars = await grammarEngineOf(engine);
  try {
    return await grammars.compile(spec.grammar.spec);
  } catch (e) {
    if (e instanceof K3Error && e.exitCode === ExitCode.badInput) {
      throw badField(spec.grammar.field, e.message);
    }
    throw e;
  }
}

/** Where a generation runs and how it is identified. */
interface RunContext {
  engine: Engine;
  /** The request's compiled grammar (compileGrammar), if it asked for one. */
  grammar?: CompiledGrammar;
  id: string;
  seq: number;
  queuedBehind: number;
  arrived: number;
  signal: AbortSignal;
  /** Once the generation has a sequence: the prompt tokens a retained state spared. */
  onStart?: (reusedTokens: number) => void;
}

let callCounter = 0;

/**
 * `n` generations of one prepared prompt (the `n` field), its prompt prefilled once. Choice
 * i samples with seed + i (no seed: 0 + i), so with a seed each equals the request alone with
 * that seed. `onDelta(i, d)` hears what each token step of choice i added.
 */
export async function runGenerations(
  run: RunContext,
  prepared: PreparedGeneration,
  n: number,
  onDelta?: (choice: number, delta: GenerationDelta) => void,
): Promise<GenerationResult[]> {
  // Each choice keeps its own place in the grammar. A forced tool call's arguments are not
  // the answer the grammar describes, so they stay unconstrained.
  const grammar = prepared.prefill.length === 0 ? run.grammar : undefined;
  const grammars = grammar ? await grammarEngineOf(run.engine) : undefined;
  const matchers = await Promise.all(
    Array.from({ length: grammar ? n : 0 }, () => grammars!.matcher(grammar!)),
  );
  const choices = Array.from(
    { length: n },
    (_, i) =>
      new Choice(run, prepared, n > 1 ? i : 0, onDelta && ((d) => onDelta(i, d)), matchers[i]),
  );
  try {
    const results = await runJobs(run.engine, choices.map((c) => c.job));
    return results.map((r, i) => choices[i].finish(r));
  } finally {
    for (const m of matchers) m.dispose();
  }
}

/** One choice of a generation: its sampler, text stream and deltas. */
class Choice {
  readonly job: Job;
  readonly #collector: DeltaCollector;
  readonly #text: TextStream;
  readonly #speculation = { drafted: 0, accepted: 0 };

  constructor(
    run: RunContext,
    readonly prepared: PreparedGeneration,
    seedOffset: number,
    onDelta?: (delta: GenerationDelta) => void,
    matcher?: GrammarMatcher,
  ) {
    const { tokenizer } = run.engine;
    const { spec } = prepared;
    const collector = this.#collector = new DeltaCollector(tokenizer, prepared, onDelta);
    const text = this.#text = new TextStream(tokenizer, {
      stops: spec.stops,
      chat: prepared.thinking === null ? undefined : {
        thinking: prepared.thinking,
        keepCutCall: true,
        maxToolCalls: spec.maxToolCalls,
        forcedCall: prepared.prefill.length > 0,
      },
      onEvent: (e) => collector.event(e),
    });
    text.prime(prepared.prefill);
    const sampling = seedOffset === 0
      ? spec.sampling
      : { ...spec.sampling, seed: (spec.sampling.seed ?? 0) + seedOffset };
    let picker: TokenPicker = new Sampler(sampling);
    if (matcher) {
      const thinkEnd = prepared.thinking ? segmentIds(tokenizer, endThinking()) : undefined;
      picker = new ConstrainedPicker(picker, matcher, { thinkEnd });
    }
    const budget = spec.input.kind === "chat" ? spec.input.thinkingBudget : undefined;
    if (budget !== undefined && prepared.thinking) {
      picker = new ThinkingBudget(picker, text, budget, segmentIds(tokenizer, endThinking()));
    }
    this.job = {
      id: run.id,
      seq: run.seq,
      queuedBehind: run.queuedBehind,
      promptIds: prepared.promptIds,
      maxTokens: prepared.maxTokens,
      picker,
      text,
      signal: run.signal,
      arrived: run.arrived,
      onStart: run.onStart,
      // A thinking budget picks from the text seen so far, not from the history alone, so it
      // cannot pick positions ahead: no speculation under it.
      speculation: picker instanceof ThinkingBudget ? null : spec.speculation,
      onStep: (step) => {
        this.#speculation.drafted += step.drafted ?? 0;
        this.#speculation.accepted += step.accepted ?? 0;
        if (spec.logprobs !== undefined) collector.step(step.token, step.logits);
      },
    };
  }

  /** The result of this choice once its job ended. */
  finish(result: JobResult): GenerationResult {
    const { prepared } = this;
    const collector = this.#collector;
    collector.deliver();
    const out = this.#text.result();
    const ended: Ended = result.finish === "cancelled"
      ? "cancelled"
      : out.stoppedBy === "stop"
      ? "stop_string"
      : out.stoppedBy === "toolCalls"
      ? "tool_limit"
      : result.finish === "stop"
      ? "stop_id"
      : "length";
    return {
      prepared,
      reasoning: out.reasoning,
      content: out.content,
      toolCalls: collector.calls,
      malformed: out.malformed,
      ended,
      stop: out.stop,
      logprobs: collector.logprobs,
      textOffsets: collector.offsets,
      usage: {
        prompt: prepared.promptIds.length,
        completion: result.completionIds.length,
        cached: result.reusedTokens,
        reasoning: out.reasoningTokens,
      },
      completionIds: result.completionIds,
      timing: result.timing,
      speculation: { ...this.#speculation },
    };
  }
}

/**
 * Caps the thinking: once `budget` tokens were generated in the think channel, the next
 * tokens are `<|close|>think<|sep|><|open|>response<|sep|>` (as the renderer writes them),
 * not sampled; then sampling goes on in the answer. A marker half written waits to finish.
 */
class ThinkingBudget implements TokenPicker {
  #queue: number[] = [];

  constructor(
    readonly inner: TokenPicker,
    readonly stream: TextStream,
    readonly budget: number,
    readonly close: number[],
  ) {}

  next(logits: Float32Array, history: TokenHistory): number {
    const s = this.stream;
    if (
      this.#queue.length === 0 && s.phase === "reasoning" && !s.inMarker &&
      s.reasoningTokens >= this.budget
    ) this.#queue = [...this.close];
    return this.#queue.shift() ?? this.inner.next(logits, history);
  }
}

/** Gathers stream events into one delta per token step. */
class DeltaCollector {
  readonly calls: ToolCallOut[] = [];
  readonly logprobs: TokenLogprob[] = [];
  readonly offsets: number[] = [];
  #delta: GenerationDelta = emptyDelta();
  #pending?: TokenLogprob;
  /** Code points of raw text emitted so far. */
  #textLength = 0;

  constructor(
    readonly tokenizer: Tokenizer,
    readonly prepared: PreparedGeneration,
    readonly onDelta?: (d: GenerationDelta) => void,
  ) {}

  /** A decode step, before its token reaches the stream: its log probability, if asked for. */
  step(token: number, logits: Float32Array): void {
    this.#pending = tokenLogprob(this.tokenizer, logits, token, this.prepared.spec.logprobs ?? 0);
  }

  event(e: StreamEvent): void {
    const d = this.#delta;
    if (e.type === "text") {
      if (e.channel === "reasoning") d.reasoning += e.text;
      else if (e.channel === "content") d.content += e.text;
      else {
        d.text += e.text;
      }
    } else if (e.type === "toolCall") {
      const call: ToolCallOut = {
        ...e.call,
        id: `${Date.now().toString(36)}${(++callCounter).toString(36).padStart(6, "0")}`,
        json: typeof e.call.arguments === "string"
          ? e.call.arguments
          : JSON.stringify(e.call.arguments),
      };
      this.calls.push(call);
      d.toolCalls.push(call);
    } else if (e.type === "token") {
      const lp = this.#pending;
      this.#pending = undefined;
      if (lp && (e.role === "content" || e.role === "text")) {
        if (e.role === "text") this.offsets.push(this.#textLength);
        this.logprobs.push(lp);
        d.logprobs.push(lp);
      }
      this.deliver();
    }
  }

  /** Hands over what was gathered since the last delivery (if anything). */
  deliver(): void {
    const d = this.#delta;
    this.#textLength += [...d.text].length;
    if (d.reasoning || d.content || d.text || d.logprobs.length || d.toolCalls.length) {
      this.onDelta?.(d);
    }
    this.#delta = emptyDelta();
  }
}

function emptyDelta(): GenerationDelta {
  return { reasoning: "", content: "", text: "", logprobs: [], toolCalls: [] };
}

/** Stands in for -Infinity (a token the model rules out), which JSON cannot carry. */
const LOGPROB_FLOOR = -9999;

/**
 * log softmax(logits)[token] and the `top` most likely tokens, in float64 from the fp32 logits:
 * lse = max + log(sum over ids in order of exp(logit - max)); logprob = logit - lse.
 */
function tokenLogprob(
  tokenizer: Tokenizer,
  logits: Float32Array,
  token: number,
  top: number,
): TokenLogprob {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const lse = max + Math.log(sum);
  const lp = (id: number) => {
    const v = logits[id] - lse;
    return Number.isFinite(v) ? v : LOGPROB_FLOOR;
  };
  const entry = (id: number) => ({
    token: tokenizer.decode([id]),
    bytes: [...tokenizer.idToBytes(id)],
    logprob: lp(id),
  });
  return { ...entry(token), top: topIds(logits, top).map(entry) };
}

/** The `k` ids with the highest logits, falling, ties to the lowest id. */
function topIds(logits: Float32Array, k: number): number[] {
  const best: number[] = [];
  if (k <= 0) return best;
  for (let id = 0; id < logits.length; id++) {
    const l = logits[id];
    if (best.length === k && !(l > logits[best[k - 1]])) continue;
    let at = best.length === k ? k - 1 : best.length;
    while (at > 0 && l > logits[best[at - 1]]) at--;
    best.splice(at, 0, id);
    if (best.length > k) best.pop();
  }
  return best;
}
