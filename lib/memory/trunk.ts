/**
 * Trunk streaming: a pinned prefix of layers stays resident, the rest pass through a ring.
 * The forward pass asks for layers in order 0, 1, ..., n-1, 0, 1, ...; the ring reads ahead
 * in that cyclic order while it has room, so the read of layer L+1 (and further) runs on
 * the reader threads while layer L computes.
 *
 * The ring is one buffer of ringSlots x slotBytes (a slot holds the largest streamed layer),
 * used as a circular byte buffer: each layer takes only its own bytes, so while a large
 * layer computes, several small ones can be read ahead into the same memory.
 *
 * Where a layer's bytes come from is a {@link TrunkStore}: the shards (one read per tensor,
 * into the block layout) or a pack (one run per layer). Either way a region holds the block
 * laid out by layoutOf(trunkTensors(l)), so binding is the same as resident.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import { type TrunkPack, verifyPackedLayer } from "../checkpoint/pack.ts";
import type { LayerRefs, ModelRefs } from "../checkpoint/types.ts";
import { IoClass, type IoPool, type PendingRead, targetIn } from "../io/stream.ts";
import { bindLayer, type LayerWeights, layoutOf, trunkTensors } from "../model/weights.ts";
import { readPieces } from "./experts.ts";
import type { TrunkSource } from "./sources.ts";

/** A page-aligned stretch of a native buffer that holds one layer's block. */
export interface Region {
  buffer: NativeBuffer;
  /** Byte offset in `buffer` (a multiple of 4096). */
  offset: number;
  bytes: number;
}

/** The pointer to the start of a region. */
function regionStart(r: Region): Deno.PointerObject {
  return r.buffer.at(r.offset);
}

/** Where each layer's block comes from. */
export interface TrunkStore {
  /** One line for the report, e.g. "shards (per-tensor reads)". */
  readonly describe: string;
  /** Queues the reads that fill `dst` with layer `l`. */
  read(pool: IoPool, l: LayerRefs, dst: Region): PendingRead[];
  /** Throws RUN INVALID when layer `i`'s bytes in `dst` are not the packed ones. */
  verify?(i: number, dst: Region): void;
}

/** Reads each tensor from its shard into the block layout. */
export class ShardTrunkStore implements TrunkStore {
  readonly describe = "shards (one read per tensor)";

  read(pool: IoPool, l: LayerRefs, dst: Region): PendingRead[] {
    const refs = trunkTensors(l);
    const { offsets } = layoutOf(refs);
    return refs.map((r, j) =>
      pool.read(
        IoClass.trunk,
        r.file,
        r.offset,
        r.nbytes,
        targetIn(regionStart(dst), offsets[j], r.nbytes, dst.bytes),
        r.name,
      )
    );
  }
}

/**
 * Bytes of one trunk read piece. A running piece is never preempted, so an expert batch
 * that arrives waits for at most the pieces already running: small pieces keep that wait
 * short, large enough ones keep the disk at full speed.
 */
export const TRUNK_PIECE_BYTES = 4 << 20;

/** Pinned layers whose reads are queued at once while the prefix loads. */
const PINNED_AHEAD = 2;

/** Reads each layer's run from a pack: page-aligned O_DIRECT pieces of one run per layer. */
export class PackTrunkStore implements TrunkStore {
  readonly describe: string;

  constructor(readonly pack: TrunkPack) {
    this.describe = `pack ${pack.bin} (O_DIRECT, ${TRUNK_PIECE_BYTES >> 20} MB pieces)`;
  }

  read(pool: IoPool, l: LayerRefs, dst: Region): PendingRead[] {
    const run = this.pack.index.layers[l.index];
    return readPieces(
      pool,
      IoClass.trunk,
      this.pack.bin,
      run.offset,
      run.bytes,
      regionStart(dst),
      dst.bytes,
      Math.ceil(run.bytes / TRUNK_PIECE_BYTES),
      `layer ${l.index}`,
    );
  }

  verify(i: number, dst: Region): void {
    verifyPackedLayer(this.pack, i, dst.buffer.view(dst.offset, this.pack.index.layers[i].bytes));
  }
}

/** The trunk plan: how many leading layers stay resident, and the ring behind them. */
export interface TrunkPlan {
  pinned: number;
  ringSlots: number;
  /** Bytes of one ring slot: the largest block among the streamed layers. */
  slotBytes: number;
}

/** Counters for the run report. */
export interface TrunkStats {
  /** Seconds the forward pass waited for a layer that was still being read. */
  waitSeconds: number;
  /** Streamed layer reads completed. */
  layerReads: number;
}

/** A layer in the ring: read, or being read, into its region. */
interface RingEntry extends Region {
  layer: number;
  pending: PendingRead[] | null;
}

export class StreamedTrunk implements TrunkSource {
  readonly stats: TrunkStats = { waitSeconds: 0, layerReads: 0 };
  #pinned: LayerWeights[] = [];
  #pinnedBuffers: NativeBuffer[] = [];
  #ringBuffer: NativeBuffer | null = null;
  /** Layers in the ring, oldest first; their regions follow each other around the buffer. */
  #ring: RingEntry[] = [];
  #streamed: number[];
  /** Index into #streamed of the next layer to read ahead. */
  #cursor = 0;
  #verified = new Set<number>();

  /**
   * Reads the pinned prefix now (reporting each layer to `onPinned`) and starts reading
   * the first streamed layers.
   */
  constructor(
    readonly refs: ModelRefs,
    readonly store: TrunkStore,
    readonly pool: IoPool,
    readonly plan: TrunkPlan,
    readonly verify = false,
    onPinned?: (done: number, total: number) => void,
  ) {
    const layers = refs.layers;
    this.#streamed = layers.slice(plan.pinned).map((l) => l.index);
    try {
      this.#loadPinned(onPinned);
      const slots = Math.min(plan.ringSlots, this.#streamed.length);
      if (slots > 0) this.#ringBuffer = NativeBuffer.alloc(slots * plan.slotBytes);
      this.#fill();
    } catch (e) {
      this.close();
      throw e;
    }
  }

  #loadPinned(onPinned?: (done: number, total: number) => void): void {
    const layers = this.refs.layers.slice(0, this.plan.pinned);
    for (const l of layers) {
      this.#pinnedBuffers.push(NativeBuffer.alloc(layoutOf(trunkTensors(l)).bytes));
    }
    const region = (i: number): Region => ({
      buffer: this.#pinnedBuffers[i],
      offset: 0,
      bytes: this.#pinnedBuffers[i].bytes,
    });
    // A few layers queued at a time keeps the disk busy without running out of tickets.
    const pending: PendingRead[][] = [];
    const queue = (i: number) => {
      if (i < layers.length) pending[i] = this.store.read(this.pool, layers[i], region(i));
    };
    for (let i = 0; i < PINNED_AHEAD; i++) queue(i);
    layers.forEach((l, i) => {
      try {
        this.#waitAll(pending[i]);
        this.#check(l.index, region(i));
        queue(i + PINNED_AHEAD);
      } catch (e) {
        // No read may land in a buffer that close() is about to free.
        for (const p of pending.slice(i + 1).flat()) this.pool.wait(p, false);
        throw e;
      }
      this.#pinned.push(this.#bind(l, region(i)));
      onPinned?.(i + 1, layers.length);
    });
  }

  #bind(l: LayerRefs, r: Region): LayerWeights {
    const offsets = layoutOf(trunkTensors(l)).offsets.map((o) => r.offset + o);
    return bindLayer(l, r.buffer, offsets);
  }

  #check(i: number, r: Region): void {
    if (!this.verify || !this.store.verify || this.#verified.has(i)) return;
    this.store.verify(i, r);
    this.#verified.add(i);
  }

  /** Waits for every read of a layer, all of them even when one fails (no read is left
   * landing in a buffer that may be reused), then throws on the first failure. */
  #waitAll(pending: PendingRead[]): void {
    let error: unknown;
    for (const p of pending) {
      try {
        this.pool.wait(p);
      } catch (e) {
        error ??= e;
      }
    }
    if (error) throw error;
  }

  /**
   * Where a block of `bytes` can go after the newest entry without overlapping the oldest:
   * right behind the newest, or else at the start of the buffer; -1 when neither has room.
   */
  #place(bytes: number): number {
    const total = this.#ringBuffer!.bytes;
    if (this.#ring.length === 0) return bytes <= total ? 0 : -1;
    const oldest = this.#ring[0], newest = this.#ring[this.#ring.length - 1];
    const end = newest.offset + newest.bytes;
    if (newest.offset >= oldest.offset) {
      // Not wrapped: room behind the newest up to the end, or before the oldest.
      if (end + bytes <= total) return end;
      return bytes <= oldest.offset ? 0 : -1;
    }
    return end + bytes <= oldest.offset ? end : -1;
  }

  /** Starts reads of the next streamed layers while the ring has room for them. */
  #fill(): void {
    if (!this.#ringBuffer) return;
    for (;;) {
      const layer = this.#streamed[this.#cursor];
      if (this.#ring.some((e) => e.layer === layer)) return;
      const l = this.refs.layers[layer];
      const bytes = layoutOf(trunkTensors(l)).bytes;
      const offset = this.#place(bytes);
      if (offset < 0) return;
      this.#cursor = (this.#cursor + 1) % this.#streamed.length;
      const entry: RingEntry = { buffer: this.#ringBuffer, offset, bytes, layer, pending: null };
      entry.pending = this.store.read(this.pool, l, entry);
      this.#ring.push(entry);
    }
  }

  /** Waits out every read ahead and empties the ring (after an out-of-order request). */
  #drain(): void {
    for (const e of this.#ring) {
      if (e.pending) { for (const p of e.pending) this.pool.wait(p, false); }
    }
    this.#ring = [];
  }

  acquire(i: number): Promise<LayerWeights> {
    if (i < this.plan.pinned) return Promise.resolve(this.#pinned[i]);
    let entry = this.#ring.find((e) => e.layer === i);
    if (!entry || entry !== this.#ring[0]) {
      // Not the layer read ahead (a different access order): restart the schedule at i.
      this.#drain();
      this.#cursor = this.#streamed.indexOf(i);
      this.#fill();
      entry = this.#ring[0];
    }
    if (entry.pending) {
      const t0 = performance.now();
      const pending = entry.pending;
      entry.pending = null;
      try {
        this.#waitAll(pending);
      } catch (e) {
        this.#ring.shift();
        throw e;
      } finally {
        this.stats.waitSeconds += (performance.now() - t0) / 1000;
      }
      this.stats.layerReads++;
      this.#check(i, entry);
    }
    return Promise.resolve(this.#bind(this.refs.layers[i], entry));
  }

  release(i: number): void {
    if (i < this.plan.pinned) return;
    const oldest = this.#ring[0];
    if (!oldest || oldest.layer !== i || oldest.pending !== null) return;
    this.#ring.shift();
    this.#fill();
  }

  close(): void {
    this.#drain();
    this.#ringBuffer?.free();
    for (const b of this.#pinnedBuffers) b.free();
    this.#ringBuffer = null;
    this.#pinnedBuffers = [];
    this.#pinned = [];
  }
}

/** A trunk source that reports each layer the forward pass asks for (prefill progress). */
export class ObservedTrunk implements TrunkSource {
  constructor(readonly inner: TrunkSource, readonly onAcquire: (i: number) => void) {}
  acquire(i: number): Promise<LayerWeights> {
    this.onAcquire(i);
    return this.inner.acquire(i);
  }
  release(i: number): void {
    this.inner.release(i);
  }
  close(): void {
    this.inner.close();
  }
}
