/**
 * k3 for Deno scripts: open a Kimi K3 checkpoint, generate, render and parse chats.
 *
 * @example
 * ```ts
 * import { openModel } from "./mod.ts";
 * const model = await openModel("/models/k3");
 * for await (const step of model.generate([1, 2, 3], { maxTokens: 8 })) console.log(step.token);
 * model.close();
 * ```
 * @module
 */
import { generate, type GenerateOptions, type GenerateStep } from "./lib/generate.ts";
import { Model, type OpenOptions } from "./lib/model/model.ts";
import { setThreads } from "./ffi/library.ts";

export { isDenseLayer, parseConfig, readConfig } from "./lib/config.ts";
export type { K3Config, KdaConfig } from "./lib/config.ts";
export { openCheckpoint } from "./lib/checkpoint/checkpoint.ts";
export type { Checkpoint } from "./lib/checkpoint/checkpoint.ts";
export type { ModelRefs, TensorRef } from "./lib/checkpoint/types.ts";
export { ExitCode, K3Error } from "./lib/errors.ts";
export { argmax, Sampler } from "./lib/text/sampler.ts";
export type { SamplingOptions } from "./lib/text/sampler.ts";
export { StreamDecoder, Tokenizer } from "./lib/text/tokenizer.ts";
export { renderChat, renderChatIds } from "./lib/text/chat.ts";
export type { ChatMessage, RenderOptions, Segment, ToolCall } from "./lib/text/chat.ts";
export { parseOutput } from "./lib/text/parse.ts";
export { StopMatcher } from "./lib/text/stops.ts";
export { Session } from "./lib/session.ts";
export type { GenerateOptions, GenerateStep, TokenPicker } from "./lib/generate.ts";
export { SequenceState } from "./lib/model/state.ts";
export { VERSION } from "./lib/version.ts";

/** Options of {@link openModel}. */
export interface OpenModelOptions extends OpenOptions {
  /** OpenMP threads; must be set before the first model opens in this process. */
  threads?: number;
}

/** Generation options for {@link K3Model.generate}. */
export type GenerateParams = GenerateOptions;

/** An open model. Close it to free its memory. */
export interface K3Model {
  /** The checkpoint's configuration. */
  readonly config: Model["config"];
  /**
   * Generates up to `maxTokens` tokens after `ids`, one step at a time. Step 0 carries the
   * distribution after the prompt.
   */
  generate(ids: number[], params: GenerateParams): AsyncGenerator<GenerateStep>;
  /** Logits after running `ids` from an empty state (fp32, vocab). */
  logits(ids: number[]): Promise<Float32Array>;
  /** The underlying engine, for advanced use (states, forward calls). */
  readonly engine: Model;
  close(): void;
}

/** Opens the checkpoint in `dir` (config.json, safetensors shards, index). */
export async function openModel(dir: string, options: OpenModelOptions = {}): Promise<K3Model> {
  if (options.threads !== undefined) setThreads(options.threads);
  const engine = await Model.open(dir, options);
  return {
    config: engine.config,
    engine,
    generate: (ids, params) => generate(engine, ids, params),
    logits: (ids) => engine.forward.forward(engine.newState(ids.length), ids),
    close: () => engine.close(),
  };
}
