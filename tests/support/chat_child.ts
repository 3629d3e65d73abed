/** `k3 chat` as a child process with piped stdio, for tests that drive it line by line. */
import * as path from "node:path";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");

/** A `k3 chat` child with piped stdio; its output is collected as it comes. */
export class ChatChild {
  readonly process: Deno.ChildProcess;
  stdout = "";
  stderr = "";
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #pumps: Promise<void>[];

  constructor(args: string[]) {
    this.process = new Deno.Command(K3, {
      args: ["chat", ...args],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#writer = this.process.stdin.getWriter();
    this.#pumps = [
      this.#pump(this.process.stdout, (s) => (this.stdout += s)),
      this.#pump(this.process.stderr, (s) => (this.stderr += s)),
    ];
  }

  async #pump(stream: ReadableStream<Uint8Array>, add: (s: string) => void): Promise<void> {
    for await (const s of stream.pipeThrough(new TextDecoderStream())) add(s);
  }

  async send(line: string): Promise<void> {
    await this.#writer.write(new TextEncoder().encode(line + "\n"));
  }

  async close(): Promise<void> {
    await this.#writer.close().catch(() => {});
  }

  /** Waits until stdout or stderr matches `pattern` (or the process ends). */
  async waitFor(where: "stdout" | "stderr", pattern: RegExp, timeoutMs = 30_000): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (!pattern.test(this[where])) {
      if (Date.now() > until) {
        throw new Error(
          `timed out waiting for ${pattern}\nstdout: ${this.stdout}\nstderr: ${this.stderr}`,
        );
      }
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  async finish(): Promise<number> {
    await this.close();
    const { code } = await this.process.status;
    await Promise.all(this.#pumps);
    return code;
  }
}
