/**
 * The OpenAI wire format: request bodies checked and turned into k3's terms, and the response,
 * chunk and error objects built from what the engine produced. No I/O here, so every shape can
 * be unit-tested without a server.
 */
import { ExitCode, K3Error } from "../errors.ts";
import type {
  ChatMessage,
  RenderOptions,
  ResponseFormat,
  ThinkingEffort,
  ToolChoice,
} from "../text/chat.ts";
import type { ParsedOutput, ParsedToolCall } from "../text/parse.ts";
import type { SamplingOptions } from "../text/sampler.ts";

// ---- errors ----

/** A failure the client caused or sees, with its HTTP status and OpenAI error fields. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = "invalid_request_error",
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** A 400 about one request field. */
export function badField(param: string, message: string): ApiError {
  return new ApiError(400, `${param}: ${message}`, "invalid_request_error", param);
}

/** Any thrown value as an ApiError: k3's bad-input errors are the client's (400), the rest ours. */
export function apiErrorOf(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof K3Error && e.exitCode === ExitCode.badInput) return new ApiError(400, e.message);
  const message = e instanceof Error ? e.message : String(e);
  return new ApiError(500, `internal error: ${message}`, "server_error");
}

/** The OpenAI error body. */
export function errorBody(e: ApiError): {
  error: { message: string; type: string; param: string | null; code: string | null };
} {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

// ---- requests ----

/** What both endpoints share: how much to generate, how, and how to deliver it. */
export interface GenerationRequest {
  /** The `model` field, if the client sent one. */
  model?: string;
  /** Absent: up to the end of the context budget. */
  maxTokens?: number;
  stop: string[];
  sampling: SamplingOptions;
  stream: boolean;
  /** `stream_options.include_usage`: a last chunk carrying usage. */
  includeUsage: boolean;
}

/** A checked POST /v1/chat/completions body. */
export interface ChatRequest extends GenerationRequest {
  messages: ChatMessage[];
  render: RenderOptions;
}

/** A checked POST /v1/completions body. */
export interface CompletionRequest extends GenerationRequest {
  prompt: string;
}

type Body = Record<string, unknown>;

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);
const MAX_STOPS = 16;

/** Checks a chat body; anything wrong is a 400 naming the field. */
export function parseChatRequest(body: Body): ChatRequest {
  return {
    ...parseGeneration(body),
    messages: parseMessages(body.messages),
    render: {
      ...parseThinking(body),
      tools: parseTools(body.tools),
      toolChoice: parseToolChoice(body.tool_choice),
      responseFormat: parseResponseFormat(body.response_format),
    },
  };
}

/** Checks a completions body: `prompt` must be one string (or a list holding one). */
export function parseCompletionRequest(body: Body): CompletionRequest {
  let prompt = body.prompt;
  if (Array.isArray(prompt) && prompt.length === 1) prompt = prompt[0];
  if (typeof prompt !== "string" || prompt === "") {
    throw badField("prompt", "must be a non-empty string (one prompt per request)");
  }
  return { ...parseGeneration(body), prompt };
}

function parseGeneration(body: Body): GenerationRequest {
  if (body.n !== undefined && body.n !== null && body.n !== 1) {
    throw badField("n", "only n = 1 is supported");
  }
  const model = optional<string>(body, "model", "string", "a string");
  const maxTokens = optionalInt(body, "max_completion_tokens", 1) ??
    optionalInt(body, "max_tokens", 1);
  const streamOptions = body.stream_options;
  if (streamOptions !== undefined && streamOptions !== null && !isRecord(streamOptions)) {
    throw badField("stream_options", "must be an object");
  }
  return {
    model,
    maxTokens,
    stop: parseStop(body.stop),
    sampling: {
      temperature: optionalNumber(body, "temperature", 0, 2),
      topP: optionalNumber(body, "top_p", Number.MIN_VALUE, 1),
      topK: optionalInt(body, "top_k", 0),
      minP: optionalNumber(body, "min_p", 0, 1),
      seed: optionalInt(body, "seed", -Number.MAX_SAFE_INTEGER),
    },
    stream: optional<boolean>(body, "stream", "boolean", "true or false") ?? false,
    includeUsage: isRecord(streamOptions) && streamOptions.include_usage === true,
  };
}

function parseStop(stop: unknown): string[] {
  if (stop === undefined || stop === null) return [];
  const list = typeof stop === "string" ? [stop] : stop;
  if (
    !Array.isArray(list) || list.length > MAX_STOPS ||
    list.some((s) => typeof s !== "string" || s === "")
  ) {
    throw badField("stop", `must be a non-empty string or a list of up to ${MAX_STOPS} of them`);
  }
  return list;
}

/** Messages: a non-empty list of objects with a known role and text-only content. */
function parseMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw badField("messages", "must be a non-empty list of messages");
  }
  value.forEach((m, i) => {
    if (!isRecord(m)) throw badField(`messages[${i}]`, "must be an object");
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw badField(`messages[${i}].role`, `must be one of ${[...ROLES].join(", ")}`);
    }
    checkContent(m.content, `messages[${i}].content`);
  });
  return value as ChatMessage[];
}

/** Content is a string, null, or a list of text parts; images are refused (text-only engine). */
function checkContent(content: unknown, where: string): void {
  if (content === undefined || content === null || typeof content === "string") return;
  if (!Array.isArray(content)) throw badField(where, "must be a string, a list of parts, or null");
  content.forEach((part, k) => {
    const type = isRecord(part) ? part.type : undefined;
    if (type === "image_url" || type === "image" || type === "input_image") {
      throw badField(`${where}[${k}]`, "image content is not supported: this server is text-only");
    }
    if (type !== "text" || typeof part.text !== "string") {
      throw badField(`${where}[${k}]`, 'must be {"type": "text", "text": "..."}');
    }
  });
}

/**
 * The thinking switch: `chat_template_kwargs.thinking` (true/false) or `reasoning_effort`
 * ("none" turns thinking off; "low", "high", "max"; OpenAI's "medium" maps to "high", since
 * K3's renderer has no medium). Absent: thinking on at effort "max", the renderer's default.
 */
export function parseThinking(body: Body): Pick<RenderOptions, "thinking" | "thinkingEffort"> {
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && !isRecord(kwargs)) {
    throw badField("chat_template_kwargs", "must be an object");
  }
  const switchOn = isRecord(kwargs) ? kwargs.thinking : undefined;
  if (switchOn !== undefined && typeof switchOn !== "boolean") {
    throw badField("chat_template_kwargs.thinking", "must be true or false");
  }
  const effort = body.reasoning_effort;
  if (effort === undefined || effort === null) return { thinking: switchOn };
  const efforts: Record<string, ThinkingEffort | "none"> = {
    none: "none",
    low: "low",
    medium: "high",
    high: "high",
    max: "max",
  };
  const mapped = typeof effort === "string" ? efforts[effort] : undefined;
  if (mapped === undefined) {
    throw badField("reasoning_effort", 'must be "none", "low", "medium", "high" or "max"');
  }
  if (mapped === "none") return { thinking: false };
  return { thinking: switchOn ?? true, thinkingEffort: mapped };
}

function parseTools(tools: unknown): unknown[] | undefined {
  if (tools === undefined || tools === null) return undefined;
  if (!Array.isArray(tools) || tools.some((t) => !isRecord(t))) {
    throw badField("tools", "must be a list of tool objects");
  }
  return tools;
}

function parseToolChoice(choice: unknown): ToolChoice | undefined {
  if (choice === undefined || choice === null) return undefined;
  if (choice === "auto" || choice === "required" || choice === "none") return choice;
  throw badField(
    "tool_choice",
    'must be "auto", "required" or "none" (naming one function is not supported)',
  );
}

function parseResponseFormat(format: unknown): ResponseFormat | undefined {
  if (format === undefined || format === null) return undefined;
  if (!isRecord(format) || typeof format.type !== "string") {
    throw badField("response_format", 'must be an object with a "type"');
  }
  return format as ResponseFormat;
}

// ---- field helpers ----

function optional<T extends string | number | boolean>(
  body: Body,
  key: string,
  type: "string" | "number" | "boolean",
  what: string,
): T | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  const actual = typeof v;
  if (actual !== type) throw badField(key, `must be ${what}`);
  return v as T;
}

function optionalNumber(body: Body, key: string, min: number, max: number): number | undefined {
  const v = optional<number>(body, key, "number", "a number");
  if (v !== undefined && !(v >= min && v <= max)) {
    throw badField(key, `must be from ${min} to ${max}, got ${v}`);
  }
  return v;
}

function optionalInt(body: Body, key: string, min: number): number | undefined {
  const v = optional<number>(body, key, "number", "a whole number");
  if (v !== undefined && (!Number.isSafeInteger(v) || v < min)) {
    throw badField(key, `must be a whole number of at least ${min}, got ${v}`);
  }
  return v;
}

/** True for a plain JSON object. */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

// ---- responses ----

/** Fields every response object and chunk of one request shares. */
export interface ResponseMeta {
  id: string;
  created: number;
  model: string;
}

export type FinishReason = "stop" | "length" | "tool_calls";

/** OpenAI usage; `cached_tokens` counts prompt tokens resumed from a retained state. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** A tool call in OpenAI's shape: arguments are a JSON string. */
export interface OpenAiToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** An assistant message as the API returns it. */
export interface AssistantMessage {
  role: "assistant";
  content: string;
  reasoning_content: string | null;
  tool_calls?: OpenAiToolCall[];
}

export function usageOf(prompt: number, completion: number, cached: number): Usage {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

/** Parsed tool calls in OpenAI's shape; a raw `json` block is passed through as the string. */
export function toolCallsOf(
  calls: ParsedToolCall[],
  newId: () => string = newToolCallId,
): OpenAiToolCall[] {
  return calls.map((c) => ({
    id: newId(),
    type: "function",
    function: {
      name: c.name,
      arguments: typeof c.arguments === "string" ? c.arguments : JSON.stringify(c.arguments),
    },
  }));
}

/** A fresh `call_...` id. */
export function newToolCallId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

/** The assistant message for a parse of the whole output. */
export function assistantMessage(
  parsed: ParsedOutput,
  toolCalls: OpenAiToolCall[],
): AssistantMessage {
  const message: AssistantMessage = {
    role: "assistant",
    content: parsed.content,
    reasoning_content: parsed.reasoning,
  };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  return message;
}

/** `tool_calls` when the model called tools, else how generation ended. */
export function finishReasonOf(ended: "stop" | "length", toolCalls: number): FinishReason {
  return toolCalls > 0 ? "tool_calls" : ended;
}

/** A whole (non-streamed) chat completion. `k3` carries the token ids and timings. */
export function chatCompletion(
  meta: ResponseMeta,
  message: AssistantMessage,
  finish: FinishReason,
  usage: Usage,
  k3: unknown,
) {
  return {
    ...meta,
    object: "chat.completion",
    choices: [{ index: 0, message, logprobs: null, finish_reason: finish }],
    usage,
    k3,
  };
}

/** One streamed piece of a chat completion. */
export interface ChatDelta {
  role?: "assistant";
  content?: string;
  reasoning_content?: string;
  tool_calls?: (OpenAiToolCall & { index: number })[];
}

export function chatChunk(meta: ResponseMeta, delta: ChatDelta, finish: FinishReason | null) {
  return {
    ...meta,
    object: "chat.completion.chunk",
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
}

/** The last chunk when `stream_options.include_usage` is set: no choices, only usage. */
export function usageChunk(meta: ResponseMeta, object: string, usage: Usage, k3: unknown) {
  return { ...meta, object, choices: [], usage, k3 };
}

/** A whole text completion. */
export function textCompletion(
  meta: ResponseMeta,
  text: string,
  finish: FinishReason,
  usage: Usage,
  k3: unknown,
) {
  return {
    ...meta,
    object: "text_completion",
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish }],
    usage,
    k3,
  };
}

export function textChunk(meta: ResponseMeta, text: string, finish: FinishReason | null) {
  return {
    ...meta,
    object: "text_completion",
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish }],
  };
}

/** One entry of GET /v1/models. */
export function modelEntry(id: string, created: number) {
  return { id, object: "model", created, owned_by: "k3" };
}
