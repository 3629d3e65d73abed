/**
 * A stand-in for the Hugging Face Hub, for the download tests: two Deno HTTP servers on
 * 127.0.0.1 (port 0). The "hub" answers the API shapes `k3 download` uses (model info with
 * `sha` and siblings, the paginated tree API with LFS oids and sizes, `resolve` with its
 * headers and a redirect) and checks Bearer tokens; the "storage" host (another origin, like
 * the Hub's CDN) serves LFS blobs by SHA-256 behind expiring links, with Range support.
 * Faults are injected on request; every request is logged (never its headers).
 */
import { createHash } from "node:crypto";
import * as path from "node:path";

export type FaultKind = "status" | "cut" | "corrupt" | "slow" | "stall" | "redirect";

export interface Fault {
  /** Which requests: the API, the hub's resolve, or the storage host. */
  where: "api" | "resolve" | "storage";
  kind: FaultKind;
  /** For "status". */
  status?: number;
  /** For "redirect": the Location sent (with a 302), taken as is. */
  location?: string;
  retryAfter?: number;
  /** Only requests whose path contains this. */
  match?: string;
  /** How many requests it hits (default 1; Infinity for all). */
  times?: number;
}

interface RepoFile {
  path: string;
  bytes: Uint8Array;
  /** The size the listing claims (defaults to the real one). */
  size: number;
  lfs: boolean;
  sha256: string;
  gitOid: string;
}

export interface StandInOptions {
  repo: string;
  /** Folder whose files (recursively) are the repo's content. */
  source: string;
  /** Tokens the hub accepts. A request with any other token gets 401. */
  tokens?: string[];
  /** The repo is private or gated: requests without a valid token get 401. */
  private?: boolean;
  /** Tree API page size (small, so the client must follow Link headers). */
  pageSize?: number;
  /** Bytes per second for storage bodies, all connections together (0 = unlimited). */
  rate?: number;
  /** Listed sizes that differ from the real ones (for the free-space check). */
  claimSizes?: Record<string, number>;
  /**
   * A hostile tree API: "self", every page's next link is the page itself; "endless", past
   * the files come empty pages, each linking to a new one; "flood", past the files come pages
   * of made-up files, without end.
   */
  treeLinks?: "self" | "endless" | "flood";
}

function sha1Hex(data: Uint8Array | string): string {
  return createHash("sha1").update(data).digest("hex");
}

function listFolder(root: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(path.join(root, rel))) {
    const p = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory) out.push(...listFolder(root, p));
    else if (e.isFile) out.push(p);
  }
  return out.sort();
}

function json(body: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

export class StandInHub {
  readonly files: RepoFile[];
  readonly branches = new Map<string, string>();
  readonly commits = new Set<string>();
  /** Access log: "hub GET /path?query bytes=a-b -> 206" (no headers, ever). */
  readonly log: { t: number; line: string }[] = [];
  faults: Fault[] = [];
  /** Requests to the storage host that carried an Authorization header (must stay 0). */
  storageAuthSeen = 0;
  /** Body bytes sent by the storage host. */
  bytesServed = 0;
  /** Storage links live this long (ms); expired ones get 403 like a signed URL. */
  linkLifetime = 3_600_000;
  #hub!: Deno.HttpServer<Deno.NetAddr>;
  #storage!: Deno.HttpServer<Deno.NetAddr>;
  #rateNext = 0;
  readonly #open = new Set<ReadableStreamDefaultController<Uint8Array>>();
  readonly #closing = new AbortController();

  private constructor(readonly opts: StandInOptions) {
    this.files = listFolder(opts.source).map((p) => {
      const bytes = Deno.readFileSync(path.join(opts.source, p));
      return {
        path: p,
        bytes,
        size: opts.claimSizes?.[p] ?? bytes.length,
        lfs: /\.(safetensors|model|bin)$/.test(p),
        sha256: createHash("sha256").update(bytes).digest("hex"),
        gitOid: createHash("sha1").update(`blob ${bytes.length}\0`).update(bytes).digest("hex"),
      };
    });
    this.newCommit("main");
  }

  static start(opts: StandInOptions): StandInHub {
    const hub = new StandInHub(opts);
    const quiet = { hostname: "127.0.0.1", port: 0, onListen() {} };
    hub.#hub = Deno.serve(quiet, (req) => hub.#handleHub(req));
    hub.#storage = Deno.serve(quiet, (req) => hub.#handleStorage(req));
    return hub;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${this.#hub.addr.port}`;
  }

  get storageOrigin(): string {
    return `http://127.0.0.1:${this.#storage.addr.port}`;
  }

  /** The commit `main` points at. */
  get commit(): string {
    return this.branches.get("main")!;
  }

  /** A new commit (same files) that `branch` now points at. */
  newCommit(branch: string): string {
    const c = sha1Hex(`commit ${this.commits.size} ${this.files.map((f) => f.sha256).join()}`);
    this.commits.add(c);
    this.branches.set(branch, c);
    return c;
  }

  /** The access log as text. */
  logText(): string {
    return this.log.map((l) => l.line).join("\n");
  }

  /** Waits `ms`, or less when the stand-in closes (so no timer outlives a test). */
  #sleep(ms: number): Promise<void> {
    const signal = this.#closing.signal;
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done);
    });
  }

  async close(): Promise<void> {
    this.#closing.abort();
    for (const c of this.#open) {
      try {
        c.close();
      } catch { /* already closed */ }
    }
    await Promise.all([this.#hub.shutdown(), this.#storage.shutdown()]);
  }

  #fault(where: Fault["where"], pathname: string): Fault | undefined {
    const f = this.faults.find((f) =>
      f.where === where && (f.times ?? 1) > 0 && (!f.match || pathname.includes(f.match))
    );
    if (f) f.times = (f.times ?? 1) - 1;
    return f;
  }

  #record(server: string, req: Request, status: number): void {
    const u = new URL(req.url);
    const range = req.headers.get("range") ?? "";
    this.log.push({
      t: performance.now(),
      line: `${server} ${req.method} ${u.pathname}${u.search} ${range} -> ${status}`.trim(),
    });
  }

  /** 401 for a bad token (any repo) or no token (private repo); undefined when allowed. */
  #auth(req: Request): Response | undefined {
    const h = req.headers.get("authorization");
    const token = h?.match(/^Bearer (.+)$/)?.[1];
    if (h !== null && !(this.opts.tokens ?? []).includes(token ?? "")) {
      return json({ error: "Invalid credentials in Authorization header" }, 401);
    }
    if (h === null && this.opts.private) {
      return json({ error: "Access to this repo is restricted. You must be authenticated." }, 401, {
        "x-error-code": "GatedRepo",
      });
    }
  }

  #revision(rev: string): string | undefined {
    rev = decodeURIComponent(rev);
    return this.commits.has(rev) ? rev : this.branches.get(rev);
  }

  #handleHub(req: Request): Response {
    const res = this.#routeHub(req);
    this.#record("hub", req, res.status);
    return res;
  }

  #routeHub(req: Request): Response {
    const u = new URL(req.url);
    const repo = this.opts.repo;
    const isApi = u.pathname.startsWith("/api/");
    const fault = this.#fault(isApi ? "api" : "resolve", u.pathname);
    if (fault?.kind === "status") return this.#statusFault(fault);
    if (fault?.kind === "redirect") return this.#redirectFault(fault);
    const denied = this.#auth(req);
    if (denied) return denied;

    const info = u.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/);
    if (info) {
      if (info[1] !== repo) return json({ error: "Repository not found" }, 404);
      const commit = this.#revision(info[2]);
      if (!commit) {
        return json({ error: `Invalid rev id: ${info[2]}` }, 404, {
          "x-error-code": "RevisionNotFound",
        });
      }
      const blobs = u.searchParams.get("blobs") === "true";
      return json({
        _id: "0123456789abcdef01234567",
        id: repo,
        sha: commit,
        private: !!this.opts.private,
        gated: false,
        downloads: 0,
        likes: 0,
        lastModified: "2026-01-01T00:00:00.000Z",
        pipeline_tag: "text-generation",
        siblings: this.files.map((f) =>
          blobs
            ? {
              rfilename: f.path,
              size: f.size,
              blobId: f.gitOid,
              ...(f.lfs ? { lfs: { sha256: f.sha256, size: f.size, pointerSize: 134 } } : {}),
            }
            : { rfilename: f.path }
        ),
      });
    }
    const tree = u.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)$/);
    if (tree) {
      if (tree[1] !== repo) return json({ error: "Repository not found" }, 404);
      const commit = this.#revision(tree[2]);
      if (!commit) return json({ error: "Invalid rev id" }, 404);
      return this.#treePage(u);
    }
    const resolve = u.pathname.match(/^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/);
    if (resolve) {
      if (resolve[1] !== repo) return json({ error: "Repository not found" }, 404);
      const commit = this.#revision(resolve[2]);
      if (!commit) return json({ error: "Invalid rev id" }, 404);
      const file = this.files.find((f) => f.path === decodeURIComponent(resolve[3]));
      if (!file) {
        return json({ error: "Entry not found" }, 404, { "x-error-code": "EntryNotFound" });
      }
      const common = { "x-repo-commit": commit, "accept-ranges": "bytes" };
      if (file.lfs) {
        const exp = Date.now() + this.linkLifetime;
        return new Response(null, {
          status: 302,
          headers: {
            ...common,
            location: `${this.storageOrigin}/blobs/${file.sha256}?expires=${exp}&signature=x`,
            "x-linked-size": String(file.size),
            "x-linked-etag": `"${file.sha256}"`,
            etag: `"${file.gitOid}"`,
          },
        });
      }
      return this.#body(req, file, { ...common, etag: `"${file.gitOid}"` }, fault);
    }
    return json({ error: "not found" }, 404);
  }

  /** One page of the tree API, with its Link to the next (see `treeLinks`). */
  #treePage(u: URL): Response {
    const page = this.opts.pageSize ?? 1000;
    const cursor = Number(u.searchParams.get("cursor") ?? 0);
    const entries = this.files.slice(cursor, cursor + page).map((f) => ({
      type: "file",
      oid: f.gitOid,
      size: f.lfs ? 134 : f.size,
      path: f.path,
      ...(f.lfs ? { lfs: { oid: f.sha256, size: f.size, pointerSize: 134 } } : {}),
    }));
    const mode = this.opts.treeLinks;
    if (mode === "flood" && cursor >= this.files.length) {
      for (let i = 0; i < page; i++) {
        const n = cursor + i;
        entries.push({ type: "file", oid: sha1Hex(`${n}`), size: 1, path: `flood/${n}.txt` });
      }
    }
    const headers: Record<string, string> = {};
    const next = new URL(u);
    if (mode !== "self") next.searchParams.set("cursor", String(cursor + page));
    if (mode || cursor + page < this.files.length) headers.link = `<${next.href}>; rel="next"`;
    return json(entries, 200, headers);
  }

  #handleStorage(req: Request): Response {
    const res = this.#routeStorage(req);
    this.#record("storage", req, res.status);
    return res;
  }

  #routeStorage(req: Request): Response {
    const u = new URL(req.url);
    if (req.headers.has("authorization")) this.storageAuthSeen++;
    const fault = this.#fault("storage", u.pathname);
    if (fault?.kind === "status") return this.#statusFault(fault);
    if (fault?.kind === "redirect") return this.#redirectFault(fault);
    const m = u.pathname.match(/^\/blobs\/([0-9a-f]{64})$/);
    const file = this.files.find((f) => f.lfs && f.sha256 === m?.[1]);
    if (!file) return new Response("NoSuchKey", { status: 404 });
    if (Number(u.searchParams.get("expires")) < Date.now()) {
      return new Response("Request has expired", { status: 403 });
    }
    return this.#body(req, file, { etag: `"${file.sha256}"` }, fault, true);
  }

  #redirectFault(f: Fault): Response {
    return new Response(null, { status: 302, headers: { location: f.location! } });
  }

  #statusFault(f: Fault): Response {
    const headers: Record<string, string> = {};
    if (f.retryAfter !== undefined) headers["retry-after"] = String(f.retryAfter);
    return json({ error: `injected HTTP ${f.status}` }, f.status!, headers);
  }

  /** The file's bytes for a GET (Range honoured), shaped by a fault. HEAD gets headers. */
  #body(
    req: Request,
    file: RepoFile,
    headers: Record<string, string>,
    fault: Fault | undefined,
    limited = false,
  ): Response {
    const size = file.bytes.length;
    let start = 0, end = size - 1, status = 200;
    const range = req.headers.get("range")?.match(/^bytes=(\d+)-(\d*)$/);
    if (range) {
      start = Number(range[1]);
      end = range[2] === "" ? size - 1 : Math.min(Number(range[2]), size - 1);
      if (start > end || start >= size) {
        return new Response(null, { status: 416, headers: { "content-range": `bytes */${size}` } });
      }
      status = 206;
      headers["content-range"] = `bytes ${start}-${end}/${size}`;
    }
    headers["content-length"] = String(end - start + 1);
    if (req.method === "HEAD") return new Response(null, { status, headers });
    const data = file.bytes.slice(start, end + 1);
    if (fault?.kind === "corrupt") data[Math.floor(data.length / 2)] ^= 0xff;
    const cutAt = fault?.kind === "cut" ? Math.floor(data.length / 2) : -1;
    const stallAt = fault?.kind === "stall" ? Math.floor(data.length / 2) : -1;
    const chunk = fault?.kind === "slow" ? 4096 : 65536;
    let at = 0;
    const body = new ReadableStream<Uint8Array>({
      start: (c) => {
        this.#open.add(c);
      },
      pull: async (c) => {
        if (at === cutAt) {
          this.#open.delete(c);
          return c.close(); // short of Content-Length: the client sees the connection drop
        }
        if (at === stallAt) {
          await this.#sleep(30_000); // stalls until the client gives up or the stand-in closes
          this.#open.delete(c);
          return c.close();
        }
        if (fault?.kind === "slow") await this.#sleep(5);
        const n = Math.min(
          chunk,
          data.length - at,
          (cutAt > at ? cutAt : Infinity) - at,
          (stallAt > at ? stallAt : Infinity) - at,
        );
        if (limited && this.opts.rate) await this.#throttle(n);
        c.enqueue(data.subarray(at, at + n));
        at += n;
        if (limited) this.bytesServed += n;
        if (at >= data.length) {
          this.#open.delete(c);
          c.close();
        }
      },
      cancel: () => {},
    });
    return new Response(body, { status, headers });
  }

  /** Paces storage bodies to `rate` bytes/s across all connections. */
  async #throttle(n: number): Promise<void> {
    const now = performance.now();
    this.#rateNext = Math.max(this.#rateNext, now) + (1000 * n) / this.opts.rate!;
    const wait = this.#rateNext - now - (1000 * n) / this.opts.rate!;
    if (wait > 0) await this.#sleep(wait);
  }
}

/**
 * By hand (for a transcript, or to try `k3 download` without the Hub):
 *   deno run -A tests/support/hub_standin.ts REPO SOURCE_DIR [TOKEN] [--rate BYTES_PER_S]
 * serves SOURCE_DIR as REPO until Ctrl-C and prints the HF_ENDPOINT to use.
 */
if (import.meta.main) {
  const rateAt = Deno.args.indexOf("--rate");
  const rate = rateAt >= 0 ? Number(Deno.args[rateAt + 1]) : 0;
  const rest = rateAt < 0
    ? Deno.args
    : Deno.args.filter((_, i) => i !== rateAt && i !== rateAt + 1);
  const [repo, source, token] = rest;
  if (!repo || !source || !(rate >= 0)) {
    console.error(
      "usage: deno run -A tests/support/hub_standin.ts REPO SOURCE_DIR [TOKEN] [--rate B/s]",
    );
    Deno.exit(2);
  }
  const hub = StandInHub.start({
    repo,
    source,
    tokens: token ? [token] : [],
    private: !!token,
    rate,
  });
  console.log(
    `HF_ENDPOINT=${hub.endpoint}  (${repo}, commit ${hub.commit}, ${hub.files.length} files)`,
  );
  const stop = () => hub.close().then(() => Deno.exit(0));
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
}
