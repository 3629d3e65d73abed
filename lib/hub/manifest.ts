/**
 * The download manifest, `<model dir>/.k3/manifest.json`: which repo and commit the folder
 * holds, every file of that commit with its size and hash (the LFS SHA-256, or the git blob
 * id of a small file), and which of them this folder is meant to hold. A resume reads the
 * commit from here, so it continues the same commit even if the branch has moved; `k3 verify`
 * checks the folder against it.
 */
import * as path from "node:path";
import { badInput } from "../errors.ts";
import { writeFileAtomic } from "../io/atomic.ts";
import { readUserTextSync } from "../io/files.ts";

export const MANIFEST_FORMAT = "k3-download/1";

/** One file of the commit. LFS files have `sha256`; the others their git blob id. */
export interface ManifestFile {
  path: string;
  size: number;
  sha256?: string;
  git_oid?: string;
}

export interface Manifest {
  format: typeof MANIFEST_FORMAT;
  repo: string;
  /** The revision asked for (branch, tag or commit), as given. */
  revision: string;
  /** The 40-hex commit it resolved to: every later resume and verify uses this one. */
  commit: string;
  endpoint: string;
  /** Every file of the commit. */
  files: ManifestFile[];
  /** The paths this folder holds (all files, or those the --include/--exclude chose). */
  wanted: string[];
}

/** The k3 folder inside a model directory (manifest, partial files, progress records). */
export function stateDir(root: string): string {
  return path.join(root, ".k3");
}

export function manifestPath(root: string): string {
  return path.join(stateDir(root), "manifest.json");
}

/**
 * The release's manifest is tens of KB; a commit of 100,000 files (the most a file list may
 * hold) is about 20 MB.
 */
const MAX_MANIFEST_BYTES = 64 << 20;

/** The manifest of `root`, or undefined when there is none; a broken one is bad input. */
export function readManifest(root: string): Manifest | undefined {
  const file = manifestPath(root);
  try {
    Deno.lstatSync(file);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound || e instanceof Deno.errors.NotADirectory) {
      return undefined;
    }
  }
  // A FIFO or a device in its place is refused, never opened: reading it would hang.
  const text = readUserTextSync(file, "the download manifest", {
    limit: MAX_MANIFEST_BYTES,
    missingOk: true,
  });
  if (text === null) return undefined;
  const fail = (what: string) =>
    badInput(`${file}: ${what}; delete it to start the download of this folder over`);
  let m: Manifest;
  try {
    m = JSON.parse(text);
  } catch {
    throw fail("not valid JSON");
  }
  if (m?.format !== MANIFEST_FORMAT) throw fail(`format is not ${MANIFEST_FORMAT}`);
  if (typeof m.repo !== "string" || !isCommit(m.commit) || typeof m.revision !== "string") {
    throw fail("repo, revision or commit missing");
  }
  if (!Array.isArray(m.files) || !Array.isArray(m.wanted)) throw fail("files or wanted missing");
  const known = new Set<string>();
  for (const f of m.files) {
    const problem = fileProblem(f);
    if (problem) throw fail(problem);
    known.add(f.path);
  }
  for (const p of m.wanted) if (!known.has(p)) throw fail(`wanted file '${p}' is not listed`);
  return m;
}

export async function writeManifest(root: string, m: Manifest): Promise<void> {
  await Deno.mkdir(stateDir(root), { recursive: true });
  await writeFileAtomic(manifestPath(root), JSON.stringify(m, null, 1) + "\n");
}

/** True for a full 40-hex commit id. */
export function isCommit(s: unknown): s is string {
  return typeof s === "string" && /^[0-9a-f]{40}$/.test(s);
}

/** What is wrong with a listed file (its path could escape the folder, a bad hash), or "". */
export function fileProblem(f: ManifestFile): string {
  if (typeof f?.path !== "string" || !safeRelativePath(f.path)) {
    return `file path '${f?.path}' is not a plain relative path`;
  }
  if (!Number.isSafeInteger(f.size) || f.size < 0) return `${f.path}: size ${f.size} is invalid`;
  if (f.sha256 !== undefined && !/^[0-9a-f]{64}$/.test(f.sha256)) {
    return `${f.path}: sha256 '${f.sha256}' is not 64 hex digits`;
  }
  if (f.sha256 === undefined && !/^[0-9a-f]{40}$/.test(f.git_oid ?? "")) {
    return `${f.path}: has neither an LFS sha256 nor a git blob id`;
  }
  return "";
}

/** A path inside the folder: relative, no `..`, no empty or dot segments, no NUL. */
export function safeRelativePath(p: string): boolean {
  if (p === "" || p.startsWith("/") || p.includes("\0") || p.includes("\\")) return false;
  return p.split("/").every((s) => s !== "" && s !== "." && s !== "..");
}

/**
 * A shell-style pattern as `hf download --include` reads it (Python fnmatch): `*` matches
 * any run of characters including `/`, `?` one character, `[abc]` / `[!abc]` a set.
 */
export function globToRegExp(glob: string): RegExp {
  let re = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*") re += ".*";
    else if (c === "?") re += ".";
    else if (c === "[") {
      const end = glob.indexOf("]", i + 2);
      if (end < 0) {
        re += "\\[";
        continue;
      }
      let set = glob.slice(i + 1, end);
      if (set.startsWith("!")) set = "^" + set.slice(1);
      re += `[${set.replace(/\\/g, "\\\\")}]`;
      i = end;
    } else re += c.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${re}$`, "s");
}

/** The listed paths that match some include (all, when none) and no exclude. */
export function selectPaths(files: ManifestFile[], include: string[], exclude: string[]) {
  const inc = include.map(globToRegExp), exc = exclude.map(globToRegExp);
  return files.map((f) => f.path).filter((p) =>
    (inc.length === 0 || inc.some((r) => r.test(p))) && !exc.some((r) => r.test(p))
  );
}
