/**
 * When to draft, and how many tokens: a cost model.
 *
 * One verify pass over 1 + k positions costs c(k) = 1 + beta * k decode steps, where beta is
 * the measured cost of one extra position (timed on this machine, this model, this memory
 * plan: small when the trunk streams, near 1 when everything is resident and compute-bound).
 * If each draft token is right with probability a (given the ones before it were), the pass
 * emits E(k) = 1 + a + ... + a^k tokens. The policy verifies the k <= the draft's length
 * that maximises E(k) / c(k), and none at all unless that beats a plain step (ratio 1).
 *
 * a is learned per kind of draft (n-gram length, draft model) from what the verify passes
 * accepted, with old passes fading out. While a kind is not drafted its estimate relaxes
 * toward the prior, so a kind that stopped paying is tried again now and then with one
 * token, which is the cheapest probe; when drafts never match, that keeps the loss near
 * beta / (steps between probes), well under 3 %.
 */
import type { Draft } from "./drafter.ts";

/** Decides how many draft tokens to verify and learns from the outcome. */
export interface DraftPolicy {
  /** How many of `draft.tokens` to verify, at most `limit` (0: a plain decode step). */
  length(draft: Draft, limit: number): number;
  /** A forward pass over `positions` positions took `seconds` (decode: 1 position). */
  timed(positions: number, seconds: number): void;
  /** A verify pass checked `verified` tokens of `kind` and accepted the first `accepted`. */
  accepted(kind: string, verified: number, accepted: number): void;
}

/** The cost of an extra verified position, measured. */
export class PassCost {
  /** Used until both a decode step and a verify pass have been timed. */
  static readonly PRIOR = 0.25;
  /** Weight of the newest sample in the running means. */
  static readonly RATE = 0.25;

  #decode?: number;
  #extra?: number;

  /** Seconds of one decode step (running mean), once measured. */
  get decodeSeconds(): number | undefined {
    return this.#decode;
  }

  /** beta: the cost of one more position in a pass, as a share of a decode step. */
  get beta(): number {
    return this.#extra ?? PassCost.PRIOR;
  }

  /** True once a decode step has been timed (verify passes are measured against it). */
  get calibrated(): boolean {
    return this.#decode !== undefined;
  }

  timed(positions: number, seconds: number): void {
    if (!(seconds > 0) || positions < 1) return;
    const mix = (old: number | undefined, x: number) =>
      old === undefined ? x : old + PassCost.RATE * (x - old);
    if (positions === 1) {
      this.#decode = mix(this.#decode, seconds);
      return;
    }
    if (this.#decode === undefined) return;
    const per = Math.max(0, (seconds / this.#decode - 1) / (positions - 1));
    this.#extra = mix(this.#extra, per);
  }
}

/** Per-kind acceptance estimates that fade with time. */
export class AcceptanceStats {
  /** Prior acceptance of an unseen kind, and its weight in pseudo-observations. */
  static readonly PRIOR = 0.5;
  static readonly PRIOR_WEIGHT = 2;
  /** Each verify pass scales a kind's past observations by this (recent passes count most). */
  static readonly PASS_FADE = 0.97;
  /** Each step a kind is offered but not drafted scales its observations by this. */
  static readonly IDLE_FADE = 0.995;

  readonly #counts = new Map<string, { right: number; seen: number }>();

  /** Estimated probability that the next draft token of `kind` is right. */
  rate(kind: string): number {
    const c = this.#counts.get(kind) ?? { right: 0, seen: 0 };
    const w = AcceptanceStats.PRIOR_WEIGHT;
    return (c.right + w * AcceptanceStats.PRIOR) / (c.seen + w);
  }

  /** `verified` tokens checked in order, the first `accepted` right. */
  record(kind: string, verified: number, accepted: number): void {
    const c = this.#counts.get(kind) ?? { right: 0, seen: 0 };
    c.right = c.right * AcceptanceStats.PASS_FADE + accepted;
    // The tokens actually compared: the accepted ones and the first wrong one.
    c.seen = c.seen * AcceptanceStats.PASS_FADE + accepted + (accepted < verified ? 1 : 0);
    this.#counts.set(kind, c);
  }

  /** A step where `kind` was offered and not drafted. */
  idle(kind: string): void {
    const c = this.#counts.get(kind);
    if (!c) return;
    c.right *= AcceptanceStats.IDLE_FADE;
    c.seen *= AcceptanceStats.IDLE_FADE;
  }
}

/** Expected tokens a pass over 1 + k positions emits when each draft is right with rate a. */
export function expectedTokens(a: number, k: number): number {
  let sum = 1, term = 1;
  for (let i = 0; i < k; i++) sum += term *= a;
  return sum;
}

/** The k in 0..max with the most expected tokens per unit cost (0 when nothing beats 1). */
export function bestLength(a: number, beta: number, max: number, margin = 0.02): number {
  let best = 0, bestRatio = 1 + margin;
  for (let k = 1; k <= max; k++) {
    const ratio = expectedTokens(a, k) / (1 + beta * k);
    if (ratio > bestRatio) {
      best = k;
      bestRatio = ratio;
    }
  }
  return best;
}

/** The cost model above: measured beta, learned acceptance. */
export class CostPolicy implements DraftPolicy {
  readonly stats = new AcceptanceStats();

  constructor(readonly cost = new PassCost()) {}

  length(draft: Draft, limit: number): number {
    const max = Math.min(limit, draft.tokens.length);
    if (max <= 0) return 0;
    // Until a decode step is timed there is nothing to weigh a verify pass against.
    if (!this.cost.calibrated) return 0;
    const k = bestLength(this.stats.rate(draft.kind), this.cost.beta, max);
    if (k === 0) this.stats.idle(draft.kind);
    return k;
  }

  timed(positions: number, seconds: number): void {
    this.cost.timed(positions, seconds);
  }

  accepted(kind: string, verified: number, accepted: number): void {
    this.stats.record(kind, verified, accepted);
  }
}

/** Verifies every draft token up to a fixed count (measurements, tests). */
export class FixedPolicy implements DraftPolicy {
  constructor(readonly max: number) {}

  length(draft: Draft, limit: number): number {
    return Math.max(0, Math.min(this.max, limit, draft.tokens.length));
  }

  timed(): void {}

  accepted(): void {}
}
