/**
 * The HTTP/1.1 transport of `k3 serve`: our own accept loop over Deno.listen, and the framing
 * of requests and responses. Deno.serve (2.9.6) has no connection cap and no header or body
 * timeout, and its accept loop dies on EMFILE ("Uncaught (in promise) Http: Error: Too many
 * open files"); node:http in Deno is built on it and hung under the same test. So:
 *
 *  - Connections are capped (`maxConnections`): one over the cap gets a 503 and is closed.
 *  - When the process runs out of descriptors, accept backs off (10 ms, doubling to 1 s) and
 *    tries again; the connections already open are served meanwhile and time out as usual.
 *  - Every phase has a deadline: the request head (`headerTimeoutMs`, counted from when the
 *    connection starts waiting for it, so an idle keep-alive connection ends too), the body
 *    (`bodyTimeoutMs`), each response write (`writeTimeoutMs`). A head or body that misses it
 *    gets a 408 (best effort) and the connection is closed.
 *  - Framing is strict: CRLF lines, no obs-fold, one Content-Length value (digits), or
 *    Transfer-Encoding exactly `chunked`, never both (request smuggling); chunk sizes of at
 *    most 15 hex digits. A body that ends before its Content-Length, an absurd chunk size or
 *    a malformed chunk is a 400 and ends the connection; over `maxBodyBytes` is a 413.
 *
 * The body reaches the handler as a stream (nothing is buffered before the handler asks);
 * a framing error mid-body makes that stream fail with an {@link HttpError}, which the
 * handler turns into its own error response. The handler's Response is written back with
 * Content-Length, or chunked for event streams, which are written as they are produced.
 */

/** A client error the transport found in the bytes of a request. */
export class HttpError extends Error {
  constructor(readonly status: number, message: string, readonly code: string) {
    super(message);
    this.name = "HttpError";
  }
}

interface HttpOptions {
  hostname: string;
  port: number;
  /** Connections served at once; one more gets a 503. */
  maxConnections: number;
  /** Milliseconds for a whole request head to arrive, counted from when it is awaited. */
  headerTimeoutMs: number;
  /** Milliseconds for a whole request body to arrive after its head. */
  bodyTimeoutMs: number;
  /** Milliseconds for one write of a response to be taken by the client. */
  writeTimeoutMs: number;
  /** Largest request head (request line and headers). */
  maxHeaderBytes: number;
  /** Largest request body; more is a 413. */
  maxBodyBytes: number;
  /** The response for an error the transport answers itself (status, message, code). */
  errorResponse: (status: number, message: string, code: string) => Response;
  /** Where transport events worth a line go (descriptor exhaustion). */
  log: (line: string) => void;
}

export const HTTP_DEFAULTS = {
  maxConnections: 128,
  headerTimeoutMs: 10_000,
  bodyTimeoutMs: 60_000,
  writeTimeoutMs: 30_000,
  maxHeaderBytes: 32 << 10,
} as const;

type HttpHandler = (req: Request) => Promise<Response>;

/** A listening transport. */
interface HttpServer {
  addr: Deno.NetAddr;
  /** Connections open now. */
  readonly connections: number;
  /** Stops accepting, closes idle connections, waits for the others' responses to end. */
  shutdown(): Promise<void>;
}

const CRLF = "\r\n";
const encoder = new TextEncoder();
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const MAX_HEADERS = 100;

/** Starts listening; resolves once the socket is bound. */
export function serveHttp(options: HttpOptions, handler: HttpHandler): HttpServer {
  const listener = Deno.listen({ hostname: options.hostname, port: options.port });
  const open = new Set<Connection>();
  let closing = false;

  const acceptLoop = (async () => {
    let backoff = 10;
    let exhausted = false;
    while (!closing) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
      } catch (e) {
        if (closing) break;
        const code = (e as { code?: string }).code;
        if (code === "EMFILE" || code === "ENFILE") {
          if (!exhausted) {
            options.log(
              `k3 serve: out of file descriptors with ${open.size} connections open ` +
                `(ulimit -n); accepting again as they close`,
            );
          }
          exhausted = true;
        } else if (e instanceof Deno.errors.BadResource) {
          break;
        } else {
          options.log(`k3 serve: accept failed: ${(e as Error).message}`);
        }
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 1000);
        continue;
      }
      backoff = 10;
      exhausted = false;
      if (open.size >= options.maxConnections) {
        refuse(conn, options);
        continue;
      }
      const c = new Connection(conn, options, handler);
      open.add(c);
      c.done.finally(() => open.delete(c));
    }
  })();

  return {
    addr: listener.addr as Deno.NetAddr,
    get connections() {
      return open.size;
    },
    shutdown: async () => {
      closing = true;
      try {
        listener.close();
      } catch { /* already closed */ }
      await acceptLoop;
      for (const c of open) c.shutdown();
      await Promise.all([...open].map((c) => c.done));
    },
  };
}

/** Answers a connection over the cap with a 503 and closes it, never waiting long. */
function refuse(conn: Deno.Conn, options: HttpOptions): void {
  const response = options.errorResponse(
    503,
    `the server has ${options.maxConnections} connections open, its limit ` +
      `(k3 serve --max-connections); try again`,
    "too_many_connections",
  );
  (async () => {
    try {
      const body = new Uint8Array(await response.arrayBuffer());
      const head = responseHead(503, response.headers, body.length, false) +
        `retry-after: 1${CRLF}${CRLF}`;
      await withTimeout(writeAll(conn, concat(encoder.encode(head), body)), 1000);
    } catch { /* the client is gone or not reading: nothing to do */ }
    closeQuietly(conn);
  })();
}

/** Why a connection's read was cut short by its own deadline. */
class Timeout extends Error {}

/** One client connection: requests read and answered in turn (keep-alive). */
class Connection {
  readonly done: Promise<void>;
  #buf = new Uint8Array(16 << 10);
  #start = 0;
  #end = 0;
  /** The read in flight, if any (at most one at a time). */
  #pending: Promise<boolean> | null = null;
  #closed = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timedOut = false;
  /** Set by shutdown: end after the current response; close now if idle. */
  #stopping = false;
  #idle = true;

  constructor(
    readonly conn: Deno.Conn,
    readonly options: HttpOptions,
    readonly handler: HttpHandler,
  ) {
    this.done = this.#serve().catch(() => {}).finally(() => this.#close());
  }

  shutdown(): void {
    this.#stopping = true;
    if (this.#idle) this.#close();
  }

  async #serve(): Promise<void> {
    while (!this.#stopping && !this.#closed) {
      this.#idle = true;
      let head: RequestHead | null;
      try {
        head = await this.#readHead();
      } catch (e) {
        if (e instanceof HttpError) await this.#fail(e);
        return; // a timeout was answered by the deadline itself
      }
      if (head === null) return; // the client closed between requests
      this.#idle = false;
      if (!(await this.#exchange(head))) return;
    }
  }

  /** Serves one request; true when the connection may carry another. */
  async #exchange(head: RequestHead): Promise<boolean> {
    const framing = bodyFraming(head, this.options.maxBodyBytes);
    if (framing instanceof HttpError) {
      await this.#fail(framing);
      return false;
    }
    if (framing.kind !== "none" && head.headers.get("expect")?.toLowerCase() === "100-continue") {
      await this.#write(encoder.encode(`HTTP/1.1 100 Continue${CRLF}${CRLF}`));
    }
    const aborter = new AbortController();
    // Once the body is in, a client that leaves aborts the request (a queued or running
    // generation stops).
    const body = new BodyReader(this, framing, () => this.#watchForClose(aborter));
    if (body.complete) this.#watchForClose(aborter);
    const host = head.headers.get("host") ?? "localhost";
    let request: Request;
    try {
      request = new Request(
        `http://${/^[\w.:\[\]-]+$/.test(host) ? host : "localhost"}${head.target}`,
        {
          method: head.method,
          headers: head.headers,
          body: framing.kind === "none" || head.method === "GET" || head.method === "HEAD"
            ? null
            : body.stream(),
          signal: aborter.signal,
        },
      );
    } catch (e) {
      await this.#fail(new HttpError(400, `bad request: ${(e as Error).message}`, "bad_request"));
      return false;
    }
    let response: Response;
    try {
      response = await this.handler(request);
    } catch (e) {
      response = this.options.errorResponse(500, (e as Error).message, "internal_error");
    }
    if (body.failure) {
      // The handler saw a broken body (and answered it); the error decides what is sent.
      await this.#fail(body.failure);
      return false;
    }
    const reuse = body.complete && head.keepAlive && !this.#stopping;
    try {
      await this.#respond(head, response, reuse, aborter);
    } finally {
      aborter.abort();
    }
    return reuse && !this.#closed;
  }

  /**
   * Writes `response`; event streams (SSE, and Ollama's NDJSON) are written chunk by chunk as
   * they are produced.
   */
  async #respond(
    head: RequestHead,
    response: Response,
    keepAlive: boolean,
    aborter: AbortController,
  ): Promise<void> {
    const noBody = head.method === "HEAD" || response.status === 204 || response.status === 304;
    const type = response.headers.get("content-type") ?? "";
    const streamed = !noBody && response.body !== null &&
      (type.startsWith("text/event-stream") || type.startsWith("application/x-ndjson"));
    if (!streamed) {
      const bytes = noBody ? new Uint8Array(0) : new Uint8Array(await response.arrayBuffer());
      const text = responseHead(response.status, response.headers, bytes.length, keepAlive);
      await this.#write(concat(encoder.encode(text + CRLF), noBody ? new Uint8Array(0) : bytes));
      return;
    }
    await this.#write(
      encoder.encode(responseHead(response.status, response.headers, -1, keepAlive) + CRLF),
    );
    this.#watchForClose(aborter);
    const reader = response.body!.getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (value.length === 0) continue;
        await this.#write(
          concat(encoder.encode(value.length.toString(16) + CRLF), value, encoder.encode(CRLF)),
        );
      }
      await this.#write(encoder.encode(`0${CRLF}${CRLF}`));
    } catch (e) {
      await reader.cancel(e).catch(() => {});
      this.#close();
    }
  }

  /** Reads on in the background so a client that leaves aborts its request. */
  #watchForClose(aborter: AbortController): void {
    if (this.#watching.has(aborter)) return;
    this.#watching.add(aborter);
    const watch = async () => {
      while (
        !this.#closed && !aborter.signal.aborted &&
        this.#end - this.#start < this.options.maxHeaderBytes
      ) {
        try {
          if (!(await this.fill())) break;
        } catch {
          break;
        }
      }
      if (!aborter.signal.aborted && (this.#closed || this.#eof)) aborter.abort();
      this.#watching.delete(aborter);
    };
    watch();
  }

  #watching = new Set<AbortController>();

  #eof = false;

  /** Reads more bytes into the buffer; false at EOF. One read at a time. */
  fill(): Promise<boolean> {
    if (this.#pending) return this.#pending;
    if (this.#eof) return Promise.resolve(false);
    if (this.#closed) return Promise.reject(new Deno.errors.BadResource("connection closed"));
    if (this.#start > 0 && this.#start === this.#end) this.#start = this.#end = 0;
    if (this.#end === this.#buf.length) {
      const live = this.#end - this.#start;
      const next = new Uint8Array(
        live * 2 > this.#buf.length ? this.#buf.length * 2 : this.#buf.length,
      );
      next.set(this.#buf.subarray(this.#start, this.#end));
      this.#buf = next;
      this.#start = 0;
      this.#end = live;
    }
    this.#pending = this.conn.read(this.#buf.subarray(this.#end)).then((n) => {
      this.#pending = null;
      if (n === null) {
        this.#eof = true;
        return false;
      }
      this.#end += n;
      return true;
    }, (e) => {
      this.#pending = null;
      throw this.#timedOut ? new Timeout("timed out") : e;
    });
    return this.#pending;
  }

  /** The bytes read and not yet consumed. */
  get buffered(): Uint8Array {
    return this.#buf.subarray(this.#start, this.#end);
  }

  consume(n: number): void {
    this.#start += n;
  }

  /**
   * Ends the connection when `ms` pass before {@link clearDeadline}: first `answer` (a 408)
   * when it returns one, best effort, then close. The read in flight then fails.
   */
  setDeadline(ms: number, answer: () => HttpError | null): void {
    this.clearDeadline();
    this.#timer = setTimeout(async () => {
      this.#timer = undefined;
      this.#timedOut = true;
      const e = answer();
      if (e) await this.#answer(e);
      this.#closeSocketOnly();
    }, ms);
  }

  clearDeadline(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** Reads a request head; null when the client closed before sending a byte of one. */
  async #readHead(): Promise<RequestHead | null> {
    this.setDeadline(
      this.options.headerTimeoutMs,
      () =>
        this.buffered.length > 0
          ? new HttpError(408, "the request head did not arrive in time", "timeout")
          : null, // an idle keep-alive connection just ends
    );
    try {
      for (;;) {
        const at = indexOfCrlfCrlf(this.buffered);
        if (at >= 0) {
          const text = latin1(this.buffered.subarray(0, at));
          this.consume(at + 4);
          return parseHead(text);
        }
        if (this.buffered.length > this.options.maxHeaderBytes) {
          throw new HttpError(
            431,
            `the request head is over ${this.options.maxHeaderBytes} bytes`,
            "headers_too_large",
          );
        }
        if (!(await this.fill())) {
          if (this.buffered.length === 0) return null;
          throw new HttpError(400, "the connection ended inside the request head", "bad_request");
        }
      }
    } finally {
      this.clearDeadline();
    }
  }

  /** Sends an error response the transport decided on, then the connection ends. */
  async #fail(e: HttpError): Promise<void> {
    await this.#answer(e);
    this.#close();
  }

  /** Writes the error response for `e` (with `connection: close`), best effort. */
  async #answer(e: HttpError): Promise<void> {
    const response = this.options.errorResponse(e.status, e.message, e.code);
    try {
      const bytes = new Uint8Array(await response.arrayBuffer());
      const text = responseHead(e.status, response.headers, bytes.length, false);
      await withTimeout(this.#rawWrite(concat(encoder.encode(text + CRLF), bytes)), 1000);
    } catch { /* gone */ }
  }

  /** Writes all of `bytes` within the write deadline; closes the connection when missed. */
  async #write(bytes: Uint8Array): Promise<void> {
    try {
      await withTimeout(this.#rawWrite(bytes), this.options.writeTimeoutMs);
    } catch (e) {
      this.#close();
      throw e;
    }
  }

  #rawWrite(bytes: Uint8Array): Promise<void> {
    if (this.#closed) return Promise.reject(new Deno.errors.BadResource("connection closed"));
    return writeAll(this.conn, bytes);
  }

  #closeSocketOnly(): void {
    if (this.#closed) return;
    this.#closed = true;
    closeQuietly(this.conn);
  }

  #close(): void {
    this.clearDeadline();
    this.#closeSocketOnly();
  }

  get timedOut(): boolean {
    return this.#timedOut;
  }
}

/** How a request's body is delimited. */
type Framing =
  | { kind: "none" }
  | { kind: "length"; length: number }
  | { kind: "chunked" };

/** The framing a head declares, or the client error in it. */
function bodyFraming(head: RequestHead, limit: number): Framing | HttpError {
  const te = head.headers.get("transfer-encoding");
  const cl = head.headers.get("content-length");
  if (te !== null && cl !== null) {
    return new HttpError(
      400,
      "a request may not have both Transfer-Encoding and Content-Length",
      "bad_request",
    );
  }
  if (te !== null) {
    if (te.trim().toLowerCase() !== "chunked") {
      return new HttpError(
        400,
        `Transfer-Encoding "${te}" is not supported (only chunked)`,
        "bad_request",
      );
    }
    return { kind: "chunked" };
  }
  if (cl === null) return { kind: "none" };
  const values = cl.split(",").map((v) => v.trim());
  if (!values.every((v) => /^\d{1,15}$/.test(v) && v === values[0])) {
    return new HttpError(400, `Content-Length "${cl}" is not one byte count`, "bad_request");
  }
  const length = Number(values[0]);
  if (length > limit) return tooLarge(limit);
  return length === 0 ? { kind: "none" } : { kind: "length", length };
}

function tooLarge(limit: number): HttpError {
  return new HttpError(
    413,
    `the request body is over the limit of ${limit} bytes (k3 serve --max-body)`,
    "request_too_large",
  );
}

/** Delivers one request's body from the connection, under the body deadline. */
class BodyReader {
  failure: HttpError | null = null;
  complete: boolean;
  #received = 0;

  constructor(
    readonly c: Connection,
    readonly framing: Framing,
    /** Called once the whole body has been read. */
    readonly onComplete: () => void,
  ) {
    this.complete = framing.kind === "none";
  }

  stream(): ReadableStream<Uint8Array> {
    let started = false;
    const chunks = this.#chunks();
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        if (!started) {
          started = true;
          this.c.setDeadline(
            this.c.options.bodyTimeoutMs,
            () => new HttpError(408, "the request body did not arrive in time", "timeout"),
          );
        }
        try {
          const { value, done } = await chunks.next();
          if (done) {
            this.c.clearDeadline();
            this.complete = true;
            this.onComplete();
            controller.close();
          } else controller.enqueue(value);
        } catch (e) {
          this.c.clearDeadline();
          this.failure = e instanceof HttpError
            ? e
            : this.c.timedOut
            ? new HttpError(408, "the request body did not arrive in time", "timeout")
            : new HttpError(
              400,
              `the request body could not be read: ${(e as Error).message}`,
              "bad_request",
            );
          controller.error(this.failure);
        }
      },
      cancel: () => {},
    });
  }

  /** The body's bytes, as they arrive. */
  async *#chunks(): AsyncGenerator<Uint8Array> {
    const limit = this.c.options.maxBodyBytes;
    if (this.framing.kind === "length") {
      let left = this.framing.length;
      while (left > 0) {
        if (this.c.buffered.length === 0 && !(await this.c.fill())) {
          throw new HttpError(
            400,
            `the request body ended after ${this.framing.length - left} of the ` +
              `${this.framing.length} bytes its Content-Length declares`,
            "bad_request",
          );
        }
        const take = this.c.buffered.subarray(0, left).slice();
        this.c.consume(take.length);
        left -= take.length;
        yield take;
      }
      return;
    }
    if (this.framing.kind !== "chunked") return;
    for (;;) {
      const line = await this.#line("a chunk size");
      const m = /^([0-9A-Fa-f]{1,15})(?:[ \t]*;.*)?$/.exec(line);
      if (!m) {
        throw new HttpError(400, `bad chunk size line "${line.slice(0, 40)}"`, "bad_request");
      }
      const size = parseInt(m[1], 16);
      if (this.#received + size > limit) throw tooLarge(limit);
      if (size === 0) break;
      let left = size;
      while (left > 0) {
        if (this.c.buffered.length === 0 && !(await this.c.fill())) {
          throw new HttpError(400, "the connection ended inside a chunk", "bad_request");
        }
        const take = this.c.buffered.subarray(0, left).slice();
        this.c.consume(take.length);
        left -= take.length;
        this.#received += take.length;
        yield take;
      }
      if ((await this.#line("the end of a chunk")) !== "") {
        throw new HttpError(400, "a chunk is longer than its size", "bad_request");
      }
    }
    // Trailer fields, ignored, up to the empty line.
    for (let n = 0; (await this.#line("the trailer")) !== ""; n++) {
      if (n > MAX_HEADERS) throw new HttpError(400, "too many trailer fields", "bad_request");
    }
  }

  /** The next CRLF-terminated line of the body framing (bounded). */
  async #line(what: string): Promise<string> {
    for (;;) {
      const b = this.c.buffered;
      const at = indexOfCrlf(b);
      if (at >= 0) {
        const text = latin1(b.subarray(0, at));
        this.c.consume(at + 2);
        return text;
      }
      if (b.length > 4096) throw new HttpError(400, `${what} line is too long`, "bad_request");
      if (!(await this.c.fill())) {
        throw new HttpError(400, `the connection ended inside ${what}`, "bad_request");
      }
    }
  }
}

/** A parsed request line and headers. */
interface RequestHead {
  method: string;
  target: string;
  headers: Headers;
  keepAlive: boolean;
}

/** Parses a request head (without its final CRLF CRLF); throws HttpError. */
function parseHead(text: string): RequestHead {
  const bad = (why: string) => new HttpError(400, `bad request: ${why}`, "bad_request");
  const lines = text.split(CRLF);
  const requestLine = lines[0];
  const parts = requestLine.split(" ");
  if (parts.length !== 3) throw bad("the request line is not METHOD TARGET VERSION");
  const [method, target, version] = parts;
  if (!TOKEN.test(method)) throw bad("the method is not a token");
  if (!target.startsWith("/") || [...target].some((ch) => ch <= " " || ch === "\x7f")) {
    throw bad("the request target is not an absolute path");
  }
  if (version !== "HTTP/1.1" && version !== "HTTP/1.0") {
    throw new HttpError(505, `${version.slice(0, 20)} is not supported (HTTP/1.1)`, "bad_request");
  }
  if (lines.length - 1 > MAX_HEADERS) throw bad(`more than ${MAX_HEADERS} header fields`);
  const headers = new Headers();
  for (const line of lines.slice(1)) {
    if (line.includes("\n") || line.includes("\r")) throw bad("a bare CR or LF in a header");
    if (line.startsWith(" ") || line.startsWith("\t")) throw bad("folded header lines");
    const colon = line.indexOf(":");
    const name = colon > 0 ? line.slice(0, colon) : "";
    if (!TOKEN.test(name)) throw bad(`header line "${line.slice(0, 40)}"`);
    const value = line.slice(colon + 1).trim();
    if (!FIELD_VALUE.test(value)) throw bad(`header ${name} has control characters`);
    try {
      headers.append(name, value);
    } catch {
      throw bad(`header ${name}`);
    }
  }
  if (requestLine.includes("\n")) throw bad("a bare LF in the request line");
  const connection = (headers.get("connection") ?? "").toLowerCase();
  const keepAlive = version === "HTTP/1.1"
    ? !/\bclose\b/.test(connection)
    : /\bkeep-alive\b/.test(connection);
  return { method, target, headers, keepAlive };
}

const REASONS: Record<number, string> = {
  200: "OK",
  204: "No Content",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  413: "Content Too Large",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  503: "Service Unavailable",
  505: "HTTP Version Not Supported",
};

/** Status line and headers (no final CRLF); length < 0 means chunked. */
function responseHead(
  status: number,
  headers: Headers,
  length: number,
  keepAlive: boolean,
): string {
  let out = `HTTP/1.1 ${status} ${REASONS[status] ?? "Status"}${CRLF}`;
  for (const [name, value] of headers) {
    if (name === "content-length" || name === "transfer-encoding" || name === "connection") {
      continue;
    }
    out += `${name}: ${value}${CRLF}`;
  }
  out += length < 0 ? `transfer-encoding: chunked${CRLF}` : `content-length: ${length}${CRLF}`;
  out += `connection: ${keepAlive ? "keep-alive" : "close"}${CRLF}`;
  return out;
}

function indexOfCrlfCrlf(b: Uint8Array): number {
  for (let i = 0; i + 3 < b.length; i++) {
    if (b[i] === 13 && b[i + 1] === 10 && b[i + 2] === 13 && b[i + 3] === 10) return i;
  }
  return -1;
}

function indexOfCrlf(b: Uint8Array): number {
  for (let i = 0; i + 1 < b.length; i++) if (b[i] === 13 && b[i + 1] === 10) return i;
  return -1;
}

function latin1(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 8192) {
    s += String.fromCharCode(...b.subarray(i, Math.min(b.length, i + 8192)));
  }
  return s;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let done = 0; done < bytes.length;) done += await conn.write(bytes.subarray(done));
}

/** `p`, or a rejection after `ms` (the caller then closes what `p` was writing to). */
function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Timeout(`no progress in ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* already closed */ }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
