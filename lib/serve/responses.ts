/**
 * The OpenAI Responses API (POST /v1/responses), stateless: `input` (text or items: messages,
 * function calls and their outputs, reasoning) becomes a K3 chat; the answer is a list of
 * output items (reasoning, message, function_call), whole or as the documented event stream
 * (response.created, response.in_progress, response.output_item.added, ...content_part.added,
 * response.reasoning_text.delta / response.output_text.delta / ...function_call_arguments.delta,
 * their .done events, response.output_item.done, response.completed), each with its
 * sequence_number. Nothing is stored: previous_response_id and store: true are 400s; reasoning
 * can travel back in `encrypted_content`, which carries the reasoning text itself.
 */
import type { ChatMessage, ToolCall } from "../text/chat.ts";
import type { GenerationDelta, GenerationResult, TokenLogprob, ToolCallOut } from "./generation.ts";
import {
  chatLogprob,
  checkFunction,
  type ChoicePlan,
  effortOf,
  errorBody,
  forceTool,
  formatGrammar,
  k3Field,
} from "./openai.ts";
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
  optionalNumber,
  optionalRecord,
  parseSampling,
  SAMPLING_FIELDS,
  unsupported,
} from "./request.ts";
import type { ResponseMeta, StreamWriter, WireFormat, WireRequest } from "./wire.ts";
import { declaredTools, toolsGrammar } from "./strict_tools.ts";

const RESPONSES_FIELDS: FieldPolicy = {
  handled: [
    ...SAMPLING_FIELDS,
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tool_calls",
    "reasoning",
    "max_output_tokens",
    "top_logprobs",
    "include",
    "stream",
    "stream_options",
    "text",
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
    previous_response_id: never(
      "k3 serve is stateless and stores no responses: send the whole conversation in input",
    ),
    store: (v) =>
      v === false ? null : "k3 serve stores no responses: send store: false (or omit it)",
    conversation: never("k3 serve keeps no conversations: send them in input"),
    background: (v) => v === false ? null : "background responses are not supported",
    prompt: never("stored prompt templates are not supported"),
    truncation: (v) =>
      v === "disabled" ? null : 'only "disabled" is supported (a prompt over the context is a 400)',
    context_management: never("context management is not supported"),
  },
};

/** A checked Responses request, with what the response object echoes back. */
interface ResponsesRequest extends WireRequest {
  logprobs: boolean;
  /** reasoning.summary: the reasoning is also given as its summary (K3 has no summarizer). */
  summary: string | null;
  effort: string | null;
  encryptedReasoning: boolean;
  echo: {
    instructions: string | null;
    tools: unknown[];
    tool_choice: unknown;
    temperature: number | null;
    top_p: number | null;
    max_output_tokens: number | null;
    parallel_tool_calls: boolean;
    text: unknown;
    top_logprobs: number | null;
    metadata: unknown;
    user: string | null;
  };
}

const INCLUDES = new Set(["reasoning.encrypted_content", "message.output_text.logprobs"]);

function parseResponsesRequest(body: Body): ResponsesRequest {
  checkFields(body, RESPONSES_FIELDS);
  const instructions = optional<string>(body, "instructions", "string", "a string");
  const tools = parseTools(body.tools);
  const choice = parseToolChoice(body.tool_choice, tools);
  const parallel = optional<boolean>(body, "parallel_tool_calls", "boolean", "true or false");
  const maxCalls = optionalInt(body, "max_tool_calls", 1);
  const { effort, effortField, summary } = parseReasoning(body);
  const include = parseInclude(body.include);
  const top = optionalInt(body, "top_logprobs", 0, 20);
  const logprobs = include.has("message.output_text.logprobs") || top !== undefined;
  const text = parseText(body.text);
  const stream = optional<boolean>(body, "stream", "boolean", "true or false") ?? false;
  const streamOptions = optionalRecord(body, "stream_options");
  if (streamOptions) {
    checkFields(
      streamOptions,
      { handled: [], informational: ["include_obfuscation"] },
      "stream_options.",
    );
    optional<boolean>(
      streamOptions,
      "include_obfuscation",
      "boolean",
      "true or false",
      "stream_options.",
    );
  }
  const maxTokens = optionalInt(body, "max_output_tokens", 1);
  const messages = inputMessages(body.input, instructions);
  const thinking = effort === "none" ? false : true;
  return {
    model: optional<string>(body, "model", "string", "a string"),
    stream,
    logprobs,
    summary,
    effort: effortField,
    encryptedReasoning: include.has("reasoning.encrypted_content"),
    spec: {
      input: {
        kind: "chat",
        messages,
        render: {
          thinking,
          thinkingEffort: effort === undefined || effort === "none" ? undefined : effort,
          tools: tools.map(asChatTool),
          toolChoice: choice.render,
          responseFormat: text.format,
        },
        forceTool: choice.force,
      },
      maxTokens,
      maxTokensField: "max_output_tokens",
      stops: [],
      sampling: {
        ...parseSampling(body),
        temperature: optionalNumber(body, "temperature", 0, 2),
      },
      logprobs: logprobs ? top ?? 0 : undefined,
      maxToolCalls: choice.force !== undefined || parallel === false ? 1 : maxCalls,
      grammar: toolsGrammar(
        declaredTools(tools, "parameters"),
        choice,
        parallel === false ? 1 : maxCalls,
        formatGrammar(text.format, "text.format", "text.format.schema"),
      ),
    },
    echo: echoOf(body, { instructions, tools, maxTokens, parallel, top }),
  };
}

/**
 * `reasoning: {effort, summary}` (generate_summary is summary's older name): the effort as
 * the template takes it, and both fields as the response echoes them.
 */
function parseReasoning(body: Body) {
  const reasoning = optionalRecord(body, "reasoning");
  if (reasoning) {
    checkFields(reasoning, {
      handled: ["effort", "summary", "generate_summary"],
      informational: [],
    }, "reasoning.");
  }
  const effort = effortOf(reasoning?.effort, "reasoning.effort");
  const summary = reasoning?.summary ?? reasoning?.generate_summary;
  if (!isAbsent(summary) && !["auto", "concise", "detailed"].includes(summary as string)) {
    throw badField("reasoning.summary", 'must be "auto", "concise" or "detailed"');
  }
  return {
    effort,
    effortField: isAbsent(reasoning?.effort) ? null : reasoning!.effort as string,
    summary: isAbsent(summary) ? null : summary as string,
  };
}

/** What the response object echoes of the request (the checked values, else the defaults). */
function echoOf(
  body: Body,
  checked: {
    instructions?: string;
    tools: Body[];
    maxTokens?: number;
    parallel?: boolean;
    top?: number;
  },
): ResponsesRequest["echo"] {
  return {
    instructions: checked.instructions ?? null,
    tools: checked.tools,
    tool_choice: body.tool_choice ?? "auto",
    temperature: (body.temperature as number | undefined) ?? null,
    top_p: (body.top_p as number | undefined) ?? null,
    max_output_tokens: checked.maxTokens ?? null,
    parallel_tool_calls: checked.parallel ?? true,
    text: isAbsent(body.text) ? { format: { type: "text" } } : body.text,
    top_logprobs: checked.top ?? null,
    metadata: body.metadata ?? {},
    user: (body.user as string | undefined) ?? null,
  };
}

function parseInclude(value: unknown): Set<string> {
  if (isAbsent(value)) return new Set();
  if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) {
    throw badField("include", "must be a list of strings");
  }
  for (const v of value) {
    if (!INCLUDES.has(v)) {
      throw unsupported(
        "include",
        `${JSON.stringify(v)} is not supported (k3 can include ${[...INCLUDES].join(", ")})`,
      );
    }
  }
  return new Set(value);
}

/** `text: {format, verbosity}`: the format as chat's response_format; verbosity medium only. */
function parseText(value: unknown) {
  if (isAbsent(value)) return { format: undefined };
  if (!isRecord(value)) throw badField("text", "must be an object");
  checkFields(value, {
    handled: ["format"],
    informational: [],
    refused: {
      verbosity: (v) =>
        v === "medium" ? null : 'only the default verbosity ("medium") is supported',
    },
  }, "text.");
  const f = value.format;
  if (isAbsent(f)) return { format: undefined };
  if (!isRecord(f)) throw badField("text.format", "must be an object");
  if (f.type === "text") return { format: { type: "text" as const } };
  if (f.type === "json_object") return { format: { type: "json_object" as const } };
  if (f.type === "json_schema") {
    optional<string>(f, "name", "string", "a string", "text.format.");
    const strict = optional<boolean>(f, "strict", "boolean", "true or false", "text.format.");
    if (!isRecord(f.schema)) throw badField("text.format.schema", "must be a JSON schema object");
    return {
      format: { type: "json_schema" as const, json_schema: { schema: f.schema, strict } },
    };
  }
  throw badField("text.format.type", 'must be "text", "json_object" or "json_schema"');
}

/** Function tools `{type: "function", name, description?, parameters?}`. */
function parseTools(value: unknown): Body[] {
  if (isAbsent(value)) return [];
  if (!Array.isArray(value)) throw badField("tools", "must be a list of tools");
  return value.map((t, i) => {
    const at = `tools[${i}]`;
    if (!isRecord(t)) throw badField(at, "must be an object");
    if (t.type !== "function") {
      throw unsupported(
        `${at}.type`,
        `only "function" tools are supported, not ${JSON.stringify(t.type)}`,
      );
    }
    if (typeof t.name !== "string" || t.name === "") {
      throw badField(`${at}.name`, "must be a non-empty string");
    }
    checkFunction(t, at);
    return t;
  });
}

/** The chat shape the K3 renderer declares tools in (the same prompt as chat completions). */
function asChatTool(t: Body): unknown {
  const f: Body = { name: t.name };
  if (!isAbsent(t.description)) f.description = t.description;
  if (!isAbsent(t.parameters)) f.parameters = t.parameters;
  return { type: "function", function: f };
}

function parseToolChoice(choice: unknown, tools: Body[]): ChoicePlan {
  if (isAbsent(choice) || choice === "auto" || choice === "none") {
    return { render: isAbsent(choice) ? undefined : choice as "auto" | "none" };
  }
  if (choice === "required") {
    if (tools.length === 0) {
      throw badField("tool_choice", "required needs tools; none are declared");
    }
    return { render: "required" };
  }
  if (isRecord(choice) && choice.type === "function") {
    if (typeof choice.name !== "string") throw badField("tool_choice.name", "must name a tool");
    return forceTool(choice.name, tools, "tool_choice.name");
  }
  throw unsupported(
    "tool_choice",
    'must be "auto", "none", "required" or {"type": "function", "name": ...}',
  );
}

// ---- input items -> K3 chat messages ----

/** `instructions` (a system message), then `input`: a string, or items. */
function inputMessages(input: unknown, instructions: string | undefined): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (instructions !== undefined) messages.push({ role: "system", content: instructions });
  if (typeof input === "string") {
    messages.push({ role: "user", content: input });
    return messages;
  }
  if (!Array.isArray(input) || input.length === 0) {
    throw badField("input", "must be a string or a non-empty list of items");
  }
  let reasoning: string | undefined;
  /** The assistant turn being built (function calls join the message before them). */
  let assistant: ChatMessage | undefined;
  const openAssistant = (): ChatMessage => {
    if (!assistant) {
      assistant = { role: "assistant", content: "" };
      if (reasoning !== undefined) assistant.reasoning_content = reasoning;
      reasoning = undefined;
      messages.push(assistant);
    }
    return assistant;
  };
  input.forEach((item, i) => {
    const at = `input[${i}]`;
    if (!isRecord(item)) throw badField(at, "must be an object");
    const type = item.type ?? "message";
    if (type === "message") {
      const role = item.role;
      const content = messageText(item.content, `${at}.content`, role === "assistant");
      if (role === "assistant") {
        if (assistant?.tool_calls?.length) assistant = undefined; // a new turn after calls
        const m = openAssistant();
        m.content = `${m.content ?? ""}${content}`;
      } else if (role === "user" || role === "system" || role === "developer") {
        assistant = undefined;
        messages.push({ role, content });
      } else {
        throw badField(`${at}.role`, 'must be "user", "assistant", "system" or "developer"');
      }
    } else if (type === "function_call") {
      for (const key of ["call_id", "name", "arguments"]) {
        if (typeof item[key] !== "string") throw badField(`${at}.${key}`, "must be a string");
      }
      if (item.name === "") throw badField(`${at}.name`, "must be a non-empty string");
      const m = openAssistant();
      const call: ToolCall = {
        id: item.call_id as string,
        type: "function",
        function: { name: item.name as string, arguments: item.arguments as string },
      };
      m.tool_calls = [...(m.tool_calls ?? []), call];
    } else if (type === "function_call_output") {
      if (typeof item.call_id !== "string") throw badField(`${at}.call_id`, "must be a string");
      assistant = undefined;
      messages.push({
        role: "tool",
        tool_call_id: item.call_id,
        content: messageText(item.output, `${at}.output`, false),
      });
    } else if (type === "reasoning") {
      reasoning = reasoningText(item, at);
      if (assistant) assistant = undefined;
    } else if (type === "item_reference") {
      throw unsupported(`${at}.type`, "item references need stored items; k3 serve is stateless");
    } else {
      throw unsupported(`${at}.type`, `${JSON.stringify(type)} items are not supported`);
    }
  });
  return messages;
}

/** Text of a message's content: a string, or input_text / output_text parts. */
function messageText(content: unknown, where: string, assistant: boolean): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw badField(where, "must be a string or a list of text parts");
  return content.map((part, k) => {
    const type = isRecord(part) ? part.type : undefined;
    if (type === "input_image" || type === "input_file" || type === "input_audio") {
      throw badField(
        `${where}[${k}]`,
        "image, file and audio input is not supported: this server is text-only",
      );
    }
    const ok = type === "input_text" ||
      (assistant && (type === "output_text" || type === "refusal"));
    const text = isRecord(part) ? (type === "refusal" ? part.refusal : part.text) : undefined;
    if (!ok || typeof text !== "string") {
      throw badField(
        `${where}[${k}]`,
        `must be {"type": "${assistant ? "output_text" : "input_text"}", "text": "..."}`,
      );
    }
    return text;
  }).join("");
}

/** The reasoning text of a reasoning item: its content, else k3's encrypted_content, else its summary. */
function reasoningText(item: Body, at: string): string {
  const parts = Array.isArray(item.content) ? item.content : [];
  const content = parts.map((p) => isRecord(p) && typeof p.text === "string" ? p.text : "").join(
    "",
  );
  if (content !== "") return content;
  if (typeof item.encrypted_content === "string" && item.encrypted_content !== "") {
    return decodeReasoning(item.encrypted_content, `${at}.encrypted_content`);
  }
  const summary = Array.isArray(item.summary) ? item.summary : [];
  return summary.map((p) => isRecord(p) && typeof p.text === "string" ? p.text : "").join("\n\n");
}

const REASONING_TAG = "k3r1.";

/** Reasoning as an opaque string (it is the text itself, base64: k3 keeps no state). */
export function encodeReasoning(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return REASONING_TAG + btoa(binary);
}

/** The text of {@link encodeReasoning}; anything else is a 400 naming `where`. */
export function decodeReasoning(value: string, where: string): string {
  if (!value.startsWith(REASONING_TAG)) {
    throw badField(where, "was not made by k3 serve (it carries k3's reasoning text)");
  }
  try {
    const binary = atob(value.slice(REASONING_TAG.length));
    return new TextDecoder("utf-8", { fatal: true }).decode(
      Uint8Array.from(binary, (c) => c.charCodeAt(0)),
    );
  } catch {
    throw badField(where, "is damaged");
  }
}

// ---- output ----

/** The id part after the prefix, shared by the ids of a response's items. */
function baseOf(meta: ResponseMeta): string {
  return meta.id.replace(/^resp_/, "");
}

function reasoningItem(
  meta: ResponseMeta,
  request: ResponsesRequest,
  text: string,
  status: string,
) {
  const item: Body = {
    id: `rs_${baseOf(meta)}`,
    type: "reasoning",
    summary: request.summary && text ? [{ type: "summary_text", text }] : [],
    content: text ? [{ type: "reasoning_text", text }] : [],
    status,
  };
  if (request.encryptedReasoning) item.encrypted_content = text ? encodeReasoning(text) : null;
  return item;
}

function outputText(request: ResponsesRequest, text: string, logprobs: TokenLogprob[]) {
  return {
    type: "output_text",
    text,
    annotations: [],
    logprobs: request.logprobs ? logprobs.map(chatLogprob) : [],
  };
}

function messageItem(meta: ResponseMeta, content: unknown[], status: string) {
  return { id: `msg_${baseOf(meta)}`, type: "message", role: "assistant", status, content };
}

function callItem(call: ToolCallOut, status: string, args = call.json) {
  return {
    id: `fc_${call.id}`,
    type: "function_call",
    call_id: `call_${call.id}`,
    name: call.name,
    arguments: args,
    status,
  };
}

function usageOf(result: GenerationResult) {
  const u = result.usage;
  return {
    input_tokens: u.prompt,
    input_tokens_details: { cached_tokens: u.cached },
    output_tokens: u.completion,
    output_tokens_details: { reasoning_tokens: u.reasoning },
    total_tokens: u.prompt + u.completion,
  };
}

/** The output items of a finished generation: reasoning, message, function calls. */
function outputItems(meta: ResponseMeta, request: ResponsesRequest, result: GenerationResult) {
  const status = result.ended === "length" ? "incomplete" : "completed";
  const items: unknown[] = [];
  if (result.reasoning) items.push(reasoningItem(meta, request, result.reasoning, "completed"));
  if (result.content !== "" || result.toolCalls.length === 0) {
    const part = outputText(request, result.content, result.logprobs);
    items.push(messageItem(meta, [part], status));
  }
  for (const call of result.toolCalls) items.push(callItem(call, "completed"));
  return items;
}

/** The response object; `result` absent: the one response.created carries. */
function responseObject(meta: ResponseMeta, request: ResponsesRequest, result?: GenerationResult) {
  const incomplete = result?.ended === "length";
  const output = result ? outputItems(meta, request, result) : [];
  const text = output.flatMap((item) => {
    const m = item as { type: string; content?: { type: string; text: string }[] };
    return m.type === "message" ? m.content!.map((c) => c.text) : [];
  }).join("");
  return {
    id: meta.id,
    object: "response",
    created_at: meta.created,
    status: !result ? "in_progress" : incomplete ? "incomplete" : "completed",
    completed_at: result && !incomplete ? Math.floor(Date.now() / 1000) : null,
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
    model: meta.model,
    output,
    output_text: text,
    previous_response_id: null,
    reasoning: { effort: request.effort, summary: request.summary },
    store: false,
    truncation: "disabled",
    usage: result ? usageOf(result) : null,
    ...request.echo,
    ...(result ? { k3: k3Field(result) } : {}),
  };
}

/** Writes the event stream; item ids and contents agree with the final response object. */
class ResponseEvents implements StreamWriter {
  #seq = 0;
  #index = 0;
  #reasoning?: { index: number; text: string };
  #message?: { index: number; text: string; logprobs: TokenLogprob[] };

  constructor(readonly meta: ResponseMeta, readonly request: ResponsesRequest) {}

  start() {
    const response = responseObject(this.meta, this.request);
    return [
      this.#event("response.created", { response }),
      this.#event("response.in_progress", { response }),
    ];
  }

  delta(d: GenerationDelta) {
    const out: unknown[] = [];
    if (d.reasoning) this.#reasoningDelta(d.reasoning, out);
    if (d.content || (this.request.logprobs && d.logprobs.length > 0)) {
      this.#closeReasoning(out);
      this.#contentDelta(d.content, d.logprobs, out);
    }
    for (const call of d.toolCalls) {
      this.#closeReasoning(out);
      this.#closeMessage(out, "completed");
      this.#call(call, out);
    }
    return out;
  }

  end(result: GenerationResult) {
    const out: unknown[] = [];
    const status = result.ended === "length" ? "incomplete" : "completed";
    this.#closeReasoning(out);
    if (!this.#message && result.content === "" && result.toolCalls.length === 0) {
      this.#contentDelta("", [], out); // an empty answer is still a message
    }
    this.#closeMessage(out, status);
    const response = responseObject(this.meta, this.request, result);
    out.push(this.#event(status === "completed" ? "response.completed" : "response.incomplete", {
      response,
    }));
    return out;
  }

  error(e: ApiError) {
    const { error } = errorBody(e);
    return [this.#event("error", { code: error.code, message: error.message, param: error.param })];
  }

  #reasoningDelta(text: string, out: unknown[]): void {
    const itemId = `rs_${baseOf(this.meta)}`;
    if (!this.#reasoning) {
      this.#reasoning = { index: this.#index++, text: "" };
      const item = reasoningItem(this.meta, this.request, "", "in_progress");
      out.push(
        this.#event("response.output_item.added", { output_index: this.#reasoning.index, item }),
      );
      out.push(this.#event("response.content_part.added", {
        item_id: itemId,
        output_index: this.#reasoning.index,
        content_index: 0,
        part: { type: "reasoning_text", text: "" },
      }));
      if (this.request.summary) {
        out.push(this.#event("response.reasoning_summary_part.added", {
          item_id: itemId,
          output_index: this.#reasoning.index,
          summary_index: 0,
          part: { type: "summary_text", text: "" },
        }));
      }
    }
    const r = this.#reasoning;
    r.text += text;
    const at = { item_id: itemId, output_index: r.index };
    out.push(
      this.#event("response.reasoning_text.delta", { ...at, content_index: 0, delta: text }),
    );
    if (this.request.summary) {
      out.push(
        this.#event("response.reasoning_summary_text.delta", {
          ...at,
          summary_index: 0,
          delta: text,
        }),
      );
    }
  }

  #closeReasoning(out: unknown[]): void {
    const r = this.#reasoning;
    if (!r || r.index < 0) return;
    const itemId = `rs_${baseOf(this.meta)}`;
    const at = { item_id: itemId, output_index: r.index };
    out.push(
      this.#event("response.reasoning_text.done", { ...at, content_index: 0, text: r.text }),
    );
    out.push(this.#event("response.content_part.done", {
      ...at,
      content_index: 0,
      part: { type: "reasoning_text", text: r.text },
    }));
    if (this.request.summary) {
      out.push(
        this.#event("response.reasoning_summary_text.done", {
          ...at,
          summary_index: 0,
          text: r.text,
        }),
      );
      out.push(this.#event("response.reasoning_summary_part.done", {
        ...at,
        summary_index: 0,
        part: { type: "summary_text", text: r.text },
      }));
    }
    const item = reasoningItem(this.meta, this.request, r.text, "completed");
    out.push(this.#event("response.output_item.done", { output_index: r.index, item }));
    r.index = -1; // closed
  }

  #contentDelta(text: string, logprobs: TokenLogprob[], out: unknown[]): void {
    const itemId = `msg_${baseOf(this.meta)}`;
    if (!this.#message) {
      this.#message = { index: this.#index++, text: "", logprobs: [] };
      const item = messageItem(this.meta, [], "in_progress");
      out.push(
        this.#event("response.output_item.added", { output_index: this.#message.index, item }),
      );
      out.push(this.#event("response.content_part.added", {
        item_id: itemId,
        output_index: this.#message.index,
        content_index: 0,
        part: outputText(this.request, "", []),
      }));
    }
    const m = this.#message;
    m.text += text;
    m.logprobs.push(...logprobs);
    if (text === "" && logprobs.length === 0) return;
    out.push(this.#event("response.output_text.delta", {
      item_id: itemId,
      output_index: m.index,
      content_index: 0,
      delta: text,
      logprobs: this.request.logprobs ? logprobs.map(chatLogprob) : [],
    }));
  }

  #closeMessage(out: unknown[], status: string): void {
    const m = this.#message;
    if (!m || m.index < 0) return;
    const itemId = `msg_${baseOf(this.meta)}`;
    const part = outputText(this.request, m.text, m.logprobs);
    const at = { item_id: itemId, output_index: m.index, content_index: 0 };
    out.push(
      this.#event("response.output_text.done", { ...at, text: m.text, logprobs: part.logprobs }),
    );
    out.push(this.#event("response.content_part.done", { ...at, part }));
    out.push(this.#event("response.output_item.done", {
      output_index: m.index,
      item: messageItem(this.meta, [part], status),
    }));
    m.index = -1;
  }

  #call(call: ToolCallOut, out: unknown[]): void {
    const index = this.#index++;
    const at = { item_id: `fc_${call.id}`, output_index: index };
    out.push(this.#event("response.output_item.added", {
      output_index: index,
      item: callItem(call, "in_progress", ""),
    }));
    out.push(this.#event("response.function_call_arguments.delta", { ...at, delta: call.json }));
    out.push(this.#event("response.function_call_arguments.done", {
      ...at,
      name: call.name,
      arguments: call.json,
    }));
    out.push(this.#event("response.output_item.done", {
      output_index: index,
      item: callItem(call, "completed"),
    }));
  }

  #event(type: string, fields: Body) {
    return { type, sequence_number: this.#seq++, ...fields };
  }
}

/** POST /v1/responses. */
export const RESPONSES_API: WireFormat<ResponsesRequest> = {
  idPrefix: "resp_",
  sse: "typed",
  parse: (body) => parseResponsesRequest(body),
  whole: (meta, request, result) => responseObject(meta, request, result),
  stream: (meta, request) => new ResponseEvents(meta, request),
};
