/**
 * Next-token choice from logits. First the logits are adjusted (only the ids each rule names;
 * arithmetic in float64 from the fp32 logit, rounded back to float32, clamped to its range):
 *   a. repetition penalty r (CTRL, Keskar et al. 2019, as Hugging Face implements it): every id
 *      that occurs in the sequence so far, prompt included, has a positive logit divided by r
 *      and a negative one multiplied by r;
 *   b. presence and frequency penalties (OpenAI's definition): with c[j] the number of times id
 *      j was generated so far in this answer (the prompt does not count),
 *      logit[j] -= c[j] * frequency_penalty + (c[j] > 0 ? 1 : 0) * presence_penalty;
 *   c. logit bias: logit[j] += bias[j] for every listed id.
 * Then greedy (argmax) when temperature is 0 or absent; otherwise, in this fixed order:
 *   1. divide the logits by the temperature;
 *   2. top-k: keep the k highest (0 or absent = all);
 *   3. softmax over the kept tokens;
 *   4. top-p: keep the smallest prefix, by falling probability, whose mass reaches p;
 *   5. min-p: drop tokens whose probability is below min_p times the highest;
 *   6. draw from what is left, renormalised, with the uniform number of this position.
 * The uniform for generated token i (i = history length - prompt length) is output i of
 * splitmix64(seed): a function of (seed, i) alone, so positions can be sampled in any order
 * (a verify pass samples several ahead) and each still gets plain decoding's token.
 * Ties in ranking go to the lowest id everywhere, so top-k = 1 is exactly greedy, and a given
 * seed gives the same tokens on every run and machine. Arithmetic is float64. With no
 * adjustment asked for, the model's logits are used as they are (not copied).
 */

import { badInput, runInvalid } from "../errors.ts";

/** How the next token is picked: greedy unless `temperature` > 0. */
export interface SamplingOptions {
  /** 0 or absent: greedy. Otherwise > 0. */
  temperature?: number;
  /** In (0, 1]; 1 or absent: off. */
  topP?: number;
  /** Integer >= 0; 0 or absent: off. */
  topK?: number;
  /** In [0, 1]; 0 or absent: off. */
  minP?: number;
  /** Any safe integer; absent: 0, so unseeded runs are still reproducible. */
  seed?: number;
  /** In [-2, 2]; 0 or absent: off. Subtracted once from every id generated so far. */
  presencePenalty?: number;
  /** In [-2, 2]; 0 or absent: off. Subtracted once per time an id was generated so far. */
  frequencyPenalty?: number;
  /** In (0, 100]; 1 or absent: off. Divides positive and multiplies negative logits of seen ids. */
  repetitionPenalty?: number;
  /** Token id -> value in [-100, 100] added to its logit (ids must be whole numbers >= 0). */
  logitBias?: Readonly<Record<number, number>>;
}

/** The sequence a token is picked after: prompt ids, then the ids generated so far. */
export interface TokenHistory {
  tokens: readonly number[];
  /** How many of `tokens` are the prompt. */
  promptLength: number;
}

const NO_HISTORY: TokenHistory = { tokens: [], promptLength: 0 };
const F32_MAX = 3.4028234663852886e38;

/**
 * A sampler: the token at a position depends on the logits, the seed and the history alone.
 * Called without a history, positions count up from 0, one per call.
 */
export class Sampler {
  readonly #temperature: number;
  readonly #topK: number;
  readonly #topP: number;
  readonly #minP: number;
  readonly #seed: number;
  /** The position used when no history is given: one past the previous call's. */
  #nextIndex = 0;
  readonly #presence: number;
  readonly #frequency: number;
  readonly #repetition: number;
  readonly #bias: [id: number, bias: number][];

  /** Validates every option (badInput on out-of-range values). */
  constructor(options: SamplingOptions = {}) {
    this.#temperature = checkRange("temperature", options.temperature ?? 0, 0, Infinity);
    this.#topK = checkRange("top_k", options.topK ?? 0, 0, Number.MAX_SAFE_INTEGER, true);
    this.#topP = checkRange("top_p", options.topP ?? 1, 0, 1);
    if (this.#topP === 0) throw badInput("top_p must be greater than 0 (use 1 to turn it off)");
    this.#minP = checkRange("min_p", options.minP ?? 0, 0, 1);
    const seed = checkRange(
      "seed",
      options.seed ?? 0,
      -Number.MAX_SAFE_INTEGER,
      Number.MAX_SAFE_INTEGER,
      true,
    );
    this.#seed = seed;
    this.#presence = checkRange("presence_penalty", options.presencePenalty ?? 0, -2, 2);
    this.#frequency = checkRange("frequency_penalty", options.frequencyPenalty ?? 0, -2, 2);
    this.#repetition = checkRange("repetition_penalty", options.repetitionPenalty ?? 1, 0, 100);
    if (this.#repetition === 0) {
      throw badInput("repetition_penalty must be greater than 0 (use 1 to turn it off)");
    }
    this.#bias = Object.entries(options.logitBias ?? {}).map(([key, value]) => {
      const id = Number(key);
      if (!/^\d+$/.test(key) || !Number.isSafeInteger(id)) {
        throw badInput(`logit_bias: ${JSON.stringify(key)} is not a token id`);
      }
      return [id, checkRange(`logit_bias[${key}]`, value, -100, 100)];
    });
  }

  /** True when some rule changes the logits before the pick (penalties or a bias). */
  get adjustsLogits(): boolean {
    return this.#presence !== 0 || this.#frequency !== 0 || this.#repetition !== 1 ||
      this.#bias.length > 0;
  }

  /**
   * The next token id after `history` (needed by the penalties; the prompt counts for the
   * repetition penalty only). NaN or +Infinity in the logits is a failed run (runInvalid).
   */
  next(modelLogits: Float32Array, history?: TokenHistory): number {
    checkLogits(modelLogits);
    const index = history ? history.tokens.length - history.promptLength : this.#nextIndex;
    this.#nextIndex = index + 1;
    history ??= NO_HISTORY;
    const logits = this.adjustsLogits ? this.adjust(modelLogits, history) : modelLogits;
    if (this.#temperature === 0) return argmax(logits);
    const ids = rankByLogit(logits, this.#topK);
    const probs = softmax(logits, ids, this.#temperature);
    const keep = Math.min(topPCount(probs, this.#topP), minPCount(probs, this.#minP));
    return draw(ids.subarray(0, keep), probs.subarray(0, keep), uniformAt(this.#seed, index));
  }

  /**
   * A copy of `logits` with the penalties and the bias applied (steps a-c above): each changed
   * logit is computed in float64 from the fp32 one, then rounded to float32 once.
   */
  adjust(logits: Float32Array, history: TokenHistory): Float32Array {
    const counts = new Map<number, number>();
    const value = new Map<number, number>(); // id -> its adjusted logit, float64
    history.tokens.forEach((id, i) => {
      checkId(id, logits.length, "the token history");
      if (!value.has(id)) {
        const l = logits[id];
        const r = this.#repetition;
        value.set(id, r === 1 ? l : l > 0 ? l / r : l * r);
      }
      if (i >= history.promptLength) counts.set(id, (counts.get(id) ?? 0) + 1);
    });
    for (const [id, c] of counts) {
      value.set(id, value.get(id)! - c * this.#frequency - this.#presence);
    }
    for (const [id, bias] of this.#bias) {
      checkId(id, logits.length, "logit_bias");
      value.set(id, (value.get(id) ?? logits[id]) + bias);
    }
    const out = new Float32Array(logits);
    for (const [id, v] of value) {
      // A -Infinity logit (an id the model rules out) stays ruled out.
      if (logits[id] !== -Infinity) out[id] = Math.fround(Math.max(-F32_MAX, Math.min(F32_MAX, v)));
    }
    return out;
  }
}

/** Refuses logit_bias ids outside a vocabulary of `vocab` ids (before any model is loaded). */
export function checkLogitBias(options: SamplingOptions, vocab: number, what = "logit_bias"): void {
  for (const key of Object.keys(options.logitBias ?? {})) checkId(Number(key), vocab, what);
}

function checkId(id: number, vocab: number, what: string): void {
  if (!(Number.isInteger(id) && id >= 0 && id < vocab)) {
    throw badInput(`${what}: token id ${id} is outside the vocabulary (0..${vocab - 1})`);
  }
}

/** Index of the largest logit; ties go to the lowest id. */
export function argmax(logits: Float32Array): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

function checkRange(name: string, v: number, min: number, max: number, integer = false): number {
  if (
    typeof v !== "number" || Number.isNaN(v) || v < min || v > max ||
    (integer && !Number.isInteger(v))
  ) {
    const kind = integer ? "an integer" : "a number";
    throw badInput(`${name} must be ${kind} in [${min}, ${max}]; got ${v}`);
  }
  return v;
}

function checkLogits(logits: Float32Array): void {
  if (logits.length === 0) throw runInvalid("the model produced an empty logit vector");
  for (let i = 0; i < logits.length; i++) {
    if (Number.isNaN(logits[i]) || logits[i] === Infinity) {
      throw runInvalid(`logit ${i} is ${logits[i]}; the forward pass produced a non-finite value`);
    }
  }
}

/** Ids by falling logit, ties by rising id; only the first `k` when k > 0. -Infinity never kept. */
function rankByLogit(logits: Float32Array, k: number): Int32Array {
  // Sort one number per token, (order key of the logit) * 2^idBits + id, with the native
  // numeric sort: exact (32 + idBits <= 53 bits) and ~10x faster than a comparator sort.
  const idBits = Math.max(1, Math.ceil(Math.log2(logits.length)));
  if (idBits > 21) {
    throw runInvalid(`a vocabulary of ${logits.length} is too large for the sampler`);
  }
  const bits = new Uint32Array(logits.buffer, logits.byteOffset, logits.length);
  const keys = new Float64Array(logits.length);
  let n = 0;
  for (let id = 0; id < logits.length; id++) {
    if (logits[id] === -Infinity) continue;
    keys[n++] = fallingOrderKey(bits[id]) * 2 ** idBits + id;
  }
  if (n === 0) throw runInvalid("every logit is -Infinity; nothing can be sampled");
  const sorted = keys.subarray(0, n).sort();
  const count = k > 0 ? Math.min(k, n) : n;
  const ids = new Int32Array(count);
  for (let i = 0; i < count; i++) ids[i] = sorted[i] % 2 ** idBits;
  return ids;
}

/** A uint32 that grows as the float32 with these bits falls (-0 and +0 tie). */
function fallingOrderKey(u: number): number {
  const ascending = u & 0x80000000 ? ~u >>> 0 : (u | 0x80000000) >>> 0;
  const key = 0xffffffff - ascending;
  return u === 0x80000000 ? 0x7fffffff : key; // -0 sorts with +0
}

/** softmax(logits[ids] / temperature), for ids in falling-logit order (ids[0] is the maximum). */
function softmax(logits: Float32Array, ids: Int32Array, temperature: number): Float64Array {
  const probs = new Float64Array(ids.length);
  const max = logits[ids[0]];
  let sum = 0;
  for (let i = 0; i < ids.length; i++) {
    sum += probs[i] = Math.exp((logits[ids[i]] - max) / temperature);
  }
  for (let i = 0; i < ids.length; i++) probs[i] /= sum;
  return probs;
}

/** How many of the (falling) probabilities top-p keeps: the shortest prefix reaching p. */
function topPCount(probs: Float64Array, p: number): number {
  if (p >= 1) return probs.length;
  let mass = 0;
  for (let i = 0; i < probs.length; i++) {
    mass += probs[i];
    if (mass >= p) return i + 1;
  }
  return probs.length;
}

/** How many of the (falling) probabilities are >= minP times the highest. */
function minPCount(probs: Float64Array, minP: number): number {
  const threshold = minP * probs[0];
  let n = 1;
  while (n < probs.length && probs[n] >= threshold) n++;
  return n;
}

/** Inverse-CDF draw over the kept candidates, renormalised; `u` in [0, 1). */
function draw(ids: Int32Array, probs: Float64Array, u: number): number {
  let total = 0;
  for (const p of probs) total += p;
  let target = u * total;
  for (let i = 0; i < ids.length; i++) {
    target -= probs[i];
    if (target < 0) return ids[i];
  }
  return ids[ids.length - 1];
}

const MASK64 = (1n << 64n) - 1n;
const GOLDEN_GAMMA = 0x9e3779b97f4a7c15n;

/** splitmix64's output function on a 64-bit state: a uniform double in [0, 1) (top 53 bits). */
function mix64(state: bigint): number {
  let z = state;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  z = z ^ (z >> 31n);
  return Number(z >> 11n) / 2 ** 53;
}

/**
 * Output `index` (0-based) of splitmix64(seed). splitmix64's state after n steps is
 * seed + n * gamma, so any output can be computed directly: a stream keyed by position.
 */
export function uniformAt(seed: number, index: number): number {
  const steps = BigInt(index) + 1n;
  return mix64((BigInt.asUintN(64, BigInt(seed)) + steps * GOLDEN_GAMMA) & MASK64);
}

/** splitmix64 (Steele, Lea, Flood 2014): uniform doubles in [0, 1) from the top 53 bits. */
export function splitmix64(seed: number): () => number {
  let index = 0;
  return () => uniformAt(seed, index++);
}
