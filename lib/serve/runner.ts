/**
 * One request through the shared engine: wait for a free sequence of the Session's batch,
 * generate (its steps share forward passes with the other running requests) with the
 * request's sampler and stops, hand text to the caller as it is decoded, and time it.
 */
import type { Session } from "../generate/session.ts";
import {
  generateText,
  generateTexts,
  type TextGenOptions,
  type TextGenResult,
} from "../generate/text.ts";
import type { GenerateStep, TokenPicker } from "../generate/decode.ts";
import type { TextStream } from "../text/stream.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import type { SpeculationConfig } from "../speculate/speculate.ts";

/** The engine every request shares. */
export interface Engine {
  session: Session;
  tokenizer: Tokenizer;
  /** Token ids that end a generation (end-of-message, EOS). */
  stopIds: number[];
}

/** What to generate for one request. */
export interface Job {
  id: string;
  /** Position in arrival order (the queue is FIFO, so also the order of service). */
  seq: number;
  /** Requests ahead of this one (waiting or running) when it was queued. */
  queuedBehind: number;
  promptIds: number[];
  maxTokens: number;
  /** The request's sampler (greedy by default). */
  picker: TokenPicker;
  /** Decodes the ids and ends at the request's first stop string (which is not returned). */
  text: TextStream;
  /** Aborted when the client goes away: generation ends within one token step. */
  signal: AbortSignal;
  /** performance.now() when the request arrived. */
  arrived: number;
  /** Every step, before its token reaches `text` (log probabilities). */
  onStep?: (step: GenerateStep) => void;
  /** This request's speculation: undefined takes the session's, null turns it off. */
  speculation?: SpeculationConfig | null;
  /** Once a sequence is free: how many prompt tokens a retained state spares prefilling. */
  onStart?: (reusedTokens: number) => void;
}

/** Timings of one request, as /health and the log show them. */
export interface RequestTiming {
  id: string;
  seq: number;
  /** Requests ahead of this one (waiting or running) when it was queued. */
  queued_behind: number;
  queue_ms: number;
  prompt_tokens: number;
  reused_tokens: number;
  completion_tokens: number;
  /** Arrival to first token, queue wait included. */
  ttft_ms: number;
  /** Tokens after the first per second of decoding (0 with fewer than two tokens). */
  tokens_per_second: number;
  total_ms: number;
  finish: "stop" | "length" | "cancelled";
}

/** What a finished job produced. */
export interface JobResult {
  completionIds: number[];
  /** Decoded text (special tokens as their names), cut before any stop string. */
  text: string;
  /** "stop": a stop id or stop string ended it; "cancelled": the client went away. */
  finish: "stop" | "length" | "cancelled";
  reusedTokens: number;
  timing: RequestTiming;
}

/** Runs `job` on the engine, calling `onText` with each piece of text as it is decoded. */
async function runJob(
  engine: Engine,
  job: Job,
  onText: (piece: string) => void = () => {},
): Promise<JobResult> {
  const out = await generateText(engine.session, job.promptIds, textOptions(engine, job, onText));
  return resultOf(job, out);
}

/**
 * Runs the choices of one request (same prompt, id and signal; each its own sampler and
 * text): one job alone, several as n choices that prefill the prompt once.
 */
export async function runJobs(engine: Engine, jobs: Job[]): Promise<JobResult[]> {
  if (jobs.length === 1) return [await runJob(engine, jobs[0])];
  const outs = await generateTexts(
    engine.session,
    jobs[0].promptIds,
    jobs.map((job) => textOptions(engine, job, () => {})),
  );
  return outs.map((out, i) => resultOf(jobs[i], out));
}

function textOptions(engine: Engine, job: Job, onText: (piece: string) => void): TextGenOptions {
  return {
    maxTokens: job.maxTokens,
    picker: job.picker,
    stopIds: engine.stopIds,
    stream: job.text,
    signal: job.signal,
    speculation: job.speculation,
    label: job.id,
    onText,
    onStep: job.onStep,
    onStart: job.onStart && ((reuse) => job.onStart!(reuse.reusedTokens)),
  };
}

function resultOf(job: Job, out: TextGenResult): JobResult {
  const { ids, firstAt: first, lastAt: last } = out;
  const finish = out.finish === "aborted" ? "cancelled" : out.finish;
  const end = performance.now();
  const timing: RequestTiming = {
    id: job.id,
    seq: job.seq,
    queued_behind: job.queuedBehind,
    queue_ms: round(out.startedAt - job.arrived),
    prompt_tokens: job.promptIds.length,
    reused_tokens: out.reuse.reusedTokens,
    completion_tokens: ids.length,
    ttft_ms: round(first ? first - job.arrived : 0),
    tokens_per_second: ids.length > 1 ? round((ids.length - 1) / ((last - first) / 1000)) : 0,
    total_ms: round(end - job.arrived),
    finish,
  };
  return {
    completionIds: ids,
    text: out.text,
    finish,
    reusedTokens: out.reuse.reusedTokens,
    timing,
  };
}

/** A one-line log entry for a finished request. */
export function formatTiming(t: RequestTiming): string {
  return `${t.id}: queue ${t.queue_ms} ms (behind ${t.queued_behind}), prompt ${t.prompt_tokens} ` +
    `(reused ${t.reused_tokens}), completion ${t.completion_tokens}, ttft ${t.ttft_ms} ms, ` +
    `${t.tokens_per_second} tok/s, total ${t.total_ms} ms, ${t.finish}`;
}

function round(x: number): number {
  return Math.round(x * 10) / 10;
}
