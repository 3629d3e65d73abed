/**
 * Trunk streaming. The trunk is the blocks of the decoder layers and of lm_head (see
 * lib/layout/block.ts), each cut into pieces of at most a piece size. A pinned prefix of
 * layers (and lm_head, when the plan has room) stays resident; every other block streams
 * through a ring, piece by piece.
 *
 * The forward pass asks for the pieces of layer 0, 1, ..., n-1, then lm_head, then layer 0
 * again for the next call: one fixed cyclic order. It asks for one piece at a time and
 * releases it before asking for the next, so the ring reads ahead in that same order, across
 * pieces, layers and calls, as far as its room allows, and the read of the next pieces runs
 * on the reader threads while the current one computes. No layer and no tensor needs to fit
 * in the ring, only the largest piece does.
 *
 * The ring is one buffer used as a circular byte range: each piece takes only the room of
 * its page-aligned span, so several small pieces can be read ahead in the room of a large
 * one.
 *
 * Where a piece's bytes come from is a {@link TrunkStore}: the shards (one read per tensor
 * or row block, into the block layout) or a pack (a layer is one aligned run, so a piece is
 * one aligned span of it). Either way a piece lands in its block layout, so the model binds
 * it the same way as resident.
 */
import { createHash } from "node:crypto";
import { NativeBuffer } from "../../ffi/native.ts";
import type { PackLayer, TrunkPack } from "../layout/pack.ts";
import { runInvalid } from "../errors.ts";
import { IoClass, type IoPool, type PendingRead, targetIn } from "../io/stream.ts";
import {
  BLOCK_ALIGN,
  type BlockLayout,
  type PiecePart,
  pieceSpan,
  rowBytes,
} from "../layout/block.ts";
import { readPieces } from "./experts.ts";
import { BlockBuffer, type PieceBytes, type TrunkSource } from "./sources.ts";

/** Where each block's bytes come from. */
interface TrunkStore {
  /** One line for the report, e.g. "shards (one read per tensor)". */
  readonly describe: string;
  /**
   * Queues the reads that fill `dst` (page-aligned, `room` bytes) with bytes
   * [spanStart, spanStart + room) of block `b`, of which `parts` must be exact.
   */
  read(
    pool: IoPool,
    block: BlockLayout,
    b: number,
    parts: PiecePart[],
    spanStart: number,
    dst: Deno.PointerObject,
    room: number,
  ): PendingRead[];
  /** The SHA-256 (hex) block `b` must have, when the store knows one. */
  digest?(b: number): string | undefined;
}

/**
 * Bytes of one trunk read job. A running job is never preempted, so an expert batch that
 * arrives waits for at most the jobs already running: small jobs keep that wait short,
 * large enough ones keep the disk at full speed.
 */
const TRUNK_READ_BYTES = 4 << 20;

/**
 * Reads each tensor (or row block of one) from its shard into the block layout. A tensor
 * placed in place (`file` placement) is read as the enclosing page-aligned window of its
 * rows, so the read is O_DIRECT (no page cache copy) where the file system allows it, and a
 * plain read of the same window where not (tmpfs); any other tensor is read exactly.
 */
export class ShardTrunkStore implements TrunkStore {
  readonly describe = "shards (O_DIRECT windows of tensors placed in place, else one read each)";

  read(
    pool: IoPool,
    block: BlockLayout,
    _b: number,
    parts: PiecePart[],
    spanStart: number,
    dst: Deno.PointerObject,
    room: number,
  ): PendingRead[] {
    if (parts.some((p) => p.coded)) throw new Error(`${block.name}: coded pieces come from a pack`);
    return joinRows(parts).map((part): PendingRead[] => {
      const r = block.entries[part.entry].ref, rb = rowBytes(r);
      const n = part.rows * rb;
      const at = block.offsets[part.entry] + part.row0 * rb - spanStart;
      const what = part.rows === (r.shape[0] ?? 1) || r.shape.length < 2
        ? r.name
        : `${r.name} rows ${part.row0}..${part.row0 + part.rows - 1}`;
      const offset = r.offset + part.row0 * rb;
      if (!block.inPlace[part.entry]) {
        return [pool.read(IoClass.trunk, r.file, offset, n, targetIn(dst, at, n, room), what)];
      }
      // In place, file and block offsets agree modulo a page: start at the page below, in
      // jobs of the pack's size (an expert batch waits for at most the running ones).
      const lead = offset % BLOCK_ALIGN, window = at - lead;
      const base = window === 0 ? dst : Deno.UnsafePointer.offset(dst, window)!;
      const jobs = Math.ceil((lead + n) / TRUNK_READ_BYTES);
      return readPieces(
        pool,
        IoClass.trunk,
        r.file,
        offset - lead,
        lead + n,
        base,
        room - window,
        jobs,
        what,
      );
    }).flat();
  }
}

/**
 * Parts with adjacent row ranges of one tensor joined into one (a whole resident block asks
 * for every piece at once): one read instead of several, and no two reads write the page
 * where one row range ends and the next begins.
 */
function joinRows(parts: PiecePart[]): PiecePart[] {
  const out: PiecePart[] = [];
  for (const p of parts) {
    const last = out[out.length - 1];
    if (last && last.entry === p.entry && last.row0 + last.rows === p.row0) {
      out[out.length - 1] = { ...last, rows: last.rows + p.rows };
    } else out.push(p);
  }
  return out;
}

/** Pinned blocks whose reads are queued at once while the resident part loads. */
const PINNED_AHEAD = 2;

/**
 * Reads each layer's piece from a pack as page-aligned O_DIRECT jobs of its one run per
 * layer. lm_head is in a coded pack only, as a run after the layers'; else it comes from its
 * shard.
 */
export class PackTrunkStore implements TrunkStore {
  readonly describe: string;
  #shards = new ShardTrunkStore();

  constructor(readonly pack: TrunkPack) {
    this.describe = `pack ${pack.bin} (O_DIRECT, ${TRUNK_READ_BYTES >> 20} MB jobs)`;
  }

  read(
    pool: IoPool,
    block: BlockLayout,
    b: number,
    parts: PiecePart[],
    spanStart: number,
    dst: Deno.PointerObject,
    room: number,
  ): PendingRead[] {
    const run = this.#run(b);
    if (!run) return this.#shards.read(pool, block, b, parts, spanStart, dst, room);
    const n = Math.min(room, run.bytes - spanStart);
    return readPieces(
      pool,
      IoClass.trunk,
      this.pack.bin,
      run.offset + spanStart,
      n,
      dst,
      room,
      Math.ceil(n / TRUNK_READ_BYTES),
      block.name,
    );
  }

  digest(b: number): string | undefined {
    return this.#run(b)?.sha256;
  }

  /** Block b's run in the pack: a layer's, or lm_head's (the block after the layers). */
  #run(b: number): PackLayer | undefined {
    const layers = this.pack.index.layers;
    return b < layers.length ? layers[b] : b === layers.length ? this.pack.index.head : undefined;
  }
}

/** The trunk plan: what stays resident, and the ring behind it. */
export interface TrunkPlan {
  /** Leading decoder layers kept resident. */
  pinned: number;
  /** lm_head kept resident (else it streams as the last block of the cycle). */
  headResident: boolean;
  /** Ring room in slots of `slotBytes` (0: nothing streams). */
  ringSlots: number;
  /** Room of the largest streamed piece. */
  slotBytes: number;
  /** The piece size the blocks were cut with. */
  pieceBytes: number;
}

/** Counters for the run report. */
export interface TrunkStats {
  /** Seconds the forward pass waited for a piece that was still being read. */
  waitSeconds: number;
  /** Streamed piece reads completed. */
  pieceReads: number;
}

/** A piece in the ring: read, or being read, into its room. */
interface RingEntry {
  b: number;
  p: number;
  /** Byte offset of its room in the ring buffer (a multiple of 4096). */
  offset: number;
  room: number;
  /** Block offset of the first byte of its room. */
  spanStart: number;
  pending: PendingRead[] | null;
  bytes: PieceBytes;
}

/** A layer's SHA-256 being computed piece by piece, on its first streamed pass. */
interface RunningHash {
  hash: ReturnType<typeof createHash>;
  /** Block bytes hashed so far. */
  upTo: number;
}

export class StreamedTrunk implements TrunkSource {
  readonly stats: TrunkStats = { waitSeconds: 0, pieceReads: 0 };
  #resident: (BlockBuffer | null)[];
  #ringBuffer: NativeBuffer | null = null;
  /** Pieces in the ring, oldest first; their rooms follow each other around the buffer. */
  #ring: RingEntry[] = [];
  /** The streamed pieces in the order the forward pass uses them. */
  #sequence: { b: number; p: number }[] = [];
  /** Index into #sequence of the next piece to read ahead. */
  #cursor = 0;
  #verified = new Set<number>();
  #hashes = new Map<number, RunningHash>();

  /**
   * Reads the resident blocks now and allocates the ring (reporting the bytes of each to
   * `onLoaded`), then starts reading the first streamed pieces.
   */
  constructor(
    readonly blocks: BlockLayout[],
    readonly store: TrunkStore,
    readonly pool: IoPool,
    readonly plan: TrunkPlan,
    readonly verify = false,
    onLoaded?: (bytes: number) => void,
  ) {
    const head = blocks.length - 1;
    const resident = (b: number) => b < plan.pinned || (b === head && plan.headResident);
    this.#resident = blocks.map(() => null);
    for (let b = 0; b < blocks.length; b++) {
      if (resident(b)) continue;
      blocks[b].pieces.forEach((_, p) => this.#sequence.push({ b, p }));
    }
    try {
      this.#loadResident(blocks.map((_, b) => b).filter(resident), onLoaded);
      if (this.#sequence.length > 0) {
        const need = Math.max(...this.#sequence.map((s) => this.#room(s.b, s.p).room));
        const bytes = plan.ringSlots * plan.slotBytes;
        if (bytes < need) {
          throw new Error(`the ring (${bytes} bytes) cannot hold a ${need}-byte piece`);
        }
        this.#ringBuffer = NativeBuffer.alloc(bytes);
        onLoaded?.(bytes);
      }
      this.#fill();
    } catch (e) {
      this.close();
      throw e;
    }
  }

  #room(b: number, p: number): { start: number; room: number } {
    return pieceSpan(this.blocks[b].pieces[p]);
  }

  #loadResident(which: number[], onLoaded?: (bytes: number) => void): void {
    // Each block is allocated (pre-faulted) when its reads are queued: a few blocks in flight
    // keep the disk busy without running out of tickets. Progress counts each read as it
    // lands (a tensor, or a row block of at most a piece), so a 2 GB block moves the bar too.
    const buffers: NativeBuffer[] = [];
    const pending: PendingRead[][] = [];
    const queue = (i: number) => {
      if (i >= which.length) return;
      const block = this.blocks[which[i]];
      buffers[i] = NativeBuffer.alloc(block.bytes);
      this.#resident[which[i]] = new BlockBuffer(buffers[i]);
      const parts = block.pieces.flatMap((p) => p.parts);
      pending[i] = this.store.read(
        this.pool,
        block,
        which[i],
        parts,
        0,
        buffers[i].pointer,
        block.bytes,
      );
    };
    try {
      if (which.length > 0) onLoaded?.(0);
      for (let i = 0; i < PINNED_AHEAD; i++) queue(i);
      which.forEach((b, i) => {
        let landed = 0;
        for (const read of pending[i]) {
          this.#waitAll([read]);
          const bytes = read.need.reduce((a, n) => a + n, 0);
          landed += bytes;
          onLoaded?.(bytes);
        }
        const bytes = buffers[i].view(0, this.blocks[b].bytes);
        if (this.#wantsCheck(b)) this.#checkDigest(b, sha256(bytes));
        queue(i + PINNED_AHEAD);
        onLoaded?.(this.blocks[b].bytes - landed); // alignment padding
      });
    } catch (e) {
      // No read may land in a buffer that close() is about to free.
      for (const p of pending.flat()) this.pool.wait(p, false);
      throw e;
    }
  }

  #wantsCheck(b: number): boolean {
    return this.verify && !this.#verified.has(b) && this.store.digest?.(b) !== undefined;
  }

  #checkDigest(b: number, got: string): void {
    const want = this.store.digest!(b)!;
    if (got !== want) {
      throw runInvalid(
        `${this.blocks[b].name} of the pack fails its SHA-256 check (got ${got.slice(0, 16)}..., ` +
          `trunk.json says ${want.slice(0, 16)}...): the pack is corrupted; re-run k3 pack`,
      );
    }
    this.#verified.add(b);
  }

  /** Hashes a streamed piece of a layer on its first pass; checks at the layer's last piece. */
  #hashPiece(e: RingEntry): void {
    if (!this.#wantsCheck(e.b)) return;
    const block = this.blocks[e.b];
    if (e.p === 0) this.#hashes.set(e.b, { hash: createHash("sha256"), upTo: 0 });
    const h = this.#hashes.get(e.b);
    if (!h) return;
    const end = Math.min(e.spanStart + e.room, block.bytes);
    if (e.spanStart > h.upTo) {
      this.#hashes.delete(e.b); // a gap (the stream restarted mid-layer): try on the next pass
      return;
    }
    const view = this.#ringBuffer!.view(e.offset + (h.upTo - e.spanStart), end - h.upTo);
    h.hash.update(view);
    h.upTo = end;
    if (e.p === block.pieces.length - 1) {
      this.#hashes.delete(e.b);
      this.#checkDigest(e.b, h.hash.digest("hex"));
    }
  }

  /** Waits for every read, all of them even when one fails (no read is left landing in a
   * buffer that may be reused), then throws on the first failure. */
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
   * Where `room` bytes can go after the newest entry without overlapping the oldest: right
   * behind the newest, or else at the start of the buffer; -1 when neither has room.
   */
  #place(room: number): number {
    const total = this.#ringBuffer!.bytes;
    if (this.#ring.length === 0) return room <= total ? 0 : -1;
    const oldest = this.#ring[0], newest = this.#ring[this.#ring.length - 1];
    const end = newest.offset + newest.room;
    if (newest.offset >= oldest.offset) {
      // Not wrapped: room behind the newest up to the end, or before the oldest.
      if (end + room <= total) return end;
      return room <= oldest.offset ? 0 : -1;
    }
    return end + room <= oldest.offset ? end : -1;
  }

  /** Starts reads of the next streamed pieces while the ring has room for them. */
  #fill(): void {
    const ring = this.#ringBuffer;
    if (!ring) return;
    for (;;) {
      const { b, p } = this.#sequence[this.#cursor];
      if (this.#ring.some((e) => e.b === b && e.p === p)) return;
      const span = this.#room(b, p);
      const offset = this.#place(span.room);
      if (offset < 0) return;
      this.#cursor = (this.#cursor + 1) % this.#sequence.length;
      const at = (o: number) => offset + o - span.start;
      const entry: RingEntry = {
        b,
        p,
        offset,
        room: span.room,
        spanStart: span.start,
        pending: null,
        bytes: { at: (o) => ring.at(at(o)), view: (o, n) => ring.view(at(o), n) },
      };
      const block = this.blocks[b];
      entry.pending = this.store.read(
        this.pool,
        block,
        b,
        block.pieces[p].parts,
        span.start,
        ring.at(offset),
        span.room,
      );
      this.#ring.push(entry);
      // Offsets are page multiples, so every room starts page-aligned.
      if (offset % BLOCK_ALIGN !== 0) throw new Error("ring room is not page-aligned");
    }
  }

  /** Waits out every read ahead and empties the ring (after an out-of-order request). */
  #drain(): void {
    for (const e of this.#ring) {
      if (e.pending) { for (const p of e.pending) this.pool.wait(p, false); }
    }
    this.#ring = [];
    this.#hashes.clear();
  }

  piece(b: number, p: number): PieceBytes {
    const resident = this.#resident[b];
    if (resident) return resident;
    let entry = this.#ring[0];
    if (!entry || entry.b !== b || entry.p !== p) {
      // Not the piece read ahead (a different access order): restart the schedule there.
      const at = this.#sequence.findIndex((s) => s.b === b && s.p === p);
      if (at < 0) throw new Error(`piece ${p} of ${this.blocks[b]?.name} is not streamed`);
      this.#drain();
      this.#cursor = at;
      this.#fill();
      entry = this.#ring[0];
    }
    if (entry.pending) {
      const t0 = performance.now(), pending = entry.pending;
      entry.pending = null;
      let error: unknown;
      try {
        this.#waitAll(pending);
      } catch (e) {
        error = e;
      }
      this.#landed(entry, t0, error);
    }
    return entry.bytes;
  }

  async ready(b: number, p: number): Promise<void> {
    const entry = this.#ring[0];
    // Anything but the piece read ahead is left to piece() (which restarts the schedule).
    if (this.#resident[b] || !entry || entry.b !== b || entry.p !== p || !entry.pending) return;
    const t0 = performance.now(), pending = entry.pending;
    entry.pending = null;
    let error: unknown;
    for (const read of pending) await this.pool.waitAsync(read).catch((e) => (error ??= e));
    this.#landed(entry, t0, error);
  }

  /**
   * Ends the wait (begun at `t0`) for the ring's first entry, whose reads all finished, the
   * first failure being `error`: counts the piece (and checks its hash), or takes it off the
   * ring and throws.
   */
  #landed(entry: RingEntry, t0: number, error: unknown): void {
    try {
      if (error) throw error;
      this.#arrived(entry);
    } catch (e) {
      this.#ring.shift();
      throw e;
    } finally {
      this.stats.waitSeconds += (performance.now() - t0) / 1000;
    }
  }

  /** Counts a piece whose reads all landed, and hashes it when its layer is checked. */
  #arrived(entry: RingEntry): void {
    this.stats.pieceReads++;
    this.#hashPiece(entry);
  }

  release(b: number, p: number): void {
    if (this.#resident[b]) return;
    const oldest = this.#ring[0];
    if (!oldest || oldest.b !== b || oldest.p !== p || oldest.pending !== null) return;
    this.#ring.shift();
    this.#fill();
  }

  resident(b: number): boolean {
    return this.#resident[b] !== null;
  }

  close(): void {
    this.#drain();
    this.#ringBuffer?.free();
    for (const r of this.#resident) r?.buffer.free();
    this.#ringBuffer = null;
    this.#resident = this.#resident.map(() => null);
  }
}

/** SHA-256 of bytes, hex. */
function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** A trunk source that reports each layer the forward pass starts (prefill progress). */
export class ObservedTrunk implements TrunkSource {
  constructor(readonly inner: TrunkSource, readonly onLayer: (i: number) => void) {}
  get blocks(): BlockLayout[] {
    return this.inner.blocks;
  }
  piece(b: number, p: number): PieceBytes {
    if (p === 0 && b < this.inner.blocks.length - 1) this.onLayer(b);
    return this.inner.piece(b, p);
  }
  release(b: number, p: number): void {
    this.inner.release(b, p);
  }
  resident(b: number): boolean {
    return this.inner.resident(b);
  }
  close(): void {
    this.inner.close();
  }
}
