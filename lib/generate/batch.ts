/**
 * Continuous batching: one forward pass for every sequence that is ready.
 *
 * A generation hands its next forward call (a decode step, a verify pass, a prompt) to the
 * Batcher through its lane instead of running it. Between passes the event loop gets a
 * turn (HTTP, timers, cancellations, new requests), and then a macrotask: by then every
 * generation whose consumer took its last token has handed in its next call, since picking
 * a token and handing in the next call are microtasks (no I/O). During a pass the event loop
 * gets a turn after every layer. Then one pass runs over what was handed in:
 *
 * - every decode step and verify pass whole (they are what the streams are waiting for);
 * - then prompt tokens up to the pass's room (lib/generate/pass_budget.ts): a pass no decode
 *   step or verify pass waits on takes all of them up to the forward's whole pass (`passCap`),
 *   so a lone prompt is one layer-major pass, one read of the trunk and of each expert; next
 *   to steps, as many as the pass's measured cost without them pays for (or a fixed
 *   `passTokens`). Shortest remaining prompt first, the oldest always getting at least a
 *   quarter of the room, so a long prompt prefills over several passes, interleaved with the
 *   other streams' steps, and never starves.
 *
 * A call whose signal is aborted leaves before the next pass (its lane rejects with
 * {@link Cancelled}). Forward.forwardMany gives every sequence the numbers a solo run gives,
 * whatever shares its pass and however its prompt is cut, so batching never changes a token.
 */
import type { SequenceState } from "../model/state.ts";
import { setImmediate } from "node:timers";
import type { PassRunner } from "./decode.ts";
import { type Forward, ForwardAborted, type SequenceInput } from "../model/forward.ts";
import { yieldToEventLoop } from "../model/kernel.ts";
import { DEFAULT_PASS_TOKENS, PassBudget, type PassCounters, passSample } from "./pass_budget.ts";

/**
 * How long a pass with prompt tokens waits at most for the last pass's open lanes to hand in
 * their next step: far above the time between a stream's steps, short next to a pass at the
 * model's scale (seconds).
 */
const HAND_IN_MS = 1000;

/** A lane's call ended because its signal was aborted; the state it was advancing is void. */
export class Cancelled extends Error {
  constructor() {
    super("cancelled");
    this.name = "Cancelled";
  }
}

/**
 * Lets timers, signals and network I/O run, in about 30 us (the forward pass's own turns use
 * the same one, so it knows when the loop last turned).
 */
export { yieldToEventLoop };

/** Counters of the passes run so far (for /health and bench-serve). */
export interface PassStats {
  passes: number;
  /** Tokens run, by kind: decode steps (1 token), verify passes (1 + drafts), prompts. */
  decodeTokens: number;
  verifyTokens: number;
  prefillTokens: number;
  /** Sum over passes of the sequences in each, and the most in one. */
  sequences: number;
  maxSequences: number;
  /** Seconds inside forward passes. */
  seconds: number;
  /** The last pass: sequences, tokens, milliseconds. */
  last?: { sequences: number; tokens: number; ms: number };
}

/** The pass running now, for /health: each sequence's tokens in it, and its layers done. */
export interface PassProgress {
  readonly tokens: ReadonlyMap<SequenceState, number>;
  layersDone: number;
  readonly layers: number;
}

/** One sequence of a handed-in call, and how far it has run. */
interface Part {
  input: SequenceInput;
  /** Ids already run. */
  done: number;
  /** Logit rows gathered so far (every row for "all" and verify passes; else the last). */
  rows: Float32Array[];
}

/** A handed-in forwardMany call. */
/** One generation's way into the batcher; closed when that generation ends. */
export interface Lane extends PassRunner {
  /** No further call will come through this lane. */
  close(): void;
}

/** What the batcher knows of a lane: whether it may still hand in a call. */
interface LaneMark {
  closed: boolean;
}

interface Call {
  parts: Part[];
  lane: LaneMark;
  signal?: AbortSignal;
  /** Arrival order. */
  order: number;
  resolve(rows: Float32Array[][]): void;
  reject(e: unknown): void;
}

export interface BatcherOptions {
  /**
   * A fixed budget for a pass that carries decode steps or verify passes: they run whole,
   * then prompt tokens up to this (a quarter of it at least). Absent: the prompt's share
   * follows measured costs (lib/generate/pass_budget.ts), DEFAULT_PASS_TOKENS until then.
   */
  passTokens?: number;
  /**
   * Most tokens of one pass (default and at most the forward's `maxTokens`): what a pass no
   * step waits on takes, so a lone prompt that fits is one read of the trunk.
   */
  passCap?: number;
  /**
   * The model's cumulative read and stall seconds, so passes measure their reads (absent: a
   * pass's wall time is all compute, as on a resident model).
   */
  counters?: () => PassCounters;
  /** Give the event loop a turn after every layer of a pass (default true). */
  yieldBetweenLayers?: boolean;
  /**
   * Whether a lone call stopped within a pass gets its states back as they were (default
   * true: a chat goes on from them). False where a cancelled call's states are discarded
   * (serve): no KDA copy is kept during a pass, and the plan need not hold one.
   */
  restoreOnStop?: boolean;
}

/** Runs every ready sequence's forward call as one pass (see the module comment). */
export class Batcher {
  /** The fixed budget, or the by-cost budget's start (see BatcherOptions.passTokens). */
  readonly passTokens: number;
  /** Most tokens of one pass. */
  readonly passCap: number;
  /** The samples of the last passes and the rule that sizes the next. */
  readonly budget: PassBudget;
  readonly stats: PassStats = {
    passes: 0,
    decodeTokens: 0,
    verifyTokens: 0,
    prefillTokens: 0,
    sequences: 0,
    maxSequences: 0,
    seconds: 0,
  };
  #calls: Call[] = [];
  #order = 0;
  #running = false;
  /** The running loop (its passes), until it ends. */
  #loopDone: Promise<void> = Promise.resolve();
  readonly #yield: boolean;
  readonly #restoreOnStop: boolean;
  #current?: PassProgress;
  readonly #counters?: () => PassCounters;
  /** The lanes that took a step (decode or verify) in the last pass. */
  #stepped = new Set<LaneMark>();
  /** Wakes {@link awaitSteps} when a call is handed in. */
  #handedIn?: () => void;

  constructor(readonly forward: Forward, options: BatcherOptions) {
    this.passCap = Math.max(
      1,
      Math.min(Math.floor(options.passCap ?? Infinity), forward.maxTokens),
    );
    const configured = options.passTokens ?? DEFAULT_PASS_TOKENS;
    this.passTokens = Math.max(1, Math.min(Math.floor(configured), this.passCap));
    this.budget = new PassBudget(this.passTokens, options.passTokens === undefined);
    this.#counters = options.counters;
    this.#yield = options.yieldBetweenLayers ?? true;
    this.#restoreOnStop = options.restoreOnStop ?? true;
  }

  /** A PassRunner whose calls go through this batcher and end early when `signal` aborts. */
  lane(signal?: AbortSignal): Lane {
    const mark: LaneMark = { closed: false };
    return {
      forwardMany: (seqs) => this.#submit(seqs, mark, signal),
      close: () => {
        mark.closed = true;
        this.#handedIn?.();
      },
    };
  }

  /**
   * Resolves once no pass runs. A pass's kernels may still be computing off the JS thread
   * after its callers gave up: the model must not be closed before this.
   */
  idle(): Promise<void> {
    return this.#loopDone.then(() => {}, () => {});
  }

  /** Calls handed in and not yet answered. */
  get waiting(): number {
    return this.#calls.length;
  }

  /** The pass running now (undefined between passes). */
  get current(): PassProgress | undefined {
    return this.#current;
  }

  #submit(
    seqs: SequenceInput[],
    lane: LaneMark,
    signal?: AbortSignal,
  ): Promise<Float32Array[][]> {
    if (signal?.aborted) return Promise.reject(new Cancelled());
    if (seqs.length === 0) return Promise.reject(new Error("forward needs at least one sequence"));
    return new Promise((resolve, reject) => {
      const parts = seqs.map((input) => ({ input, done: 0, rows: [] }));
      this.#calls.push({ parts, lane, signal, order: this.#order++, resolve, reject });
      this.#handedIn?.();
      if (!this.#running) this.#loopDone = this.#loop();
    });
  }

  async #loop(): Promise<void> {
    this.#running = true;
    try {
      while (true) {
        // Everyone whose token was just taken hands in the next call meanwhile.
        // Sockets, timers and signals get a turn; then a macrotask, which runs only once every
        // microtask has: each generation whose token was just handed out has, by then, handed
        // in its next call (an op alone may complete first: then it would miss this pass).
        await yieldToEventLoop();
        await new Promise((resolve) => setImmediate(resolve));
        this.#dropCancelled();
        if (this.#calls.length === 0) return;
        await this.#awaitSteps();
        this.#dropCancelled();
        if (this.#calls.length === 0) return;
        await this.#pass();
      }
    } finally {
      this.#running = false;
    }
  }

  /**
   * Before a pass that carries prompt tokens, waits for the generations that stepped in the
   * last pass and go on (their lanes are open) to hand in their next step: their work between
   * steps (sampling, a grammar mask, a slow reader's socket) can outlast the turn above, and a
   * prompt that found itself alone would take the whole pass while they wait for it. Bounded
   * by HAND_IN_MS, so a generation that stalls holds no one for long.
   */
  async #awaitSteps(): Promise<void> {
    const deadline = performance.now() + HAND_IN_MS;
    while (this.#promptWaits() && this.#stepMissing() && performance.now() < deadline) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => resolve(), 1);
        this.#handedIn = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    this.#handedIn = undefined;
  }

  #promptWaits(): boolean {
    return this.#calls.some((c) =>
      c.parts.some((p) => !p.input.record && p.input.ids.length - p.done > 1)
    );
  }

  #stepMissing(): boolean {
    const handed = new Set(this.#calls.map((c) => c.lane));
    for (const lane of this.#stepped) if (!lane.closed && !handed.has(lane)) return true;
    return false;
  }

  #dropCancelled(): void {
    this.#calls = this.#calls.filter((c) => {
      if (!c.signal?.aborted) return true;
      c.reject(new Cancelled());
      return false;
    });
  }

  /** One forward pass over `inputs`, its layers counted in {@link current} as they go. */
  async #forward(inputs: SequenceInput[], signal?: AbortSignal): Promise<Float32Array[][]> {
    const progress: PassProgress = {
      tokens: new Map(inputs.map((q) => [q.state, q.ids.length])),
      layersDone: 0,
      layers: this.forward.layers,
    };
    this.#current = progress;
    try {
      return await this.forward.forwardMany(inputs, {
        betweenLayers: async () => {
          progress.layersDone++;
          if (this.#yield) await yieldToEventLoop();
        },
        signal,
        restore: this.#restoreOnStop,
      });
    } finally {
      this.#current = undefined;
    }
  }

  /** Chooses this pass's tokens, runs them, hands out the rows of finished calls. */
  async #pass(): Promise<void> {
    const chosen = new Map<Part, number>();
    const prompts: { part: Part; order: number }[] = [];
    let used = 0, decode = 0, verify = 0;
    for (const call of this.#calls) {
      for (const part of call.parts) {
        const left = part.input.ids.length - part.done;
        if (left === 0) continue;
        if (part.input.record || left === 1) {
          // A verify pass is never cut; a decode step is one token.
          chosen.set(part, left);
          used += left;
          if (part.input.record) verify += left;
          else decode += left;
        } else {
          prompts.push({ part, order: call.order });
        }
      }
    }
    this.#stepped = new Set(
      this.#calls.filter((c) => c.parts.some((p) => chosen.has(p))).map((c) => c.lane),
    );
    let prefill = 0;
    if (prompts.length > 0) {
      let room = this.budget.room(used, this.passCap);
      const take = (part: Part, most: number) => {
        const left = part.input.ids.length - part.done - (chosen.get(part) ?? 0);
        const n = Math.min(left, most, room);
        if (n <= 0) return;
        chosen.set(part, (chosen.get(part) ?? 0) + n);
        room -= n;
        prefill += n;
      };
      const oldest = prompts.reduce((a, b) => (b.order < a.order ? b : a));
      take(oldest.part, Math.ceil(room / 4));
      const remaining = (p: Part) => p.input.ids.length - p.done - (chosen.get(p) ?? 0);
      const byShortest = prompts.map((p) => p.part).sort((a, b) => remaining(a) - remaining(b));
      for (const part of byShortest) take(part, Infinity);
    }

    const inputs: SequenceInput[] = [];
    const order: Part[] = [];
    for (const [part, n] of chosen) {
      const whole = part.done === 0 && n === part.input.ids.length;
      inputs.push(
        whole ? part.input : { ...part.input, ids: part.input.ids.slice(part.done, part.done + n) },
      );
      order.push(part);
    }
    // A pass of one call stops within a layer when that call is cancelled (Ctrl-C during a
    // long prompt, a client that left); a shared pass runs on for the others. Only a lone call
    // pays for the copy of its KDA states a pass that may stop keeps.
    const callsIn = this.#calls.filter((c) => c.parts.some((p) => chosen.has(p)));
    const signal = callsIn.length === 1 ? callsIn[0].signal : undefined;
    const t0 = performance.now(), before = this.#counters?.();
    let rows: Float32Array[][];
    try {
      rows = await this.#forward(inputs, signal);
    } catch (e) {
      // Every call in this pass failed (its states are void), or all were cancelled (their
      // states are as before this pass); the others go on.
      const failed = new Set(order);
      this.#calls = this.#calls.filter((c) => {
        if (!c.parts.some((p) => failed.has(p))) return true;
        c.reject(e instanceof ForwardAborted ? new Cancelled() : e);
        return false;
      });
      return;
    }
    const ms = performance.now() - t0;
    const tokens = decode + verify + prefill;
    this.budget.observe(passSample(tokens, ms / 1000, before, this.#counters?.()));
    const s = this.stats;
    s.passes++;
    s.decodeTokens += decode;
    s.verifyTokens += verify;
    s.prefillTokens += prefill;
    s.sequences += inputs.length;
    s.maxSequences = Math.max(s.maxSequences, inputs.length);
    s.seconds += ms / 1000;
    s.last = { sequences: inputs.length, tokens, ms: Math.round(ms) };

    order.forEach((part, i) => {
      part.done += chosen.get(part)!;
      const all = part.input.logits === "all" || part.input.record;
      if (all) part.rows.push(...rows[i]);
      else if (part.done === part.input.ids.length) part.rows = rows[i];
    });
    this.#calls = this.#calls.filter((c) => {
      if (c.parts.some((p) => p.done < p.input.ids.length)) return true;
      c.resolve(c.parts.map((p) => p.rows));
      return false;
    });
  }
}
