/**
 * Where a download puts its files. Two layouts, one engine:
 *
 * - a plain folder (`k3 download REPO DIR`): each file under its own name in DIR, partial
 *   data in DIR/.k3/partial, the manifest in DIR/.k3/manifest.json;
 * - the Hub cache (`k3 download REPO --hub-cache`), exactly as the Hub's own tools lay it
 *   out: `models--owner--name/blobs/<etag>` holds the bytes, `snapshots/<commit>/<path>` is a
 *   relative symlink to its blob, `refs/<revision>` names the commit. Partial data sits next
 *   to the blobs as `<etag>.k3-partial` (never `.incomplete`, which the Hub's tools would
 *   resume by size); the manifest in `snapshots/<commit>/.k3/manifest.json`.
 *
 * Either way a file reaches its final name only after its hash matched: rename, fsync.
 */
import * as path from "node:path";
import { runInvalid } from "../errors.ts";
import { sweepTempFiles, syncDir, writeFileAtomic } from "../io/atomic.ts";
import { hubCachePath, repoFolderName } from "./endpoint.ts";
import { type ManifestFile, stateDir } from "./manifest.ts";

/** One blob to fetch: a content key and every path that holds that content. */
export interface Job {
  etag: string;
  size: number;
  sha256?: string;
  gitOid?: string;
  paths: string[];
}

export interface Target {
  /** The model folder a run reads (DIR, or the snapshot folder). */
  readonly root: string;
  /** The folder the download's temp files live in (free space is checked here). */
  readonly partialDir: string;
  partialPath(job: Job): string;
  /** True when the job's content already sits under its final name(s); repairs links. */
  isComplete(job: Job): Promise<boolean>;
  /** Moves a verified partial file to its final name(s), durably. */
  place(job: Job, partial: string): Promise<void>;
  /** After every wanted file is in place (the cache records the ref). */
  finish(revision: string, commit: string): Promise<void>;
  /**
   * Removes the temp files a killed run left behind (atomic-write temps, copies in flight),
   * when no write of this run is in flight. Returns how many it removed.
   */
  sweep(): Promise<number>;
}

/** Removes files of `dir` whose names end in `suffix` (temps of k3's own naming). */
async function removeEndingIn(dir: string, suffix: string): Promise<number> {
  let n = 0;
  try {
    for await (const e of Deno.readDir(dir)) {
      if (!e.isFile || !e.name.endsWith(suffix)) continue;
      await Deno.remove(path.join(dir, e.name)).then(() => n++, () => {});
    }
  } catch {
    // No folder: nothing to sweep.
  }
  return n;
}

/** Groups files by content, so identical files are fetched once. */
export function jobsFor(files: ManifestFile[]): Job[] {
  const byEtag = new Map<string, Job>();
  for (const f of files) {
    const etag = f.sha256 ?? f.git_oid!;
    const job = byEtag.get(etag);
    if (job && job.size !== f.size) {
      throw runInvalid(
        `the Hub lists ${job.paths[0]} and ${f.path} with the same hash but sizes ` +
          `${job.size} and ${f.size}: its file list is inconsistent`,
      );
    }
    if (job) job.paths.push(f.path);
    else {
      byEtag.set(etag, {
        etag,
        size: f.size,
        sha256: f.sha256,
        gitOid: f.sha256 ? undefined : f.git_oid,
        paths: [f.path],
      });
    }
  }
  return [...byEtag.values()];
}

async function sizeOf(file: string): Promise<number | undefined> {
  try {
    const st = await Deno.stat(file);
    return st.isFile ? st.size : undefined;
  } catch {
    return undefined;
  }
}

/** Renames `from` to `to` (making its folder), then fsyncs the folder. */
async function renameDurably(from: string, to: string): Promise<void> {
  await Deno.mkdir(path.dirname(to), { recursive: true });
  await Deno.rename(from, to);
  await syncDir(path.dirname(to));
}

/** The plain-folder layout. */
export function folderTarget(dir: string): Target {
  const partialDir = path.join(stateDir(dir), "partial");
  const finalPath = (p: string) => path.join(dir, p);
  return {
    root: dir,
    partialDir,
    partialPath: (job) => path.join(partialDir, `${job.etag}.part`),
    async isComplete(job) {
      for (const p of job.paths) if (await sizeOf(finalPath(p)) !== job.size) return false;
      return true;
    },
    async place(job, partial) {
      // Copies for duplicates first (from the verified partial), then the rename.
      for (const p of job.paths.slice(1)) {
        const tmp = `${partial}.copy`;
        await Deno.copyFile(partial, tmp);
        const f = await Deno.open(tmp, { write: true });
        await f.sync();
        f.close();
        await renameDurably(tmp, finalPath(p));
      }
      await renameDurably(partial, finalPath(job.paths[0]));
    },
    async finish() {},
    async sweep() {
      const temps = [
        ...await sweepTempFiles(stateDir(dir)),
        ...await sweepTempFiles(partialDir),
      ];
      return temps.length + await removeEndingIn(partialDir, ".part.copy");
    },
  };
}

/** The Hub cache folder of `repo` (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/...). */
export function repoCacheDir(repo: string, cacheDir = hubCachePath()): string {
  return path.join(cacheDir, repoFolderName(repo));
}

/** The Hub cache layout for `commit` of `repo`. */
export function cacheTarget(repo: string, commit: string, cacheDir?: string): Target {
  const storage = repoCacheDir(repo, cacheDir);
  const blobs = path.join(storage, "blobs");
  const snapshot = path.join(storage, "snapshots", commit);
  const refs = path.join(storage, "refs");
  const blobPath = (job: Job) => path.join(blobs, job.etag);

  /** snapshots/<commit>/<p> -> ../../blobs/<etag>, relative, replaced atomically. */
  async function link(job: Job, p: string): Promise<void> {
    const at = path.join(snapshot, p);
    const to = path.relative(path.dirname(at), blobPath(job));
    try {
      if (await Deno.readLink(at) === to) return;
    } catch {
      // Missing (or not a link): make it.
    }
    await Deno.mkdir(path.dirname(at), { recursive: true });
    const tmp = `${at}.k3-link`;
    await Deno.remove(tmp).catch(() => {});
    await Deno.symlink(to, tmp);
    await Deno.rename(tmp, at);
    await syncDir(path.dirname(at));
  }

  return {
    root: snapshot,
    partialDir: blobs,
    partialPath: (job) => `${blobPath(job)}.k3-partial`,
    async isComplete(job) {
      if (await sizeOf(blobPath(job)) !== job.size) return false;
      for (const p of job.paths) await link(job, p);
      return true;
    },
    async place(job, partial) {
      await renameDurably(partial, blobPath(job));
      for (const p of job.paths) await link(job, p);
    },
    async finish(revision, commit) {
      if (revision === commit) return;
      const ref = path.join(storage, "refs", revision);
      await Deno.mkdir(path.dirname(ref), { recursive: true });
      await writeFileAtomic(ref, commit);
    },
    async sweep() {
      const temps = [...await sweepTempFiles(blobs), ...await sweepTempFiles(refs)];
      return temps.length;
    },
  };
}
