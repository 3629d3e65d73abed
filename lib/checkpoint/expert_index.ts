/**
 * The routed experts of a checkpoint in compact typed-array tables: 494,592 tensors for K3
 * (92 MoE layers x 896 experts x 6), at 27 bytes each instead of a JS object each. A slot is
 * one tensor: (MoE layer, expert, kind), kind 0..5 = w1, w2, w3 x (weight_packed,
 * weight_scale). Names are not stored: a slot's name is rebuilt from its numbers and the
 * prefix it was stored under. Refs ({@link TensorRef}) are made on demand.
 */

import { DTYPE_SIZES } from "./safetensors.ts";
import type { DType, TensorRef } from "./types.ts";

/** The six tensors of an expert, in slot order. */
export const EXPERT_KINDS = [
  "w1.weight_packed",
  "w1.weight_scale",
  "w2.weight_packed",
  "w2.weight_scale",
  "w3.weight_packed",
  "w3.weight_scale",
] as const;

/** Stored prefixes before `layers.` (MODEL.md §3.2), by prefix id. */
const LAYER_PREFIXES = ["language_model.model.", "language_model.", "model."] as const;

const DTYPES = Object.keys(DTYPE_SIZES) as DType[];
const DTYPE_CODE = new Map(DTYPES.map((d, i) => [d, i]));

/** Not present. */
const NONE = -1;

export class ExpertIndex {
  /** MoE row of each decoder layer, or -1 for a dense layer. */
  readonly #row: Int32Array;
  readonly experts: number;
  /** Number of slots: MoE layers x experts x 6. */
  readonly size: number;
  /** Shard (index into the shard list) holding the slot's tensor, or -1. */
  file = new Int16Array(0);
  offset = new Float64Array(0);
  dtype = new Uint8Array(0);
  prefix = new Uint8Array(0);
  #dim0 = new Uint32Array(0);
  #dim1 = new Uint32Array(0);
  /** Shapes that are not 2-D of 32-bit dims (never in a good checkpoint): slot -> shape. */
  readonly #oddShapes = new Map<number, number[]>();
  /** Slots filled. */
  count = 0;

  /**
   * Slot numbering only; call {@link allocate} before storing anything.
   * @param moeLayers for each decoder layer, whether it is a MoE layer
   * @param experts routed experts per MoE layer
   */
  constructor(moeLayers: boolean[], experts: number) {
    this.#row = new Int32Array(moeLayers.length).fill(-1);
    let rows = 0;
    moeLayers.forEach((moe, i) => {
      if (moe) this.#row[i] = rows++;
    });
    this.experts = experts;
    this.size = rows * experts * EXPERT_KINDS.length;
  }

  /** Allocates the tables (about 27 bytes a slot): only once the size is known to be sane. */
  allocate(): void {
    this.file = new Int16Array(this.size).fill(NONE);
    this.offset = new Float64Array(this.size);
    this.dtype = new Uint8Array(this.size);
    this.prefix = new Uint8Array(this.size);
    this.#dim0 = new Uint32Array(this.size);
    this.#dim1 = new Uint32Array(this.size);
  }

  /** Slot of (layer, expert, kind), or -1 when the layer is dense or out of range. */
  slot(layer: number, expert: number, kind: number): number {
    const row = layer < this.#row.length ? this.#row[layer] : -1;
    if (row < 0 || expert >= this.experts) return -1;
    return (row * this.experts + expert) * EXPERT_KINDS.length + kind;
  }

  /** Records the tensor of `slot`. `offset` is absolute in the shard. */
  set(slot: number, file: number, prefix: number, dtype: DType, shape: number[], offset: number) {
    this.file[slot] = file;
    this.prefix[slot] = prefix;
    this.dtype[slot] = DTYPE_CODE.get(dtype)!;
    this.offset[slot] = offset;
    if (shape.length === 2 && shape[0] < 2 ** 32 && shape[1] < 2 ** 32) {
      this.#dim0[slot] = shape[0];
      this.#dim1[slot] = shape[1];
    } else {
      this.#oddShapes.set(slot, shape.slice());
    }
    this.count++;
  }

  has(slot: number): boolean {
    return this.file[slot] !== NONE;
  }

  dtypeOf(slot: number): DType {
    return DTYPES[this.dtype[slot]];
  }

  /** True when the slot's tensor has exactly this dtype and 2-D shape. */
  matches(slot: number, dtype: DType, rows: number, cols: number): boolean {
    return this.dtype[slot] === DTYPE_CODE.get(dtype) && !this.#oddShapes.has(slot) &&
      this.#dim0[slot] === rows && this.#dim1[slot] === cols;
  }

  shapeOf(slot: number): number[] {
    return this.#oddShapes.get(slot) ?? [this.#dim0[slot], this.#dim1[slot]];
  }

  /** The canonical name of (layer, expert, kind), e.g. model.layers.1.block_sparse_moe... */
  static canonicalName(layer: number, expert: number, kind: number): string {
    return `model.layers.${layer}.block_sparse_moe.experts.${expert}.${EXPERT_KINDS[kind]}`;
  }

  /** The name the tensor of a filled slot is stored under. */
  storedName(layer: number, expert: number, kind: number, slot: number): string {
    return LAYER_PREFIXES[this.prefix[slot]] +
      ExpertIndex.canonicalName(layer, expert, kind).slice("model.".length);
  }

  /** The ref of a filled slot. */
  ref(layer: number, expert: number, kind: number, shards: readonly string[]): TensorRef {
    const slot = this.slot(layer, expert, kind);
    const dtype = this.dtypeOf(slot);
    const shape = this.shapeOf(slot);
    return {
      name: this.storedName(layer, expert, kind, slot),
      file: shards[this.file[slot]],
      dtype,
      shape,
      offset: this.offset[slot],
      nbytes: shape.reduce((n, d) => n * d, DTYPE_SIZES[dtype]),
    };
  }
}

/** Where a routed-expert name's numbers are, parsed without making strings. */
export interface ExpertName {
  prefix: number;
  layer: number;
  expert: number;
  kind: number;
}

const EXPERTS_INFIX = ".block_sparse_moe.experts.";

/** Reads a decimal integer (no sign, no leading zero) at text[at..], or -1; sets `readEnd`. */
let readEnd = 0;
function digits(text: string, at: number, end: number): number {
  let v = 0, p = at;
  while (p < end) {
    const d = text.charCodeAt(p) - 0x30;
    if (d < 0 || d > 9) break;
    v = v * 10 + d;
    p++;
  }
  if (p === at || p - at > 9 || (text.charCodeAt(at) === 0x30 && p - at > 1)) return -1;
  readEnd = p;
  return v;
}

/**
 * Parses `text[start..end)` as a routed-expert tensor name
 * (`{prefix}layers.{i}.block_sparse_moe.experts.{e}.w{1,2,3}.weight_{packed,scale}`) into
 * `out`, without allocating. False for any other name.
 */
export function parseExpertName(
  text: string,
  start: number,
  end: number,
  out: ExpertName,
): boolean {
  // "language_model.model." | "language_model." | "model.", then "layers."
  let prefix: number, p: number;
  const c = text.charCodeAt(start);
  if (c === 0x6c /* l */ && text.startsWith("language_model.", start)) {
    if (text.startsWith("model.layers.", start + 15)) {
      prefix = 0;
      p = start + 28;
    } else if (text.startsWith("layers.", start + 15)) {
      prefix = 1;
      p = start + 22;
    } else return false;
  } else if (c === 0x6d /* m */ && text.startsWith("model.layers.", start)) {
    prefix = 2;
    p = start + 13;
  } else return false;
  const layer = digits(text, p, end);
  if (layer < 0 || !text.startsWith(EXPERTS_INFIX, readEnd)) return false;
  const expert = digits(text, readEnd + EXPERTS_INFIX.length, end);
  if (expert < 0) return false;
  // ".w{1,2,3}.weight_packed" (23 - 7 = 16 + 1) or ".w{1,2,3}.weight_scale"
  p = readEnd;
  const w = text.charCodeAt(p + 2) - 0x31;
  if (text.charCodeAt(p) !== 0x2e || text.charCodeAt(p + 1) !== 0x77 || w < 0 || w > 2) {
    return false;
  }
  let scale: number;
  if (end - p === 17 && text.startsWith(".weight_packed", p + 3)) scale = 0;
  else if (end - p === 16 && text.startsWith(".weight_scale", p + 3)) scale = 1;
  else return false;
  out.prefix = prefix;
  out.layer = layer;
  out.expert = expert;
  out.kind = 2 * w + scale;
  return true;
}
