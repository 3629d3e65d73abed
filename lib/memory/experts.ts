/**
 * The routed-expert cache: a fixed number of slots, allocated (and pre-faulted) once. A
 * slot holds a key (layer, expert), is empty, or is in flight (being read into). For each
 * layer the misses are read as one batch in file-offset order, several at once; the layer
 * computes on the experts already resident while the rest arrive. A failed or short read
 * stops the run (RUN INVALID); no expert is ever skipped.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import type { ExpertRefs, ModelRefs, TensorRef } from "../checkpoint/types.ts";
import {
  IoClass,
  type IoClassValue,
  type IoPool,
  type PendingRead,
  targetIn,
} from "../io/stream.ts";
import { alignUp, BLOCK_ALIGN, expertTensors, layoutOf } from "../layout/block.ts";
import { type EvictionPolicy, LruPolicy } from "./policy.ts";
import type { ExpertSource, ReadyExpert } from "./sources.ts";

/** How one expert's bytes are read into a slot. */
export interface ExpertPlace {
  /** One run [start, end) of one file holds all six tensors back to back. */
  run?: { file: string; start: number; end: number };
  /** Byte offset in the slot where the block starts (the run's distance from a page). */
  base: number;
  /** Offsets of the six tensors (expertTensors order) from `base`. */
  offsets: number[];
  /** Bytes of slot this expert needs. */
  room: number;
}

/** Where expert `e`'s tensors are, and how they go into a slot. */
export function placeExpert(e: ExpertRefs): ExpertPlace {
  const refs = expertTensors(e);
  const sorted = [...refs].sort((a, b) => a.offset - b.offset);
  const contiguous = sorted.every((r, i) =>
    r.file === sorted[0].file &&
    (i === 0 || r.offset === sorted[i - 1].offset + sorted[i - 1].nbytes)
  );
  if (!contiguous) {
    const { offsets, bytes } = layoutOf(refs);
    return { base: 0, offsets, room: bytes };
  }
  const start = sorted[0].offset;
  const end = start + refs.reduce((n, r) => n + r.nbytes, 0);
  // Read from the page below the run so an O_DIRECT read can land at slot offset 0.
  const base = start % BLOCK_ALIGN;
  return {
    run: { file: sorted[0].file, start, end },
    base,
    offsets: refs.map((r) => r.offset - start),
    room: alignUp(base + end - start, BLOCK_ALIGN),
  };
}

/**
 * Pieces an expert read is cut into: four (about 4.4 MB each for K3), so one expert alone
 * keeps every reader busy and a batch ends with a short tail instead of one reader finishing
 * a long piece alone (measured: 86% -> 91% of raw bandwidth for expert batches).
 */
export const EXPERT_PIECES = 4;

/**
 * Queues the read of `nbytes` at `offset` of `file` into `room` bytes at `base` as `pieces`
 * reads of equal page-aligned size (the last one shorter), each one reader-thread job.
 */
export function readPieces(
  pool: IoPool,
  klass: IoClassValue,
  file: string,
  offset: number,
  nbytes: number,
  base: Deno.PointerObject,
  room: number,
  pieces: number,
  what: string,
): PendingRead[] {
  const piece = alignUp(Math.ceil(nbytes / Math.max(1, pieces)), BLOCK_ALIGN);
  const out: PendingRead[] = [];
  for (let at = 0; at < nbytes || at === 0; at += piece) {
    const n = Math.min(piece, nbytes - at);
    out.push(pool.read(klass, file, offset + at, n, targetIn(base, at, n, room), what));
    if (n === 0) break;
  }
  return out;
}

/**
 * Queues the reads of expert `e` into `room` bytes at `base`, as `place` lays it out: one
 * O_DIRECT run in EXPERT_PIECES reads when its tensors lie back to back, else one read a tensor.
 */
export function readExpert(
  pool: IoPool,
  e: ExpertRefs,
  place: ExpertPlace,
  base: Deno.PointerObject,
  room: number,
  what: string,
): PendingRead[] {
  if (place.run) {
    const { file, start, end } = place.run;
    const n = place.base + end - start;
    return readPieces(
      pool,
      IoClass.expert,
      file,
      start - place.base,
      n,
      base,
      room,
      EXPERT_PIECES,
      what,
    );
  }
  const tensors: TensorRef[] = expertTensors(e);
  return tensors.map((r, j) =>
    pool.read(
      IoClass.expert,
      r.file,
      r.offset,
      r.nbytes,
      targetIn(base, place.offsets[j], r.nbytes, room),
      `${what}: ${r.name}`,
    )
  );
}

/** Bytes of one cache slot: room for the largest expert of the model. */
export function expertSlotBytes(refs: ModelRefs): number {
  let room = 0;
  for (const l of refs.layers) {
    for (let e = 0; e < (l.moe?.experts.count ?? 0); e++) {
      room = Math.max(room, placeExpert(l.moe!.experts.get(e)).room);
    }
  }
  return room;
}

/** Counters for the run report (and `model.cacheStats()` in mod.ts), since the model opened. */
export interface CacheStats {
  /** Expert requests by the forward pass. */
  requests: number;
  /** Requests whose expert was resident when asked for (no read of any kind). */
  hits: number;
  /** Requests that needed a read. */
  misses: number;
  /** Experts dropped to make room. */
  evictions: number;
  /** Seconds the forward pass waited for an expert still being read. */
  waitSeconds: number;
}

const EMPTY = -1;

/** The cache is allocated (and pre-faulted) in chunks of about this size. */
const CACHE_CHUNK_BYTES = 256e6;

interface Slot {
  /** layer * numExperts + id, or EMPTY. */
  key: number;
  /** Set while the slot is in flight. */
  pending: PendingRead[] | null;
}

export class ExpertCache implements ExpertSource {
  readonly stats: CacheStats = { requests: 0, hits: 0, misses: 0, evictions: 0, waitSeconds: 0 };
  /** The slots, in chunks of at most CACHE_CHUNK_BYTES (progress while they are faulted in). */
  #chunks: NativeBuffer[] = [];
  #perChunk: number;
  #slots: Slot[];
  #index = new Map<number, number>();
  #numExperts: number;

  constructor(
    readonly refs: ModelRefs,
    readonly pool: IoPool,
    readonly slotCount: number,
    readonly slotBytes: number,
    readonly policy: EvictionPolicy = new LruPolicy(),
    onAllocated?: (bytes: number) => void,
  ) {
    if (slotCount < 1) throw new Error("the expert cache needs at least one slot");
    this.#numExperts = refs.layers.find((l) => l.moe)?.moe?.experts.count ?? 0;
    this.#perChunk = Math.max(1, Math.floor(CACHE_CHUNK_BYTES / slotBytes));
    try {
      for (let s = 0; s < slotCount; s += this.#perChunk) {
        const n = Math.min(this.#perChunk, slotCount - s);
        this.#chunks.push(NativeBuffer.alloc(n * slotBytes));
        onAllocated?.(n * slotBytes);
      }
    } catch (e) {
      for (const c of this.#chunks) c.free();
      throw e;
    }
    this.#slots = Array.from({ length: slotCount }, () => ({ key: EMPTY, pending: null }));
  }

  /** Pointer `offset` bytes into slot `s`. */
  #slotAt(s: number, offset: number): Deno.PointerObject {
    const chunk = this.#chunks[Math.floor(s / this.#perChunk)];
    return chunk.at((s % this.#perChunk) * this.slotBytes + offset);
  }

  #expert(layer: number, id: number): ExpertRefs {
    return this.refs.layers[layer].moe!.experts.get(id);
  }

  /** A slot for a new read: an empty one, else the policy's victim; -1 when none is free. */
  #takeSlot(busy: Set<number>): number {
    const free: number[] = [];
    for (let s = 0; s < this.#slots.length; s++) {
      if (busy.has(s) || this.#slots[s].pending) continue;
      if (this.#slots[s].key === EMPTY) return s;
      free.push(s);
    }
    if (free.length === 0) return -1;
    const s = this.policy.victim(free);
    this.#index.delete(this.#slots[s].key);
    this.#slots[s].key = EMPTY;
    this.stats.evictions++;
    return s;
  }

  /** Queues the read of expert `id` of `layer` into slot `s`. */
  #startRead(layer: number, id: number, s: number): void {
    const expert = this.#expert(layer, id);
    const pending = readExpert(
      this.pool,
      expert,
      placeExpert(expert),
      this.#slotAt(s, 0),
      this.slotBytes,
      `expert ${id} of layer ${layer}`,
    );
    this.#slots[s] = { key: layer * this.#numExperts + id, pending };
  }

  /**
   * Waits for slot `s`'s reads, off the JS thread (a server answers meanwhile); on failure the
   * slot is emptied and the error thrown.
   */
  async #finishRead(s: number): Promise<void> {
    const slot = this.#slots[s];
    const t0 = performance.now();
    const pending = slot.pending ?? [];
    slot.pending = null; // waited for here, by no one else
    let error: unknown;
    for (const p of pending) await this.pool.waitAsync(p).catch((e) => (error ??= e));
    this.stats.waitSeconds += (performance.now() - t0) / 1000;
    if (error) {
      slot.key = EMPTY;
      throw error;
    }
    this.#index.set(slot.key, s);
  }

  #ready(layer: number, id: number, s: number): ReadyExpert {
    const place = placeExpert(this.#expert(layer, id));
    this.policy.touch(s);
    return { id, base: this.#slotAt(s, place.base), offsets: place.offsets };
  }

  /**
   * Yields every expert of `ids`: resident ones first, while the misses are read (in
   * file-offset order, as many at once as there are free slots). A yielded expert stays
   * valid until the iterator is resumed.
   */
  async *fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> {
    const E = this.#numExperts;
    const hits: { id: number; slot: number }[] = [];
    const misses: number[] = [];
    for (const id of ids) {
      const s = this.#index.get(layer * E + id);
      if (s === undefined) misses.push(id);
      else hits.push({ id, slot: s });
    }
    this.stats.requests += ids.length;
    this.stats.hits += hits.length;
    this.stats.misses += misses.length;
    misses.sort((a, b) => fileOrder(this.#expert(layer, a), this.#expert(layer, b)));

    // Slots this fetch still needs: unyielded hits and reads in flight.
    const busy = new Set(hits.map((h) => h.slot));
    const inFlight: { id: number; slot: number }[] = [];
    let next = 0;
    const topUp = () => {
      while (next < misses.length) {
        const s = this.#takeSlot(busy);
        if (s < 0) return;
        this.#startRead(layer, misses[next], s);
        busy.add(s);
        inFlight.push({ id: misses[next++], slot: s });
      }
    };
    topUp();
    // The reads are queued: hand control back (to the first next()'s caller) so it can
    // compute until it needs an expert, rather than block here on the first miss.
    await Promise.resolve();
    for (const h of hits) {
      yield this.#ready(layer, h.id, h.slot);
      busy.delete(h.slot);
      topUp();
    }
    while (inFlight.length > 0) {
      const f = inFlight.shift()!;
      await this.#finishRead(f.slot);
      yield this.#ready(layer, f.id, f.slot);
      busy.delete(f.slot);
      topUp();
    }
  }

  release(_layer: number): void {}

  /** Waits out any read still landing, then frees the slots. */
  close(): void {
    for (const slot of this.#slots) {
      for (const p of slot.pending ?? []) this.pool.wait(p, false);
      slot.pending = null;
    }
    for (const c of this.#chunks) c.free();
    this.#chunks = [];
  }
}

/** Orders two experts by where their first tensor is on disk. */
function fileOrder(a: ExpertRefs, b: ExpertRefs): number {
  const fa = Math.min(...expertTensors(a).map((r) => r.offset));
  const fb = Math.min(...expertTensors(b).map((r) => r.offset));
  const ka = expertTensors(a)[0].file, kb = expertTensors(b)[0].file;
  return ka < kb ? -1 : ka > kb ? 1 : fa - fb;
}
