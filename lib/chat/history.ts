/**
 * Chat history on disk: one JSON message per line (JSONL), appended and fsynced as the chat
 * goes, so a crash loses at most the line being written.
 *
 * A crash mid-write leaves a truncated last line. It is reported and left in place, byte for
 * byte; the next append starts on a new line, and the first message written after it carries
 * `"resumes_after_bad_line": N`, so later loads know line N is a known, skipped casualty. Any
 * other bad line is an error: k3 never guesses which of your turns to drop.
 */
import * as path from "node:path";
import { badInput } from "../errors.ts";
import { syncDir, writeAll, writeFileAtomic } from "../io/atomic.ts";
import type { ChatMessage } from "../text/chat.ts";

/** A message as the chat keeps it; `interrupted` marks an answer cut short by Ctrl-C. */
export interface HistoryMessage extends ChatMessage {
  interrupted?: boolean;
}

/** What loading a history file found. */
export interface LoadedHistory {
  messages: HistoryMessage[];
  /** One line per problem the user should hear about (skipped lines). */
  warnings: string[];
  /** 1-based number of a bad last line left in place, if any. */
  badLastLine?: number;
  /** False when the file does not end with a newline (the next append adds one first). */
  endsWithNewline: boolean;
}

/** The field that acknowledges a skipped bad line just before a message. */
const RESUMES_FIELD = "resumes_after_bad_line";
const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);
const NEWLINE = 0x0a;

/** Loads `file` (absent = empty). A bad line before the last (unacknowledged) throws badInput. */
export async function loadHistory(file: string): Promise<LoadedHistory> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(file);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      return { messages: [], warnings: [], endsWithNewline: true };
    }
    throw badInput(`--history ${file}: cannot read it: ${(e as Error).message}`, { cause: e });
  }
  const lines = splitLines(bytes);
  const parsed = lines.map((line) => parseLine(line.bytes));
  const result: LoadedHistory = {
    messages: [],
    warnings: [],
    endsWithNewline: bytes.length === 0 || bytes[bytes.length - 1] === NEWLINE,
  };
  parsed.forEach((p, i) => {
    const number = lines[i].number;
    if ("message" in p) {
      result.messages.push(p.message);
      return;
    }
    const next = parsed[i + 1];
    if (next === undefined) {
      result.badLastLine = number;
      result.warnings.push(
        `${file}:${number}: the last line is not a complete message (${p.problem}; ` +
          `a crash mid-write?). It is left in place and skipped; new turns go after it.`,
      );
    } else if ("message" in next && next.resumesAfter === number) {
      result.warnings.push(`${file}:${number}: skipping a bad line left by an earlier crash`);
    } else {
      throw badInput(
        `${file}:${number}: not a chat message (${p.problem}). Lines after it exist, so this ` +
          `is not a crash mid-write; fix or delete line ${number} by hand and start again.`,
      );
    }
  });
  return result;
}

/** Non-empty lines of the file, with 1-based line numbers. */
function splitLines(bytes: Uint8Array): { number: number; bytes: Uint8Array }[] {
  const lines: { number: number; bytes: Uint8Array }[] = [];
  let start = 0;
  for (let number = 1; start < bytes.length; number++) {
    let end = bytes.indexOf(NEWLINE, start);
    if (end < 0) end = bytes.length;
    const line = bytes.subarray(start, end);
    if (line.some((b) => b !== 0x20 && b !== 0x09 && b !== 0x0d)) {
      lines.push({ number, bytes: line });
    }
    start = end + 1;
  }
  return lines;
}

type ParsedLine = { message: HistoryMessage; resumesAfter?: number } | { problem: string };

/** One line: strict UTF-8, a JSON object with a known `role`. */
function parseLine(bytes: Uint8Array): ParsedLine {
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    return { problem: (e as Error).message };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { problem: "not a JSON object" };
  }
  const { [RESUMES_FIELD]: resumesAfter, ...message } = value as Record<string, unknown>;
  if (typeof message.role !== "string" || !ROLES.has(message.role)) {
    return { problem: `"role" must be one of ${[...ROLES].join(", ")}` };
  }
  return {
    message: message as unknown as HistoryMessage,
    resumesAfter: typeof resumesAfter === "number" ? resumesAfter : undefined,
  };
}

/** An open history file that messages are appended to, each fsynced before returning. */
export class HistoryWriter {
  #needsNewline: boolean;
  #acknowledge: number | undefined;

  private constructor(readonly file: string, loaded: LoadedHistory) {
    this.#needsNewline = !loaded.endsWithNewline;
    this.#acknowledge = loaded.badLastLine;
  }

  /** A writer continuing `loaded`, the result of {@link loadHistory} on the same file. */
  static continuing(file: string, loaded: LoadedHistory): HistoryWriter {
    return new HistoryWriter(file, loaded);
  }

  /** Appends one message as one line and fsyncs it (and the folder, when the file is new). */
  async append(message: HistoryMessage): Promise<void> {
    const record = this.#acknowledge === undefined
      ? message
      : { ...message, [RESUMES_FIELD]: this.#acknowledge };
    const line = (this.#needsNewline ? "\n" : "") + JSON.stringify(record) + "\n";
    const created = !(await exists(this.file));
    const out = await Deno.open(this.file, { append: true, create: true });
    try {
      await writeAll(out, new TextEncoder().encode(line));
      await out.sync();
    } finally {
      out.close();
    }
    if (created) await syncDir(path.dirname(path.resolve(this.file)));
    this.#needsNewline = false;
    this.#acknowledge = undefined;
  }
}

/** Replaces `file` atomically with the whole conversation as JSONL. */
export async function saveConversation(file: string, messages: HistoryMessage[]): Promise<void> {
  await writeFileAtomic(file, messages.map((m) => JSON.stringify(m) + "\n").join(""));
}

async function exists(file: string): Promise<boolean> {
  try {
    await Deno.lstat(file);
    return true;
  } catch {
    return false;
  }
}
