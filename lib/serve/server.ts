/**
 * The OpenAI-compatible HTTP server: routing, authentication, body limits, and the four
 * responses (chat or text, whole or streamed). Every generation goes through the one Session,
 * so requests are served one at a time in arrival order while HTTP keeps flowing between steps.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { type ChannelDelta, ChannelView } from "../chat/display.ts";
import { renderChatIds } from "../text/chat.ts";
import { Sampler } from "../text/sampler.ts";
import { type ChatOutputOptions, TextStream } from "../text/stream.ts";
import { parseOutput } from "../text/parse.ts";
import {
  ApiError,
  apiErrorOf,
  assistantMessage,
  chatChunk,
  chatCompletion,
  errorBody,
  finishReasonOf,
  type GenerationRequest,
  isRecord,
  modelEntry,
  parseChatRequest,
  parseCompletionRequest,
  type ResponseMeta,
  textChunk,
  textCompletion,
  toolCallsOf,
  usageChunk,
  usageOf,
} from "./openai.ts";
import {
  type Engine,
  formatTiming,
  type Job,
  type JobResult,
  type RequestTiming,
  runJob,
} from "./runner.ts";
import { SseStream } from "./sse.ts";
import { HTTP_DEFAULTS, HttpError, serveHttp } from "./http.ts";

/** How to serve. */
export interface ServerOptions {
  hostname: string;
  /** 0 picks a free port. */
  port: number;
  /** When set, /v1 requests need `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** Largest request body accepted, in bytes. */
  maxBodyBytes: number;
  /** Prompt plus completion tokens one request may use. */
  contextTokens: number;
  /** The name /v1/models lists and requests must use. */
  modelId: string;
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
}

/** A running server. */
export interface K3Server {
  /** `http://host:port` (no trailing slash). */
  url: string;
  port: number;
  /** Cancels running generations, stops listening, and waits for open responses to end. */
  shutdown(): Promise<void>;
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
  }, (req) => app.handle(req));
  const addr = server.addr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  return {
    url: `http://${host}:${addr.port}`,
    port: addr.port,
    shutdown: async () => {
      app.cancelAll();
      await server.shutdown();
    },
  };
}

type Handler = (req: Request, path: string) => Promise<Response> | Response;

/** The request handlers and the state they share. */
class App {
  readonly #created = Math.floor(Date.now() / 1000);
  readonly #keyDigest?: Uint8Array;
  readonly #log: (line: string) => void;
  readonly #recent: RequestTiming[] = [];
  readonly #running = new Set<AbortController>();
  #seq = 0;
  #served = 0;

  readonly #routes: Record<string, Record<string, Handler>> = {
    "/health": { GET: () => this.#health() },
    "/v1/models": { GET: () => json({ object: "list", data: [this.#model()] }) },
    "/v1/models/*": { GET: (_, path) => this.#oneModel(path) },
    "/v1/chat/completions": { POST: (req) => this.#chat(req) },
    "/v1/completions": { POST: (req) => this.#completions(req) },
  };

  constructor(readonly engine: Engine, readonly options: ServerOptions) {
    if (options.apiKey !== undefined) this.#keyDigest = sha256(options.apiKey);
    this.#log = options.log ?? ((line) => console.error(line));
  }

  /** Every request ends here with a response; errors become OpenAI error bodies. */
  async handle(req: Request): Promise<Response> {
    try {
      const path = new URL(req.url).pathname;
      if (path.startsWith("/v1/")) this.#authorize(req);
      const methods = this.#routes[path] ??
        (path.startsWith("/v1/models/") ? this.#routes["/v1/models/*"] : undefined);
      if (!methods) {
        throw new ApiError(404, `no route ${path}`, "invalid_request_error", null, "not_found");
      }
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
      return await handler(req, path);
    } catch (e) {
      const error = apiErrorOf(e);
      const detail = error.status >= 500 ? (e as Error).stack ?? String(e) : error.message;
      this.#log(`k3 serve: ${req.method} ${new URL(req.url).pathname}: ${error.status} ${detail}`);
      return jsonError(error);
    }
  }

  /** Stops every running or queued generation (shutdown). */
  cancelAll(): void {
    for (const c of this.#running) c.abort();
  }

  // ---- endpoints ----

  #health(): Response {
    return json({
      status: "ok",
      model: this.options.modelId,
      context_tokens: this.options.contextTokens,
      queue_depth: this.engine.session.queueDepth,
      in_flight: this.#running.size,
      requests_served: this.#served,
      recent: this.#recent,
    });
  }

  #model() {
    return modelEntry(this.options.modelId, this.#created);
  }

  #oneModel(path: string): Response {
    this.#checkModel(decodeURIComponent(path.slice("/v1/models/".length)));
    return json(this.#model());
  }

  async #chat(req: Request): Promise<Response> {
    const arrived = performance.now();
    const request = parseChatRequest(await readJsonBody(req, this.options.maxBodyBytes));
    this.#checkModel(request.model);
    const { ids } = renderChatIds(this.engine.tokenizer, request.messages, request.render);
    const thinking = request.render.thinking ?? true;
    const job = this.#job(
      "chatcmpl",
      ids,
      request,
      arrived,
      request.stream ? undefined : req.signal,
      { thinking },
    );
    return request.stream
      ? this.#streamChat(job, request, thinking)
      : await this.#wholeChat(job, thinking);
  }

  async #completions(req: Request): Promise<Response> {
    const arrived = performance.now();
    const request = parseCompletionRequest(await readJsonBody(req, this.options.maxBodyBytes));
    this.#checkModel(request.model);
    const ids = this.engine.tokenizer.encode(request.prompt, { allowSpecial: false });
    const job = this.#job("cmpl", ids, request, arrived, request.stream ? undefined : req.signal);
    return request.stream ? this.#streamText(job, request) : await this.#wholeText(job);
  }

  // ---- the four responses ----

  async #wholeChat(job: QueuedJob, thinking: boolean): Promise<Response> {
    const result = await this.#run(job, () => {});
    const parsed = parseOutput(result.text, { thinking });
    const calls = toolCallsOf(parsed.toolCalls);
    return json(chatCompletion(
      job.meta,
      assistantMessage(parsed, calls),
      finishReasonOf(ended(result), calls.length),
      usageOf(job.promptIds.length, result.completionIds.length, result.reusedTokens),
      k3Field(job, result),
    ));
  }

  #streamChat(job: QueuedJob, request: GenerationRequest, thinking: boolean): Response {
    const sse = new SseStream(() => job.controller.abort());
    const channels = new ChannelView(thinking);
    const sendDelta = (d: ChannelDelta) => {
      if (d.reasoning) sse.send(chatChunk(job.meta, { reasoning_content: d.reasoning }, null));
      if (d.content) sse.send(chatChunk(job.meta, { content: d.content }, null));
    };
    sse.send(chatChunk(job.meta, { role: "assistant", content: "" }, null));
    this.#stream(
      sse,
      job,
      request,
      "chat.completion.chunk",
      (piece) => sendDelta(channels.push(piece)),
      (result) => {
        sendDelta(channels.flush());
        const parsed = parseOutput(result.text, { thinking });
        const calls = toolCallsOf(parsed.toolCalls);
        if (calls.length > 0) {
          const tool_calls = calls.map((c, index) => ({ index, ...c }));
          sse.send(chatChunk(job.meta, { tool_calls }, null));
        }
        sse.send(chatChunk(job.meta, {}, finishReasonOf(ended(result), calls.length)));
      },
    );
    return sse.response;
  }

  async #wholeText(job: QueuedJob): Promise<Response> {
    const result = await this.#run(job, () => {});
    return json(textCompletion(
      job.meta,
      result.text,
      ended(result),
      usageOf(job.promptIds.length, result.completionIds.length, result.reusedTokens),
      k3Field(job, result),
    ));
  }

  #streamText(job: QueuedJob, request: GenerationRequest): Response {
    const sse = new SseStream(() => job.controller.abort());
    this.#stream(
      sse,
      job,
      request,
      "text_completion",
      (piece) => sse.send(textChunk(job.meta, piece, null)),
      (result) => {
        sse.send(textChunk(job.meta, "", ended(result)));
      },
    );
    return sse.response;
  }

  /**
   * Runs a streamed job in the background: pieces go out as they come, then `finish` sends
   * the closing chunks, then usage (if asked) and [DONE]. A cancelled stream just stops.
   */
  #stream(
    sse: SseStream,
    job: QueuedJob,
    request: GenerationRequest,
    usageObject: string,
    onText: (piece: string) => void,
    finish: (result: JobResult) => void,
  ): void {
    this.#run(job, onText).then((result) => {
      if (result.finish === "cancelled" || !sse.open) return sse.close();
      finish(result);
      if (request.includeUsage) {
        const usage = usageOf(
          job.promptIds.length,
          result.completionIds.length,
          result.reusedTokens,
        );
        sse.send(usageChunk(job.meta, usageObject, usage, k3Field(job, result)));
      }
      sse.done();
    }).catch((e) => {
      const error = apiErrorOf(e);
      this.#log(`k3 serve: ${job.id}: ${(e as Error).stack ?? e}`);
      sse.send(errorBody(error));
      sse.close();
    });
  }

  // ---- shared steps ----

  #authorize(req: Request): void {
    if (!this.#keyDigest) return;
    const header = req.headers.get("authorization") ?? "";
    const given = /^Bearer\s+(.+)$/i.exec(header)?.[1]?.trim();
    if (given === undefined) {
      throw new ApiError(
        401,
        "missing API key: send Authorization: Bearer <key>",
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

  #checkModel(model: string | undefined): void {
    if (model !== undefined && model !== this.options.modelId) {
      throw new ApiError(
        404,
        `model ${JSON.stringify(model)} does not exist; this server serves ${
          JSON.stringify(this.options.modelId)
        }`,
        "invalid_request_error",
        "model",
        "model_not_found",
      );
    }
  }

  /** A job for `promptIds` within the context budget; cancelled when the client goes away. */
  #job(
    prefix: string,
    promptIds: number[],
    request: GenerationRequest,
    arrived: number,
    clientGone?: AbortSignal,
    chat?: ChatOutputOptions,
  ): QueuedJob {
    const maxTokens = completionBudget(
      promptIds.length,
      request.maxTokens,
      this.options.contextTokens,
    );
    const controller = new AbortController();
    // A streamed job is cancelled by its body stream; a whole one when its client disconnects
    // (request.signal, read only for whole responses: Deno also aborts it after a response).
    clientGone?.addEventListener("abort", () => controller.abort());
    const seq = ++this.#seq;
    const id = `${prefix}-${seq}-${crypto.randomUUID().slice(0, 8)}`;
    return {
      id,
      seq,
      queuedBehind: 0,
      promptIds,
      maxTokens,
      picker: new Sampler(request.sampling),
      text: new TextStream(this.engine.tokenizer, { stops: request.stop, chat }),
      signal: controller.signal,
      arrived,
      controller,
      meta: { id, created: Math.floor(Date.now() / 1000), model: this.options.modelId },
    };
  }

  /** Queues the job on the engine (FIFO), records its timing, logs one line. */
  async #run(job: QueuedJob, onText: (piece: string) => void): Promise<JobResult> {
    job.queuedBehind = this.#running.size;
    this.#running.add(job.controller);
    try {
      const result = await runJob(this.engine, job, onText);
      this.#served++;
      this.#recent.push(result.timing);
      if (this.#recent.length > (this.options.recent ?? 32)) this.#recent.shift();
      this.#log(`k3 serve: ${formatTiming(result.timing)}`);
      return result;
    } finally {
      this.#running.delete(job.controller);
    }
  }
}

/** A job plus what the server needs to answer it. */
interface QueuedJob extends Job {
  controller: AbortController;
  meta: ResponseMeta;
}

/**
 * Completion tokens allowed: the request's max_tokens, or the rest of the context. A prompt
 * that leaves no room, or a max_tokens past the budget, is a 400 saying how many tokens fit.
 */
export function completionBudget(
  prompt: number,
  requested: number | undefined,
  context: number,
): number {
  if (prompt >= context) {
    throw new ApiError(
      400,
      `the prompt is ${prompt} tokens but the context budget is ${context} tokens: ` +
        `at most ${context - 1} prompt tokens fit (leaving room for one completion token)`,
      "invalid_request_error",
      "messages",
      "context_length_exceeded",
    );
  }
  const room = context - prompt;
  if (requested !== undefined && requested > room) {
    throw new ApiError(
      400,
      `the prompt (${prompt} tokens) plus max_tokens (${requested}) exceeds the context budget ` +
        `of ${context} tokens: at most ${room} completion tokens fit after this prompt`,
      "invalid_request_error",
      "max_tokens",
      "context_length_exceeded",
    );
  }
  return requested ?? room;
}

/** The k3 extension field: the exact token ids and the request's timing. */
function k3Field(job: Job, result: JobResult) {
  return { prompt_ids: job.promptIds, completion_ids: result.completionIds, timing: result.timing };
}

/** How a finished (not cancelled) job ended, in OpenAI's terms. */
function ended(result: JobResult): "stop" | "length" {
  return result.finish === "stop" ? "stop" : "length";
}

/**
 * A JSON object body, refusing more than `limit` bytes: by Content-Length up front, and by
 * counting what actually arrives (the header may be absent or wrong).
 */
export async function readJsonBody(req: Request, limit: number): Promise<Record<string, unknown>> {
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
