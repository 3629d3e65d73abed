/**
 * The grammar of a chat answer with tool calls, in K3's markup (MODEL.md §7.4), for
 * constrained decoding: the tools channel, each call's opening naming one of the tools, and its
 * arguments as one `json` block held to that tool's JSON Schema:
 *
 * ```
 * <|close|>response<|sep|><|open|>tools<|sep|>
 *   <|open|>call tool="NAME" index="N"<|sep|><|open|>json type="object"<|sep|>{...}<|close|>json<|sep|><|close|>call<|sep|>
 *   ...
 * <|close|>tools<|sep|>
 * ```
 *
 * The `json` block (not one `argument` part per key) is the form the parser passes through as
 * written, so the arguments a client gets are exactly the text the grammar allowed. The markup
 * specials appear in the grammar as the control bytes of MARKUP_BYTES (grammar.ts hands them
 * to xgrammar that way). Each schema's own grammar comes from xgrammar's JSON Schema converter
 * with its rule names prefixed, so several schemas live in one grammar.
 */
import { badInput } from "../errors.ts";
import { CLOSE, OPEN, SEP } from "./chat.ts";
import type { ToolCallsSpec } from "./grammar.ts";

/** The markup specials of K3's chat format, and the control byte each stands for in a grammar. */
export const MARKUP_BYTES: ReadonlyMap<string, number> = new Map([[OPEN, 1], [CLOSE, 2], [SEP, 3]]);

/** Most calls one constrained answer may hold (each is a rule of the grammar). */
export const MAX_GRAMMAR_CALLS = 16;

const O = "\x01", C = "\x02", S = "\x03";

/** The grammar of `spec` in xgrammar's EBNF (root rule `root`). */
export async function toolCallsEbnf(
  spec: ToolCallsSpec,
  schemaEbnf: (schema: unknown) => Promise<string>,
): Promise<string> {
  const rules: string[] = [];
  for (const [i, tool] of spec.tools.entries()) {
    rules.push(prefixRules(await schemaEbnf(tool.schema), `t${i}_`));
    rules.push(
      `args_${i} ::= ${literal(`${O}json type="object"${S}`)} t${i}_root ${
        literal(`${C}json${S}${C}call${S}`)
      }`,
    );
  }
  const block = `${literal(`${O}tools${S}`)} call_1 ${literal(`${C}tools${S}`)}`;
  if (spec.mode === "forced") {
    rules.push(`root ::= args_0 ${literal(`${C}tools${S}`)}`);
  } else if (spec.mode === "required") {
    rules.push(`root ::= ${literal(`${C}response${S}`)} ${block}`);
  } else {
    let answer = "text";
    if (spec.content) {
      const schema = spec.content.type === "json_schema" ? spec.content.schema : undefined;
      rules.push(prefixRules(await schemaEbnf(schema), "c_"));
      answer = "c_root";
    } else {
      rules.push(String.raw`text ::= [^\x01-\x03]*`);
    }
    rules.push(`root ::= ${answer} ( ${literal(`${C}response${S}`)} ( ${block} )? )?`);
  }
  if (spec.mode !== "forced") rules.push(...callRules(spec));
  return rules.join("\n") + "\n";
}

/** call_1 .. call_K: one call of any tool, with its index, then maybe the next call. */
function callRules(spec: ToolCallsSpec): string[] {
  const most = Math.min(spec.maxCalls ?? MAX_GRAMMAR_CALLS, MAX_GRAMMAR_CALLS);
  const rules: string[] = [];
  for (let k = 1; k <= most; k++) {
    const heads = spec.tools.map((tool, i) =>
      `( ${literal(`${O}call tool="${escapeAttr(tool.name)}" index="${k}"${S}`)} args_${i} )`
    );
    const next = k < most ? ` ( call_${k + 1} )?` : "";
    rules.push(`call_${k} ::= ( ${heads.join(" | ")} )${next}`);
  }
  return rules;
}

/** The renderer's attribute escaping (the parser undoes it). */
function escapeAttr(v: string): string {
  return v.replaceAll("&", "&amp;").replaceAll('"', "&quot;");
}

/**
 * `s` as EBNF: a sequence of string literals, each control character a literal of its own
 * (xgrammar reads every hex digit after `\\x`, so "\\x01call" would be U+01CA and "ll").
 */
export function literal(s: string): string {
  const parts: string[] = [];
  let run = "";
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (c < 0x20 || c === 0x7f) {
      if (run) parts.push(`"${run}"`);
      parts.push(`"\\x${c.toString(16).padStart(2, "0")}"`);
      run = "";
    } else run += ch === '"' || ch === "\\" ? "\\" + ch : ch;
  }
  if (run) parts.push(`"${run}"`);
  return parts.length === 1 ? parts[0] : `( ${parts.join(" ")} )`;
}

/**
 * `ebnf` with every rule name (where defined and where used) prefixed, so grammars made apart
 * share one namespace. String literals and character classes are copied as they are.
 */
export function prefixRules(ebnf: string, prefix: string): string {
  const names = new Set([...ebnf.matchAll(/^([A-Za-z_][A-Za-z0-9_]*)\s*::=/gm)].map((m) => m[1]));
  let out = "";
  let i = 0;
  while (i < ebnf.length) {
    const ch = ebnf[i];
    if (ch === '"' || ch === "[") {
      const end = quotedEnd(ebnf, i, ch === '"' ? '"' : "]");
      out += ebnf.slice(i, end);
      i = end;
    } else if (/[A-Za-z_]/.test(ch)) {
      WORD.lastIndex = i;
      const word = WORD.exec(ebnf)![0];
      out += names.has(word) ? prefix + word : word;
      i += word.length;
    } else {
      out += ch;
      i++;
    }
  }
  return out;
}

const WORD = /[A-Za-z_][A-Za-z0-9_]*/y;

/** The index just past the literal or class opened at `start`, which `close` ends. */
function quotedEnd(text: string, start: number, close: string): number {
  for (let i = start + 1; i < text.length; i++) {
    if (text[i] === "\\") i++;
    else if (text[i] === close) return i + 1;
  }
  throw badInput("a schema's grammar has an unterminated literal");
}

/**
 * Where a tool-call answer is, as k3 tracks it next to xgrammar: in the free text of a plain
 * answer, in JSON (arguments, or a plain answer held to a JSON format), or in markup. Needed
 * because xgrammar's rule for a bounded or patterned JSON string takes any character but `"`
 * and `\`, control bytes too, so it would take a markup token inside a string: k3 refuses a
 * markup token inside a JSON string, and any control byte outside the free text.
 *
 * A state is a number: the region (bits 0-1), inside a string (bit 2), after a backslash in a
 * string (bit 3), the last token was `<|sep|>` (bit 4: a `{` there opens the arguments).
 */
export type RegionState = number;

export const REGION_FREE = 0, REGION_JSON = 1, REGION_MARKUP = 2;
const IN_STRING = 4, ESCAPED = 8, AFTER_SEP = 16;

/** Where a grammar's answer starts. */
export function regionStart(spec: ToolCallsSpec): RegionState {
  if (spec.mode === "forced") return REGION_MARKUP | AFTER_SEP;
  if (spec.mode === "required") return REGION_MARKUP;
  return spec.content ? REGION_JSON : REGION_FREE;
}

/**
 * The state after a token (`markup`: the MARKUP_BYTES byte of a markup special, else 0 and
 * the token's `bytes`), or -1 when k3 refuses the token there.
 */
export function regionStep(state: RegionState, markup: number, bytes: Uint8Array): RegionState {
  const region = state & 3;
  if (markup !== 0) {
    if (region === REGION_JSON && (state & IN_STRING) !== 0) return -1;
    return REGION_MARKUP | (markup === MARKUP_BYTES.get(SEP) ? AFTER_SEP : 0);
  }
  if (region === REGION_FREE) return state;
  let s = state & ~AFTER_SEP;
  if (region === REGION_MARKUP && (state & AFTER_SEP) !== 0 && bytes[0] === 0x7b) {
    s = REGION_JSON;
  }
  for (const b of bytes) {
    if (b < 0x20) return -1;
    if ((s & 3) !== REGION_JSON) continue;
    if ((s & ESCAPED) !== 0) s &= ~ESCAPED;
    else if ((s & IN_STRING) !== 0 && b === 0x5c) s |= ESCAPED;
    else if (b === 0x22) s ^= IN_STRING;
  }
  return s;
}
