/**
 * Trunk streaming: a pinned prefix of layers stays resident, the rest pass through a ring
 * of slots. The forward pass asks for layers in order 0, 1, ..., n-1, 0, 1, ...; the ring
 * reads ahead in that cyclic order while slots are free, so the read of layer L+1 (and
 * further) runs on the reader threads while layer L computes.
 *
 * Where a layer's bytes come from is a {@link TrunkStore}: the shards (one read per tensor,
 * into the block layout) or a pack (one aligned read per layer). Either way a slot holds the
 * block laid out by layoutOf(trunkTensors(l)), so binding is the same as resident.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import { type TrunkPack, verifyPackedLayer } from "../checkpoint/pack.ts";
import type { LayerRefs, ModelRefs } from "../checkpoint/types.ts";
import { IoClass, type IoPool, type PendingRead, targetIn } from "../io/stream.ts";
import { bindLayer, type LayerWeights, layoutOf, trunkTensors } from "../model/weights.ts";
import type { TrunkSource } from "./sources.ts";

/** Where each layer's block comes from. */
export interface TrunkStore {
  /** One line for the report, e.g. "shards (per-tensor reads)". */
  readonly describe: string;
  /** Queues the reads that fill `dst` (page-aligned, `dst.bytes` long) with layer `l`. */
  read(pool: IoPool, l: LayerRefs, dst: NativeBuffer): PendingRead[];
  /** Throws RUN INVALID when layer `i`'s bytes in `dst` are not the packed ones. */
  verify?(i: number, dst: NativeBuffer): void;
}

/** Reads each tensor from its shard into the block layout. */
export class ShardTrunkStore implements TrunkStore {
  readonly describe = "shards (one read per tensor)";

  read(pool: IoPool, l: LayerRefs, dst: NativeBuffer): PendingRead[] {
    const refs = trunkTensors(l);
    const { offsets } = layoutOf(refs);
    return refs.map((r, j) =>
      pool.read(
        IoClass.trunk,
        r.file,
        r.offset,
        r.nbytes,
        targetIn(dst.pointer, offsets[j], r.nbytes, dst.bytes),
        r.name,
      )
    );
  }
}

/** Reads each layer's run from a pack: one page-aligned read per layer (O_DIRECT). */
export class PackTrunkStore implements TrunkStore {
  readonly describe: string;

  constructor(readonly pack: TrunkPack) {
    this.describe = `pack ${pack.bin} (one O_DIRECT read per layer)`;
  }

  read(pool: IoPool, l: LayerRefs, dst: NativeBuffer): PendingRead[] {
    const run = this.pack.index.layers[l.index];
    return [
      pool.read(
        IoClass.trunk,
        this.pack.bin,
        run.offset,
        run.bytes,
        targetIn(dst.pointer, 0, run.bytes, dst.bytes),
        `layer ${l.index}`,
      ),
    ];
  }

  verify(i: number, dst: NativeBuffer): void {
    verifyPackedLayer(this.pack, i, dst.view(0, this.pack.index.layers[i].bytes));
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

interface RingSlot {
  buffer: NativeBuffer;
  /** The layer this slot holds or is reading; -1 when empty. */
  layer: number;
  pending: PendingRead[] | null;
}

export class StreamedTrunk implements TrunkSource {
  readonly stats: TrunkStats = { waitSeconds: 0, layerReads: 0 };
  #pinned: LayerWeights[] = [];
  #pinnedBuffers: NativeBuffer[] = [];
  #ring: RingSlot[] = [];
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
      for (let s = 0; s < slots; s++) {
        this.#ring.push({ buffer: NativeBuffer.alloc(plan.slotBytes), layer: -1, pending: null });
      }
      this.#fill();
    } catch (e) {
      this.close();
      throw e;
    }
  }

  #loadPinned(onPinned?: (done: number, total: number) => void): void {
    const layers = this.refs.layers.slice(0, this.plan.pinned);
    const pending = layers.map((l) => {
      const buffer = NativeBuffer.alloc(layoutOf(trunkTensors(l)).bytes);
      this.#pinnedBuffers.push(buffer);
      return this.store.read(this.pool, l, buffer);
    });
    layers.forEach((l, i) => {
      this.#waitAll(pending[i]);
      this.#check(l.index, this.#pinnedBuffers[i]);
      this.#pinned.push(this.#bind(l, this.#pinnedBuffers[i]));
      onPinned?.(i + 1, layers.length);
    });
  }

  #bind(l: LayerRefs, buffer: NativeBuffer): LayerWeights {
    return bindLayer(l, buffer, layoutOf(trunkTensors(l)).offsets);
  }

  #check(i: number, buffer: NativeBuffer): void {
    if (!this.verify || !this.store.verify || this.#verified.has(i)) return;
    this.store.verify(i, buffer);
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

  /** Starts reads of the next streamed layers into every empty slot. */
  #fill(): void {
    for (const slot of this.#ring) {
      if (slot.layer >= 0) continue;
      const layer = this.#streamed[this.#cursor];
      if (this.#ring.some((s) => s.layer === layer)) return;
      this.#cursor = (this.#cursor + 1) % this.#streamed.length;
      slot.layer = layer;
      slot.pending = this.store.read(this.pool, this.refs.layers[layer], slot.buffer);
    }
  }

  /** Waits out every read ahead and empties the ring (after an out-of-order request). */
  #drain(): void {
    for (const slot of this.#ring) {
      if (slot.pending) { for (const p of slot.pending) this.pool.wait(p, false); }
      slot.pending = null;
      slot.layer = -1;
    }
  }

  acquire(i: number): Promise<LayerWeights> {
    if (i < this.plan.pinned) return Promise.resolve(this.#pinned[i]);
    let slot = this.#ring.find((s) => s.layer === i);
    if (!slot) {
      // Not the layer read ahead (a different access order): restart the schedule at i.
      this.#drain();
      this.#cursor = this.#streamed.indexOf(i);
      this.#fill();
      slot = this.#ring.find((s) => s.layer === i)!;
    }
    if (slot.pending) {
      const t0 = performance.now();
      const pending = slot.pending;
      slot.pending = null;
      try {
        this.#waitAll(pending);
      } catch (e) {
        slot.layer = -1;
        throw e;
      } finally {
        this.stats.waitSeconds += (performance.now() - t0) / 1000;
      }
      this.stats.layerReads++;
      this.#check(i, slot.buffer);
    }
    return Promise.resolve(this.#bind(this.refs.layers[i], slot.buffer));
  }

  release(i: number): void {
    if (i < this.plan.pinned) return;
    const slot = this.#ring.find((s) => s.layer === i && s.pending === null);
    if (!slot) return;
    slot.layer = -1;
    this.#fill();
  }

  close(): void {
    this.#drain();
    for (const s of this.#ring) s.buffer.free();
    for (const b of this.#pinnedBuffers) b.free();
    this.#ring = [];
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
