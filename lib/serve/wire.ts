/**
 * What each API (Chat Completions, Completions, Responses, Messages) gives the server: how to
 * read a request, how to answer it whole, how to stream it, and how its errors look. The
 * server (server.ts) does the HTTP and runs the generation; the APIs do no I/O.
 */
import type { GenerationDelta, GenerationResult, GenerationSpec } from "./generation.ts";
import type { ApiError, Body } from "./request.ts";

/** A parsed request: what to generate, for which model name, streamed or not. */
export interface WireRequest {
  model?: string;
  spec: GenerationSpec;
  stream: boolean;
}

/** Fields every answer of one request shares. */
export interface ResponseMeta {
  id: string;
  /** Unix seconds. */
  created: number;
  /** The model name the request used (or the server's first name). */
  model: string;
  /** Tokens of the prompt (with any pre-fill). */
  promptTokens: number;
}

/** Writes one streamed answer as a list of events per step. */
export interface StreamWriter {
  /** Events before the first token (created, message_start, the role chunk). */
  start(): unknown[];
  /**
   * Events once the request has a sequence, when the prompt tokens a retained state spared
   * are known (Anthropic's message_start carries that split of its usage).
   */
  started?(reusedTokens: number): unknown[];
  /** Events for what one token step added. */
  delta(d: GenerationDelta): unknown[];
  /** Closing events. */
  end(result: GenerationResult): unknown[];
  /** An error after the stream began. */
  error(e: ApiError): unknown[];
}

export interface WireFormat<R extends WireRequest = WireRequest> {
  /** Response ids: prefix + sequence number + random part (`chatcmpl-`, `resp_`, `msg_`). */
  idPrefix: string;
  /**
   * `data`: OpenAI chat/completions SSE (`data: {...}`, then `data: [DONE]`). `typed`: each
   * event is named by its `type` field (`event: TYPE`), and there is no [DONE]. `ndjson`:
   * Ollama's stream, one JSON object a line.
   */
  sse: "data" | "typed" | "ndjson";
  /** The event a quiet stream is kept alive with (Anthropic's `ping`); absent: a comment. */
  ping?: { type: string };
  parse(body: Body, vocab: number): R;
  whole(meta: ResponseMeta, request: R, result: GenerationResult): unknown;
  stream(meta: ResponseMeta, request: R): StreamWriter;
  /** Several choices of one prompt (OpenAI's `n`), for the APIs that have them. */
  choices?: ChoiceFormat<R>;
}

/** How an API asks for and answers several choices of one prompt. */
interface ChoiceFormat<R extends WireRequest> {
  /** Choices the request asks for (1: answer as usual). */
  count(request: R): number;
  /** The whole answer, one choice per result. */
  whole(meta: ResponseMeta, request: R, results: GenerationResult[]): unknown;
  /** The stream writer of choice `index` (no usage event: that comes once, from `usage`). */
  stream(meta: ResponseMeta, request: R, index: number): StreamWriter;
  /** Events after every choice ended (usage over all of them, when asked for). */
  usage(meta: ResponseMeta, request: R, results: GenerationResult[]): unknown[];
}

/** How errors look on a route: OpenAI's `{error: {...}}`, Anthropic's, or Ollama's `{error}`. */
export type ErrorDialect = "openai" | "anthropic" | "ollama";
