/**
 * One engine shared by a chat or many server clients. Up to `maxBatch` sequences generate
 * at once, their forward passes run as one (continuous batching, lib/generate/batch.ts): a request
 * that arrives while others generate joins at the next pass, one that ends or is cancelled
 * leaves at once, and one that finds no free sequence waits its turn in arrival order.
 *
 * A new prompt resumes from the longest retained state whose tokens are a prefix of it.
 * KDA state cannot be rewound, so a snapshot is taken at the end of each prefilled prompt;
 * resuming copies the snapshot, so the retained one stays reusable. Several choices of one
 * prompt (`choices`) prefill it once and continue copies of its state.
 */
import { Batcher, Cancelled, type Lane } from "./batch.ts";
import { passCounters } from "./pass_budget.ts";
import { generate, type GenerateOptions, type GenerateStep, isPrefix } from "./decode.ts";
import type { Model } from "../model/model.ts";
import type { SequenceState } from "../model/state.ts";
import {
  speculateOptions,
  type SpeculationConfig,
  type SpeculationStats,
} from "../speculate/speculate.ts";

/** Sequences generating at once unless the caller (the memory plan) says otherwise. */
export const DEFAULT_MAX_BATCH = 8;
export { DEFAULT_PASS_TOKENS } from "./pass_budget.ts";

/** Prompt states retained for reuse unless the caller (the memory plan) says otherwise. */
export const DEFAULT_RETAIN = 4;

/** Snapshots of prefilled prompts, most recently used last. */
export class PrefixCache {
  #snapshots: SequenceState[] = [];

  constructor(readonly capacity = DEFAULT_RETAIN) {}

  /**
   * A copy of the longest snapshot that is a prefix of `ids`: shorter than it, or all of it
   * when the snapshot kept its logits (then nothing needs prefilling). The copy has room for
   * `capacity` positions.
   */
  take(ids: readonly number[], capacity = 0): SequenceState | undefined {
    let best: SequenceState | undefined;
    for (const s of this.#snapshots) {
      const usable = s.position < ids.length || (s.position === ids.length && s.lastLogits);
      if (usable && isPrefix(s.tokens, ids)) {
        if (!best || s.position > best.position) best = s;
      }
    }
    if (!best) return undefined;
    this.#snapshots = [...this.#snapshots.filter((s) => s !== best), best];
    return best.snapshot(capacity);
  }

  /** Keeps a snapshot of `state`, dropping the least recently used beyond capacity. */
  remember(state: SequenceState): void {
    if (this.capacity <= 0) return;
    const same = (s: SequenceState) =>
      s.position === state.position && isPrefix(s.tokens, state.tokens);
    this.#snapshots = this.#snapshots.filter((s) => !same(s));
    // Drop first, then copy: never more than `capacity` snapshots at once (the plan's count).
    while (this.#snapshots.length >= this.capacity) this.#snapshots.shift();
    this.#snapshots.push(state.snapshot());
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

/** How a Session runs. */
export interface SessionOptions {
  /** Prompt states kept for reuse (default DEFAULT_RETAIN). */
  retain?: number;
  /** Kept for callers that set it: a direct prefill is one forward call (see Forward). */
  prefillChunk?: number;
  /** Speculation for requests that do not choose (undefined: off). */
  speculation?: SpeculationConfig;
  /** Most draft tokens a request may verify per pass (what the memory plan holds). */
  draftLimit?: number;
  /** Most sequences generating at once (each holds a sequence state). */
  maxBatch?: number;
  /**
   * A fixed budget for passes shared with decode steps (`k3 serve --pass-tokens`); absent,
   * their prompt share follows measured costs (see Batcher).
   */
  passTokens?: number;
  /**
   * Most tokens of one pass (default the plan's whole pass, model.forward.maxTokens: a lone
   * prompt is one layer-major pass).
   */
  passCap?: number;
  /** Give the event loop a turn after every layer of a pass (default true). */
  yieldBetweenLayers?: boolean;
  /** A cancelled request's pass puts its states back (default true; see Batcher). */
  restoreOnStop?: boolean;
}

/** One request's generation options. */
export type RequestOptions =
  & Omit<GenerateOptions, "state" | "onPrefill" | "recompute" | "speculate" | "passes">
  & {
    /** This request's speculation: undefined takes the session's, null turns it off. */
    speculation?: SpeculationConfig | null;
    /** Filled in when the request speculates. */
    speculationStats?: SpeculationStats;
    /** A name for /health (the server's request id). */
    label?: string;
    /**
     * The state this request advances, before its first pass: after a cancel it holds the
     * prompt as far as whole passes prefilled it (a stopped pass leaves no trace).
     */
    onState?: (state: SequenceState) => void;
  };

/** A request that holds (or waits for) sequences of the batch. */
interface Ticket {
  label: string;
  /** Sequences it holds (n choices hold n), released one by one as they end. */
  sequences: number;
  live: number;
  promptTokens: number;
  reusedTokens: number;
  queuedAt: number;
  startedAt: number;
  firstAt: number;
  generated: number;
  /** The states its forward calls advance (to show prefill progress). */
  states: Set<SequenceState>;
}

/** The admitted request and the prefilled state of each choice (`choices`). */
interface Shared {
  ticket: Ticket;
  states: SequenceState[];
}

/** A running request as /health shows it. */
export interface RunningStatus {
  id: string;
  sequences: number;
  prompt_tokens: number;
  reused_tokens: number;
  /** Prompt tokens in the state so far (reused ones included). */
  prefilled: number;
  generated: number;
  queue_ms: number;
  running_ms: number;
  /** Admission to first token (absent before it). */
  ttft_ms?: number;
  /**
   * The forward pass running now, when this request is in it: its tokens there (prompt
   * tokens, or 1 for a decode step) and the layers done of all (the prompt's progress
   * inside a pass, which `prefilled` counts only once the pass ends).
   */
  pass?: { tokens: number; layers_done: number; layers: number };
}

/** A waiting request as /health shows it. */
export interface WaitingStatus {
  id: string;
  sequences: number;
  prompt_tokens: number;
  waiting_ms: number;
}

/** The batch as /health shows it. */
export interface BatchStatus {
  max_batch: number;
  /** The fixed budget per pass, or (by cost) the budget used until a pass is measured. */
  pass_tokens: number;
  /** How a pass shared with decode steps is sized: measured costs, or a fixed budget. */
  pass_budget: "cost" | "fixed";
  /** By cost: prompt tokens the next pass beside one decode step would take (once measured). */
  pass_room?: number;
  /** Sequences generating now. */
  sequences: number;
  running: RunningStatus[];
  queue: WaitingStatus[];
  /** Passes so far: tokens by kind, sequences per pass, seconds, the last pass. */
  passes: {
    passes: number;
    decode_tokens: number;
    verify_tokens: number;
    prefill_tokens: number;
    mean_sequences: number;
    max_sequences: number;
    seconds: number;
    last?: { sequences: number; tokens: number; ms: number };
  };
}

/** Too many sequences for one request: it could never be admitted. */
export class BatchTooSmall extends Error {}

/** A model plus retained states, the batch of running sequences and the waiting queue. */
export class Session {
  readonly prefixes: PrefixCache;
  readonly batcher: Batcher;
  readonly maxBatch: number;

  /** Prompt tokens per forward call of a direct prefill (chat's conversation state). */
  readonly prefillChunk?: number;
  /** Speculation for requests that do not choose (undefined: off). */
  readonly speculation?: SpeculationConfig;
  /** Most draft tokens a request may verify per pass (what the memory plan holds). */
  readonly draftLimit?: number;

  #used = 0;
  readonly #running = new Set<Ticket>();
  #queue: { ticket: Ticket; admit: (ok: boolean) => void }[] = [];

  constructor(readonly model: Model, options: SessionOptions = {}) {
    this.prefixes = new PrefixCache(options.retain ?? DEFAULT_RETAIN);
    this.prefillChunk = options.prefillChunk;
    this.speculation = options.speculation;
    this.draftLimit = options.draftLimit;
    this.maxBatch = Math.max(1, Math.floor(options.maxBatch ?? DEFAULT_MAX_BATCH));
    this.batcher = new Batcher(model.forward, {
      passTokens: options.passTokens,
      passCap: options.passCap,
      counters: () => passCounters(model),
      yieldBetweenLayers: options.yieldBetweenLayers,
      restoreOnStop: options.restoreOnStop,
    });
  }

  /** Requests waiting for a free sequence (not counting the running ones). */
  get queueDepth(): number {
    return this.#queue.length;
  }

  /** Sequences generating now. */
  get batchSize(): number {
    return this.#used;
  }

  /**
   * Generates after `prompt`, reusing the longest retained prefix, once a sequence of the
   * batch is free (arrival order). `onStart` reports the reuse before the first step runs.
   */
  async *generate(
    prompt: number[],
    options: RequestOptions,
    onStart?: (reuse: ReuseInfo) => void,
  ): AsyncGenerator<GenerateStep> {
    const ticket = await this.#admit(options.label, prompt.length, 1, options.signal);
    if (!ticket) return;
    try {
      const capacity = this.#capacity(prompt, options);
      const state = this.prefixes.take(prompt, capacity) ?? this.model.newState(capacity);
      ticket.reusedTokens = state.position;
      onStart?.({ promptTokens: prompt.length, reusedTokens: ticket.reusedTokens });
      options.onState?.(state);
      yield* this.#steps(ticket, prompt, options, state, true);
    } finally {
      this.#release(ticket);
    }
  }

  /**
   * `options.length` generations after one prompt (n choices), sharing one prefill: the
   * prompt runs once (or resumes from a retained state), then each choice continues its own
   * copy of that state with its own options (sampler, seed, stops). The request holds that
   * many sequences of the batch. Consume every returned generator (or return() it): each
   * frees its sequence when it ends. All share `options[0].signal` and `.label`.
   */
  choices(
    prompt: number[],
    options: RequestOptions[],
    onStart?: (reuse: ReuseInfo) => void,
  ): AsyncGenerator<GenerateStep>[] {
    const n = options.length, first = options[0];
    if (n === 0) throw new Error("choices needs at least one set of options");
    this.#checkFits(n);
    let shared: Promise<Shared | null> | undefined;
    const start = () => shared ??= this.#prefillShared(prompt, options, first, onStart);
    return options.map((o, i) => this.#choice(start, prompt, o, i));
  }

  /** Choice `i` of {@link choices}: waits for the shared prefill, then decodes its copy. */
  async *#choice(
    start: () => Promise<Shared | null>,
    prompt: number[],
    options: RequestOptions,
    i: number,
  ): AsyncGenerator<GenerateStep> {
    const r = await start();
    if (!r) return;
    try {
      yield* this.#steps(r.ticket, prompt, options, r.states[i], false);
    } finally {
      this.#release(r.ticket);
    }
  }

  /** The batch, the queue, per-request progress and the pass counters (/health). */
  status(): BatchStatus {
    const now = performance.now(), ms = (x: number) => Math.round(x);
    const p = this.batcher.stats, pass = this.batcher.current;
    const inPass = (t: Ticket) => [...t.states].reduce((a, s) => a + (pass?.tokens.get(s) ?? 0), 0);
    return {
      max_batch: this.maxBatch,
      pass_tokens: this.batcher.passTokens,
      pass_budget: this.batcher.budget.byCost ? "cost" : "fixed",
      pass_room: this.batcher.budget.byCost && this.batcher.budget.costs
        ? this.batcher.budget.room(1, this.batcher.passCap)
        : undefined,
      sequences: this.#used,
      running: [...this.#running].map((t) => {
        const at = Math.max(0, ...[...t.states].map((s) => s.position));
        return {
          id: t.label,
          sequences: t.sequences,
          prompt_tokens: t.promptTokens,
          reused_tokens: t.reusedTokens,
          prefilled: Math.min(t.promptTokens, Math.max(at, t.reusedTokens)),
          generated: t.generated,
          queue_ms: ms(t.startedAt - t.queuedAt),
          running_ms: ms(now - t.startedAt),
          ...(t.firstAt ? { ttft_ms: ms(t.firstAt - t.startedAt) } : {}),
          ...(pass && inPass(t) > 0
            ? { pass: { tokens: inPass(t), layers_done: pass.layersDone, layers: pass.layers } }
            : {}),
        };
      }),
      queue: this.#queue.map(({ ticket: t }) => ({
        id: t.label,
        sequences: t.sequences,
        prompt_tokens: t.promptTokens,
        waiting_ms: ms(now - t.queuedAt),
      })),
      passes: {
        passes: p.passes,
        decode_tokens: p.decodeTokens,
        verify_tokens: p.verifyTokens,
        prefill_tokens: p.prefillTokens,
        mean_sequences: p.passes ? Math.round((100 * p.sequences) / p.passes) / 100 : 0,
        max_sequences: p.maxSequences,
        seconds: Math.round(p.seconds * 1000) / 1000,
        ...(p.last ? { last: { ...p.last } } : {}),
      },
    };
  }

  /** Admits, prefills once, copies the state per choice; null when cancelled meanwhile. */
  async #prefillShared(
    prompt: number[],
    options: RequestOptions[],
    first: RequestOptions,
    onStart?: (reuse: ReuseInfo) => void,
  ): Promise<Shared | null> {
    const n = options.length;
    const ticket = await this.#admit(first.label, prompt.length, n, first.signal);
    if (!ticket) return null;
    try {
      const capacities = options.map((o) => this.#capacity(prompt, o));
      const state = this.prefixes.take(prompt, capacities[0]) ??
        this.model.newState(capacities[0]);
      ticket.reusedTokens = state.position;
      onStart?.({ promptTokens: prompt.length, reusedTokens: state.position });
      const todo = prompt.slice(state.position);
      if (todo.length > 0) {
        const lane = this.#lane(ticket, first.signal);
        try {
          await lane.forwardMany([{ state, ids: todo }]);
        } finally {
          lane.close();
        }
      }
      this.prefixes.remember(state);
      // Copies before any choice moves the original.
      const states = [state, ...capacities.slice(1).map((c) => state.snapshot(c))];
      return { ticket, states };
    } catch (e) {
      for (let i = 0; i < n; i++) this.#release(ticket);
      if (e instanceof Cancelled) return null;
      throw e;
    }
  }

  /** The decode loop of one sequence on the batcher; a cancelled pass ends it quietly. */
  async *#steps(
    ticket: Ticket,
    prompt: number[],
    options: RequestOptions,
    state: SequenceState,
    retain: boolean,
  ): AsyncGenerator<GenerateStep> {
    const { speculation: asked, speculationStats, label: _, onState: _s, ...rest } = options;
    const speculation = this.#speculation(asked);
    const lane = this.#lane(ticket, options.signal);
    try {
      for await (
        const step of generate(this.model, prompt, {
          ...rest,
          speculate: speculation && speculateOptions(this.model, speculation, speculationStats),
          state,
          onPrefill: retain ? (s) => this.prefixes.remember(s) : undefined,
          passes: lane,
        })
      ) {
        ticket.generated++;
        if (!ticket.firstAt) ticket.firstAt = performance.now();
        yield step;
      }
    } catch (e) {
      if (e instanceof Cancelled) return;
      throw e;
    } finally {
      lane.close();
    }
  }

  /** The batcher's lane for `ticket`, noting the states it advances. */
  #lane(ticket: Ticket, signal?: AbortSignal): Lane {
    const lane = this.batcher.lane(signal);
    return {
      forwardMany: (seqs) => {
        for (const s of seqs) ticket.states.add(s.state);
        return lane.forwardMany(seqs);
      },
      close: () => lane.close(),
    };
  }

  /** The request's speculation, its cap held to what the plan has room for. */
  #speculation(asked: SpeculationConfig | null | undefined): SpeculationConfig | undefined {
    const speculation = asked === undefined ? this.speculation : asked ?? undefined;
    // A larger cap only changes speed, never tokens: hold it to what the plan has room for.
    if (speculation && this.draftLimit !== undefined && speculation.draftMax > this.draftLimit) {
      return { ...speculation, draftMax: this.draftLimit };
    }
    return speculation;
  }

  /** Positions a request's state needs: prompt, completion, and a verify pass's drafts. */
  #capacity(prompt: number[], options: RequestOptions): number {
    const s = this.#speculation(options.speculation);
    const drafts = s ? Math.max(0, Math.min(s.draftMax, this.model.forward.maxTokens - 1)) : 0;
    return prompt.length + Math.max(0, options.maxTokens) + drafts;
  }

  #checkFits(sequences: number): void {
    if (sequences > this.maxBatch) {
      throw new BatchTooSmall(
        `${sequences} sequences at once do not fit a batch of ${this.maxBatch} (--max-batch)`,
      );
    }
  }

  /**
   * Waits until `sequences` sequences of the batch are free (arrival order: nobody passes a
   * waiting request). Null when `signal` aborts first: the request leaves the queue at once.
   */
  #admit(
    label: string | undefined,
    promptTokens: number,
    sequences: number,
    signal?: AbortSignal,
  ): Promise<Ticket | null> {
    this.#checkFits(sequences);
    const now = performance.now();
    const ticket: Ticket = {
      label: label ?? `request-${now.toFixed(0)}`,
      sequences,
      live: sequences,
      promptTokens,
      reusedTokens: 0,
      queuedAt: now,
      startedAt: now,
      firstAt: 0,
      generated: 0,
      states: new Set(),
    };
    if (signal?.aborted) return Promise.resolve(null);
    if (this.#queue.length === 0 && this.#used + sequences <= this.maxBatch) {
      this.#start(ticket);
      return Promise.resolve(ticket);
    }
    return new Promise((resolve) => {
      const onAbort = () => {
        this.#queue = this.#queue.filter((q) => q.ticket !== ticket);
        resolve(null);
        this.#admitWaiting();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#queue.push({
        ticket,
        admit: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve(ticket);
        },
      });
    });
  }

  #start(ticket: Ticket): void {
    ticket.startedAt = performance.now();
    this.#used += ticket.sequences;
    this.#running.add(ticket);
  }

  /** One of the ticket's sequences ended. */
  #release(ticket: Ticket): void {
    if (ticket.live <= 0) return;
    ticket.live--;
    this.#used--;
    if (ticket.live === 0) this.#running.delete(ticket);
    this.#admitWaiting();
  }

  #admitWaiting(): void {
    while (this.#queue.length > 0) {
      const head = this.#queue[0];
      if (this.#used + head.ticket.sequences > this.maxBatch) return;
      this.#queue.shift();
      this.#start(head.ticket);
      head.admit(true);
    }
  }
}
