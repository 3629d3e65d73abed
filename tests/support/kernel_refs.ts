/**
 * Plain float64 references for the libk3 kernels, written from MODEL.md §3.4 and §4 (not
 * from the C). They compute the mathematical result; the C kernels round to fp32 in a
 * fixed order, so tests compare with a relative tolerance.
 *
 * Layouts follow csrc/k3.h: token-major `[T][n]`, channel `c = h*dim + d`.
 */

// Sigmoid and the MXFP4 decode are the float64 reference's own (tests/reference/math.ts):
// one definition of each for all the test oracles.
export { decodeMxfp4, e2m1, sigmoid } from "../reference/math.ts";
import { sigmoid } from "../reference/math.ts";

/** Deterministic pseudo-random numbers (mulberry32), so a failing case reproduces. */
export class Rng {
  #state: number;
  constructor(seed: number) {
    this.#state = seed >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.#state = (this.#state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  /** Uniform in [lo, hi). */
  uniform(lo: number, hi: number): number {
    return lo + (hi - lo) * this.next();
  }
  /** Integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  /** n fp32 values uniform in [lo, hi). */
  f32(n: number, lo = -1, hi = 1): Float32Array<ArrayBuffer> {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.uniform(lo, hi);
    return out;
  }
  /** n BF16 bit patterns of values uniform in [lo, hi) (upper halves of fp32 values). */
  bf16(n: number, lo = -1, hi = 1): Uint16Array<ArrayBuffer> {
    const f = this.f32(n, lo, hi);
    const bits = new Uint32Array(f.buffer);
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = bits[i] >>> 16;
    return out;
  }
}

/** BF16 bits widened to their exact value (MODEL.md §5.1: weights as stored, widened exactly). */
export function bf16Values(bits: Uint16Array): Float64Array {
  const u = new Uint32Array(bits.length);
  for (let i = 0; i < bits.length; i++) u[i] = bits[i] << 16;
  return Float64Array.from(new Float32Array(u.buffer));
}

/** y[t][r] = Σ_c W[r][c]·x[t][c] for a dense W [rows][cols]. */
export function matmulRef(
  w: ArrayLike<number>,
  x: ArrayLike<number>,
  rows: number,
  cols: number,
  T: number,
): Float64Array {
  const y = new Float64Array(T * rows);
  for (let t = 0; t < T; t++) {
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let c = 0; c < cols; c++) s += w[r * cols + c] * x[t * cols + c];
      y[t * rows + r] = s;
    }
  }
  return y;
}

/** Σ v² over v[from .. from+n). */
function sumSquares(v: ArrayLike<number>, from: number, n: number): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += v[from + i] * v[from + i];
  return s;
}

/** RMSNorm per token (MODEL.md §4.1, fp32 policy): x / sqrt(mean(x²) + eps) · w. */
export function rmsnormRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  n: number,
  eps: number,
  T: number,
): Float64Array {
  const y = new Float64Array(T * n);
  for (let t = 0; t < T; t++) {
    const r = 1 / Math.sqrt(sumSquares(x, t * n, n) / n + eps);
    for (let i = 0; i < n; i++) y[t * n + i] = x[t * n + i] * r * w[i];
  }
  return y;
}

/** Per head: x / sqrt(Σ x² + eps) · scale (MODEL.md §4.1 L2 norm, MODEL.md §4.4 step 3). */
export function l2normHeadsRef(
  x: ArrayLike<number>,
  heads: number,
  dim: number,
  eps: number,
  scale: number,
  T: number,
): Float64Array {
  const y = new Float64Array(T * heads * dim);
  for (let th = 0; th < T * heads; th++) {
    const d = Math.sqrt(sumSquares(x, th * dim, dim) + eps);
    for (let i = 0; i < dim; i++) y[th * dim + i] = x[th * dim + i] / d * scale;
  }
  return y;
}

/** SiTU-GLU (MODEL.md §4.1): β₁·tanh(g/β₁)·sigmoid(g) · β₂·tanh(u/β₂). */
export function situGluRef(
  gate: ArrayLike<number>,
  up: ArrayLike<number>,
  b1: number,
  b2: number,
): Float64Array {
  const out = new Float64Array(gate.length);
  for (let i = 0; i < gate.length; i++) {
    const g = gate[i];
    out[i] = b1 * Math.tanh(g / b1) * sigmoid(g) * b2 * Math.tanh(up[i] / b2);
  }
  return out;
}

/** Softmax of a list of scores. */
function softmax(s: number[]): number[] {
  const max = Math.max(...s);
  const e = s.map((v) => Math.exp(v - max));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / sum);
}

/**
 * AttnRes aggregation AR(P, B) for one token (MODEL.md §4.1): rows = B[0..n-1] then P;
 * s_v = (v·sw) / sqrt(mean(v²) + eps); out = Σ softmax(s)_v · v.
 */
export function attnResRef(
  rows: ArrayLike<number>[],
  sw: ArrayLike<number>,
  H: number,
  eps: number,
): Float64Array {
  const scores = rows.map((v) => {
    let dot = 0;
    for (let i = 0; i < H; i++) dot += v[i] * sw[i];
    return dot / Math.sqrt(sumSquares(v, 0, H) / H + eps);
  });
  const p = softmax(scores);
  const out = new Float64Array(H);
  rows.forEach((v, j) => {
    for (let i = 0; i < H; i++) out[i] += p[j] * v[i];
  });
  return out;
}

/**
 * Causal depthwise conv + SiLU over a whole sequence x [T][C] from its start (MODEL.md §4.4
 * step 2): y_c(t) = Σ_j w_c[j]·x_c(t−K+1+j) with x(τ<0) = 0; out = y·sigmoid(y).
 */
export function kdaConvRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  C: number,
  K: number,
  T: number,
): Float64Array {
  const out = new Float64Array(T * C);
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < C; c++) {
      let y = 0;
      for (let j = 0; j < K; j++) {
        const tau = t - K + 1 + j;
        if (tau >= 0) y += w[c * K + j] * x[tau * C + c];
      }
      out[t * C + c] = y * sigmoid(y);
    }
  }
  return out;
}

/** Decay (MODEL.md §4.4 step 4): α = exp(lb·sigmoid(exp(A_log[h])·(g + dt_bias))). */
export function kdaGateRef(
  g: ArrayLike<number>,
  dtBias: ArrayLike<number>,
  aLog: ArrayLike<number>,
  heads: number,
  dim: number,
  lb: number,
  T: number,
): Float64Array {
  const alpha = new Float64Array(T * heads * dim);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < heads; h++) {
      for (let d = 0; d < dim; d++) {
        const c = h * dim + d;
        const z = g[t * heads * dim + c] + dtBias[c];
        alpha[t * heads * dim + c] = Math.exp(lb * sigmoid(Math.exp(aLog[h]) * z));
      }
    }
  }
  return alpha;
}

/**
 * Delta-rule recurrence (MODEL.md §4.4 step 6), state S[h][k][v] updated in place:
 * decay rows by α, u = Sᵀk, S += k ⊗ β(v − u), o = Sᵀq (read after the write).
 */
export function kdaRecurrenceRef(
  S: Float64Array,
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  alpha: ArrayLike<number>,
  beta: ArrayLike<number>,
  heads: number,
  dim: number,
  T: number,
): Float64Array {
  const o = new Float64Array(T * heads * dim);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < heads; h++) {
      const at = t * heads * dim + h * dim;
      const s0 = h * dim * dim;
      for (let a = 0; a < dim; a++) {
        for (let b = 0; b < dim; b++) S[s0 + a * dim + b] *= alpha[at + a];
      }
      for (let b = 0; b < dim; b++) {
        let u = 0;
        for (let a = 0; a < dim; a++) u += S[s0 + a * dim + b] * k[at + a];
        const delta = beta[t * heads + h] * (v[at + b] - u);
        for (let a = 0; a < dim; a++) S[s0 + a * dim + b] += k[at + a] * delta;
      }
      for (let b = 0; b < dim; b++) {
        let s = 0;
        for (let a = 0; a < dim; a++) s += S[s0 + a * dim + b] * q[at + a];
        o[at + b] = s;
      }
    }
  }
  return o;
}

/** KDA output norm + gate (MODEL.md §4.4 step 7): o / sqrt(mean(o²) + eps) · w · sigmoid(g). */
export function gatedRmsnormRef(
  o: ArrayLike<number>,
  w: ArrayLike<number>,
  gate: ArrayLike<number>,
  heads: number,
  dim: number,
  eps: number,
  T: number,
): Float64Array {
  const y = new Float64Array(T * heads * dim);
  for (let th = 0; th < T * heads; th++) {
    const d = Math.sqrt(sumSquares(o, th * dim, dim) / dim + eps);
    for (let i = 0; i < dim; i++) {
      const at = th * dim + i;
      y[at] = o[at] / d * w[i] * sigmoid(gate[at]);
    }
  }
  return y;
}

/** MLA shapes (MODEL.md §4.6). */
export interface MlaShape {
  nh: number;
  dn: number;
  dr: number;
  dv: number;
  rkv: number;
}

/**
 * MLA attention in the EXPANDED form (MODEL.md §4.6, rearranged): per head k_nope = W_UK·c(s),
 * v = W_UV·c(s); score = (q_nope·k_nope + q_pe·k_pe(s))·scale over s ≤ pos0+t;
 * o_h = Σ softmax · v_h. q [T][nh][dn+dr]; latent [P][rkv]; kpe [P][dr]; kvB the decoded
 * kv_b_proj [nh*(dn+dv)][rkv]. Returns o [T][nh][dv].
 */
export function mlaExpandedRef(
  shape: MlaShape,
  q: ArrayLike<number>,
  latent: ArrayLike<number>,
  kpe: ArrayLike<number>,
  kvB: Float64Array,
  pos0: number,
  T: number,
  scale: number,
): Float64Array {
  const { nh, dn, dr, dv, rkv } = shape;
  const P = pos0 + T;
  const o = new Float64Array(T * nh * dv);
  for (let h = 0; h < nh; h++) {
    const rowOf = (i: number) => (h * (dn + dv) + i) * rkv;
    const kNope = matmulRef(kvB.subarray(rowOf(0), rowOf(dn)), latent, dn, rkv, P);
    const value = matmulRef(kvB.subarray(rowOf(dn), rowOf(dn + dv)), latent, dv, rkv, P);
    for (let t = 0; t < T; t++) {
      const qh = (t * nh + h) * (dn + dr);
      const scores: number[] = [];
      for (let s = 0; s <= pos0 + t; s++) {
        let dot = 0;
        for (let d = 0; d < dn; d++) dot += q[qh + d] * kNope[s * dn + d];
        for (let e = 0; e < dr; e++) dot += q[qh + dn + e] * kpe[s * dr + e];
        scores.push(dot * scale);
      }
      const p = softmax(scores);
      for (let i = 0; i < dv; i++) {
        let acc = 0;
        p.forEach((ps, s) => acc += ps * value[s * dv + i]);
        o[(t * nh + h) * dv + i] = acc;
      }
    }
  }
  return o;
}

/** One token's routing decision. */
export interface Route {
  ids: number[];
  weights: number[];
}

/**
 * Router (MODEL.md §4.8 steps 1–3): s = sigmoid(logit); top-k of s + bias, ties to
 * the lowest id; weights = s, divided by (Σ + 1e-20) when renorm, times scale; ids ascending.
 */
export function routerRef(
  logits: ArrayLike<number>,
  bias: ArrayLike<number>,
  k: number,
  renorm: boolean,
  scale: number,
): Route {
  const s = Array.from(logits, sigmoid);
  const order = s.map((_, e) => e).sort((a, b) => (s[b] + bias[b]) - (s[a] + bias[a]) || a - b);
  const ids = order.slice(0, k).sort((a, b) => a - b);
  const sum = ids.reduce((acc, e) => acc + s[e], 0);
  const weights = ids.map((e) => (renorm ? s[e] / (sum + 1e-20) : s[e]) * scale);
  return { ids, weights };
}

/** acc[i] = Σ_j w[j]·y[j][i]. */
export function combineRef(y: ArrayLike<number>, w: ArrayLike<number>, k: number, n: number) {
  const acc = new Float64Array(n);
  for (let j = 0; j < k; j++) {
    for (let i = 0; i < n; i++) acc[i] += w[j] * y[j * n + i];
  }
  return acc;
}
