/**
 * The transfer engine: ranged GETs into a temp file, several at once, resumable after any
 * kill, hashed in order as the pieces land.
 *
 * Each file is cut into pieces (a multiple of 64 bytes, so a SHA-256 state sits on a block
 * boundary between them). Up to `connections` pieces are in flight across all files, taken
 * from the earliest unfinished file first, each on its own file handle at its own offset. A
 * per-file hasher follows the pieces in order, reading each back from disk once it landed.
 * About once a second a progress record is written next to the temp file: after an
 * fsync of the data, the pieces known to be on disk, how far each piece in flight had got,
 * and the SHA-256 state up to the first missing piece. A re-run trusts exactly that record:
 * landed pieces are not fetched again, a piece in flight continues from its recorded bytes,
 * and hashed bytes are not read again; only what arrived after the last record (at most
 * about a second's worth) is fetched again. When the last piece is hashed and the digest matches the Hub's
 * LFS SHA-256 (or the git blob id, for small files), the file is renamed to its final name.
 * A mismatch fetches the file once more, then gives up with exit 4: never a wrong file under
 * its real name.
 */
import { createHash } from "node:crypto";
import { runInvalid } from "../errors.ts";
import { writeAll, writeFileAtomic } from "../io/atomic.ts";
import { checkWritableFile } from "../io/files.ts";
import { hubStatusError } from "./api.ts";
import type { HubToken } from "./endpoint.ts";
import {
  firstLine,
  netFetch,
  type RetryPolicy,
  stallGuard,
  Transient,
  transientStatus,
  withRetries,
} from "./http.ts";
import { Sha256 } from "./sha256.ts";
import type { Job, Target } from "./target.ts";

const RECORD_FORMAT = "k3-partial/1";
const MiB = 1 << 20;
/** Bytes read at a time when hashing a landed piece. */
const HASH_READ = 8 * MiB;
/** Seconds between progress records of one file. */
const CHECKPOINT_EVERY = 1;

interface TransferOptions {
  endpoint: string;
  repo: string;
  commit: string;
  token?: HubToken;
  /** Ranged GETs in flight at once, across all files. */
  connections: number;
  /** Piece size in bytes (a multiple of 64); undefined picks one per file. */
  pieceSize?: number;
  policy: RetryPolicy;
  target: Target;
  /** Per-file events, for --verbose. */
  log?: (line: string) => void;
}

/** Live counters for the progress line. */
export class TransferStats {
  bytesTotal = 0;
  /** Bytes on disk (complete files, landed pieces, partial pieces of this run). */
  bytesDone = 0;
  /** Bytes received in this run. */
  bytesFetched = 0;
  /** Bytes already on disk when this run started (complete files and kept pieces). */
  bytesKept = 0;
  /** Bytes hashed in this run (the rest were hashed by the run that fetched them). */
  bytesHashed = 0;
  filesTotal = 0;
  filesDone = 0;
  /** Files already under their final names when this run started (checked by size only). */
  filesKept = 0;
}

/** What the progress record of a partial file says. */
interface PartialRecord {
  format: typeof RECORD_FORMAT;
  etag: string;
  size: number;
  piece: number;
  /** Landed pieces as "a-b,c-d" (inclusive ranges of piece indices). */
  done: string;
  /** Pieces in flight as "k:bytes,...": the first `bytes` bytes of piece k are on disk. */
  partial?: string;
  /** SHA-256 state over the first `bytes` bytes (LFS files). */
  hash?: { state: string; bytes: number };
}

/** The piece size for a file: about 4 pieces per connection, 1 to 64 MiB. */
export function autoPieceSize(size: number, connections: number): number {
  const want = Math.ceil(size / (4 * connections) / MiB) * MiB;
  return Math.min(64 * MiB, Math.max(MiB, want));
}

function encodeRanges(bits: Uint8Array): string {
  const out: string[] = [];
  for (let i = 0; i < bits.length; i++) {
    if (!bits[i]) continue;
    let j = i;
    while (j + 1 < bits.length && bits[j + 1]) j++;
    out.push(i === j ? `${i}` : `${i}-${j}`);
    i = j;
  }
  return out.join(",");
}

/** "k:bytes,..." of a record: pieces not landed, 0 < bytes < their length; else undefined. */
function decodePartial(
  s: string,
  landed: Uint8Array,
  length: (k: number) => number,
): Map<number, number> | undefined {
  const out = new Map<number, number>();
  if (s === "") return out;
  for (const part of s.split(",")) {
    const m = part.match(/^(\d+):(\d+)$/);
    if (!m) return undefined;
    const k = Number(m[1]), bytes = Number(m[2]);
    if (k >= landed.length || landed[k] || bytes <= 0 || bytes >= length(k) || out.has(k)) {
      return undefined;
    }
    out.set(k, bytes);
  }
  return out;
}

function decodeRanges(s: string, n: number): Uint8Array<ArrayBuffer> | undefined {
  const bits = new Uint8Array(n);
  if (s === "") return bits;
  for (const part of s.split(",")) {
    const m = part.match(/^(\d+)(?:-(\d+))?$/);
    if (!m) return undefined;
    const a = Number(m[1]), b = Number(m[2] ?? m[1]);
    if (a > b || b >= n) return undefined;
    bits.fill(1, a, b + 1);
  }
  return bits;
}

/** Reads exactly `buf.length` bytes at `offset` (short only at end of file). */
async function readAt(file: Deno.FsFile, buf: Uint8Array, offset: number): Promise<number> {
  await file.seek(offset, Deno.SeekMode.Start);
  let got = 0;
  while (got < buf.length) {
    const n = await file.read(buf.subarray(got));
    if (n === null) break;
    got += n;
  }
  return got;
}

/**
 * The absolute URL of a redirect's Location, which must be http(s): fetch would read a `file:`
 * URL from the local disk and a `data:` URL from the header itself, neither of them the Hub's.
 * @throws K3Error (exit 4) naming the Location
 */
function followable(location: string, from: string, name: string): string {
  let url: URL;
  try {
    url = new URL(location, from);
  } catch {
    throw runInvalid(`the Hub redirected ${name} to '${location}', which is not a URL`);
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    throw runInvalid(
      `the Hub redirected ${name} to '${location.slice(0, 200)}'; k3 follows http(s) ` +
        `redirects only`,
    );
  }
  return url.href;
}

/** Where the bytes of a file come from, once resolved. */
interface Source {
  url: string;
  host: string;
  /** The URL is on the Hub itself: it gets the token, and its 4xx are final. */
  hub: boolean;
}

/** One file's download. */
class FileTask {
  readonly name: string;
  readonly partial: string;
  readonly record: string;
  piece = 0;
  count = 0;
  landed = new Uint8Array(0);
  assigned = new Uint8Array(0);
  /** Pieces not landed whose first bytes are on disk: piece index -> bytes from its start. */
  readonly partialBytes = new Map<number, number>();
  complete = false;
  started?: Promise<void>;
  finished?: Promise<void>;
  #next = 0;
  #frontier = 0;
  #sha?: Sha256;
  #hashSaved?: { state: string; bytes: number };
  #mismatches = 0;
  #dirty = false;
  #lastCheckpoint = -Infinity;
  #checkpointing: Promise<void> = Promise.resolve();
  #source?: Promise<Source>;
  #wake?: () => void;

  constructor(readonly job: Job, readonly t: Transfer) {
    this.name = job.paths[0];
    this.partial = t.opts.target.partialPath(job);
    this.record = `${this.partial}.json`;
  }

  /** Reads what is on disk: complete, or the pieces and hash state a record vouches for. */
  async load(): Promise<void> {
    if (await this.t.opts.target.isComplete(this.job)) {
      this.complete = true;
      return;
    }
    // Both are opened below (read, then written): a FIFO there would block either open.
    await checkWritableFile(this.record, "the progress record");
    await checkWritableFile(this.partial, "the partial file");
    const rec = await this.#readRecord();
    const piece = rec?.piece ?? this.t.opts.pieceSize ??
      autoPieceSize(this.job.size, this.t.opts.connections);
    this.#reset(piece);
    if (!rec) return;
    const landed = decodeRanges(rec.done, this.count);
    let sha: Sha256 | null = this.job.sha256 ? Sha256.fresh() : null;
    let frontier = 0;
    if (this.job.sha256 && rec.hash) {
      sha = Sha256.resume(rec.hash);
      frontier = sha ? sha.bytes / piece : -1;
    }
    const hashedOk = landed !== undefined && Number.isInteger(frontier) && frontier >= 0 &&
      frontier <= this.count && landed.subarray(0, frontier).every((b) => b === 1);
    if (!landed || !hashedOk || (this.job.sha256 && !sha)) {
      this.t.log(`${this.name}: its progress record is unusable; starting this file over`);
      return;
    }
    const partial = decodePartial(rec.partial ?? "", landed, (k) => this.pieceLength(k));
    if (!partial) {
      this.t.log(`${this.name}: its progress record is unusable; starting this file over`);
      return;
    }
    this.landed = landed;
    partial.forEach((bytes, k) => this.partialBytes.set(k, bytes));
    this.#frontier = frontier;
    if (sha) this.#sha = sha;
    this.#hashSaved = rec.hash;
    const kept = this.#keptBytes();
    this.t.stats.bytesDone += kept;
    this.t.stats.bytesKept += kept;
    this.t.log(
      `${this.name}: resuming with ${fmt(kept)} of ${fmt(this.job.size)} on disk` +
        (this.job.sha256 ? `, hashed to ${fmt(frontier * piece)}` : ""),
    );
  }

  async #readRecord(): Promise<PartialRecord | undefined> {
    let rec: PartialRecord;
    try {
      rec = JSON.parse(await Deno.readTextFile(this.record));
      const st = await Deno.stat(this.partial);
      if (st.size !== this.job.size) return undefined;
    } catch {
      return undefined;
    }
    const ok = rec?.format === RECORD_FORMAT && rec.etag === this.job.etag &&
      rec.size === this.job.size && Number.isSafeInteger(rec.piece) && rec.piece >= 64 &&
      rec.piece % 64 === 0 && typeof rec.done === "string";
    return ok ? rec : undefined;
  }

  #reset(piece: number): void {
    this.piece = piece;
    this.count = Math.ceil(this.job.size / piece);
    this.landed = new Uint8Array(this.count);
    this.assigned = new Uint8Array(this.count);
    this.partialBytes.clear();
    this.#next = 0;
    this.#frontier = 0;
    this.#sha = this.job.sha256 ? Sha256.fresh() : undefined;
    this.#hashSaved = this.#sha?.saved();
  }

  /** Bytes on disk that the next fetches keep: landed pieces and the starts of others. */
  #keptBytes(): number {
    let n = 0;
    for (let k = 0; k < this.count; k++) if (this.landed[k]) n += this.pieceLength(k);
    for (const bytes of this.partialBytes.values()) n += bytes;
    return n;
  }

  pieceLength(k: number): number {
    return Math.min(this.job.size, (k + 1) * this.piece) - k * this.piece;
  }

  /** Makes the temp file (sparse, full size) if needed and starts the hasher. */
  start(): Promise<void> {
    this.started ??= (async () => {
      if (this.#keptBytes() === 0) {
        await Deno.mkdir(this.t.opts.target.partialDir, { recursive: true });
        const f = await Deno.open(this.partial, { write: true, create: true, truncate: true });
        await f.truncate(this.job.size);
        f.close();
      }
      this.finished = this.#hashLoop();
      this.finished.catch((e) => this.t.fail(e));
    })();
    return this.started;
  }

  /** The next piece nobody is fetching and that is not on disk, or undefined. */
  takePiece(): number | undefined {
    while (this.#next < this.count && (this.landed[this.#next] || this.assigned[this.#next])) {
      this.#next++;
    }
    if (this.#next >= this.count) return undefined;
    this.assigned[this.#next] = 1;
    return this.#next++;
  }

  /** The first `bytes` bytes of piece k are on disk (durable at the next checkpoint). */
  pieceProgress(k: number, bytes: number): void {
    this.partialBytes.set(k, bytes);
    this.#dirty = true;
    this.checkpoint(false).catch(() => {});
  }

  /** A piece is on disk (not yet durable: the next checkpoint fsyncs it). */
  pieceLanded(k: number): void {
    this.landed[k] = 1;
    this.partialBytes.delete(k);
    this.#dirty = true;
    this.wakeHasher();
    this.checkpoint(false).catch(() => {});
  }

  /** A piece failed for good in this run; it stays missing. */
  pieceDropped(k: number): void {
    this.assigned[k] = 0;
    if (k < this.#next) this.#next = k;
  }

  /** Writes the progress record (at most once a second unless forced), after an fsync. */
  checkpoint(force: boolean): Promise<void> {
    const now = performance.now() / 1000;
    if (
      this.complete || !this.#dirty || (!force && now - this.#lastCheckpoint < CHECKPOINT_EVERY)
    ) {
      return this.#checkpointing;
    }
    this.#lastCheckpoint = now;
    this.#checkpointing = this.#checkpointing.then(async () => {
      if (this.complete || !this.#dirty) return;
      this.#dirty = false;
      // What the record will claim, taken before the fsync that makes it true.
      const rec: PartialRecord = {
        format: RECORD_FORMAT,
        etag: this.job.etag,
        size: this.job.size,
        piece: this.piece,
        done: encodeRanges(this.landed),
        partial: [...this.partialBytes].map(([k, bytes]) => `${k}:${bytes}`).join(","),
        hash: this.#hashSaved,
      };
      const f = await Deno.open(this.partial, { write: true });
      try {
        await f.syncData();
      } finally {
        f.close();
      }
      await writeFileAtomic(this.record, JSON.stringify(rec) + "\n");
    });
    return this.#checkpointing;
  }

  /** Hashes pieces in order as they land; places the file when the digest matches. */
  async #hashLoop(): Promise<void> {
    const file = await Deno.open(this.partial, { read: true });
    let digest: string;
    try {
      digest = this.job.sha256 ? await this.#sha256(file) : await this.#gitOid(file);
    } finally {
      file.close();
    }
    const want = this.job.sha256 ?? this.job.gitOid!;
    if (digest !== want) return await this.#mismatch(digest, want);
    await this.#checkpointing;
    this.complete = true;
    // The bytes are durable before the name says the file is complete (temp, fsync, rename).
    const data = await Deno.open(this.partial, { write: true });
    try {
      await data.syncData();
    } finally {
      data.close();
    }
    await this.t.opts.target.place(this.job, this.partial);
    await Deno.remove(this.record).catch(() => {});
    this.t.stats.filesDone++;
    this.t.log(`${this.name}: ${fmt(this.job.size)} ${this.job.sha256 ? "sha256" : "git"} ok`);
    this.t.changed();
  }

  async #waitLanded(k: number): Promise<void> {
    while (!this.landed[k]) {
      this.t.signal.throwIfAborted();
      await new Promise<void>((resolve) => this.#wake = resolve);
    }
  }

  /** Lets a waiting hasher look again (a piece landed, or the run stopped). */
  wakeHasher(): void {
    this.#wake?.();
  }

  async #sha256(file: Deno.FsFile): Promise<string> {
    const buf = new Uint8Array(Math.min(HASH_READ, Math.max(64, this.piece)));
    let tail = new Uint8Array(0);
    for (; this.#frontier < this.count; this.#frontier++) {
      const k = this.#frontier;
      await this.#waitLanded(k);
      const end = k * this.piece + this.pieceLength(k);
      for (let at = k * this.piece; at < end;) {
        const n = await readAt(file, buf.subarray(0, Math.min(buf.length, end - at)), at);
        if (n !== Math.min(buf.length, end - at)) {
          throw runInvalid(`${this.partial} came back short while hashing`);
        }
        const whole = n - (n % 64);
        await this.#sha!.update(buf.subarray(0, whole));
        if (whole < n) tail = buf.slice(whole, n); // only the file's last bytes
        at += n;
        this.t.stats.bytesHashed += n;
      }
      if (k + 1 < this.count) this.#hashSaved = this.#sha!.saved();
    }
    return this.#sha!.digest(tail);
  }

  /** The git blob id (the Hub's ETag of a non-LFS file): sha1("blob N\0" + bytes). */
  async #gitOid(file: Deno.FsFile): Promise<string> {
    for (let k = 0; k < this.count; k++) await this.#waitLanded(k);
    const h = createHash("sha1").update(`blob ${this.job.size}\0`);
    const buf = new Uint8Array(Math.min(HASH_READ, Math.max(1, this.job.size)));
    for (let at = 0; at < this.job.size;) {
      const n = await readAt(file, buf.subarray(0, Math.min(buf.length, this.job.size - at)), at);
      if (n === 0) throw runInvalid(`${this.partial} came back short while hashing`);
      h.update(buf.subarray(0, n));
      at += n;
      this.t.stats.bytesHashed += n;
    }
    return h.digest("hex");
  }

  async #mismatch(got: string, want: string): Promise<void> {
    this.#mismatches++;
    const what = `${this.name}: the downloaded bytes hash to ${got.slice(0, 12)}..., the Hub ` +
      `lists ${want.slice(0, 12)}...`;
    this.t.stats.bytesDone -= this.job.size;
    if (this.#mismatches >= 2) {
      await Deno.remove(this.partial).catch(() => {});
      await Deno.remove(this.record).catch(() => {});
      throw runInvalid(
        `${what} (twice): the Hub or something on the way serves wrong bytes. The bad copy ` +
          `was deleted; the other files are kept. Re-run the same command to try again.`,
      );
    }
    this.t.log(`${what}; fetching it again`);
    await Deno.remove(this.record).catch(() => {});
    this.#reset(this.piece);
    const f = await Deno.open(this.partial, { write: true, truncate: true });
    await f.truncate(this.job.size);
    f.close();
    this.#dirty = false;
    this.t.changed();
    return this.#hashLoop();
  }

  /** Where this file's bytes are fetched from (resolved once, again after a failure). */
  source(): Promise<Source> {
    this.#source ??= this.t.resolve(this).catch((e) => {
      this.#source = undefined;
      throw e;
    });
    return this.#source;
  }

  /** The storage link stopped working (expired): resolve it again next time. */
  forgetSource(): void {
    this.#source = undefined;
  }
}

/** One run of a download: the tasks, the workers and the shared stop signal. */
class Transfer {
  readonly stats = new TransferStats();
  readonly tasks: FileTask[];
  readonly #abort = new AbortController();
  readonly signal = this.#abort.signal;
  readonly #hubOrigin: string;
  readonly policy: RetryPolicy;
  #waiters: (() => void)[] = [];

  constructor(readonly opts: TransferOptions, jobs: Job[]) {
    this.tasks = jobs.map((j) => new FileTask(j, this));
    this.#hubOrigin = new URL(opts.endpoint).origin;
    const outer = opts.policy.signal;
    outer?.addEventListener("abort", () => this.stop(outer.reason), { once: true });
    this.policy = { ...opts.policy, signal: this.signal };
    this.signal.addEventListener("abort", () => {
      this.changed();
      this.tasks.forEach((task) => task.wakeHasher());
    }, { once: true });
  }

  /** The first failure stops the run; later ones (mostly its echoes) are dropped. */
  failure: unknown;
  fail(e: unknown): void {
    this.failure ??= e;
    this.stop(e);
  }

  log(line: string): void {
    this.opts.log?.(line);
  }

  stop(reason: unknown): void {
    if (!this.signal.aborted) this.#abort.abort(reason);
  }

  /** Wakes workers waiting for work (a file finished, restarted, or the run stopped). */
  changed(): void {
    const w = this.#waiters;
    this.#waiters = [];
    w.forEach((f) => f());
  }

  /** The next piece to fetch, or null when every file is done. */
  async next(): Promise<{ task: FileTask; k: number } | null> {
    for (;;) {
      this.signal.throwIfAborted();
      let pending = false;
      for (const task of this.tasks) {
        if (task.complete) continue;
        pending = true;
        await task.start();
        const k = task.takePiece();
        if (k !== undefined) return { task, k };
      }
      if (!pending) return null;
      // The run may have stopped while this loop awaited a start: its wake-up is gone.
      this.signal.throwIfAborted();
      await new Promise<void>((resolve) => this.#waiters.push(resolve));
    }
  }

  async worker(): Promise<void> {
    for (;;) {
      const next = await this.next();
      if (!next) return;
      try {
        await this.fetchPiece(next.task, next.k);
      } catch (e) {
        next.task.pieceDropped(next.k);
        throw e;
      }
    }
  }

  /** Resolves a file's URL on the Hub: follows its redirects (no token off the Hub). */
  async resolve(task: FileTask): Promise<Source> {
    const { endpoint, repo, commit, token } = this.opts;
    const file = task.job.paths[0].split("/").map(encodeURIComponent).join("/");
    let url = `${endpoint}/${repo}/resolve/${commit}/${file}`;
    for (let hop = 0; hop < 8; hop++) {
      const u = new URL(url);
      const hub = u.origin === this.#hubOrigin;
      const headers: Record<string, string> = {};
      if (hub && token) headers.authorization = `Bearer ${token.value}`;
      const res = transientStatus(
        await netFetch(
          url,
          { method: "HEAD", redirect: "manual", headers, signal: this.signal },
          u.host,
          this.policy.stallTimeout,
        ),
        u.host,
      );
      if (hub && res.status >= 400 && res.status < 500) {
        throw hubStatusError(this.opts, res.status, repo, commit, task.name);
      }
      this.#checkResolveHeaders(task, res);
      if (res.status >= 300 && res.status < 400) {
        const location = res.headers.get("location");
        if (!location) throw runInvalid(`the Hub redirected ${task.name} without a Location`);
        url = followable(location, url, task.name);
        if (new URL(url).origin !== this.#hubOrigin) {
          return { url, host: new URL(url).host, hub: false };
        }
        continue;
      }
      if (res.status === 200) return { url, host: u.host, hub };
      throw runInvalid(`resolving ${task.name} on ${u.host} gave HTTP ${res.status}`);
    }
    throw runInvalid(`resolving ${task.name}: more than 8 redirects`);
  }

  #checkResolveHeaders(task: FileTask, res: Response): void {
    const commit = res.headers.get("x-repo-commit");
    if (commit && commit !== this.opts.commit) {
      throw runInvalid(
        `the Hub serves ${task.name} from commit ${commit}, not the recorded ${this.opts.commit}`,
      );
    }
    const size = res.headers.get("x-linked-size");
    if (size && Number(size) !== task.job.size) {
      throw runInvalid(
        `the Hub says ${task.name} has ${size} bytes; the file list says ${task.job.size}`,
      );
    }
    // LFS files: X-Linked-Etag is the SHA-256. Small files served by the Hub: ETag is the
    // git blob id.
    const raw = task.job.sha256
      ? res.headers.get("x-linked-etag")
      : res.headers.get("x-linked-etag") ?? (res.status === 200 ? res.headers.get("etag") : null);
    const etag = raw?.replace(/^W\//, "").replace(/"/g, "");
    if (etag && etag !== task.job.etag) {
      throw runInvalid(
        `the Hub's ETag for ${task.name} is ${etag}; the file list says ${task.job.etag}`,
      );
    }
  }

  /** Fetches piece k of a file into its temp file; retried until the policy gives up. */
  async fetchPiece(task: FileTask, k: number): Promise<void> {
    const start = k * task.piece, end = start + task.pieceLength(k);
    // A piece an earlier run (or attempt) got partway through continues where it stopped.
    let got = task.partialBytes.get(k) ?? 0;
    await withRetries(`${task.name} bytes ${start}-${end - 1}`, this.policy, async (progress) => {
      const src = await task.source();
      const guard = stallGuard(this.policy.stallTimeout, this.signal);
      let out: Deno.FsFile | undefined;
      try {
        const headers: Record<string, string> = { range: `bytes=${start + got}-${end - 1}` };
        if (src.hub && this.opts.token) headers.authorization = `Bearer ${this.opts.token.value}`;
        const res = await netFetch(src.url, { headers, signal: guard.signal }, src.host);
        if (!src.hub && [401, 403, 404, 410].includes(res.status)) {
          // Signed storage links expire: resolve the file again (bounded like any retry).
          await res.body?.cancel();
          task.forgetSource();
          throw new Transient(`HTTP ${res.status} from ${src.host} (link expired?)`);
        }
        transientStatus(res, src.host);
        if (src.hub && res.status >= 400 && res.status < 500) {
          await res.body?.cancel();
          throw hubStatusError(this.opts, res.status, this.opts.repo, this.opts.commit, task.name);
        }
        this.#checkRange(task, res, start + got, end, src.host);
        out = await Deno.open(task.partial, { write: true });
        await out.seek(start + got, Deno.SeekMode.Start);
        const reader = res.body!.getReader();
        while (got < end - start) {
          let r: ReadableStreamReadResult<Uint8Array>;
          try {
            r = await reader.read();
          } catch (e) {
            if (this.signal.aborted) throw this.signal.reason;
            if (guard.stalled) {
              throw new Transient(
                `${src.host} stalled (no data for ${this.policy.stallTimeout} s)`,
              );
            }
            throw new Transient(`connection to ${src.host} dropped mid-body (${firstLine(e)})`);
          }
          if (r.done) break;
          guard.kick();
          const chunk = r.value.subarray(0, end - start - got);
          await writeAll(out, chunk);
          got += chunk.length;
          this.stats.bytesDone += chunk.length;
          this.stats.bytesFetched += chunk.length;
          if (got < end - start) task.pieceProgress(k, got);
          progress();
        }
        if (got < end - start) {
          throw new Transient(`the body from ${src.host} ended ${end - start - got} bytes early`);
        }
        await reader.cancel().catch(() => {});
      } finally {
        guard.done();
        out?.close();
      }
    });
    task.pieceLanded(k);
  }

  #checkRange(task: FileTask, res: Response, from: number, end: number, host: string): void {
    const want = `bytes ${from}-${end - 1}/${task.job.size}`;
    if (res.status === 206) {
      const got = res.headers.get("content-range")?.trim();
      if (got === want) return;
      res.body?.cancel().catch(() => {});
      throw runInvalid(`${host} sent '${got}' for ${task.name}; asked for ${want}`);
    }
    if (res.status === 200 && from === 0 && end === task.job.size) return;
    res.body?.cancel().catch(() => {});
    throw runInvalid(
      res.status === 200
        ? `${host} ignores Range requests (HTTP 200 for ${want} of ${task.name})`
        : `${host} answered HTTP ${res.status} for ${want} of ${task.name}`,
    );
  }
}

/** The transfer of `jobs` after {@link prepare}: runs until done, or throws (exit 2/4/130). */
export interface PreparedTransfer {
  stats: TransferStats;
  /** Bytes still to fetch (for the free-space check). */
  missing: number;
  run(): Promise<void>;
}

/** Loads what is on disk for every job (complete files, progress records). */
export async function prepare(opts: TransferOptions, jobs: Job[]): Promise<PreparedTransfer> {
  const t = new Transfer(opts, jobs);
  // Temps a killed run left (a progress record half replaced) are not data: gone first.
  const swept = await opts.target.sweep();
  if (swept > 0) opts.log?.(`removed ${swept} temp file(s) an interrupted run left behind`);
  for (const task of t.tasks) {
    await task.load();
    t.stats.bytesTotal += task.job.size;
    t.stats.filesTotal++;
    if (task.complete) {
      t.stats.bytesDone += task.job.size;
      t.stats.bytesKept += task.job.size;
      t.stats.filesDone++;
      t.stats.filesKept++;
    }
  }
  return {
    stats: t.stats,
    missing: t.stats.bytesTotal - t.stats.bytesDone,
    run: () => runTransfer(t),
  };
}

async function runTransfer(t: Transfer): Promise<void> {
  const workers = Array.from({ length: t.opts.connections }, () => t.worker());
  workers.forEach((w) => w.catch((e) => t.fail(e)));
  await Promise.allSettled(workers);
  // Workers return only when every file is placed, or when the run stopped: then the hashers
  // wake, see the stop, and what is on disk is recorded for the next run.
  for (const task of t.tasks) {
    if (!task.started) continue;
    await task.started;
    await task.finished?.catch(() => {});
    if (!task.complete) await task.checkpoint(true).catch(() => {});
  }
  // Every write of this run has ended (placed, or recorded above): no temp of ours is live.
  await t.opts.target.sweep();
  if (t.failure !== undefined) throw t.failure;
}

function fmt(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)} MB`;
  return `${(n / 1e3).toFixed(1)} kB`;
}
