/**
 * The Anthropic Messages API (POST /v1/messages): `system`, `messages` with content blocks
 * (text, tool_use, tool_result, thinking), tools, tool_choice, the thinking switch, and the
 * answer as content blocks, whole or as the documented event stream (message_start, ping,
 * content_block_start / content_block_delta (thinking_delta, signature_delta, text_delta,
 * input_json_delta) / content_block_stop, message_delta with stop_reason and usage,
 * message_stop). Errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
 */
import type { ChatMessage, ContentPart, ThinkingEffort, ToolCall } from "../text/chat.ts";
import type { GenerationDelta, GenerationResult, ToolCallOut } from "./generation.ts";
import { checkFunction, type ChoicePlan, forceTool, k3Field } from "./openai.ts";
import { declaredTools, toolsGrammar } from "./strict_tools.ts";
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
import { decodeReasoning, encodeReasoning } from "./responses.ts";
import type { ResponseMeta, StreamWriter, WireFormat, WireRequest } from "./wire.ts";

// ---- errors ----

/** Anthropic's error type for an HTTP status. */
function anthropicErrorType(status: number): string {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

export function anthropicErrorBody(e: ApiError) {
  return { type: "error", error: { type: anthropicErrorType(e.status), message: e.message } };
}

// ---- requests ----

const MESSAGES_FIELDS: FieldPolicy = {
  handled: [
    ...SAMPLING_FIELDS,
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "stream",
    "thinking",
    "tool_choice",
    "tools",
    "output_config",
  ],
  informational: ["metadata", "service_tier", "cache_control", "inference_geo", "speed"],
  refused: {
    container: never("containers (code execution) are not supported"),
    mcp_servers: never("MCP servers are not supported"),
    context_management: never("context management is not supported"),
    diagnostics: never("prompt-cache diagnostics are not supported"),
  },
};

interface MessagesRequest extends WireRequest {
  /** thinking.display: "omitted" sends the thinking only inside the signature. */
  omitThinking: boolean;
}

const THINKING_TAG = "k3r1.";

/**
 * The thinking switch: `{type: "enabled", budget_tokens}` (at most that many thinking tokens:
 * then k3 closes the think channel itself), `{type: "adaptive"}` (K3 decides), `{type:
 * "disabled"}`. Absent: K3's default, thinking on. `output_config.effort` sets K3's effort
 * (low; medium and high are "high"; xhigh and max are "max").
 */
function parseThinking(body: Body): {
  thinking: boolean;
  effort?: ThinkingEffort;
  budget?: number;
  omit: boolean;
} {
  const t = optionalRecord(body, "thinking");
  const output = optionalRecord(body, "output_config");
  let effort: ThinkingEffort | undefined;
  if (output) {
    checkFields(output, {
      handled: ["effort"],
      informational: [],
      refused: {
        format: never("output formats are not supported; describe the format in the prompt"),
      },
    }, "output_config.");
    const e = output.effort;
    const efforts: Record<string, ThinkingEffort> = {
      low: "low",
      medium: "high",
      high: "high",
      xhigh: "max",
      max: "max",
    };
    if (!isAbsent(e)) {
      effort = typeof e === "string" ? efforts[e] : undefined;
      if (!effort) {
        throw badField("output_config.effort", 'must be "low", "medium", "high", "xhigh" or "max"');
      }
    }
  }
  if (!t) return { thinking: true, effort, omit: false };
  const display = t.display;
  if (!isAbsent(display) && display !== "summarized" && display !== "omitted") {
    throw badField("thinking.display", 'must be "summarized" or "omitted"');
  }
  if (t.type === "disabled") return { thinking: false, omit: false };
  if (t.type === "adaptive") return { thinking: true, effort, omit: display === "omitted" };
  if (t.type === "enabled") {
    const budget = optionalInt(t, "budget_tokens", 1, Number.MAX_SAFE_INTEGER, "thinking.");
    if (budget === undefined) throw badField("thinking.budget_tokens", "is required");
    return { thinking: true, effort, budget, omit: display === "omitted" };
  }
  throw unsupported("thinking.type", 'must be "enabled", "adaptive" or "disabled"');
}

function parseMessagesRequest(body: Body): MessagesRequest {
  checkFields(body, MESSAGES_FIELDS);
  const maxTokens = optionalInt(body, "max_tokens", 1);
  if (maxTokens === undefined) throw badField("max_tokens", "is required");
  const tools = parseTools(body.tools);
  const choice = parseToolChoice(body.tool_choice, tools);
  const thinking = parseThinking(body);
  if (thinking.budget !== undefined && thinking.budget >= maxTokens) {
    throw badField("thinking.budget_tokens", `must be less than max_tokens (${maxTokens})`);
  }
  const messages = [...systemMessages(body.system), ...chatMessages(body.messages)];
  return {
    model: optional<string>(body, "model", "string", "a string"),
    stream: optional<boolean>(body, "stream", "boolean", "true or false") ?? false,
    omitThinking: thinking.omit,
    spec: {
      input: {
        kind: "chat",
        messages,
        render: {
          thinking: thinking.thinking,
          thinkingEffort: thinking.effort,
          tools: tools.map(asChatTool),
          toolChoice: choice.plan.render,
        },
        forceTool: choice.plan.force,
        thinkingBudget: thinking.budget,
      },
      maxTokens,
      maxTokensField: "max_tokens",
      stops: parseStops(body.stop_sequences, "stop_sequences", 64),
      sampling: parseSampling(body, 1),
      maxToolCalls: choice.plan.force !== undefined || choice.single ? 1 : undefined,
      grammar: toolsGrammar(
        declaredTools(tools, "input_schema"),
        choice.plan,
        choice.single ? 1 : undefined,
        undefined,
      ),
    },
  };
}

/** Custom tools `{name, description?, input_schema}`; server tools are refused. */
function parseTools(value: unknown): Body[] {
  if (isAbsent(value)) return [];
  if (!Array.isArray(value)) throw badField("tools", "must be a list of tools");
  return value.map((t, i) => {
    const at = `tools[${i}]`;
    if (!isRecord(t)) throw badField(at, "must be an object");
    if (!isAbsent(t.type) && t.type !== "custom") {
      throw unsupported(`${at}.type`, `server tools (${JSON.stringify(t.type)}) are not supported`);
    }
    if (typeof t.name !== "string" || t.name === "") {
      throw badField(`${at}.name`, "must be a non-empty string");
    }
    if (!isRecord(t.input_schema)) {
      throw badField(`${at}.input_schema`, "must be a JSON schema object");
    }
    checkFunction(t, at, "input_schema");
    return t;
  });
}

/** The chat shape the K3 renderer declares tools in (the same prompt as chat completions). */
function asChatTool(t: Body): unknown {
  const f: Body = { name: t.name };
  if (!isAbsent(t.description)) f.description = t.description;
  f.parameters = t.input_schema;
  return { type: "function", function: f };
}

/** auto, any (K3's "required"), tool (forced), none; disable_parallel_tool_use: one call. */
function parseToolChoice(value: unknown, tools: Body[]): { plan: ChoicePlan; single: boolean } {
  if (isAbsent(value)) return { plan: {}, single: false };
  if (!isRecord(value)) throw badField("tool_choice", "must be an object with a type");
  const single = optional<boolean>(
    value,
    "disable_parallel_tool_use",
    "boolean",
    "true or false",
    "tool_choice.",
  ) ?? false;
  if (value.type === "auto") return { plan: { render: "auto" }, single };
  if (value.type === "none") return { plan: { render: "none" }, single };
  if (value.type === "any") {
    if (tools.length === 0) throw badField("tool_choice", "any needs tools; none are declared");
    return { plan: { render: "required" }, single };
  }
  if (value.type === "tool") {
    if (typeof value.name !== "string") throw badField("tool_choice.name", "must name a tool");
    return { plan: forceTool(value.name, tools, "tool_choice.name"), single };
  }
  throw badField("tool_choice.type", 'must be "auto", "any", "tool" or "none"');
}

function systemMessages(system: unknown): ChatMessage[] {
  if (isAbsent(system)) return [];
  if (typeof system === "string") return [{ role: "system", content: system }];
  if (!Array.isArray(system)) throw badField("system", "must be a string or a list of text blocks");
  const parts = system.map((block, k) => textBlock(block, `system[${k}]`));
  return [{ role: "system", content: parts }];
}

function textBlock(block: unknown, at: string): ContentPart {
  if (!isRecord(block) || block.type !== "text" || typeof block.text !== "string") {
    throw badField(at, 'must be {"type": "text", "text": "..."}');
  }
  return { type: "text", text: block.text };
}

/**
 * Anthropic turns as K3 chat messages. A user turn's tool_result blocks become tool messages
 * and its text a user message; an assistant turn's thinking is its reasoning_content, its
 * text the content, its tool_use blocks the tool calls. Consecutive turns of one role are
 * combined, as Anthropic does. A last assistant turn (a prefill) is refused.
 */
function chatMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw badField("messages", "must be a non-empty list of messages");
  }
  const out: ChatMessage[] = [];
  value.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (!isRecord(m)) throw badField(at, "must be an object");
    const blocks = typeof m.content === "string"
      ? [{ type: "text", text: m.content }]
      : Array.isArray(m.content)
      ? m.content
      : undefined;
    if (!blocks) throw badField(`${at}.content`, "must be a string or a list of content blocks");
    if (m.role === "user") userTurn(out, blocks, `${at}.content`);
    else if (m.role === "assistant") {
      if (i === value.length - 1) {
        throw unsupported(
          at,
          "prefill (a last assistant message) is not supported: end with a user message",
        );
      }
      assistantTurn(out, blocks, `${at}.content`);
    } else throw badField(`${at}.role`, 'must be "user" or "assistant"');
  });
  return out;
}

function userTurn(out: ChatMessage[], blocks: unknown[], at: string): void {
  blocks.forEach((block, k) => {
    const where = `${at}[${k}]`;
    const type = isRecord(block) ? block.type : undefined;
    if (type === "tool_result") {
      const b = block as Body;
      if (typeof b.tool_use_id !== "string") {
        throw badField(`${where}.tool_use_id`, "must be a string");
      }
      const text = toolResultText(b.content, `${where}.content`);
      out.push({
        role: "tool",
        tool_call_id: b.tool_use_id,
        content: b.is_error === true ? `Error: ${text}` : text,
      });
    } else if (type === "text") {
      const part = textBlock(block, where);
      const last = out.at(-1);
      if (last?.role === "user" && Array.isArray(last.content)) last.content.push(part);
      else out.push({ role: "user", content: [part] });
    } else if (type === "image" || type === "document") {
      throw badField(where, `${type} blocks are not supported: this server is text-only`);
    } else {
      throw unsupported(
        `${where}.type`,
        `${JSON.stringify(type)} blocks are not supported in user turns`,
      );
    }
  });
}

function toolResultText(content: unknown, at: string): string {
  if (isAbsent(content)) return "";
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw badField(at, "must be a string or a list of text blocks");
  return content.map((b, k) => textBlock(b, `${at}[${k}]`).text as string).join("");
}

function assistantTurn(out: ChatMessage[], blocks: unknown[], at: string): void {
  let m = out.at(-1);
  if (m?.role !== "assistant") {
    m = { role: "assistant", content: "" };
    out.push(m);
  }
  const turn = m;
  blocks.forEach((block, k) => {
    const where = `${at}[${k}]`;
    if (!isRecord(block)) throw badField(where, "must be a content block");
    if (block.type === "text") {
      turn.content = `${turn.content ?? ""}${textBlock(block, where).text}`;
    } else if (block.type === "thinking") {
      const text = typeof block.thinking === "string" ? block.thinking : undefined;
      if (text === undefined) throw badField(`${where}.thinking`, "must be a string");
      const signature = typeof block.signature === "string" ? block.signature : "";
      const reasoning = text === "" && signature.startsWith(THINKING_TAG)
        ? decodeReasoning(signature, `${where}.signature`)
        : text;
      turn.reasoning_content = `${turn.reasoning_content ?? ""}${reasoning}`;
    } else if (block.type === "tool_use") {
      if (typeof block.id !== "string") throw badField(`${where}.id`, "must be a string");
      if (typeof block.name !== "string" || block.name === "") {
        throw badField(`${where}.name`, "must be a non-empty string");
      }
      if (!isRecord(block.input)) throw badField(`${where}.input`, "must be an object");
      const call: ToolCall = {
        id: block.id,
        type: "function",
        function: { name: block.name, arguments: block.input },
      };
      turn.tool_calls = [...(turn.tool_calls ?? []), call];
    } else if (block.type === "redacted_thinking") {
      throw unsupported(
        `${where}.type`,
        "redacted_thinking blocks come from Anthropic's models; k3 cannot read them",
      );
    } else {
      throw unsupported(`${where}.type`, `${JSON.stringify(block.type)} blocks are not supported`);
    }
  });
}

// ---- output ----

type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use";

function stopReasonOf(result: GenerationResult): StopReason {
  if (result.ended === "length") return "max_tokens";
  if (result.toolCalls.length > 0) return "tool_use";
  return result.ended === "stop_string" ? "stop_sequence" : "end_turn";
}

/**
 * Anthropic usage: input_tokens excludes the prompt tokens resumed from a retained state
 * (`cached`), which are the cache reads. A stream's message_start and message_delta carry the
 * same input split, so a client that takes either (or both) counts the prompt once, right.
 */
function usageOf(prompt: number, cached: number, completion = 0, reasoning = 0) {
  return {
    input_tokens: prompt - cached,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: cached,
    output_tokens: completion,
    output_tokens_details: { thinking_tokens: reasoning },
  };
}

function resultUsage(result: GenerationResult) {
  const u = result.usage;
  return usageOf(u.prompt, u.cached, u.completion, u.reasoning);
}

/** A tool_use block's input: the arguments object (a raw json block that is one, else {}). */
function inputOf(call: ToolCallOut): Record<string, unknown> {
  if (typeof call.arguments !== "string") return call.arguments;
  try {
    const parsed = JSON.parse(call.arguments);
    return isRecord(parsed) ? parsed : {};
  } catch {
    return {};
  }
}

function toolUse(call: ToolCallOut) {
  return {
    type: "tool_use",
    id: `toolu_${call.id}`,
    name: call.name,
    input: inputOf(call),
    caller: { type: "direct" },
  };
}

function thinkingBlock(request: MessagesRequest, text: string) {
  return {
    type: "thinking",
    thinking: request.omitThinking ? "" : text,
    signature: encodeReasoning(text),
  };
}

function message(meta: ResponseMeta, content: unknown[], result?: GenerationResult) {
  return {
    id: meta.id,
    type: "message",
    role: "assistant",
    model: meta.model,
    content,
    stop_reason: result ? stopReasonOf(result) : null,
    stop_sequence: result?.stop ?? null,
    usage: result ? resultUsage(result) : undefined,
    ...(result ? { k3: k3Field(result) } : {}),
  };
}

function wholeMessage(meta: ResponseMeta, request: MessagesRequest, result: GenerationResult) {
  const content: unknown[] = [];
  if (result.reasoning) content.push(thinkingBlock(request, result.reasoning));
  if (hasTextBlock(result)) content.push({ type: "text", text: result.content, citations: null });
  content.push(...result.toolCalls.map(toolUse));
  return message(meta, content, result);
}

/**
 * Whether the answer has a text block: when it has text, and when it has nothing else. Only
 * tool calls, or thinking that max_tokens cut off before any answer, come without one (as
 * Anthropic answers them: no empty text block).
 */
function hasTextBlock(result: GenerationResult): boolean {
  if (result.content !== "") return true;
  const thinkingCut = result.ended === "length" && (result.reasoning ?? "") !== "";
  return result.toolCalls.length === 0 && !thinkingCut;
}

/** The event stream: one block at a time, in the order of the whole message's content. */
class MessageEvents implements StreamWriter {
  #index = -1;
  #open: "thinking" | "text" | null = null;
  #thinking = "";

  #textSeen = false;

  constructor(readonly meta: ResponseMeta, readonly request: MessagesRequest) {}

  /** Nothing yet: message_start waits for the prompt's reuse, which its usage carries. */
  start() {
    return [];
  }

  started(reusedTokens: number) {
    if (this.#started) return [];
    this.#started = true;
    const start = message(this.meta, []);
    start.usage = usageOf(this.meta.promptTokens, reusedTokens);
    return [{ type: "message_start", message: start }, { type: "ping" }];
  }

  #started = false;

  delta(d: GenerationDelta) {
    const out: unknown[] = [];
    if (d.reasoning) {
      this.#begin("thinking", out);
      this.#thinking += d.reasoning;
      if (!this.request.omitThinking) {
        out.push(this.#delta({ type: "thinking_delta", thinking: d.reasoning }));
      }
    }
    if (d.content) {
      this.#begin("text", out);
      out.push(this.#delta({ type: "text_delta", text: d.content }));
    }
    for (const call of d.toolCalls) {
      this.#close(out);
      this.#index++;
      out.push({
        type: "content_block_start",
        index: this.#index,
        content_block: { ...toolUse(call), input: {} },
      });
      out.push(
        this.#delta({ type: "input_json_delta", partial_json: JSON.stringify(inputOf(call)) }),
      );
      out.push({ type: "content_block_stop", index: this.#index });
    }
    return out;
  }

  end(result: GenerationResult) {
    // Every answer begins with message_start (sent here if the start was not heard).
    const out: unknown[] = this.started(result.usage.cached);
    // As in the whole message: an empty text block when the answer has nothing else.
    if (!this.#textSeen && hasTextBlock(result)) this.#begin("text", out);
    this.#close(out);
    const usage = resultUsage(result);
    out.push({
      type: "message_delta",
      delta: { stop_reason: stopReasonOf(result), stop_sequence: result.stop },
      usage,
    });
    out.push({ type: "message_stop" });
    return out;
  }

  error(e: ApiError) {
    return [anthropicErrorBody(e)];
  }

  #begin(kind: "thinking" | "text", out: unknown[]): void {
    if (this.#open === kind) return;
    this.#close(out);
    this.#index++;
    this.#open = kind;
    if (kind === "text") this.#textSeen = true;
    out.push({
      type: "content_block_start",
      index: this.#index,
      content_block: kind === "thinking"
        ? { type: "thinking", thinking: "", signature: "" }
        : { type: "text", text: "", citations: null },
    });
  }

  #close(out: unknown[]): void {
    if (this.#open === null) return;
    if (this.#open === "thinking") {
      out.push(
        this.#delta({ type: "signature_delta", signature: encodeReasoning(this.#thinking) }),
      );
    }
    out.push({ type: "content_block_stop", index: this.#index });
    this.#open = null;
  }

  #delta(delta: Body) {
    return { type: "content_block_delta", index: this.#index, delta };
  }
}

/** POST /v1/messages. */
export const MESSAGES_API: WireFormat<MessagesRequest> = {
  idPrefix: "msg_",
  sse: "typed",
  ping: { type: "ping" },
  parse: (body) => parseMessagesRequest(body),
  whole: wholeMessage,
  stream: (meta, request) => new MessageEvents(meta, request),
};

/** What POST /v1/messages/count_tokens reads: a Messages request's prompt fields. */
const COUNT_TOKENS_FIELDS: FieldPolicy = {
  handled: ["model", "messages", "system", "thinking", "tool_choice", "tools", "output_config"],
  informational: ["cache_control"],
  refused: MESSAGES_FIELDS.refused,
};

/**
 * A count_tokens body as the Messages request it stands for: the same parser, so the prompt
 * is the one that request would prefill (a forced tool's opening included). It has no
 * max_tokens; the largest one stands in, and the spec leaves the completion budget open.
 */
export function parseCountTokensRequest(body: Body): WireRequest {
  checkFields(body, COUNT_TOKENS_FIELDS);
  const request = parseMessagesRequest({ ...body, max_tokens: Number.MAX_SAFE_INTEGER });
  return { ...request, spec: { ...request.spec, maxTokens: undefined } };
}
