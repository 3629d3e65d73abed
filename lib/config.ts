/**
 * config.json -> K3Config. Nested (`text_config`, `linear_attn_config`,
 * `quantization_config`) and flat shapes. Every shape key is required; a missing key is
 * never replaced by a default (SPEC project decisions 2 and 8).
 */

/** KDA (linear attention) settings from `linear_attn_config`. */
export interface KdaConfig {
  numHeads: number;
  headDim: number;
  convKernel: number; // short_conv_kernel_size
  gateLowerBound: number; // gate_lower_bound, -5 <= lb < 0
  useFullRankGate: boolean;
}

/** Everything the engine reads from config.json, in engine units. */
export interface K3Config {
  /** Path of the config.json this came from. */
  source: string;
  layout: "nested" | "flat";
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  /** Dense MLP width (layers below firstKDenseReplace). */
  intermediateSize: number;
  firstKDenseReplace: number;
  moeLayerFreq: number;
  rmsNormEps: number;
  situBeta: number; // activation_situ_beta (gate cap)
  situLinearBeta: number; // activation_situ_linear_beta (up cap)
  // MLA
  numHeads: number;
  numKvHeads: number;
  qLoraRank: number;
  kvLoraRank: number;
  qkNopeHeadDim: number;
  qkRopeHeadDim: number;
  vHeadDim: number;
  // MoE
  numExperts: number;
  topK: number;
  numSharedExperts: number;
  moeIntermediateSize: number;
  /** routed_expert_hidden_size: the latent width the experts run in. */
  latentSize: number;
  latentMoeUseNorm: boolean;
  moeRenormalize: boolean;
  routedScalingFactor: number;
  // AttnRes
  attnResBlockSize: number;
  // KDA
  kda: KdaConfig;
  /** 1-based lists as in the file. */
  kdaLayers: number[];
  fullAttnLayers: number[];
  /** 0-based per-layer attention kind, derived from the lists. */
  layerKinds: ("kda" | "mla")[];
  /** MXFP4 group size from quantization_config. */
  quantGroupSize: number;
  /** Generation stop ids from eos_token_id (a number or a list), possibly empty. */
  eosTokenIds: number[];
  /** Behavioural defaults that were applied because their key was absent (named). */
  defaultsApplied: string[];
}

/** True when layer i (0-based) uses a dense MLP rather than LatentMoE. */
export function isDenseLayer(c: K3Config, i: number): boolean {
  return !(i >= c.firstKDenseReplace && i % c.moeLayerFreq === 0);
}
