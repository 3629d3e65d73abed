/**
 * Ollama's API, for the tools that speak only it (Open WebUI, editor plugins, the `ollama`
 * client libraries): `/api/chat` and `/api/generate` as wire formats the server runs like the
 * others (streamed as NDJSON, one JSON object a line, by default; whole with `stream: false`),
 * and the informational routes `/api/tags`, `/api/show`, `/api/version`, `/api/ps`.
 * Ollama's `options` map onto k3's sampling; an option k3 cannot honour is a 400 in Ollama's
 * error shape `{"error": "..."}`, never silently dropped. No I/O here.
 */
import type { ChatMessage, RenderOptions, ResponseFormat, ToolCall } from "../text/chat.ts";
import type { SamplingOptions } from "../text/sampler.ts";
import { VERSION } from "../version.ts";
import type {
  GenerationDelta,
  GenerationResult,
  GenerationSpec,
  ToolCallOut,
} from "./generation.ts";
import { checkFunction, effortOf, formatGrammar } from "./openai.ts";
import {
  type ApiError,
  badField,
  type Body,
  checkFields,
  type FieldPolicy,
  isAbsent,
  isRecord,
  optional,
  optionalInt,
  optionalNumber,
  optionalRecord,
  parseStops,
} from "./request.ts";
import type { ResponseMeta, StreamWriter, WireFormat, WireRequest } from "./wire.ts";

/** A parsed Ollama request. */
interface OllamaRequest extends WireRequest {
  /** /api/generate with `raw: true`: the prompt is sent as it is, no chat template. */
  raw: boolean;
}

/** Ollama's error body. */
export function ollamaErrorBody(e: ApiError): { error: string } {
  return { error: e.message };
}

/** Fields both generation routes share. */
const COMMON_HANDLED = ["model", "stream", "options", "think", "format"];
/** Accepted, changing nothing: how long Ollama keeps a model loaded (k3 keeps it loaded). */
const COMMON_INFORMATIONAL = ["keep_alive"];

const CHAT_FIELDS: FieldPolicy = {
  handled: [...COMMON_HANDLED, "messages", "tools"],
  informational: COMMON_INFORMATIONAL,
};

const GENERATE_FIELDS: FieldPolicy = {
  handled: [...COMMON_HANDLED, "prompt", "system", "raw"],
  informational: COMMON_INFORMATIONAL,
  refused: {
    suffix: () => "fill-in-the-middle is not supported; put the whole text in prompt",
    images: () => "image input is not supported: this server is text-only",
    template: () => "k3 renders K3's own chat template; send raw: true to give the exact text",
    context: () =>
      "k3 does not return or take context token lists; send the conversation to /api/chat " +
      "(k3 reuses the retained state of a repeated prefix by itself)",
  },
};

/**
 * Ollama `options` k3 reads, and those that only tune how Ollama places and runs the model
 * (threads, GPU layers, batch size, memory mapping): they cannot change k3's answer, so they
 * are accepted. Any other option (mirostat, typical_p, penalize_newline...) is refused.
 */
const OPTION_FIELDS: FieldPolicy = {
  handled: [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "num_predict",
    "stop",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "num_ctx",
  ],
  informational: [
    "num_thread",
    "num_gpu",
    "main_gpu",
    "num_batch",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "vocab_only",
  ],
};

/** `options` in k3's terms: sampling, the completion limit, stop strings. */
function parseOptions(body: Body): Pick<GenerationSpec, "sampling" | "maxTokens" | "stops"> {
  const o = optionalRecord(body, "options") ?? {};
  checkFields(o, OPTION_FIELDS, "options.");
  const at = "options.";
  const sampling: SamplingOptions = {
    temperature: optionalNumber(o, "temperature", 0, 2, at),
    topP: optionalNumber(o, "top_p", Number.MIN_VALUE, 1, at),
    topK: optionalInt(o, "top_k", 0, Number.MAX_SAFE_INTEGER, at),
    minP: optionalNumber(o, "min_p", 0, 1, at),
    seed: optionalInt(o, "seed", -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, at),
    presencePenalty: optionalNumber(o, "presence_penalty", -2, 2, at),
    frequencyPenalty: optionalNumber(o, "frequency_penalty", -2, 2, at),
    repetitionPenalty: optionalNumber(o, "repeat_penalty", Number.MIN_VALUE, 100, at),
  };
  // -1 (no limit) and -2 (fill the context) both run to the end of k3's context budget.
  const predict = optionalInt(o, "num_predict", -2, Number.MAX_SAFE_INTEGER, at);
  if (predict === 0) {
    throw badField("options.num_predict", "must be at least 1, or -1 for no limit");
  }
  // The context is k3 serve's --context; a smaller num_ctx asks for less than it gives.
  optionalInt(o, "num_ctx", 1, Number.MAX_SAFE_INTEGER, at);
  return {
    sampling,
    maxTokens: predict !== undefined && predict > 0 ? predict : undefined,
    stops: parseStops(o.stop, "options.stop"),
  };
}

/** `think`: true/false, or an effort ("low", "medium", "high"); absent: K3's default (on). */
function parseThink(body: Body): Pick<RenderOptions, "thinking" | "thinkingEffort"> {
  const think = body.think;
  if (isAbsent(think)) return {};
  if (typeof think === "boolean") return { thinking: think };
  const effort = effortOf(think, "think");
  return effort === "none" ? { thinking: false } : { thinking: true, thinkingEffort: effort };
}

/** What `format` asks for: the template's response-format note and the grammar enforcing it. */
interface OllamaFormat {
  render?: ResponseFormat;
  grammar?: GenerationSpec["grammar"];
}

/**
 * `format`: "json" is any JSON object (OpenAI's json_object); a JSON schema object is enforced
 * token by token (a strict json_schema), its keywords checked here so one the engine cannot
 * enforce is a 400 naming it. Ollama's clients send "" for no format, so that is none too.
 */
function parseFormat(body: Body): OllamaFormat {
  const format = body.format;
  if (isAbsent(format) || format === "") return {};
  let render: ResponseFormat;
  if (format === "json") render = { type: "json_object" };
  else if (isRecord(format)) {
    render = { type: "json_schema", json_schema: { name: "format", schema: format, strict: true } };
  } else throw badField("format", 'must be "json" or a JSON schema object');
  return { render, grammar: formatGrammar(render, "format", "format") };
}

/** Fields parsed the same way by both routes. */
function parseCommon(body: Body): Omit<OllamaRequest, "spec" | "raw"> {
  const model = optional<string>(body, "model", "string", "a string");
  if (model === undefined || model === "") throw badField("model", "is required");
  return {
    // Ollama's clients name a model `name:latest` when no tag is given.
    model: model.endsWith(":latest") ? model.slice(0, -":latest".length) : model,
    // Ollama streams unless told otherwise.
    stream: optional<boolean>(body, "stream", "boolean", "true or false") ?? true,
  };
}

function parseChat(body: Body): OllamaRequest {
  checkFields(body, CHAT_FIELDS);
  const tools = parseTools(body.tools);
  const format = parseFormat(body);
  return {
    ...parseCommon(body),
    raw: false,
    spec: {
      input: {
        kind: "chat",
        messages: parseMessages(body.messages),
        render: { ...parseThink(body), tools, responseFormat: format.render },
      },
      maxTokensField: "options.num_predict",
      ...parseOptions(body),
      grammar: format.grammar,
    },
  };
}

function parseGenerate(body: Body): OllamaRequest {
  checkFields(body, GENERATE_FIELDS);
  const prompt = optional<string>(body, "prompt", "string", "a string");
  if (prompt === undefined || prompt === "") throw badField("prompt", "must be a non-empty string");
  const system = optional<string>(body, "system", "string", "a string");
  const raw = optional<boolean>(body, "raw", "boolean", "true or false") ?? false;
  if (raw && (system !== undefined || !isAbsent(body.think))) {
    throw badField("raw", "a raw prompt has no chat template: leave out system and think");
  }
  const messages: ChatMessage[] = [
    ...(system !== undefined ? [{ role: "system", content: system }] : []),
    { role: "user", content: prompt },
  ];
  // A raw prompt has no template to note the format in: the grammar alone holds the answer.
  const format = parseFormat(body);
  const render = { ...parseThink(body), responseFormat: format.render };
  return {
    ...parseCommon(body),
    raw,
    spec: {
      input: raw ? { kind: "text", prompt } : { kind: "chat", messages, render },
      maxTokensField: "options.num_predict",
      ...parseOptions(body),
      grammar: format.grammar,
    },
  };
}

const ROLES = new Set(["system", "user", "assistant", "tool"]);

/** Ollama messages `{role, content, thinking?, tool_calls?, tool_name?}` as k3's. */
function parseMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) {
    throw badField("messages", "must be a non-empty list of messages");
  }
  return value.map((m, i) => {
    const at = `messages[${i}]`;
    if (!isRecord(m)) throw badField(at, "must be an object");
    checkFields(m, {
      handled: ["role", "content", "thinking", "tool_calls", "tool_name"],
      informational: [],
      refused: { images: () => "image input is not supported: this server is text-only" },
    }, `${at}.`);
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw badField(`${at}.role`, `must be one of ${[...ROLES].join(", ")}`);
    }
    const message: ChatMessage = {
      role: m.role,
      content: optional<string>(m, "content", "string", "a string", `${at}.`) ?? "",
    };
    const thinking = optional<string>(m, "thinking", "string", "a string", `${at}.`);
    if (thinking !== undefined) message.reasoning_content = thinking;
    const tool = optional<string>(m, "tool_name", "string", "a string", `${at}.`);
    if (tool !== undefined) message.tool = tool;
    if (!isAbsent(m.tool_calls)) {
      if (m.role !== "assistant") {
        throw badField(`${at}.tool_calls`, "only assistant messages have tool calls");
      }
      message.tool_calls = parseToolCalls(m.tool_calls, `${at}.tool_calls`);
    }
    return message;
  });
}

/** `[{function: {name, arguments: {...}}}]`. */
function parseToolCalls(calls: unknown, where: string): ToolCall[] {
  if (!Array.isArray(calls)) throw badField(where, "must be a list of tool calls");
  return calls.map((call, k) => {
    const f = isRecord(call) ? call.function : undefined;
    if (!isRecord(f) || typeof f.name !== "string" || f.name === "") {
      throw badField(`${where}[${k}].function`, "must be an object {name, arguments}");
    }
    if (!isAbsent(f.arguments) && !isRecord(f.arguments)) {
      throw badField(`${where}[${k}].function.arguments`, "must be an object");
    }
    return { type: "function", function: { name: f.name, arguments: f.arguments ?? {} } };
  });
}

/** Function tools, in the same shape as OpenAI's. */
function parseTools(tools: unknown): unknown[] | undefined {
  if (isAbsent(tools)) return undefined;
  if (!Array.isArray(tools)) throw badField("tools", "must be a list of tool objects");
  tools.forEach((t, i) => {
    const at = `tools[${i}]`;
    if (!isRecord(t) || (t.type ?? "function") !== "function") {
      throw badField(at, 'must be {"type": "function", "function": {...}}');
    }
    const f = t.function;
    if (!isRecord(f) || typeof f.name !== "string" || f.name === "") {
      throw badField(`${at}.function`, "must be an object with a non-empty name");
    }
    checkFunction(f, `${at}.function`, "parameters", false);
  });
  return tools;
}

// ---- answers ----

/** Nanoseconds, as Ollama reports durations. */
function ns(ms: number): number {
  return Math.round(ms * 1e6);
}

/** The closing fields: why it ended, token counts, durations. */
function doneFields(result: GenerationResult) {
  const t = result.timing;
  return {
    done: true,
    done_reason: result.ended === "length" ? "length" : "stop",
    total_duration: ns(t.total_ms),
    load_duration: 0,
    prompt_eval_count: result.usage.prompt,
    prompt_eval_duration: ns(Math.max(0, t.ttft_ms - t.queue_ms)),
    eval_count: result.usage.completion,
    eval_duration: ns(Math.max(0, t.total_ms - t.ttft_ms)),
  };
}

function head(meta: ResponseMeta) {
  return { model: meta.model, created_at: new Date(meta.created * 1000).toISOString() };
}

function toolCalls(calls: ToolCallOut[]) {
  return calls.map((c) => ({
    function: {
      index: c.index,
      name: c.name,
      arguments: typeof c.arguments === "string" ? parseArguments(c.arguments) : c.arguments,
    },
  }));
}

/** Ollama carries arguments as an object; a raw json block that is not one stays text. */
function parseArguments(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function chatMessage(content: string, reasoning: string | null, calls: ToolCallOut[]) {
  return {
    role: "assistant",
    content,
    ...(reasoning ? { thinking: reasoning } : {}),
    ...(calls.length > 0 ? { tool_calls: toolCalls(calls) } : {}),
  };
}

function chatWhole(meta: ResponseMeta, _: OllamaRequest, r: GenerationResult) {
  return {
    ...head(meta),
    message: chatMessage(r.content, r.reasoning, r.toolCalls),
    ...doneFields(r),
  };
}

function generateWhole(meta: ResponseMeta, _: OllamaRequest, r: GenerationResult) {
  return {
    ...head(meta),
    response: r.content,
    ...(r.reasoning ? { thinking: r.reasoning } : {}),
    ...doneFields(r),
  };
}

function chatStream(meta: ResponseMeta): StreamWriter {
  return {
    start: () => [],
    delta: (d: GenerationDelta) => [{
      ...head(meta),
      message: chatMessage(d.content, d.reasoning, d.toolCalls),
      done: false,
    }],
    end: (r) => [{ ...head(meta), message: chatMessage("", null, []), ...doneFields(r) }],
    error: (e) => [ollamaErrorBody(e)],
  };
}

function generateStream(meta: ResponseMeta, request: OllamaRequest): StreamWriter {
  return {
    start: () => [],
    delta: (d: GenerationDelta) => [{
      ...head(meta),
      response: request.raw ? d.text : d.content,
      ...(d.reasoning ? { thinking: d.reasoning } : {}),
      done: false,
    }],
    end: (r) => [{ ...head(meta), response: "", ...doneFields(r) }],
    error: (e) => [ollamaErrorBody(e)],
  };
}

/** POST /api/chat. */
export const OLLAMA_CHAT_API: WireFormat<OllamaRequest> = {
  idPrefix: "ollama-chat-",
  sse: "ndjson",
  parse: (body) => parseChat(body),
  whole: chatWhole,
  stream: (meta) => chatStream(meta),
};

/** POST /api/generate. */
export const OLLAMA_GENERATE_API: WireFormat<OllamaRequest> = {
  idPrefix: "ollama-gen-",
  sse: "ndjson",
  parse: (body) => parseGenerate(body),
  whole: generateWhole,
  stream: generateStream,
};

// ---- the informational routes ----

/** What the server serves, as the informational routes describe it. */
export interface ServedModels {
  names: string[];
  /** Unix seconds the server started. */
  created: number;
  contextTokens: number;
}

const DETAILS = {
  parent_model: "",
  format: "safetensors",
  family: "kimi-k3",
  families: ["kimi-k3"],
  parameter_size: "",
  quantization_level: "",
};

function modelInfo(name: string, served: ServedModels) {
  return {
    name,
    model: name,
    modified_at: new Date(served.created * 1000).toISOString(),
    size: 0,
    digest: "",
    details: DETAILS,
  };
}

/** GET /api/tags: every name the server answers to. */
export function ollamaTags(served: ServedModels) {
  return { models: served.names.map((n) => modelInfo(n, served)) };
}

/** GET /api/ps: the model is always loaded (k3 serve loads it at start). */
export function ollamaPs(served: ServedModels) {
  return {
    models: served.names.map((n) => ({
      ...modelInfo(n, served),
      expires_at: "9999-12-31T23:59:59Z",
      size_vram: 0,
      context_length: served.contextTokens,
    })),
  };
}

/** GET /api/version: k3's version. */
export function ollamaVersion() {
  return { version: VERSION };
}

/**
 * POST /api/show `{model}` (or the older `name`): the model's details. `resolve` checks the
 * name (a 404 when the server does not serve it) and returns the name to answer with.
 */
export function ollamaShow(
  body: Body,
  served: ServedModels,
  resolve: (model: string | undefined) => string,
) {
  checkFields(body, { handled: ["model", "name"], informational: ["verbose"] });
  const given = optional<string>(body, "model", "string", "a string") ??
    optional<string>(body, "name", "string", "a string");
  if (given === undefined || given === "") throw badField("model", "is required");
  const name = resolve(given.endsWith(":latest") ? given.slice(0, -":latest".length) : given);
  return {
    license: "",
    modelfile: `# k3 serve answers for ${name}\nFROM ${name}\n`,
    parameters: "",
    template: "",
    details: DETAILS,
    model_info: {
      "general.architecture": "kimi-k3",
      "kimi-k3.context_length": served.contextTokens,
    },
    capabilities: ["completion", "tools", "thinking"],
    modified_at: new Date(served.created * 1000).toISOString(),
  };
}
