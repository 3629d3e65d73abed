/**
 * Constrained decoding: a grammar (a JSON Schema, any JSON, or an EBNF grammar) turned into a
 * mask of the tokens that keep the output inside it, by xgrammar compiled to WASM
 * (`@mlc-ai/web-xgrammar`). The WASM module is imported on first use, so a run without a
 * grammar never loads it.
 *
 * The vocabulary is handed to xgrammar in its byte-level form: every byte of a token as the
 * printable character GPT-2's byte-level BPE uses for it, which xgrammar maps back to the
 * bytes. Special tokens are given as "" (xgrammar never allows an empty token inside a
 * grammar), except the stop ids, which it allows once the grammar is complete, and the three
 * markup tokens of K3's chat format (`<|open|>`, `<|close|>`, `<|sep|>`): each is handed over
 * as one control byte (MARKUP_BYTES), so a grammar can describe the tool-call markup. No other
 * grammar may use them, and inside a markup grammar an ordinary token holding one of those
 * bytes is refused, so the byte stands for the special token alone.
 */

import { badInput, runInvalid } from "../errors.ts";
import {
  MARKUP_BYTES,
  regionStart,
  type RegionState,
  regionStep,
  toolCallsEbnf,
} from "./tool_grammar.ts";
import type { TokenHistory } from "./sampler.ts";
import type { Tokenizer } from "./tokenizer.ts";

/** What the output must match. */
export type GrammarSpec =
  /** A JSON Schema (draft 2020-12 subset: see SCHEMA_KEYWORDS). */
  | { type: "json_schema"; schema: unknown }
  /** Any JSON value (an object, as OpenAI's json_object mode asks). */
  | { type: "json_object" }
  /** An EBNF grammar in xgrammar's notation (root rule `root`). */
  | { type: "ebnf"; grammar: string };

/**
 * What the engine compiles: a GrammarSpec, or tool calls in K3's markup with their arguments
 * held to each tool's schema (tool_grammar.ts; the server's, not part of the library's API).
 */
export type EngineGrammarSpec = GrammarSpec | ToolCallsSpec;

/** One tool a tool-call grammar may call. */
export interface GrammarTool {
  name: string;
  /** The arguments' JSON Schema (a strict tool); absent: any JSON object. */
  schema?: unknown;
}

/**
 * The answer of a chat turn that may (`auto`), must (`required`) or is (`forced`: the prompt
 * ends with the call's opening) call tools.
 */
export interface ToolCallsSpec {
  type: "tool_calls";
  tools: GrammarTool[];
  mode: "auto" | "required" | "forced";
  /** `auto`: what a plain answer must be (a JSON format); absent: any text. */
  content?: { type: "json_schema"; schema: unknown } | { type: "json_object" };
  /** At most this many calls (absent: MAX_GRAMMAR_CALLS). */
  maxCalls?: number;
}

/** The JSON Schema keywords a schema may use; any other is refused with its name. */
export const SCHEMA_KEYWORDS: ReadonlySet<string> = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "enum",
  "const",
  "anyOf",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "$ref",
  "$defs",
  "definitions",
  // Annotations: no effect on what is valid.
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
]);

/** Keywords whose value is a map of name -> subschema. */
const SCHEMA_MAPS = new Set(["properties", "$defs", "definitions"]);
/** Keywords whose value is a subschema or a list of them. */
const SCHEMA_CHILDREN = new Set(["items", "additionalProperties", "anyOf", "prefixItems"]);
/** Keywords whose value is data, not schema (their contents are not checked). */
const SCHEMA_DATA = new Set(["enum", "const", "default", "examples", "required"]);

/**
 * Largest `minLength` / `maxLength` accepted. xgrammar spells a bounded string out character by
 * character, and compiles each step against the whole vocabulary: about 0.12 s per unit at
 * 163,840 ids (maxLength 10: 1.2 s), on the thread that serves every request.
 */
export const MAX_STRING_BOUND = 32;

/** Largest schema or grammar text accepted (its compile time grows with it). */
export const MAX_GRAMMAR_BYTES = 64 * 1024;

/** Compiled grammars kept per vocabulary (least recently used dropped first). */
const CACHE_ENTRIES = 32;

/** The subset of the xgrammar API used here (the package's own types are loose). */
interface XGrammar {
  TokenizerInfo: {
    createTokenizerInfo(
      vocab: string[],
      vocabType: string,
      prependSpace: boolean,
      vocabSize: number,
      stopTokenIds: number[],
    ): Promise<XHandle & { getVocabSize(): number; getDecodedVocabHandle(): XVector<string> }>;
  };
  GrammarCompiler: {
    createGrammarCompiler(info: XHandle, cache: boolean): Promise<XCompiler>;
  };
  GrammarMatcher: {
    createGrammarMatcher(compiled: XHandle): Promise<XMatcher>;
  };
  Grammar: {
    fromJSONSchema(
      schema: string,
      anyWhitespace: boolean,
      indent: number,
      separators?: [string, string],
      strictMode?: boolean,
    ): Promise<XGrammarText>;
  };
}
interface XHandle {
  dispose(): void;
}
interface XVector<T> {
  size(): number;
  get(i: number): T;
  delete(): void;
}
interface XCompiler extends XHandle {
  compileJSONSchema(
    schema: string,
    anyWhitespace: boolean,
    indent: number,
    separators?: [string, string],
    strictMode?: boolean,
  ): Promise<XHandle>;
  compileBuiltinJSONGrammar(): Promise<XHandle>;
  compileGrammar(ebnf: string, root?: string): Promise<XHandle>;
}
/** What the schema-to-grammar conversion returns: its EBNF text. */
interface XGrammarText extends XHandle {
  toString(): string;
}
interface XMatcher extends XHandle {
  acceptToken(id: number): boolean;
  isTerminated(): boolean;
  rollBack(n: number): void;
  /** The binding object behind the class: its mask call is synchronous. */
  handle: { GetNextTokenBitmask(vocabSize: number): XVector<number> };
}

let loading: Promise<XGrammar> | undefined;

/**
 * Where xgrammar's error output goes. The module binds `console.error` once, as it loads, and
 * reports why a compile failed only there (the exception says just "Aborted()"): so it is
 * given a function that forwards to this, and a compile collects the lines while it runs.
 */
let errorSink: (...args: unknown[]) => void = (...args) => console.error(...args);

/** Runs `fn`, with xgrammar's error lines collected instead of printed. */
async function collectingErrors<T>(
  fn: () => Promise<T>,
): Promise<{ value?: T; error?: unknown; lines: string[] }> {
  const lines: string[] = [];
  const before = errorSink;
  errorSink = (...args) => lines.push(args.map(String).join(" "));
  try {
    return { value: await fn(), lines };
  } catch (error) {
    return { error, lines };
  } finally {
    errorSink = before;
  }
}

/** True once something asked for a grammar (the WASM module is loaded only then). */
export function xgrammarRequested(): boolean {
  return loading !== undefined;
}

/**
 * The xgrammar module. Its bundle is UMD built by Emscripten: it takes the Node path when it
 * sees `process` (and then calls `require`, which an ES module in Deno lacks), and the web
 * path needs `location`. So both are arranged while it loads and initialises its WASM, then
 * put back as they were.
 */
export function loadXGrammar(): Promise<XGrammar> {
  loading ??= (async () => {
    const g = globalThis as Record<string, unknown>;
    const process = Object.getOwnPropertyDescriptor(g, "process");
    const location = Object.getOwnPropertyDescriptor(g, "location");
    Object.defineProperty(g, "location", {
      value: new URL("http://localhost/"),
      configurable: true,
    });
    delete g.process;
    const consoleError = console.error;
    console.error = (...args: unknown[]) => errorSink(...args);
    try {
      await import("@mlc-ai/web-xgrammar");
      // Loaded as an ES module, the UMD wrapper finds no `exports` and sets a global instead.
      const xg = g.xgrammar as XGrammar;
      delete g.xgrammar;
      // The first call initialises the WASM binding; it, too, looks for `process`.
      (await xg.TokenizerInfo.createTokenizerInfo([], "raw", false, 0, [])).dispose();
      return xg;
    } finally {
      console.error = consoleError;
      if (process) Object.defineProperty(g, "process", process);
      if (location) Object.defineProperty(g, "location", location);
      else delete g.location;
    }
  })();
  return loading;
}

/** GPT-2's byte-level alphabet: byte b as a printable character (xgrammar's BYTE_LEVEL). */
export const BYTE_TO_CHAR: readonly string[] = (() => {
  const chars: string[] = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    chars[b] = String.fromCodePoint(printable ? b : next++);
  }
  return chars;
})();

/** A token's bytes in the byte-level alphabet. */
export function byteLevelText(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += BYTE_TO_CHAR[b];
  return s;
}

/**
 * The vocabulary as xgrammar takes it: ordinary tokens in the byte-level alphabet, specials
 * as "" (never part of a grammar's text), `vocabSize` entries (ids past the tokenizer's, if
 * the model pads its logits, are "" too).
 */
export function byteLevelVocabulary(tokenizer: Tokenizer, vocabSize: number): string[] {
  const vocab: string[] = new Array(vocabSize);
  for (let id = 0; id < vocabSize; id++) {
    const ordinary = id < tokenizer.vocabSize && !tokenizer.isSpecial(id);
    vocab[id] = ordinary ? byteLevelText(tokenizer.idToBytes(id)) : "";
  }
  for (const [name, byte] of MARKUP_BYTES) {
    const id = tokenizer.specialId(name);
    if (id !== undefined && id < vocabSize) vocab[id] = BYTE_TO_CHAR[byte];
  }
  return vocab;
}

/** A compiled grammar: give each generation its own matcher ({@link GrammarEngine.matcher}). */
export interface CompiledGrammar {
  readonly key: string;
  readonly handle: XHandle;
  /**
   * JSON output: no raw control character anywhere (JSON allows them in no string, and the
   * compact form has no whitespace between values; xgrammar's string rule lets some through).
   */
  readonly noControl: boolean;
  /**
   * A grammar of K3's markup (tool calls): the markup specials are its control bytes, and an
   * ordinary token holding such a byte is refused; where its answer starts (regionStep says
   * where a markup token and a control byte may go). Absent: no markup token is allowed.
   */
  readonly markupStart?: RegionState;
}

/** xgrammar over one vocabulary, with the grammars compiled for it (cached, bounded). */
export class GrammarEngine {
  readonly vocabSize: number;
  readonly stopIds: readonly number[];
  readonly #xg: XGrammar;
  readonly #info: XHandle;
  readonly #compiler: XCompiler;
  readonly #cache = new Map<string, CompiledGrammar>();
  readonly #utf8: Utf8Guard;

  private constructor(
    xg: XGrammar,
    info: XHandle,
    compiler: XCompiler,
    vocabSize: number,
    stopIds: number[],
    utf8: Utf8Guard,
  ) {
    this.#utf8 = utf8;
    this.#xg = xg;
    this.#info = info;
    this.#compiler = compiler;
    this.vocabSize = vocabSize;
    this.stopIds = stopIds;
  }

  /**
   * An engine for `tokenizer`'s vocabulary padded to `vocabSize` (the logits' length);
   * `stopIds` are what may follow a complete grammar.
   */
  static async create(
    tokenizer: Tokenizer,
    vocabSize: number,
    stopIds: number[],
  ): Promise<GrammarEngine> {
    const xg = await loadXGrammar();
    const vocab = byteLevelVocabulary(tokenizer, vocabSize);
    const info = await xg.TokenizerInfo.createTokenizerInfo(
      vocab,
      "byte_level",
      false,
      vocabSize,
      stopIds,
    );
    // Our own cache bounds memory; xgrammar's would keep every schema ever compiled.
    const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
    return new GrammarEngine(xg, info, compiler, vocabSize, stopIds, new Utf8Guard(tokenizer));
  }

  /** The bytes xgrammar decoded for every id (for checking the vocabulary hand-over). */
  decodedVocabulary(): string[] {
    const v = (this.#info as unknown as { getDecodedVocabHandle(): XVector<string> })
      .getDecodedVocabHandle();
    const out: string[] = [];
    for (let i = 0; i < v.size(); i++) out.push(v.get(i));
    v.delete();
    return out;
  }

  /** Compiles `spec` (or takes it from the cache); a bad schema throws badInput naming why. */
  async compile(spec: EngineGrammarSpec): Promise<CompiledGrammar> {
    const key = grammarKey(spec);
    const hit = this.#cache.get(key);
    if (hit) {
      this.#cache.delete(key);
      this.#cache.set(key, hit);
      return hit;
    }
    const handle = await this.#compileNew(spec);
    const compiled = {
      key,
      handle,
      noControl: spec.type !== "ebnf" && spec.type !== "tool_calls",
      markupStart: spec.type === "tool_calls" ? regionStart(spec) : undefined,
    };
    this.#cache.set(key, compiled);
    if (this.#cache.size > CACHE_ENTRIES) {
      const [oldest, entry] = this.#cache.entries().next().value!;
      this.#cache.delete(oldest);
      entry.handle.dispose();
    }
    return compiled;
  }

  async #compileNew(spec: EngineGrammarSpec): Promise<XHandle> {
    const out = await collectingErrors(() => this.#compileWith(spec));
    if (out.error === undefined) return out.value!;
    const what = spec.type === "ebnf"
      ? "grammar"
      : spec.type === "tool_calls"
      ? "tool-call grammar"
      : "JSON schema";
    const why = out.lines.map(fatalMessage).find((m) => m !== undefined) ??
      xgrammarMessage(out.error);
    throw badInput(`the ${what} could not be compiled: ${why}`, { cause: out.error });
  }

  async #compileWith(spec: EngineGrammarSpec): Promise<XHandle> {
    if (spec.type === "json_object") return this.#compiler.compileGrammar(JSON_OBJECT_EBNF, "root");
    if (spec.type === "ebnf") return this.#compiler.compileGrammar(spec.grammar, "root");
    if (spec.type === "tool_calls") {
      const ebnf = await toolCallsEbnf(spec, (schema) => this.#schemaEbnf(schema));
      return this.#compiler.compileGrammar(ebnf, "root");
    }
    // Compact output: one line, no optional whitespace, so a token budget goes to content.
    return this.#compiler.compileJSONSchema(
      JSON.stringify(spec.schema),
      false,
      -1,
      [",", ":"],
      true,
    );
  }

  /** The EBNF of a JSON Schema (or any JSON object when absent), compact, as compile() takes it. */
  async #schemaEbnf(schema: unknown): Promise<string> {
    if (schema === undefined) return JSON_OBJECT_EBNF;
    const grammar = await this.#xg.Grammar.fromJSONSchema(
      JSON.stringify(schema),
      false,
      -1,
      [",", ":"],
      true,
    );
    try {
      return grammar.toString();
    } finally {
      grammar.dispose();
    }
  }

  /** A fresh matcher for one generation. */
  async matcher(compiled: CompiledGrammar): Promise<GrammarMatcher> {
    return new GrammarMatcher(
      await this.#xg.GrammarMatcher.createGrammarMatcher(compiled.handle),
      this.vocabSize,
      this.#utf8,
      compiled,
    );
  }

  /** Releases the compiled grammars and the vocabulary. */
  dispose(): void {
    for (const entry of this.#cache.values()) entry.handle.dispose();
    this.#cache.clear();
    this.#compiler.dispose();
    this.#info.dispose();
  }
}

/** Any JSON object, in compact form. */
export const JSON_OBJECT_EBNF = String.raw`
root ::= object
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
array ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [+-]? [0-9]+ )?
`;

function grammarKey(spec: EngineGrammarSpec): string {
  if (spec.type === "json_schema") {
    const text = JSON.stringify(spec.schema);
    checkSize(text, "JSON schema");
    checkSchema(spec.schema, "schema");
    return "s" + text;
  }
  if (spec.type === "ebnf") {
    checkSize(spec.grammar, "grammar");
    return "g" + spec.grammar;
  }
  if (spec.type === "tool_calls") {
    const text = JSON.stringify(spec);
    checkSize(text, "tool schemas");
    checkToolCalls(spec);
    return "t" + text;
  }
  return "json_object";
}

/**
 * A tool-call grammar's tools: names the markup can carry (no control character), each named
 * once, and schemas the engine enforces (their paths say which tool: `tools[i]`).
 */
function checkToolCalls(spec: ToolCallsSpec): void {
  if (spec.tools.length === 0) throw badInput("a tool-call grammar needs at least one tool");
  const seen = new Set<string>();
  spec.tools.forEach((tool, i) => {
    // deno-lint-ignore no-control-regex
    if (tool.name === "" || /[\x00-\x1f\x7f]/.test(tool.name)) {
      throw badInput(`tools[${i}]: the name must be non-empty, without control characters`);
    }
    if (seen.has(tool.name)) {
      throw badInput(`tools[${i}]: ${JSON.stringify(tool.name)} is named twice`);
    }
    seen.add(tool.name);
    if (tool.schema !== undefined) checkSchema(tool.schema, `tools[${i}] (${tool.name}) schema`);
  });
  if (spec.content?.type === "json_schema") checkSchema(spec.content.schema, "schema");
}

function checkSize(text: string, what: string): void {
  if (new TextEncoder().encode(text).length > MAX_GRAMMAR_BYTES) {
    throw badInput(`the ${what} is larger than ${MAX_GRAMMAR_BYTES} bytes`);
  }
}

/**
 * Refuses a schema keyword the engine does not enforce (it would be silently ignored, and
 * output said to match the schema would not), naming it and where it is.
 */
export function checkSchema(schema: unknown, where: string, root: unknown = schema): void {
  if (schema === true) return;
  if (schema === false) throw badInput(`${where} is false: no value could match it`);
  if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
    throw badInput(`${where} must be a JSON Schema object`);
  }
  checkValues(schema as Record<string, unknown>, where, root);
  for (const [key, value] of Object.entries(schema)) {
    if (!SCHEMA_KEYWORDS.has(key)) {
      throw badInput(
        `${where}: the JSON Schema keyword ${JSON.stringify(key)} is not supported ` +
          `(supported: ${[...SCHEMA_KEYWORDS].join(", ")})`,
      );
    }
    if (key === "pattern") checkPattern(value, `${where}.pattern`);
    if (SCHEMA_DATA.has(key)) continue;
    if (SCHEMA_MAPS.has(key)) {
      if (value === null || typeof value !== "object") {
        throw badInput(`${where}.${key} must be an object`);
      }
      for (const [name, child] of Object.entries(value)) {
        checkSchema(child, `${where}.${key}.${name}`, root);
      }
    } else if (SCHEMA_CHILDREN.has(key)) {
      // `additionalProperties: false` (no other properties), `items: false` (no more items).
      if (typeof value === "boolean" && key !== "anyOf") continue;
      const children = Array.isArray(value) ? value : [value];
      children.forEach((child, i) =>
        checkSchema(
          child,
          Array.isArray(value) ? `${where}.${key}[${i}]` : `${where}.${key}`,
          root,
        )
      );
    }
  }
}

/**
 * String formats the engine enforces exactly. It has others (email, date, time, ipv4, ...), but
 * checked against a JSON Schema validator (ajv-formats) they let through values the format
 * forbids (September 31, a leap second at any minute, ipv4 parts with leading zeros), and it
 * ignores names it does not know: all those are refused.
 */
export const STRING_FORMATS: ReadonlySet<string> = new Set(["uuid"]);

const JSON_TYPES = new Set(["object", "array", "string", "number", "integer", "boolean", "null"]);

/**
 * The values of one schema object that xgrammar would abort on (its WASM instance stops with
 * a message on stderr instead of returning an error): checked here, each named.
 */
function checkValues(schema: Record<string, unknown>, where: string, root: unknown): void {
  const types = Array.isArray(schema.type) ? schema.type : [schema.type ?? "object"];
  const bad = types.find((t) => !JSON_TYPES.has(t as string));
  if (bad !== undefined) throw badInput(`${where}.type: ${JSON.stringify(bad)} is not a JSON type`);
  if (schema.enum !== undefined && !(Array.isArray(schema.enum) && schema.enum.length > 0)) {
    throw badInput(`${where}.enum must be a non-empty list`);
  }
  for (
    const [low, high] of [["minimum", "maximum"], ["minLength", "maxLength"], [
      "minItems",
      "maxItems",
    ]]
  ) {
    for (const k of [low, high]) {
      if (schema[k] !== undefined && typeof schema[k] !== "number") {
        throw badInput(`${where}.${k} must be a number`);
      }
    }
    if ((schema[low] as number) > (schema[high] as number)) {
      throw badInput(`${where}: ${low} ${schema[low]} is greater than ${high} ${schema[high]}`);
    }
  }
  for (const k of ["minLength", "maxLength"]) {
    if ((schema[k] as number) > MAX_STRING_BOUND) {
      throw badInput(
        `${where}.${k} is ${schema[k]}: at most ${MAX_STRING_BOUND} is supported (a longer ` +
          "bounded string takes too long to compile); leave it out, or use a pattern",
      );
    }
  }
  if (schema.format !== undefined && !STRING_FORMATS.has(schema.format as string)) {
    throw badInput(
      `${where}.format ${JSON.stringify(schema.format)} is not supported ` +
        `(supported: ${[...STRING_FORMATS].join(", ")})`,
    );
  }
  if (schema.$ref !== undefined) checkRef(schema.$ref, `${where}.$ref`, root);
  // With a pattern the engine drops the other string bounds without a word (it prints a
  // warning only): the output would not be held to them.
  const withPattern = ["minLength", "maxLength", "format"].find((k) => schema[k] !== undefined);
  if (schema.pattern !== undefined && withPattern !== undefined) {
    throw badInput(
      `${where}: "pattern" with "${withPattern}" is not supported (the engine would ignore ` +
        `"${withPattern}"); put the length into the pattern, e.g. ^[a-z]{1,8}$`,
    );
  }
}

/** A `$ref` must point inside this schema (`#` or a JSON pointer from it) at something. */
function checkRef(ref: unknown, where: string, root: unknown): void {
  if (typeof ref !== "string" || !(ref === "#" || ref.startsWith("#/"))) {
    throw badInput(`${where} must be "#" or a "#/..." pointer into this schema`);
  }
  let at: unknown = root;
  for (const part of ref === "#" ? [] : ref.slice(2).split("/")) {
    const key = part.replaceAll("~1", "/").replaceAll("~0", "~");
    if (at === null || typeof at !== "object" || !(key in at)) {
      throw badInput(`${where}: ${JSON.stringify(ref)} points at nothing in the schema`);
    }
    at = (at as Record<string, unknown>)[key];
  }
}

/**
 * A `pattern` the engine can take: a valid regular expression without lookaround, back
 * references or word boundaries. Checked here because xgrammar aborts its WASM instance on a
 * regex it cannot parse instead of returning an error.
 */
function checkPattern(pattern: unknown, where: string): void {
  if (typeof pattern !== "string") throw badInput(`${where} must be a string`);
  try {
    new RegExp(pattern, "u");
  } catch (e) {
    throw badInput(`${where} is not a valid regular expression: ${(e as Error).message}`);
  }
  const unsupported = /\\[1-9bBk]|\(\?<?[=!]/.exec(pattern);
  if (unsupported) {
    throw badInput(
      `${where}: ${JSON.stringify(unsupported[0])} (lookaround, back references and word ` +
        "boundaries) is not supported in a pattern",
    );
  }
}

/** The reason in an xgrammar `[FATAL] file.cc:123: reason` line, without the source path. */
function fatalMessage(line: string): string | undefined {
  const m = /^\[FATAL\] [^ ]*:\d+: (?:Check failed: \(.*?\) is false: )?(.*)$/s.exec(line);
  return m?.[1].trim().slice(0, 300);
}

function xgrammarMessage(e: unknown): string {
  const text = e instanceof Error ? e.message : String(e);
  return text.split("\n")[0].slice(0, 300);
}

/**
 * One generation's position in a compiled grammar. Every accepted token is remembered, so
 * the matcher can be brought to any history by rolling back to the common prefix.
 */
export class GrammarMatcher {
  readonly #m: XMatcher;
  readonly #vocabSize: number;
  readonly #utf8: Utf8Guard;
  readonly #noControl: boolean;
  readonly #markup: boolean;
  readonly #accepted: number[] = [];
  /** The UTF-8 state after each accepted token (index i: after i tokens). */
  readonly #utf8States: number[] = [UTF8_BOUNDARY];
  /** A markup grammar: the region state after each accepted token (as #utf8States). */
  readonly #regions: RegionState[];

  constructor(
    m: XMatcher,
    vocabSize: number,
    utf8: Utf8Guard,
    kind: Pick<CompiledGrammar, "noControl" | "markupStart">,
  ) {
    this.#m = m;
    this.#vocabSize = vocabSize;
    this.#utf8 = utf8;
    this.#noControl = kind.noControl;
    this.#markup = kind.markupStart !== undefined;
    this.#regions = [kind.markupStart ?? 0];
  }

  /**
   * Whether `id` may follow `at` accepted tokens as far as k3's own checks go (xgrammar
   * decides the rest): the region state after it (0 for a grammar without markup), or -1.
   */
  #allowed(at: number, id: number): RegionState {
    const utf8 = this.#utf8;
    if (utf8.after(this.#utf8States[at], id) < 0) return -1;
    if (!this.#markup) {
      return utf8.isMarkup(id) || (this.#noControl && utf8.hasControl(id)) ? -1 : 0;
    }
    if (utf8.hasMarkupByte(id)) return -1;
    return regionStep(this.#regions[at], utf8.markupByte(id), utf8.bytes(id));
  }

  /** Brings the matcher to exactly `tokens` (the answer so far); false if one is refused. */
  syncTo(tokens: readonly number[], from = 0): boolean {
    const n = tokens.length - from;
    let common = 0;
    while (
      common < this.#accepted.length && common < n &&
      this.#accepted[common] === tokens[from + common]
    ) common++;
    if (common < this.#accepted.length) {
      this.#m.rollBack(this.#accepted.length - common);
      this.#accepted.length = common;
      this.#utf8States.length = common + 1;
      this.#regions.length = common + 1;
    }
    for (let i = common; i < n; i++) {
      const id = tokens[from + i];
      const region = this.#allowed(i, id);
      if (region < 0 || this.#m.isTerminated() || !this.#m.acceptToken(id)) return false;
      this.#accepted.push(id);
      this.#utf8States.push(this.#utf8.after(this.#utf8States[i], id));
      this.#regions.push(region);
    }
    return true;
  }

  /** Whether xgrammar alone (no UTF-8 check) takes `id` next; the matcher is left as it was. */
  acceptsAlone(id: number): boolean {
    if (this.#m.isTerminated() || !this.#m.acceptToken(id)) return false;
    this.#m.rollBack(1);
    return true;
  }

  /** True once a stop id ended the grammar. */
  get terminated(): boolean {
    return this.#m.isTerminated();
  }

  /**
   * A copy of `logits` with every token the grammar refuses next set to -Infinity, and every
   * token that would make the output's bytes invalid UTF-8 (xgrammar reads UTF-8 loosely: an
   * overlong form or a surrogate would pass as a character).
   */
  mask(logits: Float32Array): Float32Array {
    const bits = this.#m.handle.GetNextTokenBitmask(this.#vocabSize);
    const at = this.#accepted.length;
    const out = new Float32Array(logits.length).fill(-Infinity);
    try {
      const words = bits.size();
      for (let w = 0; w < words; w++) {
        const word = bits.get(w);
        if (word === 0) continue;
        const base = w * 32;
        for (let b = 0; b < 32; b++) {
          const id = base + b;
          if ((word >>> b) & 1 && id < logits.length && this.#allowed(at, id) >= 0) {
            out[id] = logits[id];
          }
        }
      }
    } finally {
      bits.delete();
    }
    return out;
  }

  dispose(): void {
    this.#m.dispose();
  }
}

/** The UTF-8 state at a character boundary. */
const UTF8_BOUNDARY = 0;

/**
 * Strict UTF-8 (RFC 3629) over token boundaries. A state is 0 at a character boundary, else
 * (continuation bytes still needed) << 16 | (lowest allowed next byte) << 8 | (highest).
 */
export class Utf8Guard {
  readonly #bytes: Uint8Array[];
  /** Per id: 1 when its bytes are ASCII only (or it is special), so no check is needed. */
  readonly #plain: Uint8Array;
  /**
   * Per id: bit 0 set when it holds a control byte (0x00-0x1f), bit 1 when one of those is a
   * MARKUP_BYTES byte, bit 2 when it is a markup special.
   */
  readonly #kind: Uint8Array;
  readonly #markupByte = new Map<number, number>();

  constructor(tokenizer: Tokenizer) {
    this.#bytes = [];
    this.#plain = new Uint8Array(tokenizer.vocabSize);
    this.#kind = new Uint8Array(tokenizer.vocabSize);
    const markupBytes = new Set(MARKUP_BYTES.values());
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      const bytes = tokenizer.isSpecial(id) ? new Uint8Array(0) : tokenizer.idToBytes(id);
      this.#bytes.push(bytes);
      this.#plain[id] = bytes.every((b) => b < 0x80) ? 1 : 0;
      this.#kind[id] = (bytes.some((b) => b < 0x20) ? 1 : 0) |
        (bytes.some((b) => markupBytes.has(b)) ? 2 : 0);
    }
    for (const [name, byte] of MARKUP_BYTES) {
      const id = tokenizer.specialId(name);
      if (id === undefined) continue;
      this.#kind[id] = 4;
      this.#markupByte.set(id, byte);
    }
  }

  /** True when token `id` holds a control byte (0x00-0x1f). */
  hasControl(id: number): boolean {
    return (this.#kind[id] & 1) !== 0;
  }

  /** True when ordinary token `id` holds a byte that stands for a markup special in a grammar. */
  hasMarkupByte(id: number): boolean {
    return (this.#kind[id] & 2) !== 0;
  }

  /** True when `id` is one of the markup specials (`<|open|>`, `<|close|>`, `<|sep|>`). */
  isMarkup(id: number): boolean {
    return this.#kind[id] === 4;
  }

  /** The MARKUP_BYTES byte a markup special stands for; 0 for any other token. */
  markupByte(id: number): number {
    return this.#markupByte.get(id) ?? 0;
  }

  /** Token `id`'s bytes (none for a special). */
  bytes(id: number): Uint8Array {
    return this.#bytes[id];
  }

  /** The state after token `id` from `state`, or -1 when its bytes break UTF-8 there. */
  after(state: number, id: number): number {
    if (id >= this.#plain.length) return -1;
    if (this.#plain[id] === 1) return state === UTF8_BOUNDARY ? state : -1;
    let s = state;
    for (const b of this.#bytes[id]) {
      s = utf8Step(s, b);
      if (s < 0) return -1;
    }
    return s;
  }
}

/** One byte of strict UTF-8 from state `s` (see Utf8Guard); -1 when the byte is invalid. */
function utf8Step(s: number, b: number): number {
  if (s !== UTF8_BOUNDARY) {
    const need = s >> 16, lo = (s >> 8) & 0xff, hi = s & 0xff;
    if (b < lo || b > hi) return -1;
    return need === 1 ? UTF8_BOUNDARY : ((need - 1) << 16) | (0x80 << 8) | 0xbf;
  }
  if (b < 0x80) return UTF8_BOUNDARY;
  if (b >= 0xc2 && b <= 0xdf) return (1 << 16) | (0x80 << 8) | 0xbf;
  if (b === 0xe0) return (2 << 16) | (0xa0 << 8) | 0xbf;
  if (b === 0xed) return (2 << 16) | (0x80 << 8) | 0x9f;
  if (b >= 0xe1 && b <= 0xef) return (2 << 16) | (0x80 << 8) | 0xbf;
  if (b === 0xf0) return (3 << 16) | (0x90 << 8) | 0xbf;
  if (b >= 0xf1 && b <= 0xf3) return (3 << 16) | (0x80 << 8) | 0xbf;
  if (b === 0xf4) return (3 << 16) | (0x80 << 8) | 0x8f;
  return -1;
}

/** Where the grammar starts in a chat answer (after the think channel), and what ends it. */
export interface ConstrainOptions {
  /**
   * The ids that close the think channel and open the answer. When given, the grammar
   * applies only after them: tokens before the first `thinkEnd[0]` are free, and once the
   * model writes `thinkEnd[0]` the rest of `thinkEnd` is forced. Absent: the grammar applies
   * from the first generated token.
   */
  thinkEnd?: readonly number[];
}

/**
 * A token picker that keeps the output inside a grammar: the mask is applied to the model's
 * logits before the sampler's penalties and its pick, greedy or sampled. Like the sampler,
 * the pick depends on (logits, history) alone: the matcher is brought to the history on each
 * call, so a verify pass may ask several positions ahead and a rejected draft is rolled back.
 */
/** What picks from the masked logits (a Sampler, or a picker wrapping one). */
export interface LogitPicker {
  next(logits: Float32Array, history: TokenHistory): number;
}

export class ConstrainedPicker {
  readonly #sampler: LogitPicker;
  readonly #matcher: GrammarMatcher;
  readonly #thinkEnd?: readonly number[];

  constructor(sampler: LogitPicker, matcher: GrammarMatcher, options: ConstrainOptions = {}) {
    this.#sampler = sampler;
    this.#matcher = matcher;
    this.#thinkEnd = options.thinkEnd;
  }

  next(logits: Float32Array, history: TokenHistory): number {
    const start = this.#answerStart(history);
    if (start.forced !== undefined) return start.forced;
    if (start.at < 0) return this.#sampler.next(logits, history);
    if (!this.#matcher.syncTo(history.tokens, start.at)) {
      throw runInvalid("a generated token is outside the grammar it was constrained to");
    }
    return this.#sampler.next(this.#matcher.mask(logits), history);
  }

  /** Where the answer starts in `history.tokens` (-1: still thinking), or a forced id. */
  #answerStart(history: TokenHistory): { at: number; forced?: number } {
    const { tokens, promptLength } = history;
    const end = this.#thinkEnd;
    if (!end || end.length === 0) return { at: promptLength };
    const close = tokens.indexOf(end[0], promptLength);
    if (close < 0) return { at: -1 };
    const written = tokens.length - close;
    if (written < end.length) return { at: -1, forced: end[written] };
    return { at: close + end.length };
  }

  dispose(): void {
    this.#matcher.dispose();
  }
}
