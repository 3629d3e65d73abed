/**
 * Streaming the XTML channels: as generated text arrives, send what belongs to the think
 * channel as reasoning and what belongs to the response channel as content. The split is
 * parseOutput's own, applied to the text so far minus a tail that could still turn into a
 * channel marker; so the deltas always add up to exactly what parseOutput gives for the whole.
 */
import { CLOSE, END_OF_MSG, OPEN, SEP } from "../text/chat.ts";
import { type ParsedOutput, parseOutput } from "../text/parse.ts";

/** Text to send for each channel (empty when nothing new). */
export interface ChannelDelta {
  reasoning: string;
  content: string;
}

/** Splits a growing generation into reasoning and content deltas. */
export class ChannelSplitter {
  #text = "";
  #sentReasoning = "";
  #sentContent = "";

  /** `thinking`: whether the prompt opened the think channel (as for parseOutput). */
  constructor(readonly thinking: boolean) {}

  /** Adds generated text; returns what is now certain to belong to each channel. */
  push(piece: string): ChannelDelta {
    this.#text += piece;
    const settled = this.#text.slice(0, this.#text.length - pendingTail(this.#text));
    return this.#advance(parseOutput(settled, { thinking: this.thinking }));
  }

  /** End of generation: the rest of each channel, and the parse of the whole text. */
  finish(): { delta: ChannelDelta; parsed: ParsedOutput } {
    const parsed = parseOutput(this.#text, { thinking: this.thinking });
    return { delta: this.#advance(parsed), parsed };
  }

  #advance(parsed: ParsedOutput): ChannelDelta {
    const reasoning = extension(this.#sentReasoning, parsed.reasoning ?? "");
    const content = extension(this.#sentContent, parsed.content);
    this.#sentReasoning += reasoning;
    this.#sentContent += content;
    return { reasoning, content };
  }
}

/** What `now` adds to `sent`; `now` always extends `sent` (see pendingTail). */
function extension(sent: string, now: string): string {
  if (!now.startsWith(sent)) {
    throw new Error(`channel text went back: sent ${JSON.stringify(sent)}, now ${now.length}`);
  }
  return now.slice(sent.length);
}

const CONTROLS = [OPEN, CLOSE, SEP, END_OF_MSG];
const LONGEST_CONTROL = Math.max(...CONTROLS.map((c) => c.length));

/**
 * Length of the tail that may still become part of a marker: from the last `<|open|>` or
 * `<|close|>` not yet followed by `<|sep|>` (a tag still being written), else a short `<...`
 * without its `>` (a control string still being spelled out). Every marker parseOutput splits
 * on is such a tag or `<|end_of_msg|>`, so the text before this tail parses the same way however
 * the generation continues.
 */
export function pendingTail(text: string): number {
  const control = Math.max(text.lastIndexOf(OPEN), text.lastIndexOf(CLOSE));
  if (control >= 0 && !text.includes(SEP, control)) return text.length - control;
  const angle = text.lastIndexOf("<");
  const tail = text.length - angle;
  if (angle >= 0 && tail < LONGEST_CONTROL && !text.includes(">", angle)) return tail;
  return 0;
}
