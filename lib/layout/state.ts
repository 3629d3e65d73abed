/**
 * Sizes of the per-sequence state and of a forward call's scratch, from the config alone.
 * The planner adds them up before anything is allocated; the model allocates exactly
 * these (lib/model/state.ts, lib/model/forward.ts). All fp32 (MODEL.md §4.10).
 */
import type { K3Config } from "../checkpoint/config.ts";

/** Width of one MLA latent cache row: the normalised latent, then k_pe. */
export function mlaRowWidth(c: K3Config): number {
  return c.kvLoraRank + c.qkRopeHeadDim;
}

/** Channels of a KDA layer's q, k and v (heads x head_dim). */
function kdaChannels(c: K3Config): number {
  return c.kda.numHeads * c.kda.headDim;
}

/** Floats of one KDA recurrent state: [heads][dim][dim]. */
export function kdaRecurrentFloats(c: K3Config): number {
  return c.kda.numHeads * c.kda.headDim * c.kda.headDim;
}

/** Floats of one conv history (q, k or v): [K-1][C] pre-conv inputs. */
export function kdaHistoryFloats(c: K3Config): number {
  return (c.kda.convKernel - 1) * kdaChannels(c);
}

/** Bytes of one KDA layer's state: the recurrent state and three conv histories. */
function kdaStateBytes(c: K3Config): number {
  return 4 * (kdaRecurrentFloats(c) + 3 * kdaHistoryFloats(c));
}

/** Bytes of the KDA states of the first `layers` layers. */
export function kdaBytes(c: K3Config, layers: number): number {
  return c.layerKinds.slice(0, layers).filter((k) => k === "kda").length * kdaStateBytes(c);
}

/** Bytes of one position of the MLA latent cache, over the first `layers` layers. */
export function mlaPositionBytes(c: K3Config, layers: number): number {
  const mla = c.layerKinds.slice(0, layers).filter((k) => k === "mla").length;
  return mla * 4 * mlaRowWidth(c);
}

/** Bytes of the MLA latent cache of the first `layers` layers for `positions` positions. */
export function mlaBytes(c: K3Config, layers: number, positions: number): number {
  return positions * mlaPositionBytes(c, layers);
}

/** Sequence state for `positions` positions: KDA states plus the MLA latent cache. */
export function stateBytes(c: K3Config, layers: number, positions: number): number {
  return kdaBytes(c, layers) + mlaBytes(c, layers, positions);
}

/** Rows of the AttnRes snapshot bank for `layers` layers. */
export function bankRows(c: K3Config, layers: number): number {
  return Math.ceil(layers / c.attnResBlockSize);
}

/**
 * Floats per token of each scratch buffer of a forward call (lib/model/forward.ts asks for
 * exactly these names). Buffers of the attention kinds and of the FFN kinds are separate;
 * a model without a kind never allocates its buffers, but the plan counts them all.
 */
export function scratchFloats(c: K3Config, layers: number): Record<string, number> {
  const H = c.hiddenSize, C = kdaChannels(c), d = c.kda.headDim;
  const nh = c.numHeads, w = mlaRowWidth(c), L = c.latentSize, k = c.topK;
  const Is = c.numSharedExperts * c.moeIntermediateSize, I = c.moeIntermediateSize;
  return {
    bank: bankRows(c, layers) * H,
    p: H,
    h: H,
    last: H,
    xn: H,
    "attn.out": H,
    "kda.raw": C,
    "kda.q": C,
    "kda.k": C,
    "kda.v": C,
    "kda.fa": d,
    "kda.alpha": C,
    "kda.beta": c.kda.numHeads,
    "kda.o": C,
    "mla.cq": c.qLoraRank,
    "mla.q": nh * (c.qkNopeHeadDim + c.qkRopeHeadDim),
    "mla.qabs": nh * w,
    "mla.olat": nh * c.kvLoraRank,
    "mla.o": nh * c.vHeadDim,
    "mla.g": nh * c.vHeadDim,
    // New latent rows of every sequence of the pass, before they go to each one's cache.
    "mla.rows": w,
    "dense.g": c.intermediateSize,
    "dense.u": c.intermediateSize,
    "dense.out": H,
    "moe.logits": c.numExperts,
    "moe.weights": k,
    "moe.y": k * L,
    "moe.z": L,
    "moe.acc": L,
    "moe.routed": H,
    "shared.g": Is,
    "shared.u": Is,
    "shared.out": H,
    // One expert runs on at most every token of the call.
    "exp.z": L,
    "exp.g": I,
    "exp.u": I,
    "exp.out": L,
    // The token's embedding row as stored (BF16), read for each forward call.
    "embed.rows": H / 2,
  };
}

/**
 * Bytes of the scratch of a forward call over at most `T` tokens, plus two logits rows (the
 * one being computed and the one the state keeps).
 */
export function scratchBytes(c: K3Config, layers: number, T: number): number {
  const perToken = Object.values(scratchFloats(c, layers)).reduce((a, b) => a + b, 0);
  return 4 * (T * perToken + 2 * c.vocabSize);
}

/** Floats a verify pass keeps per KDA layer and position for an exact rewind (model/rewind.ts). */
export function kdaRecordFloats(c: K3Config): number {
  return 6 * kdaChannels(c) + c.kda.numHeads;
}

/**
 * Bytes of a verify pass over `positions` positions of the first `layers` layers: the kept
 * inputs of every KDA layer, plus one layer's S and conv history as the pass's scratch.
 */
export function passRecordBytes(c: K3Config, layers: number, positions: number): number {
  const kdaLayers = c.layerKinds.slice(0, layers).filter((k) => k === "kda").length;
  const scratch = kdaRecurrentFloats(c) + kdaHistoryFloats(c);
  return 4 * (kdaLayers * positions * kdaRecordFloats(c) + scratch);
}
