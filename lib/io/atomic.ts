/**
 * Files the user keeps are replaced atomically: write a temp file in the same directory,
 * fsync it, rename it over the target, fsync the directory. A crash leaves the old file or
 * the new one, never half of either.
 */
import * as path from "node:path";
import { badInput, K3Error } from "../errors.ts";

/** Writes all of `data` to `file` at its current position. */
export async function writeAll(file: Deno.FsFile, data: Uint8Array): Promise<void> {
  for (let done = 0; done < data.length;) done += await file.write(data.subarray(done));
}

/** Replaces `file` atomically with what `fill` writes into the temp file. */
export async function writeAtomically(
  file: string,
  fill: (out: Deno.FsFile) => Promise<void>,
): Promise<void> {
  const tmp = path.join(
    path.dirname(file),
    `.${path.basename(file)}.${Deno.pid}.${crypto.randomUUID().slice(0, 8)}.tmp`,
  );
  const out = await Deno.open(tmp, { write: true, createNew: true });
  try {
    await fill(out);
    await out.sync();
  } catch (e) {
    out.close();
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
  out.close();
  await Deno.rename(tmp, file);
  await syncDir(path.dirname(file));
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

/**
 * A failed write of `file` as the user should see it: exit 2 naming the path and the OS
 * error (ENOSPC, EACCES, EROFS, EISDIR...), never a stack trace. K3Errors pass through.
 */
export function writeFailure(file: string, e: unknown): K3Error {
  if (e instanceof K3Error) return e;
  const why = e instanceof Error ? e.message : String(e);
  return badInput(`cannot write ${file}: ${why}`, { cause: e });
}
