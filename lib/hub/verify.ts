/**
 * Checks a model folder against its manifest: every wanted file present, of the listed size,
 * and (unless `fast`) with the listed SHA-256 or git blob id. Several files are hashed at
 * once; the hashing itself runs on libk3 threads.
 */
import { createHash } from "node:crypto";
import * as path from "node:path";
import type { Manifest, ManifestFile } from "./manifest.ts";
import { Sha256 } from "./sha256.ts";

const READ = 8 << 20;

interface VerifyProblem {
  path: string;
  problem: string;
}

export interface VerifyProgress {
  bytesDone: number;
  bytesTotal: number;
  filesDone: number;
  filesTotal: number;
}

/** Hex SHA-256 (LFS files) or git blob id (others) of `file`, read in 8 MiB pieces. */
async function hashFile(
  file: string,
  f: ManifestFile,
  onBytes: (n: number) => void = () => {},
): Promise<string> {
  const h = f.sha256 ? Sha256.fresh() : undefined;
  const git = f.sha256 ? undefined : createHash("sha1").update(`blob ${f.size}\0`);
  const buf = new Uint8Array(READ);
  const fd = await Deno.open(file, { read: true });
  let tail = new Uint8Array(0);
  try {
    for (;;) {
      let n = 0;
      while (n < buf.length) {
        const r = await fd.read(buf.subarray(n));
        if (r === null) break;
        n += r;
      }
      if (n === 0) break;
      if (h) {
        const whole = n - (n % 64);
        await h.update(buf.subarray(0, whole));
        tail = buf.slice(whole, n);
      } else git!.update(buf.subarray(0, n));
      onBytes(n);
      if (n < buf.length) break;
    }
  } finally {
    fd.close();
  }
  return h ? h.digest(tail) : git!.digest("hex");
}

/** What is wrong with one file, or undefined when it matches. */
async function checkFile(
  root: string,
  f: ManifestFile,
  fast: boolean,
  onBytes: (n: number) => void,
): Promise<string | undefined> {
  const file = path.join(root, f.path);
  let size: number;
  try {
    const st = await Deno.stat(file);
    if (!st.isFile) return "is not a file";
    size = st.size;
  } catch {
    return "is missing";
  }
  if (size !== f.size) return `has ${size} bytes, the manifest says ${f.size}`;
  if (fast) return undefined;
  let got: string;
  try {
    got = await hashFile(file, f, onBytes);
  } catch (e) {
    return `cannot be read (${String((e as Error)?.message ?? e).split("\n")[0]})`;
  }
  const want = f.sha256 ?? f.git_oid!;
  const kind = f.sha256 ? "SHA-256" : "git blob id";
  return got === want ? undefined : `${kind} is ${got}, the manifest says ${want}`;
}

/** Verifies every wanted file of `m` under `root`, `jobs` at a time. */
export async function verifyFolder(
  root: string,
  m: Manifest,
  opts: { fast: boolean; jobs: number; progress?: VerifyProgress },
): Promise<VerifyProblem[]> {
  const wanted = new Set(m.wanted);
  const files = m.files.filter((f) => wanted.has(f.path)).sort((a, b) => b.size - a.size);
  const p = opts.progress ?? { bytesDone: 0, bytesTotal: 0, filesDone: 0, filesTotal: 0 };
  p.filesTotal = files.length;
  p.bytesTotal = opts.fast ? 0 : files.reduce((s, f) => s + f.size, 0);
  const problems: VerifyProblem[] = [];
  let next = 0;
  const worker = async () => {
    while (next < files.length) {
      const f = files[next++];
      const problem = await checkFile(root, f, opts.fast, (n) => p.bytesDone += n);
      if (problem) problems.push({ path: f.path, problem });
      p.filesDone++;
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, opts.jobs) }, worker));
  return problems.sort((a, b) => a.path.localeCompare(b.path));
}
