/**
 * Server-sent events. OpenAI's chat and completions stream `data: {json}\n\n` per chunk and
 * `data: [DONE]\n\n` at the end; the Responses and Messages APIs name each event
 * (`event: TYPE\ndata: {json}\n\n`) and send no [DONE]. When the client goes away the body
 * stream is cancelled; `onCancel` hears it so the generation behind the stream can stop.
 * Ollama's API streams NDJSON instead (one JSON object a line), through the same class.
 *
 * A stream that has said nothing for a while (its request waits in the queue, or a long
 * prompt prefills) gets a keep-alive: an SSE comment (`: keep-alive`), which every SSE parser
 * skips, or a named event such as Anthropic's `ping`. Proxies cut a response whose next byte
 * takes longer than their read timeout (often 60 s); the prefill of a long prompt does.
 */

const encoder = new TextEncoder();

/** Seconds of silence before a stream gets a keep-alive, unless the server says otherwise. */
export const DEFAULT_KEEPALIVE_SECONDS = 15;

/** One SSE response being written. Writes after close or cancel are dropped. */
export class SseStream {
  readonly response: Response;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #open = true;
  readonly #ndjson: boolean;
  #timer?: ReturnType<typeof setInterval>;
  #wrote = false;

  constructor(
    onCancel: () => void,
    headers: Record<string, string> = {},
    framing: "sse" | "ndjson" = "sse",
  ) {
    this.#ndjson = framing === "ndjson";
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        this.#controller = controller;
      },
      cancel: () => {
        this.#open = false;
        this.#stopKeepAlive();
        onCancel();
      },
    });
    this.response = new Response(body, {
      headers: {
        "content-type": this.#ndjson
          ? "application/x-ndjson; charset=utf-8"
          : "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
        ...headers,
      },
    });
  }

  /** True until the stream is closed or the client cancels it. */
  get open(): boolean {
    return this.#open;
  }

  /** Sends one JSON event, named `event` when given. */
  send(data: unknown, event?: string): void {
    if (this.#ndjson) return this.#write(`${JSON.stringify(data)}\n`);
    this.#write(`${event ? `event: ${event}\n` : ""}data: ${JSON.stringify(data)}\n\n`);
  }

  /**
   * From now on, each `seconds` in which nothing was sent sends a keep-alive: `ping` as a
   * named event when given (`event: ping` with `ping` as its data), else an SSE comment.
   * NDJSON has no comment to send: there it does nothing. 0 turns it off.
   */
  keepAlive(seconds: number, ping?: { type: string }): void {
    this.#stopKeepAlive();
    if (this.#ndjson || !(seconds > 0) || !this.#open) return;
    const text = ping
      ? `event: ${ping.type}\ndata: ${JSON.stringify(ping)}\n\n`
      : ": keep-alive\n\n";
    this.#wrote = false;
    this.#timer = setInterval(() => {
      if (!this.#wrote) this.#write(text);
      this.#wrote = false;
    }, seconds * 1000);
  }

  #stopKeepAlive(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** Sends `data: [DONE]` and closes. */
  done(): void {
    this.#write("data: [DONE]\n\n");
    this.close();
  }

  close(): void {
    this.#stopKeepAlive();
    if (!this.#open) return;
    this.#open = false;
    this.#controller.close();
  }

  #write(text: string): void {
    if (!this.#open) return;
    this.#controller.enqueue(encoder.encode(text));
    this.#wrote = true;
  }
}
