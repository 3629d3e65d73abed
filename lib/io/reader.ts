/**
 * Exact reads of checkpoint bytes into native memory. A failed or short read throws
 * RUN INVALID (exit 4): a read that did not complete never becomes a token.
 */
import { k3 } from "../../ffi/library.ts";
import { runInvalid } from "../errors.ts";

const encoder = new TextEncoder();

const EFAULT = 14;

/** What a negative result of a libk3 read means, for an error message. */
export function errnoText(errno: number, nbytes: number): string {
  if (errno === EFAULT) {
    return `libk3 refused it: ${nbytes} bytes do not fit the buffer they were to land in ` +
      `(a bug in k3, caught before any byte was written; please report)`;
  }
  return `errno ${errno}`;
}

/** Byte and time counters, for the run report. */
interface ReadStats {
  bytes: number;
  seconds: number;
  reads: number;
}

/** Keeps one read-only descriptor per file and reads byte ranges into native memory. */
export class FileReader {
  #fds = new Map<string, number>();
  readonly stats: ReadStats = { bytes: 0, seconds: 0, reads: 0 };

  constructor(readonly direct = false) {}

  /** The descriptor for `file`, opened on first use. */
  fd(file: string): number {
    let fd = this.#fds.get(file);
    if (fd === undefined) {
      fd = k3().k3_open_read(encoder.encode(file + "\0"), this.direct ? 1 : 0);
      if (fd < 0) throw runInvalid(`cannot open ${file} (errno ${-fd})`);
      this.#fds.set(file, fd);
    }
    return fd;
  }

  /** Reads exactly `nbytes` at `offset` of `file` into `dst`; `what` names it in errors. */
  read(file: string, offset: number, nbytes: number, dst: Deno.PointerObject, what: string): void {
    const t0 = performance.now();
    const got = Number(k3().k3_pread_full(this.fd(file), dst, BigInt(offset), BigInt(nbytes)));
    if (got !== nbytes) {
      const why = got < 0 ? errnoText(-got, nbytes) : `got ${got} of ${nbytes} bytes`;
      throw runInvalid(`read of ${what} from ${file} at offset ${offset} failed (${why})`);
    }
    this.stats.bytes += nbytes;
    this.stats.reads++;
    this.stats.seconds += (performance.now() - t0) / 1000;
  }

  /** Closes every descriptor. */
  close(): void {
    for (const fd of this.#fds.values()) k3().k3_close(fd);
    this.#fds.clear();
  }
}
