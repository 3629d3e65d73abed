/**
 * The decode loop: prefill the prompt, then one token at a time, carrying the state (or,
 * with `recompute`, re-running the whole sequence from an empty state every step).
 *
 * With `speculate`, a step may instead be one verify pass over the last token and k draft
 * tokens: the target picks a token at every position, the drafts are accepted up to the
 * first that differs from the target's pick, and the accepted ones plus the target's own
 * next token are emitted. Every emitted token, its logits and the state after it are those
 * plain decoding gives, byte for byte: a position's logits do not depend on how many
 * positions share the pass, the picker depends only on (logits, history), and the
 * state advances by replaying exactly the emitted positions (lib/model/rewind.ts).
 */
import type { SequenceInput } from "../model/forward.ts";
import type { Model } from "../model/model.ts";
import { PassRecord } from "../model/rewind.ts";
import type { SequenceState } from "../model/state.ts";
import { type Draft, NO_DRAFT } from "../speculate/drafter.ts";
import { CostPolicy } from "../speculate/policy.ts";
import type { SpeculateOptions } from "../speculate/speculate.ts";
import { argmax, type TokenHistory } from "../text/sampler.ts";
import { badInput } from "../errors.ts";

/** Picks the next token from fp32 logits. */
export interface TokenPicker {
  /**
   * The token after `history` (the prompt, then the tokens generated so far; its length
   * minus the prompt's is the position being picked). The result must depend on the logits
   * and the history alone, so that a verify pass may pick several positions ahead.
   */
  next(logits: Float32Array, history: TokenHistory): number;
}

const GREEDY: TokenPicker = { next: (logits) => argmax(logits) };

export type { SpeculateOptions };

/**
 * What runs the forward passes: the model's own Forward (alone), or a Session's scheduler,
 * which runs the passes of several generations as one (lib/generate/batch.ts). Either way every
 * sequence gets the numbers it would get alone.
 */
export interface PassRunner {
  forwardMany(seqs: SequenceInput[]): Promise<Float32Array[][]>;
}

/** The logits after `ids` run as the next tokens of `state`. */
async function forwardOne(
  run: PassRunner,
  state: SequenceState,
  ids: number[],
): Promise<Float32Array> {
  return (await run.forwardMany([{ state, ids }]))[0][0];
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
  /**
   * Kept for callers that set it; the prompt goes to the forward in one call, which cuts it
   * into the plan's passes (the scratch chunk is the plan's: RunShape.maxBatch).
   */
  prefillChunk?: number;
  /** Continue this state instead of a fresh one; it must already hold a prefix of the prompt. */
  state?: SequenceState;
  /** Checked between steps: an aborted signal ends the loop after the current step. */
  signal?: AbortSignal;
  /** Called once the whole prompt is in the state, before the first token is picked. */
  onPrefill?: (state: SequenceState) => void;
  /** Verify drafted tokens several at a time (not with `recompute`). */
  speculate?: SpeculateOptions;
  /** Where the forward passes run (default: the model's Forward, alone). */
  passes?: PassRunner;
}

/** One generated token, as the library's `generate` yields it (mod.ts: `GenerateStep`). */
export interface TokenStep {
  /** 0-based index of the generated token. */
  index: number;
  /** The token id. */
  token: number;
  /** The distribution the token was picked from (fp32, vocab; step 0: after the prompt). */
  logits: Float32Array;
  /**
   * Wall-clock seconds of this step (step 0 includes the prefill). A verify pass's time is
   * on the first token it emits; the others it emits show 0.
   */
  seconds: number;
  /** Tokens fed through the model in this step (a verify pass: 1 + drafts; then 0). */
  fed: number;
  /** True when this token is a stop token. */
  stop: boolean;
  /** On the first token of a verify pass: drafts verified. */
  drafted?: number;
  /** On the first token of a verify pass: drafts accepted. */
  accepted?: number;
}

/** One generated token, and the sequence state after it. */
export interface GenerateStep extends TokenStep {
  /** The state after this step (undefined in recompute mode). */
  state?: SequenceState;
}

/** Runs `ids` through `state` in chunks of at most `chunk` tokens; returns the last logits. */
async function feed(run: PassRunner, state: SequenceState, ids: number[]): Promise<Float32Array> {
  // One call: the forward runs it layer by layer in as few passes as its plan allows (one
  // read of the trunk per pass); the plan's chunk bounds the scratch, not the reads.
  return await forwardOne(run, state, ids);
}

function runnerOf(model: Model, options: GenerateOptions): PassRunner {
  return options.passes ?? model.forward;
}

/** Generates up to `maxTokens` tokens after `prompt`. */
export async function* generate(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
): AsyncGenerator<GenerateStep> {
  if (prompt.length === 0) throw badInput("the prompt is empty");
  checkTokenIds(prompt, model.config.vocabSize);
  if (options.state && !isPrefix(options.state.tokens, prompt)) {
    throw new Error("the given state is not a prefix of the prompt");
  }
  if (options.speculate && options.recompute) {
    throw new Error("speculation needs a carried state; it cannot run with recompute");
  }
  if (options.recompute) yield* recomputeSteps(model, prompt, options);
  else if (options.speculate) yield* speculativeSteps(model, prompt, options, options.speculate);
  else yield* plainSteps(model, prompt, options);
}

/** The recompute check mode: every step re-runs the whole sequence from an empty state. */
async function* recomputeSteps(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
): AsyncGenerator<GenerateStep> {
  const pick = options.picker ?? GREEDY;
  const stops = new Set(options.stopIds ?? []);
  const sequence = [...prompt];
  for (let index = 0; index < options.maxTokens; index++) {
    if (options.signal?.aborted) return;
    const t0 = performance.now();
    const logits = await feed(runnerOf(model, options), model.newState(sequence.length), sequence);
    const token = pick.next(logits, { tokens: sequence, promptLength: prompt.length });
    const stop = stops.has(token);
    yield { index, token, logits, seconds: elapsed(t0), fed: sequence.length, stop };
    sequence.push(token);
    if (stop) return;
  }
}

/**
 * Prefill (or resume) and pick token 0; returns what step 0 yields and the state, or
 * undefined when the signal aborted during the prefill (no token is picked then).
 */
async function firstStep(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
  capacity: number,
): Promise<(GenerateStep & { state: SequenceState }) | undefined> {
  const t0 = performance.now();
  const state = options.state ?? model.newState(capacity);
  const todo = prompt.slice(state.position);
  // A retained state of exactly this prompt already holds its logits.
  const logits = todo.length === 0 && state.lastLogits
    ? state.lastLogits
    : await feed(runnerOf(model, options), state, todo);
  options.onPrefill?.(state);
  if (options.signal?.aborted) return undefined;
  const token = (options.picker ?? GREEDY).next(logits, {
    tokens: prompt,
    promptLength: prompt.length,
  });
  const stop = new Set(options.stopIds ?? []).has(token);
  return { index: 0, token, logits, seconds: elapsed(t0), fed: todo.length, stop, state };
}

/** Plain decoding: one token per forward pass. */
async function* plainSteps(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
): AsyncGenerator<GenerateStep> {
  if (options.maxTokens <= 0 || options.signal?.aborted) return;
  const pick = options.picker ?? GREEDY;
  const stops = new Set(options.stopIds ?? []);
  const run = runnerOf(model, options);
  const first = await firstStep(model, prompt, options, prompt.length + options.maxTokens);
  if (!first) return;
  const state = first.state;
  yield first;
  if (first.stop) return;
  const sequence = [...prompt, first.token];
  for (let index = 1; index < options.maxTokens; index++) {
    if (options.signal?.aborted) return;
    const t0 = performance.now();
    const logits = await forwardOne(run, state, [sequence.at(-1)!]);
    const token = pick.next(logits, { tokens: sequence, promptLength: prompt.length });
    const stop = stops.has(token);
    yield { index, token, logits, seconds: elapsed(t0), fed: 1, stop, state };
    sequence.push(token);
    if (stop) return;
  }
}

/**
 * Speculative decoding. Each pass feeds the last emitted token plus k drafts (k from the
 * policy; 0 is a plain step), picks the target's token at every position up to the first
 * draft it rejects, and emits those tokens one by one, bringing the state up to each
 * emitted position before yielding it.
 */
async function* speculativeSteps(
  model: Model,
  prompt: number[],
  options: GenerateOptions,
  spec: SpeculateOptions,
): AsyncGenerator<GenerateStep> {
  if (options.maxTokens <= 0 || options.signal?.aborted) return;
  // A verify pass must fit one forward pass of the plan's batch.
  const draftMax = Math.max(0, Math.min(Math.floor(spec.draftMax), model.forward.maxTokens - 1));
  const pick = options.picker ?? GREEDY;
  const stops = new Set(options.stopIds ?? []);
  const policy = spec.policy ?? new CostPolicy();
  const stats = spec.stats;
  const run = runnerOf(model, options);
  const first = await firstStep(
    model,
    prompt,
    options,
    prompt.length + options.maxTokens + draftMax,
  );
  if (!first) return;
  const state = first.state;
  yield first;
  if (first.stop) return;
  const sequence = [...prompt, first.token];
  const record = new PassRecord(model.config, 1 + draftMax);
  const vocab = model.config.vocabSize;
  let index = 1;
  while (index < options.maxTokens) {
    if (options.signal?.aborted) return;
    // Drafts past maxTokens could never be emitted.
    const limit = Math.min(draftMax, options.maxTokens - index - 1);
    const draft = limit > 0
      ? inVocabulary(await spec.drafter.propose(sequence, limit), vocab)
      : NO_DRAFT;
    const k = policy.length(draft, limit);
    const t0 = performance.now();
    if (stats) stats.proposed += draft.tokens.length;
    if (k === 0) {
      if (stats) stats.decodeSteps++;
      const logits = await forwardOne(run, state, [sequence.at(-1)!]);
      policy.timed(1, elapsed(t0));
      const token = pick.next(logits, { tokens: sequence, promptLength: prompt.length });
      const stop = stops.has(token);
      yield { index, token, logits, seconds: elapsed(t0), fed: 1, stop, state };
      sequence.push(token);
      index++;
      if (stop) return;
      continue;
    }

    const ids = [sequence.at(-1)!, ...draft.tokens.slice(0, k)];
    const [rows] = await run.forwardMany([{ state, ids, logits: "all", record }]);
    const passSeconds = elapsed(t0);
    const picked = verifyPicks(pick, rows, sequence, ids, stops, prompt.length);
    // Drafts the target confirmed (a stop token can end the pass on a confirmed one).
    const accepted = picked.filter((t, i) => i < k && t === ids[i + 1]).length;
    policy.accepted(draft.kind, Math.min(k, picked.length), accepted);
    if (stats) {
      stats.verifyPasses++;
      stats.verified += k;
      stats.accepted += accepted;
    }
    const emitted = yield* emitVerified(
      { rows, ids, picked, accepted, t0, passSeconds },
      { state, record, sequence, stops, index, options },
    );
    index = emitted.index;
    // The pass's cost: the forward pass and the replay of what it emitted.
    policy.timed(ids.length, emitted.passSeconds);
    if (stops.has(sequence.at(-1)!) || options.signal?.aborted) return;
  }
}

/**
 * The target's token at each position of a verify pass over `ids` (the last emitted token,
 * then the drafts), up to the first draft it does not confirm or a stop token.
 */
function verifyPicks(
  pick: TokenPicker,
  rows: Float32Array[],
  sequence: number[],
  ids: number[],
  stops: Set<number>,
  promptLength: number,
): number[] {
  const k = ids.length - 1;
  const picked: number[] = [];
  for (let i = 0; i <= k; i++) {
    // Position i sees exactly plain decoding's history: the drafts before it are the
    // tokens it would have emitted, or the pass already stopped.
    const tokens = i === 0 ? sequence : sequence.concat(ids.slice(1, i + 1));
    picked.push(pick.next(rows[i], { tokens, promptLength }));
    if (i === k || picked[i] !== ids[i + 1] || stops.has(picked[i])) break;
  }
  return picked;
}

/** A verify pass's outcome: its logits rows, what it fed, what the target picked. */
interface VerifyPass {
  rows: Float32Array[];
  ids: number[];
  picked: number[];
  accepted: number;
  /** When the pass started, and its seconds so far (forward and picks). */
  t0: number;
  passSeconds: number;
}

/**
 * Emits a verify pass's picked tokens one by one from `index`, bringing the state up to each
 * emitted position before yielding it; appends them to `sequence`. Returns the next index
 * and the pass's seconds with the replays added.
 */
async function* emitVerified(
  pass: VerifyPass,
  at: {
    state: SequenceState;
    record: PassRecord;
    sequence: number[];
    stops: Set<number>;
    index: number;
    options: GenerateOptions;
  },
): AsyncGenerator<GenerateStep, { index: number; passSeconds: number }> {
  const { rows, ids, picked, accepted, t0 } = pass;
  const { state, record, sequence, stops, options } = at;
  const k = ids.length - 1;
  let index = at.index, passSeconds = pass.passSeconds;
  for (let j = 0; j < picked.length; j++) {
    if (j > 0 && options.signal?.aborted) break;
    const t1 = performance.now();
    record.advance(state, j + 1);
    passSeconds += elapsed(t1);
    const token = picked[j], stop = stops.has(token);
    yield {
      index,
      token,
      logits: rows[j],
      // The pass (forward, picks, first replay) on its first token; then each replay.
      seconds: elapsed(j === 0 ? t0 : t1),
      fed: j === 0 ? ids.length : 0,
      stop,
      state,
      ...(j === 0 ? { drafted: k, accepted } : {}),
    };
    sequence.push(token);
    index++;
    if (stop || index >= options.maxTokens) break;
  }
  return { index, passSeconds };
}

/** The draft up to its first id outside the vocabulary (a drafter's bug must not fail a run). */
function inVocabulary(draft: Draft, vocab: number): Draft {
  const bad = draft.tokens.findIndex((t) => !(Number.isInteger(t) && t >= 0 && t < vocab));
  return bad < 0 ? draft : { ...draft, tokens: draft.tokens.slice(0, bad) };
}

function elapsed(t0: number): number {
  return (performance.now() - t0) / 1000;
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
