/**
 * The OpenAI Chat Completions and Completions wire formats: request bodies checked and turned
 * into a {@link GenerationSpec}, and the response, chunk and error objects built from what the
 * engine produced. No I/O here, so every shape can be unit-tested without a server.
 */
import type {
  ChatMessage,
  RenderOptions,
  ResponseFormat,
  ThinkingEffort,
  ToolChoice,
} from "../text/chat.ts";
import type {
  GenerationDelta,
  GenerationResult,
  GenerationSpec,
  TokenLogprob,
  ToolCallOut,
} from "./generation.ts";
import type { ResponseMeta, StreamWriter, WireFormat } from "./wire.ts";
import {
  type ApiError,
  badField,
  type Body,
  checkFields,
  type FieldPolicy,
  isAbsent,
  isRecord,
  never,
  optional,
  optionalInt,
  optionalRecord,
  parseSampling,
  parseStops,
  SAMPLING_FIELDS,
  unsupported,
} from "./request.ts";
import { parseSpeculateField, type SpeculationConfig } from "../speculate/speculate.ts";
import { checkSchema } from "../text/grammar.ts";
import { type DeclaredTool, strictSchema, toolsGrammar } from "./strict_tools.ts";

// ---- errors ----

/** The OpenAI error body. */
export function errorBody(e: ApiError): {
  error: { message: string; type: string; param: string | null; code: string | null };
} {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

// ---- requests ----

/** What both endpoints share. */
interface OpenAiRequest {
  /** The `model` field, if the client sent one. */
  model?: string;
  spec: GenerationSpec;
  stream: boolean;
  /** `stream_options.include_usage`: a last chunk carrying usage. */
  includeUsage: boolean;
  /** Chat: `logprobs: true`; completions: `logprobs` given (0 and up). */
  logprobs: boolean;
  /** `n`: choices to generate (they share the prompt's prefill). */
  n: number;
}

/** The most choices one request may ask for (the server's --max-batch may allow fewer). */
const MAX_CHOICES = 16;

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

const COMPLETIONS_ONLY = "is a /v1/completions field; chat completions do not take it";

/** Chat Completions fields: read, informational, or refused with a reason. */
const CHAT_FIELDS: FieldPolicy = {
  handled: [
    ...SAMPLING_FIELDS,
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "reasoning_effort",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "n",
    "speculate",
  ],
  informational: [
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
  ],
  refused: {
    store: (v) =>
      v === false ? null : "store: true is not supported (k3 keeps no completions); omit it",
    modalities: (v) =>
      Array.isArray(v) && v.every((m) => m === "text") ? null : 'only ["text"] is supported',
    audio: never("audio output is not supported: this server is text-only"),
    prediction: never("predicted outputs are not supported; omit it"),
    web_search_options: never("web search is not supported"),
    functions: never("the legacy functions field is not supported: send tools"),
    function_call: never("the legacy function_call field is not supported: send tool_choice"),
    verbosity: (v) => v === "medium" ? null : 'only the default verbosity ("medium") is supported',
    echo: never(COMPLETIONS_ONLY),
    best_of: never(COMPLETIONS_ONLY),
    suffix: never(COMPLETIONS_ONLY),
  },
};

/** Completions fields. */
const COMPLETION_FIELDS: FieldPolicy = {
  handled: [
    ...SAMPLING_FIELDS,
    "prompt",
    "model",
    "max_tokens",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "n",
    "speculate",
  ],
  informational: ["user"],
  refused: {
    echo: (v) => v === false ? null : "echo is not supported (the prompt is not repeated)",
    best_of: (v) => v === 1 ? null : "only best_of = 1 is supported",
    suffix: never("insertion (suffix) is not supported"),
  },
};

/** Checks a chat body; anything wrong is a 400 naming the field. */
export function parseChatRequest(body: Body): OpenAiRequest {
  checkFields(body, CHAT_FIELDS);
  const { tools, declared } = parseTools(body.tools);
  const choice = parseToolChoice(body.tool_choice, tools);
  const parallel = optional<boolean>(body, "parallel_tool_calls", "boolean", "true or false");
  const logprobs = optional<boolean>(body, "logprobs", "boolean", "true or false") ?? false;
  const top = optionalInt(body, "top_logprobs", 0, 20);
  if (top !== undefined && !logprobs) {
    throw badField("top_logprobs", "needs logprobs: true");
  }
  const format = parseResponseFormat(body.response_format);
  const render: RenderOptions = {
    ...parseThinking(body),
    tools,
    toolChoice: choice.render,
    responseFormat: format,
  };
  return {
    ...parseCommon(body),
    logprobs,
    spec: {
      input: {
        kind: "chat",
        messages: parseMessages(body.messages),
        render,
        forceTool: choice.force,
      },
      maxTokens: optionalInt(body, "max_completion_tokens", 1) ??
        optionalInt(body, "max_tokens", 1),
      maxTokensField: body.max_completion_tokens !== undefined
        ? "max_completion_tokens"
        : "max_tokens",
      stops: parseStops(body.stop, "stop"),
      sampling: parseSampling(body),
      speculation: parseSpeculate(body),
      logprobs: logprobs ? top ?? 0 : undefined,
      maxToolCalls: choice.force !== undefined || parallel === false ? 1 : undefined,
      grammar: toolsGrammar(
        declared,
        choice,
        parallel === false ? 1 : undefined,
        formatGrammar(format, "response_format"),
      ),
    },
  };
}

/**
 * The grammar a response format asks for: any JSON object for json_object, the schema for a
 * strict json_schema (its keywords checked here, so a bad one is a 400 naming it). A
 * json_schema that is not strict is only shown to the model, as before.
 */
export function formatGrammar(
  format: ResponseFormat | undefined,
  field: string,
  at = `${field}.json_schema.schema`,
): GenerationSpec["grammar"] {
  if (format?.type === "json_object") return { spec: { type: "json_object" }, field };
  if (format?.type !== "json_schema" || format.json_schema.strict !== true) return undefined;
  const schema = format.json_schema.schema ?? {};
  try {
    checkSchema(schema, at);
  } catch (e) {
    throw badField(at, (e as Error).message.replace(`${at}: `, ""));
  }
  return { spec: { type: "json_schema", schema }, field: at };
}

/**
 * Checks a completions body. `prompt` is one string (or a list holding one), or one list of
 * token ids (or a list holding one).
 */
function parseCompletionRequest(body: Body, vocab: number): OpenAiRequest {
  checkFields(body, COMPLETION_FIELDS);
  let prompt = body.prompt;
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] !== "number") {
    prompt = prompt[0];
  }
  let input: GenerationSpec["input"];
  if (typeof prompt === "string" && prompt !== "") input = { kind: "text", prompt };
  else if (
    Array.isArray(prompt) && prompt.length > 0 && prompt.every((id) => isTokenId(id, vocab))
  ) {
    input = { kind: "ids", ids: prompt as number[] };
  } else {
    throw badField(
      "prompt",
      `must be a non-empty string or a non-empty list of token ids below ${vocab} (one prompt per request)`,
    );
  }
  const logprobs = optionalInt(body, "logprobs", 0, 5);
  return {
    ...parseCommon(body),
    logprobs: logprobs !== undefined,
    spec: {
      input,
      maxTokens: optionalInt(body, "max_tokens", 1),
      maxTokensField: "max_tokens",
      stops: parseStops(body.stop, "stop"),
      sampling: parseSampling(body),
      speculation: parseSpeculate(body),
      logprobs,
    },
  };
}

function isTokenId(id: unknown, vocab: number): boolean {
  return typeof id === "number" && Number.isInteger(id) && id >= 0 && id < vocab;
}

function parseCommon(
  body: Body,
): Pick<OpenAiRequest, "model" | "stream" | "includeUsage" | "n"> {
  const n = optionalInt(body, "n", 1, MAX_CHOICES) ?? 1;
  const streamOptions = optionalRecord(body, "stream_options");
  if (streamOptions) {
    checkFields(streamOptions, {
      handled: ["include_usage"],
      informational: ["include_obfuscation"],
    }, "stream_options.");
  }
  const flag = (key: string) =>
    streamOptions &&
    optional<boolean>(streamOptions, key, "boolean", "true or false", "stream_options.");
  const includeUsage = flag("include_usage") ?? false;
  flag("include_obfuscation");
  const stream = optional<boolean>(body, "stream", "boolean", "true or false") ?? false;
  if (streamOptions && !stream) throw badField("stream_options", "needs stream: true");
  return {
    model: optional<string>(body, "model", "string", "a string"),
    stream,
    includeUsage,
    n,
  };
}

/** `speculate` (a k3 extension, lib/speculate/speculate.ts): undefined = the server's. */
function parseSpeculate(body: Body): SpeculationConfig | null | undefined {
  try {
    return parseSpeculateField(body.speculate);
  } catch (e) {
    throw badField("speculate", (e as Error).message.replace(/^speculate: /, ""));
  }
}

/** Messages: a non-empty list of objects with a known role and text-only content. */
function parseMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw badField("messages", "must be a non-empty list of messages");
  }
  value.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (!isRecord(m)) throw badField(at, "must be an object");
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw badField(`${at}.role`, `must be one of ${[...ROLES].join(", ")}`);
    }
    checkContent(m.content, `${at}.content`);
    for (const key of ["name", "tool_call_id", "reasoning_content", "reasoning"]) {
      optional<string>(m, key, "string", "a string", `${at}.`);
    }
    if (!isAbsent(m.tool_calls)) {
      if (m.role !== "assistant") {
        throw badField(`${at}.tool_calls`, "only assistant messages have tool calls");
      }
      checkToolCalls(m.tool_calls, `${at}.tool_calls`);
    }
  });
  return value as ChatMessage[];
}

/** Content is a string, null, or a list of text parts; images are refused (text-only engine). */
function checkContent(content: unknown, where: string): void {
  if (isAbsent(content) || typeof content === "string") return;
  if (!Array.isArray(content)) throw badField(where, "must be a string, a list of parts, or null");
  content.forEach((part, k) => {
    const type = isRecord(part) ? part.type : undefined;
    if (
      type === "image_url" || type === "image" || type === "input_image" || type === "input_audio"
    ) {
      throw badField(
        `${where}[${k}]`,
        "image content is not supported (nor audio): this server is text-only",
      );
    }
    if (type !== "text" || !isRecord(part) || typeof part.text !== "string") {
      throw badField(`${where}[${k}]`, 'must be {"type": "text", "text": "..."}');
    }
  });
}

/** `[{id?, type: "function", function: {name, arguments}}]`, arguments a JSON string or object. */
function checkToolCalls(calls: unknown, where: string): void {
  if (!Array.isArray(calls)) throw badField(where, "must be a list of tool calls");
  calls.forEach((call, k) => {
    const at = `${where}[${k}]`;
    if (!isRecord(call)) throw badField(at, "must be an object");
    if (!isAbsent(call.type) && call.type !== "function") {
      throw badField(`${at}.type`, 'must be "function"');
    }
    optional<string>(call, "id", "string", "a string", `${at}.`);
    const f = call.function;
    if (!isRecord(f)) throw badField(`${at}.function`, "must be an object {name, arguments}");
    if (typeof f.name !== "string" || f.name === "") {
      throw badField(`${at}.function.name`, "must be a non-empty string");
    }
    const args = f.arguments;
    if (!isAbsent(args) && typeof args !== "string" && !isRecord(args)) {
      throw badField(`${at}.function.arguments`, "must be a JSON string or an object");
    }
  });
}

/**
 * The thinking switch: `chat_template_kwargs.thinking` (true/false) or `reasoning_effort`:
 * "none" turns thinking off; "minimal" and "low" are K3's "low"; "medium" and "high" are "high"
 * (K3's renderer has no medium); "xhigh" and "max" are "max". Absent: thinking on at effort
 * "max", the renderer's default.
 */
function parseThinking(body: Body): Pick<RenderOptions, "thinking" | "thinkingEffort"> {
  const kwargs = optionalRecord(body, "chat_template_kwargs");
  if (kwargs) {
    checkFields(kwargs, { handled: ["thinking"], informational: [] }, "chat_template_kwargs.");
  }
  const switchOn = kwargs
    ? optional<boolean>(kwargs, "thinking", "boolean", "true or false", "chat_template_kwargs.")
    : undefined;
  const effort = effortOf(body.reasoning_effort, "reasoning_effort");
  if (effort === undefined) return { thinking: switchOn };
  if (effort === "none") return { thinking: false };
  return { thinking: switchOn ?? true, thinkingEffort: effort };
}

const EFFORTS: Record<string, ThinkingEffort | "none"> = {
  none: "none",
  minimal: "low",
  low: "low",
  medium: "high",
  high: "high",
  xhigh: "max",
  max: "max",
};

/** An OpenAI reasoning effort in K3's terms (undefined when absent). */
export function effortOf(value: unknown, param: string): ThinkingEffort | "none" | undefined {
  if (isAbsent(value)) return undefined;
  // Own keys only: "constructor" or "toString" would be found on Object.prototype, not efforts.
  const mapped = typeof value === "string" && Object.hasOwn(EFFORTS, value)
    ? EFFORTS[value]
    : undefined;
  if (mapped === undefined) {
    throw badField(param, `must be one of ${Object.keys(EFFORTS).join(", ")}`);
  }
  return mapped;
}

/** Function tools `{type: "function", function: {name, description?, parameters?, strict?}}`. */
function parseTools(tools: unknown): { tools?: unknown[]; declared: DeclaredTool[] } {
  if (isAbsent(tools)) return { declared: [] };
  if (!Array.isArray(tools)) throw badField("tools", "must be a list of tool objects");
  const declared = tools.map((t, i) => {
    const at = `tools[${i}]`;
    if (!isRecord(t)) throw badField(at, "must be an object");
    if (t.type !== "function") {
      throw unsupported(`${at}.type`, 'only "function" tools are supported');
    }
    const f = t.function;
    if (!isRecord(f) || typeof f.name !== "string" || f.name === "") {
      throw badField(`${at}.function`, "must be an object with a non-empty name");
    }
    const schema = checkFunction(f, `${at}.function`);
    return { name: f.name, schema, at: `${at}.function` };
  });
  return { tools, declared };
}

/**
 * description, the schema (an object, under `schemaKey`), and strict: a strict tool's schema
 * is checked and returned (absent: not strict). An API without strict tools refuses it.
 */
export function checkFunction(
  f: Body,
  at: string,
  schemaKey = "parameters",
  strictAllowed = true,
): unknown {
  optional<string>(f, "description", "string", "a string", `${at}.`);
  optionalRecord(f, schemaKey, `${at}.`);
  if (strictAllowed) return strictSchema(f, at, schemaKey);
  if (optional<boolean>(f, "strict", "boolean", "true or false", `${at}.`)) {
    throw unsupported(`${at}.strict`, "strict tools are not supported here; send strict: false");
  }
  return undefined;
}

/** The names of function tools, in either API's shape. */
function toolNames(tools: unknown[] | undefined): string[] {
  return (tools ?? []).flatMap((t) => {
    const r = t as Record<string, unknown>;
    const f = isRecord(r.function) ? r.function : r;
    return typeof f.name === "string" ? [f.name] : [];
  });
}

/** How a tool choice is carried out: the rendered choice, and a tool to force, if any. */
export interface ChoicePlan {
  render?: ToolChoice;
  force?: string;
}

/**
 * `auto`, `none`, `required`, or `{type: "function", function: {name}}`. Naming a function
 * forces the call: K3 is told tools are required, and its answer is pre-filled up to
 * `<|open|>call tool="NAME" index="1"<|sep|>` (generation.ts), so it writes that call's
 * arguments.
 */
function parseToolChoice(choice: unknown, tools: unknown[] | undefined): ChoicePlan {
  if (isAbsent(choice)) return {};
  if (choice === "auto" || choice === "none") return { render: choice };
  if (choice === "required") return { render: needTools("required", tools) };
  if (isRecord(choice) && choice.type === "function") {
    const f = choice.function;
    const name = isRecord(f) ? f.name : undefined;
    if (typeof name !== "string") {
      throw badField("tool_choice.function.name", "must name one of the tools");
    }
    return forceTool(name, tools, "tool_choice.function.name");
  }
  if (isRecord(choice) && (choice.type === "allowed_tools" || choice.type === "custom")) {
    throw unsupported("tool_choice", `${choice.type} tool choices are not supported`);
  }
  throw badField(
    "tool_choice",
    'must be "auto", "required", "none" or {"type": "function", "function": {"name": ...}}',
  );
}

function needTools(choice: ToolChoice, tools: unknown[] | undefined): ToolChoice {
  if (!tools || tools.length === 0) {
    throw badField("tool_choice", `${choice} needs tools; the request declares none`);
  }
  return choice;
}

/** A plan that forces `name`, which must be one of the declared tools. */
export function forceTool(name: string, tools: unknown[] | undefined, param: string): ChoicePlan {
  const names = toolNames(tools);
  if (!names.includes(name)) {
    throw badField(
      param,
      `no tool is named ${JSON.stringify(name)} (declared: ${names.join(", ") || "none"})`,
    );
  }
  return { render: "required", force: name };
}

function parseResponseFormat(format: unknown): ResponseFormat | undefined {
  if (isAbsent(format)) return undefined;
  if (!isRecord(format) || typeof format.type !== "string") {
    throw badField("response_format", 'must be an object with a "type"');
  }
  if (format.type === "json_schema") {
    const js = format.json_schema;
    if (!isRecord(js)) throw badField("response_format.json_schema", "must be an object");
    optional<string>(js, "name", "string", "a string", "response_format.json_schema.");
    optional<boolean>(js, "strict", "boolean", "true or false", "response_format.json_schema.");
    optionalRecord(js, "schema", "response_format.json_schema.");
  } else if (format.type !== "text" && format.type !== "json_object") {
    throw badField("response_format.type", 'must be "text", "json_object" or "json_schema"');
  }
  return format as ResponseFormat;
}

// ---- responses ----

type FinishReason = "stop" | "length" | "tool_calls";

/** OpenAI usage; `cached_tokens` counts prompt tokens resumed from a retained state. */
interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
  completion_tokens_details: { reasoning_tokens: number };
}

/** A tool call in OpenAI's shape: arguments are a JSON string. */
interface OpenAiToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

function usageOf(result: GenerationResult | GenerationResult[]): Usage {
  // n choices: one prompt, every choice's completion.
  const all = Array.isArray(result) ? result : [result];
  const u = all[0].usage;
  const completion = all.reduce((a, r) => a + r.usage.completion, 0);
  return {
    prompt_tokens: u.prompt,
    completion_tokens: completion,
    total_tokens: u.prompt + completion,
    prompt_tokens_details: { cached_tokens: u.cached },
    completion_tokens_details: {
      reasoning_tokens: all.reduce((a, r) => a + r.usage.reasoning, 0),
    },
  };
}

function openAiToolCall(call: ToolCallOut): OpenAiToolCall {
  return {
    id: `call_${call.id}`,
    type: "function",
    function: { name: call.name, arguments: call.json },
  };
}

/** `tool_calls` when the model called tools (and was not cut off), else how it ended. */
function finishReasonOf(result: GenerationResult): FinishReason {
  if (result.ended === "length") return "length";
  return result.toolCalls.length > 0 ? "tool_calls" : "stop";
}

/**
 * The k3 extension field: the exact token ids, the request's timing, parser notes (n
 * choices: choice 0's, and every choice's under `choices`).
 */
export function k3Field(result: GenerationResult | GenerationResult[]): Record<string, unknown> {
  if (Array.isArray(result)) {
    const first = k3Field(result[0]);
    return result.length === 1 ? first : { ...first, choices: result.map((r) => k3Field(r)) };
  }
  const field: Record<string, unknown> = {
    prompt_ids: result.prepared.promptIds,
    completion_ids: result.completionIds,
    timing: result.timing,
  };
  if (result.prepared.prefill.length > 0) field.prefill_ids = result.prepared.prefill;
  if (result.malformed.length > 0) field.malformed_tool_calls = result.malformed;
  return field;
}

/** One OpenAI chat logprob entry. */
export function chatLogprob(lp: TokenLogprob) {
  return {
    token: lp.token,
    logprob: lp.logprob,
    bytes: lp.bytes,
    top_logprobs: lp.top.map((t) => ({ token: t.token, logprob: t.logprob, bytes: t.bytes })),
  };
}

/** The fields OpenAI puts first in every completion and chunk (not the internal token count). */
function openAiHead(meta: ResponseMeta) {
  return { id: meta.id, created: meta.created, model: meta.model };
}

/** A whole (non-streamed) chat completion: one choice per result (n). */
function chatCompletion(
  meta: ResponseMeta,
  request: OpenAiRequest,
  result: GenerationResult | GenerationResult[],
) {
  const results = Array.isArray(result) ? result : [result];
  return {
    ...openAiHead(meta),
    object: "chat.completion",
    choices: results.map((r, index) => {
      const calls = r.toolCalls.map(openAiToolCall);
      const message: Record<string, unknown> = {
        role: "assistant",
        content: r.content,
        reasoning_content: r.reasoning,
        refusal: null,
      };
      if (calls.length > 0) message.tool_calls = calls;
      return {
        index,
        message,
        logprobs: request.logprobs ? { content: r.logprobs.map(chatLogprob), refusal: null } : null,
        finish_reason: finishReasonOf(r),
      };
    }),
    usage: usageOf(results),
    k3: k3Field(results),
  };
}

/** The chunks of a streamed chat completion, built as the generation goes. */
class ChatChunks {
  #calls = 0;

  /** `index`: the choice these chunks are of (n > 1). */
  constructor(readonly meta: ResponseMeta, readonly request: OpenAiRequest, readonly index = 0) {}

  /** The first chunk: the role. */
  start() {
    return [this.#chunk({ role: "assistant", content: "" })];
  }

  /** What one token step added: reasoning, content (with its logprobs), finished calls. */
  delta(d: GenerationDelta) {
    const out = [];
    if (d.reasoning) out.push(this.#chunk({ reasoning_content: d.reasoning }));
    if (d.content || (this.request.logprobs && d.logprobs.length > 0)) {
      const logprobs = this.request.logprobs
        ? { content: d.logprobs.map(chatLogprob), refusal: null }
        : null;
      out.push(this.#chunk({ content: d.content }, null, logprobs));
    }
    if (d.toolCalls.length > 0) {
      const tool_calls = d.toolCalls.map((c) => ({ index: this.#calls++, ...openAiToolCall(c) }));
      out.push(this.#chunk({ tool_calls }));
    }
    return out;
  }

  /** The closing chunk, then usage when asked for. */
  end(result: GenerationResult) {
    const out: unknown[] = [this.#chunk({}, finishReasonOf(result))];
    if (this.request.includeUsage) {
      out.push({
        ...openAiHead(this.meta),
        object: "chat.completion.chunk",
        choices: [],
        usage: usageOf(result),
        k3: k3Field(result),
      });
    }
    return out;
  }

  #chunk(
    delta: Record<string, unknown>,
    finish: FinishReason | null = null,
    logprobs: unknown = null,
  ) {
    return {
      ...openAiHead(this.meta),
      object: "chat.completion.chunk",
      choices: [{ index: this.index, delta, logprobs, finish_reason: finish }],
    };
  }
}

/** Legacy completions logprobs: parallel lists, alternatives as {token: logprob}. */
function completionLogprobs(lps: TokenLogprob[], offsets: number[]) {
  return {
    tokens: lps.map((l) => l.token),
    token_logprobs: lps.map((l) => l.logprob),
    // Two alternatives with the same text (e.g. parts of characters, both U+FFFD) share one
    // key: the more likely one is kept.
    top_logprobs: lps.map((l) => {
      const top: Record<string, number> = {};
      for (const t of l.top) if (!(t.token in top)) top[t.token] = t.logprob;
      return top;
    }),
    text_offset: offsets,
  };
}

/** A whole text completion: one choice per result (n). */
function textCompletion(
  meta: ResponseMeta,
  request: OpenAiRequest,
  result: GenerationResult | GenerationResult[],
) {
  const results = Array.isArray(result) ? result : [result];
  return {
    ...openAiHead(meta),
    object: "text_completion",
    choices: results.map((r, index) => ({
      index,
      text: r.content,
      logprobs: request.logprobs ? completionLogprobs(r.logprobs, r.textOffsets) : null,
      finish_reason: r.ended === "length" ? "length" : "stop",
    })),
    usage: usageOf(results),
    k3: k3Field(results),
  };
}

/** The chunks of a streamed text completion. */
class TextChunks {
  #offset = 0;
  /** `index`: the choice these chunks are of (n > 1). */
  constructor(readonly meta: ResponseMeta, readonly request: OpenAiRequest, readonly index = 0) {}

  start() {
    return [];
  }

  delta(d: GenerationDelta) {
    if (!d.text && !(this.request.logprobs && d.logprobs.length)) return [];
    let logprobs = null;
    if (this.request.logprobs) {
      const offsets = d.logprobs.map(() => this.#offset);
      logprobs = completionLogprobs(d.logprobs, offsets);
    }
    this.#offset += [...d.text].length;
    return [this.#chunk(d.text, null, logprobs)];
  }

  end(result: GenerationResult) {
    const out: unknown[] = [this.#chunk("", result.ended === "length" ? "length" : "stop")];
    if (this.request.includeUsage) {
      out.push({
        ...openAiHead(this.meta),
        object: "text_completion",
        choices: [],
        usage: usageOf(result),
        k3: k3Field(result),
      });
    }
    return out;
  }

  #chunk(text: string, finish: string | null, logprobs: unknown = null) {
    return {
      ...openAiHead(this.meta),
      object: "text_completion",
      choices: [{ index: this.index, text, logprobs, finish_reason: finish }],
    };
  }
}

/** One entry of GET /v1/models. */
export function modelEntry(id: string, created: number) {
  return { id, object: "model", created, owned_by: "k3" };
}

/** POST /v1/chat/completions. */
export const CHAT_API: WireFormat<OpenAiRequest> = {
  idPrefix: "chatcmpl-",
  sse: "data",
  parse: (body) => parseChatRequest(body),
  whole: chatCompletion,
  stream: (meta, request) => withErrors(new ChatChunks(meta, request)),
  choices: {
    count: (request) => request.n,
    whole: chatCompletion,
    stream: (meta, request, index) =>
      withErrors(new ChatChunks(meta, { ...request, includeUsage: false }, index)),
    usage: (meta, request, results) => usageChunks(meta, request, results, "chat.completion.chunk"),
  },
};

/** POST /v1/completions. */
export const COMPLETIONS_API: WireFormat<OpenAiRequest> = {
  idPrefix: "cmpl-",
  sse: "data",
  parse: parseCompletionRequest,
  whole: textCompletion,
  stream: (meta, request) => withErrors(new TextChunks(meta, request)),
  choices: {
    count: (request) => request.n,
    whole: textCompletion,
    stream: (meta, request, index) =>
      withErrors(new TextChunks(meta, { ...request, includeUsage: false }, index)),
    usage: (meta, request, results) => usageChunks(meta, request, results, "text_completion"),
  },
};

/** n > 1, streamed: the one closing usage chunk over every choice, when asked for. */
function usageChunks(
  meta: ResponseMeta,
  request: OpenAiRequest,
  results: GenerationResult[],
  object: string,
): unknown[] {
  if (!request.includeUsage) return [];
  return [{
    ...openAiHead(meta),
    object,
    choices: [],
    usage: usageOf(results),
    k3: k3Field(results),
  }];
}

/** A mid-stream error, as OpenAI streams it: one `data: {"error": ...}` event. */
function withErrors(chunks: Omit<StreamWriter, "error">): StreamWriter {
  return {
    start: () => chunks.start(),
    delta: (d) => chunks.delta(d),
    end: (r) => chunks.end(r),
    error: (e) => [errorBody(e)],
  };
}
