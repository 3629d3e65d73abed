/**
 * Where the forward pass gets its bytes. A TrunkSource hands out the blocks of the decoder
 * layers and of lm_head one piece at a time; an ExpertSource the routed experts a layer
 * selected; EmbeddingRows the embedding rows of the tokens of one call. Whether the bytes
 * are resident, streamed through a ring, or cached is the source's business: the memory
 * layer deals in bytes and block offsets only, and the model binds them to kernel
 * arguments (lib/model/weights.ts). The math cannot tell the difference, which is why
 * every budget gives the same bytes out.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import type { ModelRefs, TensorRef } from "../checkpoint/types.ts";
import type { FileReader } from "../io/reader.ts";
import {
  type BlockLayout,
  type CodedSizes,
  expertTensors,
  headBlock,
  layerBlock,
  layoutOf,
  PIECE_BYTES,
  type Placement,
} from "../layout/block.ts";

/** The bytes of one resident piece: block offset `o` (inside the piece) is at `at(o)`. */
export interface PieceBytes {
  at(offset: number): Deno.PointerObject;
  view(offset: number, nbytes: number): Uint8Array;
}

/**
 * Supplies the trunk: blocks 0..layers-1 are the decoder layers, block `layers` is lm_head.
 * The forward pass asks for pieces in block order and releases each before asking for the
 * next one; a source may read ahead in that order.
 */
export interface TrunkSource {
  readonly blocks: BlockLayout[];
  /** Piece p of block b, resident (waits for its read); valid until release(b, p). */
  piece(b: number, p: number): PieceBytes;
  /**
   * Resolves once piece p of block b is resident, having waited for its read off the JS thread
   * (piece() then returns at once). Optional: a source whose pieces are always resident has
   * nothing to wait for.
   */
  ready?(b: number, p: number): Promise<void>;
  /** The caller is done with piece p of block b for this pass. */
  release(b: number, p: number): void;
  /** True when block b stays resident (its bytes never move). */
  resident(b: number): boolean;
  close(): void;
}

/**
 * The blocks of a model's trunk: each decoder layer, then lm_head. `layers` places the
 * decoder layers: `packed` as a trunk pack stores them, `file` for reads from the shards.
 * lm_head is in a coded pack only, so without `coded` it is placed for reads from its shard.
 * `coded`: the coded chunk sizes of each layer and then of lm_head, from a coded pack.
 */
export function trunkBlocks(
  refs: ModelRefs,
  pieceBytes = PIECE_BYTES,
  layers: Placement = "packed",
  coded?: CodedSizes[],
): BlockLayout[] {
  return [
    ...refs.layers.map((l, i) => layerBlock(l, pieceBytes, layers, coded?.[i])),
    headBlock(refs.lmHead, pieceBytes, coded ? "packed" : "file", coded?.[refs.layers.length]),
  ];
}

/** An expert made resident: tensor j (expertTensors order) is at `base + offsets[j]`. */
export interface ReadyExpert {
  id: number;
  base: Deno.PointerObject;
  offsets: number[];
}

/** Supplies routed experts. */
export interface ExpertSource {
  /** Yields every expert in `ids` of `layer`, each as soon as it is resident. */
  fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert>;
  /** The caller is done with the experts of the last fetch. */
  release(layer: number): void;
  close(): void;
}

/** A whole block held in one native buffer (resident or pinned). */
export class BlockBuffer implements PieceBytes {
  constructor(readonly buffer: NativeBuffer) {}
  at(offset: number): Deno.PointerObject {
    return this.buffer.at(offset);
  }
  view(offset: number, nbytes: number): Uint8Array {
    return this.buffer.view(offset, nbytes);
  }
}

/** Reads every tensor of `block` from the shards into a fresh buffer in its layout. */
function readWholeBlock(reader: FileReader, block: BlockLayout): NativeBuffer {
  const buffer = NativeBuffer.alloc(block.bytes);
  try {
    block.entries.forEach((e, i) => {
      const r = e.ref;
      reader.read(r.file, r.offset, r.nbytes, buffer.at(block.offsets[i]), r.name);
    });
  } catch (e) {
    buffer.free();
    throw e;
  }
  return buffer;
}

/** Reads a list of tensors into a fresh block laid out by layoutOf. */
export function readBlock(
  reader: FileReader,
  refs: TensorRef[],
): { buffer: NativeBuffer; offsets: number[] } {
  const { offsets, bytes } = layoutOf(refs);
  const buffer = NativeBuffer.alloc(bytes);
  try {
    refs.forEach((r, i) => reader.read(r.file, r.offset, r.nbytes, buffer.at(offsets[i]), r.name));
  } catch (e) {
    buffer.free();
    throw e;
  }
  return { buffer, offsets };
}

/** Bytes of one expert's block. */
export function expertBlockBytes(refs: ModelRefs): number {
  const moe = refs.layers.find((l) => l.moe)?.moe;
  return moe ? layoutOf(expertTensors(moe.experts.get(0))).bytes : 0;
}

/** Every block read once and kept. */
export class ResidentTrunk implements TrunkSource {
  readonly blocks: BlockLayout[];
  #buffers: BlockBuffer[] = [];

  constructor(refs: ModelRefs, reader: FileReader) {
    this.blocks = trunkBlocks(refs);
    try {
      for (const b of this.blocks) this.#buffers.push(new BlockBuffer(readWholeBlock(reader, b)));
    } catch (e) {
      this.close();
      throw e;
    }
  }

  piece(b: number, _p: number): PieceBytes {
    return this.#buffers[b];
  }

  release(_b: number, _p: number): void {}

  resident(_b: number): boolean {
    return true;
  }

  close(): void {
    for (const b of this.#buffers) b.buffer.free();
    this.#buffers = [];
  }
}

/** Every routed expert read once and kept. */
export class ResidentExperts implements ExpertSource {
  #experts = new Map<number, ReadyExpert[]>();
  #buffers: NativeBuffer[] = [];

  constructor(refs: ModelRefs, reader: FileReader) {
    try {
      for (const l of refs.layers) {
        if (!l.moe) continue;
        const perExpert = Array.from(
          { length: l.moe.experts.count },
          (_, e) => expertTensors(l.moe!.experts.get(e)),
        );
        const { offsets, bytes } = layoutOf(perExpert[0]);
        const buffer = NativeBuffer.alloc(bytes * perExpert.length);
        this.#buffers.push(buffer);
        this.#experts.set(
          l.index,
          perExpert.map((tensors, e) => {
            tensors.forEach((r, j) =>
              reader.read(r.file, r.offset, r.nbytes, buffer.at(e * bytes + offsets[j]), r.name)
            );
            return { id: e, base: buffer.at(e * bytes), offsets };
          }),
        );
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  async *fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> {
    const all = this.#experts.get(layer)!;
    for (const id of ids) yield all[id];
  }

  release(_layer: number): void {}

  close(): void {
    for (const b of this.#buffers) b.free();
    this.#buffers = [];
  }
}

/**
 * The embedding is never resident: each forward call reads the rows of its own tokens
 * (T x hidden BF16) from the shard, into a buffer that grows to the largest call.
 */
export class EmbeddingRows {
  #buffer: NativeBuffer | null = null;
  readonly rowBytes: number;

  constructor(readonly ref: TensorRef, readonly reader: FileReader) {
    this.rowBytes = ref.nbytes / ref.shape[0];
  }

  /** Reads the rows of `ids` (each checked against the vocabulary by the caller), in order. */
  read(ids: ArrayLike<number>): Deno.PointerObject {
    const need = ids.length * this.rowBytes;
    if (!this.#buffer || this.#buffer.bytes < need) {
      this.#buffer?.free();
      this.#buffer = null;
      this.#buffer = NativeBuffer.alloc(need);
    }
    for (let t = 0; t < ids.length; t++) {
      this.reader.read(
        this.ref.file,
        this.ref.offset + ids[t] * this.rowBytes,
        this.rowBytes,
        this.#buffer.at(t * this.rowBytes),
        `${this.ref.name} row ${ids[t]}`,
      );
    }
    return this.#buffer.pointer;
  }

  close(): void {
    this.#buffer?.free();
    this.#buffer = null;
  }
}
