/**
 * Background reads through libk3's reader pool (csrc/stream.c). `IoPool.read` queues a read
 * and returns at once; `IoPool.wait` blocks until it landed. In between, the caller computes,
 * which is how a layer's read hides under the previous layer's math.
 *
 * A read that is page-aligned at both ends goes through an O_DIRECT descriptor (no page
 * cache copy); anything else through a buffered one. A failed or short read is RUN INVALID.
 */
import { k3 } from "../../ffi/library.ts";
import { runInvalid } from "../errors.ts";
import { errnoText } from "./reader.ts";

const encoder = new TextEncoder();
const PAGE = 4096;

/** Read classes: experts are needed now, trunk layers are prefetched ahead. */
export const IoClass = { trunk: 0, expert: 1 } as const;
export type IoClassValue = (typeof IoClass)[keyof typeof IoClass];

/** Large reads are split so several are in flight at once. */
const CHUNK_BYTES = 16 << 20;

/** One read in flight: its tickets and what it is, for error messages. */
export interface PendingRead {
  tickets: bigint[];
  /** Bytes each ticket must return at least. */
  need: number[];
  what: string;
  file: string;
  offset: number;
}

/** Totals of the pool: seconds with a read of each class in flight, bytes, reads. */
export interface IoTotals {
  trunkSeconds: number;
  expertSeconds: number;
  anySeconds: number;
  trunkBytes: number;
  expertBytes: number;
  trunkReads: number;
  expertReads: number;
}

/** Where a read lands: a pointer and whether it is page-aligned with room to round up. */
interface ReadTarget {
  dst: Deno.PointerObject;
  /** dst is 4096-aligned and has room for the read rounded up to 4096 bytes. */
  aligned: boolean;
}

export class IoPool {
  #pool: Deno.PointerObject | null;
  #direct = new Map<string, number>();
  #buffered = new Map<string, number>();

  /** Starts `workers` reader threads. */
  constructor(readonly workers = 4) {
    this.#pool = k3().k3_io_pool_new(workers);
    if (this.#pool === null) throw new Error("cannot start the reader threads");
  }

  #fd(file: string, direct: boolean): number {
    const fds = direct ? this.#direct : this.#buffered;
    let fd = fds.get(file);
    if (fd === undefined) {
      fd = k3().k3_open_read(encoder.encode(file + "\0"), direct ? 1 : 0);
      if (fd < 0) throw runInvalid(`cannot open ${file} (errno ${-fd})`);
      fds.set(file, fd);
    }
    return fd;
  }

  /** Queues a read of `nbytes` at `offset` of `file` into `target`; returns at once. */
  read(
    klass: IoClassValue,
    file: string,
    offset: number,
    nbytes: number,
    target: ReadTarget,
    what: string,
  ): PendingRead {
    const direct = target.aligned && offset % PAGE === 0;
    const fd = this.#fd(file, direct);
    const span = direct ? Math.ceil(nbytes / PAGE) * PAGE : nbytes;
    const pending: PendingRead = { tickets: [], need: [], what, file, offset };
    const chunk = Math.max(CHUNK_BYTES, Math.ceil(span / 64 / PAGE) * PAGE);
    for (let at = 0; at < span || at === 0; at += chunk) {
      const n = Math.min(chunk, span - at);
      const dst = at === 0 ? target.dst : Deno.UnsafePointer.offset(target.dst, at)!;
      const t = k3().k3_io_submit(this.#pool!, klass, fd, dst, BigInt(offset + at), BigInt(n));
      if (t < 0n) {
        this.wait(pending, false);
        throw runInvalid(
          `cannot queue the read of ${what} from ${file} (${errnoText(Number(-t), n)})`,
        );
      }
      pending.tickets.push(t);
      pending.need.push(Math.max(0, Math.min(n, nbytes - at)));
      if (n === 0) break;
    }
    return pending;
  }

  /** Waits for every part of `p`; throws RUN INVALID on a failed or short part when `check`. */
  wait(p: PendingRead, check = true): void {
    const got = p.tickets.map((t) => Number(k3().k3_io_wait(this.#pool!, t)));
    p.tickets = [];
    this.#check(p, got, check);
  }

  /**
   * As {@link wait}, but a part still being read is waited for off the JS thread, so the event
   * loop turns meanwhile (a server answers while a pass waits for the disk). Nothing else may
   * wait for `p` meanwhile, and the pool must stay open until this resolves.
   */
  async waitAsync(p: PendingRead, check = true): Promise<void> {
    const tickets = p.tickets, got: number[] = [];
    p.tickets = [];
    for (const t of tickets) {
      const done = k3().k3_io_poll(this.#pool!, t) === 1;
      got.push(
        Number(done ? k3().k3_io_wait(this.#pool!, t) : await k3().k3_io_wait_nb(this.#pool!, t)),
      );
    }
    this.#check(p, got, check);
  }

  /** Throws RUN INVALID (when `check`) on the first part that failed or came short. */
  #check(p: PendingRead, got: number[], check: boolean): void {
    const i = got.findIndex((n, i) => n < p.need[i]);
    if (!check || i < 0) return;
    const failure = got[i] < 0
      ? `errno ${-got[i]}`
      : `got ${got[i]} of ${p.need[i]} bytes in part ${i}`;
    throw runInvalid(`read of ${p.what} from ${p.file} at offset ${p.offset} failed (${failure})`);
  }

  /** Whether the read behind `ticket` has finished (never blocks; wait() still collects it). */
  poll(ticket: bigint): boolean {
    return k3().k3_io_poll(this.#pool!, ticket) === 1;
  }

  /** Pool totals so far. */
  totals(): IoTotals {
    const out = new BigInt64Array(7);
    k3().k3_io_stats(this.#pool!, out);
    const n = (i: number) => Number(out[i]);
    return {
      trunkSeconds: n(0) / 1e9,
      expertSeconds: n(1) / 1e9,
      anySeconds: n(2) / 1e9,
      trunkBytes: n(3),
      expertBytes: n(4),
      trunkReads: n(5),
      expertReads: n(6),
    };
  }

  /** Stops the threads (running reads finish first) and closes the files. */
  close(): void {
    if (this.#pool !== null) k3().k3_io_pool_free(this.#pool);
    this.#pool = null;
    for (const fd of [...this.#direct.values(), ...this.#buffered.values()]) k3().k3_close(fd);
    this.#direct.clear();
    this.#buffered.clear();
  }
}

/** The target for `offset` bytes into a page-aligned native block of `room` bytes. */
export function targetIn(
  base: Deno.PointerObject,
  offset: number,
  nbytes: number,
  room: number,
): ReadTarget {
  const dst = offset === 0 ? base : Deno.UnsafePointer.offset(base, offset)!;
  const aligned = offset % PAGE === 0 && offset + Math.ceil(nbytes / PAGE) * PAGE <= room;
  return { dst, aligned };
}
