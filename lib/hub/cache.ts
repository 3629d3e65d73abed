/**
 * Finding a model by repo id in the Hub cache, for `run`, `chat` and `serve`: an argument
 * that is not an existing path but looks like `owner/name` (optionally `@revision`) is looked
 * up as `$HF_HUB_CACHE/models--owner--name/snapshots/<commit>`, the commit read from
 * `refs/<revision>` (default `main`) or given as 40 hex digits. Snapshots from `k3 download
 * --hub-cache` and from the Hub's own tools are found alike.
 */
import * as path from "node:path";
import { existsSync, readdirSync, statSync } from "node:fs";
import { badInput } from "../errors.ts";
import { readUserTextSync } from "../io/files.ts";
import { hubCachePath } from "./endpoint.ts";
import { isCommit, type Manifest, readManifest } from "./manifest.ts";
import { repoCacheDir } from "./target.ts";

/** `owner/name` or `owner/name@revision`, as run/chat/serve accept it. */
const REPO_ARG = /^([A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?$/;

/** The model folder for `arg`: the path itself, or the Hub cache snapshot of a repo id. */
export function resolveModelDir(arg: string): string {
  if (existsSync(arg)) return arg;
  const m = arg.match(REPO_ARG);
  if (!m || arg.includes("..")) return arg; // not a repo id: the loader reports the path
  const [, repo, revision = "main"] = m;
  const cache = hubCachePath();
  const storage = repoCacheDir(repo, cache);
  const fetch = `download it with \`k3 download ${repo} --hub-cache\`` +
    `${revision === "main" ? "" : ` --revision ${revision}`} (or into a folder with ` +
    `\`k3 download ${repo} DIR\`, then pass DIR)`;
  let commit = revision;
  if (!isCommit(revision)) {
    // A FIFO or a device in the ref's place is refused by name, never opened.
    const ref = readUserTextSync(path.join(storage, "refs", revision), "the Hub cache ref", {
      limit: 4096,
      missingOk: true,
    });
    if (ref !== null) commit = ref.trim();
    else {
      throw badInput(
        `'${arg}' is not a folder, and the Hub cache (${cache}) has no ${repo}` +
          `${revision === "main" ? "" : ` at ${revision}`}: ${fetch}`,
      );
    }
  }
  const snapshot = path.join(storage, "snapshots", commit);
  if (!isCommit(commit) || !existsSync(snapshot)) {
    throw badInput(
      `the Hub cache (${cache}) names commit ${commit} for ${repo}@${revision} but has no ` +
        `snapshot of it: ${fetch}`,
    );
  }
  const missing = missingFiles(snapshot, readManifest(snapshot));
  if (missing.length > 0) {
    throw badInput(
      `the Hub cache snapshot of ${repo}@${revision} lacks ${missing.length} file(s) ` +
        `(${missing.slice(0, 3).join(", ")}${missing.length > 3 ? ", ..." : ""}): finish it ` +
        `with \`k3 download ${repo} --hub-cache\``,
    );
  }
  return snapshot;
}

/** Wanted files of a k3 manifest that are not (or no longer: dangling link) there. */
function missingFiles(root: string, m: Manifest | undefined): string[] {
  if (!m) return [];
  return m.wanted.filter((p) => {
    try {
      return !statSync(path.join(root, p)).isFile();
    } catch {
      return true;
    }
  });
}

/**
 * A manifest for a Hub cache snapshot made without k3 (e.g. by `hf download`): each file is a
 * link to `blobs/<etag>`, and the etag is the SHA-256 (LFS) or the git blob id. Undefined when
 * `root` is not such a snapshot.
 */
export function manifestFromCacheLinks(root: string): Manifest | undefined {
  const abs = path.resolve(root);
  const snapshots = path.dirname(abs);
  if (path.basename(snapshots) !== "snapshots" || !isCommit(path.basename(abs))) return undefined;
  const storage = path.dirname(snapshots);
  const folder = path.basename(storage);
  if (!folder.startsWith("models--")) return undefined;
  const files: Manifest["files"] = [];
  const walk = (rel: string) => {
    for (const e of readdirSync(path.join(abs, rel), { withFileTypes: true })) {
      const p = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) {
        if (p !== ".k3") walk(p);
        continue;
      }
      const etag = path.basename(Deno.realPathSync(path.join(abs, p)));
      const size = Deno.statSync(path.join(abs, p)).size;
      if (/^[0-9a-f]{64}$/.test(etag)) files.push({ path: p, size, sha256: etag });
      else if (/^[0-9a-f]{40}$/.test(etag)) files.push({ path: p, size, git_oid: etag });
    }
  };
  try {
    walk("");
  } catch {
    return undefined;
  }
  return {
    format: "k3-download/1",
    repo: folder.slice("models--".length).split("--").join("/"),
    revision: path.basename(abs),
    commit: path.basename(abs),
    endpoint: "",
    files,
    wanted: files.map((f) => f.path),
  };
}
