/**
 * Server-sent events. OpenAI's chat and completions stream `data: {json}\n\n` per chunk and
 * `data: [DONE]\n\n` at the end; the Responses and Messages APIs name each event
 * (`event: TYPE\ndata: {json}\n\n`) and send no [DONE]. When the client goes away the body
 * stream is cancelled; `onCancel` hears it so the generation behind the stream can stop.
 * Ollama's API streams NDJSON instead (one JSON object a line), through the same class.
 */

const encoder = new TextEncoder();

/** One SSE response being written. Writes after close or cancel are dropped. */
export class SseStream {
  readonly response: Response;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #open = true;
  readonly #ndjson: boolean;

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

  /** Sends `data: [DONE]` and closes. */
  done(): void {
    this.#write("data: [DONE]\n\n");
    this.close();
  }

  close(): void {
    if (!this.#open) return;
    this.#open = false;
    this.#controller.close();
  }

  #write(text: string): void {
    if (this.#open) this.#controller.enqueue(encoder.encode(text));
  }
}
