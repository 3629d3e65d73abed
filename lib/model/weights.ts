/**
 * Binding bytes to kernel arguments. The memory layer hands out a block's pieces (bytes at
 * block offsets, lib/layout/block.ts); this file turns them into what the kernels take:
 * small vectors widened once to fp32 (exactly) and kept in TypeScript, and matrices as
 * pointers to their rows as stored (BF16, MXFP4), one row block per piece.
 *
 * A {@link BlockReader} walks one block for one forward pass in block order: it waits for a
 * piece only when the first part the forward pass needs is in it, and releases the piece as
 * soon as every part in it has been used, so the ring can read further ahead.
 */
import type { BlockLayout, PiecePart } from "../layout/block.ts";
import type { PieceBytes, ReadyExpert, TrunkSource } from "../memory/sources.ts";
import type { TensorRef } from "../checkpoint/types.ts";
import { runInvalid } from "../errors.ts";

/** Widens a BF16 or F32 tensor's bytes to a new Float32Array (exact). */
export function widen(ref: TensorRef, bytes: Uint8Array): Float32Array {
  const n = ref.nbytes / (ref.dtype === "BF16" ? 2 : 4);
  if (ref.dtype === "F32") {
    return new Float32Array(bytes.slice(0, ref.nbytes).buffer);
  }
  if (ref.dtype !== "BF16") throw new Error(`cannot widen ${ref.name} of dtype ${ref.dtype}`);
  const src = new Uint16Array(bytes.slice(0, ref.nbytes).buffer);
  const bits = new Uint32Array(n);
  for (let i = 0; i < n; i++) bits[i] = src[i] << 16;
  return new Float32Array(bits.buffer);
}

/** Folded AttnRes score vector: res_norm.weight * res_proj.weight (exact in fp32). */
export function foldAttnRes(norm: Float32Array, proj: Float32Array): Float32Array {
  const sw = new Float32Array(norm.length);
  for (let i = 0; i < sw.length; i++) sw[i] = norm[i] * proj[i];
  return sw;
}

/** A layer's small vectors, widened to fp32. */
export interface LayerVectors {
  inputNorm: Float32Array;
  postAttnNorm: Float32Array;
  attnResSw: Float32Array;
  mlpResSw: Float32Array;
  kda?: {
    qConv: Float32Array;
    kConv: Float32Array;
    vConv: Float32Array;
    aLog: Float32Array;
    dtBias: Float32Array;
    oNorm: Float32Array;
  };
  mla?: { qANorm: Float32Array; kvANorm: Float32Array };
  moe?: { routerBias: Float32Array; latentNorm: Float32Array };
}

/** The vectors of a layer from their widened values by role. */
export function layerVectors(v: Map<string, Float32Array>): LayerVectors {
  const get = (role: string) => v.get(role)!;
  const out: LayerVectors = {
    inputNorm: get("inputNorm"),
    postAttnNorm: get("postAttnNorm"),
    attnResSw: foldAttnRes(get("attnRes.norm"), get("attnRes.proj")),
    mlpResSw: foldAttnRes(get("mlpRes.norm"), get("mlpRes.proj")),
  };
  if (v.has("kda.qConv")) {
    out.kda = {
      qConv: get("kda.qConv"),
      kConv: get("kda.kConv"),
      vConv: get("kda.vConv"),
      aLog: get("kda.aLog"),
      dtBias: get("kda.dtBias"),
      oNorm: get("kda.oNorm"),
    };
  }
  if (v.has("mla.qANorm")) out.mla = { qANorm: get("mla.qANorm"), kvANorm: get("mla.kvANorm") };
  if (v.has("moe.routerBias")) {
    out.moe = { routerBias: get("moe.routerBias"), latentNorm: get("moe.latentNorm") };
  }
  return out;
}

/** For each entry of a block, its parts in row order with the piece each is in. */
export class BlockMap {
  readonly parts: { piece: number; part: PiecePart }[][];
  /** Parts per piece. */
  readonly perPiece: number[];
  /** Entries that are vectors (all at the front of the block). */
  readonly vectors: number;

  constructor(readonly layout: BlockLayout) {
    this.parts = layout.entries.map(() => []);
    this.perPiece = layout.pieces.map((p) => p.parts.length);
    layout.pieces.forEach((p, i) => {
      for (const part of p.parts) this.parts[part.entry].push({ piece: i, part });
    });
    this.vectors = layout.entries.findIndex((e) => e.kind !== "vector");
    if (this.vectors < 0) this.vectors = layout.entries.length;
  }

  entry(role: string): number {
    const i = this.layout.roles.get(role);
    if (i === undefined) throw new Error(`${role} is not in ${this.layout.name}`);
    return i;
  }
}

/**
 * One pass over one block. Entries must be used in block order (the order the forward pass
 * consumes them, which is how the block is laid out); using one out of order is a bug and
 * throws, because a streamed ring could not serve it.
 */
export class BlockReader {
  #next = 0;
  #left: number[];
  #held = new Map<number, PieceBytes>();

  constructor(readonly trunk: TrunkSource, readonly b: number, readonly map: BlockMap) {
    this.#left = [...map.perPiece];
  }

  #take(role: string): number {
    const i = this.map.entry(role);
    if (i !== this.#next) {
      throw new Error(
        `${role} of ${this.map.layout.name} used out of block order ` +
          `(expected ${this.map.layout.entries[this.#next]?.role})`,
      );
    }
    this.#next++;
    return i;
  }

  /** Waits, off the JS thread, for the first piece of entry `role` when it is not held yet. */
  async ready(role: string): Promise<void> {
    const [{ piece }] = this.map.parts[this.map.entry(role)];
    if (!this.#held.has(piece)) await this.trunk.ready?.(this.b, piece);
  }

  /** As {@link ready} for the block's first entry (its vectors). */
  async start(): Promise<void> {
    await this.ready(this.map.layout.entries[0].role);
  }

  #piece(p: number): PieceBytes {
    let bytes = this.#held.get(p);
    if (!bytes) {
      bytes = this.trunk.piece(this.b, p);
      this.#held.set(p, bytes);
    }
    return bytes;
  }

  #used(p: number): void {
    if (--this.#left[p] > 0) return;
    this.#held.delete(p);
    this.trunk.release(this.b, p);
  }

  /** Every vector of the block, widened to fp32, by role (the block's first entries). */
  vectors(): Map<string, Float32Array> {
    const out = new Map<string, Float32Array>();
    for (let i = 0; i < this.map.vectors; i++) {
      const e = this.map.layout.entries[this.#take(this.map.layout.entries[i].role)];
      const { piece } = this.map.parts[i][0];
      const bytes = this.#piece(piece);
      out.set(e.role, widen(e.ref, bytes.view(this.map.layout.offsets[i], e.ref.nbytes)));
      this.#used(piece);
    }
    return out;
  }

  /**
   * Each row block of matrix `role`, in row order, each resident until the loop asks for the
   * next one (the caller may await a kernel on it meanwhile): its rows as stored (`coded` 0),
   * or a coded chunk of `coded` bytes whose header was checked to hold exactly those rows.
   */
  *rowBlocks(role: string): Generator<RowBlock> {
    const i = this.#take(role),
      ref = this.map.layout.entries[i].ref,
      rb = ref.nbytes / (ref.shape[0] ?? 1);
    for (const { piece, part } of this.map.parts[i]) {
      // A sync generator (an async one costs microseconds a step, on every decode step):
      // a piece still being read is handed out as a wait to await first.
      if (!this.#held.has(piece) && this.trunk.ready) {
        yield { wait: this.trunk.ready(this.b, piece) };
      }
      const bytes = this.#piece(piece);
      if (part.coded) {
        checkCodedHeader(bytes.view(part.coded.at, CODED_HEADER), this.map.layout.name, ref, part);
        yield {
          w: bytes.at(part.coded.at),
          row0: part.row0,
          rows: part.rows,
          coded: part.coded.bytes,
        };
      } else {
        yield {
          w: bytes.at(this.map.layout.offsets[i] + part.row0 * rb),
          row0: part.row0,
          rows: part.rows,
          coded: 0,
        };
      }
      this.#used(piece);
    }
  }

  /** The whole tensor `role` (never cut), resident until {@link done}. */
  whole(role: string): Deno.PointerObject {
    const i = this.#take(role);
    const [{ piece }] = this.map.parts[i];
    return this.#piece(piece).at(this.map.layout.offsets[i]);
  }

  /** The forward pass is done with the whole tensor `role`. */
  done(role: string): void {
    this.#used(this.map.parts[this.map.entry(role)][0].piece);
  }

  /** Throws unless every entry was used (a skipped tensor would stall the ring). */
  finish(): void {
    if (this.#next !== this.map.layout.entries.length || this.#held.size > 0) {
      throw new Error(`${this.map.layout.name}: pass ended at entry ${this.#next}`);
    }
  }
}

/** Bytes of a coded chunk's header (csrc/codec.h): magic, rows, cols, block rows, ... */
const CODED_HEADER = 32;
const CODED_MAGIC = 0x3143334b;

/**
 * Refuses (RUN INVALID) a coded chunk whose header does not say it holds rows
 * [row0, row0 + rows) of `ref` in `coded.bytes` bytes: the kernel sizes its output and reads
 * its input by the header, so a tampered one must not reach it.
 */
function checkCodedHeader(h: Uint8Array, block: string, ref: TensorRef, part: PiecePart): void {
  const d = new DataView(h.buffer, h.byteOffset, h.byteLength);
  const magic = d.getUint32(0, true), rows = d.getUint32(4, true), cols = d.getUint32(8, true);
  const size = Number(d.getBigUint64(24, true));
  if (
    magic !== CODED_MAGIC || rows !== part.rows || cols !== ref.shape[1] ||
    size !== part.coded!.bytes
  ) {
    throw runInvalid(
      `${block}: the coded chunk of ${ref.name} rows ${part.row0}..${part.row0 + part.rows - 1} ` +
        `has a bad header (magic ${magic.toString(16)}, ${rows} x ${cols}, ${size} bytes; ` +
        `expected ${part.rows} x ${ref.shape[1]}, ${part.coded!.bytes} bytes): the pack is ` +
        `corrupted; re-run k3 pack`,
    );
  }
}

/** A row block of a matrix, resident; or a read to await before the next one. */
export type RowBlock = {
  w: Deno.PointerObject;
  row0: number;
  rows: number;
  /** Bytes of the coded chunk at w, or 0: the rows as stored. */
  coded: number;
  wait?: undefined;
} | {
  wait: Promise<void>;
};

/** One routed expert's MXFP4 weights. */
export interface ExpertWeights {
  w1Packed: Deno.PointerObject;
  w1Scale: Deno.PointerObject;
  w3Packed: Deno.PointerObject;
  w3Scale: Deno.PointerObject;
  w2Packed: Deno.PointerObject;
  w2Scale: Deno.PointerObject;
}

/** Binds a resident expert (tensors in expertTensors order) to kernel arguments. */
export function bindExpert(r: ReadyExpert): ExpertWeights {
  const p = (i: number) =>
    r.offsets[i] === 0 ? r.base : Deno.UnsafePointer.offset(r.base, r.offsets[i])!;
  return {
    w1Packed: p(0),
    w1Scale: p(1),
    w3Packed: p(2),
    w3Scale: p(3),
    w2Packed: p(4),
    w2Scale: p(5),
  };
}
