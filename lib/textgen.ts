/**
 * Text generation through a shared Session: the decode loop of `k3 chat` and `k3 serve`.
 * Ids become whole characters, stop strings end the text (and are never shown), the event
 * loop gets a turn between steps (so Ctrl-C and client disconnects are seen within one
 * token), and the timings are kept.
 */
import { setImmediate } from "node:timers";
import type { GenerateStep, TokenPicker } from "./generate.ts";
import type { ReuseInfo, Session } from "./session.ts";
import type { SpeculationConfig, SpeculationStats } from "./speculate/speculate.ts";
import type { TextStream } from "./text/stream.ts";

export interface TextGenOptions {
  maxTokens: number;
  picker: TokenPicker;
  /** Token ids that end generation; they are not part of the text. */
  stopIds: number[];
  /** Decoder + stop strings for this request. */
  stream: TextStream;
  /** Aborting ends generation after the current step. */
  signal?: AbortSignal;
  /** Reuse of retained state, before the first step. */
  onStart?: (reuse: ReuseInfo) => void;
  /** Each piece of text as it becomes safe to show. */
  onText?: (piece: string) => void | Promise<void>;
  /** Every step (for checks that compare logits). */
  onStep?: (step: GenerateStep) => void;
  /** Speculation for this request: undefined takes the session's, null turns it off. */
  speculation?: SpeculationConfig | null;
  /** Filled in when the request speculates. */
  speculationStats?: SpeculationStats;
}

export interface TextGenResult {
  /** Generated ids, a stop id included. */
  ids: number[];
  /** The text, without the stop id's text or a stop string. */
  text: string;
  /** stop: a stop id or string; length: maxTokens; aborted: the signal ended it early. */
  finish: "stop" | "length" | "aborted";
  reuse: ReuseInfo;
  /** performance.now() when the engine took the request, at the first and last token. */
  startedAt: number;
  firstAt: number;
  lastAt: number;
}

/** Lets timers, signals and network I/O run between token steps. */
export function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** Generates after `prompt` through `session` (FIFO, retained prefixes). */
export async function generateText(
  session: Session,
  prompt: number[],
  options: TextGenOptions,
): Promise<TextGenResult> {
  const ids: number[] = [];
  let text = "";
  let reuse: ReuseInfo = { promptTokens: prompt.length, reusedTokens: 0 };
  let startedAt = performance.now(), firstAt = 0, lastAt = 0;
  let finish: TextGenResult["finish"] = "length";
  let stopString = false;
  const emit = async (piece: string) => {
    if (piece === "") return;
    text += piece;
    await options.onText?.(piece);
  };
  const steps = session.generate(prompt, {
    maxTokens: options.maxTokens,
    picker: options.picker,
    stopIds: options.stopIds,
    signal: options.signal,
    speculation: options.speculation,
    speculationStats: options.speculationStats,
  }, (r) => {
    startedAt = performance.now();
    reuse = r;
    options.onStart?.(r);
  });
  for await (const step of steps) {
    ids.push(step.token);
    lastAt = performance.now();
    if (step.index === 0) firstAt = lastAt;
    options.onStep?.(step);
    if (step.stop) {
      finish = "stop";
      break;
    }
    const seen = options.stream.push(step.token);
    await emit(seen.emit);
    if (seen.stopped) {
      finish = "stop";
      stopString = true;
      break;
    }
    await yieldToEventLoop();
  }
  if (!stopString) await emit(options.stream.flush());
  if (options.signal?.aborted && finish === "length" && ids.length < options.maxTokens) {
    finish = "aborted";
  }
  return { ids, text, finish, reuse, startedAt, firstAt, lastAt };
}
