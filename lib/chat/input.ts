/**
 * Where chat messages come from. Two sources with one contract ({@link ChatInput}):
 *
 * - {@link TerminalInput}: a terminal. Line editing is `node:readline` (arrows, Home/End,
 *   Ctrl-A/E/W/K/U, Up/Down through the input history, kept in a file beside the chat
 *   history). A paste arrives as one message (bracketed paste). While the model answers,
 *   the terminal stays in raw mode and nothing is echoed: keys typed then are held and
 *   replayed into the next prompt, so they never land inside the answer; Ctrl-C stops the
 *   answer.
 * - {@link PipedInput}: piped stdin, one line per message.
 *
 * Both take several lines the same way: a line ending with a backslash continues onto the
 * next (the backslash becomes a newline). Alt-Enter in a terminal does the same, and a
 * multi-line paste is turned into continued lines, which the user then sends with Enter.
 */
import process from "node:process";
import * as readline from "node:readline";
import { PassThrough } from "node:stream";
import { writeFileAtomic } from "../io/atomic.ts";
import { readUserText } from "../io/files.ts";

/** What {@link ChatInput.read} gives: a message, `null` at end of input, or Ctrl-C. */
export type InputResult = string | null | typeof INTERRUPTED;

/** Ctrl-C at an empty prompt. */
export const INTERRUPTED: unique symbol = Symbol("interrupted");

/** A source of chat messages. */
export interface ChatInput {
  /** True for a terminal (prompts are shown by the input itself). */
  readonly interactive: boolean;
  /** The next message (continued lines joined), `null` at the end, or INTERRUPTED. */
  read(): Promise<InputResult>;
  /**
   * The model is answering: keys typed from now on are held for the next prompt, and
   * Ctrl-C typed on a terminal calls `onInterrupt`.
   */
  hold(onInterrupt: () => void): void;
  /** Restores the terminal. */
  close(): Promise<void>;
}

/** Joins continued lines: a line ending in `\` continues onto the next one. */
export class Continuation {
  #lines: string[] = [];

  /** True when a message is started and waiting for more lines. */
  get pending(): boolean {
    return this.#lines.length > 0;
  }

  /** Adds a line; returns the whole message once a line does not end with `\`. */
  push(line: string): string | undefined {
    if (line.endsWith("\\")) {
      this.#lines.push(line.slice(0, -1));
      return undefined;
    }
    const message = [...this.#lines, line].join("\n");
    this.#lines = [];
    return message;
  }

  /** At end of input: what was started, if anything. */
  flush(): string | undefined {
    if (!this.pending) return undefined;
    const message = this.#lines.join("\n");
    this.#lines = [];
    return message;
  }

  reset(): void {
    this.#lines = [];
  }
}

/** Piped stdin: one message per line (UTF-8; `\n` or `\r\n`), continued lines joined. */
export class PipedInput implements ChatInput {
  readonly interactive = false;
  readonly #lines: AsyncIterator<string>;
  readonly #joiner = new Continuation();

  constructor(input: ReadableStream<Uint8Array>) {
    this.#lines = readLines(input);
  }

  async read(): Promise<InputResult> {
    for (;;) {
      const next = await this.#lines.next();
      if (next.done) return this.#joiner.flush() ?? null;
      const message = this.#joiner.push(next.value);
      if (message !== undefined) return message;
    }
  }

  hold(): void {}

  async close(): Promise<void> {}
}

/** Lines of a byte stream (UTF-8; "\n" or "\r\n"); a last line without "\n" still counts. */
async function* readLines(input: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let buffer = "";
  for await (const chunk of input.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let at: number;
    while ((at = buffer.indexOf("\n")) >= 0) {
      yield buffer.slice(0, at).replace(/\r$/, "");
      buffer = buffer.slice(at + 1);
    }
  }
  if (buffer !== "") yield buffer.replace(/\r$/, "");
}

const PASTE_ON = "\x1b[?2004h";
const PASTE_OFF = "\x1b[?2004l";
const PASTE_START = "\x1b[200~";
const PASTE_END = "\x1b[201~";
const ALT_ENTER = "\x1b\r";
const CTRL_C = 0x03;
/** Input history entries kept (in memory and in the file). */
const INPUT_HISTORY_SIZE = 1000;
/** 1000 lines of typed input; a file far larger is not one k3 wrote. */
const INPUT_HISTORY_BYTES = 64 << 20;

/**
 * Turns raw terminal input into what readline is given: bracketed pastes become continued
 * lines (control characters inside a paste dropped, a trailing newline dropped), Alt-Enter
 * becomes `\` + Enter. Everything else passes through untouched.
 */
export class PasteSplitter {
  #inPaste = false;
  #paste = "";
  #tail = "";

  push(text: string): string {
    let s = this.#tail + text;
    this.#tail = "";
    let out = "";
    while (s !== "") {
      const marker = this.#inPaste ? PASTE_END : PASTE_START;
      const at = s.indexOf(marker);
      if (at < 0) {
        // Keep a tail that could be the start of the marker (split across reads).
        const keep = partialSuffix(s, marker);
        this.#tail = s.slice(s.length - keep);
        s = s.slice(0, s.length - keep);
        if (this.#inPaste) this.#paste += s;
        else out += s.replaceAll(ALT_ENTER, "\\\r");
        break;
      }
      if (this.#inPaste) {
        out += pastedAsLines(this.#paste + s.slice(0, at));
        this.#paste = "";
      } else {
        out += s.slice(0, at).replaceAll(ALT_ENTER, "\\\r");
      }
      this.#inPaste = !this.#inPaste;
      s = s.slice(at + marker.length);
    }
    return out;
  }
}

/** Length (at least 2) of the longest suffix of `s` that is a proper prefix of `marker`. */
function partialSuffix(s: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, s.length); n >= 2; n--) {
    if (s.endsWith(marker.slice(0, n))) return n;
  }
  return 0;
}

/** A pasted text as readline input: each line but the last ends with `\` + Enter. */
function pastedAsLines(paste: string): string {
  const text = paste.replace(/\r\n?/g, "\n").replace(/\n$/, "")
    // deno-lint-ignore no-control-regex
    .replace(/[\x00-\x08\x0b-\x1f\x7f]/g, "");
  return text.split("\n").join("\\\r");
}

/** One readline prompt's outcome. */
type LineRead =
  | { kind: "line"; line: string }
  | { kind: "eof" }
  | { kind: "interrupt"; empty: boolean };

/** The input history file kept beside a chat history file. */
export function inputHistoryFile(chatHistory: string): string {
  return `${chatHistory}.input-history`;
}

/**
 * A terminal: stdin in raw mode for the whole chat, read by one pump. While a prompt is
 * open the pump hands keys to a readline interface, one line at a time (so keys typed after
 * an Enter wait for the next prompt instead of being lost); otherwise it holds them.
 */
export class TerminalInput implements ChatInput {
  readonly interactive = true;
  /** Newest first, as readline keeps it. */
  #history: string[];
  readonly #historyFile?: string;
  readonly #splitter = new PasteSplitter();
  readonly #decoder = new TextDecoder();
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  /** The open prompt's key input, or undefined between prompts. */
  #keys?: PassThrough;
  #onEof?: () => void;
  /** Keys (after paste handling) left over when a line ended. */
  #pending = "";
  /** Raw bytes typed between prompts. */
  #held: Uint8Array[] = [];
  #onInterrupt?: () => void;
  #ended = false;

  private constructor(history: string[], historyFile?: string) {
    this.#history = history;
    this.#historyFile = historyFile;
    Deno.stdin.setRaw(true);
    process.stdout.write(PASTE_ON);
    this.#reader = Deno.stdin.readable.getReader();
    this.#pump();
  }

  /** Opens the terminal; `historyFile` keeps the input history across chats. */
  static async open(historyFile?: string): Promise<TerminalInput> {
    return new TerminalInput(await loadInputHistory(historyFile), historyFile);
  }

  /** The input history, newest first. */
  get history(): readonly string[] {
    return this.#history;
  }

  async #pump(): Promise<void> {
    try {
      for (;;) {
        const { value, done } = await this.#reader.read();
        if (done) break;
        if (this.#keys) this.#give(value);
        else this.#hold(value);
      }
    } catch {
      // stdin closed under us (hangup): the same as end of input.
    }
    this.#ended = true;
    this.#onEof?.();
  }

  #give(bytes: Uint8Array): void {
    this.#offer(this.#splitter.push(this.#decoder.decode(bytes, { stream: true })));
  }

  /**
   * Hands `text` to the open prompt up to each key that can end it (Enter, Ctrl-C, Ctrl-D);
   * once the prompt has ended, the rest waits for the next one. readline decodes keys
   * synchronously on "data", so the prompt's end is seen right after each piece.
   */
  #offer(text: string): void {
    while (text !== "" && this.#keys) {
      // deno-lint-ignore no-control-regex
      const end = text.search(/[\r\n\x03\x04]/);
      const piece = end < 0 ? text : text.slice(0, end + 1);
      text = text.slice(piece.length);
      this.#keys.emit("data", new TextEncoder().encode(piece));
    }
    this.#pending = text + this.#pending;
  }

  /** Between prompts: Ctrl-C interrupts the answer, everything else waits for the prompt. */
  #hold(bytes: Uint8Array): void {
    if (bytes.includes(CTRL_C)) {
      bytes = bytes.filter((b) => b !== CTRL_C);
      this.#onInterrupt?.();
    }
    if (bytes.length > 0) this.#held.push(bytes);
  }

  hold(onInterrupt: () => void): void {
    this.#onInterrupt = onInterrupt;
  }

  async read(): Promise<InputResult> {
    this.#onInterrupt = undefined;
    const joiner = new Continuation();
    for (;;) {
      const got = await this.#readLine(joiner.pending ? "... " : "> ");
      if (got.kind === "eof") {
        process.stdout.write("\n");
        return joiner.flush() ?? null;
      }
      if (got.kind === "interrupt") {
        if (!got.empty || joiner.pending) {
          // Ctrl-C on a line being typed drops it, as in a shell.
          process.stdout.write("^C\n");
          joiner.reset();
          continue;
        }
        process.stdout.write("\n");
        return INTERRUPTED;
      }
      const message = joiner.push(got.line);
      if (message !== undefined) {
        await this.#saveHistory();
        return message;
      }
    }
  }

  /** One line from a fresh readline interface, given the keys typed ahead first. */
  #readLine(prompt: string): Promise<LineRead> {
    return new Promise<LineRead>((resolve) => {
      const keys = new PassThrough();
      const rl = readline.createInterface({
        input: keys,
        output: process.stdout,
        terminal: true,
        prompt,
        history: this.#history,
        historySize: INPUT_HISTORY_SIZE,
        removeHistoryDuplicates: true,
        tabSize: 4,
      });
      let settled = false;
      const settle = (got: LineRead) => {
        if (settled) return;
        settled = true;
        this.#history = (rl as unknown as { history?: string[] }).history ?? this.#history;
        this.#keys = undefined;
        this.#onEof = undefined;
        rl.close();
        resolve(got);
      };
      rl.on("line", (line) => settle({ kind: "line", line }));
      rl.on("SIGINT", () => settle({ kind: "interrupt", empty: rl.line === "" }));
      rl.on("close", () => settle({ kind: "eof" })); // Ctrl-D on an empty line
      rl.prompt();
      this.#keys = keys;
      this.#onEof = () => settle({ kind: "eof" });
      const pending = this.#pending;
      this.#pending = "";
      this.#offer(pending);
      while (this.#keys && this.#held.length > 0) this.#give(this.#held.shift()!);
      if (this.#keys && this.#ended) settle({ kind: "eof" });
    });
  }

  async #saveHistory(): Promise<void> {
    if (!this.#historyFile) return;
    const lines = this.#history.slice(0, INPUT_HISTORY_SIZE).reverse();
    try {
      await writeFileAtomic(this.#historyFile, lines.map((l) => l + "\n").join(""));
    } catch (e) {
      console.error(`warning: cannot save the input history ${this.#historyFile}: ${e}`);
    }
  }

  async close(): Promise<void> {
    process.stdout.write(PASTE_OFF);
    try {
      Deno.stdin.setRaw(false);
    } catch {
      // stdin is gone (hangup): nothing to restore.
    }
    await this.#reader.cancel().catch(() => {});
  }
}

/** The input history in `file` (oldest first, one entry per line), newest first. */
async function loadInputHistory(file: string | undefined): Promise<string[]> {
  if (!file) return [];
  try {
    // A FIFO here must not hang the chat, nor a huge file fill memory.
    const text = await readUserText(file, "input history", {
      limit: INPUT_HISTORY_BYTES,
      missingOk: true,
    });
    if (text === null) return [];
    return text.split("\n").filter((l) => l !== "").reverse().slice(0, INPUT_HISTORY_SIZE);
  } catch (e) {
    console.error(`warning: not using the input history: ${(e as Error).message}`);
    return [];
  }
}
