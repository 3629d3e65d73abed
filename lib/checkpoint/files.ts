/**
 * The files of a checkpoint directory are checked before they are opened: each must be a
 * regular file (a directory, FIFO, socket or device is named as what it is; a FIFO is never
 * opened, so nothing can hang), a symlink loop is named as one, and a file must resolve to a
 * place inside the model directory (an index naming `../elsewhere/x` or `/etc/passwd`, or a
 * symlink that leaves the directory, is refused). All of it is bad input (exit 2).
 *
 * One exception keeps the Hugging Face cache usable: in `<repo>/snapshots/<rev>/` the files
 * are symlinks into `<repo>/blobs/`, so for a snapshot directory that folder counts as inside.
 */

import { constants } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { badInput, type K3Error } from "../errors.ts";
import { kindOf, osReason } from "../io/files.ts";

/** A model directory, resolved: where its files may live. */
export interface ModelDir {
  /** As given, absolute. */
  dir: string;
  /** Real paths files may resolve into: the directory, and `../../blobs` of an HF snapshot. */
  roots: string[];
}

/** The OS error of a failed stat or realpath as a message, naming the path. */
function describeError(file: string, what: string, e: unknown): K3Error {
  return badInput(`${file}: ${what} ${osReason(e)}`, { cause: e });
}

/**
 * Checks and resolves the model directory.
 * @throws K3Error (exit 2) when it does not exist, is not a directory, or is a symlink loop
 */
export async function openModelDir(dir: string): Promise<ModelDir> {
  const abs = path.resolve(dir);
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(abs);
  } catch (e) {
    const err = describeError(abs, "checkpoint directory", e);
    err.message += " (pass the folder holding config.json)";
    throw err;
  }
  if (!info.isDirectory) {
    throw badInput(
      `${abs}: checkpoint directory is ${kindOf(info)} (pass the folder holding config.json)`,
    );
  }
  const real = await Deno.realPath(abs);
  const roots = [real];
  // <repo>/snapshots/<rev>: the Hub cache keeps the bytes in <repo>/blobs.
  if (path.basename(path.dirname(real)) === "snapshots") {
    const blobs = path.join(path.dirname(path.dirname(real)), "blobs");
    const blobsReal = await Deno.realPath(blobs).catch(() => null);
    if (blobsReal) roots.push(blobsReal);
  }
  return { dir: abs, roots };
}

function inside(real: string, root: string): boolean {
  const rel = path.relative(root, real);
  return rel !== "" && !rel.startsWith("..") && !path.isAbsolute(rel);
}

/**
 * Checks that `file` is a regular file inside the model directory, without opening it.
 * @param what what the file is, for messages ("config.json", "shard", ...)
 * @throws K3Error (exit 2) naming the file, what it is instead, and what to do
 */
export async function checkModelFile(model: ModelDir, file: string, what: string): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(file);
  } catch (e) {
    const link = await Deno.readLink(file).catch(() => null);
    if (link !== null && (e as { code?: string }).code === "ENOENT") {
      throw badInput(`${file}: ${what} is a symlink to ${link}, which does not exist`, {
        cause: e,
      });
    }
    throw describeError(file, what, e);
  }
  const kind = kindOf(info);
  if (kind) throw badInput(`${file}: ${what} is ${kind}, not a regular file`);
  let real: string;
  try {
    real = await Deno.realPath(file);
  } catch (e) {
    throw describeError(file, what, e);
  }
  if (!model.roots.some((root) => inside(real, root))) {
    throw badInput(
      `${file}: ${what} resolves to ${real}, outside the model directory ${model.dir}; ` +
        `k3 reads only files inside it (copy the file into the directory or fix the link)`,
    );
  }
}

/**
 * Opens a file checked by checkModelFile for reading. O_NONBLOCK keeps even a file swapped
 * for a FIFO since the check from blocking, and fstat refuses it.
 */
export async function openModelFile(file: string, what: string): Promise<fs.FileHandle> {
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(file, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw describeError(file, what, e);
  }
  const st = await handle.stat();
  if (!st.isFile()) {
    await handle.close();
    throw badInput(`${file}: ${what} is not a regular file (it changed while being opened)`);
  }
  return handle;
}

/**
 * Resolves a file name found in the index against the model directory, refusing absolute
 * paths and any path that climbs out of it (`..`), before anything is opened.
 * @param source the index file, for messages
 * @param field the JSON field that names the file, for messages
 */
export function resolveInside(model: ModelDir, name: string, source: string, field: string) {
  const normal = path.normalize(name);
  if (
    name === "" || path.isAbsolute(name) || normal === ".." || normal.startsWith("../") ||
    normal === "." || name.includes("\0")
  ) {
    throw badInput(
      `${source}: ${field} names ${JSON.stringify(name)}, which is not a file inside the model ` +
        `directory ${model.dir}; shard names must be relative paths inside it`,
    );
  }
  return path.join(model.dir, normal);
}
