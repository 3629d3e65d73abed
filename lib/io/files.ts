/**
 * Files the user names (tokenizer files, chat histories, prompt files, state and trace files)
 * are read only when they are regular files of a size k3 expects. A FIFO, a device such as
 * /dev/zero, a socket or a directory is named as what it is and never opened for reading, so
 * nothing can hang or fill memory; a symlink loop is named as one; a file over its limit is
 * refused before it is read. Every refusal is bad input (exit 2) naming the file.
 */
import { constants } from "node:fs";
import * as fsSync from "node:fs";
import * as fs from "node:fs/promises";
import { badInput, K3Error } from "../errors.ts";

/** "a directory", "a FIFO (named pipe)", ... for anything that is not a regular file. */
export function kindOf(info: Deno.FileInfo): string | null {
  if (info.isFile) return null;
  if (info.isDirectory) return "a directory";
  if (info.isFifo) return "a FIFO (named pipe)";
  if (info.isSocket) return "a socket";
  if (info.isCharDevice) return "a character device";
  if (info.isBlockDevice) return "a block device";
  return "not a regular file";
}

/** Why a stat, realpath or open failed, as the end of a sentence ("does not exist", ...). */
export function osReason(e: unknown): string {
  const code = (e as { code?: string }).code;
  if (code === "ENOENT") return "does not exist";
  if (code === "ELOOP") {
    return "is a symlink loop (following its links never reaches a file); fix or remove the link";
  }
  if (code === "EACCES" || code === "EPERM") return "cannot be read (permission denied)";
  if (code === "ENOTDIR") return "has a path component that is not a directory";
  if (code === "ENAMETOOLONG") return "has a name too long for the file system";
  return `cannot be read (${(e as Error).message})`;
}

/** A byte count for messages: 16 MiB, 2.5 KiB, 17 bytes. */
export function formatSize(n: number): string {
  if (n >= 1 << 20) return `${+(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${+(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} bytes`;
}

/**
 * The most text k3 takes as one prompt or one chat message: 16 MiB is millions of tokens, far
 * past the model's 1M-token context, while a 50 MB message would only burn memory and time.
 */
export const MAX_TEXT_BYTES = 16 << 20;

/** How much of what a file may hold. */
interface ReadLimits {
  /** The most bytes the file may hold. */
  limit: number;
  /** An absent file reads as null instead of an error. */
  missingOk?: boolean;
}

/**
 * Refuses (exit 2) anything but a regular file of at most `limit` bytes.
 * @param what what the file is, for messages ("--prompt-file", "the chat history", ...)
 */
export function checkRegular(file: string, what: string, info: Deno.FileInfo, limit = Infinity) {
  const kind = kindOf(info);
  if (kind) throw badInput(`${file}: ${what} is ${kind}, not a regular file`);
  if (info.size > limit) throw tooLarge(file, what, info.size, limit);
}

function tooLarge(file: string, what: string, bytes: number, limit: number): K3Error {
  return badInput(
    `${file}: ${what} is ${formatSize(bytes)}, over the ${formatSize(limit)} k3 reads for it`,
  );
}

/** An OS failure on a user file as bad input naming it. */
function osFailure(file: string, what: string, e: unknown): K3Error {
  return e instanceof K3Error ? e : badInput(`${file}: ${what} ${osReason(e)}`, { cause: e });
}

/** The buffer a read fills: one byte more than the file holds, so growth is seen, not cut. */
function readBuffer(size: number, limit: number): Uint8Array {
  return new Uint8Array(Math.min(size, limit) + 1);
}

/** The bytes read, refused when over the limit or more than the file held when opened. */
function readResult(
  file: string,
  what: string,
  buf: Uint8Array,
  got: number,
  size: number,
  limit: number,
) {
  if (got > limit) throw tooLarge(file, what, got, limit);
  if (got > size) throw badInput(`${file}: ${what} grew while it was read; try again`);
  return buf.subarray(0, got);
}

function changedWhileOpening(file: string, what: string): K3Error {
  return badInput(`${file}: ${what} is not a regular file (it changed while being opened)`);
}

function decodeUtf8(file: string, what: string, bytes: Uint8Array | null): string | null {
  if (bytes === null) return null;
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw badInput(`${file}: ${what} is not UTF-8 text`);
  }
}

/**
 * The bytes of a regular file of at most `limit` bytes (null: absent, with missingOk).
 * @param what what the file is, for messages ("--prompt-file", "the chat history", ...)
 * @throws K3Error (exit 2) naming the file: absent (unless missingOk), not a regular file, a
 *   symlink loop, over the limit, or unreadable
 */
export async function readUserFile(
  file: string,
  what: string,
  { limit, missingOk = false }: ReadLimits,
): Promise<Uint8Array | null> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(file);
  } catch (e) {
    if (missingOk && e instanceof Deno.errors.NotFound) return null;
    throw osFailure(file, what, e);
  }
  checkRegular(file, what, info, limit);
  // O_NONBLOCK: even a file swapped for a FIFO since the stat cannot block the open.
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(file, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw osFailure(file, what, e);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw changedWhileOpening(file, what);
    const buf = readBuffer(st.size, limit);
    let got = 0;
    while (got < buf.length) {
      const { bytesRead } = await handle.read(buf, got, buf.length - got, null);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return readResult(file, what, buf, got, st.size, limit);
  } catch (e) {
    throw osFailure(file, what, e);
  } finally {
    await handle.close();
  }
}

/** UTF-8 text of a regular file (see {@link readUserFile}); invalid UTF-8 is bad input. */
export async function readUserText(
  file: string,
  what: string,
  limits: ReadLimits,
): Promise<string | null> {
  return decodeUtf8(file, what, await readUserFile(file, what, limits));
}

/**
 * {@link readUserFile}, synchronous: for state read before anything async starts (a download's
 * manifest, a token file, a cache ref). The same refusals, the same messages.
 */
function readUserFileSync(
  file: string,
  what: string,
  { limit, missingOk = false }: ReadLimits,
): Uint8Array | null {
  let info: Deno.FileInfo;
  try {
    info = Deno.statSync(file);
  } catch (e) {
    if (missingOk && e instanceof Deno.errors.NotFound) return null;
    throw osFailure(file, what, e);
  }
  checkRegular(file, what, info, limit);
  let fd: number;
  try {
    fd = fsSync.openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw osFailure(file, what, e);
  }
  try {
    const st = fsSync.fstatSync(fd);
    if (!st.isFile()) throw changedWhileOpening(file, what);
    const buf = readBuffer(st.size, limit);
    let got = 0;
    while (got < buf.length) {
      const n = fsSync.readSync(fd, buf, got, buf.length - got, null);
      if (n === 0) break;
      got += n;
    }
    return readResult(file, what, buf, got, st.size, limit);
  } catch (e) {
    throw osFailure(file, what, e);
  } finally {
    fsSync.closeSync(fd);
  }
}

/** UTF-8 text of a regular file, synchronously (see {@link readUserFileSync}). */
export function readUserTextSync(file: string, what: string, limits: ReadLimits): string | null {
  return decodeUtf8(file, what, readUserFileSync(file, what, limits));
}

/**
 * Refuses (exit 2) a path k3 is about to open for writing when something other than a regular
 * file is there: opening a FIFO for writing blocks until a reader comes, and a device or a
 * directory is never k3's own. An absent path is fine (it will be created).
 */
export async function checkWritableFile(file: string, what: string): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(file);
  } catch (e) {
    // Nothing there (or no folder to hold it yet): the write that follows says what is wrong.
    if (e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotADirectory) return;
    throw osFailure(file, what, e);
  }
  if (info.isSymlink) {
    throw badInput(`${file}: ${what} is a symlink, not a regular file; remove it`);
  }
  const kind = kindOf(info);
  if (kind) throw badInput(`${file}: ${what} is ${kind}, not a regular file; remove it`);
}
