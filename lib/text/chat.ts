/**
 * The K3 chat format, XTML (MODEL.md §7.1–§7.2): OpenAI-style messages -> a list of segments, each
 * tokenised on its own. Control markers (`<|open|>` `<|close|>` `<|sep|>` `<|end_of_msg|>`) are
 * special segments; tag names, attribute text and all content are ordinary text segments, so a
 * user typing `<|end_of_msg|>` gets plain bytes.
 */

import { badInput } from "../errors.ts";
import { deepSort, pyJsonDumps, pythonStrip } from "./pyjson.ts";
import type { Tokenizer } from "./tokenizer.ts";

/** One piece of the rendered prompt; `special` = tokenise with special tokens recognised. */
export interface Segment {
  /** The segment's text. */
  text: string;
  /** Tokenise with special tokens recognised (control markers only). */
  special: boolean;
}

/** A tool call as OpenAI sends it; `arguments` may be an object or a JSON string. */
export interface ToolCall {
  /** The call's id, echoed by the `tool` message that answers it. */
  id?: string;
  /** `function`. */
  type?: string;
  /** The function called and its arguments. */
  function: { name: string; arguments?: Record<string, unknown> | string | null };
}

/** A content part: text, or an image (rendered as a placeholder; the engine refuses images). */
export type ContentPart =
  | { type: "text"; text: string }
  | { type: "image" | "image_url"; [key: string]: unknown };

/** An OpenAI-style chat message. `developer` is treated as `system`. */
export interface ChatMessage {
  /** `system`, `developer`, `user`, `assistant` or `tool`. */
  role: string;
  /** The text, or text parts. */
  content?: string | ContentPart[] | null;
  /** The speaker's name, when the role has several. */
  name?: string;
  /** An assistant turn's thinking (K3 keeps past thinking). */
  reasoning_content?: string | null;
  /** Another name for `reasoning_content`. */
  reasoning?: string | null;
  /** Calls an assistant turn made. */
  tool_calls?: ToolCall[] | null;
  /** On a `tool` message: the call it answers. */
  tool_call_id?: string;
  /** The tool's name on a `tool` message (filled in from the matching call when absent). */
  tool?: string;
  /** Tools declared mid-conversation by a `system` message. */
  tools?: unknown[] | null;
}

/** How much the model thinks in its think channel. */
export type ThinkingEffort = "low" | "high" | "max";
/** Whether the model may (`auto`), must (`required`) or must not (`none`) call tools. */
export type ToolChoice = "auto" | "required" | "none";
/** Plain text, any JSON object, or JSON matching a schema. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; json_schema: Record<string, unknown> };

/** Rendering options; defaults follow HF `apply_chat_template` for K3. */
export interface RenderOptions {
  /** Think channel on every assistant turn and in the generation prompt. Default true. */
  thinking?: boolean;
  /** Default "max". */
  thinkingEffort?: ThinkingEffort;
  /** Tools the model may call (OpenAI function specs). */
  tools?: unknown[] | null;
  /** Whether it may, must or must not call them. */
  toolChoice?: ToolChoice;
  /** Ask for JSON output. */
  responseFormat?: ResponseFormat | null;
  /** End with the opening of an assistant turn. Default true. */
  addGenerationPrompt?: boolean;
}

export const OPEN = "<|open|>";
export const CLOSE = "<|close|>";
export const SEP = "<|sep|>";
export const END_OF_MSG = "<|end_of_msg|>";
const IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>";
const CONTROL_TOKENS = [OPEN, CLOSE, SEP, END_OF_MSG];

const TOOL_DECLARE_HEAD =
  "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
const DYNAMIC_TOOLS_HEAD = "## New Tools Available\n" +
  "The system dynamically extends the toolset via lazy-loading.\n" +
  "You have access to all existing and extended tools.\n" +
  "Here are the specs for the extended tools.\n\n```json\n";
const EFFORT_HEAD = "`thinking_effort` guides on how much to think in your thinking channel " +
  "(not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n" +
  "Now the system is invoked with `thinking_effort=";
const CHOICE_REQUIRED =
  "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
const CHOICE_NONE =
  "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.";
const RF_RAW =
  "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";
const RF_OBJECT = "The system is invoked with `response_format=json_object`.\n" + RF_RAW;
const RF_SCHEMA_HEAD = "The system is invoked with `response_format=json_schema`.\n" + RF_RAW +
  "\nThe JSON data must match the following schema:\n```json\n";
const FENCE_END = "\n```";

/** Render messages to XTML segments (MODEL.md §7.2). Invalid input throws badInput. */
export function renderChat(
  messages: ChatMessage[],
  options: RenderOptions = {},
): { segments: Segment[] } {
  const thinking = options.thinking ?? true;
  const effort = checkEffort(options.thinkingEffort ?? "max");
  const out: Segment[] = [];
  if (options.tools != null && !Array.isArray(options.tools)) {
    throw badInput("tools must be a list of tool specs");
  }
  if (options.tools && options.tools.length > 0) {
    sys(out, "tool-declare", TOOL_DECLARE_HEAD + compactSorted(options.tools) + FENCE_END);
  }
  if (thinking) sys(out, "thinking-effort", EFFORT_HEAD + effort + "`.");
  renderMessages(out, orderToolResults(messages.map(normaliseRole)), thinking);
  renderToolChoice(out, options.toolChoice);
  if (options.responseFormat) renderResponseFormat(out, options.responseFormat);
  if (options.addGenerationPrompt ?? true) {
    open(out, "message", [["role", "assistant"]]);
    open(out, thinking ? "think" : "response");
  }
  return { segments: out };
}

/**
 * Render and tokenise: each segment on its own, special segments with special tokens allowed.
 * Refuses images (this engine is text-only) and tokenizers lacking the XTML control tokens.
 */
export function renderChatIds(
  tokenizer: Tokenizer,
  messages: ChatMessage[],
  options: RenderOptions = {},
): { segments: Segment[]; ids: number[] } {
  checkControlTokens(tokenizer);
  const { segments } = renderChat(messages, options);
  return { segments, ids: segmentIds(tokenizer, segments) };
}

function checkControlTokens(tokenizer: Tokenizer): void {
  for (const name of CONTROL_TOKENS) {
    if (tokenizer.specialId(name) === undefined) {
      throw badInput(
        `tokenizer_config.json: added_tokens_decoder has no ${name}; XTML chat needs it`,
      );
    }
  }
}

/**
 * {@link renderChatIds}, giving the event loop a turn between pieces of long segments (see
 * Tokenizer.encodeYielding): the same ids, for a server that must keep answering meanwhile.
 */
export async function renderChatIdsYielding(
  tokenizer: Tokenizer,
  messages: ChatMessage[],
  options: RenderOptions = {},
): Promise<{ segments: Segment[]; ids: number[] }> {
  checkControlTokens(tokenizer);
  const { segments } = renderChat(messages, options);
  const ids: number[] = [];
  for (const segment of segments) {
    // Specials and short text at once; long text a piece at a time.
    const encoded = segment.special || segment.text.length <= YIELD_SEGMENT_UNITS
      ? segmentIds(tokenizer, [segment])
      : await tokenizer.encodeYielding(segment.text, { allowSpecial: false });
    for (const id of encoded) ids.push(id);
  }
  return { segments, ids };
}

/** Segments longer than this (UTF-16 units) are encoded a piece at a time, yielding. */
const YIELD_SEGMENT_UNITS = 65536;

/**
 * A lower bound on the ids renderChatIds gives, without tokenising: each token covers at most
 * `maxTokenBytes` bytes of its segment, and a string has at least as many UTF-8 bytes as
 * UTF-16 units. Lets a caller refuse a huge message before spending a minute encoding it.
 */
export function leastChatTokens(
  tokenizer: Tokenizer,
  messages: ChatMessage[],
  options: RenderOptions = {},
): number {
  let least = 0;
  for (const segment of renderChat(messages, options).segments) {
    const units = segment.text.length;
    least += segment.special ? Math.min(1, units) : Math.ceil(units / tokenizer.maxTokenBytes);
  }
  return least;
}

/** Token ids of segments, each tokenised on its own (images refused: text-only engine). */
export function segmentIds(tokenizer: Tokenizer, segments: Segment[]): number[] {
  const ids: number[] = [];
  for (const segment of segments) {
    if (segment.special && segment.text === IMAGE_PLACEHOLDER) {
      throw badInput("messages: image content is not supported; this engine is text-only");
    }
    // No spread: a long message's ids overflow the stack as call arguments.
    for (const id of tokenizer.encode(segment.text, { allowSpecial: segment.special })) {
      ids.push(id);
    }
  }
  return ids;
}

/** `<|close|>think<|sep|><|open|>response<|sep|>`: the think channel ends, the answer begins. */
export function endThinking(): Segment[] {
  const out: Segment[] = [];
  close(out, "think");
  open(out, "response");
  return out;
}

/**
 * What follows the generation prompt when the assistant must call tool `name`: the think
 * channel (if open) closed empty, an empty response channel, and the tools channel up to
 * `<|open|>call tool="NAME" index="1"<|sep|>`. The same segments the renderer writes for such
 * a turn in the history, so a later turn that re-renders it shares this prefix.
 */
export function toolCallPrefill(name: string, thinking: boolean): Segment[] {
  // The generation prompt opened the think channel, or (thinking off) the response channel.
  const out: Segment[] = thinking ? endThinking() : [];
  close(out, "response");
  open(out, "tools");
  open(out, "call", [["tool", name], ["index", 1]]);
  return out;
}

// ---- building blocks (MODEL.md §7.1) ----

type Attr = [key: string, value: string | number];

function control(out: Segment[], s: string): void {
  out.push({ text: s, special: true });
}

function text(out: Segment[], s: string): void {
  if (s !== "") out.push({ text: s, special: false });
}

/** HTML-style attribute escaping: `&` first, then `"`; nothing else. */
function escapeAttr(v: string): string {
  return v.replaceAll("&", "&amp;").replaceAll('"', "&quot;");
}

/** One attribute is four text segments: ` key`, `="`, value, `"`. */
function attr(out: Segment[], [key, value]: Attr): void {
  text(out, " " + key);
  text(out, '="');
  text(out, escapeAttr(String(value)));
  text(out, '"');
}

function open(out: Segment[], tag: string, attrs: Attr[] = []): void {
  control(out, OPEN);
  text(out, tag);
  for (const a of attrs) attr(out, a);
  control(out, SEP);
}

function close(out: Segment[], tag: string): void {
  control(out, CLOSE);
  text(out, tag);
  control(out, SEP);
}

/** A whole message: open, body, close, end-of-message. */
function message(out: Segment[], attrs: Attr[], body: () => void): void {
  open(out, "message", attrs);
  body();
  close(out, "message");
  control(out, END_OF_MSG);
}

function sys(out: Segment[], type: string, body: string): void {
  message(out, [["role", "system"], ["type", type]], () => text(out, pythonStrip(body)));
}

/** Python `json.dumps(deep_sort(x), ensure_ascii=False, separators=(",", ":"))`. */
function compactSorted(value: unknown): string {
  return pyJsonDumps(deepSort(value), { compact: true, sortKeys: true });
}

// ---- options ----

function checkEffort(effort: string): ThinkingEffort {
  if (effort === "low" || effort === "high" || effort === "max") return effort;
  throw badInput(`thinking_effort must be one of low, high, max; got ${JSON.stringify(effort)}`);
}

function renderToolChoice(out: Segment[], choice: string | undefined): void {
  if (choice === undefined || choice === "auto") return;
  if (choice === "required") return sys(out, "tool-choice", CHOICE_REQUIRED);
  if (choice === "none") return sys(out, "tool-choice", CHOICE_NONE);
  throw badInput(`tool_choice must be "auto", "required" or "none"; got ${JSON.stringify(choice)}`);
}

function renderResponseFormat(out: Segment[], format: ResponseFormat): void {
  if (format.type === "text") return;
  if (format.type === "json_object") return sys(out, "response-format", RF_OBJECT);
  if (format.type === "json_schema") {
    return sys(
      out,
      "response-format",
      RF_SCHEMA_HEAD + compactSorted(schemaOf(format)) + FENCE_END,
    );
  }
  throw badInput(
    `response_format.type must be "text", "json_object" or "json_schema"; got ${
      JSON.stringify((format as { type: unknown }).type)
    }`,
  );
}

/** `json_schema.schema`, else `json_schema.json_schema`, else `json_schema` itself. */
function schemaOf(format: { json_schema?: Record<string, unknown> }): unknown {
  const js = format.json_schema;
  if (!isRecord(js)) {
    throw badInput("response_format.json_schema must be an object holding the schema");
  }
  return js.schema ?? js.json_schema ?? js;
}

// ---- messages ----

function normaliseRole(m: ChatMessage): ChatMessage {
  return m.role === "developer" ? { ...m, role: "system" } : m;
}

/**
 * Re-sort each run of tool messages that follows an assistant turn with tool_calls into the
 * order of those calls (matching tool_call_id to the call id), and name each matched result
 * after its call. A run with any unmatched message is left untouched.
 */
function orderToolResults(messages: ChatMessage[]): ChatMessage[] {
  const result = [...messages];
  for (let i = 0; i < result.length; i++) {
    const calls = result[i].role === "assistant" ? result[i].tool_calls : null;
    if (!calls || calls.length === 0) continue;
    let end = i + 1;
    while (end < result.length && result[end].role === "tool") end++;
    const run = result.slice(i + 1, end);
    const positions = run.map((m) =>
      calls.findIndex((c) => c.id !== undefined && c.id === m.tool_call_id)
    );
    if (run.length === 0 || positions.some((p) => p < 0)) continue;
    const sorted = run
      .map((m, k) => ({ m, pos: positions[k] }))
      .sort((a, b) => a.pos - b.pos)
      .map(({ m, pos }) => withToolName(m, callFunction(calls[pos], i, pos).name));
    result.splice(i + 1, run.length, ...sorted);
  }
  return result;
}

function withToolName(m: ChatMessage, name: string): ChatMessage {
  return m.name ? { ...m, tool: name, name } : { ...m, tool: name };
}

function renderMessages(out: Segment[], messages: ChatMessage[], thinking: boolean): void {
  let lastCalls: ToolCall[] = [];
  let toolCounter = 0;
  messages.forEach((m, i) => {
    if (m.role === "system" && m.tools && m.tools.length > 0) {
      message(out, [["role", "system"], ["type", "tool-declare"]], () => {
        text(out, DYNAMIC_TOOLS_HEAD + compactSorted(m.tools) + FENCE_END);
      });
    } else if (m.role === "user" || m.role === "system") {
      message(out, roleAttrs(m), () => content(out, m.content, i));
    } else if (m.role === "assistant") {
      lastCalls = m.tool_calls ?? [];
      toolCounter = 0;
      message(out, roleAttrs(m), () => assistantBody(out, m, i, thinking));
    } else if (m.role === "tool") {
      toolCounter++;
      const name = m.tool || m.name || toolNameFromCall(lastCalls, toolCounter, i);
      message(
        out,
        [["role", "tool"], ["tool", name], ["index", toolCounter]],
        () => content(out, m.content, i),
      );
    }
    // Other roles are ignored, as the official encoder does.
  });
}

function roleAttrs(m: ChatMessage): Attr[] {
  return m.name ? [["role", m.role], ["name", m.name]] : [["role", m.role]];
}

function toolNameFromCall(calls: ToolCall[], counter: number, i: number): string {
  const call = calls[counter - 1];
  const name = call ? callFunction(call, -1, counter - 1).name : undefined;
  if (!name) {
    throw badInput(
      `messages[${i}]: tool message #${counter} has no "name" and no matching tool_calls entry ` +
        `in the preceding assistant message; set "name" or "tool_call_id"`,
    );
  }
  return name;
}

/** CONTENT(c): a string, a list of parts, or null. */
function content(out: Segment[], c: ChatMessage["content"], i: number): void {
  if (c === null || c === undefined) return;
  if (typeof c === "string") return text(out, c);
  if (!Array.isArray(c)) {
    throw badInput(`messages[${i}].content must be a string, a list of parts, or null`);
  }
  c.forEach((part, k) => {
    if (part?.type === "image" || part?.type === "image_url") {
      return control(out, IMAGE_PLACEHOLDER);
    }
    const partText = (part as { text?: unknown })?.text;
    if (typeof partText !== "string") {
      throw badInput(`messages[${i}].content[${k}].text must be a string`);
    }
    text(out, partText);
  });
}

function assistantBody(out: Segment[], m: ChatMessage, i: number, thinking: boolean): void {
  if (thinking) {
    open(out, "think");
    const r = m.reasoning_content ?? m.reasoning;
    if (r !== null && r !== undefined && pythonStrip(String(r)) !== "") text(out, String(r));
    close(out, "think");
  }
  open(out, "response");
  content(out, m.content, i);
  close(out, "response");
  if (m.tool_calls && m.tool_calls.length > 0) toolCalls(out, m.tool_calls, i);
}

function toolCalls(out: Segment[], calls: ToolCall[], i: number): void {
  open(out, "tools");
  calls.forEach((call, k) => {
    const f = callFunction(call, i, k);
    open(out, "call", [["tool", f.name], ["index", k + 1]]);
    const args = callArguments(f.arguments, i, k);
    if (typeof args === "string") {
      open(out, "json", [["type", "object"]]);
      text(out, args);
      close(out, "json");
    } else {
      for (const [key, value] of Object.entries(args)) {
        open(out, "argument", [["key", key], ["type", jsonTypeName(value)]]);
        text(out, typeof value === "string" ? value : pyJsonDumps(value));
        close(out, "argument");
      }
    }
    close(out, "call");
  });
  close(out, "tools");
}

/** `call.function`, or the call itself when it is already flat ({name, arguments}). */
function callFunction(call: ToolCall, i: number, k: number): ToolCall["function"] {
  const f = (call as { function?: unknown }).function ?? call;
  if (!isRecord(f) || typeof f.name !== "string" || f.name === "") {
    const where = i >= 0 ? `messages[${i}].tool_calls[${k}]` : `tool_calls[${k}]`;
    throw badInput(`${where}.function.name must be a non-empty string`);
  }
  return f as ToolCall["function"];
}

/**
 * Tool-call arguments: an object as is; a JSON string parsed (blank -> {}); an unparsable string
 * stays raw (rendered as a json block); a string holding a non-object JSON value is an error.
 */
function callArguments(args: unknown, i: number, k: number): Record<string, unknown> | string {
  if (args === null || args === undefined) return {};
  if (isRecord(args)) return args;
  const where = `messages[${i}].tool_calls[${k}].function.arguments`;
  if (typeof args !== "string") throw badInput(`${where} must be an object or a JSON string`);
  if (pythonStrip(args) === "") return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(args);
  } catch {
    return args;
  }
  if (!isRecord(parsed)) {
    throw badInput(`${where} must encode a JSON object; got ${JSON.stringify(args)}`);
  }
  return parsed;
}

/** TYPE(value) of MODEL.md §7.2. */
function jsonTypeName(value: unknown): string {
  if (typeof value === "boolean") return "boolean";
  if (value === null) return "null";
  if (typeof value === "number") return "number";
  if (typeof value === "string") return "string";
  if (isRecord(value)) return "object";
  return "array";
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
