/**
 * The decode loop: prefill the prompt, then one token at a time, carrying the state (or,
 * with `recompute`, re-running the whole sequence from an empty state every step).
 */
import type { Model } from "./model/model.ts";
import { argmax, type TokenHistory } from "./text/sampler.ts";
import type { SequenceState } from "./model/state.ts";
import { badInput } from "./errors.ts";

/**
 * Picks the next token from fp32 logits. `history` is the sequence so far (prompt, then the
 * tokens generated), for pickers whose rules look back (repetition penalties).
 */
export interface TokenPicker {
  next(logits: Float32Array, history: TokenHistory): number;
}

export interface GenerateOptions {
  /** Stop after this many new tokens. */
  maxTokens: number;
  /** How to pick tokens; greedy argmax (ties to the lowest id) when absent. */
  picker?: TokenPicker;
  /** Token ids that end generation; the stop token is yielded, then the loop ends. */
  stopIds?: number[];
  /** Re-run the whole sequence every step and carry no state (a check mode). */
  recompute?: boolean;
  /** Prefill the prompt in chunks of at most this many tokens. */
  prefillChunk?: number;
  /** Continue this state instead of a fresh one; it must already hold a prefix of the prompt. */
  state?: SequenceState;
  /** Checked between steps: an aborted signal ends the loop after the current step. */
  signal?: AbortSignal;
  /** Called once the whole prompt is in the state, before the first token is picked. */
  onPrefill?: (state: SequenceState) => void;
}

/** One generated token. */
export interface GenerateStep {
  /** 0-based index of the generated token. */
  index: number;
  token: number;
  /** The distribution the token was picked from (step 0: after the prompt). */
  logits: Float32Array;
  /** Wall-clock seconds of this step (step 0 includes the prefill). */
  seconds: number;
  /** Tokens fed through the model in this step. */
  fed: number;
  /** True when this token is a stop token. */
  stop: boolean;
  /** The state after this step (undefined in recompute mode). */
  state?: SequenceState;
}

/** Runs `ids` through `state` in chunks of at most `chunk` tokens; returns the last logits. */
async function feed(
  model: Model,
  state: SequenceState,
  ids: number[],
  chunk: number,
): Promise<Float32Array> {
  let logits: Float32Array | undefined;
  for (let i = 0; i < ids.length; i += chunk) {
    logits = await model.forward.forward(state, ids.slice(i, i + chunk));
  }
  return logits!;
}

/** Generates up to `maxTokens` tokens after `prompt`. */
export async function* generate(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
): AsyncGenerator<GenerateStep> {
  if (prompt.length === 0) throw badInput("the prompt is empty");
  checkTokenIds(prompt, model.config.vocabSize);
  const pick = options.picker ?? { next: argmax };
  const stops = new Set(options.stopIds ?? []);
  const chunk = Math.max(1, options.prefillChunk ?? Number.MAX_SAFE_INTEGER);
  const sequence = [...prompt];
  let state = options.state;
  if (state && !isPrefix(state.tokens, prompt)) {
    throw new Error("the given state is not a prefix of the prompt");
  }
  for (let index = 0; index < options.maxTokens; index++) {
    if (options.signal?.aborted) return;
    const t0 = performance.now();
    let logits: Float32Array;
    let fed: number;
    if (options.recompute) {
      fed = sequence.length;
      logits = await feed(model, model.newState(sequence.length), sequence, chunk);
    } else {
      state ??= model.newState(prompt.length + options.maxTokens);
      const todo = sequence.slice(state.position);
      fed = todo.length;
      // A retained state of exactly this prompt already holds its logits.
      logits = fed === 0 && state.lastLogits
        ? state.lastLogits
        : await feed(model, state, todo, index === 0 ? chunk : todo.length);
      if (index === 0) options.onPrefill?.(state);
    }
    const token = pick.next(logits, { tokens: sequence, promptLength: prompt.length });
    sequence.push(token);
    const stop = stops.has(token);
    yield {
      index,
      token,
      logits,
      seconds: (performance.now() - t0) / 1000,
      fed,
      stop,
      state,
    };
    if (stop) return;
  }
}

/** Bad input (exit 2) unless every id is a whole number in [0, vocab). */
export function checkTokenIds(ids: readonly number[], vocab: number): void {
  const bad = ids.find((id) => !Number.isInteger(id) || id < 0 || id >= vocab);
  if (bad !== undefined) {
    throw badInput(`token id ${bad} is outside the vocabulary (0..${vocab - 1})`);
  }
}

/** True when `prefix` is a prefix of `ids`. */
export function isPrefix(prefix: readonly number[], ids: readonly number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (prefix[i] !== ids[i]) return false;
  return true;
}
