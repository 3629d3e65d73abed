/**
 * config.json for the float64 reference, read independently of lib/checkpoint/config.ts
 * (MODEL.md §2.1, §1.2): shape and schedule keys are required, all missing ones named at once;
 * only the behavioural flags with a universal reference default may be absent.
 */

import { readFileSync } from "node:fs";
import { join } from "node:path";

/** The model's sizes and constants, as the reference uses them. */
export interface RefConfig {
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  intermediateSize: number;
  firstKDenseReplace: number;
  moeLayerFreq: number;
  rmsNormEps: number;
  situBeta: number;
  situLinearBeta: number;
  mlaHeads: number;
  qLoraRank: number;
  kvLoraRank: number;
  qkNopeHeadDim: number;
  qkRopeHeadDim: number;
  vHeadDim: number;
  mlaUseOutputGate: boolean;
  numExperts: number;
  topK: number;
  numSharedExperts: number;
  moeIntermediateSize: number;
  latentSize: number;
  latentMoeUseNorm: boolean;
  moeRenormalize: boolean;
  routedScalingFactor: number;
  attnResBlockSize: number;
  kdaHeads: number;
  kdaHeadDim: number;
  convKernel: number;
  gateLowerBound: number;
  /** 0-based attention kind per layer, from the 1-based lists. */
  layerKinds: ("kda" | "mla")[];
  /** MXFP4 group size; 0 when no layer is MoE (then nothing needs it). */
  mxfp4GroupSize: number;
}

/** Read and validate `<dir>/config.json`, nested (`text_config`) or flat. */
export function readRefConfig(dir: string): RefConfig {
  const path = join(dir, "config.json");
  const root = JSON.parse(readFileSync(path, "utf8"));
  const text = typeof root.text_config === "object" && root.text_config !== null
    ? root.text_config
    : root;
  const linear = text.linear_attn_config ?? {};
  const missing: string[] = [];
  const need = (obj: any, key: string, where: string): any => {
    if (obj[key] === undefined || obj[key] === null) missing.push(where + key);
    return obj[key];
  };
  const t = (key: string) => need(text, key, "");
  const l = (key: string) => need(linear, key, "linear_attn_config.");
  const numExperts = text.num_experts ?? text.n_routed_experts;
  if (numExperts === undefined) missing.push("num_experts");
  const config = {
    vocabSize: t("vocab_size"),
    hiddenSize: t("hidden_size"),
    numLayers: t("num_hidden_layers"),
    intermediateSize: t("intermediate_size"),
    firstKDenseReplace: t("first_k_dense_replace"),
    moeLayerFreq: t("moe_layer_freq"),
    rmsNormEps: t("rms_norm_eps"),
    situBeta: t("activation_situ_beta"),
    situLinearBeta: t("activation_situ_linear_beta"),
    mlaHeads: t("num_attention_heads"),
    qLoraRank: t("q_lora_rank"),
    kvLoraRank: t("kv_lora_rank"),
    qkNopeHeadDim: t("qk_nope_head_dim"),
    qkRopeHeadDim: t("qk_rope_head_dim"),
    vHeadDim: t("v_head_dim"),
    mlaUseOutputGate: text.mla_use_output_gate ?? true,
    numExperts,
    topK: t("num_experts_per_token"),
    numSharedExperts: t("num_shared_experts"),
    moeIntermediateSize: t("moe_intermediate_size"),
    latentSize: t("routed_expert_hidden_size"),
    latentMoeUseNorm: text.latent_moe_use_norm ?? true,
    moeRenormalize: text.moe_renormalize ?? true,
    routedScalingFactor: text.routed_scaling_factor ?? 1.0,
    attnResBlockSize: t("attn_res_block_size"),
    kdaHeads: l("num_heads"),
    kdaHeadDim: l("head_dim"),
    convKernel: l("short_conv_kernel_size"),
    gateLowerBound: l("gate_lower_bound"),
    layerKinds: [] as ("kda" | "mla")[],
    mxfp4GroupSize: 0,
  };
  const kdaLayers: number[] = l("kda_layers");
  const fullAttnLayers: number[] = l("full_attn_layers");
  if (missing.length > 0) {
    throw new Error(`${path}: missing required keys: ${missing.join(", ")}; add them to the file`);
  }
  checkBehaviour(path, text);
  config.layerKinds = layerKinds(path, config.numLayers, kdaLayers, fullAttnLayers);
  if (usesMoe(config)) config.mxfp4GroupSize = mxfp4GroupSize(path, text, root);
  return config;
}

/** True when some layer is a LatentMoE layer (MODEL.md §2.2 moe_layer_freq rule). */
export function isMoeLayer(c: RefConfig, i: number): boolean {
  return i >= c.firstKDenseReplace && i % c.moeLayerFreq === 0;
}

function usesMoe(c: RefConfig): boolean {
  return c.layerKinds.some((_, i) => isMoeLayer(c, i));
}

/** Flags the reference implements only in their K3 setting. */
function checkBehaviour(path: string, text: any): void {
  const refuse = (what: string) => {
    throw new Error(`${path}: ${what} is not supported by the reference (K3 uses the default)`);
  };
  if (text.mla_use_nope === false) refuse("mla_use_nope: false");
  const activation = text.moe_router_activation_func;
  if (activation !== undefined && activation !== "sigmoid") {
    refuse(`moe_router_activation_func ${activation}`);
  }
  if ((text.num_expert_group ?? 1) !== 1) refuse(`num_expert_group ${text.num_expert_group}`);
}

/** 0-based kinds from the 1-based lists, which must be disjoint and cover 1..numLayers. */
function layerKinds(
  path: string,
  numLayers: number,
  kdaLayers: number[],
  fullAttnLayers: number[],
): ("kda" | "mla")[] {
  const kinds: ("kda" | "mla")[] = [];
  for (let i = 0; i < numLayers; i++) {
    const kda = kdaLayers.includes(i + 1);
    const mla = fullAttnLayers.includes(i + 1);
    if (kda === mla) {
      throw new Error(
        `${path}: layer ${i + 1} (1-based) is in ${
          kda ? "both" : "neither"
        } of linear_attn_config.kda_layers and full_attn_layers; each layer must be in exactly one`,
      );
    }
    kinds.push(kda ? "kda" : "mla");
  }
  return kinds;
}

/** quantization_config.config_groups.*.weights.group_size, from text_config or the top level. */
function mxfp4GroupSize(path: string, text: any, root: any): number {
  const quant = text.quantization_config ?? root.quantization_config;
  const groups = Object.values(quant?.config_groups ?? {}) as any[];
  const size = groups[0]?.weights?.group_size;
  if (typeof size !== "number" || size <= 0) {
    throw new Error(
      `${path}: quantization_config.config_groups.*.weights.group_size is missing; ` +
        "the MXFP4 experts cannot be decoded without it",
    );
  }
  return size;
}
