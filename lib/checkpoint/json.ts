/**
 * A strict pull scanner for JSON text, for the two large JSON documents of a checkpoint: the
 * safetensors headers (~0.7 MB each, 96 of them) and model.safetensors.index.json (~60 MB).
 * JSON.parse would build an object per tensor and silently keep the last of two equal keys;
 * this reads one token at a time, so the caller keeps only what it needs in compact form and
 * sees every key (duplicates included). It accepts exactly what JSON.parse accepts (RFC 8259),
 * never recurses (any nesting depth is safe), and can take a document in chunks, so a 60 MB
 * index never sits in memory whole.
 *
 * Strings it returns may be slices of the document's text: a caller that keeps one for long
 * passes it through {@link detach} first, or it pins the whole document in memory.
 *
 * Every error is bad input naming the document and the character offset.
 */

import { badInput, type K3Error } from "../errors.ts";

const QUOTE = 0x22, BACKSLASH = 0x5c, COMMA = 0x2c, COLON = 0x3a;
const OPEN_BRACE = 0x7b, CLOSE_BRACE = 0x7d, OPEN_BRACKET = 0x5b, CLOSE_BRACKET = 0x5d;

/** The longest single token (string or number) accepted: far above any tensor name. */
const MAX_TOKEN_CHARS = 1 << 20;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A flat copy of `s` that does not keep the document it was sliced from alive. */
export function detach(s: string): string {
  return decoder.decode(encoder.encode(s));
}

function isWhitespace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/** A JSON number's characters: digits, sign, point, exponent. */
function isNumberChar(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 ||
    c === 0x45;
}

const NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;
// deno-lint-ignore no-control-regex -- JSON forbids raw control characters inside strings
const CONTROL = /[\x00-\x1f]/g;

/** Characters `text.slice(start, end)`: a string not yet made. */
export interface StringView {
  readonly text: string;
  readonly start: number;
  readonly end: number;
}

/** The text of a view, as a string. */
export function viewText(v: StringView): string {
  return v.text.slice(v.start, v.end);
}

/** The next chunk of the document's text, or null at its end. */
type Refill = () => string | null;

/** Reads bytes at `position` into `into`; returns how many (0 at the end of the file). */
export type ByteReader = (into: Uint8Array, position: number) => number;

/** Characters decoded per chunk: small, so chunk strings die young instead of piling up. */
const TEXT_CHUNK_BYTES = 64 << 10;

/**
 * The UTF-8 text of bytes [start, end) read through `read`, in chunks, strictly decoded.
 * @param what the document, for the error when it is not UTF-8
 */
export function textChunks(read: ByteReader, start: number, end: number, what: string): Refill {
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const chunk = new Uint8Array(TEXT_CHUNK_BYTES);
  let position = start, done = false;
  return () => {
    if (done) return null;
    const got = position < end
      ? read(chunk.subarray(0, Math.min(chunk.length, end - position)), position)
      : 0;
    position += got;
    try {
      if (got > 0) return decoder.decode(chunk.subarray(0, got), { stream: true });
      done = true;
      const tail = decoder.decode();
      return tail === "" ? null : tail;
    } catch (e) {
      throw badInput(`${what} is not valid JSON (not UTF-8)`, { cause: e });
    }
  };
}

export class JsonScanner {
  #text: string;
  #pos = 0;
  /** Offset of #text[0] in the document. */
  #base = 0;
  /** Start of the token being read (kept when more text is appended), or -1. */
  #mark = -1;
  #refill: Refill | null;

  /**
   * @param what the document, for error messages (usually its path and what it is)
   * @param source the whole document's text, or a function that returns its next chunk
   */
  constructor(readonly what: string, source: string | Refill) {
    if (typeof source === "string") {
      this.#text = source;
      this.#refill = null;
    } else {
      this.#text = "";
      this.#refill = source;
    }
  }

  /** A bad-input error at the current place: "<what> is not valid JSON (at character N: ...)". */
  error(message: string): K3Error {
    return badInput(
      `${this.what} is not valid JSON (at character ${this.#base + this.#pos}: ${message})`,
    );
  }

  /** Appends the next chunk; false at the end. Drops the text before #mark (or #pos). */
  #more(): boolean {
    if (!this.#refill) return false;
    const keep = this.#mark >= 0 ? this.#mark : this.#pos;
    if (this.#text.length - keep > MAX_TOKEN_CHARS) {
      throw this.error(`a token longer than ${MAX_TOKEN_CHARS} characters`);
    }
    const next = this.#refill();
    if (next === null) {
      this.#refill = null;
      return false;
    }
    this.#text = this.#text.slice(keep) + next;
    this.#nextBackslash = this.#nextControl = -1;
    this.#base += keep;
    this.#pos -= keep;
    if (this.#mark >= 0) this.#mark = 0;
    return true;
  }

  /** The next byte that is not whitespace (not consumed), or -1 at the end. */
  peek(): number {
    for (;;) {
      const text = this.#text, end = text.length;
      let p = this.#pos;
      while (p < end && isWhitespace(text.charCodeAt(p))) p++;
      this.#pos = p;
      if (p < end) return text.charCodeAt(p);
      if (!this.#more()) return -1;
    }
  }

  #expect(c: number, what: string): void {
    if (this.peek() !== c) throw this.error(`expected ${what}`);
    this.#pos++;
  }

  /** Consumes `{`. */
  beginObject(): void {
    this.#expect(OPEN_BRACE, "'{'");
  }

  /**
   * The next key of the object being read (after beginObject), with its ':' consumed, or null
   * (and the '}' consumed) when the object ends.
   * @param i how many keys of this object were read before (0 for the first)
   */
  key(i: number): string | null {
    if (!this.#toKey(i)) return null;
    const k = this.string();
    this.#expect(COLON, "':'");
    return k;
  }

  /** Moves to the next key's opening quote (past a ','); false (and '}' consumed) at the end. */
  #toKey(i: number): boolean {
    const c = this.peek();
    if (c === CLOSE_BRACE) {
      this.#pos++;
      return false;
    }
    if (i > 0) {
      if (c !== COMMA) throw this.error("expected ',' or '}'");
      this.#pos++;
      if (this.peek() !== QUOTE) throw this.error("expected a key (a string)");
    } else if (c !== QUOTE) throw this.error("expected a key (a string) or '}'");
    return true;
  }

  /** Consumes `[`. */
  beginArray(): void {
    this.#expect(OPEN_BRACKET, "'['");
  }

  /**
   * True when the array being read has another item (the ',' before it consumed); false (and
   * the ']' consumed) at its end.
   * @param i how many items were read before
   */
  item(i: number): boolean {
    const c = this.peek();
    if (c === CLOSE_BRACKET) {
      this.#pos++;
      return false;
    }
    if (i > 0) {
      if (c !== COMMA) throw this.error("expected ',' or ']'");
      this.#pos++;
      this.peek();
    }
    return true;
  }

  /** The type of the next value: "string", "number", "object", "array", "literal" or "end". */
  next(): "string" | "number" | "object" | "array" | "literal" | "end" {
    const c = this.peek();
    if (c === QUOTE) return "string";
    if (c === OPEN_BRACE) return "object";
    if (c === OPEN_BRACKET) return "array";
    if (c === -1) return "end";
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return "number";
    return "literal";
  }

  /** Where the last string scanned lies in #text (without quotes), and if it has escapes. */
  #strStart = 0;
  #strEnd = 0;
  #strEscaped = false;

  /** Next backslash and next control character in #text at or after where they were sought. */
  #nextBackslash = -1;
  #nextControl = -1;

  /** True when a backslash or a control character lies in #text[from, to). */
  #special(from: number, to: number): boolean {
    const text = this.#text;
    if (this.#nextBackslash < from) {
      const i = text.indexOf("\\", from);
      this.#nextBackslash = i < 0 ? Infinity : i;
    }
    if (this.#nextControl < from) {
      CONTROL.lastIndex = from;
      const m = CONTROL.exec(text);
      this.#nextControl = m ? m.index : Infinity;
    }
    return this.#nextBackslash < to || this.#nextControl < to;
  }

  /** Moves past a string, recording where its characters are. */
  #scanString(): void {
    if (this.peek() !== QUOTE) throw this.error("expected a string");
    this.#mark = this.#pos;
    let from = this.#pos + 1;
    for (;;) {
      const q = this.#text.indexOf('"', from);
      if (q >= 0 && !this.#special(this.#mark + 1, q)) {
        this.#strStart = this.#mark + 1;
        this.#strEnd = q;
        this.#strEscaped = false;
        this.#mark = -1;
        this.#pos = q + 1;
        return;
      }
      if (q >= 0) break; // escapes (or invalid control characters) before the quote
      const scanned = this.#text.length - this.#mark;
      if (!this.#more()) {
        this.#pos = this.#mark;
        this.#mark = -1;
        throw this.error("unterminated string");
      }
      from = this.#mark + scanned;
    }
    // Escapes: walk to the closing quote, stepping over escaped characters.
    this.#pos = this.#mark + 1;
    for (;;) {
      const text = this.#text, end = text.length;
      let p = this.#pos;
      while (p < end) {
        const c = text.charCodeAt(p);
        if (c === QUOTE) break;
        p += c === BACKSLASH ? 2 : 1;
      }
      this.#pos = p;
      if (p < end) break;
      if (!this.#more()) {
        this.#pos = this.#mark;
        this.#mark = -1;
        throw this.error("unterminated string");
      }
    }
    this.#strStart = this.#mark + 1;
    this.#strEnd = this.#pos;
    this.#strEscaped = true;
    this.#mark = -1;
    this.#pos++;
  }

  /** The last string scanned, decoded. */
  #lastString(): string {
    if (!this.#strEscaped) return this.#text.slice(this.#strStart, this.#strEnd);
    try {
      return JSON.parse(this.#text.slice(this.#strStart - 1, this.#strEnd + 1));
    } catch (e) {
      this.#pos = this.#strStart - 1;
      throw this.error(`bad string (${(e as Error).message})`);
    }
  }

  /** Reads a string value. */
  string(): string {
    this.#scanString();
    return this.#lastString();
  }

  /**
   * Reads a string value and says which of `values` it is: its index, or -1 for another
   * string (then `other` holds it, decoded).
   */
  stringIn(values: readonly string[]): number {
    this.#scanString();
    if (!this.#strEscaped) {
      const n = this.#strEnd - this.#strStart;
      for (let k = 0; k < values.length; k++) {
        if (values[k].length === n && this.#text.startsWith(values[k], this.#strStart)) return k;
      }
    }
    this.other = this.#lastString();
    const k = values.indexOf(this.other);
    return k;
  }

  /** The string stringIn or keyIn read when it returned -1. */
  other = "";

  /** The characters of the last string read by keyView or stringView. */
  readonly view: StringView = { text: "", start: 0, end: 0 };

  #setView(): StringView {
    const v = this.view as { text: string; start: number; end: number };
    if (this.#strEscaped) {
      const s = this.#lastString();
      v.text = s;
      v.start = 0;
      v.end = s.length;
    } else {
      v.text = this.#text;
      v.start = this.#strStart;
      v.end = this.#strEnd;
    }
    return v;
  }

  /** Reads a string value without making a string of it: see {@link view}. */
  stringView(): StringView {
    this.#scanString();
    return this.#setView();
  }

  /**
   * Like key(), but leaves the key in {@link view} instead of making a string of it; null
   * (and the '}' consumed) at the end of the object. The view is overwritten by the next keyView or stringView.
   */
  keyView(i: number): StringView | null {
    if (!this.#toKey(i)) return null;
    this.#scanString();
    // The view holds its own reference to the text, so reading on cannot invalidate it.
    const v = this.#setView();
    this.#expect(COLON, "':'");
    return v;
  }

  /**
   * Like key(), but says which of `names` the key is: its index, -1 for another key (held in
   * `other`), or -2 (and the '}' consumed) at the end of the object.
   */
  keyIn(i: number, names: readonly string[]): number {
    if (!this.#toKey(i)) return -2;
    const k = this.stringIn(names);
    this.#expect(COLON, "':'");
    return k;
  }

  /**
   * Reads an array of numbers into `out` (emptied first).
   * @returns true, or false when the value is not an array of numbers only (it is skipped,
   *   and `other` holds the start of its text)
   */
  numbers(out: number[]): boolean {
    out.length = 0;
    if (this.next() !== "array") {
      this.other = this.skipValue();
      return false;
    }
    this.beginArray();
    let ok = true;
    for (let i = 0; this.item(i); i++) {
      if (this.next() === "number") out.push(this.number());
      else {
        this.other = `a list holding ${this.skipValue()}`;
        ok = false;
      }
    }
    return ok;
  }

  /** Reads a number value. */
  number(): number {
    const c = this.peek();
    if (c !== 0x2d && !(c >= 0x30 && c <= 0x39)) throw this.error("expected a number");
    this.#mark = this.#pos;
    for (;;) {
      const text = this.#text, end = text.length;
      let p = this.#pos;
      while (p < end && isNumberChar(text.charCodeAt(p))) p++;
      this.#pos = p;
      if (p < end || !this.#more()) break;
    }
    const start = this.#mark, text = this.#text, stop = this.#pos;
    this.#mark = -1;
    // Fast path: up to 15 digits, no sign, no leading zero: exact as a double.
    if (stop - start <= 15 && (text.charCodeAt(start) !== 0x30 || stop - start === 1)) {
      let v = 0, i = start;
      for (; i < stop; i++) {
        const d = text.charCodeAt(i) - 0x30;
        if (d < 0 || d > 9) break;
        v = v * 10 + d;
      }
      if (i === stop) return v;
    }
    const token = text.slice(start, stop);
    if (!NUMBER.test(token)) {
      this.#pos = start;
      throw this.error(`bad number ${JSON.stringify(token)}`);
    }
    return Number(token);
  }

  /** Reads `true`, `false` or `null`. */
  literal(): true | false | null {
    const c = this.peek();
    const word = c === 0x74 ? "true" : c === 0x66 ? "false" : c === 0x6e ? "null" : "";
    if (word === "") throw this.error("expected a value");
    this.#mark = this.#pos;
    while (this.#text.length - this.#pos < word.length && this.#more());
    this.#mark = -1;
    if (!this.#text.startsWith(word, this.#pos)) throw this.error("expected a value");
    this.#pos += word.length;
    return word === "true" ? true : word === "false" ? false : null;
  }

  /**
   * Skips one value of any kind and depth (no recursion), checking its syntax.
   * @returns its first bytes as text (up to 80 characters), for error messages
   */
  skipValue(): string {
    const start = this.#base + this.#pos;
    let preview = "";
    const note = (s: string) => {
      if (preview.length < 80) preview = (preview + s).slice(0, 80);
    };
    // Open containers: true = object, false = array; with how many members each has had.
    const open: boolean[] = [];
    const counts: number[] = [];
    for (;;) {
      // One value.
      const kind = this.next();
      if (kind === "string") note(JSON.stringify(this.string()));
      else if (kind === "number") note(String(this.number()));
      else if (kind === "literal") note(String(this.literal()));
      else if (kind === "end") throw this.error("expected a value");
      else {
        this.#pos++;
        note(kind === "object" ? "{" : "[");
        open.push(kind === "object");
        counts.push(0);
      }
      // Close what ends here, then position at the next member.
      while (open.length > 0) {
        const top = open.length - 1;
        if (open[top]) {
          const k = this.key(counts[top]);
          if (k !== null) {
            note(`${JSON.stringify(k)}:`);
            counts[top]++;
            break;
          }
          note("}");
        } else {
          if (this.item(counts[top])) {
            if (counts[top] > 0) note(",");
            counts[top]++;
            break;
          }
          note("]");
        }
        open.pop();
        counts.pop();
      }
      if (open.length === 0) break;
    }
    return preview || `(value at byte ${start})`;
  }

  // Fast paths for a document of known, compact form (safetensors headers as their writers
  // lay them out). They match at the current character without skipping whitespace and never
  // read more text, so on a miss the caller can rewind() to where it started and read the
  // same part with the general methods above.

  /** The current place, for rewind(). */
  get position(): number {
    return this.#pos;
  }

  /** Goes back to a place returned by `position` (only if no fast path read past a chunk). */
  rewind(position: number): void {
    this.#pos = position;
  }

  /** Consumes `literal` if the text continues with it here. */
  tryLiteral(literal: string): boolean {
    if (!this.#text.startsWith(literal, this.#pos)) return false;
    this.#pos += literal.length;
    return true;
  }

  /** A non-negative integer of at most 15 digits written plainly here, or -1 (nothing read). */
  tryUint(): number {
    const text = this.#text, start = this.#pos, end = text.length;
    let p = start, v = 0;
    while (p < end) {
      const d = text.charCodeAt(p) - 0x30;
      if (d < 0 || d > 9) break;
      v = v * 10 + d;
      p++;
    }
    const n = p - start;
    if (n === 0 || n > 15 || p === end || isNumberChar(text.charCodeAt(p))) return -1;
    if (n > 1 && text.charCodeAt(start) === 0x30) return -1;
    this.#pos = p;
    return v;
  }

  /**
   * Which of `values` is written here followed by a closing quote (consumed), or -1.
   * The opening quote must already be consumed (e.g. by tryLiteral).
   */
  tryStringIn(values: readonly string[]): number {
    const text = this.#text, p = this.#pos;
    for (let k = 0; k < values.length; k++) {
      const v = values[k];
      if (text.charCodeAt(p + v.length) === QUOTE && text.startsWith(v, p)) {
        this.#pos = p + v.length + 1;
        return k;
      }
    }
    return -1;
  }

  /** Checks that only whitespace is left. */
  finish(): void {
    if (this.peek() !== -1) throw this.error("unexpected data after the end");
  }
}
