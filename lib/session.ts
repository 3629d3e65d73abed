/**
 * One engine shared by a chat or many server clients: requests run one at a time, in
 * arrival order, and a new prompt resumes from the longest retained state whose tokens are
 * a prefix of it. KDA state cannot be rewound, so a snapshot is taken at the end of each
 * prefilled prompt; resuming copies the snapshot, so the retained one stays reusable.
 */
import { generate, type GenerateOptions, type GenerateStep, isPrefix } from "./generate.ts";
import type { Model } from "./model/model.ts";
import type { SequenceState } from "./model/state.ts";
import {
  speculateOptions,
  type SpeculationConfig,
  type SpeculationStats,
} from "./speculate/speculate.ts";

/** Snapshots of prefilled prompts, most recently used last. */
export class PrefixCache {
  #snapshots: SequenceState[] = [];

  constructor(readonly capacity = 4) {}

  /**
   * A copy of the longest snapshot that is a prefix of `ids`: shorter than it, or all of it
   * when the snapshot kept its logits (then nothing needs prefilling).
   */
  take(ids: readonly number[]): SequenceState | undefined {
    let best: SequenceState | undefined;
    for (const s of this.#snapshots) {
      const usable = s.position < ids.length || (s.position === ids.length && s.lastLogits);
      if (usable && isPrefix(s.tokens, ids)) {
        if (!best || s.position > best.position) best = s;
      }
    }
    if (!best) return undefined;
    this.#snapshots = [...this.#snapshots.filter((s) => s !== best), best];
    return best.snapshot();
  }

  /** Keeps a snapshot of `state`, dropping the least recently used beyond capacity. */
  remember(state: SequenceState): void {
    if (this.capacity <= 0) return;
    const same = (s: SequenceState) =>
      s.position === state.position && isPrefix(s.tokens, state.tokens);
    this.#snapshots = this.#snapshots.filter((s) => !same(s));
    this.#snapshots.push(state.snapshot());
    while (this.#snapshots.length > this.capacity) this.#snapshots.shift();
  }

  /** Bytes held by the snapshots. */
  bytes(): number {
    return this.#snapshots.reduce((a, s) => a + s.bytes(), 0);
  }

  clear(): void {
    this.#snapshots = [];
  }
}

/** What a finished or running request reports about reuse. */
export interface ReuseInfo {
  promptTokens: number;
  /** Prompt tokens that came from a retained state instead of being prefilled again. */
  reusedTokens: number;
}

/** A FIFO gate: each holder runs alone, in arrival order. */
class FifoLock {
  #tail: Promise<void> = Promise.resolve();
  #waiting = 0;

  get waiting(): number {
    return this.#waiting;
  }

  async acquire(): Promise<() => void> {
    let release!: () => void;
    const next = new Promise<void>((r) => (release = r));
    const previous = this.#tail;
    this.#tail = previous.then(() => next);
    this.#waiting++;
    await previous;
    this.#waiting--;
    return release;
  }
}

/** A model plus retained states and a request queue. */
export class Session {
  readonly prefixes: PrefixCache;
  readonly #lock = new FifoLock();

  /** Prefill at most this many tokens per forward call (bounds scratch memory). */
  readonly prefillChunk?: number;
  /** Speculation for requests that do not choose (undefined: off). */
  readonly speculation?: SpeculationConfig;
  /** Most draft tokens a request may verify per pass (what the memory plan holds). */
  readonly draftLimit?: number;

  constructor(
    readonly model: Model,
    options: {
      retain?: number;
      prefillChunk?: number;
      speculation?: SpeculationConfig;
      draftLimit?: number;
    } = {},
  ) {
    this.prefixes = new PrefixCache(options.retain ?? 4);
    this.prefillChunk = options.prefillChunk;
    this.speculation = options.speculation;
    this.draftLimit = options.draftLimit;
  }

  /** Requests waiting for the engine (not counting the one running). */
  get queueDepth(): number {
    return this.#lock.waiting;
  }

  /**
   * Generates after `prompt`, reusing the longest retained prefix, waiting its turn behind
   * earlier requests. `onStart` reports the reuse before the first step runs.
   */
  async *generate(
    prompt: number[],
    options: Omit<GenerateOptions, "state" | "onPrefill" | "recompute" | "speculate"> & {
      /** This request's speculation: undefined takes the session's, null turns it off. */
      speculation?: SpeculationConfig | null;
      /** Filled in when the request speculates. */
      speculationStats?: SpeculationStats;
    },
    onStart?: (reuse: ReuseInfo) => void,
  ): AsyncGenerator<GenerateStep> {
    const release = await this.#lock.acquire();
    try {
      const state = this.prefixes.take(prompt);
      onStart?.({ promptTokens: prompt.length, reusedTokens: state?.position ?? 0 });
      const { speculation: asked, speculationStats, ...rest } = options;
      let speculation = asked === undefined ? this.speculation : asked ?? undefined;
      // A larger cap only changes speed, never tokens: hold it to what the plan has room for.
      if (speculation && this.draftLimit !== undefined && speculation.draftMax > this.draftLimit) {
        speculation = { ...speculation, draftMax: this.draftLimit };
      }
      yield* generate(this.model, prompt, {
        prefillChunk: this.prefillChunk,
        ...rest,
        speculate: speculation && speculateOptions(this.model, speculation, speculationStats),
        state,
        onPrefill: (s) => this.prefixes.remember(s),
      });
    } finally {
      release();
    }
  }
}
