/**
 * Exact rewind for speculative decoding.
 *
 * A verify pass runs 1 + k positions, but only the first n (the accepted ones) may stay in
 * the sequence state. The MLA latent cache rewinds by its position alone (rows past the
 * position are never read and are overwritten later). The KDA recurrence cannot be undone,
 * so the verify pass runs it on a scratch copy of S and of the conv history, and keeps what
 * the recurrence needs per position: k, v, the decay and beta after the projections, and
 * the pre-conv inputs. `advance(state, n)` then replays the first n positions on the kept
 * state with the same kernel, reading no weight. The same kernel over the same inputs in the
 * same order gives the same bytes, so the state equals plain decoding's, byte for byte.
 *
 * What this keeps (counted by the memory plan): per KDA layer and verified position,
 * 6 x (heads x head_dim) + heads floats, plus one layer's S and conv history as scratch.
 */
import { k3 } from "../../ffi/library.ts";
import type { K3Config } from "../checkpoint/config.ts";
export { kdaRecordFloats, passRecordBytes } from "../layout/state.ts";
import type { KdaState, SequenceState } from "./state.ts";

/** What one KDA layer kept of a verify pass, position-major ([T][C], beta [T][heads]). */
export interface KdaRecord {
  /** Pre-conv inputs (projection outputs) of q, k and v: the conv history's source. */
  rawQ: Float32Array;
  rawK: Float32Array;
  rawV: Float32Array;
  /** The recurrence's inputs: k (normalised), v, decay, beta. */
  k: Float32Array;
  v: Float32Array;
  alpha: Float32Array;
  beta: Float32Array;
}

/**
 * The record of one sequence's verify pass: which tokens ran from which position, what each
 * KDA layer kept, and how many of its positions have been made part of the state.
 */
export class PassRecord {
  readonly #c: K3Config;
  readonly #layers = new Map<number, KdaRecord>();
  /** The replay's discarded output. */
  #out = new Float32Array(0);
  /** One layer's scratch copies of S and of a conv history: the verify pass runs on these. */
  readonly #S: Float32Array;
  readonly #hist: Float32Array;
  #state?: SequenceState;
  /** The state's position when the pass ran. */
  base = 0;
  /** The tokens the pass ran. */
  ids: number[] = [];
  /** Positions of the pass already in the state. */
  applied = 0;
  /** Logits after each position of the pass ([T] rows of vocab), when the caller kept them. */
  logits: Float32Array[] = [];

  constructor(config: K3Config, readonly capacity: number) {
    this.#c = config;
    const C = config.kda.numHeads * config.kda.headDim, nh = config.kda.numHeads;
    this.#S = new Float32Array(nh * config.kda.headDim * config.kda.headDim);
    this.#hist = new Float32Array((config.kda.convKernel - 1) * C);
    config.layerKinds.forEach((kind, i) => {
      if (i >= config.numLayers || kind !== "kda") return;
      const f = (n: number) => new Float32Array(capacity * n);
      this.#layers.set(i, {
        rawQ: f(C),
        rawK: f(C),
        rawV: f(C),
        k: f(C),
        v: f(C),
        alpha: f(C),
        beta: f(nh),
      });
    });
  }

  /** Starts a record for `ids` run from `state`'s current position. */
  begin(state: SequenceState, ids: number[]): void {
    if (ids.length > this.capacity) {
      throw new Error(`a verify pass of ${ids.length} positions exceeds ${this.capacity}`);
    }
    this.#state = state;
    this.base = state.position;
    this.ids = [...ids];
    this.applied = 0;
    this.logits = [];
  }

  /**
   * For the verify pass's conv of layer i: keeps its inputs `x` ([T][C]) and returns a
   * scratch copy of the state's history `which` to run on.
   */
  scratchHistory(i: number, which: "histQ" | "histK" | "histV", x: Float32Array): Float32Array {
    const raw = { histQ: "rawQ", histK: "rawK", histV: "rawV" } as const;
    this.layer(i)[raw[which]].set(x);
    this.#hist.set(this.#kept(i)[which]);
    return this.#hist;
  }

  /**
   * For the verify pass's recurrence of layer i: keeps its inputs and returns a scratch copy
   * of the state's S to run on.
   */
  scratchRecurrence(
    i: number,
    k: Float32Array,
    v: Float32Array,
    alpha: Float32Array,
    beta: Float32Array,
  ): Float32Array {
    const r = this.layer(i);
    r.k.set(k);
    r.v.set(v);
    r.alpha.set(alpha);
    r.beta.set(beta);
    this.#S.set(this.#kept(i).S);
    return this.#S;
  }

  #kept(i: number): KdaState {
    const s = this.#state?.kda.get(i);
    if (!s) throw new Error(`no verify pass is running over KDA layer ${i}`);
    return s;
  }

  /** Bytes this record holds (what passRecordBytes plans for). */
  bytes(): number {
    let n = this.#S.length + this.#hist.length;
    for (const r of this.#layers.values()) {
      n += r.rawQ.length + r.rawK.length + r.rawV.length + r.k.length + r.v.length +
        r.alpha.length + r.beta.length;
    }
    return 4 * n;
  }

  /** KDA layer i's buffers. */
  layer(i: number): KdaRecord {
    const r = this.#layers.get(i);
    if (!r) throw new Error(`layer ${i} is not a KDA layer of this record`);
    return r;
  }

  /**
   * Makes the first `n` positions of the pass part of `state` (replaying the ones not yet
   * applied). n only grows; `state` must be the state the pass ran from.
   */
  advance(state: SequenceState, n: number): void {
    if (n < this.applied || n > this.ids.length) {
      throw new Error(`cannot advance a ${this.ids.length}-position pass to ${n}`);
    }
    if (state.position !== this.base + this.applied) {
      throw new Error("the state moved since the verify pass");
    }
    const from = this.applied, count = n - from;
    if (count === 0) return;
    for (const [i, r] of this.#layers) this.#replay(state.kda.get(i)!, r, from, count);
    state.position += count;
    for (let i = from; i < n; i++) state.tokens.push(this.ids[i]); // no spread (stack)
    state.lastLogits = this.logits[n - 1];
    this.applied = n;
  }

  /** Positions from..from+count-1 of one layer, on the kept state. */
  #replay(s: KdaState, r: KdaRecord, from: number, count: number): void {
    const c = this.#c, nh = c.kda.numHeads, d = c.kda.headDim, C = nh * d;
    const rows = (a: Float32Array, w: number) => a.subarray(from * w, (from + count) * w);
    // The recurrence reads q only for its output, which the replay discards: k stands in.
    if (this.#out.length < count * C) this.#out = new Float32Array(count * C);
    const k = rows(r.k, C);
    k3().k3_kda_recurrence(
      this.#out,
      s.S,
      k,
      k,
      rows(r.v, C),
      rows(r.alpha, C),
      rows(r.beta, nh),
      nh,
      d,
      count,
    );
    shiftHistory(s.histQ, rows(r.rawQ, C), C);
    shiftHistory(s.histK, rows(r.rawK, C), C);
    shiftHistory(s.histV, rows(r.rawV, C), C);
  }
}

/**
 * The conv history after `inputs` ([n][C]) follow it: the last K-1 rows of hist ++ inputs
 * (what k3_kda_conv leaves in its history; a copy, so exact).
 */
export function shiftHistory(hist: Float32Array, inputs: Float32Array, C: number): void {
  const past = hist.length / C, n = inputs.length / C;
  if (n >= past) {
    hist.set(inputs.subarray((n - past) * C));
    return;
  }
  hist.copyWithin(0, n * C);
  hist.set(inputs, (past - n) * C);
}
