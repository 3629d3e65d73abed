/**
 * Where the forward pass gets its weights. The engine asks a TrunkSource for one layer at a
 * time and an ExpertSource for the routed experts a layer selected; whether the bytes are
 * resident, streamed through a ring, or cached is the source's business. The math cannot
 * tell the difference, which is why every budget gives the same bytes out.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import type { LayerRefs, ModelRefs, TensorRef } from "../checkpoint/types.ts";
import type { FileReader } from "../io/reader.ts";
import {
  bindExpert,
  bindLayer,
  expertTensors,
  type ExpertWeights,
  foldAttnRes,
  type LayerWeights,
  layoutOf,
  trunkTensors,
  widen,
} from "../model/weights.ts";

/** Supplies one decoder layer's non-expert weights. */
export interface TrunkSource {
  /** The layer's weights; valid until `release(i)`. */
  acquire(i: number): Promise<LayerWeights>;
  /** The caller is done with layer i for this pass. */
  release(i: number): void;
  close(): void;
}

/** An expert made resident for the current layer. */
export interface ReadyExpert {
  id: number;
  weights: ExpertWeights;
}

/** Supplies routed experts. */
export interface ExpertSource {
  /** Yields every expert in `ids` of `layer`, each as soon as it is resident. */
  fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert>;
  /** The caller is done with the experts of the last fetch. */
  release(layer: number): void;
  close(): void;
}

/** Reads a list of tensors into a fresh block laid out by layoutOf. */
export function readBlock(
  reader: FileReader,
  refs: TensorRef[],
): { buffer: NativeBuffer; offsets: number[] } {
  const { offsets, bytes } = layoutOf(refs);
  const buffer = NativeBuffer.alloc(bytes);
  refs.forEach((r, i) => reader.read(r.file, r.offset, r.nbytes, buffer.at(offsets[i]), r.name));
  return { buffer, offsets };
}

/** Bytes of one layer's trunk block. */
export function trunkBlockBytes(l: LayerRefs): number {
  return layoutOf(trunkTensors(l)).bytes;
}

/** Bytes of one expert's block. */
export function expertBlockBytes(refs: ModelRefs): number {
  const moe = refs.layers.find((l) => l.moe)?.moe;
  return moe ? layoutOf(expertTensors(moe.experts.get(0))).bytes : 0;
}

/** Every layer read once and kept. */
export class ResidentTrunk implements TrunkSource {
  #layers: LayerWeights[] = [];
  #buffers: NativeBuffer[] = [];

  constructor(refs: ModelRefs, reader: FileReader) {
    for (const l of refs.layers) {
      const { buffer, offsets } = readBlock(reader, trunkTensors(l));
      this.#buffers.push(buffer);
      this.#layers.push(bindLayer(l, buffer, offsets));
    }
  }

  acquire(i: number): Promise<LayerWeights> {
    return Promise.resolve(this.#layers[i]);
  }

  release(_i: number): void {}

  close(): void {
    for (const b of this.#buffers) b.free();
    this.#buffers = [];
  }
}

/** Every routed expert read once and kept. */
export class ResidentExperts implements ExpertSource {
  #experts = new Map<number, ExpertWeights[]>();
  #buffers: NativeBuffer[] = [];

  constructor(refs: ModelRefs, reader: FileReader) {
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
          return bindExpert(buffer, e * bytes, offsets);
        }),
      );
    }
  }

  async *fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> {
    const all = this.#experts.get(layer)!;
    for (const id of ids) yield { id, weights: all[id] };
  }

  release(_layer: number): void {}

  close(): void {
    for (const b of this.#buffers) b.free();
    this.#buffers = [];
  }
}

/** Model-level weights: embedding and lm_head (native), final norm and output AttnRes. */
export interface HeadWeights {
  embed: Deno.PointerObject;
  lmHead: Deno.PointerObject;
  norm: Float32Array;
  outputResSw: Float32Array;
  close(): void;
}

/** Reads the model-level tensors. */
export function readHead(refs: ModelRefs, reader: FileReader): HeadWeights {
  const small = [refs.norm, refs.outputRes.norm, refs.outputRes.proj];
  const { buffer, offsets } = readBlock(reader, [refs.embed, refs.lmHead, ...small]);
  const f32 = (i: number) => widen(small[i], buffer.view(offsets[i + 2], small[i].nbytes));
  return {
    embed: buffer.at(offsets[0]),
    lmHead: buffer.at(offsets[1]),
    norm: f32(0),
    outputResSw: foldAttnRes(f32(1), f32(2)),
    close: () => buffer.free(),
  };
}
