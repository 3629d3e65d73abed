/**
 * What the checkpoint reader hands to the engine: every tensor the model needs, bound by
 * name, with its exact shape and dtype already checked. Offsets are absolute byte offsets
 * inside `file` (safetensors header already skipped).
 */

/** safetensors dtypes this project knows. */
export type DType =
  | "BOOL"
  | "U8"
  | "I8"
  | "I16"
  | "U16"
  | "I32"
  | "U32"
  | "I64"
  | "U64"
  | "F16"
  | "BF16"
  | "F32"
  | "F64"
  | "F8_E4M3"
  | "F8_E5M2";

/** One tensor's place on disk. */
export interface TensorRef {
  name: string;
  file: string;
  dtype: DType;
  shape: number[];
  /** Absolute byte offset in `file`. */
  offset: number;
  nbytes: number;
}

/** An MXFP4 linear [rows, cols]: packed nibbles [rows, cols/2] U8 + E8M0 scales U8. */
interface Mxfp4Ref {
  packed: TensorRef;
  scale: TensorRef;
  rows: number;
  cols: number;
}

/** One routed expert: w1 = gate, w3 = up (latent -> moe_intermediate), w2 = down. */
export interface ExpertRefs {
  w1: Mxfp4Ref;
  w2: Mxfp4Ref;
  w3: Mxfp4Ref;
}

/** An AttnRes aggregation: `*_res_norm.weight` [H] and `*_res_proj.weight` [1, H]. */
export interface AttnResRefs {
  norm: TensorRef;
  proj: TensorRef;
}

export interface KdaRefs {
  q: TensorRef;
  k: TensorRef;
  v: TensorRef;
  qConv: TensorRef;
  kConv: TensorRef;
  vConv: TensorRef;
  fA: TensorRef;
  fB: TensorRef;
  b: TensorRef;
  aLog: TensorRef;
  dtBias: TensorRef;
  oNorm: TensorRef;
}

export interface MlaRefs {
  qA: TensorRef;
  qANorm: TensorRef;
  qB: TensorRef;
  kvA: TensorRef;
  kvANorm: TensorRef;
  kvB: TensorRef;
}

export interface DenseMlpRefs {
  gate: TensorRef;
  up: TensorRef;
  down: TensorRef;
}

export interface MoeRefs {
  router: TensorRef;
  routerBias: TensorRef;
  latentDown: TensorRef;
  latentNorm: TensorRef;
  latentUp: TensorRef;
  sharedGate: TensorRef;
  sharedUp: TensorRef;
  sharedDown: TensorRef;
  /** The routed experts, by id; refs are made on demand (do not keep many). */
  experts: ExpertTable;
}

/**
 * A layer's routed experts. At full size a checkpoint has 82,432 of them (494,592 tensors), so
 * they live in a compact table and `get` builds one expert's refs when asked; callers use the
 * result and let it go rather than collecting them.
 */
export interface ExpertTable {
  /** Number of routed experts (ids 0..count-1). */
  readonly count: number;
  /** Expert `e`'s refs. @throws RangeError when e is not an id in 0..count-1 */
  get(e: number): ExpertRefs;
}

export interface LayerRefs {
  index: number;
  kind: "kda" | "mla";
  inputNorm: TensorRef;
  postAttnNorm: TensorRef;
  attnRes: AttnResRefs;
  mlpRes: AttnResRefs;
  gProj: TensorRef;
  oProj: TensorRef;
  kda?: KdaRefs;
  mla?: MlaRefs;
  dense?: DenseMlpRefs;
  moe?: MoeRefs;
}

export interface ModelRefs {
  embed: TensorRef;
  norm: TensorRef;
  outputRes: AttnResRefs;
  lmHead: TensorRef;
  layers: LayerRefs[];
}
