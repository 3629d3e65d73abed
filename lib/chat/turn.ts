/**
 * One assistant turn: render the whole conversation (XTML, ending with the generation
 * prompt), generate through a {@link Session} (which resumes from the longest retained
 * prefix), and parse what came out into an OpenAI-style assistant message.
 */
import { type GenerateStep, isPrefix, type TokenPicker } from "../generate/decode.ts";
import type { SequenceState } from "../model/state.ts";
import { generateText, yieldToEventLoop } from "../generate/text.ts";
import { ForwardAborted } from "../model/forward.ts";
import type { ReuseInfo, Session } from "../generate/session.ts";
import type { SpeculationConfig, SpeculationStats } from "../speculate/speculate.ts";
import { leastChatTokens, renderChatIds, type RenderOptions } from "../text/chat.ts";
import { parseOutput } from "../text/parse.ts";
import { Sampler, type SamplingOptions } from "../text/sampler.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import type { HistoryMessage } from "./history.ts";
import { TextStream } from "../text/stream.ts";
import { badInput } from "../errors.ts";

export interface TurnOptions {
  /** thinking and thinkingEffort; the generation prompt is always added. */
  render: RenderOptions;
  /** A fresh sampler with these options runs each turn, so a turn depends only on its prompt. */
  sampling: SamplingOptions;
  /** Picks instead of a sampler with `sampling` (a grammar-constrained one). */
  picker?: TokenPicker;
  /** Token ids that end the answer (from config and tokenizer); not part of the text. */
  stopIds: number[];
  /** --stop strings, matched on the visible reasoning and answer (never on markup). */
  stops: string[];
  maxTokens: number;
  /** Prompt plus answer tokens the plan reserved state for (chat --context); a turn that
   * would need more is refused (exit 2), as serve refuses it with a 400. */
  contextTokens?: number;
  /**
   * Aborting ends the answer after the current step (Ctrl-C), or its prompt's prefill within
   * a layer; no token is picked after an aborted prefill.
   */
  signal?: AbortSignal;
  /** Reuse of retained state, before the first step. */
  onStart?: (reuse: ReuseInfo) => void;
  /** Each piece of generated text, safe to show (whole characters, no stop string). */
  onText?: (piece: string) => void | Promise<void>;
  /** Every step, for checks that compare logits. */
  onStep?: (step: GenerateStep) => void;
  /** Speculation for this turn: undefined takes the session's, null turns it off. */
  speculation?: SpeculationConfig | null;
  /** Filled in when the turn speculates. */
  speculationStats?: SpeculationStats;
}

/** Why the answer ended. */
export type FinishReason = "stop" | "length" | "interrupted";

export interface TurnResult {
  message: HistoryMessage;
  /** The prompt ids (the rendered conversation). */
  prompt: number[];
  /** Generated ids, the stop id included. */
  ids: number[];
  /** Generated text with markers as text, without the stop id or a stop string. */
  text: string;
  reuse: ReuseInfo;
  finish: FinishReason;
  /** Problems the parser found in the tools channel. */
  malformed: string[];
  seconds: number;
  /** Prompt tokens run through the model (not reused), and for how long. */
  prefill: { tokens: number; seconds: number };
  /** Tokens generated after the first (which the prefill's last pass gives), and how long. */
  decode: { tokens: number; seconds: number };
  /**
   * The sequence state after the last step (prompt and answer but its last token); when
   * the prefill was interrupted, the prompt as far as whole passes ran.
   */
  state?: SequenceState;
}

/** Runs one assistant turn after `messages`. */
export async function runTurn(
  session: Session,
  tokenizer: Tokenizer,
  messages: HistoryMessage[],
  options: TurnOptions,
): Promise<TurnResult> {
  const render = { ...options.render, addGenerationPrompt: true };
  const context = options.contextTokens;
  // A message far over --context is refused before it is tokenised (50 MB: about a minute).
  const least = context === undefined ? 0 : leastChatTokens(tokenizer, messages, render);
  if (context !== undefined && least + options.maxTokens > context) {
    throw badInput(
      `the conversation is at least ${least} tokens and --max-tokens is ${options.maxTokens}: ` +
        `together over --context ${context}; raise --context, lower --max-tokens, or /reset`,
    );
  }
  const { ids: prompt } = renderChatIds(tokenizer, messages, render);
  if (context !== undefined && prompt.length + options.maxTokens > context) {
    throw badInput(
      `the conversation is ${prompt.length} tokens and --max-tokens is ${options.maxTokens}: ` +
        `together over --context ${context}; raise --context, lower --max-tokens, or /reset`,
    );
  }
  const t0 = performance.now();
  let state: SequenceState | undefined;
  const out = await generateText(session, prompt, {
    maxTokens: options.maxTokens,
    stopIds: options.stopIds,
    picker: options.picker ?? new Sampler(options.sampling),
    stream: new TextStream(tokenizer, {
      stops: options.stops,
      chat: { thinking: render.thinking ?? true },
    }),
    signal: options.signal,
    speculation: options.speculation,
    speculationStats: options.speculationStats,
    onStart: options.onStart,
    onText: options.onText,
    onStep: options.onStep,
    onState: (s) => (state = s),
  });
  const { ids, text, reuse } = out;
  const finish: FinishReason = out.finish === "aborted" ? "interrupted" : out.finish;
  const parsed = parseOutput(text, { thinking: render.thinking ?? true });
  const message: HistoryMessage = { role: "assistant", content: parsed.content };
  if (parsed.reasoning !== null) message.reasoning_content = parsed.reasoning;
  if (parsed.toolCalls.length > 0) {
    message.tool_calls = parsed.toolCalls.map((c) => ({
      type: "function",
      function: { name: c.name, arguments: c.arguments },
    }));
  }
  if (finish === "interrupted") message.interrupted = true;
  const end = performance.now(), seconds = (end - t0) / 1000;
  const reused = reuse.reusedTokens;
  const prefilled = (out.firstAt ? prompt.length : state?.position ?? reused) - reused;
  return {
    message,
    prompt,
    ids,
    text,
    reuse,
    finish,
    malformed: parsed.malformed,
    seconds,
    prefill: { tokens: prefilled, seconds: ((out.firstAt || end) - out.startedAt) / 1000 },
    decode: {
      tokens: Math.max(0, ids.length - 1),
      seconds: out.firstAt ? (out.lastAt - out.firstAt) / 1000 : 0,
    },
    state,
  };
}

/** The conversation state {@link conversationState} built. */
interface ConversationState {
  state: SequenceState;
  /** Tokens run through the model to build it (0 when the answer's own state fitted). */
  prefilled: number;
}

/**
 * The state of the whole conversation so far (`messages` rendered without a generation
 * prompt), which every next prompt extends, so a later turn prefills only its new message.
 * Built from the answer's own state when its tokens are a prefix of the rendering (then a
 * few closing tokens are run), else from the longest retained prefix (the answer is run
 * again as a prefill). The retained states are not changed.
 *
 * `signal` stops the prefill within a layer: the state is then a prefix of the
 * conversation, as far as whole passes ran (an already aborted signal runs nothing). The
 * event loop gets a turn after every layer, so a chat stays responsive meanwhile.
 */
export async function conversationState(
  session: Session,
  tokenizer: Tokenizer,
  messages: HistoryMessage[],
  render: RenderOptions,
  answer?: SequenceState,
  signal?: AbortSignal,
): Promise<ConversationState> {
  const { ids } = renderChatIds(tokenizer, messages, { ...render, addGenerationPrompt: false });
  let state = answer && isPrefix(answer.tokens, ids) ? answer : undefined;
  state ??= session.prefixes.take(ids) ??
    session.model.newState(signal?.aborted ? 0 : ids.length);
  const from = state.position, todo = ids.slice(from);
  try {
    // One call: the forward cuts it into the plan's passes, each committed whole.
    if (todo.length > 0 && !signal?.aborted) {
      await session.model.forward.forwardMany([{ state, ids: todo }], {
        betweenLayers: yieldToEventLoop,
        signal,
      });
    }
  } catch (e) {
    if (!(e instanceof ForwardAborted)) throw e;
  }
  return { state, prefilled: state.position - from };
}
