/**
 * Chat history on disk: one JSON message per line (JSONL), appended and fsynced as the chat
 * goes, so a crash loses at most the line being written.
 *
 * A crash mid-write leaves a truncated last line. It is reported and left in place, byte for
 * byte; the next append starts on a new line, and the first message written after it carries
 * `"resumes_after_bad_line": N`, so later loads know line N is a known, skipped casualty. Any
 * other bad line is an error naming the file and line: k3 never guesses which of your turns to
 * drop. A line that is whole JSON but not a message k3 can render (`tool_calls: "abc"`, a part
 * without text, a 50 MB message, nesting 10,000 deep) is such an error even when it is last.
 *
 * One chat at a time: {@link lockHistory} takes an exclusive lock on the file, and a second
 * `k3 chat` on it is refused rather than interleaving its turns with the first's.
 */
import * as path from "node:path";
import { badInput, K3Error } from "../errors.ts";
import { syncDir, writeAll, writeFailure, writeFileAtomic } from "../io/atomic.ts";
import { checkRegular, formatSize, MAX_TEXT_BYTES, osReason, readUserFile } from "../io/files.ts";
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
/** A history holds at most one conversation that fits the context; 256 MiB is far past it. */
const MAX_HISTORY_BYTES = 256 << 20;
/** JSON nesting a message may have (the renderer recurses over tool arguments). */
const MAX_DEPTH = 64;

/** Loads `file` (absent = empty). A bad line that is not an unacknowledged torn last line
 * throws badInput naming `file:line`. */
export async function loadHistory(file: string): Promise<LoadedHistory> {
  const bytes = await readUserFile(file, "chat history", {
    limit: MAX_HISTORY_BYTES,
    missingOk: true,
  });
  if (bytes === null) return { messages: [], warnings: [], endsWithNewline: true };
  const lines = splitLines(bytes);
  const parsed = lines.map((line) => parseLine(line.bytes));
  const result: LoadedHistory = {
    messages: [],
    warnings: [],
    endsWithNewline: bytes.length === 0 || bytes[bytes.length - 1] === NEWLINE,
  };
  const toolNames = new ToolNames();
  parsed.forEach((p, i) => {
    const number = lines[i].number;
    if ("message" in p) {
      const problem = toolNames.check(p.message);
      if (problem) throw badLine(file, number, problem);
      result.messages.push(p.message);
      return;
    }
    const next = parsed[i + 1];
    if (!p.torn) throw badLine(file, number, p.problem);
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

function badLine(file: string, number: number, problem: string): K3Error {
  return badInput(
    `${file}:${number}: not a chat message k3 can use (${problem}); fix or delete line ` +
      `${number} by hand and start again`,
  );
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

/** A message, or why the line is not one; `torn`: not even whole JSON (a cut write). */
type ParsedLine =
  | { message: HistoryMessage; resumesAfter?: number }
  | { problem: string; torn: boolean };

/** One line: strict UTF-8, a JSON object that is a message the chat can render. */
function parseLine(bytes: Uint8Array): ParsedLine {
  if (bytes.length > MAX_TEXT_BYTES) {
    return {
      problem: `the line is ${formatSize(bytes.length)}, over the ${
        formatSize(MAX_TEXT_BYTES)
      } a message may be`,
      torn: false,
    };
  }
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    return { problem: (e as Error).message, torn: true };
  }
  if (!isRecord(value)) return { problem: "not a JSON object", torn: false };
  const { [RESUMES_FIELD]: resumesAfter, ...message } = value;
  const problem = messageProblem(message);
  if (problem) return { problem, torn: false };
  return {
    message: message as unknown as HistoryMessage,
    resumesAfter: typeof resumesAfter === "number" ? resumesAfter : undefined,
  };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const show = (v: unknown) => {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 40 ? s.slice(0, 37) + "..." : s;
};

/**
 * What keeps `m` from being a message the renderer (lib/text/chat.ts) takes, naming the
 * field; null when it is one. Unknown fields are kept and ignored, as the renderer does.
 */
function messageProblem(m: Record<string, unknown>): string | null {
  if (typeof m.role !== "string" || !ROLES.has(m.role)) {
    return `"role" must be one of ${[...ROLES].join(", ")}, found ${show(m.role)}`;
  }
  if (tooDeep(m, MAX_DEPTH)) return `it nests JSON deeper than ${MAX_DEPTH} levels`;
  for (const key of ["name", "tool_call_id", "tool"]) {
    if (m[key] !== undefined && typeof m[key] !== "string") {
      return `"${key}" must be a string, found ${show(m[key])}`;
    }
  }
  for (const key of ["reasoning_content", "reasoning"]) {
    if (m[key] !== undefined && m[key] !== null && typeof m[key] !== "string") {
      return `"${key}" must be a string or null, found ${show(m[key])}`;
    }
  }
  if (m.interrupted !== undefined && typeof m.interrupted !== "boolean") {
    return `"interrupted" must be true or false, found ${show(m.interrupted)}`;
  }
  if (m.tools !== undefined && m.tools !== null && !Array.isArray(m.tools)) {
    return `"tools" must be a list of tool declarations, found ${show(m.tools)}`;
  }
  return contentProblem(m.content) ?? toolCallsProblem(m.tool_calls);
}

function contentProblem(c: unknown): string | null {
  if (c === undefined || c === null || typeof c === "string") return null;
  if (!Array.isArray(c)) {
    return `"content" must be a string, a list of parts or null, found ${show(c)}`;
  }
  for (let k = 0; k < c.length; k++) {
    const part = c[k];
    if (isRecord(part) && (part.type === "image" || part.type === "image_url")) {
      return `content[${k}] is an image; this engine is text-only`;
    }
    if (!isRecord(part) || typeof part.text !== "string") {
      return `content[${k}] must be a text part {"type": "text", "text": "..."}, found ${
        show(part)
      }`;
    }
  }
  return null;
}

function toolCallsProblem(calls: unknown): string | null {
  if (calls === undefined || calls === null) return null;
  if (!Array.isArray(calls)) return `"tool_calls" must be a list of calls, found ${show(calls)}`;
  for (let k = 0; k < calls.length; k++) {
    const call = calls[k];
    if (!isRecord(call)) return `tool_calls[${k}] must be an object, found ${show(call)}`;
    const f = call.function ?? call;
    if (!isRecord(f) || typeof f.name !== "string" || f.name === "") {
      return `tool_calls[${k}].function.name must be a non-empty string`;
    }
    const args = f.arguments;
    if (args === undefined || args === null || isRecord(args)) continue;
    if (typeof args !== "string") {
      return `tool_calls[${k}].function.arguments must be an object or a JSON string`;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(args);
    } catch {
      continue; // rendered raw, as the renderer does
    }
    if (args.trim() !== "" && !isRecord(parsed)) {
      return `tool_calls[${k}].function.arguments must encode a JSON object, found ${show(args)}`;
    }
    if (tooDeep(parsed, MAX_DEPTH)) {
      return `tool_calls[${k}].function.arguments nest JSON deeper than ${MAX_DEPTH} levels`;
    }
  }
  return null;
}

/** True when `value` nests objects or lists deeper than `limit` (checked without recursion). */
function tooDeep(value: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    if (depth > limit) return true;
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
  return false;
}

/**
 * The renderer names a `tool` message without "name" or "tool" after the preceding
 * assistant's call of the same position; one with no such call cannot be rendered.
 */
class ToolNames {
  #calls = 0;
  #seen = 0;

  check(m: HistoryMessage): string | null {
    if (m.role === "assistant") {
      this.#calls = m.tool_calls?.length ?? 0;
      this.#seen = 0;
    } else if (m.role === "tool") {
      this.#seen++;
      if (!m.tool && !m.name && this.#seen > this.#calls) {
        return `tool message #${this.#seen} has no "name" and no matching tool_calls entry in ` +
          `the assistant message before it`;
      }
    }
    return null;
  }
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

  /**
   * Appends one message as one line and fsyncs it (and the folder, when the file was empty).
   * A failed write (a full disk) cuts the file back to where it was, so no torn line is left,
   * and throws exit 2 naming the file and the OS error.
   */
  async append(message: HistoryMessage): Promise<void> {
    const record = this.#acknowledge === undefined
      ? message
      : { ...message, [RESUMES_FIELD]: this.#acknowledge };
    const line = (this.#needsNewline ? "\n" : "") + JSON.stringify(record) + "\n";
    let out: Deno.FsFile;
    try {
      out = await Deno.open(this.file, { append: true, create: true });
    } catch (e) {
      throw writeFailure(this.file, e);
    }
    let start: number | undefined;
    try {
      start = (await out.stat()).size;
      await writeAll(out, new TextEncoder().encode(line));
      await out.sync();
    } catch (e) {
      if (start !== undefined) await out.truncate(start).catch(() => {});
      const err = writeFailure(this.file, e);
      if (err instanceof K3Error) {
        err.message += "; the message was not recorded (the history is as it was before it)";
      }
      throw err;
    } finally {
      out.close();
    }
    if (start === 0) await syncDir(path.dirname(path.resolve(this.file)));
    this.#needsNewline = false;
    this.#acknowledge = undefined;
  }
}

/**
 * Takes an exclusive lock on the history `file` (creating it empty when absent), so that a
 * second `k3 chat` on the same file is refused instead of interleaving its turns. `release`
 * (or leaving an `await using` scope) unlocks it, and removes the file again when it was created here and nothing was written.
 * @throws K3Error (exit 2) when another process holds the lock, or the file is not a regular
 *   file or cannot be opened
 */
export async function lockHistory(file: string): Promise<HistoryLock> {
  let existed = true;
  try {
    checkRegular(file, "chat history", await Deno.stat(file));
  } catch (e) {
    if (e instanceof K3Error) throw e;
    if (!(e instanceof Deno.errors.NotFound)) {
      throw badInput(`${file}: chat history ${osReason(e)}`, { cause: e });
    }
    existed = false;
  }
  let f: Deno.FsFile;
  try {
    f = await Deno.open(file, { read: true, append: true, create: true });
  } catch (e) {
    throw writeFailure(file, e);
  }
  if (!(await f.tryLock(true))) {
    f.close();
    throw badInput(
      `${file}: another k3 chat is using this history (it holds the file's lock); end that ` +
        `chat first, or give this one another --history`,
    );
  }
  let held = true;
  const release = async () => {
    if (!held) return;
    held = false;
    const empty = !existed && (await f.stat()).size === 0;
    if (empty) await Deno.remove(file).catch(() => {});
    f.close(); // closing the file drops the lock
  };
  return { release, [Symbol.asyncDispose]: release };
}

/** A held history lock; `await using` releases it. */
export interface HistoryLock extends AsyncDisposable {
  release(): Promise<void>;
}

/** Replaces `file` atomically with the whole conversation as JSONL. */
export async function saveConversation(file: string, messages: HistoryMessage[]): Promise<void> {
  await writeFileAtomic(file, messages.map((m) => JSON.stringify(m) + "\n").join(""));
}

/** The state kept beside a chat history file: the conversation's, for the next chat to resume. */
export function stateFileFor(history: string): string {
  return `${history}.state`;
}

/**
 * The history file a new conversation (/reset) records to, beside `file`: `talk.jsonl` ->
 * `talk-2.jsonl`, `talk-2.jsonl` -> `talk-3.jsonl`, past any name already taken; locked (and
 * created) here, so no other chat takes it meanwhile.
 */
export async function nextHistoryFile(file: string): Promise<{ file: string; lock: HistoryLock }> {
  const ext = path.extname(file);
  const stem = file.slice(0, file.length - ext.length);
  const numbered = /^(.*)-(\d+)$/.exec(stem);
  const base = numbered ? numbered[1] : stem;
  for (let n = numbered ? Number(numbered[2]) + 1 : 2;; n++) {
    const next = `${base}-${n}${ext}`;
    if (await exists(next)) continue;
    return { file: next, lock: await lockHistory(next) };
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await Deno.lstat(file);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw badInput(`${file}: chat history ${osReason(e)}`, { cause: e });
  }
}
