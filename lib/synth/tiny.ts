/**
 * `make-tiny`: writes a random-weight checkpoint in the exact released K3 layout (MODEL.md §2, §3):
 * nested config.json, generation_config.json, tiktoken.model + tokenizer_config.json, a trunk
 * shard, expert shards and model.safetensors.index.json. `tiny` is a few MB with every width
 * different from every other; `k3` has K3's true widths with few layers and experts, for
 * benchmarks. Files are generated chunk by chunk and streamed to disk, so a multi-GB shard never
 * sits in memory, and every file is replaced atomically. Same options, same bytes.
 */

import * as path from "node:path";
import { buildHeader, DTYPE_SIZES, tensorBytes } from "../checkpoint/safetensors.ts";
import type { DType } from "../checkpoint/types.ts";
import { badInput } from "../errors.ts";
import { writeAll, writeAtomically } from "../io/atomic.ts";
import { NUM_SPECIAL_TOKENS } from "../text/tokenizer.ts";
import { formatTiktokenRanks, trainBpe } from "./bpe.ts";
import { SYNTH_CORPUS } from "./corpus.ts";
import { fillSkewedBias, type Routing, ROUTINGS, SKEWED_STRENGTH } from "./routing.ts";
import {
  E2M1_RMS,
  E8M0_BIAS,
  encodeMxfp4Groups,
  f32ToBf16,
  fillBf16Normal,
  fillBf16Uniform,
  fillF32Uniform,
  fillNormal,
  fillRandomBytes,
  streamRng,
  type XorShift128,
} from "./numerics.ts";

/** Options of `makeTiny`; every field has a default from the chosen shape. */
export interface TinyOptions {
  seed?: number;
  layers?: number;
  experts?: number;
  shape?: "tiny" | "k3";
  topK?: number;
  /** 1-based layers that use MLA (the rest use KDA), as in `full_attn_layers`. */
  mlaLayers?: number[];
  blockSize?: number;
  hidden?: number;
  /** Write a flat text-only config (no text_config) and bare `model.` tensor names. */
  flat?: boolean;
  /** How the routers pick experts (lib/synth/routing.ts); default "uniform". */
  routing?: Routing;
  /** How the weight matrices are drawn (see {@link Weights}); default "uniform". */
  weights?: Weights;
}

/**
 * How the weight matrices are drawn. `uniform`: BF16 matrices uniform noise, MXFP4 experts
 * uniform random codes under a fixed scale (cheap; the default, byte for byte as always).
 * `normal`: as trained weights are distributed: BF16 matrices (and the embedding) N(0, std^2)
 * with the same per-tensor std (1/sqrt(fan-in)), and MXFP4 experts quantized from such normal
 * weights (per-group E8M0 scale from the group's largest magnitude, E2M1 codes rounded to
 * nearest). Norm gains, biases and F32 tensors are drawn as under `uniform` either way.
 */
export type Weights = "uniform" | "normal";
export const WEIGHTS: readonly Weights[] = ["uniform", "normal"];

/** Every width and count of a synthetic model. */
export interface SynthShape {
  hidden: number;
  layers: number;
  blockSize: number;
  /** 1-based, sorted. */
  mlaLayers: number[];
  kdaHeads: number;
  kdaHeadDim: number;
  convKernel: number;
  mlaHeads: number;
  qLoraRank: number;
  kvLoraRank: number;
  qkNope: number;
  qkRope: number;
  vHeadDim: number;
  experts: number;
  topK: number;
  sharedExperts: number;
  moeIntermediate: number;
  latent: number;
  denseIntermediate: number;
  groupSize: number;
}

type Preset = Omit<SynthShape, "mlaLayers">;

/** Small widths, all different, so a swapped dimension cannot pass a test. */
const TINY: Preset = {
  hidden: 96,
  layers: 8,
  blockSize: 3,
  kdaHeads: 3,
  kdaHeadDim: 20,
  convKernel: 4,
  mlaHeads: 5,
  qLoraRank: 40,
  kvLoraRank: 24,
  qkNope: 12,
  qkRope: 6,
  vHeadDim: 28,
  experts: 13,
  topK: 7,
  sharedExperts: 2,
  moeIntermediate: 160,
  latent: 64,
  denseIntermediate: 112,
  groupSize: 32,
};

/** K3's true widths (MODEL.md §2.1) with few layers and experts. */
export const K3: Preset = {
  hidden: 7168,
  layers: 4,
  blockSize: 12,
  kdaHeads: 96,
  kdaHeadDim: 128,
  convKernel: 4,
  mlaHeads: 96,
  qLoraRank: 1536,
  kvLoraRank: 512,
  qkNope: 128,
  qkRope: 64,
  vHeadDim: 128,
  experts: 32,
  topK: 8,
  sharedExperts: 2,
  moeIntermediate: 3072,
  latent: 3584,
  denseIntermediate: 33792,
  groupSize: 32,
};

/** Ranks of the synthetic BPE; the vocabulary adds K3's 256 reserved special ids. */
export const SYNTH_BPE_RANKS = 1024;
/** Layers below this are dense (layer 0 only, as in K3). */
export const FIRST_K_DENSE = 1;
const EXPERT_SHARDS = 3;

/** K3's special-token names by offset from the first special id (MODEL.md §6.1). */
const SPECIAL_NAMES: Readonly<Record<number, string>> = {
  0: "[BOS]",
  1: "[EOS]",
  2: "<|end_of_msg|>",
  3: "<|open|>",
  4: "<|close|>",
  5: "<|sep|>",
  18: "<|media_begin|>",
  19: "<|media_content|>",
  20: "<|media_end|>",
  21: "<|media_pad|>",
  254: "[UNK]",
  255: "[PAD]",
};
const EOS_OFFSET = 2;
const MEDIA_PAD_OFFSET = 21;

// ---------------------------------------------------------------------------------------------
// Shape

/** 1-based default MLA layers: the last two, plus the middle one once there are 6 or more. */
function defaultMlaLayers(layers: number): number[] {
  const set = new Set([layers - 1, layers].filter((l) => l >= 1));
  if (layers >= 6) set.add(Math.floor(layers / 2));
  return [...set].sort((a, b) => a - b);
}

export function requireInt(value: number, field: string, min: number, max = 2 ** 31): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw badInput(`make-tiny: ${field} must be an integer in ${min}..${max}, got ${value}`);
  }
  return value;
}

/** The shape for `options`: the preset with the overrides applied and checked. */
function resolveShape(options: TinyOptions = {}): SynthShape {
  const kind = options.shape ?? "tiny";
  if (kind !== "tiny" && kind !== "k3") {
    throw badInput(`make-tiny: --shape must be "tiny" or "k3", got ${JSON.stringify(kind)}`);
  }
  const preset = kind === "k3" ? K3 : TINY;
  const layers = requireInt(options.layers ?? preset.layers, "--layers", 1, 1000);
  const experts = requireInt(options.experts ?? preset.experts, "--experts", 1, 65536);
  const topK = requireInt(options.topK ?? Math.min(preset.topK, experts), "topK", 1, experts);
  const blockSize = requireInt(options.blockSize ?? preset.blockSize, "blockSize", 1);
  const hidden = requireInt(options.hidden ?? preset.hidden, "hidden", 1);
  const mlaLayers = [...new Set(options.mlaLayers ?? defaultMlaLayers(layers))]
    .map((l) => requireInt(l, "mlaLayers (1-based)", 1, layers))
    .sort((a, b) => a - b);
  return { ...preset, layers, experts, topK, blockSize, hidden, mlaLayers };
}

/** Attention kind of 0-based layer i. */
function isMla(shape: SynthShape, i: number): boolean {
  return shape.mlaLayers.includes(i + 1);
}

/** Width of the attention output (g_proj rows, o_proj columns). */
function attnWidth(shape: SynthShape, i: number): number {
  return isMla(shape, i) ? shape.mlaHeads * shape.vHeadDim : shape.kdaHeads * shape.kdaHeadDim;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

let cachedRanks: Uint8Array[] | undefined;

/** The synthetic BPE vocabulary (trained once per process; deterministic). */
export function synthVocabulary(): Uint8Array[] {
  cachedRanks ??= trainBpe(SYNTH_CORPUS, SYNTH_BPE_RANKS);
  return cachedRanks;
}

/** Vocabulary size: BPE ranks + 256 special ids. */
export const SYNTH_VOCAB_SIZE = SYNTH_BPE_RANKS + NUM_SPECIAL_TOKENS;

/** The names of the 256 special ids, in id order (first = vocabSize - 256). */
function specialTokenNames(vocabSize: number): string[] {
  const first = vocabSize - NUM_SPECIAL_TOKENS;
  return Array.from(
    { length: NUM_SPECIAL_TOKENS },
    (_, k) => SPECIAL_NAMES[k] ?? `<|reserved_token_${first + k}|>`,
  );
}

/** The generation stop id: `<|end_of_msg|>`, as in K3's config.json. */
export function eosTokenId(vocabSize: number): number {
  return vocabSize - NUM_SPECIAL_TOKENS + EOS_OFFSET;
}

/** tokenizer_config.json with `added_tokens_decoder` for all 256 special ids. */
export function tokenizerConfig(vocabSize: number): Record<string, unknown> {
  const first = vocabSize - NUM_SPECIAL_TOKENS;
  const decoder: Record<string, unknown> = {};
  specialTokenNames(vocabSize).forEach((content, k) => {
    decoder[String(first + k)] = {
      content,
      lstrip: false,
      normalized: false,
      rstrip: false,
      single_word: false,
      special: true,
    };
  });
  return {
    added_tokens_decoder: decoder,
    auto_map: { AutoTokenizer: ["tokenization_kimi.TikTokenTokenizer", null] },
    bos_token: SPECIAL_NAMES[0],
    eos_token: SPECIAL_NAMES[1],
    unk_token: SPECIAL_NAMES[254],
    pad_token: SPECIAL_NAMES[255],
    clean_up_tokenization_spaces: false,
    model_max_length: 1048576,
    tokenizer_class: "TikTokenTokenizer",
  };
}

// ---------------------------------------------------------------------------------------------
// Config

/** `quantization_config` as in the released file (MODEL.md §2.3). */
function quantizationConfig(groupSize: number): Record<string, unknown> {
  return {
    quant_method: "compressed-tensors",
    format: "mxfp4-pack-quantized",
    quantization_status: "compressed",
    config_groups: {
      group_0: {
        format: "mxfp4-pack-quantized",
        targets: ["Linear"],
        weights: {
          num_bits: 4,
          type: "float",
          group_size: groupSize,
          strategy: "group",
          symmetric: true,
          scale_dtype: "torch.uint8",
          dynamic: false,
          observer: "minmax",
        },
        input_activations: null,
        output_activations: null,
      },
    },
    ignore: [
      "re:.*self_attn.*",
      "re:.*shared_experts.*",
      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
      "re:.*lm_head.*",
      "re:.*vision_tower.*",
      "re:.*mm_projector.*",
    ],
    kv_cache_scheme: null,
  };
}

/** The text model's config keys (MODEL.md §2.1, §2.2), the body of `text_config`. */
function textConfig(shape: SynthShape, vocabSize: number): Record<string, unknown> {
  const first = vocabSize - NUM_SPECIAL_TOKENS;
  const all = Array.from({ length: shape.layers }, (_, i) => i + 1);
  return {
    model_type: "kimi_linear",
    architectures: ["KimiLinearForCausalLM"],
    dtype: "bfloat16",
    vocab_size: vocabSize,
    hidden_size: shape.hidden,
    num_hidden_layers: shape.layers,
    intermediate_size: shape.denseIntermediate,
    first_k_dense_replace: FIRST_K_DENSE,
    moe_layer_freq: 1,
    hidden_act: "situ",
    activation_situ_beta: 4.0,
    activation_situ_linear_beta: 25.0,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 1048576,
    num_attention_heads: shape.mlaHeads,
    num_key_value_heads: shape.mlaHeads,
    q_lora_rank: shape.qLoraRank,
    kv_lora_rank: shape.kvLoraRank,
    qk_nope_head_dim: shape.qkNope,
    qk_rope_head_dim: shape.qkRope,
    v_head_dim: shape.vHeadDim,
    mla_use_nope: true,
    mla_use_output_gate: true,
    num_experts: shape.experts,
    num_experts_per_token: shape.topK,
    num_shared_experts: shape.sharedExperts,
    moe_intermediate_size: shape.moeIntermediate,
    routed_expert_hidden_size: shape.latent,
    latent_moe_use_norm: true,
    moe_router_activation_func: "sigmoid",
    moe_renormalize: true,
    routed_scaling_factor: 1.0,
    use_grouped_topk: true,
    num_expert_group: 1,
    topk_group: 1,
    topk_method: "noaux_tc",
    attn_res_block_size: shape.blockSize,
    num_nextn_predict_layers: 0,
    tie_word_embeddings: false,
    bos_token_id: first,
    eos_token_id: eosTokenId(vocabSize),
    pad_token_id: first + NUM_SPECIAL_TOKENS - 1,
    quantization_config: quantizationConfig(shape.groupSize),
    linear_attn_config: {
      full_attn_layers: shape.mlaLayers,
      kda_layers: all.filter((l) => !shape.mlaLayers.includes(l)),
      num_heads: shape.kdaHeads,
      head_dim: shape.kdaHeadDim,
      short_conv_kernel_size: shape.convKernel,
      use_full_rank_gate: true,
      gate_lower_bound: -5.0,
    },
  };
}

/** config.json: the multimodal wrapper around text_config, or the flat text-only form. */
export function modelConfig(shape: SynthShape, vocabSize: number, flat: boolean) {
  const text = textConfig(shape, vocabSize);
  if (flat) return text;
  return {
    model_type: "kimi_k3",
    architectures: ["KimiK3ForConditionalGeneration"],
    dtype: "bfloat16",
    tie_word_embeddings: false,
    image_placeholder: "<|kimi_image_placeholder|>",
    media_placeholder_token_id: vocabSize - NUM_SPECIAL_TOKENS + MEDIA_PAD_OFFSET,
    pad_token_id: text.pad_token_id,
    text_config: text,
  };
}

// ---------------------------------------------------------------------------------------------
// Tensor plan

/** How a tensor's bytes are generated. */
export type TensorInit =
  /** Uniform noise with this mean and standard deviation, stored as the tensor's dtype. */
  | { kind: "uniform"; mean: number; std: number }
  /** A_log: ln(U(1, 16)) for the first `used` entries (one per KDA head), zero padding after. */
  | { kind: "aLog"; used: number }
  /** Normal noise N(0, std^2), BF16. */
  | { kind: "normal"; std: number }
  /** MXFP4 codes: uniform random bytes (two uniform E2M1 codes each); groups of `group`. */
  | { kind: "fp4Codes"; group: number }
  /**
   * One half of an MXFP4 matrix quantized from normal weights N(0, std^2) with `cols` columns:
   * its E2M1 codes or its E8M0 scales. Both halves draw the same weights, from the stream of
   * `source` (the matrix's name without its suffix).
   */
  | { kind: "mxfp4Normal"; part: "codes" | "scales"; source: string; std: number; group: number }
  /** E8M0 scales: `exponent` or `exponent - 1`, at random, biased by 127. */
  | { kind: "e8m0"; exponent: number; group: number }
  /** A router's selection bias with a Zipf-like popularity (lib/synth/routing.ts), F32. */
  | { kind: "skewedBias"; strength: number }
  /** Every element `value` (BF16 or F32). */
  | { kind: "const"; value: number }
  /** Never written: a hole of a sparse file, which reads as zeros. */
  | { kind: "hole" };

/** One tensor of the plan: its header entry and how to fill it. */
export interface PlannedTensor {
  name: string;
  dtype: DType;
  shape: number[];
  nbytes: number;
  init: TensorInit;
}

/** One safetensors file of the plan. */
interface PlannedShard {
  file: string;
  tensors: PlannedTensor[];
  /** Sum of the tensors' bytes (the file adds its header). */
  dataBytes: number;
}

/** What `makeTiny` would write, without generating any weights. */
interface CheckpointPlan {
  shape: SynthShape;
  vocabSize: number;
  config: Record<string, unknown>;
  shards: PlannedShard[];
  totalTensorBytes: number;
}

export function tensor(
  name: string,
  dtype: DType,
  shape: number[],
  init: TensorInit,
): PlannedTensor {
  return { name, dtype, shape, nbytes: tensorBytes(dtype, shape), init };
}

/** A BF16 [out, in] projection with std 1/sqrt(in), so outputs keep the input's scale. */
function linear(name: string, out: number, inp: number): PlannedTensor {
  return tensor(name, "BF16", [out, inp], { kind: "uniform", mean: 0, std: 1 / Math.sqrt(inp) });
}

/** A norm gain near 1. */
function gain(name: string, n: number, dtype: DType = "BF16"): PlannedTensor {
  return tensor(name, dtype, [n], { kind: "uniform", mean: 1, std: 0.1 });
}

/** An AttnRes pair: key-norm gain and pseudo-query (scores come out of order 1). */
function attnRes(prefix: string, h: number): PlannedTensor[] {
  return [
    gain(`${prefix}_res_norm.weight`, h),
    tensor(`${prefix}_res_proj.weight`, "BF16", [1, h], {
      kind: "uniform",
      mean: 0,
      std: 1 / Math.sqrt(h),
    }),
  ];
}

function kdaTensors(p: string, s: SynthShape): PlannedTensor[] {
  const dp = s.kdaHeads * s.kdaHeadDim;
  const conv = (n: string) =>
    tensor(`${p}self_attn.${n}_conv1d.weight`, "F32", [dp, 1, s.convKernel], {
      kind: "uniform",
      mean: 0,
      std: 1 / Math.sqrt(s.convKernel),
    });
  return [
    linear(`${p}self_attn.q_proj.weight`, dp, s.hidden),
    linear(`${p}self_attn.k_proj.weight`, dp, s.hidden),
    linear(`${p}self_attn.v_proj.weight`, dp, s.hidden),
    conv("q"),
    conv("k"),
    conv("v"),
    linear(`${p}self_attn.f_a_proj.weight`, s.kdaHeadDim, s.hidden),
    linear(`${p}self_attn.f_b_proj.weight`, dp, s.kdaHeadDim),
    linear(`${p}self_attn.b_proj.weight`, s.kdaHeads, s.hidden),
    // Released as [head_dim] with only the first num_heads used (MODEL.md §3.3).
    tensor(`${p}self_attn.A_log`, "F32", [Math.max(s.kdaHeadDim, s.kdaHeads)], {
      kind: "aLog",
      used: s.kdaHeads,
    }),
    tensor(`${p}self_attn.dt_bias`, "F32", [dp], { kind: "uniform", mean: 0, std: 0.1 }),
    gain(`${p}self_attn.o_norm.weight`, s.kdaHeadDim, "F32"),
  ];
}

function mlaTensors(p: string, s: SynthShape): PlannedTensor[] {
  return [
    linear(`${p}self_attn.q_a_proj.weight`, s.qLoraRank, s.hidden),
    gain(`${p}self_attn.q_a_layernorm.weight`, s.qLoraRank),
    linear(`${p}self_attn.q_b_proj.weight`, s.mlaHeads * (s.qkNope + s.qkRope), s.qLoraRank),
    linear(`${p}self_attn.kv_a_proj_with_mqa.weight`, s.kvLoraRank + s.qkRope, s.hidden),
    gain(`${p}self_attn.kv_a_layernorm.weight`, s.kvLoraRank),
    linear(`${p}self_attn.kv_b_proj.weight`, s.mlaHeads * (s.qkNope + s.vHeadDim), s.kvLoraRank),
  ];
}

function denseTensors(p: string, s: SynthShape): PlannedTensor[] {
  return [
    linear(`${p}mlp.gate_proj.weight`, s.denseIntermediate, s.hidden),
    linear(`${p}mlp.up_proj.weight`, s.denseIntermediate, s.hidden),
    linear(`${p}mlp.down_proj.weight`, s.hidden, s.denseIntermediate),
  ];
}

/** The non-expert LatentMoE tensors (router, latent projections, shared experts). */
function moeTrunkTensors(p: string, s: SynthShape): PlannedTensor[] {
  const m = `${p}block_sparse_moe.`;
  const shared = s.sharedExperts * s.moeIntermediate;
  return [
    linear(`${m}gate.weight`, s.experts, s.hidden),
    tensor(`${m}gate.e_score_correction_bias`, "F32", [s.experts], {
      kind: "uniform",
      mean: 0,
      std: 0.01,
    }),
    linear(`${m}routed_expert_down_proj.weight`, s.latent, s.hidden),
    gain(`${m}routed_expert_norm.weight`, s.latent),
    linear(`${m}routed_expert_up_proj.weight`, s.hidden, s.latent),
    linear(`${m}shared_experts.gate_proj.weight`, shared, s.hidden),
    linear(`${m}shared_experts.up_proj.weight`, shared, s.hidden),
    linear(`${m}shared_experts.down_proj.weight`, s.hidden, shared),
  ];
}

/** An MXFP4 [rows, cols] projection whose values have std about 1/sqrt(cols). */
function mxfp4(name: string, rows: number, cols: number, groupSize: number): PlannedTensor[] {
  // Uniform codes have RMS E2M1_RMS; pick the power of two that brings it to 1/sqrt(cols).
  const exponent = Math.round(-Math.log2(Math.sqrt(cols) * E2M1_RMS));
  return [
    tensor(`${name}.weight_packed`, "U8", [rows, cols / 2], { kind: "fp4Codes", group: groupSize }),
    tensor(`${name}.weight_scale`, "U8", [rows, cols / groupSize], {
      kind: "e8m0",
      exponent,
      group: groupSize,
    }),
  ];
}

/** One routed expert: w1 = gate, w3 = up (latent -> intermediate), w2 = down. */
export function expertTensors(p: string, e: number, s: SynthShape): PlannedTensor[] {
  const x = `${p}block_sparse_moe.experts.${e}.`;
  return [
    ...mxfp4(`${x}w1`, s.moeIntermediate, s.latent, s.groupSize),
    ...mxfp4(`${x}w2`, s.latent, s.moeIntermediate, s.groupSize),
    ...mxfp4(`${x}w3`, s.moeIntermediate, s.latent, s.groupSize),
  ];
}

/** Every non-expert tensor of layer i. */
export function layerTrunkTensors(p: string, i: number, s: SynthShape): PlannedTensor[] {
  const width = attnWidth(s, i);
  return [
    gain(`${p}input_layernorm.weight`, s.hidden),
    gain(`${p}post_attention_layernorm.weight`, s.hidden),
    ...attnRes(`${p}self_attention`, s.hidden),
    ...attnRes(`${p}mlp`, s.hidden),
    linear(`${p}self_attn.g_proj.weight`, width, s.hidden),
    linear(`${p}self_attn.o_proj.weight`, s.hidden, width),
    ...(isMla(s, i) ? mlaTensors(p, s) : kdaTensors(p, s)),
    ...(i < FIRST_K_DENSE ? denseTensors(p, s) : moeTrunkTensors(p, s)),
  ];
}

/** Name prefixes: the released nested layout or a flat text-only one (MODEL.md §3.2). */
export function namePrefixes(flat: boolean): { model: string; head: string } {
  return flat
    ? { model: "model.", head: "lm_head.weight" }
    : { model: "language_model.model.", head: "language_model.lm_head.weight" };
}

/** The embedding (random rows of std 1). */
export function embedTensor(s: SynthShape, vocabSize: number, flat: boolean): PlannedTensor {
  return tensor(`${namePrefixes(flat).model}embed_tokens.weight`, "BF16", [vocabSize, s.hidden], {
    kind: "uniform",
    mean: 0,
    std: 1,
  });
}

/** What follows the last layer: final norm, output AttnRes, lm_head. */
export function headTensors(s: SynthShape, vocabSize: number, flat: boolean): PlannedTensor[] {
  const { model, head } = namePrefixes(flat);
  return [
    gain(`${model}norm.weight`, s.hidden),
    ...attnRes(`${model}output_attn`, s.hidden),
    linear(head, vocabSize, s.hidden),
  ];
}

function trunkTensors(s: SynthShape, vocabSize: number, flat: boolean): PlannedTensor[] {
  const { model } = namePrefixes(flat);
  const layers = Array.from({ length: s.layers }, (_, i) => i);
  return [
    embedTensor(s, vocabSize, flat),
    ...layers.flatMap((i) => layerTrunkTensors(`${model}layers.${i}.`, i, s)),
    ...headTensors(s, vocabSize, flat),
  ];
}

/** Expert tensors split into at most EXPERT_SHARDS groups; one expert never straddles two. */
function expertShardTensors(s: SynthShape, flat: boolean): PlannedTensor[][] {
  const { model } = namePrefixes(flat);
  const units: { layer: number; expert: number }[] = [];
  for (let i = FIRST_K_DENSE; i < s.layers; i++) {
    for (let e = 0; e < s.experts; e++) units.push({ layer: i, expert: e });
  }
  const count = Math.min(EXPERT_SHARDS, units.length);
  const groups: PlannedTensor[][] = Array.from({ length: count }, () => []);
  units.forEach(({ layer, expert }, u) => {
    groups[Math.floor((u * count) / units.length)].push(
      ...expertTensors(`${model}layers.${layer}.`, expert, s),
    );
  });
  return groups;
}

/**
 * Widest dtype first (stable otherwise), as the safetensors serializer does: every tensor then
 * starts at a multiple of its element size, so a zero-copy Float32Array view never faults.
 */
function alignedOrder(tensors: PlannedTensor[]): PlannedTensor[] {
  return [...tensors].sort((a, b) => DTYPE_SIZES[b.dtype] - DTYPE_SIZES[a.dtype]);
}

/** HF shard name, e.g. model-00002-of-00004.safetensors. */
export function shardName(k: number, n: number): string {
  const pad = (x: number) => String(x).padStart(5, "0");
  return `model-${pad(k)}-of-${pad(n)}.safetensors`;
}

export function checkMxfp4Widths(s: SynthShape): void {
  const widths = { latent: s.latent, moe_intermediate: s.moeIntermediate };
  for (const [field, width] of Object.entries(widths)) {
    if (width % s.groupSize !== 0) {
      throw badInput(
        `make-tiny: ${field} ${width} is not a multiple of the MXFP4 group size ${s.groupSize}`,
      );
    }
  }
}

/** The routing option, checked: bad input names the flag and the choices. */
export function checkRouting(routing: Routing | undefined): Routing {
  const r = routing ?? "uniform";
  if (!ROUTINGS.includes(r)) {
    throw badInput(
      `make-tiny: --routing must be ${ROUTINGS.map((x) => `"${x}"`).join(" or ")}, got ` +
        JSON.stringify(routing),
    );
  }
  return r;
}

/** `t`, with a skewed selection bias when it is a router's bias and routing is skewed. */
export function withRouting(t: PlannedTensor, routing: Routing): PlannedTensor {
  if (routing !== "skewed" || !t.name.endsWith("gate.e_score_correction_bias")) return t;
  return { ...t, init: { kind: "skewedBias", strength: SKEWED_STRENGTH } };
}

/** The weights option, checked: bad input names the flag and the choices. */
export function checkWeights(weights: Weights | undefined): Weights {
  const w = weights ?? "uniform";
  if (!WEIGHTS.includes(w)) {
    throw badInput(
      `make-tiny: --weights must be ${WEIGHTS.map((x) => `"${x}"`).join(" or ")}, got ` +
        JSON.stringify(weights),
    );
  }
  return w;
}

/** `t` as drawn under `weights` (see {@link Weights}). */
export function withWeights(t: PlannedTensor, weights: Weights): PlannedTensor {
  if (weights === "uniform") return t;
  const init = t.init;
  if (init.kind === "uniform" && init.mean === 0 && t.dtype === "BF16") {
    return { ...t, init: { kind: "normal", std: init.std } };
  }
  if (init.kind === "fp4Codes" || init.kind === "e8m0") {
    const source = t.name.replace(/\.weight_(packed|scale)$/, "");
    const codes = init.kind === "fp4Codes";
    const cols = codes ? 2 * t.shape[1] : init.group * t.shape[1];
    return {
      ...t,
      init: {
        kind: "mxfp4Normal",
        part: codes ? "codes" : "scales",
        source,
        std: 1 / Math.sqrt(cols),
        group: init.group,
      },
    };
  }
  return t;
}

/**
 * Plans a synthetic checkpoint (config, shard files, every tensor's name, dtype, shape and
 * size) without generating weights: cheap even for `--shape k3`.
 */
export function planCheckpoint(options: TinyOptions = {}): CheckpointPlan {
  const shape = resolveShape(options);
  checkMxfp4Widths(shape);
  const flat = options.flat ?? false;
  const vocabSize = SYNTH_VOCAB_SIZE;
  const routing = checkRouting(options.routing);
  const weights = checkWeights(options.weights);
  const groups = [
    alignedOrder(trunkTensors(shape, vocabSize, flat).map((t) => withRouting(t, routing))),
    ...expertShardTensors(shape, flat),
  ].map((ts) => ts.map((t) => withWeights(t, weights)));
  const shards = groups.map((tensors, k) => ({
    file: shardName(k + 1, groups.length),
    tensors,
    dataBytes: tensors.reduce((n, t) => n + t.nbytes, 0),
  }));
  return {
    shape,
    vocabSize,
    config: modelConfig(shape, vocabSize, flat),
    shards,
    totalTensorBytes: shards.reduce((n, s) => n + s.dataBytes, 0),
  };
}

// ---------------------------------------------------------------------------------------------
// Generation

/** Bytes generated per step: large enough to amortise a write, small enough to stay cheap. */
const CHUNK_BYTES = 8 << 20;

/** Groups quantized per step: bounds the scratch of normal values (here 2 MB). */
const MXFP4_BATCH_GROUPS = 16384;

/**
 * Fills `out`, the next bytes of one half of an MXFP4 matrix quantized from normal weights:
 * codes (two values a byte) or scales (one group a byte), drawn in stream order, so both
 * halves see the same weights whatever their chunks (a chunk of codes is whole groups).
 */
function fillMxfp4Normal(
  init: Extract<TensorInit, { kind: "mxfp4Normal" }>,
  rng: XorShift128,
  out: Uint8Array,
): void {
  const perByte = init.part === "codes" ? 2 : init.group;
  const values = new Float32Array(MXFP4_BATCH_GROUPS * init.group);
  const bytesPerBatch = values.length / perByte;
  for (let at = 0; at < out.length; at += bytesPerBatch) {
    const n = Math.min(bytesPerBatch, out.length - at);
    const batch = values.subarray(0, n * perByte);
    fillNormal(rng, batch, init.std);
    const dst = out.subarray(at, at + n);
    encodeMxfp4Groups(
      batch,
      init.group,
      init.part === "codes" ? dst : null,
      init.part === "scales" ? dst : null,
    );
  }
}

/** Fills `out` (the next piece of a tensor, element-aligned) from the tensor's stream. */
function fillChunk(
  t: PlannedTensor,
  rng: XorShift128,
  out: Uint8Array,
  firstElement: number,
): void {
  const init = t.init;
  if (init.kind === "fp4Codes") return fillRandomBytes(rng, out);
  if (init.kind === "mxfp4Normal") return fillMxfp4Normal(init, rng, out);
  if (init.kind === "normal") {
    if (t.dtype !== "BF16") throw new Error(`make-tiny: ${t.name}: normal weights are BF16`);
    return fillBf16Normal(
      rng,
      new Uint16Array(out.buffer, out.byteOffset, out.length / 2),
      init.std,
    );
  }
  if (init.kind === "e8m0") {
    fillRandomBytes(rng, out);
    for (let i = 0; i < out.length; i++) out[i] = E8M0_BIAS + init.exponent - (out[i] & 1);
    return;
  }
  if (init.kind === "hole") throw new Error(`make-tiny: ${t.name} is a hole and has no bytes`);
  if (init.kind === "skewedBias") {
    // The profile is a permutation of the whole tensor: it must come in one piece.
    if (t.dtype !== "F32" || firstElement !== 0 || out.length !== t.nbytes) {
      throw new Error(`make-tiny: ${t.name}: a skewed bias is one F32 tensor in one chunk`);
    }
    return fillSkewedBias(
      rng,
      new Float32Array(out.buffer, out.byteOffset, out.length / 4),
      init.strength,
    );
  }
  if (init.kind === "const") {
    if (t.dtype === "BF16") {
      new Uint16Array(out.buffer, out.byteOffset, out.length / 2).fill(f32ToBf16(init.value));
    } else if (t.dtype === "F32") {
      new Float32Array(out.buffer, out.byteOffset, out.length / 4).fill(init.value);
    } else throw new Error(`make-tiny: no constant fill for ${t.name} (${t.dtype})`);
    return;
  }
  if (init.kind === "aLog") {
    const f32 = new Float32Array(out.buffer, out.byteOffset, out.length / 4);
    for (let i = 0; i < f32.length; i++) {
      f32[i] = firstElement + i < init.used ? Math.log(1 + 15 * rng.nextUnit()) : 0;
    }
    return;
  }
  if (t.dtype === "BF16") {
    const bf16 = new Uint16Array(out.buffer, out.byteOffset, out.length / 2);
    return fillBf16Uniform(rng, bf16, init.mean, init.std);
  }
  if (t.dtype === "F32") {
    const f32 = new Float32Array(out.buffer, out.byteOffset, out.length / 4);
    return fillF32Uniform(rng, f32, init.mean, init.std);
  }
  throw new Error(`make-tiny: no generator for ${t.name} (${t.dtype}, ${init.kind})`);
}

/** Yields a tensor's bytes chunk by chunk (views into `buffer`, valid until the next). */
export function* tensorChunks(
  t: PlannedTensor,
  seed: number,
  buffer: Uint8Array,
): Generator<Uint8Array> {
  // Keyed without the `language_model.` prefix: flat and nested checkpoints get equal weights.
  // The two halves of an MXFP4 matrix drawn from normal weights share their matrix's stream.
  const key = t.init.kind === "mxfp4Normal" ? t.init.source : t.name;
  const rng = streamRng(seed, key.replace(/^language_model\./, ""));
  const elementSize = DTYPE_SIZES[t.dtype];
  for (let done = 0; done < t.nbytes; done += buffer.length) {
    const out = buffer.subarray(0, Math.min(buffer.length, t.nbytes - done));
    fillChunk(t, rng, out, done / elementSize);
    yield out;
  }
}

// ---------------------------------------------------------------------------------------------
// Files

export async function writeTextAtomically(file: string, text: string): Promise<number> {
  const bytes = new TextEncoder().encode(text);
  await writeAtomically(file, (out) => writeAll(out, bytes));
  return bytes.length;
}

export function jsonText(value: unknown): string {
  return JSON.stringify(value, null, 2) + "\n";
}

/** Streams one shard: header, then every tensor generated chunk by chunk. Returns its size. */
async function writeShard(
  file: string,
  shard: PlannedShard,
  seed: number,
  buffer: Uint8Array,
): Promise<number> {
  const { header } = buildHeader(shard.tensors, { format: "pt" });
  await writeAtomically(file, async (out) => {
    await writeAll(out, header);
    for (const t of shard.tensors) {
      for (const chunk of tensorChunks(t, seed, buffer)) await writeAll(out, chunk);
    }
  });
  return header.length + shard.dataBytes;
}

/** model.safetensors.index.json: total size and the shard of every tensor. */
function shardIndex(plan: CheckpointPlan): Record<string, unknown> {
  const weightMap: Record<string, string> = {};
  for (const shard of plan.shards) {
    for (const t of shard.tensors) weightMap[t.name] = shard.file;
  }
  return { metadata: { total_size: plan.totalTensorBytes }, weight_map: weightMap };
}

/** Refuses a directory holding safetensors files other than `shardFiles` (names). */
async function checkNoForeignShards(dir: string, shardFiles: string[]): Promise<void> {
  const ours = new Set(shardFiles);
  const foreign: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (entry.name.endsWith(".safetensors") && !ours.has(entry.name)) foreign.push(entry.name);
  }
  if (foreign.length > 0) {
    throw badInput(
      `make-tiny: ${dir} already holds other safetensors files (${foreign.sort().join(", ")}); ` +
        `a loader would mix them in. Choose an empty directory or remove them.`,
    );
  }
}

/** Creates `dir` if needed; refuses one holding safetensors files other than `shardFiles`. */
export async function prepareDirectory(dir: string, shardFiles: string[]): Promise<void> {
  try {
    await Deno.mkdir(dir, { recursive: true });
  } catch (e) {
    throw badInput(`make-tiny: cannot create directory ${dir} (${(e as Error).message})`, {
      cause: e,
    });
  }
  await checkNoForeignShards(dir, shardFiles);
}

/**
 * Writes a random-weight checkpoint in the released K3 layout to `dir`.
 * @returns the path of config.json and the number of bytes written over all files
 * @throws K3Error (bad input) for invalid options or a directory with foreign shards
 */
export async function makeTiny(
  dir: string,
  options: TinyOptions = {},
): Promise<{ configPath: string; bytes: number }> {
  const seed = requireInt(options.seed ?? 0, "--seed", 0, 2 ** 32 - 1);
  const plan = planCheckpoint(options);
  await prepareDirectory(dir, plan.shards.map((s) => s.file));
  const eos = eosTokenId(plan.vocabSize);
  const configPath = path.join(dir, "config.json");
  let bytes = 0;
  bytes += await writeTextAtomically(
    path.join(dir, "tiktoken.model"),
    formatTiktokenRanks(synthVocabulary()),
  );
  bytes += await writeTextAtomically(
    path.join(dir, "tokenizer_config.json"),
    jsonText(tokenizerConfig(plan.vocabSize)),
  );
  bytes += await writeTextAtomically(
    path.join(dir, "generation_config.json"),
    jsonText({ max_length: 1048576, eos_token_id: eos }),
  );
  const buffer = new Uint8Array(CHUNK_BYTES); // reused by every tensor
  for (const shard of plan.shards) {
    bytes += await writeShard(path.join(dir, shard.file), shard, seed, buffer);
  }
  bytes += await writeTextAtomically(
    path.join(dir, "model.safetensors.index.json"),
    jsonText(shardIndex(plan)),
  );
  // config.json last: its presence marks a complete checkpoint.
  bytes += await writeTextAtomically(configPath, jsonText(plan.config));
  return { configPath, bytes };
}
