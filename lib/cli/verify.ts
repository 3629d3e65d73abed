/**
 * `k3 verify DIR|REPO [--fast] [--jobs N]`: every file the manifest lists, checked in
 * parallel. Exit 0 when all match; exit 4 (the model is unusable) naming each bad file.
 */
import { badInput, ExitCode, runInvalid } from "../errors.ts";
import { manifestFromCacheLinks, resolveModelDir } from "../hub/cache.ts";
import { manifestPath, readManifest } from "../hub/manifest.ts";
import { formatDuration, formatSize, StatusLine } from "../hub/progress.ts";
import { verifyFolder, type VerifyProgress } from "../hub/verify.ts";
import { intFlag, parseCommand } from "./flags.ts";

const HELP = `usage: k3 verify DIR|REPO [--fast] [--jobs N]

Checks a downloaded model against its manifest (DIR/.k3/manifest.json, written by
k3 download): every file present, of the listed size, with the listed SHA-256 (LFS files) or
git blob id (small files). A Hub cache snapshot made by other tools is checked against its
blob names. REPO (owner/name) means its snapshot in the Hub cache.

options:
  --fast        sizes only, no hashing
  --jobs N      files hashed at once (default: the number of cores)

exit codes: 0 every file matches; 4 a file is missing, short or differs (the model is
unusable: re-run k3 download to fetch it again); 2 no manifest.`;

export const OPTIONS = {
  fast: { type: "boolean" },
  jobs: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

export async function verifyCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  if (positionals.length !== 1) throw badInput("usage: k3 verify DIR|REPO [--fast] (see --help)");
  const root = resolveModelDir(positionals[0]);
  const jobs = intFlag("jobs", values.jobs, navigator.hardwareConcurrency || 2, 1, 64);
  const manifest = readManifest(root) ?? manifestFromCacheLinks(root);
  if (!manifest) {
    throw badInput(
      `${manifestPath(root)} not found: ${root} was not made by k3 download (download into ` +
        `it with \`k3 download REPO ${root}\`, which resumes over files already there)`,
    );
  }
  const fast = values.fast === true;
  const progress: VerifyProgress = { bytesDone: 0, bytesTotal: 0, filesDone: 0, filesTotal: 0 };
  const line = new StatusLine(`verify${fast ? " --fast" : ""}`, {
    done: () => progress.bytesDone,
    total: () => progress.bytesTotal,
    moved: () => progress.bytesDone,
    extra: () => `files ${progress.filesDone}/${progress.filesTotal}`,
  });
  line.start();
  const problems = await verifyFolder(root, manifest, { fast, jobs, progress }).finally(() =>
    line.stop()
  );
  for (const p of problems) console.error(`k3 verify: ${p.path} ${p.problem}`);
  const what = `${manifest.repo}@${manifest.commit.slice(0, 12)} in ${root}`;
  if (problems.length > 0) {
    throw runInvalid(
      `${problems.length} of ${progress.filesTotal} files of ${what} failed verification ` +
        `(${problems.slice(0, 3).map((p) => p.path).join(", ")}${
          problems.length > 3 ? ", ..." : ""
        }): the model is unusable. Delete the bad files and re-run k3 download to fetch them again`,
    );
  }
  console.log(
    `verified ${progress.filesTotal} files of ${what}: ` +
      (fast
        ? "all present with the listed sizes (--fast: not hashed)"
        : `${formatSize(progress.bytesTotal)} hashed in ${
          formatDuration(line.seconds)
        }, all match`),
  );
  return ExitCode.ok;
}
