/**
 * Streaming an answer to the terminal, channel by channel: reasoning (dimmed, labelled, or
 * hidden) then content. The channels come from {@link parseOutput} on the text so far, so
 * what is shown always agrees with the message that is stored; a tail that could still grow
 * into a channel marker is held back until it can be classified.
 */
import { CLOSE, END_OF_MSG, OPEN, SEP } from "../text/chat.ts";
import { parseOutput } from "../text/parse.ts";

/** The markers parseOutput splits channels on (MODEL.md §7.4). */
const CHANNEL_MARKERS = [
  `${CLOSE}think${SEP}`,
  `${OPEN}response${SEP}`,
  `${CLOSE}response${SEP}`,
  `${OPEN}tools${SEP}`,
  `${CLOSE}message${SEP}`,
  END_OF_MSG,
];

/** New text in each channel since the last push. */
interface ChannelDelta {
  reasoning: string;
  content: string;
}

/** Splits streamed generated text into reasoning and content deltas. */
export class ChannelView {
  #text = "";
  #reasoningShown = 0;
  #contentShown = 0;

  /** `thinking`: the generation prompt opened the think channel. */
  constructor(readonly thinking: boolean) {}

  /** Adds generated text; returns what can now be shown. */
  push(piece: string): ChannelDelta {
    this.#text += piece;
    return this.#delta(this.#text.slice(0, this.#text.length - partialMarkerLength(this.#text)));
  }

  /** End of the answer: shows any held-back tail. */
  flush(): ChannelDelta {
    return this.#delta(this.#text);
  }

  #delta(text: string): ChannelDelta {
    const parsed = parseOutput(text, { thinking: this.thinking });
    const reasoning = (parsed.reasoning ?? "").slice(this.#reasoningShown);
    const content = parsed.content.slice(this.#contentShown);
    this.#reasoningShown += reasoning.length;
    this.#contentShown += content.length;
    return { reasoning, content };
  }
}

/** Length of the longest suffix of `text` that is a proper prefix of a channel marker. */
function partialMarkerLength(text: string): number {
  let longest = 0;
  for (const marker of CHANNEL_MARKERS) {
    for (let n = Math.min(marker.length - 1, text.length); n > longest; n--) {
      if (text.endsWith(marker.slice(0, n))) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

/**
 * Text made safe for a terminal: every control character except newline and tab (C0, DEL
 * and the C1 range, which some terminals also obey) is shown escaped (`\x0e`, `\x1b`,
 * `\u009b`), so model output can never move the cursor, change colours or retitle the
 * window. Everything else, all of Unicode included, passes through.
 */
export function terminalSafe(text: string): string {
  // deno-lint-ignore no-control-regex
  return text.replace(/[\x00-\x08\x0b-\x1f\x7f-\x9f]/g, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x80
      ? `\\x${code.toString(16).padStart(2, "0")}`
      : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}

/** How reasoning is shown. */
export type ReasoningStyle = "dim" | "label" | "hide";

const DIM = "\x1b[2m";
const UNDIM = "\x1b[22m";
const LABEL = "[reasoning] ";
/** Shown while hidden reasoning streams, so a long think does not read as a hang. */
export const THINKING = "thinking…";
/** Back to the start of the line and clear it: the indicator goes when the answer comes. */
const ERASE_LINE = "\r\x1b[K";

/**
 * Writes one answer's deltas: reasoning in its style, then a line break, then content, all
 * through {@link terminalSafe}. Hidden reasoning shows {@link THINKING} while it streams; at a
 * terminal (`erasable`) it counts the seconds (a think can take minutes at full size) and the
 * answer then replaces it, elsewhere it stays as its own line. An answer that never leaves its
 * reasoning keeps the indicator: it was all thinking.
 */
export class AnswerPrinter {
  #channel: "none" | "reasoning" | "content" = "none";
  /** When hidden reasoning started, and the whole seconds the indicator shows. */
  #thinkingSince = 0;
  #thinkingShown = 0;

  constructor(
    readonly write: (text: string) => Promise<void>,
    readonly style: ReasoningStyle,
    readonly options: { erasable?: boolean; now?: () => number } = {},
  ) {}

  async show(delta: ChannelDelta): Promise<void> {
    if (delta.reasoning && this.style === "hide") {
      await this.#showThinking();
    } else if (delta.reasoning) {
      if (this.#channel === "none") await this.write(this.style === "dim" ? DIM : LABEL);
      this.#channel = "reasoning";
      await this.write(terminalSafe(delta.reasoning));
    }
    if (delta.content) {
      await this.#leaveReasoning();
      this.#channel = "content";
      await this.write(terminalSafe(delta.content));
    }
  }

  /** Ends the answer's line (and the dimming). */
  async end(): Promise<void> {
    if (this.#channel === "reasoning" && this.style === "dim") await this.write(UNDIM);
    this.#channel = "none";
    await this.write("\n");
  }

  /** The indicator: written once, then at a terminal redrawn as each whole second passes. */
  async #showThinking(): Promise<void> {
    const now = this.options.now?.() ?? performance.now();
    if (this.#channel === "none") {
      this.#channel = "reasoning";
      [this.#thinkingSince, this.#thinkingShown] = [now, 0];
      return await this.write(THINKING);
    }
    const seconds = Math.floor((now - this.#thinkingSince) / 1000);
    if (!this.options.erasable || seconds <= this.#thinkingShown) return;
    this.#thinkingShown = seconds;
    await this.write(`${ERASE_LINE}${THINKING} ${seconds} s`);
  }

  async #leaveReasoning(): Promise<void> {
    if (this.#channel !== "reasoning") return;
    if (this.style === "hide") await this.write(this.options.erasable ? ERASE_LINE : "\n");
    else await this.write(this.style === "dim" ? UNDIM + "\n" : "\n");
    this.#channel = "none";
  }
}
