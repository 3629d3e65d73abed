/**
 * Text generation through a shared Session: the decode loop of `k3 chat` and `k3 serve`.
 * Ids become whole characters, stop strings end the text (and are never shown), and the
 * timings are kept. The Session's scheduler gives the event loop a turn between passes (so
 * Ctrl-C and client disconnects are seen within one step); the loop here adds none, so the
 * next step of every stream is handed in before the next pass starts.
 */
import type { GenerateStep, TokenPicker } from "./decode.ts";
import type { RequestOptions, ReuseInfo, Session } from "./session.ts";
import type { SpeculationConfig, SpeculationStats } from "../speculate/speculate.ts";
import type { TextStream } from "../text/stream.ts";
import type { SequenceState } from "../model/state.ts";

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
  /** A name for /health (the server's request id). */
  label?: string;
  /** The state the generation advances (Session RequestOptions.onState). */
  onState?: (state: SequenceState) => void;
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

/** Lets timers, signals and network I/O run (`run` calls it between steps). */
export { yieldToEventLoop } from "./batch.ts";

/** Generates after `prompt` through `session` (batched, retained prefixes). */
export function generateText(
  session: Session,
  prompt: number[],
  options: TextGenOptions,
): Promise<TextGenResult> {
  const run = new TextRun(options, prompt.length);
  return run.consume(session.generate(prompt, requestOptions(options), (r) => run.started(r)));
}

/**
 * Several generations after one prompt, prefilled once (n choices; Session.choices), each
 * with its own options; they share `options[0].signal`. Resolves when all have ended.
 */
export function generateTexts(
  session: Session,
  prompt: number[],
  options: TextGenOptions[],
): Promise<TextGenResult[]> {
  const runs = options.map((o) => new TextRun(o, prompt.length));
  const steps = session.choices(
    prompt,
    options.map(requestOptions),
    (r) => runs.forEach((run) => run.started(r)),
  );
  return Promise.all(runs.map((run, i) => run.consume(steps[i])));
}

function requestOptions(options: TextGenOptions): RequestOptions {
  return {
    maxTokens: options.maxTokens,
    picker: options.picker,
    stopIds: options.stopIds,
    signal: options.signal,
    speculation: options.speculation,
    speculationStats: options.speculationStats,
    label: options.label,
    onState: options.onState,
  };
}

/** One generation's text, finish and timings, built from its steps. */
class TextRun {
  reuse: ReuseInfo;
  startedAt = performance.now();

  constructor(readonly options: TextGenOptions, promptTokens: number) {
    this.reuse = { promptTokens, reusedTokens: 0 };
  }

  started(reuse: ReuseInfo): void {
    this.startedAt = performance.now();
    this.reuse = reuse;
    this.options.onStart?.(reuse);
  }

  async consume(steps: AsyncGenerator<GenerateStep>): Promise<TextGenResult> {
    const options = this.options;
    const ids: number[] = [];
    let text = "";
    let firstAt = 0, lastAt = 0;
    let finish: TextGenResult["finish"] = "length";
    let stopString = false;
    const emit = async (piece: string) => {
      if (piece === "") return;
      text += piece;
      await options.onText?.(piece);
    };
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
    }
    if (!stopString) await emit(options.stream.flush());
    if (options.signal?.aborted && finish === "length" && ids.length < options.maxTokens) {
      finish = "aborted";
    }
    return { ids, text, finish, reuse: this.reuse, startedAt: this.startedAt, firstAt, lastAt };
  }
}
