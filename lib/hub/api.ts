/**
 * The Hub's API through npm `@huggingface/hub`: `modelInfo` resolves a revision to its commit,
 * `listFiles` lists the commit's files with sizes and LFS SHA-256 (following the tree API's
 * pagination), both against our endpoint and token. Their requests go through our retrying
 * fetch, and their errors become messages that say what to do, with the right exit code.
 */
import { HubApiError, listFiles, modelInfo } from "@huggingface/hub";
import { badInput, K3Error } from "../errors.ts";
import { type HubToken, redact } from "./endpoint.ts";
import { netFetch, type RetryPolicy, transientStatus, withRetries } from "./http.ts";
import { fileProblem, isCommit, type ManifestFile } from "./manifest.ts";

export const DEFAULT_REPO = "moonshotai/Kimi-K3";

/** `owner/name` (or a bare legacy `name`) as the Hub spells repo ids. */
export function isRepoId(s: string): boolean {
  return /^(?:[A-Za-z0-9][\w.-]{0,95}\/)?[A-Za-z0-9][\w.-]{0,95}$/.test(s) && !s.includes("..");
}

export interface HubContext {
  endpoint: string;
  token?: HubToken;
  policy: RetryPolicy;
}

/** A `fetch` for the library's calls: retried on 5xx, 429 and dropped connections. */
function retryingFetch(ctx: HubContext): typeof fetch {
  const host = new URL(ctx.endpoint).host;
  return (input, init) =>
    withRetries("the Hub API", ctx.policy, async () => {
      const url = input instanceof Request ? input.url : String(input);
      const { signal, stallTimeout } = ctx.policy;
      const res = await netFetch(url, { ...init, signal }, host, stallTimeout);
      return transientStatus(res, host);
    });
}

/** Resolves `revision` (branch, tag or commit) of `repo` to its 40-hex commit. */
export async function resolveCommit(
  ctx: HubContext,
  repo: string,
  revision: string,
): Promise<string> {
  const info = await hubCall(ctx, repo, revision, () =>
    modelInfo({
      name: repo,
      revision,
      hubUrl: ctx.endpoint,
      accessToken: ctx.token?.value,
      additionalFields: ["sha"],
      fetch: retryingFetch(ctx),
    }));
  if (!isCommit(info.sha)) {
    throw new K3Error(
      `the Hub's answer for ${repo}@${revision} has no commit id (sha: ${info.sha})`,
      4,
    );
  }
  return info.sha;
}

/**
 * The most pages and entries a file list may have. The release has about a hundred files and
 * the Hub pages a thousand entries at a time; a list past these bounds is a Hub (or something
 * posing as it) that never ends, and following it would only grow memory.
 */
const MAX_LIST_PAGES = 1000;
const MAX_LIST_ENTRIES = 100_000;

/**
 * The library's fetch for one paginated listing, refusing (exit 4) a page asked for twice
 * (pages that link back to themselves or to an earlier page never end) and more than
 * {@link MAX_LIST_PAGES} pages.
 */
function pageFetch(ctx: HubContext, what: string): typeof fetch {
  const inner = retryingFetch(ctx);
  const seen = new Set<string>();
  return (input, init) => {
    const url = input instanceof Request ? input.url : String(input);
    if (seen.has(url)) {
      throw new K3Error(
        redact(
          `${what}: the Hub's page ${url} links back to a page it already sent (page ` +
            `${seen.size + 1} repeats one): its pages never end; try again later, or report it`,
          ctx.token,
        ),
        4,
      );
    }
    if (seen.size >= MAX_LIST_PAGES) {
      throw new K3Error(
        `${what}: the Hub sent ${MAX_LIST_PAGES} pages and links to more (${
          redact(url, ctx.token)
        }); ` +
          `no model repo has that many: k3 stops here`,
        4,
      );
    }
    seen.add(url);
    return inner(input, init);
  };
}

/** Every file of `commit` with its size and hash. */
export async function listCommitFiles(
  ctx: HubContext,
  repo: string,
  commit: string,
): Promise<ManifestFile[]> {
  const what = `the Hub's file list for ${repo}@${commit}`;
  return await hubCall(ctx, repo, commit, async () => {
    const files: ManifestFile[] = [];
    const paths = new Set<string>();
    let entries = 0;
    for await (
      const e of listFiles({
        repo: { type: "model", name: repo },
        revision: commit,
        recursive: true,
        hubUrl: ctx.endpoint,
        accessToken: ctx.token?.value,
        fetch: pageFetch(ctx, what),
      })
    ) {
      if (++entries > MAX_LIST_ENTRIES) {
        throw new K3Error(
          `${what}: more than ${MAX_LIST_ENTRIES} entries; no model repo has that many: ` +
            `k3 stops here`,
          4,
        );
      }
      if (e.type !== "file") continue;
      const f: ManifestFile = e.lfs
        ? { path: e.path, size: e.lfs.size, sha256: e.lfs.oid }
        : { path: e.path, size: e.size, git_oid: e.oid };
      const problem = fileProblem(f);
      if (problem) throw new K3Error(`${what}: ${problem}`, 4);
      if (paths.has(f.path)) throw new K3Error(`${what}: lists ${f.path} twice`, 4);
      paths.add(f.path);
      files.push(f);
    }
    return files;
  });
}

/** Runs a library call; maps its errors to what the user should do. */
async function hubCall<T>(
  ctx: HubContext,
  repo: string,
  revision: string,
  call: () => Promise<T>,
): Promise<T> {
  try {
    return await call();
  } catch (e) {
    if (e instanceof HubApiError) throw hubStatusError(ctx, e.statusCode, repo, revision);
    if (e instanceof TypeError && /access token must start with/.test(e.message)) {
      throw badInput(
        `the Hub token from ${ctx.token?.source} is not a Hugging Face token (they start with ` +
          `hf_): fix it or unset it`,
      );
    }
    if (e instanceof K3Error || e instanceof DOMException || (e as Error)?.name === "GaveUp") {
      throw e;
    }
    throw new K3Error(redact(`the Hub's answer was not understood: ${e}`, ctx.token), 4);
  }
}

/** The user-facing error for an HTTP status from the Hub itself (exit 2: fix the input). */
export function hubStatusError(
  ctx: HubContext,
  status: number,
  repo: string,
  revision: string,
  file?: string,
): K3Error {
  const what = file ? `${file} of ${repo}@${revision}` : `${repo}@${revision}`;
  const at = ctx.endpoint;
  if (status === 401) {
    return badInput(
      ctx.token
        ? `the Hub (${at}) rejected the token from ${ctx.token.source} (HTTP 401 for ${what}): check it at ` +
          `${at}/settings/tokens, or unset it for public repos`
        : `the Hub (${at}) wants a token for ${what} (HTTP 401): the repo is private, gated or ` +
          `does not exist; set HF_TOKEN or log in with \`hf auth login\``,
    );
  }
  if (status === 403) {
    return badInput(
      `the Hub (${at}) refused access to ${what} (HTTP 403): the repo is gated or the token ` +
        `lacks read access; accept the terms at ${at}/${repo} with the token's account`,
    );
  }
  if (status === 404) {
    return badInput(
      `the Hub (${at}) has no ${what} (HTTP 404): check the repo id and --revision`,
    );
  }
  if (status === 400) {
    return badInput(`the Hub (${at}) calls the request for ${what} malformed (HTTP 400)`);
  }
  return new K3Error(`the Hub (${at}) answered HTTP ${status} for ${what}`, 4);
}
