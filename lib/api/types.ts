/**
 * The library's types: how to open a model, what a call takes and gives back, and the
 * {@link Model} an open model is. mod.ts exports them; lib/api/model.ts implements them.
 */
import type { TokenStep as GenerateStep } from "../generate/decode.ts";
import type { CacheStats } from "../memory/experts.ts";
import type { SpeculationConfig, SpeculationStats } from "../speculate/speculate.ts";
import type {
  ChatMessage,
  RenderOptions,
  ResponseFormat,
  ThinkingEffort,
  ToolCall,
  ToolChoice,
} from "../text/chat.ts";
import type { GrammarSpec } from "../text/grammar.ts";
import type { SamplingOptions } from "../text/sampler.ts";
import type { Tokenizer } from "../text/tokenizer.ts";

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
  /**
   * Constrain the output to a JSON Schema, any JSON object or an EBNF grammar: at every step
   * the tokens that would leave it are masked before sampling, and it ends at a stop id once
   * complete (`stopIds` must hold the model's). A schema keyword the engine cannot enforce throws K3Error (exit code 2).
   */
  grammar?: GrammarSpec;
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
  /**
   * Constrain the answer (after the think channel) to a JSON Schema, any JSON object or an EBNF grammar: at every step
   * the tokens that would leave it are masked before sampling, and it ends at a stop id once
   * complete. A schema keyword the engine cannot enforce throws K3Error (exit code 2).
   */
  grammar?: GrammarSpec;

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
  /** Set when the answer was cut short (by the signal, or by leaving the loop). */
  interrupted?: boolean;
}

/**
 * Why an answer or completion ended: `stop` (a stop id or string), `length` (`maxTokens` or
 * the context), `interrupted` (the call's `signal` was aborted), `cancelled` (the caller left
 * the `for await` loop early: generation stopped at once and its batch slot was freed).
 */
export type FinishReason = "stop" | "length" | "interrupted" | "cancelled";

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

/**
 * A streamed answer: iterate for deltas; `result` settles when it ends. Leaving the loop
 * early (`break`, `return`, a throw) cancels the generation at once; `result` then says
 * `cancelled` and holds what was generated.
 */
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
  /**
   * Constrain the output to a JSON Schema, any JSON object or an EBNF grammar: at every step
   * the tokens that would leave it are masked before sampling, and it ends at a stop id once
   * complete. A schema keyword the engine cannot enforce throws K3Error (exit code 2).
   */
  grammar?: GrammarSpec;
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

/**
 * A streamed completion: iterate for text pieces; `result` settles when it ends. Leaving the
 * loop early cancels the generation at once; `result` then says `cancelled`.
 */
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
export interface Model extends Disposable {
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
  /**
   * Frees native memory and closes files. Calls still running end after their current step
   * and reject with a K3Error ("the model was closed"); the memory is freed once the last of
   * them has ended. Every later call (render, generate, save or load state, report, cache
   * statistics) throws it. `using model = await openModel(...)` closes it at the end of the
   * scope ([Symbol.dispose] is close).
   */
  close(): void;
}
