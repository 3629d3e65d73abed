/**
 * Per-sequence state carried between forward calls: each KDA layer's recurrent state and
 * conv history, each MLA layer's latent cache (kv_lora_rank + qk_rope_head_dim values per
 * position), and the position. All fp32 (SPEC decision 6). AttnRes carries nothing across
 * tokens.
 */
import type { K3Config } from "../checkpoint/config.ts";
import { kdaHistoryFloats, kdaRecurrentFloats, mlaRowWidth } from "../layout/state.ts";

export interface KdaState {
  /** [heads][dim][dim], key index first. */
  S: Float32Array;
  /** [K-1][C] pre-conv inputs, oldest first, for q, k and v. */
  histQ: Float32Array;
  histK: Float32Array;
  histV: Float32Array;
}

export interface MlaState {
  /** [capacity][rkv + dr]: normalised latent, then k_pe. */
  cache: Float32Array;
}

/** The state of one sequence. */
export class SequenceState {
  /** Tokens processed so far. */
  position = 0;
  /** The token ids processed so far (for prefix reuse). */
  readonly tokens: number[] = [];
  readonly kda: Map<number, KdaState> = new Map();
  readonly mla: Map<number, MlaState> = new Map();
  /** Logits after the last processed token, so an identical prompt needs no new token. */
  lastLogits?: Float32Array;
  /**
   * Why this state may not be used again, when a forward pass stopped part-way through it
   * (some layers advanced, others not): forward calls refuse it, so it never gives tokens.
   */
  unusable?: string;

  constructor(readonly config: K3Config, capacity = 0) {
    const c = config, hist = kdaHistoryFloats(c);
    c.layerKinds.forEach((kind, i) => {
      if (i >= c.numLayers) return;
      if (kind === "kda") {
        this.kda.set(i, {
          S: new Float32Array(kdaRecurrentFloats(c)),
          histQ: new Float32Array(hist),
          histK: new Float32Array(hist),
          histV: new Float32Array(hist),
        });
      } else {
        this.mla.set(i, { cache: new Float32Array(capacity * mlaRowWidth(c)) });
      }
    });
  }

  /** Makes room for `positions` total positions in every MLA cache (keeps contents). */
  reserve(positions: number): void {
    const w = mlaRowWidth(this.config);
    for (const m of this.mla.values()) {
      if (m.cache.length >= positions * w) continue;
      const grown = new Float32Array(Math.max(positions, 2 * m.cache.length / w) * w);
      grown.set(m.cache.subarray(0, this.position * w));
      m.cache = grown;
    }
  }

  /**
   * A deep copy that can be resumed later (KDA state cannot be rewound, only copied), with
   * room for `capacity` positions (at least the ones it holds).
   */
  snapshot(capacity = 0): SequenceState {
    const s = new SequenceState(this.config, 0);
    s.position = this.position;
    for (const t of this.tokens) s.tokens.push(t); // no spread: a long context overflows the stack
    s.lastLogits = this.lastLogits?.slice();
    s.unusable = this.unusable;
    for (const [i, k] of this.kda) {
      s.kda.set(i, {
        S: k.S.slice(),
        histQ: k.histQ.slice(),
        histK: k.histK.slice(),
        histV: k.histV.slice(),
      });
    }
    const w = mlaRowWidth(this.config), used = this.position * w;
    const room = Math.max(this.position, capacity) * w;
    for (const [i, m] of this.mla) {
      const cache = new Float32Array(room);
      cache.set(m.cache.subarray(0, used));
      s.mla.set(i, { cache });
    }
    return s;
  }

  /** Bytes held by this state. */
  bytes(): number {
    let n = 0;
    for (const k of this.kda.values()) n += 4 * (k.S.length + 3 * k.histQ.length);
    for (const m of this.mla.values()) n += 4 * m.cache.length;
    return n;
  }
}
