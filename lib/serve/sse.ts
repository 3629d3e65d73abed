/**
 * Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk, `data: [DONE]\n\n`
 * at the end. When the client goes away the body stream is cancelled; `onCancel` hears it so
 * the generation behind the stream can stop.
 */

const encoder = new TextEncoder();

/** One SSE response being written. Writes after close or cancel are dropped. */
export class SseStream {
  readonly response: Response;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #open = true;

  constructor(onCancel: () => void) {
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
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        "x-accel-buffering": "no",
      },
    });
  }

  /** True until the stream is closed or the client cancels it. */
  get open(): boolean {
    return this.#open;
  }

  /** Sends one JSON event. */
  send(data: unknown): void {
    this.#write(`data: ${JSON.stringify(data)}\n\n`);
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
