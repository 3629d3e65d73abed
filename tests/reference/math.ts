/**
 * The reference's building blocks, in float64, written from MODEL.md §3.4 and §4. Every function
 * is one operation on plain Float64Arrays so the unit tests can check each against hand cases.
 */

/** E2M1 magnitudes for codes 0..7; bit 3 is the sign (MODEL.md §3.4). */
const E2M1_MAGNITUDE = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

/** One FP4 E2M1 code (0..15) as a number; code 8 is -0. */
export function e2m1(code: number): number {
  const magnitude = E2M1_MAGNITUDE[code & 7];
  return code & 8 ? -magnitude : magnitude;
}

/** One E8M0 scale byte as 2^(s-127). 255 is NaN in OCP MX and is refused (MODEL.md §3.4). */
export function e8m0(s: number): number {
  if (s === 255) throw new Error("E8M0 scale 255 (NaN): the expert weights are corrupt");
  return Math.pow(2, s - 127);
}

/**
 * An MXFP4 matrix [rows][cols] from `packed` [rows][cols/2] and `scales` [rows][cols/group]:
 * low nibble = even column, high nibble = odd column, one E8M0 scale per `group` columns.
 */
export function decodeMxfp4(
  packed: Uint8Array,
  scales: Uint8Array,
  rows: number,
  cols: number,
  group: number,
): Float64Array {
  const out = new Float64Array(rows * cols);
  const groupsPerRow = cols / group;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const byte = packed[r * (cols / 2) + (c >> 1)];
      const code = c % 2 === 0 ? byte & 0x0f : byte >> 4;
      out[r * cols + c] = e2m1(code) * e8m0(scales[r * groupsPerRow + Math.floor(c / group)]);
    }
  }
  return out;
}

/** y = W x for a row-major W [rows][cols]. */
export function matVec(w: Float64Array, rows: number, cols: number, x: Float64Array): Float64Array {
  if (x.length !== cols) throw new Error(`matVec: input has ${x.length} values, expected ${cols}`);
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let sum = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) sum += w[base + c] * x[c];
    y[r] = sum;
  }
  return y;
}

/** Elementwise a + b. */
export function add(a: Float64Array, b: Float64Array): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] + b[i];
  return out;
}

/** Elementwise a * b. */
export function mul(a: Float64Array, b: Float64Array): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] * b[i];
  return out;
}

/** Dot product. */
export function dot(a: Float64Array, b: Float64Array): number {
  let sum = 0;
  for (let i = 0; i < a.length; i++) sum += a[i] * b[i];
  return sum;
}

/** Logistic sigmoid. */
export function sigmoid(x: number): number {
  return 1 / (1 + Math.exp(-x));
}

/** SiLU: x * sigmoid(x). */
export function silu(x: number): number {
  return x * sigmoid(x);
}

/** 1 / sqrt(mean(x²) + eps): the RMS statistic every norm here uses. */
export function inverseRms(x: Float64Array, eps: number): number {
  let sumSquares = 0;
  for (let i = 0; i < x.length; i++) sumSquares += x[i] * x[i];
  return 1 / Math.sqrt(sumSquares / x.length + eps);
}

/** RMSNorm: x / sqrt(mean(x²) + eps) * w. */
export function rmsNorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  const r = inverseRms(x, eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * r * w[i];
  return out;
}

/** L2 normalisation for KDA q and k: x / sqrt(sum(x²) + eps), a sum and not a mean. */
export function l2Normalize(x: Float64Array, eps = 1e-6): Float64Array {
  let sumSquares = 0;
  for (let i = 0; i < x.length; i++) sumSquares += x[i] * x[i];
  const r = 1 / Math.sqrt(sumSquares + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * r;
  return out;
}

/**
 * SiTU-GLU: beta1·tanh(g/beta1)·sigmoid(g) (sigmoid of the UNCAPPED gate) times
 * beta2·tanh(u/beta2), so |out| < beta1·beta2.
 */
export function situGlu(
  gate: Float64Array,
  up: Float64Array,
  beta1: number,
  beta2: number,
): Float64Array {
  const out = new Float64Array(gate.length);
  for (let i = 0; i < gate.length; i++) {
    const g = gate[i];
    const activated = beta1 * Math.tanh(g / beta1) * sigmoid(g);
    out[i] = activated * (beta2 * Math.tanh(up[i] / beta2));
  }
  return out;
}

/** Numerically stable softmax. */
export function softmax(scores: number[]): number[] {
  const max = Math.max(...scores);
  const exps = scores.map((s) => Math.exp(s - max));
  const total = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / total);
}

/**
 * AttnRes aggregation (MODEL.md §4.1 `AR`): score every row (bank rows first, the prefix last) by
 * dot(v, wn ⊙ wp) / rms(v), softmax the scores, mix the RAW rows. An empty bank returns the prefix.
 */
export function attnResMix(
  prefix: Float64Array,
  bank: Float64Array[],
  normWeight: Float64Array,
  projWeight: Float64Array,
  eps: number,
): Float64Array {
  if (bank.length === 0) return prefix;
  const rows = [...bank, prefix];
  const scoreVector = mul(normWeight, projWeight);
  const p = softmax(rows.map((v) => dot(v, scoreVector) * inverseRms(v, eps)));
  const out = new Float64Array(prefix.length);
  rows.forEach((v, r) => {
    for (let i = 0; i < out.length; i++) out[i] += p[r] * v[i];
  });
  return out;
}

/** Indices of the k largest values, largest first; equal values go to the lowest index. */
export function topKIndices(values: Float64Array, k: number): number[] {
  const order = Array.from(values.keys());
  order.sort((a, b) => values[b] - values[a] || a - b);
  return order.slice(0, k);
}

/**
 * Short causal depthwise convolution + SiLU over a sequence, zero history before t = 0.
 * `weight` is [channels][kernel], oldest tap first, so weight[c][kernel-1] meets the current input.
 */
export function causalConvSilu(
  inputs: Float64Array[],
  weight: Float64Array,
  kernel: number,
): Float64Array[] {
  return inputs.map((current, t) => {
    const out = new Float64Array(current.length);
    for (let c = 0; c < current.length; c++) {
      let y = 0;
      for (let j = 0; j < kernel; j++) {
        const source = t - (kernel - 1) + j;
        if (source >= 0) y += weight[c * kernel + j] * inputs[source][c];
      }
      out[c] = silu(y);
    }
    return out;
  });
}

/** KDA decay α per key channel of head h: exp(lb · sigmoid(exp(A_log[h]) · (g + dt_bias))). */
export function kdaDecay(g: number, dtBias: number, aLog: number, lowerBound: number): number {
  return Math.exp(lowerBound * sigmoid(Math.exp(aLog) * (g + dtBias)));
}

/**
 * One delta-rule step for one head, state S[k][v] (row-major [dk][dv]), updated in place:
 * decay rows by α, read u = Sᵀk, write S += k ⊗ β(v − u), return o = Sᵀq from the UPDATED state.
 */
export function deltaRuleStep(
  state: Float64Array,
  alpha: Float64Array,
  q: Float64Array,
  k: Float64Array,
  v: Float64Array,
  beta: number,
): Float64Array {
  const dk = k.length;
  const dv = v.length;
  for (let i = 0; i < dk; i++) {
    for (let j = 0; j < dv; j++) state[i * dv + j] *= alpha[i];
  }
  const u = new Float64Array(dv);
  for (let i = 0; i < dk; i++) {
    for (let j = 0; j < dv; j++) u[j] += state[i * dv + j] * k[i];
  }
  for (let i = 0; i < dk; i++) {
    for (let j = 0; j < dv; j++) state[i * dv + j] += k[i] * beta * (v[j] - u[j]);
  }
  const o = new Float64Array(dv);
  for (let i = 0; i < dk; i++) {
    for (let j = 0; j < dv; j++) o[j] += state[i * dv + j] * q[i];
  }
  return o;
}

/**
 * Router weights (MODEL.md §4.8 steps 1–3): experts chosen by sigmoid(logit) + bias, weighted by the
 * unbiased sigmoid, renormalised by (sum + 1e-20) when asked and top-k > 1, then scaled.
 */
export function routeTokens(
  logits: Float64Array,
  bias: Float64Array,
  topK: number,
  renormalize: boolean,
  scalingFactor: number,
): { experts: number[]; weights: number[] } {
  const scores = logits.map(sigmoid);
  const experts = topKIndices(scores.map((s, e) => s + bias[e]), topK);
  let weights = experts.map((e) => scores[e]);
  if (renormalize && topK > 1) {
    const total = weights.reduce((a, b) => a + b, 0) + 1e-20;
    weights = weights.map((w) => w / total);
  }
  return { experts, weights: weights.map((w) => w * scalingFactor) };
}

/** Index of the largest value; ties go to the lowest index. */
export function argmax(values: Float64Array): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}
