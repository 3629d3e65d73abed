/**
 * The independent float64 reference forward pass: the oracle the engine is checked against.
 * Written from MODEL.md §2–§4 with no code shared with lib/, ffi/ or csrc/. Every activation is a
 * float64, weights are decoded exactly once at load, and nothing is ever rounded to bf16.
 * MLA runs in the EXPANDED form (per-head k_nope and v from kv_b), so comparing against the
 * engine's absorbed latent form checks the absorption.
 */

import { isMoeLayer, readRefConfig, type RefConfig } from "./config.ts";
import {
  add,
  argmax,
  attnResMix,
  causalConvSilu,
  decodeMxfp4,
  deltaRuleStep,
  dot,
  kdaDecay,
  l2Normalize,
  matVec,
  rmsNorm,
  routeTokens,
  sigmoid,
  situGlu,
  softmax,
} from "./math.ts";
import { decodeFloatTensor, readCheckpoint, type StoredTensor } from "./safetensors.ts";

/** A weight matrix [rows][cols], row-major, as float64. */
interface Matrix {
  w: Float64Array;
  rows: number;
  cols: number;
}

interface KdaWeights {
  kind: "kda";
  q: Matrix;
  k: Matrix;
  v: Matrix;
  qConv: Float64Array;
  kConv: Float64Array;
  vConv: Float64Array;
  fA: Matrix;
  fB: Matrix;
  b: Matrix;
  /** The first num_heads entries of A_log: one per head. */
  aLog: Float64Array;
  dtBias: Float64Array;
  oNorm: Float64Array;
  g: Matrix;
  o: Matrix;
}

interface MlaWeights {
  kind: "mla";
  qA: Matrix;
  qANorm: Float64Array;
  qB: Matrix;
  kvA: Matrix;
  kvANorm: Float64Array;
  kvB: Matrix;
  /** Absent when mla_use_output_gate is false. */
  g: Matrix | null;
  o: Matrix;
}

interface MlpWeights {
  gate: Matrix;
  up: Matrix;
  down: Matrix;
}

interface ExpertWeights {
  w1: Matrix;
  w3: Matrix;
  w2: Matrix;
}

interface MoeWeights {
  kind: "moe";
  router: Matrix;
  routerBias: Float64Array;
  latentDown: Matrix;
  /** Absent when latent_moe_use_norm is false. */
  latentNorm: Float64Array | null;
  latentUp: Matrix;
  experts: ExpertWeights[];
  /** Absent when num_shared_experts is 0. */
  shared: MlpWeights | null;
}

interface LayerWeights {
  inputNorm: Float64Array;
  postAttentionNorm: Float64Array;
  /** Unused at layer 0 (the bank is empty there), so it may be absent there. */
  attnResNorm: Float64Array | null;
  attnResProj: Float64Array | null;
  mlpResNorm: Float64Array;
  mlpResProj: Float64Array;
  attention: KdaWeights | MlaWeights;
  ffn: ({ kind: "dense" } & MlpWeights) | MoeWeights;
}

/** The config plus every weight the forward pass needs, decoded to float64. */
export interface RefModel {
  config: RefConfig;
  embed: Matrix;
  layers: LayerWeights[];
  outputResNorm: Float64Array;
  outputResProj: Float64Array;
  finalNorm: Float64Array;
  lmHead: Matrix;
}

/** Eps of the MLA low-rank norms, a reference-code constant (MODEL.md §4.6). */
const MLA_LOW_RANK_EPS = 1e-6;

/** Load config.json and the checkpoint in `dir`, decoding every needed weight once. */
export async function loadReference(dir: string): Promise<RefModel> {
  const config = readRefConfig(dir);
  const store = new WeightStore(await readCheckpoint(dir), dir);
  const H = config.hiddenSize;
  const layers: LayerWeights[] = [];
  for (let i = 0; i < config.numLayers; i++) layers.push(loadLayer(store, config, i));
  const top = (suffix: string) => store.pick(MODEL_PREFIXES.map((p) => p + suffix));
  return {
    config,
    embed: store.matrix(top("embed_tokens.weight"), config.vocabSize, H),
    layers,
    outputResNorm: store.vector(top("output_attn_res_norm.weight"), H),
    outputResProj: store.vector(top("output_attn_res_proj.weight"), H),
    finalNorm: store.vector(top("norm.weight"), H),
    lmHead: store.matrix(
      store.pick(["language_model.lm_head.weight", "lm_head.weight"]),
      config.vocabSize,
      H,
    ),
  };
}

/** Prefixes of model-level tensors; the layer prefix is one of these + "layers." (MODEL.md §3.2). */
const MODEL_PREFIXES = ["language_model.model.", "language_model.", "model."];

/** Name lookup, shape checks and exact decoding over the checkpoint's tensors. */
class WeightStore {
  constructor(private tensors: Map<string, StoredTensor>, private dir: string) {}

  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** The first of `names` present in the checkpoint. */
  pick(names: string[]): string {
    const found = names.find((n) => this.tensors.has(n));
    if (found === undefined) {
      throw new Error(`${this.dir}: none of the tensors ${names.join(", ")} is in the checkpoint`);
    }
    return found;
  }

  get(name: string): StoredTensor {
    const t = this.tensors.get(name);
    if (t === undefined) throw new Error(`${this.dir}: tensor ${name} is missing`);
    return t;
  }

  /** A BF16/F32 matrix of exactly [rows, cols]. */
  matrix(name: string, rows: number, cols: number): Matrix {
    const t = this.get(name);
    this.expectShape(t, [rows, cols]);
    return { w: decodeFloatTensor(t), rows, cols };
  }

  /** A BF16/F32 tensor of n values (shape [n], or [1, n] for the AttnRes projections). */
  vector(name: string, n: number): Float64Array {
    const values = decodeFloatTensor(this.get(name));
    if (values.length !== n) {
      throw new Error(
        `${this.get(name).file}: tensor ${name} has ${values.length} values, expected ${n}`,
      );
    }
    return values;
  }

  /** An MXFP4 matrix [rows, cols] from `<base>.weight_packed` and `<base>.weight_scale`. */
  mxfp4(base: string, rows: number, cols: number, group: number): Matrix {
    const packed = this.get(`${base}.weight_packed`);
    const scale = this.get(`${base}.weight_scale`);
    for (const t of [packed, scale]) {
      if (t.dtype !== "U8") {
        throw new Error(`${t.file}: tensor ${t.name} is ${t.dtype}, expected U8`);
      }
    }
    if (cols % group !== 0) {
      throw new Error(
        `${packed.file}: ${base} has ${cols} inputs, not a multiple of group ${group}`,
      );
    }
    this.expectShape(packed, [rows, cols / 2]);
    this.expectShape(scale, [rows, cols / group]);
    return { w: decodeMxfp4(packed.bytes, scale.bytes, rows, cols, group), rows, cols };
  }

  private expectShape(t: StoredTensor, shape: number[]): void {
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new Error(
        `${t.file}: tensor ${t.name} has shape ${JSON.stringify(t.shape)}, ` +
          `config.json implies ${JSON.stringify(shape)}`,
      );
    }
  }
}

/** The layer prefix this checkpoint uses, found from layer 0's input norm. */
function layerPrefix(store: WeightStore, i: number): string {
  const base = store.pick(MODEL_PREFIXES.map((p) => `${p}layers.${i}.input_layernorm.weight`));
  return base.slice(0, -"input_layernorm.weight".length);
}

function loadLayer(store: WeightStore, c: RefConfig, i: number): LayerWeights {
  const p = layerPrefix(store, i);
  const H = c.hiddenSize;
  const optionalVector = (name: string) => store.has(name) ? store.vector(name, H) : null;
  const layer: LayerWeights = {
    inputNorm: store.vector(`${p}input_layernorm.weight`, H),
    postAttentionNorm: store.vector(`${p}post_attention_layernorm.weight`, H),
    attnResNorm: i === 0
      ? optionalVector(`${p}self_attention_res_norm.weight`)
      : store.vector(`${p}self_attention_res_norm.weight`, H),
    attnResProj: i === 0
      ? optionalVector(`${p}self_attention_res_proj.weight`)
      : store.vector(`${p}self_attention_res_proj.weight`, H),
    mlpResNorm: store.vector(`${p}mlp_res_norm.weight`, H),
    mlpResProj: store.vector(`${p}mlp_res_proj.weight`, H),
    attention: c.layerKinds[i] === "kda"
      ? loadKda(store, c, `${p}self_attn.`)
      : loadMla(store, c, `${p}self_attn.`),
    ffn: isMoeLayer(c, i) ? loadMoe(store, c, `${p}block_sparse_moe.`) : {
      kind: "dense",
      ...loadMlp(store, `${p}mlp.`, c.intermediateSize, H),
    },
  };
  return layer;
}

function loadKda(store: WeightStore, c: RefConfig, p: string): KdaWeights {
  const H = c.hiddenSize;
  const width = c.kdaHeads * c.kdaHeadDim;
  const gateRank = store.get(`${p}f_a_proj.weight`).shape[0];
  const aLogTensor = store.get(`${p}A_log`);
  const aLog = decodeFloatTensor(aLogTensor);
  if (aLog.length < c.kdaHeads) {
    throw new Error(
      `${aLogTensor.file}: tensor ${p}A_log has ${aLog.length} values, fewer than the ` +
        `${c.kdaHeads} KDA heads (linear_attn_config.num_heads)`,
    );
  }
  return {
    kind: "kda",
    q: store.matrix(`${p}q_proj.weight`, width, H),
    k: store.matrix(`${p}k_proj.weight`, width, H),
    v: store.matrix(`${p}v_proj.weight`, width, H),
    qConv: store.vector(`${p}q_conv1d.weight`, width * c.convKernel),
    kConv: store.vector(`${p}k_conv1d.weight`, width * c.convKernel),
    vConv: store.vector(`${p}v_conv1d.weight`, width * c.convKernel),
    fA: store.matrix(`${p}f_a_proj.weight`, gateRank, H),
    fB: store.matrix(`${p}f_b_proj.weight`, width, gateRank),
    b: store.matrix(`${p}b_proj.weight`, c.kdaHeads, H),
    aLog: aLog.slice(0, c.kdaHeads),
    dtBias: store.vector(`${p}dt_bias`, width),
    oNorm: store.vector(`${p}o_norm.weight`, c.kdaHeadDim),
    g: store.matrix(`${p}g_proj.weight`, width, H),
    o: store.matrix(`${p}o_proj.weight`, H, width),
  };
}

function loadMla(store: WeightStore, c: RefConfig, p: string): MlaWeights {
  const H = c.hiddenSize;
  const qHead = c.qkNopeHeadDim + c.qkRopeHeadDim;
  const valueWidth = c.mlaHeads * c.vHeadDim;
  return {
    kind: "mla",
    qA: store.matrix(`${p}q_a_proj.weight`, c.qLoraRank, H),
    qANorm: store.vector(`${p}q_a_layernorm.weight`, c.qLoraRank),
    qB: store.matrix(`${p}q_b_proj.weight`, c.mlaHeads * qHead, c.qLoraRank),
    kvA: store.matrix(`${p}kv_a_proj_with_mqa.weight`, c.kvLoraRank + c.qkRopeHeadDim, H),
    kvANorm: store.vector(`${p}kv_a_layernorm.weight`, c.kvLoraRank),
    kvB: store.matrix(
      `${p}kv_b_proj.weight`,
      c.mlaHeads * (c.qkNopeHeadDim + c.vHeadDim),
      c.kvLoraRank,
    ),
    g: c.mlaUseOutputGate ? store.matrix(`${p}g_proj.weight`, valueWidth, H) : null,
    o: store.matrix(`${p}o_proj.weight`, H, valueWidth),
  };
}

function loadMlp(store: WeightStore, p: string, width: number, H: number): MlpWeights {
  return {
    gate: store.matrix(`${p}gate_proj.weight`, width, H),
    up: store.matrix(`${p}up_proj.weight`, width, H),
    down: store.matrix(`${p}down_proj.weight`, H, width),
  };
}

function loadMoe(store: WeightStore, c: RefConfig, p: string): MoeWeights {
  const H = c.hiddenSize;
  const L = c.latentSize;
  const I = c.moeIntermediateSize;
  const g = c.mxfp4GroupSize;
  const experts: ExpertWeights[] = [];
  for (let e = 0; e < c.numExperts; e++) {
    experts.push({
      w1: store.mxfp4(`${p}experts.${e}.w1`, I, L, g),
      w3: store.mxfp4(`${p}experts.${e}.w3`, I, L, g),
      w2: store.mxfp4(`${p}experts.${e}.w2`, L, I, g),
    });
  }
  return {
    kind: "moe",
    router: store.matrix(`${p}gate.weight`, c.numExperts, H),
    routerBias: store.vector(`${p}gate.e_score_correction_bias`, c.numExperts),
    latentDown: store.matrix(`${p}routed_expert_down_proj.weight`, L, H),
    latentNorm: c.latentMoeUseNorm ? store.vector(`${p}routed_expert_norm.weight`, L) : null,
    latentUp: store.matrix(`${p}routed_expert_up_proj.weight`, H, L),
    experts,
    shared: c.numSharedExperts > 0
      ? loadMlp(store, `${p}shared_experts.`, c.numSharedExperts * I, H)
      : null,
  };
}

/** y = W x. */
function apply(m: Matrix, x: Float64Array): Float64Array {
  return matVec(m.w, m.rows, m.cols, x);
}

/** SiTU-GLU MLP: down(situ_glu(gate x, up x)). */
function mlp(w: MlpWeights, x: Float64Array, c: RefConfig): Float64Array {
  return apply(w.down, situGlu(apply(w.gate, x), apply(w.up, x), c.situBeta, c.situLinearBeta));
}

/** KDA over the whole sequence (MODEL.md §4.4), zero conv history and zero state at t = 0. */
function kdaForward(w: KdaWeights, xs: Float64Array[], c: RefConfig): Float64Array[] {
  const D = c.kdaHeadDim;
  const q = causalConvSilu(xs.map((x) => apply(w.q, x)), w.qConv, c.convKernel);
  const k = causalConvSilu(xs.map((x) => apply(w.k, x)), w.kConv, c.convKernel);
  const v = causalConvSilu(xs.map((x) => apply(w.v, x)), w.vConv, c.convKernel);
  const states = Array.from({ length: c.kdaHeads }, () => new Float64Array(D * D));
  const qScale = 1 / Math.sqrt(D);
  return xs.map((x, t) => {
    const decayLogits = apply(w.fB, apply(w.fA, x));
    const betaLogits = apply(w.b, x);
    const gate = apply(w.g, x);
    const heads = new Float64Array(c.kdaHeads * D);
    for (let h = 0; h < c.kdaHeads; h++) {
      const head = (a: Float64Array) => a.subarray(h * D, (h + 1) * D);
      const qh = l2Normalize(head(q[t])).map((value) => value * qScale);
      const kh = l2Normalize(head(k[t]));
      const alpha = new Float64Array(D);
      for (let d = 0; d < D; d++) {
        alpha[d] = kdaDecay(
          decayLogits[h * D + d],
          w.dtBias[h * D + d],
          w.aLog[h],
          c.gateLowerBound,
        );
      }
      const o = deltaRuleStep(states[h], alpha, qh, kh, head(v[t]), sigmoid(betaLogits[h]));
      const normed = rmsNorm(o, w.oNorm, c.rmsNormEps);
      const g = head(gate);
      for (let d = 0; d < D; d++) heads[h * D + d] = normed[d] * sigmoid(g[d]);
    }
    return apply(w.o, heads);
  });
}

/** Gated NoPE MLA in the expanded form (MODEL.md §4.6): per-head keys/values, causal softmax. */
function mlaForward(w: MlaWeights, xs: Float64Array[], c: RefConfig): Float64Array[] {
  const nope = c.qkNopeHeadDim;
  const rope = c.qkRopeHeadDim;
  const dv = c.vHeadDim;
  const qHead = nope + rope;
  const kvHead = nope + dv;
  const scale = 1 / Math.sqrt(nope + rope);
  const queries = xs.map((x) => apply(w.qB, rmsNorm(apply(w.qA, x), w.qANorm, MLA_LOW_RANK_EPS)));
  const latents = xs.map((x) => apply(w.kvA, x));
  const keyValues = latents.map((ckv) =>
    apply(w.kvB, rmsNorm(ckv.subarray(0, c.kvLoraRank), w.kvANorm, MLA_LOW_RANK_EPS))
  );
  const sharedPe = latents.map((ckv) => ckv.subarray(c.kvLoraRank)); // never normed, never rotated
  return xs.map((x, t) => {
    const out = new Float64Array(c.mlaHeads * dv);
    for (let h = 0; h < c.mlaHeads; h++) {
      const qNope = queries[t].subarray(h * qHead, h * qHead + nope);
      const qPe = queries[t].subarray(h * qHead + nope, (h + 1) * qHead);
      const scores: number[] = [];
      for (let s = 0; s <= t; s++) {
        const kNope = keyValues[s].subarray(h * kvHead, h * kvHead + nope);
        scores.push((dot(qNope, kNope) + dot(qPe, sharedPe[s])) * scale);
      }
      const p = softmax(scores);
      for (let s = 0; s <= t; s++) {
        const value = keyValues[s].subarray(h * kvHead + nope, (h + 1) * kvHead);
        for (let d = 0; d < dv; d++) out[h * dv + d] += p[s] * value[d];
      }
    }
    if (w.g !== null) {
      const gate = apply(w.g, x);
      for (let i = 0; i < out.length; i++) out[i] *= sigmoid(gate[i]);
    }
    return apply(w.o, out);
  });
}

/** Stable LatentMoE for one token (MODEL.md §4.8), plus the shared experts on the original input. */
function moeForward(w: MoeWeights, x: Float64Array, c: RefConfig): Float64Array {
  const route = routeTokens(
    apply(w.router, x),
    w.routerBias,
    c.topK,
    c.moeRenormalize,
    c.routedScalingFactor,
  );
  const latent = apply(w.latentDown, x);
  const mixed = new Float64Array(c.latentSize);
  route.experts.forEach((e, j) => {
    const expert = w.experts[e];
    const hidden = situGlu(
      apply(expert.w1, latent),
      apply(expert.w3, latent),
      c.situBeta,
      c.situLinearBeta,
    );
    const y = apply(expert.w2, hidden);
    for (let i = 0; i < mixed.length; i++) mixed[i] += route.weights[j] * y[i];
  });
  const normed = w.latentNorm === null ? mixed : rmsNorm(mixed, w.latentNorm, c.rmsNormEps);
  const routed = apply(w.latentUp, normed);
  return w.shared === null ? routed : add(routed, mlp(w.shared, x, c));
}

/**
 * The AttnRes layer loop (MODEL.md §4.2) over the whole sequence; returns the final-normed hidden
 * state of every position. The prefix P and the snapshot bank are per token.
 */
function finalHidden(model: RefModel, ids: number[]): Float64Array[] {
  const c = model.config;
  const eps = c.rmsNormEps;
  const H = c.hiddenSize;
  let prefix: Float64Array[] = ids.map((id) => {
    if (!Number.isInteger(id) || id < 0 || id >= c.vocabSize) {
      throw new Error(`token id ${id} is outside the vocabulary [0, ${c.vocabSize})`);
    }
    return model.embed.w.slice(id * H, (id + 1) * H);
  });
  const banks: Float64Array[][] = ids.map(() => []);
  model.layers.forEach((layer, i) => {
    const attnInput = prefix.map((P, t) =>
      banks[t].length === 0
        ? P
        : attnResMix(P, banks[t], layer.attnResNorm!, layer.attnResProj!, eps)
    );
    const startsBlock = i % c.attnResBlockSize === 0;
    if (startsBlock) prefix.forEach((P, t) => banks[t].push(P));
    const normed = attnInput.map((h) => rmsNorm(h, layer.inputNorm, eps));
    const attention = layer.attention.kind === "kda"
      ? kdaForward(layer.attention, normed, c)
      : mlaForward(layer.attention, normed, c);
    prefix = startsBlock ? attention : prefix.map((P, t) => add(P, attention[t]));
    const ffnInput = prefix.map((P, t) =>
      rmsNorm(
        attnResMix(P, banks[t], layer.mlpResNorm, layer.mlpResProj, eps),
        layer.postAttentionNorm,
        eps,
      )
    );
    const ffn = layer.ffn;
    prefix = prefix.map((P, t) =>
      add(P, ffn.kind === "dense" ? mlp(ffn, ffnInput[t], c) : moeForward(ffn, ffnInput[t], c))
    );
  });
  return prefix.map((P, t) =>
    rmsNorm(
      attnResMix(P, banks[t], model.outputResNorm, model.outputResProj, eps),
      model.finalNorm,
      eps,
    )
  );
}

/** Logits (vocab) at every position of `ids`, by a full forward pass over the whole sequence. */
export function referenceForward(model: RefModel, ids: number[]): Float64Array[] {
  return finalHidden(model, ids).map((y) => apply(model.lmHead, y));
}

/**
 * Greedy decode by full recompute: n new tokens (argmax, ties to the lowest id), plus the logits
 * of each step (step 0 = the distribution after the prompt).
 */
export function referenceGreedy(
  model: RefModel,
  prompt: number[],
  n: number,
): { tokens: number[]; logits: Float64Array[] } {
  if (prompt.length === 0) throw new Error("referenceGreedy: the prompt is empty");
  const ids = [...prompt];
  const tokens: number[] = [];
  const logits: Float64Array[] = [];
  for (let step = 0; step < n; step++) {
    const hidden = finalHidden(model, ids);
    const stepLogits = apply(model.lmHead, hidden[hidden.length - 1]);
    const next = argmax(stepLogits);
    logits.push(stepLogits);
    tokens.push(next);
    ids.push(next);
  }
  return { tokens, logits };
}
