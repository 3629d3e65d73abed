/**
 * Files the user keeps are replaced atomically: write a temp file in the same directory,
 * fsync it, rename it over the target, fsync the directory. A crash leaves the old file or
 * the new one, never half of either.
 */
import { statfs } from "node:fs/promises";
import * as path from "node:path";
import process from "node:process";
import { badInput, K3Error } from "../errors.ts";
import { formatSize } from "./files.ts";

/** Writes all of `data` to `file` at its current position. */
export async function writeAll(file: Deno.FsFile, data: Uint8Array): Promise<void> {
  for (let done = 0; done < data.length;) done += await file.write(data.subarray(done));
}

/**
 * Replaces `file` atomically with what `fill` writes into the temp file. An OS error (a full
 * or read-only disk, a missing folder) removes the temp file and throws exit 2 naming `file`.
 */
export async function writeAtomically(
  file: string,
  fill: (out: Deno.FsFile) => Promise<void>,
): Promise<void> {
  const tmp = path.join(
    path.dirname(file),
    `.${path.basename(file)}.${Deno.pid}.${crypto.randomUUID().slice(0, 8)}.tmp`,
  );
  let out: Deno.FsFile;
  try {
    out = await Deno.open(tmp, { write: true, createNew: true });
  } catch (e) {
    throw writeFailure(file, e);
  }
  try {
    await fill(out);
    await out.sync();
  } catch (e) {
    out.close();
    await Deno.remove(tmp).catch(() => {});
    throw writeFailure(file, e);
  }
  out.close();
  try {
    await Deno.rename(tmp, file);
  } catch (e) {
    await Deno.remove(tmp).catch(() => {});
    throw writeFailure(file, e);
  }
  await syncDir(path.dirname(file));
}

/** The temp file {@link writeAtomically} writes for a file: `.NAME.PID.XXXXXXXX.tmp`. */
const TEMP_NAME = /^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$/;

/** True when a process with this id runs (ours included). */
function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM";
  }
}

/**
 * Removes the temp files {@link writeAtomically} left in `dir` when its process was killed
 * between writing and renaming (SIGKILL, power loss): files named like its temps whose process
 * is gone, and this process's own (call it when no write of ours is in flight there). Another
 * running process's temp is left alone: it may be about to rename it. Best effort.
 * @returns the names removed
 */
export async function sweepTempFiles(dir: string): Promise<string[]> {
  const removed: string[] = [];
  let entries: Deno.DirEntry[];
  try {
    entries = await Array.fromAsync(Deno.readDir(dir));
  } catch {
    return removed; // no folder, no temps
  }
  for (const e of entries) {
    const pid = Number(TEMP_NAME.exec(e.name)?.[1] ?? NaN);
    if (!e.isFile || !Number.isSafeInteger(pid)) continue;
    if (pid !== Deno.pid && processAlive(pid)) continue;
    try {
      await Deno.remove(path.join(dir, e.name));
      removed.push(e.name);
    } catch {
      // Gone already, or not ours to remove: nothing to do.
    }
  }
  return removed;
}

/** Replaces `file` atomically with `data`. */
export function writeFileAtomic(file: string, data: Uint8Array | string): Promise<void> {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  return writeAtomically(file, (out) => writeAll(out, bytes));
}

/** fsyncs a directory so a rename inside it is durable (best effort where unsupported). */
export async function syncDir(dir: string): Promise<void> {
  try {
    const d = await Deno.open(dir, { read: true });
    try {
      await d.sync();
    } finally {
      d.close();
    }
  } catch {
    // Some file systems refuse fsync on directories; the rename itself is still atomic.
  }
}

/** True for an error the OS reported (ENOSPC, EACCES, EROFS, EISDIR...), not a bug in k3. */
function isOsError(e: unknown): boolean {
  return e instanceof Error &&
    (typeof (e as { code?: unknown }).code === "string" ||
      Object.values(Deno.errors).some((kind) => e instanceof kind));
}

/**
 * A failed write of `file` as the user should see it: exit 2 naming the path and the OS
 * error (ENOSPC, EACCES, EROFS, EISDIR...), never a stack trace. K3Errors, and errors that
 * are not the OS's (bugs, exit 1), pass through unchanged.
 */
export function writeFailure(file: string, e: unknown): Error {
  if (e instanceof K3Error || !isOsError(e)) return e as Error;
  return badInput(`cannot write ${file}: ${(e as Error).message}`, { cause: e });
}

/**
 * Checks, before a long run, that `file` can be written the way {@link writeAtomically}
 * writes it, so that a missing folder, a directory in the way, a read-only or a full file
 * system is exit 2 before the run rather than a lost run after it: the folder must exist and
 * take a new file (a probe of a few KB is written and removed there), `file` must not be
 * anything but a regular file, and with `bytes` the file system must have that much free.
 * @param flag the option that named `file`, for messages ("--out")
 * @throws K3Error (exit 2) naming the option, the path and the OS error
 */
export async function checkWritable(file: string, flag: string, bytes = 0): Promise<void> {
  const fail = (why: string, cause?: unknown) =>
    badInput(`${flag} ${file}: ${why}; nothing was run`, { cause });
  const info = await Deno.stat(file).catch((e) => e instanceof Deno.errors.NotFound ? null : e);
  if (info instanceof Error) throw fail(`cannot write it (${info.message})`, info);
  if (info && !info.isFile) {
    throw fail(
      `${info.isDirectory ? "is a directory" : "is not a regular file"}; give a file name`,
    );
  }
  await probeFolder(path.dirname(path.resolve(file)), bytes, fail);
}

/**
 * {@link checkWritable} for a folder that a file will be written into (created if absent):
 * the folder, or the nearest existing one above it, must be a directory that takes a file.
 */
export async function checkWritableDir(dir: string, flag: string): Promise<void> {
  const fail = (why: string, cause?: unknown) =>
    badInput(`${flag} ${dir}: ${why}; nothing was run`, { cause });
  let at = path.resolve(dir);
  for (;;) {
    const info = await Deno.stat(at).catch(() => null);
    if (info) {
      if (!info.isDirectory) throw fail(`${at} is not a directory`);
      return await probeFolder(at, 0, fail);
    }
    const up = path.dirname(at);
    if (up === at) throw fail("no folder of it exists");
    at = up;
  }
}

/** Size of the file written and removed to prove a folder takes new data. */
const PROBE_BYTES = 64 << 10;

async function probeFolder(
  dir: string,
  bytes: number,
  fail: (why: string, cause?: unknown) => K3Error,
): Promise<void> {
  const info = await Deno.stat(dir).catch(() => null);
  if (!info) throw fail(`the folder ${dir} does not exist`);
  if (!info.isDirectory) throw fail(`${dir} is not a folder`);
  const probe = path.join(dir, `.k3-write-probe.${Deno.pid}.${crypto.randomUUID().slice(0, 8)}`);
  try {
    const out = await Deno.open(probe, { write: true, createNew: true });
    try {
      await writeAll(out, new Uint8Array(PROBE_BYTES));
    } finally {
      out.close();
    }
  } catch (e) {
    throw fail(`cannot write in ${dir} (${(e as Error).message})`, e);
  } finally {
    await Deno.remove(probe).catch(() => {});
  }
  if (bytes > 0) {
    const fs = await statfs(dir).catch(() => null);
    const free = fs ? fs.bavail * fs.bsize : Infinity;
    if (free < bytes) {
      throw fail(
        `it needs ${formatSize(bytes)}, but the file system of ${dir} has ${formatSize(free)} free`,
      );
    }
  }
}
