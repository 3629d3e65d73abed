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
 * the thread count to OpenMP. Read and env may be scoped: see the README.) A missing
 * permission is named in the error.
 *
 * Leaving a `for await` loop over `chat()` or `complete()` early cancels the generation at
 * once (its `result` says `cancelled`); `using model = await openModel(...)` closes it at the
 * end of the scope.
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

export { openModel } from "./lib/api/model.ts";
export type {
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
  UsageInfo,
} from "./lib/api/types.ts";
export type { TokenStep as GenerateStep } from "./lib/generate/decode.ts";
export { ExitCode, K3Error } from "./lib/errors.ts";
export type { ExitCodeValue, K3ErrorOptions, Remedy } from "./lib/errors.ts";
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
export type { GrammarSpec } from "./lib/text/grammar.ts";
export { Tokenizer } from "./lib/text/tokenizer.ts";
export type { EncodeOptions } from "./lib/text/tokenizer.ts";
export type { CacheStats } from "./lib/memory/experts.ts";
export type {
  SpeculateMethod,
  SpeculationConfig,
  SpeculationStats,
} from "./lib/speculate/speculate.ts";
export { VERSION } from "./lib/version.ts";
