/**
 * Parse what the model generated after the XTML generation prompt (MODEL.md §7.4) into reasoning,
 * answer and tool calls, incrementally: {@link OutputParser} takes the output one atom at a
 * time (a control token, or text between control tokens) and says at once which channel each
 * piece of text belongs to. The same parser serves generated token ids (lib/text/stream.ts,
 * where only the special ids are control tokens) and whole strings ({@link parseOutput}, where
 * the control tokens are found by their names). Never throws: a tool call that does not follow
 * the grammar is skipped and described in `malformed`.
 */

import { CLOSE, END_OF_MSG, OPEN, SEP } from "./chat.ts";

/** One parsed tool call; `index` is its 0-based position (OpenAI's convention). */
export interface ParsedToolCall {
  /** The function's name. */
  name: string;
  /** key -> value, or the raw text of a `json` block. */
  arguments: Record<string, unknown> | string;
  /** 0-based position among the calls. */
  index: number;
}

/** Generated text split into its channels (MODEL.md §7.4). */
export interface ParsedOutput {
  /** Text of the think channel, or null when thinking is off. */
  reasoning: string | null;
  /** Text of the answer. */
  content: string;
  /** Calls in the tools channel, in order. */
  toolCalls: ParsedToolCall[];
  /** One human-readable line per problem found in the tools channel. */
  malformed: string[];
}

/** A unit of output: a special token (by name) or the text of ordinary tokens. */
export type Atom = { special: string } | { text: string };

/**
 * Where the parser is in the assistant message:
 * - `reasoning`: the think channel (the generation prompt opened it);
 * - `afterThink`: the think channel closed, the response channel not yet open;
 * - `content`: the response channel;
 * - `afterContent`: the response channel closed;
 * - `tools`: inside the tools channel;
 * - `done`: the message closed (or the tools channel did); the rest is ignored.
 */
export type Phase = "reasoning" | "afterThink" | "content" | "afterContent" | "tools" | "done";

/** The two channels whose text a reader sees. */
export type TextChannel = "reasoning" | "content";

/** What one atom produced. */
export type ParseEvent =
  /** Text of the model in a channel: what stop strings are matched against. */
  | { type: "visible"; channel: TextChannel; text: string }
  /** Markup kept in a channel's text (an unknown marker, a special token's name). */
  | { type: "hidden"; channel: TextChannel; text: string }
  | { type: "phase"; phase: Phase }
  | { type: "toolCall"; call: ParsedToolCall }
  | { type: "malformed"; note: string };

interface ParserOptions {
  /** The generation prompt opened the think channel (default true); else the response channel. */
  thinking?: boolean;
  /**
   * A tool call still open when the output ends (cut off by a token budget) is reported with
   * the arguments completed so far, plus a `malformed` note. Default false: it is dropped.
   */
  keepCutCall?: boolean;
  /**
   * The first call was opened by a prefill (a forced tool choice): it is reported whatever
   * follows, with the arguments completed before any problem (noted in `malformed`).
   */
  forcedCall?: boolean;
}

const CONTROLS = new Set([OPEN, CLOSE, SEP, END_OF_MSG]);

/** A marker `<|open|>head<|sep|>` or `<|close|>head<|sep|>`, as read. */
interface Marker {
  open: boolean;
  head: string;
}

/** What the head reader hands to the phase machine. */
type Item =
  | { kind: "text"; text: string }
  /** Text that is markup: a special token's name, a stray separator, an unfinished marker. */
  | { kind: "markup"; text: string }
  | { kind: "marker"; marker: Marker }
  | { kind: "end" };

function markerText(m: Marker): string {
  return `${m.open ? OPEN : CLOSE}${m.head}${SEP}`;
}

/** The incremental parser; call {@link OutputParser.end} after the last atom. */
export class OutputParser {
  readonly #thinking: boolean;
  readonly #tools: ToolsReader;
  #phase: Phase;
  /** An opened marker waiting for its separator. */
  #pending: Marker | null = null;
  #reasoning = "";
  #content = "";

  constructor(options: ParserOptions = {}) {
    this.#thinking = options.thinking ?? true;
    this.#phase = this.#thinking ? "reasoning" : "content";
    this.#tools = new ToolsReader(options.keepCutCall ?? false, options.forcedCall ?? false);
  }

  get phase(): Phase {
    return this.#phase;
  }

  /** True while an opened marker waits for its separator (its text is not classified yet). */
  get inMarker(): boolean {
    return this.#pending !== null;
  }

  /** Feeds one atom. */
  push(atom: Atom): ParseEvent[] {
    const out: ParseEvent[] = [];
    for (const item of this.#items(atom)) this.#item(item, out);
    return out;
  }

  /** The output ended: an unfinished marker is text, an open tool call is cut off. */
  end(): ParseEvent[] {
    const out: ParseEvent[] = [];
    if (this.#pending) {
      this.#item({
        kind: "markup",
        text: `${this.#pending.open ? OPEN : CLOSE}${this.#pending.head}`,
      }, out);
      this.#pending = null;
    }
    if (this.#phase === "tools") this.#tools.end(out, "cut");
    return out;
  }

  /** Everything parsed so far. */
  result(): ParsedOutput {
    return {
      reasoning: this.#thinking ? this.#reasoning : null,
      content: this.#content,
      toolCalls: [...this.#tools.calls],
      malformed: [...this.#tools.malformed],
    };
  }

  /** Assembles markers: `<|open|>` or `<|close|>`, then head text, then `<|sep|>`. */
  #items(atom: Atom): Item[] {
    if ("text" in atom) {
      if (this.#pending) {
        this.#pending.head += atom.text;
        return [];
      }
      return atom.text === "" ? [] : [{ kind: "text", text: atom.text }];
    }
    const name = atom.special;
    const items: Item[] = [];
    const unfinished = () => {
      if (!this.#pending) return;
      const p = this.#pending;
      this.#pending = null;
      items.push({ kind: "markup", text: `${p.open ? OPEN : CLOSE}${p.head}` });
    };
    if (name === OPEN || name === CLOSE) {
      unfinished();
      this.#pending = { open: name === OPEN, head: "" };
    } else if (name === SEP) {
      if (this.#pending) {
        items.push({ kind: "marker", marker: this.#pending });
        this.#pending = null;
      } else items.push({ kind: "markup", text: SEP });
    } else if (name === END_OF_MSG) {
      unfinished();
      items.push({ kind: "end" });
    } else if (this.#pending) {
      this.#pending.head += name; // another special inside a marker's head is part of its text
    } else items.push({ kind: "markup", text: name });
    return items;
  }

  #item(item: Item, out: ParseEvent[]): void {
    const phase = this.#phase;
    if (phase === "reasoning" || phase === "content") {
      if (item.kind === "text") return this.#text(out, "visible", phase, item.text);
      if (item.kind === "markup") return this.#text(out, "hidden", phase, item.text);
      if (item.kind === "end") return this.#enter("done", out);
      const next = transition(phase, item.marker);
      if (next) return this.#enter(next, out);
      return this.#text(out, "hidden", phase, markerText(item.marker));
    }
    if (phase === "tools") {
      if (
        item.kind === "end" || (item.kind === "marker" && isMarker(item.marker, false, "message"))
      ) {
        this.#tools.end(out, "unclosed");
        return this.#enter("done", out);
      }
      if (item.kind === "marker" && isMarker(item.marker, false, "tools")) {
        this.#tools.end(out, "closed");
        return this.#enter("done", out);
      }
      return this.#tools.push(item, out);
    }
    if (phase === "done") return;
    // afterThink, afterContent: only markers move on; other text is dropped.
    if (item.kind === "end") return this.#enter("done", out);
    if (item.kind === "marker") {
      const next = transition(phase, item.marker);
      if (next) this.#enter(next, out);
    }
  }

  #text(out: ParseEvent[], type: "visible" | "hidden", channel: TextChannel, text: string): void {
    if (channel === "reasoning") this.#reasoning += text;
    else this.#content += text;
    out.push({ type, channel, text });
  }

  #enter(phase: Phase, out: ParseEvent[]): void {
    this.#phase = phase;
    out.push({ type: "phase", phase });
  }
}

function isMarker(m: Marker, open: boolean, head: string): boolean {
  return m.open === open && m.head === head;
}

/** The phase a known marker leads to from `phase`, or null (then it is text of the channel). */
function transition(phase: Phase, m: Marker): Phase | null {
  if (isMarker(m, false, "message")) return "done";
  switch (phase) {
    case "reasoning":
      if (isMarker(m, false, "think")) return "afterThink";
      if (isMarker(m, true, "response")) return "content";
      return null;
    case "afterThink":
      if (isMarker(m, true, "response")) return "content";
      if (isMarker(m, true, "tools")) return "tools";
      return null;
    case "content":
      if (isMarker(m, false, "response")) return "afterContent";
      if (isMarker(m, true, "tools")) return "tools";
      return null;
    case "afterContent":
      if (isMarker(m, true, "tools")) return "tools";
      return null;
    default:
      return null;
  }
}

/**
 * Split generated text into reasoning, content and tool calls. `thinking` (default true) says
 * whether the prompt opened the think channel; otherwise it opened the response channel.
 * Missing closing markers (a cut-off generation) end the channel at the end of the text.
 * Control tokens are found by their names here; for generated ids use lib/text/stream.ts,
 * which knows which ids are special.
 */
export function parseOutput(text: string, options: { thinking?: boolean } = {}): ParsedOutput {
  const parser = new OutputParser(options);
  for (const atom of atomsOf(text)) parser.push(atom);
  parser.end();
  return parser.result();
}

const CONTROL_PATTERN = new RegExp(
  [...CONTROLS].map((c) => c.replace(/[|[\]\\^$.*+?(){}]/g, "\\$&")).join("|"),
  "g",
);

/** A string cut into atoms at the control-token names. */
function atomsOf(text: string): Atom[] {
  const atoms: Atom[] = [];
  let at = 0;
  for (const m of text.matchAll(CONTROL_PATTERN)) {
    if (m.index > at) atoms.push({ text: text.slice(at, m.index) });
    atoms.push({ special: m[0] });
    at = m.index + m[0].length;
  }
  if (at < text.length) atoms.push({ text: text.slice(at) });
  return atoms;
}

// ---- the tools channel ----

type ToolsState =
  | { kind: "between" }
  | { kind: "call"; call: OpenCall }
  | { kind: "part"; call: OpenCall; tag: string; key?: string; type?: string; value: string }
  | { kind: "skip" };

interface OpenCall {
  name: string;
  arguments: Record<string, unknown> | string;
  /** Set once a json block or an argument was read (they may not be mixed). */
  form?: "json" | "arguments";
}

/** Reads calls from the items of the tools channel. */
class ToolsReader {
  readonly calls: ParsedToolCall[] = [];
  readonly malformed: string[] = [];
  #state: ToolsState = { kind: "between" };
  #attempt = 0;
  /** The call in progress is the forced one: report it even if broken. */
  #forced: boolean;

  constructor(readonly keepCutCall: boolean, forcedCall: boolean) {
    this.#forced = forcedCall;
  }

  push(item: Item, out: ParseEvent[]): void {
    const s = this.#state;
    if (s.kind === "part") {
      if (item.kind === "marker" && isMarker(item.marker, false, s.tag)) return this.#endPart(s);
      s.value += item.kind === "marker" ? markerText(item.marker) : itemText(item);
      return;
    }
    const opensCall = item.kind === "marker" && item.marker.open &&
      tagOf(item.marker.head) === "call";
    if (s.kind === "skip") {
      if (opensCall) return this.#openCall(item.marker, out);
      if (item.kind === "marker" && isMarker(item.marker, false, "call")) {
        this.#state = { kind: "between" };
      }
      return;
    }
    if (item.kind === "text" && item.text.trim() === "") return;
    if (s.kind === "between") {
      if (opensCall) return this.#openCall(item.marker, out);
      return this.#bad(out, `expected ${OPEN}call, found ${preview(item)}`);
    }
    // Inside a call.
    const name = s.call.name;
    if (item.kind === "marker" && isMarker(item.marker, false, "call")) {
      this.#report(out, s.call);
      this.#state = { kind: "between" };
      return;
    }
    if (opensCall) {
      this.#note(out, `call "${name}" is not closed`);
      this.#abandon(out);
      return this.#openCall(item.marker, out);
    }
    if (item.kind !== "marker" || !item.marker.open) {
      return this.#bad(out, `unexpected text in call "${name}": ${preview(item)}`);
    }
    const { tag, attrs } = parseHead(item.marker.head);
    if (tag === "argument") {
      const key = attrs.get("key");
      if (key === undefined) return this.#bad(out, `argument without key in call "${name}"`);
      if (s.call.form === "json") {
        return this.#bad(out, `call "${name}" mixes a json block with arguments`);
      }
      this.#state = { kind: "part", call: s.call, tag, key, type: attrs.get("type"), value: "" };
    } else if (tag === "json") {
      if (s.call.form === "arguments") {
        return this.#bad(out, `call "${name}" mixes a json block with arguments`);
      }
      this.#state = { kind: "part", call: s.call, tag, value: "" };
    } else {
      this.#bad(out, `unknown tag "${tag ?? item.marker.head}" in call "${name}"`);
    }
  }

  /** The channel ended: `closed` by its marker, `unclosed` by the message's end, or `cut`. */
  end(out: ParseEvent[], how: "closed" | "unclosed" | "cut"): void {
    const s = this.#state;
    if (s.kind === "call" || s.kind === "part") {
      const name = s.call.name;
      const what = s.kind === "part" ? `${s.tag} in call "${name}"` : `call "${name}"`;
      if (how === "cut" && this.keepCutCall) {
        this.#note(out, `${what} was cut off; its completed arguments are kept`);
        this.#report(out, s.call);
      } else {
        this.#note(out, `${what} is not closed`);
        this.#abandon(out);
      }
    }
    if (how !== "closed") this.#note(out, "tools channel is not closed (generation cut off?)");
    this.#state = { kind: "skip" };
  }

  #openCall(marker: Marker, out: ParseEvent[]): void {
    this.#attempt++;
    const name = parseHead(marker.head).attrs.get("tool");
    if (!name) return this.#bad(out, "call has no tool attribute", false);
    this.#state = { kind: "call", call: { name, arguments: {} } };
  }

  #endPart(s: Extract<ToolsState, { kind: "part" }>): void {
    const call = s.call;
    if (s.tag === "json") {
      call.arguments = s.value;
      call.form = "json";
    } else {
      if (typeof call.arguments === "string") call.arguments = {};
      call.arguments[s.key!] = argumentValue(s.value, s.type);
      call.form = "arguments";
    }
    this.#state = { kind: "call", call };
  }

  #note(out: ParseEvent[], what: string): void {
    const note = `call ${Math.max(1, this.#attempt)}: ${what}`;
    this.malformed.push(note);
    out.push({ type: "malformed", note });
  }

  /** A problem: note it and skip to the next call. */
  #bad(out: ParseEvent[], what: string, counts = true): void {
    if (counts && this.#state.kind === "between") this.#attempt++;
    this.#note(out, what);
    this.#abandon(out);
    this.#state = { kind: "skip" };
  }

  #report(out: ParseEvent[], call: OpenCall): void {
    this.#forced = false;
    this.calls.push({ name: call.name, arguments: call.arguments, index: this.calls.length });
    out.push({ type: "toolCall", call: this.calls.at(-1)! });
  }

  /** The call in progress is given up: only the forced call is still reported. */
  #abandon(out: ParseEvent[]): void {
    const s = this.#state;
    if (this.#forced && (s.kind === "call" || s.kind === "part")) {
      this.#note(out, `call "${s.call.name}" is reported with the arguments completed before that`);
      this.#report(out, s.call);
    }
  }
}

function itemText(item: Item): string {
  if (item.kind === "marker") return markerText(item.marker);
  return item.kind === "end" ? END_OF_MSG : item.text;
}

function preview(item: Item): string {
  return JSON.stringify(itemText(item).slice(0, 40));
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
function unescapeAttr(v: string): string {
  return v.replaceAll("&quot;", '"').replaceAll("&amp;", "&");
}

const TAG = /^[A-Za-z_-]+/;
const ATTR = /^ ([^\s="]+)="([^"]*)"/;

/** `tag attr="v" ...` -> the tag (undefined if the head is not of that form) and attributes. */
function parseHead(head: string): { tag: string | undefined; attrs: Map<string, string> } {
  const tag = TAG.exec(head)?.[0];
  const attrs = new Map<string, string>();
  if (!tag) return { tag, attrs };
  let rest = head.slice(tag.length);
  for (let m = ATTR.exec(rest); m; m = ATTR.exec(rest)) {
    attrs.set(m[1], unescapeAttr(m[2]));
    rest = rest.slice(m[0].length);
  }
  return rest.trim() === "" ? { tag, attrs } : { tag: undefined, attrs: new Map() };
}

function tagOf(head: string): string | undefined {
  return parseHead(head).tag;
}
