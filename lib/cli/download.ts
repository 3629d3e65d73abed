/**
 * `k3 download [REPO] DIR` / `k3 download [REPO] --hub-cache`: the checkpoint from the
 * Hugging Face Hub, resumable, parallel, verified. lib/hub/ has the parts; this file reads
 * the flags, records the commit, checks free space, shows progress and maps failures to
 * exit codes (2: fix the input; 4: wrong bytes, partial data kept; 5: the network kept
 * failing, partial data kept; 130: Ctrl-C). It always says at once what it fetches from where,
 * each retry and when the next attempt comes, progress, and how it ended.
 */
import { existsSync, statfsSync } from "node:fs";
import * as path from "node:path";
import { badInput, ExitCode, K3Error, networkFailure } from "../errors.ts";
import {
  DEFAULT_REPO,
  type HubContext,
  isRepoId,
  listCommitFiles,
  resolveCommit,
} from "../hub/api.ts";
import { hubEndpoint, type HubToken, hubToken, redact } from "../hub/endpoint.ts";
import { firstLine, GaveUp } from "../hub/http.ts";
import {
  isCommit,
  type Manifest,
  MANIFEST_FORMAT,
  readManifest,
  selectPaths,
  writeManifest,
} from "../hub/manifest.ts";
import { formatDuration, formatSize, StatusLine } from "../hub/progress.ts";
import { cacheTarget, folderTarget, jobsFor, type Target } from "../hub/target.ts";
import { prepare, type PreparedTransfer, type TransferStats } from "../hub/transfer.ts";
import { intFlag, numberFlag, parseCommand } from "./flags.ts";

const HELP = `usage: k3 download [REPO] DIR [options]
       k3 download [REPO] --hub-cache [options]

Downloads REPO (default ${DEFAULT_REPO}) from the Hugging Face Hub into DIR, each file under
its own name (run it with k3 run DIR), or with --hub-cache into the Hub cache (run it with
k3 run REPO). The revision is resolved to a commit once and recorded in DIR/.k3/manifest.json:
a re-run resumes that commit from the bytes on disk (after any kill), and k3 verify checks
against it. A file gets its final name only once its SHA-256 matches the Hub's.

options:
  --revision REV        branch, tag or commit (default: main, or the commit DIR records)
  --include GLOB        only files matching GLOB (repeatable; * also matches /)
  --exclude GLOB        skip files matching GLOB (repeatable)
  --connections N       ranged GETs in flight at once, across files (default 8)
  --hub-cache           into the Hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
                        ~/.cache/huggingface/hub) instead of DIR
  --piece-size SIZE     bytes per ranged GET, e.g. 256K, 64M (default: 1-64 MiB per file)
  --retry-for S         give up (exit 5, partial data kept) when a request keeps failing for
                        S seconds (default 600)
  --stall-timeout S     retry a request that gets no answer, or a transfer that sends
                        nothing, for S seconds (default 60)
  --verbose             a line per file (resumed, verified)

environment: HF_ENDPOINT (default https://huggingface.co); HF_TOKEN, else the token file
(HF_TOKEN_PATH, else $HF_HOME/token, else ~/.cache/huggingface/token). The token is sent
only to the endpoint, never to the storage it redirects to, and never printed.
K3_PROGRESS_EVERY: seconds between progress lines when stderr is not a terminal (default 10).
exit codes: 0 done, 2 bad input (repo, revision, token, free space), 4 the Hub served wrong
bytes, 5 network failure: the Hub could not be reached or kept failing for --retry-for
seconds (partial data kept: re-run to resume), 130 interrupted.`;

/** "64M", "256K", "1G" or plain bytes, a multiple of 64 (SHA-256 blocks), 64 KiB to 1 GiB. */
function sizeFlag(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const m = value.trim().match(/^(\d+)([KMG]?)i?B?$/i);
  const mult = { "": 1, K: 1 << 10, M: 1 << 20, G: 1 << 30 }[(m?.[2] ?? "").toUpperCase()];
  const n = m ? Number(m[1]) * mult! : NaN;
  if (!Number.isSafeInteger(n) || n < 65536 || n > 1 << 30 || n % 64 !== 0) {
    throw badInput(
      `--piece-size wants 64K to 1G, a multiple of 64 bytes (e.g. 64M), got '${value}'`,
    );
  }
  return n;
}

/** Free bytes for an unprivileged writer on the file system holding `dir`. */
function freeBytes(dir: string): number {
  let at = path.resolve(dir);
  for (;;) {
    try {
      const s = statfsSync(at);
      return Number(s.bavail) * Number(s.bsize);
    } catch {
      const up = path.dirname(at);
      if (up === at) return Infinity;
      at = up;
    }
  }
}

export const OPTIONS = {
  revision: { type: "string" },
  include: { type: "string", multiple: true },
  exclude: { type: "string", multiple: true },
  connections: { type: "string" },
  "hub-cache": { type: "boolean" },
  "piece-size": { type: "string" },
  "retry-for": { type: "string" },
  "stall-timeout": { type: "string" },
  verbose: { type: "boolean", short: "v" },
  help: { type: "boolean", short: "h" },
} as const;

export async function downloadCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  const req = downloadRequest(values, positionals);
  const endpoint = hubEndpoint();
  const token = hubToken();
  const voice = new Voice(token, values.verbose === true);
  const stop = new AbortController();
  const onSigint = () => stop.abort(new K3Error("interrupted", ExitCode.interrupted));
  Deno.addSignalListener("SIGINT", onSigint);
  const ctx: HubContext = {
    endpoint,
    token,
    policy: {
      retryFor: req.retryFor,
      stallTimeout: req.stallTimeout,
      backoff: 0.25,
      signal: stop.signal,
      onRetry: (what, failure, s, left) => voice.say(retryLine(what, failure, s, left)),
    },
  };
  // The first line comes before any request: a Hub that does not answer is not silence.
  voice.say(openingLine(req, endpoint));
  const t0 = performance.now();
  let partialDir = "";
  try {
    const { repo, commit, recorded } = await chooseCommit(ctx, req);
    const target: Target = req.useCache ? cacheTarget(repo, commit) : folderTarget(req.dir!);
    const { manifest, prepared } = await prepareDownload(
      ctx,
      req,
      { repo, commit, target, recorded: recorded ?? readManifest(target.root) },
      voice.log,
    );
    partialDir = target.partialDir;
    voice.stats = prepared.stats;
    await checkFreeSpace(req, repo, commit, target, prepared.missing);
    await writeManifest(target.root, manifest);
    await fetchWithProgress(voice, repo, commit, target, manifest, prepared);
    return ExitCode.ok;
  } catch (e) {
    voice.line?.stop();
    voice.line = undefined;
    const err = userError(e, token, partialDir);
    voice.say(stoppedLine(err, (performance.now() - t0) / 1000, voice.stats));
    throw err;
  } finally {
    Deno.removeSignalListener("SIGINT", onSigint);
  }
}

/** The flags' values as parsed (see OPTIONS). */
interface DownloadValues {
  revision?: string;
  include?: string[];
  exclude?: string[];
  connections?: string;
  "hub-cache"?: boolean;
  "piece-size"?: string;
  "retry-for"?: string;
  "stall-timeout"?: string;
}

/** What the command line asks for, checked. */
interface DownloadRequest {
  useCache: boolean;
  repoArg?: string;
  dir?: string;
  revision?: string;
  include: string[];
  exclude: string[];
  connections: number;
  pieceSize?: number;
  retryFor: number;
  stallTimeout: number;
}

function downloadRequest(values: DownloadValues, positionals: string[]): DownloadRequest {
  const useCache = values["hub-cache"] === true;
  const usage = "usage: k3 download [REPO] DIR | k3 download [REPO] --hub-cache (see --help)";
  let repoArg: string | undefined, dir: string | undefined;
  if (useCache) {
    if (positionals.length > 1) throw badInput(`--hub-cache takes no DIR; ${usage}`);
    repoArg = positionals[0];
  } else {
    if (positionals.length < 1 || positionals.length > 2) throw badInput(usage);
    [repoArg, dir] = positionals.length === 2 ? positionals : [undefined, positionals[0]];
  }
  if (repoArg !== undefined && !isRepoId(repoArg)) {
    throw badInput(`'${repoArg}' is not a Hub repo id (owner/name, e.g. ${DEFAULT_REPO})`);
  }
  if (values.revision !== undefined && !/^[\w.\/-]+$/.test(values.revision)) {
    throw badInput(`--revision '${values.revision}' is not a branch, tag or commit name`);
  }
  return {
    useCache,
    repoArg,
    dir,
    revision: values.revision,
    include: values.include ?? [],
    exclude: values.exclude ?? [],
    connections: intFlag("connections", values.connections, 8, 1, 64),
    pieceSize: sizeFlag(values["piece-size"]),
    retryFor: numberFlag("retry-for", values["retry-for"], 0, 1e7) ?? 600,
    stallTimeout: numberFlag("stall-timeout", values["stall-timeout"], 0.1, 1e5) ?? 60,
  };
}

/**
 * Where the command speaks: through the status line while it shows, else stderr; the token
 * never. `log` is for the lines only --verbose shows.
 */
class Voice {
  line: StatusLine | undefined;
  /** The transfer's counters, once the file list is known. */
  stats: TransferStats | undefined;
  readonly log: ((s: string) => void) | undefined;
  constructor(private readonly token: HubToken | undefined, readonly verbose: boolean) {
    this.log = verbose ? this.say : undefined;
  }
  say = (s: string) => {
    if (this.line) this.line.print(redact(s, this.token));
    else console.error(redact(s, this.token));
  };
}

/** Which repo and commit: the folder's record wins, unless --revision says otherwise. */
async function chooseCommit(
  ctx: HubContext,
  req: DownloadRequest,
): Promise<{ repo: string; commit: string; recorded?: Manifest }> {
  const { repoArg, dir } = req;
  let repo = repoArg ?? DEFAULT_REPO;
  let recorded: Manifest | undefined;
  let commit: string;
  if (!req.useCache) {
    recorded = readManifest(dir!);
    if (recorded && repoArg !== undefined && recorded.repo !== repoArg) {
      throw badInput(
        `${dir} holds ${recorded.repo}, not ${repoArg}: pick another DIR for ${repoArg}`,
      );
    }
    if (recorded) repo = recorded.repo;
  }
  if (recorded && req.revision === undefined) commit = recorded.commit;
  else {
    commit = isCommit(req.revision)
      ? req.revision
      : await resolveCommit(ctx, repo, req.revision ?? "main");
  }
  if (recorded && commit !== recorded.commit) {
    throw badInput(
      `${dir} holds ${repo} at commit ${recorded.commit} (${recorded.revision}); ` +
        `--revision ${req.revision} is commit ${commit}: pick another DIR, or drop ` +
        `--revision to finish the recorded one`,
    );
  }
  return { repo, commit, recorded };
}

/** Where the download goes and what is already recorded there. */
interface Destination {
  repo: string;
  commit: string;
  target: Target;
  recorded?: Manifest;
}

/**
 * The files wanted (the recorded ones and those --include/--exclude pick), the manifest to
 * record, and the transfer prepared against the bytes already on disk.
 */
async function prepareDownload(
  ctx: HubContext,
  req: DownloadRequest,
  { repo, commit, target, recorded }: Destination,
  log: ((s: string) => void) | undefined,
): Promise<{ manifest: Manifest; prepared: PreparedTransfer }> {
  const files = recorded?.commit === commit
    ? recorded.files
    : await listCommitFiles(ctx, repo, commit);
  const chosen = selectPaths(files, req.include, req.exclude);
  if (chosen.length === 0) {
    throw badInput(`--include/--exclude leave no file of ${repo}@${commit.slice(0, 12)}`);
  }
  const wanted = new Set([...(recorded?.wanted ?? []), ...chosen]);
  const manifest: Manifest = {
    format: MANIFEST_FORMAT,
    repo,
    revision: recorded?.revision ?? req.revision ?? "main",
    commit,
    endpoint: ctx.endpoint,
    files,
    wanted: files.map((f) => f.path).filter((p) => wanted.has(p)),
  };
  const jobs = jobsFor(files.filter((f) => wanted.has(f.path)));
  const prepared = await prepare({
    endpoint: ctx.endpoint,
    repo,
    commit,
    token: ctx.token,
    connections: req.connections,
    pieceSize: req.pieceSize,
    policy: ctx.policy,
    target,
    log,
  }, jobs);
  return { manifest, prepared };
}

/** Free space against what is still missing, before a single byte is fetched. */
async function checkFreeSpace(
  req: DownloadRequest,
  repo: string,
  commit: string,
  target: Target,
  missing: number,
): Promise<void> {
  await Deno.mkdir(target.partialDir, { recursive: true });
  const free = freeBytes(target.partialDir);
  if (missing > free) {
    throw badInput(
      `not enough free space: ${repo}@${commit.slice(0, 12)} needs ` +
        `${formatSize(missing)} more in ${target.partialDir}, which has ` +
        `${formatSize(free)} free. Free ${formatSize(missing - free)} or pick ` +
        `another ${req.useCache ? "HF_HUB_CACHE" : "DIR"}; nothing was downloaded`,
    );
  }
}

/** Runs the transfer under a status line, moves the files into place and sums it up. */
async function fetchWithProgress(
  voice: Voice,
  repo: string,
  commit: string,
  target: Target,
  manifest: Manifest,
  prepared: PreparedTransfer,
): Promise<void> {
  const s = prepared.stats;
  const tty = Deno.stderr.isTerminal();
  voice.say(
    `${repo}@${commit.slice(0, 12)}: ${s.filesTotal} files, ${formatSize(s.bytesTotal)}; ` +
      `${formatSize(prepared.missing)} to fetch into ${target.root}`,
  );
  const line = new StatusLine(
    `${repo.split("/").pop()}@${commit.slice(0, 7)}`,
    {
      done: () => s.bytesDone,
      total: () => s.bytesTotal,
      moved: () => s.bytesFetched,
      extra: () => `files ${s.filesDone}/${s.filesTotal}`,
    },
    tty,
    pipeProgressSeconds(),
  );
  voice.line = line;
  line.start();
  await prepared.run();
  await target.finish(manifest.revision, commit);
  line.stop();
  const secs = line.seconds;
  voice.line = undefined;
  voice.say(
    `downloaded ${repo}@${commit.slice(0, 12)} into ${target.root}: ${s.filesTotal} files, ` +
      `${formatSize(s.bytesTotal)} (fetched ${formatSize(s.bytesFetched)} in ` +
      `${formatDuration(secs)}, ${formatSize(s.bytesFetched / Math.max(secs, 1e-3))}/s; ` +
      `${formatSize(s.bytesKept)} kept from before; hashed ` +
      `${formatSize(s.bytesHashed)}), ` +
      (s.filesKept === 0
        ? "every file verified"
        : `${s.filesTotal - s.filesKept} fetched and verified; ${s.filesKept} already in ` +
          `place, checked by size (k3 verify hashes every file)`),
  );
}

/** What is fetched, from where, into where, and how much when DIR's record says. */
function openingLine(req: DownloadRequest, endpoint: string): string {
  let recorded: Manifest | undefined;
  try {
    recorded = req.useCache ? undefined : readManifest(req.dir!);
  } catch {
    // A record that cannot be read is reported by the download itself, named.
  }
  const repo = req.repoArg ?? recorded?.repo ?? DEFAULT_REPO;
  const revision = req.revision ?? recorded?.revision ?? "main";
  const wanted = new Set(recorded?.wanted ?? []);
  const size = recorded?.files.filter((f) => wanted.has(f.path))
    .reduce((a, f) => a + f.size, 0);
  const how = size ? ` (${formatSize(size)} recorded in ${req.dir})` : "";
  return `k3 download: ${repo}@${revision}${how} from ${endpoint} into ` +
    `${req.useCache ? "the Hub cache" : req.dir}`;
}

/** Seconds between progress lines in a pipe or log: $K3_PROGRESS_EVERY, else 10. */
function pipeProgressSeconds(): number {
  const every = Number(Deno.env.get("K3_PROGRESS_EVERY") ?? "10");
  return Number.isFinite(every) && every > 0 ? every : 10;
}

/** A wall-clock time as "14:03:27", for a line saying when something happens next. */
function clock(at: Date): string {
  return at.toTimeString().slice(0, 8);
}

/** One retry: what failed and why, when the next attempt comes, when k3 will give up. */
function retryLine(what: string, failure: string, seconds: number, left: number): string {
  const next = clock(new Date(Date.now() + seconds * 1000));
  return `retry ${what} in ${seconds.toFixed(1)} s: ${failure} (next attempt at ${next}; ` +
    `giving up if it still fails in ${Math.max(0, left).toFixed(1)} s, --retry-for)`;
}

/** The closing line of a download that did not finish: how long, how far. */
function stoppedLine(err: K3Error, seconds: number, s: TransferStats | undefined): string {
  const how = err.exitCode === ExitCode.interrupted ? "interrupted" : "failed";
  const far = s
    ? `fetched ${formatSize(s.bytesFetched)}; ${formatSize(s.bytesDone)} of ` +
      `${formatSize(s.bytesTotal)} on disk, files ${s.filesDone}/${s.filesTotal}`
    : "nothing fetched (the file list never arrived)";
  return `download ${how} after ${seconds.toFixed(1)} s: ${far}`;
}

/** An error of a file-system call (Deno's error classes, or an OS error number). */
function fileSystemError(e: unknown): e is Error {
  if (!(e instanceof Error)) return false;
  return Object.values(Deno.errors).some((c) => e instanceof c) ||
    /\(os error \d+\)/.test(e.message);
}

/** The error as the user sees it: exit code chosen, the token never in the text. */
function userError(e: unknown, token: ReturnType<typeof hubToken>, partialDir: string): K3Error {
  const kept = partialDir && existsSync(partialDir)
    ? ` Partial data is kept in ${partialDir}; re-run the same command to resume.`
    : "";
  let err: K3Error;
  if (e instanceof GaveUp) {
    err = networkFailure(
      `network failure: ${e.message}. Check the connection and HF_ENDPOINT (or raise ` +
        `--retry-for), then re-run the same command.${kept}`,
    );
  } else if (fileSystemError(e)) {
    // The network's failures are retried (Transient); what is left is the disk: exit 2.
    const what = firstLine(e);
    err = /\(os error 28\)/.test(what)
      ? badInput(
        `the disk filled up during the download (${what}). Partial data is kept in ` +
          `${partialDir}; free some space, then re-run the same command to resume.`,
      )
      : badInput(`cannot write the download (${what}): pick a folder you can write.${kept}`);
  } else if (e instanceof K3Error) {
    err = e.exitCode === ExitCode.interrupted || e.exitCode === ExitCode.runInvalid
      ? new K3Error(`${e.message}${e.message.endsWith(".") ? "" : "."}${kept}`, e.exitCode)
      : e;
  } else {
    err = new K3Error(
      `internal error (please report): ${(e as Error)?.stack ?? e}`,
      ExitCode.internal,
    );
  }
  return new K3Error(redact(err.message, token), err.exitCode);
}
