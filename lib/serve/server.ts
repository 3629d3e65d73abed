/**
 * The HTTP server: routing, authentication, CORS, body limits, and one way to answer every
 * generation API (whole or streamed) with the wire formats of openai.ts, responses.ts and
 * anthropic.ts. Every generation goes through the one Session, which runs the running
 * requests' steps as one forward pass (continuous batching) while HTTP keeps flowing between
 * passes and layers.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { anthropicErrorBody, MESSAGES_API, parseCountTokensRequest } from "./anthropic.ts";
import { anthropicModel, anthropicModelList } from "./models.ts";
import { detokenize, tokenize } from "./tokenize.ts";
import {
  compileGrammar,
  type GenerationDelta,
  type GenerationResult,
  type PreparedGeneration,
  prepareGeneration,
  runGenerations,
} from "./generation.ts";
import { CHAT_API, COMPLETIONS_API, errorBody, modelEntry } from "./openai.ts";
import { ApiError, apiErrorOf, checkDepth, isRecord } from "./request.ts";
import { RESPONSES_API } from "./responses.ts";
import { ServeMetrics } from "./metrics.ts";
import {
  OLLAMA_CHAT_API,
  OLLAMA_GENERATE_API,
  ollamaErrorBody,
  ollamaPs,
  ollamaShow,
  ollamaTags,
  ollamaVersion,
  type ServedModels,
} from "./ollama.ts";
import { type Engine, formatTiming, type RequestTiming } from "./runner.ts";
import { DEFAULT_KEEPALIVE_SECONDS, SseStream } from "./sse.ts";
import type { CompiledGrammar } from "../text/grammar.ts";
import { HTTP_DEFAULTS, HttpError, serveHttp } from "./http.ts";
import type { ErrorDialect, ResponseMeta, WireFormat, WireRequest } from "./wire.ts";

/** How to serve. */
export interface ServerOptions {
  hostname: string;
  /** 0 picks a free port. */
  port: number;
  /** When set, /v1 requests need `Authorization: Bearer <key>` or `x-api-key: <key>`. */
  apiKey?: string;
  /** Largest request body accepted, in bytes. */
  maxBodyBytes: number;
  /** Prompt plus completion tokens one request may use. */
  contextTokens: number;
  /** The names /v1/models lists and requests may use; the first is the one answers carry. */
  modelNames: string[];
  /**
   * Origins a browser may call from (`*` for any). Absent or empty: no CORS, and a request
   * that carries an Origin header (a web page's) is refused.
   */
  corsOrigins?: string[];
  /** Where the one line per request goes (default: stderr). */
  log?: (line: string) => void;
  /** How many recent requests /health shows (default 32). */
  recent?: number;
  /** Connections served at once; more get a 503 (default 128). */
  maxConnections?: number;
  /** Milliseconds for a request head to arrive, idle keep-alive included (default 10 s). */
  headerTimeoutMs?: number;
  /** Milliseconds for a request body to arrive (default 60 s). */
  bodyTimeoutMs?: number;
  /** Milliseconds for the client to take one write of a response (default 30 s). */
  writeTimeoutMs?: number;
  /**
   * Seconds a streamed answer may stay silent (queued, prefilling) before it gets a
   * keep-alive: an SSE comment, or Anthropic's `ping` event (default 15; 0: never).
   */
  keepAliveSeconds?: number;
}

/** A running server. */
export interface K3Server {
  /** `http://host:port` (no trailing slash). */
  url: string;
  port: number;
  /**
   * Stops listening, lets running generations go on for up to `drainMs` (default 0), then
   * cancels the rest (their clients get a "shutting down" error) and waits for open
   * responses to end.
   */
  shutdown(drainMs?: number): Promise<void>;
}

/** Starts serving `engine`; resolves once the socket is listening. */
// deno-lint-ignore require-await
export async function startServer(engine: Engine, options: ServerOptions): Promise<K3Server> {
  const app = new App(engine, options);
  const server = serveHttp({
    hostname: options.hostname,
    port: options.port,
    maxConnections: options.maxConnections ?? HTTP_DEFAULTS.maxConnections,
    headerTimeoutMs: options.headerTimeoutMs ?? HTTP_DEFAULTS.headerTimeoutMs,
    bodyTimeoutMs: options.bodyTimeoutMs ?? HTTP_DEFAULTS.bodyTimeoutMs,
    writeTimeoutMs: options.writeTimeoutMs ?? HTTP_DEFAULTS.writeTimeoutMs,
    maxHeaderBytes: HTTP_DEFAULTS.maxHeaderBytes,
    maxBodyBytes: options.maxBodyBytes,
    errorResponse: (status, message, code) =>
      jsonError(
        new ApiError(
          status,
          message,
          status >= 500 ? "server_error" : "invalid_request_error",
          null,
          code,
        ),
      ),
    log: options.log ?? ((line) => console.error(line)),
  }, (req) => app.handleCounted(req));
  const addr = server.addr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  return {
    url: `http://${host}:${addr.port}`,
    port: addr.port,
    shutdown: async (drainMs = 0) => {
      const closed = server.shutdown();
      await app.drain(drainMs);
      app.cancelAll();
      await closed;
      // A cancelled pass stops at its next layer boundary; the caller closes the model next.
      await engine.session.batcher?.idle();
    },
  };
}

type Handler = (req: Request, path: string) => Promise<Response> | Response;

/** How long a browser may cache a preflight answer, in seconds. */
const CORS_MAX_AGE = "600";

/** The request handlers and the state they share. */
class App {
  readonly #created = Math.floor(Date.now() / 1000);
  readonly #keyDigest?: Uint8Array;
  readonly #log: (line: string) => void;
  readonly #recent: RequestTiming[] = [];
  readonly #running = new Set<AbortController>();
  #seq = 0;
  #served = 0;
  /** Set once shutdown cancels what is still running: those answers say so. */
  #stopping = false;
  readonly metrics: ServeMetrics;

  readonly #routes: Record<string, Record<string, Handler>> = {
    "/health": { GET: () => this.#health() },
    "/v1/models": { GET: (req) => this.#models(req) },
    "/v1/models/*": { GET: (req, path) => this.#oneModel(req, path) },
    "/v1/chat/completions": { POST: (req) => this.#generate(req, CHAT_API) },
    "/v1/completions": { POST: (req) => this.#generate(req, COMPLETIONS_API) },
    "/v1/responses": { POST: (req) => this.#generate(req, RESPONSES_API) },
    "/v1/messages": { POST: (req) => this.#generate(req, MESSAGES_API) },
    "/v1/messages/count_tokens": { POST: (req) => this.#countTokens(req) },
    "/v1/embeddings": { POST: () => noEmbeddings() },
    "/tokenize": {
      POST: async (req) => json(await tokenize(this.engine.tokenizer, await this.#body(req))),
    },
    "/detokenize": {
      POST: async (req) => json(detokenize(this.engine.tokenizer, await this.#body(req))),
    },
    "/metrics": { GET: () => this.#metrics() },
    "/api/chat": { POST: (req) => this.#generate(req, OLLAMA_CHAT_API) },
    "/api/generate": { POST: (req) => this.#generate(req, OLLAMA_GENERATE_API) },
    "/api/tags": { GET: () => json(ollamaTags(this.#servedModels())) },
    "/api/ps": { GET: () => json(ollamaPs(this.#servedModels())) },
    "/api/version": { GET: () => json(ollamaVersion()) },
    "/api/show": { POST: (req) => this.#ollamaShow(req) },
    "/api/embed": { POST: () => noEmbeddings() },
    "/api/embeddings": { POST: () => noEmbeddings() },
  };

  constructor(readonly engine: Engine, readonly options: ServerOptions) {
    if (options.modelNames.length === 0) throw new Error("ServerOptions.modelNames is empty");
    if (options.apiKey !== undefined) this.#keyDigest = sha256(options.apiKey);
    this.#log = options.log ?? ((line) => console.error(line));
    this.metrics = new ServeMetrics(engine);
  }

  /** {@link handle}, counted in /metrics by route and status. */
  async handleCounted(req: Request): Promise<Response> {
    const response = await this.handle(req);
    const path = new URL(req.url).pathname;
    this.metrics.request(this.#routeLabel(path), response.status);
    return response;
  }

  /** A known route's path (one label for every model id), else "other". */
  #routeLabel(path: string): string {
    if (path.startsWith("/v1/models/")) return "/v1/models/*";
    return Object.hasOwn(this.#routes, path) ? path : "other";
  }

  /** Every request ends here with a response; errors become the route's API's error bodies. */
  async handle(req: Request): Promise<Response> {
    const path = new URL(req.url).pathname;
    const dialect = dialectOf(req, path);
    const origin = req.headers.get("origin");
    const cors = this.#corsHeaders(origin);
    try {
      if (origin !== null && !cors) {
        throw new ApiError(
          403,
          `requests from web pages (Origin ${origin}) are refused: start k3 serve with ` +
            `--cors ${origin} to allow that origin`,
          "invalid_request_error",
          null,
          "origin_not_allowed",
        );
      }
      const methods = this.#routes[path] ??
        (path.startsWith("/v1/models/") ? this.#routes["/v1/models/*"] : undefined);
      if (methods && req.method === "OPTIONS" && cors) return this.#preflight(req, methods, cors);
      if (needsKey(path)) this.#authorize(req);
      if (!methods) throw noRoute(req.method, path, Object.keys(this.#routes));
      const handler = methods[req.method];
      if (!handler) {
        const allowed = Object.keys(methods).join(", ");
        throw new ApiError(
          405,
          `${path} takes ${allowed}, not ${req.method}`,
          "invalid_request_error",
          null,
          "method_not_allowed",
        );
      }
      return withHeaders(await handler(req, path), cors);
    } catch (e) {
      const error = apiErrorOf(e);
      const detail = error.status >= 500 ? (e as Error).stack ?? String(e) : error.message;
      this.#log(`k3 serve: ${req.method} ${path}: ${error.status} ${detail}`);
      return withHeaders(errorResponse(error, dialect), cors);
    }
  }

  /** Stops every running or queued generation (shutdown). */
  cancelAll(): void {
    this.#stopping = true;
    for (const c of this.#running) c.abort();
  }

  /** Resolves once no generation runs, or after `ms` milliseconds. */
  async drain(ms: number): Promise<void> {
    const deadline = performance.now() + ms;
    while (this.#running.size > 0 && performance.now() < deadline) {
      const wait = Math.min(DRAIN_POLL_MS, deadline - performance.now());
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  // ---- CORS ----

  /** The CORS headers for `origin`, or undefined when it is not allowed (or absent). */
  #corsHeaders(origin: string | null): Record<string, string> | undefined {
    const allowed = this.options.corsOrigins ?? [];
    if (origin === null) return allowed.length > 0 ? {} : undefined;
    if (!allowed.includes("*") && !allowed.includes(origin)) return undefined;
    return { "access-control-allow-origin": origin, vary: "Origin" };
  }

  #preflight(req: Request, methods: Record<string, Handler>, cors: Record<string, string>) {
    const asked = req.headers.get("access-control-request-headers");
    return new Response(null, {
      status: 204,
      headers: {
        ...cors,
        "access-control-allow-methods": [...Object.keys(methods), "OPTIONS"].join(", "),
        "access-control-allow-headers": asked ??
          "authorization, content-type, x-api-key, anthropic-version",
        "access-control-max-age": CORS_MAX_AGE,
      },
    });
  }

  // ---- endpoints ----

  #health(): Response {
    const session = this.engine.session;
    const io = session.model?.stream?.pool.totals();
    return json({
      status: "ok",
      model: this.options.modelNames[0],
      models: this.options.modelNames,
      context_tokens: this.options.contextTokens,
      queue_depth: session.queueDepth,
      in_flight: this.#running.size,
      requests_served: this.#served,
      // The running batch (per-request progress), the waiting queue, the pass counters.
      batch: session.status?.(),
      // Bytes read from disk so far (a model loaded under a memory plan).
      io: io && { trunk_bytes: io.trunkBytes, expert_bytes: io.expertBytes },
      recent: this.#recent,
    });
  }

  async #metrics(): Promise<Response> {
    return new Response(await this.metrics.text(), {
      headers: { "content-type": this.metrics.contentType },
    });
  }

  #servedModels(): ServedModels {
    const { modelNames: names, contextTokens } = this.options;
    return { names, created: this.#created, contextTokens };
  }

  async #ollamaShow(req: Request): Promise<Response> {
    const body = await readJsonBody(req, this.options.maxBodyBytes);
    return json(ollamaShow(body, this.#servedModels(), (name) => this.#modelName(name)));
  }

  #models(req: Request): Response {
    const names = this.options.modelNames;
    if (wantsAnthropic(req)) {
      return json(anthropicModelList(names, this.#created, new URL(req.url).searchParams));
    }
    const data = names.map((name) => modelEntry(name, this.#created));
    return json({ object: "list", data });
  }

  #oneModel(req: Request, path: string): Response {
    let name: string;
    try {
      name = decodeURIComponent(path.slice("/v1/models/".length));
    } catch {
      throw new ApiError(
        400,
        `the model id in ${path} is not valid percent-encoding (URL-encode it as UTF-8)`,
        "invalid_request_error",
        "model",
        "invalid_model_id",
      );
    }
    const model = this.#modelName(name);
    return json(
      wantsAnthropic(req) ? anthropicModel(model, this.#created) : modelEntry(model, this.#created),
    );
  }

  /** A JSON object body within --max-body. */
  #body(req: Request): Promise<Record<string, unknown>> {
    return readJsonBody(req, this.options.maxBodyBytes);
  }

  /**
   * POST /v1/messages/count_tokens: the prompt tokens the same Messages request would
   * prefill, rendered by the same path (any context: a count may exceed it).
   */
  async #countTokens(req: Request): Promise<Response> {
    const body = await this.#body(req);
    checkDepth(body);
    const request = parseCountTokensRequest(body);
    this.#modelName(request.model);
    const prepared = await prepareGeneration(
      this.engine.tokenizer,
      request.spec,
      Number.MAX_SAFE_INTEGER,
    );
    return json({ input_tokens: prepared.promptIds.length });
  }

  /**
   * The body of a streamed answer, kept alive while it is silent (queued, prefilling); a
   * client that leaves aborts `controller`.
   */
  #eventStream(
    framing: WireFormat<WireRequest>["sse"],
    ping: { type: string } | undefined,
    controller: AbortController,
  ): SseStream {
    const sse = new SseStream(
      () => controller.abort(),
      {},
      framing === "ndjson" ? "ndjson" : "sse",
    );
    sse.keepAlive(this.options.keepAliveSeconds ?? DEFAULT_KEEPALIVE_SECONDS, ping);
    return sse;
  }

  /** Any generation API: parse, check, then answer whole or streamed. */
  async #generate<R extends WireRequest>(req: Request, api: WireFormat<R>): Promise<Response> {
    const arrived = performance.now();
    const route = new URL(req.url).pathname;
    const body = await readJsonBody(req, this.options.maxBodyBytes);
    checkDepth(body);
    const request = api.parse(body, this.engine.tokenizer.vocabSize);
    const model = this.#modelName(request.model);
    const prepared = await prepareGeneration(
      this.engine.tokenizer,
      request.spec,
      this.options.contextTokens,
    );
    const grammar = await compileGrammar(this.engine, request.spec);
    // n choices run as n sequences of the batch at once.
    const n = api.choices?.count(request) ?? 1;
    const maxBatch = this.engine.session.maxBatch;
    if (n > maxBatch) {
      throw new ApiError(
        400,
        `n = ${n} choices run as ${n} sequences at once, but this server's batch holds ` +
          `${maxBatch} (k3 serve --max-batch)`,
        "invalid_request_error",
        "n",
        "n_too_large",
      );
    }
    const seq = ++this.#seq;
    const meta: ResponseMeta = {
      id: `${api.idPrefix}${seq}-${crypto.randomUUID().slice(0, 8)}`,
      created: Math.floor(Date.now() / 1000),
      model,
      promptTokens: prepared.promptIds.length,
    };
    const controller = new AbortController();
    if (!request.stream) {
      // A whole answer is cancelled when its client disconnects (request.signal, read only
      // here: Deno also aborts it after a response); a streamed one by its body stream.
      req.signal.addEventListener("abort", () => controller.abort());
      const results = await this.#run(
        route,
        meta.id,
        seq,
        arrived,
        prepared,
        controller,
        n,
        grammar,
      );
      if (this.#stopping && results.some((r) => r.ended === "cancelled")) throw shutdownError();
      return json(
        n > 1 ? api.choices!.whole(meta, request, results) : api.whole(meta, request, results[0]),
      );
    }
    const writers = n > 1
      ? Array.from({ length: n }, (_, i) => api.choices!.stream(meta, request, i))
      : [api.stream(meta, request)];
    const sse = this.#eventStream(api.sse, api.ping, controller);
    const send = (events: unknown[]) => {
      for (const e of events) {
        sse.send(e, api.sse === "typed" ? (e as { type: string }).type : undefined);
      }
    };
    for (const w of writers) send(w.start());
    const onDelta = (i: number, d: GenerationDelta) => send(writers[i].delta(d));
    const onStart = (reused: number) => {
      for (const w of writers) send(w.started?.(reused) ?? []);
    };
    this.#run(
      route,
      meta.id,
      seq,
      arrived,
      prepared,
      controller,
      n,
      grammar,
      onDelta,
      onStart,
    )
      .then((results) => {
        if (results.some((r) => r.ended === "cancelled") || !sse.open) {
          // Cancelled by shutdown while the client still listens: say why, in whole events.
          if (this.#stopping && sse.open) send(writers[0].error(shutdownError()));
          return sse.close();
        }
        results.forEach((r, i) => send(writers[i].end(r)));
        if (n > 1) send(api.choices!.usage(meta, request, results));
        if (api.sse === "data") sse.done();
        else sse.close();
      }).catch((e) => {
        this.#log(`k3 serve: ${meta.id}: ${(e as Error).stack ?? e}`);
        send(writers[0].error(apiErrorOf(e)));
        sse.close();
      });
    return sse.response;
  }

  // ---- shared steps ----

  #authorize(req: Request): void {
    if (!this.#keyDigest) return;
    const bearer = /^Bearer\s+(.+)$/i.exec(req.headers.get("authorization") ?? "")?.[1]?.trim();
    const given = bearer ?? req.headers.get("x-api-key")?.trim();
    if (given === undefined || given === "") {
      throw new ApiError(
        401,
        "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
        "invalid_request_error",
        null,
        "invalid_api_key",
      );
    }
    if (!timingSafeEqual(sha256(given), this.#keyDigest)) {
      throw new ApiError(
        401,
        "incorrect API key",
        "invalid_request_error",
        null,
        "invalid_api_key",
      );
    }
  }

  /** The name to answer with: the requested one if the server has it, else the first. */
  #modelName(model: string | undefined): string {
    const names = this.options.modelNames;
    if (model === undefined) return names[0];
    if (names.includes(model)) return model;
    throw new ApiError(
      404,
      `model ${JSON.stringify(model)} does not exist; this server serves ${
        names.map((n) => JSON.stringify(n)).join(", ")
      }`,
      "invalid_request_error",
      "model",
      "model_not_found",
    );
  }

  /** Queues a generation on the engine (FIFO), records its timing, logs one line. */
  async #run(
    route: string,
    id: string,
    seq: number,
    arrived: number,
    prepared: PreparedGeneration,
    controller: AbortController,
    n: number,
    grammar: CompiledGrammar | undefined,
    onDelta?: (choice: number, d: GenerationDelta) => void,
    onStart?: (reusedTokens: number) => void,
  ): Promise<GenerationResult[]> {
    if (this.#stopping) throw shutdownError();
    const queuedBehind = this.#running.size;
    this.#running.add(controller);
    try {
      const results = await runGenerations(
        {
          engine: this.engine,
          id,
          seq,
          queuedBehind,
          arrived,
          signal: controller.signal,
          grammar,
          onStart,
        },
        prepared,
        n,
        onDelta,
      );
      this.#served++;
      this.metrics.generation(route, results);
      for (const result of results) {
        this.#recent.push(result.timing);
        if (this.#recent.length > (this.options.recent ?? 32)) this.#recent.shift();
        this.#log(`k3 serve: ${formatTiming(result.timing)}`);
      }
      return results;
    } finally {
      this.#running.delete(controller);
    }
  }
}

/** `response` with `headers` added (CORS). */
function withHeaders(response: Response, headers: Record<string, string> | undefined): Response {
  for (const [k, v] of Object.entries(headers ?? {})) response.headers.set(k, v);
  return response;
}

/** Anthropic's SDKs send `anthropic-version` with every request; OpenAI's never do. */
function wantsAnthropic(req: Request): boolean {
  return req.headers.has("anthropic-version");
}

/**
 * Whose error shape a route answers in: the Messages routes Anthropic's, the Ollama routes
 * Ollama's, the model list whichever API the client speaks, the rest OpenAI's.
 */
function dialectOf(req: Request, path: string): ErrorDialect {
  if (path.startsWith("/v1/messages")) return "anthropic";
  if (path.startsWith("/api/")) return "ollama";
  if (path.startsWith("/v1/models") && wantsAnthropic(req)) return "anthropic";
  return "openai";
}

/** Routes behind the API key: everything but /health, /metrics and what no route serves. */
function needsKey(path: string): boolean {
  return path.startsWith("/v1/") || path.startsWith("/api/") || path === "/tokenize" ||
    path === "/detokenize";
}

/** A 404 for a path no route serves, naming the routes of the same API. */
function noRoute(method: string, path: string, routes: string[]): ApiError {
  const family = path.startsWith("/api/") ? "/api/" : path.startsWith("/v1/") ? "/v1/" : "";
  const same = routes.filter((r) => family !== "" && r.startsWith(family) && !r.endsWith("*"));
  const list = (same.length > 0 ? same : routes.filter((r) => !r.endsWith("*"))).join(", ");
  return new ApiError(
    404,
    `k3 serve has no route ${method} ${path}; its ${family ? `${family} ` : ""}routes are ${list}`,
    "invalid_request_error",
    null,
    "not_found",
  );
}

/**
 * /v1/embeddings (and Ollama's /api/embed): k3 runs one chat model, which makes no
 * embeddings; a client that asks is told so, not given a bare 404.
 */
function noEmbeddings(): never {
  throw new ApiError(
    404,
    "k3 serve has no embedding model: it serves one chat model (Kimi K3), which makes no " +
      "embeddings; ask an embedding model on another server for them",
    "invalid_request_error",
    "model",
    "model_not_found",
  );
}

/** An error in the route's API's shape. */
function errorResponse(e: ApiError, dialect: ErrorDialect): Response {
  const body = dialect === "anthropic"
    ? anthropicErrorBody(e)
    : dialect === "ollama"
    ? ollamaErrorBody(e)
    : errorBody(e);
  return json(body, e.status);
}

/** How often shutdown looks whether the running generations have ended. */
const DRAIN_POLL_MS = 25;

/** What a generation cancelled by shutdown answers (whole, or as a stream's last event). */
function shutdownError(): ApiError {
  return new ApiError(
    503,
    "k3 serve is shutting down: this generation was cancelled when the drain timeout " +
      "(k3 serve --drain-timeout) ran out; send it again once the server is back",
    "server_error",
    null,
    "server_shutting_down",
  );
}

/**
 * A JSON object body, refusing more than `limit` bytes: by Content-Length up front, and by
 * counting what actually arrives (the header may be absent or wrong).
 */
async function readJsonBody(req: Request, limit: number): Promise<Record<string, unknown>> {
  checkContentEncoding(req.headers.get("content-encoding"));
  const declared = Number(req.headers.get("content-length") ?? 0);
  if (declared > limit) throw bodyTooLarge(limit);
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for await (const chunk of req.body ?? []) {
      size += chunk.length;
      if (size > limit) throw bodyTooLarge(limit);
      chunks.push(chunk);
    }
  } catch (e) {
    // A framing error of the transport (short body, bad chunk, timeout) is the client's.
    if (e instanceof HttpError) throw new ApiError(e.status, e.message, undefined, null, e.code);
    throw e;
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new ApiError(
      400,
      `the request body is not valid JSON: ${(e as Error).message}`,
      "invalid_request_error",
      null,
      "invalid_json",
    );
  }
  if (!isRecord(value)) throw new ApiError(400, "the request body must be a JSON object");
  return value;
}

/**
 * k3 decodes no Content-Encoding: a gzip (or any other) body read as JSON would be refused as
 * "not JSON" at best, so it is a 415 saying what to send instead. `identity` is no encoding.
 */
function checkContentEncoding(header: string | null): void {
  if (header === null) return;
  const codings = header.split(",").map((c) => c.trim().toLowerCase()).filter((c) => c !== "");
  const other = codings.find((c) => c !== "identity");
  if (other === undefined) return;
  throw new ApiError(
    415,
    `the request body has Content-Encoding: ${header.slice(0, 100)}; k3 reads only ` +
      `uncompressed bodies: send the JSON as it is, without Content-Encoding`,
    "invalid_request_error",
    null,
    "unsupported_content_encoding",
  );
}

function bodyTooLarge(limit: number): ApiError {
  return new ApiError(
    413,
    `the request body is over the limit of ${limit} bytes (k3 serve --max-body)`,
    "invalid_request_error",
    null,
    "request_too_large",
  );
}

function sha256(s: string): Uint8Array {
  return createHash("sha256").update(s).digest();
}

function json(value: unknown, status = 200): Response {
  return Response.json(value, { status });
}

function jsonError(e: ApiError): Response {
  return json(errorBody(e), e.status);
}
