/**
 * The Kimi tokenizer (MODEL.md §6): byte-level BPE from `tiktoken.model` plus 256 special tokens
 * named by `tokenizer_config.json`, encoded by the tiktoken WASM core with Kimi's `pat_str`.
 *
 * Token ids: ranks 0..n-1 are the mergeable tokens of the rank file, n..n+255 the specials.
 */

import * as path from "node:path";
// A full npm: specifier, so a script outside this repo (no deno.json) can import mod.ts.
// deno-lint-ignore no-import-prefix
import type { Tiktoken } from "npm:tiktoken@1.0.22";
import { badInput, K3Error } from "../errors.ts";
import { readUserText } from "../io/files.ts";
import { isPythonSpace } from "./pyjson.ts";

/** Kimi's pre-tokenisation regex, verbatim (Rust fancy-regex syntax, run inside tiktoken). */
export const KIMI_PAT_STR = [
  String.raw`[\p{Han}]+`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

/** Number of special tokens after the mergeable ranks (`num_reserved_special_tokens`). */
export const NUM_SPECIAL_TOKENS = 256;

/** Window sizes of the reference pre-split (MODEL.md §6.3), in characters (code points). */
export const MAX_ENCODE_CHARS = 400_000;
export const MAX_RUN_CHARS = 25_000;

const RANK_FILE = "tiktoken.model";
const CONFIG_FILE = "tokenizer_config.json";

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /** true: the 256 special strings become their ids. false (default): they are plain bytes. */
  allowSpecial?: boolean;
}

/**
 * The tiktoken WASM core, imported on first use: the package reads its .wasm file when it
 * loads, so importing it lazily lets a script without --allow-read get a message that names
 * the missing permission instead of "Missing tiktoken_bg.wasm".
 */
async function tiktoken(): Promise<typeof Tiktoken> {
  try {
    // deno-lint-ignore no-import-prefix -- as above: works without k3's deno.json
    return (await import("npm:tiktoken@1.0.22")).Tiktoken;
  } catch (e) {
    // The package's folder (Deno's npm cache), from where the load failed.
    const folder = /file:\/\/(\/\S*?\/tiktoken\/[^/\s]+)\//.exec(String((e as Error)?.stack))?.[1];
    const read = folder ? { name: "read" as const, path: folder } : { name: "read" as const };
    if (Deno.permissions.querySync(read).state !== "granted") {
      const scoped = folder ? ` (scoped: add ${folder} to --allow-read=...)` : "";
      throw badInput(
        `the tokenizer (npm:tiktoken) must read its WASM core: run deno with --allow-read${scoped}`,
        { cause: e },
      );
    }
    throw e;
  }
}

/** The Kimi tokenizer. Call {@link Tokenizer.free} when done: the WASM core is not GC'd. */
export class Tokenizer {
  /** Mergeable ranks plus the 256 specials. */
  readonly vocabSize: number;
  readonly #core: Tiktoken;
  readonly #ranks: RankTable;
  readonly #specialIds: Map<string, number>;
  readonly #specialNames: string[];
  readonly #specialBytes: Uint8Array[];
  #freed = false;

  private constructor(core: Tiktoken, ranks: RankTable, specialNames: string[]) {
    this.#core = core;
    this.#ranks = ranks;
    this.#specialNames = specialNames;
    this.#specialIds = new Map(specialNames.map((name, i) => [name, ranks.count + i]));
    this.#specialBytes = specialNames.map((name) => utf8.encode(name));
    this.vocabSize = ranks.count + NUM_SPECIAL_TOKENS;
    let longest = 1;
    for (let i = 0; i < ranks.count; i++) {
      longest = Math.max(longest, ranks.offsets[i + 1] - ranks.offsets[i]);
    }
    for (const b of this.#specialBytes) longest = Math.max(longest, b.length);
    this.maxTokenBytes = longest;
  }

  /** Bytes of the longest token: text of n UTF-8 bytes is at least n / this many tokens. */
  readonly maxTokenBytes: number;

  /** Load `tiktoken.model` and `tokenizer_config.json` from `dir`; bad files throw badInput. */
  static async load(dir: string): Promise<Tokenizer> {
    const rankPath = path.join(dir, RANK_FILE);
    const configPath = path.join(dir, CONFIG_FILE);
    const ranks = parseRankFile(await readText(rankPath), rankPath);
    const names = specialTokenNames(await readText(configPath), configPath, ranks.count);
    const specials = Object.fromEntries(names.map((name, i) => [name, ranks.count + i]));
    const core = new (await tiktoken())(ranks.text, specials, KIMI_PAT_STR);
    return new Tokenizer(core, ranks, names);
  }

  /** Text to ids, split and encoded as `tokenization_kimi.py` does (MODEL.md §6.3). */
  encode(text: string, options: EncodeOptions = {}): number[] {
    this.#checkLive();
    const ids: number[] = [];
    for (const piece of splitForEncoding(text)) {
      const pieceIds = options.allowSpecial
        ? this.#core.encode(piece, "all")
        : this.#core.encode_ordinary(piece);
      for (const id of pieceIds) ids.push(id);
    }
    return ids;
  }

  /**
   * {@link encode}, giving the event loop a turn between the reference's pieces (at most
   * 400,000 characters each): a server encoding a long prompt keeps answering others.
   */
  async encodeYielding(text: string, options: EncodeOptions = {}): Promise<number[]> {
    this.#checkLive();
    const ids: number[] = [];
    const turn = () => new Promise((resolve) => setTimeout(resolve, 0));
    for (const window of splitWindows(text)) {
      for (const piece of window) {
        for (const slice of slicesAtLineStarts(piece, YIELD_SLICE_CHARS)) {
          await turn();
          this.#checkLive();
          const sliceIds = options.allowSpecial
            ? this.#core.encode(slice, "all")
            : this.#core.encode_ordinary(slice);
          for (const id of sliceIds) ids.push(id);
        }
      }
      await turn();
    }
    return ids;
  }

  /** Ids to text; invalid UTF-8 becomes U+FFFD, a leading BOM is kept. */
  decode(ids: number[]): string {
    const chunks = ids.map((id) => this.idToBytes(id));
    const bytes = new Uint8Array(chunks.reduce((sum, c) => sum + c.length, 0));
    let offset = 0;
    for (const chunk of chunks) {
      bytes.set(chunk, offset);
      offset += chunk.length;
    }
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes);
  }

  /** The raw bytes of one token; a special token gives the UTF-8 of its name. */
  idToBytes(id: number): Uint8Array {
    this.#checkId(id);
    if (id >= this.#ranks.count) return this.#specialBytes[id - this.#ranks.count];
    return this.#ranks.bytes.subarray(this.#ranks.offsets[id], this.#ranks.offsets[id + 1]);
  }

  /** The id of a special token by name (e.g. `<|end_of_msg|>`), or undefined. */
  specialId(name: string): number | undefined {
    return this.#specialIds.get(name);
  }

  /** The name of a special token id, or undefined for an ordinary (or unknown) id. */
  specialName(id: number): string | undefined {
    return this.isSpecial(id) ? this.#specialNames[id - this.#ranks.count] : undefined;
  }

  /** True for ids n..n+255. */
  isSpecial(id: number): boolean {
    return Number.isInteger(id) && id >= this.#ranks.count && id < this.vocabSize;
  }

  /** Release the WASM encoder. */
  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.#core.free();
  }

  /** A freed WASM core fails with a bare Rust message; say what happened instead. */
  #checkLive(): void {
    if (this.#freed) {
      throw badInput("the tokenizer was freed (its model was closed): open the model again");
    }
  }

  #checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw badInput(`token id ${id} is outside the vocabulary (0..${this.vocabSize - 1})`);
    }
  }
}

/**
 * Incremental detokeniser: push ids, get text. Bytes of a character split across tokens are held
 * until the character is complete, so no half character is ever emitted.
 */
export class StreamDecoder {
  readonly #tokenizer: Tokenizer;
  readonly #decoder = new TextDecoder("utf-8", { ignoreBOM: true });

  constructor(tokenizer: Tokenizer) {
    this.#tokenizer = tokenizer;
  }

  /** The text completed by this token (possibly ""). */
  push(id: number): string {
    return this.#decoder.decode(this.#tokenizer.idToBytes(id), { stream: true });
  }

  /** End of stream: any held incomplete bytes become U+FFFD. */
  flush(): string {
    return this.#decoder.decode();
  }
}

/** About how much text {@link Tokenizer.encodeYielding} encodes between turns of the loop. */
const YIELD_SLICE_CHARS = 16384;

/**
 * `text` cut, every `size` characters or so, only just after a newline that a letter or digit
 * follows. No match of the split pattern (KIMI_PAT_STR) spans such a point: the patterns that
 * take a newline end at newlines or take only whitespace, and the ones that start a word may
 * not start with a newline. So each slice splits into the same pieces as it does inside the
 * whole, and encoding the slices one by one gives the same ids. Text without such a newline
 * stays whole.
 */
export function slicesAtLineStarts(text: string, size: number): string[] {
  const slices: string[] = [];
  let start = 0;
  while (text.length - start > size) {
    let cut = -1;
    for (let nl = text.indexOf("\n", start + size); nl >= 0; nl = text.indexOf("\n", nl + 1)) {
      if (/[\p{L}\p{N}]/u.test(String.fromCodePoint(text.codePointAt(nl + 1) ?? 32))) {
        cut = nl + 1;
        break;
      }
    }
    if (cut < 0) break;
    slices.push(text.slice(start, cut));
    start = cut;
  }
  slices.push(text.slice(start));
  return slices;
}

/**
 * The reference pre-split (MODEL.md §6.3): windows of 400,000 characters, each cut so that no piece
 * holds more than 25,000 consecutive whitespace or non-whitespace characters (Python
 * `str.isspace()`). Characters are code points, as in Python. Always yields at least one piece.
 */
export function splitForEncoding(text: string): string[] {
  return [...splitWindows(text)].flat();
}

/** {@link splitForEncoding} one window at a time (each window's pieces as one list). */
function* splitWindows(text: string): Generator<string[]> {
  if (text.length <= MAX_RUN_CHARS) return yield [text]; // no run can be longer: the common case
  let start = 0;
  do {
    let end = start;
    for (let n = 0; n < MAX_ENCODE_CHARS && end < text.length; n++) {
      end += unitsOfCodePointAt(text, end);
    }
    const pieces: string[] = [];
    splitLongRuns(text, start, end, pieces);
    yield pieces;
    start = end;
  } while (start < text.length);
}

/** `_split_whitespaces_or_nonwhitespaces` of tokenization_kimi.py on `text[start..end)`. */
function splitLongRuns(text: string, start: number, end: number, pieces: string[]): void {
  let runIsSpace = start < end && isPythonSpace(text.codePointAt(start)!);
  let runLength = 0;
  let pieceStart = start;
  for (let i = start; i < end; i += unitsOfCodePointAt(text, i)) {
    const isSpace = isPythonSpace(text.codePointAt(i)!);
    if (isSpace !== runIsSpace) {
      runIsSpace = isSpace;
      runLength = 1;
    } else if (++runLength > MAX_RUN_CHARS) {
      pieces.push(text.slice(pieceStart, i));
      pieceStart = i;
      runLength = 1;
    }
  }
  pieces.push(text.slice(pieceStart, end));
}

/** 2 for a surrogate pair at `i`, else 1 (a lone surrogate counts as one character, as in Python). */
function unitsOfCodePointAt(text: string, i: number): number {
  return text.codePointAt(i)! > 0xffff ? 2 : 1;
}

/** The parsed rank file: all token bytes packed, `offsets[id]..offsets[id+1]` per id. */
interface RankTable {
  count: number;
  bytes: Uint8Array;
  offsets: Uint32Array;
  /** The rank file without blank lines or CRs, as the tiktoken core parses it. */
  text: string;
}

/**
 * Parse and validate `<base64> <rank>` lines (blank lines skipped): ranks 0..n-1 each once, no
 * token twice, every single byte present. Errors name the file and the line. Hand-rolled
 * (no regex, no atob) because the real file has 163,584 lines and load time matters.
 */
function parseRankFile(text: string, file: string): RankTable {
  const lines = text.split("\n").map((l) => l.endsWith("\r") ? l.slice(0, -1) : l);
  const kept = lines.filter((l) => l !== "");
  if (kept.length === 0) {
    throw badInput(`${file}: no tokens; expected "<base64 token> <rank>" lines`);
  }
  // Every rank below the token count and none twice means exactly 0..n-1.
  const count = kept.length;
  const starts = new Int32Array(count).fill(-1); // where rank r's bytes start in `scratch`
  const lengths = new Uint32Array(count);
  let scratch = new Uint8Array(text.length); // decoded bytes are never longer than the text
  let used = 0;
  const lineOfRank = new Uint32Array(count);
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line === "") continue;
    const where = `${file} line ${i + 1}`;
    const space = line.indexOf(" ");
    const b64 = line.slice(0, space);
    const decoded = space > 0 && space === line.lastIndexOf(" ")
      ? decodeBase64(b64, scratch, used)
      : -1;
    if (decoded < 0) {
      throw badInput(
        `${where}: expected "<base64 token> <rank>", got ${JSON.stringify(clip(line))}`,
      );
    }
    const rank = parseRank(line, space + 1);
    if (rank < 0) {
      throw badInput(
        `${where}: rank ${JSON.stringify(clip(line.slice(space + 1)))} is not a decimal integer`,
      );
    }
    if (rank >= count) {
      throw badInput(
        `${where}: rank ${rank} is too large; ${count} tokens need ranks 0..${
          count - 1
        }, each once`,
      );
    }
    if (starts[rank] >= 0) throw badInput(`${where}: rank ${rank} is listed twice`);
    lineOfRank[rank] = i + 1;
    starts[rank] = used;
    lengths[rank] = decoded;
    used += decoded;
  }
  scratch = scratch.subarray(0, used);
  const table = { ...packByRank(scratch, starts, lengths), count, text: kept.join("\n") };
  checkAllBytesPresent(table, file);
  checkNoDuplicateTokens(table, lineOfRank, file);
  return table;
}

/** No byte string may have two ranks. An open-addressing hash set (a Map of strings is 10x slower). */
function checkNoDuplicateTokens(
  table: Omit<RankTable, "text">,
  lineOfRank: Uint32Array,
  file: string,
): void {
  const { bytes, offsets } = table;
  const size = 1 << Math.ceil(Math.log2(table.count * 2 + 1));
  const slots = new Int32Array(size).fill(-1);
  for (let r = 0; r < table.count; r++) {
    const token = bytes.subarray(offsets[r], offsets[r + 1]);
    let slot = fnv1a(token) & (size - 1);
    for (; slots[slot] >= 0; slot = (slot + 1) & (size - 1)) {
      const other = slots[slot];
      if (sameBytes(token, bytes.subarray(offsets[other], offsets[other + 1]))) {
        const [first, second] = [lineOfRank[other], lineOfRank[r]].sort((a, b) => a - b);
        throw badInput(`${file} line ${second}: the same token is already listed on line ${first}`);
      }
    }
    slots[slot] = r;
  }
}

function fnv1a(bytes: Uint8Array): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < bytes.length; i++) h = Math.imul(h ^ bytes[i], 0x01000193);
  return h >>> 0;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

const BASE64_VALUES = new Int8Array(128).fill(-1);
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".split("").forEach((c, v) => {
  BASE64_VALUES[c.charCodeAt(0)] = v;
});

/** Decode padded standard base64 into `out` at `at`; the byte count, or -1 if malformed. */
function decodeBase64(b64: string, out: Uint8Array, at: number): number {
  if (b64.length === 0 || b64.length % 4 !== 0) return -1;
  const pad = b64.endsWith("==") ? 2 : b64.endsWith("=") ? 1 : 0;
  let n = 0;
  for (let i = 0; i < b64.length; i += 4) {
    let quad = 0;
    for (let k = 0; k < 4; k++) {
      const c = b64.charCodeAt(i + k);
      const isPad = c === 61 && i + k >= b64.length - pad;
      const v = isPad ? 0 : c < 128 ? BASE64_VALUES[c] : -1;
      if (v < 0) return -1;
      quad = (quad << 6) | v;
    }
    out[at + n++] = quad >> 16;
    out[at + n++] = (quad >> 8) & 255;
    out[at + n++] = quad & 255;
  }
  return n - pad;
}

/** A decimal rank without sign or leading zeros from `line[from..]`, or -1. */
function parseRank(line: string, from: number): number {
  if (from >= line.length || (line[from] === "0" && line.length > from + 1)) return -1;
  let rank = 0;
  for (let i = from; i < line.length; i++) {
    const d = line.charCodeAt(i) - 48;
    if (d < 0 || d > 9 || rank > 1e9) return -1;
    rank = rank * 10 + d;
  }
  return rank;
}

/** Copy each rank's bytes into one buffer in rank order. */
function packByRank(
  scratch: Uint8Array,
  starts: Int32Array,
  lengths: Uint32Array,
): { bytes: Uint8Array; offsets: Uint32Array } {
  const offsets = new Uint32Array(starts.length + 1);
  for (let r = 0; r < starts.length; r++) offsets[r + 1] = offsets[r] + lengths[r];
  const bytes = new Uint8Array(offsets[starts.length]);
  for (let r = 0; r < starts.length; r++) {
    bytes.set(scratch.subarray(starts[r], starts[r] + lengths[r]), offsets[r]);
  }
  return { bytes, offsets };
}

function checkAllBytesPresent(table: Omit<RankTable, "text">, file: string): void {
  const present = new Uint8Array(256);
  for (let r = 0; r < table.count; r++) {
    if (table.offsets[r + 1] - table.offsets[r] === 1) present[table.bytes[table.offsets[r]]] = 1;
  }
  const missing = present.indexOf(0);
  if (missing >= 0) {
    throw badInput(
      `${file}: byte 0x${
        missing.toString(16).padStart(2, "0")
      } has no token; byte-level BPE needs all 256`,
    );
  }
}

/**
 * The 256 special-token names: `added_tokens_decoder[str(id)].content` for ids n..n+255, else
 * `<|reserved_token_{id}|>` (MODEL.md §6.1). Entries outside that range are ignored, as in Python.
 */
function specialTokenNames(text: string, file: string, rankCount: number): string[] {
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch (e) {
    throw badInput(`${file}: not valid JSON (${(e as Error).message})`);
  }
  if (!isRecord(config)) throw badInput(`${file}: expected a JSON object at the top level`);
  const decoder = config.added_tokens_decoder ?? {};
  if (!isRecord(decoder)) {
    throw badInput(`${file}: "added_tokens_decoder" must be an object of id -> {content}`);
  }
  const names: string[] = [];
  const seen = new Map<string, number>();
  for (let id = rankCount; id < rankCount + NUM_SPECIAL_TOKENS; id++) {
    const name = specialNameFromEntry(decoder[String(id)], id, file);
    const other = seen.get(name);
    if (other !== undefined) {
      throw badInput(
        `${file}: special token ${JSON.stringify(name)} is used by ids ${other} and ${id}`,
      );
    }
    seen.set(name, id);
    names.push(name);
  }
  return names;
}

function specialNameFromEntry(entry: unknown, id: number, file: string): string {
  if (entry === undefined) return `<|reserved_token_${id}|>`;
  if (!isRecord(entry) || typeof entry.content !== "string" || entry.content === "") {
    throw badInput(`${file}: added_tokens_decoder["${id}"].content must be a non-empty string`);
  }
  return entry.content;
}

/** The release's tiktoken.model is 2.5 MB and its tokenizer_config.json far less. */
const TOKENIZER_FILE_LIMIT = 64 << 20;

/** A tokenizer file's text; a FIFO, /dev/zero or a huge file is refused, never read. */
async function readText(file: string): Promise<string> {
  try {
    return (await readUserText(file, "tokenizer file", { limit: TOKENIZER_FILE_LIMIT }))!;
  } catch (e) {
    if (e instanceof K3Error && e.message.endsWith("does not exist")) {
      e.message += "; pass the model directory that holds it";
    }
    throw e;
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function clip(s: string): string {
  return s.length > 60 ? s.slice(0, 60) + "…" : s;
}

const utf8 = new TextEncoder();
