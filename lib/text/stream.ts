/**
 * Generated ids to text as a reader sees it. Each id is decoded (no half character is ever
 * emitted) and, for chat output, classified as it arrives by the XTML parser (lib/text/parse.ts):
 * reasoning, answer, tools channel or markup. Only special ids are control tokens, so text the
 * model spells out with ordinary tokens is never taken for markup.
 *
 * Stop strings are matched on the visible text only: the answer and the reasoning in chat
 * output, the ordinary tokens' text in raw output. Markup (channel markers, tag names, any
 * special token's name) is never matched, and a stop string never spans it. Shared by `k3 run`,
 * `k3 chat` and `k3 serve`.
 */
import {
  type Atom,
  OutputParser,
  type ParsedOutput,
  type ParsedToolCall,
  type ParseEvent,
  type Phase,
  type TextChannel,
} from "./parse.ts";
import { CLOSE, END_OF_MSG, OPEN, SEP } from "./chat.ts";
import { StopMatcher, type StopResult } from "./stops.ts";
import { StreamDecoder, type Tokenizer } from "./tokenizer.ts";

/** What one generated token turned out to be. */
type TokenRole =
  | "reasoning"
  | "content"
  /** Inside the tools channel (calls, arguments). */
  | "tools"
  /** A special token, or text of a channel marker, or text between channels. */
  | "markup"
  /** Raw (non-chat) output: an ordinary token. */
  | "text";

/** Where released text goes: a chat channel, or `text` for raw output. */
type StreamChannel = TextChannel | "text";

/** What the stream reports as it goes (synchronously, from push and flush). */
export type StreamEvent =
  /** Text added to a channel: visible text cleared by the stop matcher, or kept markup. */
  | { type: "text"; channel: StreamChannel; text: string }
  | { type: "phase"; phase: Phase }
  | { type: "toolCall"; call: ParsedToolCall }
  /** Token `index` (0-based among the pushed ids) was classified. */
  | { type: "token"; index: number; role: TokenRole };

/** Chat output: the generation prompt opened the think channel (`thinking`) or the answer. */
interface ChatOutputOptions {
  thinking: boolean;
  /** Report a tool call cut off by the token budget (see ParserOptions.keepCutCall). */
  keepCutCall?: boolean;
  /** Stop once this many tool calls are complete. */
  maxToolCalls?: number;
  /** The prefill opened a call (a forced tool choice): see ParserOptions.forcedCall. */
  forcedCall?: boolean;
}

export interface TextStreamOptions {
  /** Stop strings (matched on visible text only). */
  stops?: string[];
  /** Parse K3 chat output; absent: raw text. */
  chat?: ChatOutputOptions;
  onEvent?: (event: StreamEvent) => void;
}

/** Everything the stream produced. */
interface StreamResult extends ParsedOutput {
  /** All decoded text (special tokens as their names), cut before a stop string. */
  text: string;
  /** The stop string that ended the output, if one did. */
  stop: string | null;
  /** Why the stream stopped on its own: a stop string, or `maxToolCalls` calls. */
  stoppedBy: "stop" | "toolCalls" | null;
  /** Tokens pushed while the think channel was open. */
  reasoningTokens: number;
}

/** Decodes ids one at a time, classifies them, and ends at the first stop string. */
export class TextStream {
  readonly #tokenizer: Tokenizer;
  readonly #decoder: StreamDecoder;
  readonly #stops: StopMatcher;
  readonly #parser?: OutputParser;
  readonly #options: TextStreamOptions;
  #text = "";
  #channels = { reasoning: "", content: "", text: "" };
  /** The channel of the text the stop matcher holds back. */
  #heldChannel: StreamChannel = "text";
  #count = 0;
  #reasoningTokens = 0;
  #stop: string | null = null;
  #stoppedBy: StreamResult["stoppedBy"] = null;
  #toolCalls = 0;

  constructor(tokenizer: Tokenizer, options: TextStreamOptions = {}) {
    this.#tokenizer = tokenizer;
    this.#decoder = new StreamDecoder(tokenizer);
    this.#stops = new StopMatcher(options.stops ?? []);
    this.#options = options;
    if (options.chat) {
      this.#parser = new OutputParser({
        thinking: options.chat.thinking,
        keepCutCall: options.chat.keepCutCall,
        forcedCall: options.chat.forcedCall,
      });
    }
  }

  /** The parser's phase (chat output), e.g. to know whether the answer has begun. */
  get phase(): Phase | undefined {
    return this.#parser?.phase;
  }

  /** True while a channel marker is half read (between its opening token and `<|sep|>`). */
  get inMarker(): boolean {
    return this.#parser?.inMarker ?? false;
  }

  /** Tokens pushed so far while the think channel was open. */
  get reasoningTokens(): number {
    return this.#reasoningTokens;
  }

  /**
   * Feeds ids that the prompt already ends with (a prefill the model continues from): they
   * move the parser on but are not output.
   */
  prime(ids: number[]): void {
    for (const id of ids) {
      const special = this.#tokenizer.specialName(id);
      const atoms: Atom[] = special === undefined
        ? [{ text: this.#decoder.push(id) }]
        : [{ text: this.#decoder.flush() }, { special }];
      for (const atom of atoms) this.#parser?.push(atom);
    }
    this.#parser?.push({ text: this.#decoder.flush() });
  }

  /** The text this token makes safe to show; `stopped` once a stop string completed. */
  push(id: number): StopResult {
    if (this.#stoppedBy) return { emit: "", stopped: true };
    const start = this.#text.length;
    const index = this.#count++;
    const special = this.#tokenizer.specialName(id);
    const phase = this.#parser?.phase;
    const inMarker = this.#parser?.inMarker ?? false;
    if (phase === "reasoning") this.#reasoningTokens++;
    if (special === undefined) this.#atom({ text: this.#decoder.push(id) });
    else {
      this.#atom({ text: this.#decoder.flush() });
      if (!this.#stoppedBy) this.#atom({ special });
    }
    const control = special !== undefined && CONTROLS.includes(special);
    this.#event({ type: "token", index, role: roleOf(control, phase, inMarker) });
    const emit = this.#text.slice(start);
    if (this.#stoppedBy) return { emit, stopped: true, stop: this.#stop ?? undefined };
    return { emit, stopped: false };
  }

  /** End of generation: held bytes (as U+FFFD), a held partial stop string, a cut-off call. */
  flush(): string {
    if (this.#stoppedBy) return "";
    const start = this.#text.length;
    this.#atom({ text: this.#decoder.flush() });
    if (!this.#stoppedBy) {
      this.#release();
      for (const e of this.#parser?.end() ?? []) this.#parsed(e);
      // A call reported here was cut off by the end of generation: the output stopped for
      // that, not because the call limit was reached.
      this.#stoppedBy = null;
    }
    return this.#text.slice(start);
  }

  /** The output so far (all of it, after {@link flush}). */
  result(): StreamResult {
    const parsed = this.#parser?.result();
    return {
      reasoning: parsed?.reasoning === null || !parsed ? null : this.#channels.reasoning,
      content: this.#channels[parsed ? "content" : "text"],
      toolCalls: parsed?.toolCalls ?? [],
      malformed: parsed?.malformed ?? [],
      text: this.#text,
      stop: this.#stop,
      stoppedBy: this.#stoppedBy,
      reasoningTokens: this.#reasoningTokens,
    };
  }

  #atom(atom: Atom): void {
    if ("text" in atom && atom.text === "") return;
    if (!this.#parser) {
      if ("text" in atom) return this.#visible("text", atom.text);
      this.#release();
      return this.#append("text", atom.special); // output, but never matched
    }
    const events = this.#parser.push(atom);
    const visible = events.find((e) => e.type === "visible");
    if (visible) return this.#visible(visible.channel, visible.text);
    this.#release();
    this.#text += "text" in atom ? atom.text : atom.special;
    for (const e of events) this.#parsed(e);
  }

  /** Visible text through the stop matcher. */
  #visible(channel: StreamChannel, text: string): void {
    if (channel !== this.#heldChannel) this.#release();
    this.#heldChannel = channel;
    const r = this.#stops.push(text);
    this.#append(channel, r.emit);
    if (r.stopped) {
      this.#stop = r.stop ?? null;
      this.#stoppedBy = "stop";
    }
  }

  /** Markup interrupts the visible text: what the stop matcher held back is released. */
  #release(): void {
    this.#append(this.#heldChannel, this.#stops.flush());
  }

  #append(channel: StreamChannel, text: string): void {
    if (text === "") return;
    this.#text += text;
    this.#channels[channel] += text;
    this.#event({ type: "text", channel, text });
  }

  #parsed(e: ParseEvent): void {
    if (e.type === "hidden") {
      this.#channels[e.channel] += e.text;
      this.#event({ type: "text", channel: e.channel, text: e.text });
    } else if (e.type === "phase") this.#event(e);
    else if (e.type === "toolCall") {
      this.#event(e);
      const max = this.#options.chat?.maxToolCalls;
      if (max !== undefined && ++this.#toolCalls >= max) this.#stoppedBy = "toolCalls";
    }
  }

  #event(e: StreamEvent): void {
    this.#options.onEvent?.(e);
  }
}

const CONTROLS = [OPEN, CLOSE, SEP, END_OF_MSG];

/**
 * A token's role from where the parser was when it came: raw output is all text; a control
 * token, or any token inside a marker's head, is markup (tools, in the tools channel); other
 * tokens (a reserved special token too: its name is in the channel's text) are their channel's.
 */
function roleOf(control: boolean, phase: Phase | undefined, inMarker: boolean): TokenRole {
  if (phase === undefined) return "text";
  if (phase === "tools") return "tools";
  if (control || inMarker) return "markup";
  if (phase === "reasoning" || phase === "content") return phase;
  return "markup";
}
