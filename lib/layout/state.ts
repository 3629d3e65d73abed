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
 * Scratch buffers that share room: a layer is either KDA or MLA, and its FFN either dense or
 * MoE, so the buffers of one kind are never live next to the other kind's. Each inner list
 * is one kind; the room is as wide as its widest kind.
 */
export const SHARED_SCRATCH: string[][][] = [
  [
    ["kda.raw", "kda.q", "kda.k", "kda.v", "kda.fa", "kda.alpha", "kda.beta", "kda.o"],
    ["mla.cq", "mla.q", "mla.rows", "mla.o", "mla.g"],
  ],
  [
    ["dense.g", "dense.u", "dense.out"],
    [
      "moe.logits",
      "moe.weights",
      "moe.y",
      "moe.z",
      "moe.acc",
      "moe.routed",
      "shared.g",
      "shared.u",
      "shared.out",
    ],
  ],
];

/**
 * Scratch buffers sized by the chunk instead of by the pass: MLA's absorbed queries and
 * latent outputs (computed a chunk at a time against the cache) and one routed expert's
 * inputs and outputs (an expert runs on its tokens a chunk at a time).
 */
export const CHUNK_SCRATCH = ["mla.qabs", "mla.olat", "exp.z", "exp.g", "exp.u", "exp.out"];

/**
 * Floats per token of a pass's scratch: `wide` for every token of the pass (the hidden
 * states and AttnRes bank a layer-major pass carries from layer to layer, and each layer's
 * activations, which every piece of the layer's weights is applied to), `chunk` for the
 * tokens of one chunk.
 */
export function passScratchFloats(c: K3Config, layers: number): { wide: number; chunk: number } {
  const f = scratchFloats(c, layers);
  const shared = new Set(SHARED_SCRATCH.flat(2));
  let wide = 0, chunk = 0;
  for (const [name, n] of Object.entries(f)) {
    if (CHUNK_SCRATCH.includes(name)) chunk += n;
    else if (!shared.has(name)) wide += n;
  }
  for (const kinds of SHARED_SCRATCH) {
    wide += Math.max(...kinds.map((k) => k.reduce((a, name) => a + f[name], 0)));
  }
  return { wide, chunk };
}

/**
 * Bytes of the scratch of a layer-major pass over at most `T` tokens computed `chunk` at a
 * time, plus two logits rows (the one being computed and the one the state keeps).
 */
export function passScratchBytes(c: K3Config, layers: number, T: number, chunk: number): number {
  const f = passScratchFloats(c, layers);
  return 4 * (T * f.wide + Math.min(T, chunk) * f.chunk + 2 * c.vocabSize);
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
