/**
 * Parse what the model generated after the XTML generation prompt (SPEC §7.4) into reasoning,
 * answer and tool calls. Input is detokenised text with special tokens kept. Never throws: a
 * tool call that does not follow the grammar is skipped and described in `malformed`.
 */

import { CLOSE, END_OF_MSG, OPEN, SEP } from "./chat.ts";

/** One parsed tool call; `index` is its 0-based position (OpenAI's convention). */
export interface ParsedToolCall {
  name: string;
  /** key -> value, or the raw text of a `json` block. */
  arguments: Record<string, unknown> | string;
  index: number;
}

export interface ParsedOutput {
  /** Text of the think channel, or null when thinking is off. */
  reasoning: string | null;
  content: string;
  toolCalls: ParsedToolCall[];
  /** One human-readable line per problem found in the tools channel. */
  malformed: string[];
}

const THINK_END = `${CLOSE}think${SEP}`;
const RESPONSE_OPEN = `${OPEN}response${SEP}`;
const RESPONSE_CLOSE = `${CLOSE}response${SEP}`;
const TOOLS_OPEN = `${OPEN}tools${SEP}`;
const TOOLS_CLOSE = `${CLOSE}tools${SEP}`;
const MESSAGE_CLOSE = `${CLOSE}message${SEP}`;

/**
 * Split generated text into reasoning, content and tool calls. `thinking` (default true) says
 * whether the prompt opened the think channel; otherwise it opened the response channel.
 * Missing closing markers (a cut-off generation) end the channel at the end of the text.
 */
export function parseOutput(text: string, options: { thinking?: boolean } = {}): ParsedOutput {
  let rest = text;
  let reasoning: string | null = null;
  if (options.thinking ?? true) {
    const end = firstOf(rest, [THINK_END, RESPONSE_OPEN, MESSAGE_CLOSE, END_OF_MSG]);
    reasoning = rest.slice(0, end.at);
    rest = end.marker === THINK_END ? rest.slice(end.at + THINK_END.length) : rest.slice(end.at);
    const response = rest.indexOf(RESPONSE_OPEN);
    rest = response >= 0 ? rest.slice(response + RESPONSE_OPEN.length) : "";
  }
  const contentEnd = firstOf(rest, [RESPONSE_CLOSE, TOOLS_OPEN, MESSAGE_CLOSE, END_OF_MSG]);
  const content = rest.slice(0, contentEnd.at);
  rest = rest.slice(contentEnd.at);
  const malformed: string[] = [];
  const toolCalls = parseToolsChannel(rest, malformed);
  return { reasoning, content, toolCalls, malformed };
}

/** The earliest of several markers in `text` (or the end of the text). */
function firstOf(text: string, markers: string[]): { at: number; marker: string | null } {
  let best = { at: text.length, marker: null as string | null };
  for (const marker of markers) {
    const at = text.indexOf(marker);
    if (at >= 0 && at < best.at) best = { at, marker };
  }
  return best;
}

function parseToolsChannel(text: string, malformed: string[]): ParsedToolCall[] {
  const start = text.indexOf(TOOLS_OPEN);
  if (start < 0) return [];
  const body = text.slice(start + TOOLS_OPEN.length);
  const end = body.indexOf(TOOLS_CLOSE);
  if (end < 0) malformed.push("tools channel is not closed (generation cut off?)");
  const reader = new Reader(end < 0 ? body : body.slice(0, end));
  const calls: ParsedToolCall[] = [];
  for (let attempt = 1; reader.skipSpace(), !reader.done(); attempt++) {
    const problem = readCall(reader, calls.length, calls);
    if (problem) {
      malformed.push(`call ${attempt}: ${problem}`);
      reader.skipToNextCall();
    }
  }
  return calls;
}

/** Read one `<|open|>call ...<|close|>call<|sep|>`; push it, or return what is wrong. */
function readCall(reader: Reader, index: number, calls: ParsedToolCall[]): string | null {
  const head = reader.readOpen();
  if (!head || head.tag !== "call") return `expected ${OPEN}call, found ${reader.preview()}`;
  const name = head.attrs.get("tool");
  if (!name) return "call has no tool attribute";
  let args: Record<string, unknown> | string = {};
  for (;;) {
    reader.skipSpace();
    if (reader.readClose("call")) break;
    if (reader.done()) return `call "${name}" is not closed`;
    const part = reader.readOpen();
    if (!part) return `unexpected text in call "${name}": ${reader.preview()}`;
    const value = reader.readUntilClose(part.tag);
    if (value === null) return `${part.tag} in call "${name}" is not closed`;
    if (part.tag === "json") {
      args = value;
    } else if (part.tag === "argument") {
      const key = part.attrs.get("key");
      if (key === undefined) return `argument without key in call "${name}"`;
      if (typeof args === "string") return `call "${name}" mixes a json block with arguments`;
      args[key] = argumentValue(value, part.attrs.get("type"));
    } else {
      return `unknown tag "${part.tag}" in call "${name}"`;
    }
  }
  calls.push({ name, arguments: args, index });
  return null;
}

/** `type="string"` keeps the raw text; any other type is JSON, falling back to the raw text. */
function argumentValue(raw: string, type: string | undefined): unknown {
  if (type === "string") return raw;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/** Undo the attribute escaping of the renderer (`&quot;` then `&amp;`). */
export function unescapeAttr(v: string): string {
  return v.replaceAll("&quot;", '"').replaceAll("&amp;", "&");
}

const ATTR = /^ ([^\s="]+)="([^"]*)"/;

/** A cursor over the tools channel. */
class Reader {
  #pos = 0;
  constructor(readonly text: string) {}

  done(): boolean {
    return this.#pos >= this.text.length;
  }

  skipSpace(): void {
    while (!this.done() && /\s/.test(this.text[this.#pos])) this.#pos++;
  }

  /** After a bad call: go to the next call's opening, or past the bad call's closing. */
  skipToNextCall(): void {
    const nextOpen = this.text.indexOf(`${OPEN}call`, this.#pos + 1);
    const closeMarker = `${CLOSE}call${SEP}`;
    const nextClose = this.text.indexOf(closeMarker, this.#pos);
    if (nextOpen >= 0 && (nextClose < 0 || nextOpen < nextClose)) this.#pos = nextOpen;
    else this.#pos = nextClose < 0 ? this.text.length : nextClose + closeMarker.length;
  }

  /** `<|open|>tag attr="v"...<|sep|>` at the cursor, or null (cursor unchanged). */
  readOpen(): { tag: string; attrs: Map<string, string> } | null {
    if (!this.text.startsWith(OPEN, this.#pos)) return null;
    const sep = this.text.indexOf(SEP, this.#pos);
    if (sep < 0) return null;
    let head = this.text.slice(this.#pos + OPEN.length, sep);
    const tag = /^[A-Za-z_-]+/.exec(head)?.[0];
    if (!tag) return null;
    head = head.slice(tag.length);
    const attrs = new Map<string, string>();
    for (let m = ATTR.exec(head); m; m = ATTR.exec(head)) {
      attrs.set(m[1], unescapeAttr(m[2]));
      head = head.slice(m[0].length);
    }
    if (head.trim() !== "") return null;
    this.#pos = sep + SEP.length;
    return { tag, attrs };
  }

  /** `<|close|>tag<|sep|>` at the cursor: consume it and return true. */
  readClose(tag: string): boolean {
    const marker = `${CLOSE}${tag}${SEP}`;
    if (!this.text.startsWith(marker, this.#pos)) return false;
    this.#pos += marker.length;
    return true;
  }

  /** The text up to `<|close|>tag<|sep|>`, consuming both; null if there is no such marker. */
  readUntilClose(tag: string): string | null {
    const marker = `${CLOSE}${tag}${SEP}`;
    const at = this.text.indexOf(marker, this.#pos);
    if (at < 0) return null;
    const value = this.text.slice(this.#pos, at);
    this.#pos = at + marker.length;
    return value;
  }

  preview(): string {
    return JSON.stringify(this.text.slice(this.#pos, this.#pos + 40));
  }
}
