/**
 * Every routed expert resident, loaded while the model already runs. When the plan holds
 * all experts, reading them all before the first step makes the first token wait for
 * experts its prompt never routes to. Here the reads are queued in layer order, a bounded
 * window at a time, each expert read as the expert cache reads it (one O_DIRECT run into a
 * page-aligned block of its own, allocated when queued): the first layers' experts land
 * first, and an expert the forward pass asks for before its turn is read at once, ahead of
 * the queue. Nothing is read twice or evicted; once every read has landed this is a
 * resident expert table.
 */
import { NativeBuffer } from "../../ffi/native.ts";
import type { ModelRefs } from "../checkpoint/types.ts";
import type { IoPool, PendingRead } from "../io/stream.ts";
import { type ExpertPlace, placeExpert, readExpert } from "./experts.ts";
import type { ExpertSource, ReadyExpert } from "./sources.ts";

/**
 * Background bytes in flight at once. A demand read queues behind at most this much
 * (tens of milliseconds on an NVMe drive), yet it keeps several reads per reader thread.
 */
export const LOAD_WINDOW_BYTES = 256 << 20;

/** Experts a fetch keeps queued ahead of the one it waits for. */
const DEMAND_AHEAD = 32;

/** How often the loader tops up its window while the event loop is otherwise idle. */
const PUMP_MS = 5;

/** One expert: where its bytes go, and its reads while they are in flight. */
interface Expert {
  place: ExpertPlace;
  /** Allocated when its reads are queued (first touch of fresh pages is slow: pay it late). */
  buffer?: NativeBuffer;
  /** undefined = not queued, an array = in flight, null = landed. */
  reads?: PendingRead[] | null;
}
export class LoadingExperts implements ExpertSource {
  #layers = new Map<number, Expert[]>();
  /** Every (layer, expert) in load order; `#next` is the first not yet queued. */
  #order: { layer: number; id: number }[] = [];
  #next = 0;
  #inFlight: { layer: number; id: number; bytes: number }[] = [];
  #inFlightBytes = 0;
  #failure: unknown;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(readonly refs: ModelRefs, readonly pool: IoPool) {
    for (const l of refs.layers) {
      if (!l.moe) continue;
      const experts: Expert[] = [];
      for (let e = 0; e < l.moe.experts.count; e++) {
        experts.push({ place: placeExpert(l.moe.experts.get(e)) });
        this.#order.push({ layer: l.index, id: e });
      }
      this.#layers.set(l.index, experts);
    }
    this.#pump();
    if (this.#next < this.#order.length || this.#inFlight.length > 0) {
      const timer = setInterval(() => this.#pump(), PUMP_MS);
      Deno.unrefTimer(timer);
      this.#timer = timer;
    }
  }

  /** Experts whose bytes have all landed. */
  get loaded(): number {
    let n = 0;
    for (const l of this.#layers.values()) n += l.filter((e) => e.reads === null).length;
    return n;
  }

  /** Every expert of the model. */
  get total(): number {
    return this.#order.length;
  }

  /** Allocates expert `id` of `layer` and queues its reads (as the expert cache reads). */
  #queue(layer: number, id: number): void {
    const expert = this.#layers.get(layer)![id];
    const { place } = expert;
    const buffer = NativeBuffer.alloc(place.room);
    expert.buffer = buffer;
    expert.reads = readExpert(
      this.pool,
      this.refs.layers[layer].moe!.experts.get(id),
      place,
      buffer.pointer,
      place.room,
      `expert ${id} of layer ${layer}`,
    );
    this.#inFlight.push({ layer, id, bytes: place.room });
    this.#inFlightBytes += place.room;
  }

  /** Waits for expert `id` of `layer` (throws its read's failure). */
  #land(layer: number, id: number): void {
    const expert = this.#layers.get(layer)![id];
    const reads = expert.reads;
    if (!reads) return;
    expert.reads = null;
    const at = this.#inFlight.findIndex((f) => f.layer === layer && f.id === id);
    this.#inFlightBytes -= this.#inFlight[at].bytes;
    this.#inFlight.splice(at, 1);
    let error: unknown;
    for (const p of reads) {
      try {
        this.pool.wait(p);
      } catch (e) {
        error ??= e;
      }
    }
    if (error) throw error;
  }

  /** Whether every ticket of `reads` has finished (never blocks). */
  #done(reads: PendingRead[]): boolean {
    return reads.every((p) => p.tickets.every((t) => this.pool.poll(t)));
  }

  /** Takes the reads that landed and queues more, up to the window. Never blocks. */
  #pump(): void {
    try {
      for (const f of [...this.#inFlight]) {
        const reads = this.#layers.get(f.layer)![f.id].reads;
        if (reads && this.#done(reads)) this.#land(f.layer, f.id);
      }
      while (this.#next < this.#order.length && this.#inFlightBytes < LOAD_WINDOW_BYTES) {
        const { layer, id } = this.#order[this.#next++];
        if (this.#layers.get(layer)![id].reads === undefined) this.#queue(layer, id);
      }
    } catch (e) {
      // Reported by the next fetch: a timer callback has nobody to throw to.
      this.#failure ??= e;
    }
    const finished = this.#next >= this.#order.length && this.#inFlight.length === 0;
    if ((finished || this.#failure) && this.#timer !== undefined) {
      clearInterval(this.#timer);
      this.#timer = undefined;
    }
  }

  async *fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> {
    if (this.#failure) throw this.#failure;
    const l = this.#layers.get(layer)!;
    this.#pump();
    const ready = (id: number): ReadyExpert => ({
      id,
      base: l[id].buffer!.at(l[id].place.base),
      offsets: l[id].place.offsets,
    });
    const waiting = ids.filter((id) => l[id].reads !== null);
    // What this layer needs and nobody queued yet is queued now, ahead of the background
    // window, DEMAND_AHEAD experts at a time (each read is a reader ticket; they are few).
    let queued = 0;
    const topUp = (upTo: number) => {
      for (; queued < Math.min(upTo, waiting.length); queued++) {
        if (l[waiting[queued]].reads === undefined) this.#queue(layer, waiting[queued]);
      }
    };
    topUp(DEMAND_AHEAD);
    for (const id of ids) if (l[id].reads === null) yield ready(id);
    for (let i = 0; i < waiting.length; i++) {
      this.#land(layer, waiting[i]);
      // A read the background pump collected may have failed: never hand out its expert.
      if (this.#failure) throw this.#failure;
      topUp(i + 1 + DEMAND_AHEAD);
      yield ready(waiting[i]);
    }
  }

  release(_layer: number): void {}

  /** Waits out every read still landing, then frees the buffers. */
  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    for (const l of this.#layers.values()) {
      for (const e of l) {
        for (const p of e.reads ?? []) this.pool.wait(p, false);
        e.buffer?.free();
      }
    }
    this.#layers.clear();
    this.#inFlight = [];
    this.#inFlightBytes = 0;
  }
}
