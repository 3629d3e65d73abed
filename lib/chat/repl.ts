/**
 * The chat loop: one user message per input (a line, or continued lines), an answer streamed
 * per turn, the history appended as it goes. Input comes from a terminal (line editing,
 * paste, input history: ./input.ts) or piped stdin (EOF ends the chat).
 *
 * Ctrl-C while an answer is generating stops that answer after the current step, or its
 * prompt's prefill within a layer; what was generated is kept (marked `interrupted`) and the
 * prompt returns. Ctrl-C at an empty prompt exits; on a line being typed it drops the line.
 *
 * With a history file, the whole conversation's state is built and written after each turn
 * in the background, while the user types: the next turn waits for it, Ctrl-C stops it
 * within a layer (keeping what was computed). After an interrupted turn nothing more is
 * computed: the state kept is the longest prefix of the conversation already computed.
 */
import { ExitCode } from "../errors.ts";
import type { Session } from "../generate/session.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import { AnswerPrinter, ChannelView, type ReasoningStyle, terminalSafe } from "./display.ts";
import {
  type HistoryLock,
  type HistoryMessage,
  HistoryWriter,
  type LoadedHistory,
  nextHistoryFile,
  saveConversation,
  stateFileFor,
} from "./history.ts";
import { type ChatInput, type InputResult, INTERRUPTED } from "./input.ts";
import type { PrefillMeter } from "./prefill.ts";
import type { ReuseInfo } from "../generate/session.ts";
import { conversationState, runTurn, type TurnOptions, type TurnResult } from "./turn.ts";
import { isPrefix } from "../generate/decode.ts";
import { renderChatIds } from "../text/chat.ts";
import { readStateFile, writeStateFile } from "../model/state_file.ts";

interface ChatSettings {
  session: Session;
  tokenizer: Tokenizer;
  /** Rendering, sampling and stop settings shared by every turn. */
  turn: Pick<
    TurnOptions,
    "render" | "sampling" | "stopIds" | "stops" | "maxTokens" | "contextTokens"
  >;
  reasoning: ReasoningStyle;
  /** The system prompt of a new conversation. */
  system?: string;
  /** JSONL history to continue and append to. */
  historyFile?: string;
  /**
   * Where the conversation's state is kept between chats (beside the history), and the
   * checkpoint identity it must match (lib/model/state_file.ts).
   */
  stateFile?: { file: string; identity: string };
  /** Status lines (reuse counts, warnings). */
  info: (line: string) => void;
  /** At a terminal: the prefill's progress line (fed by the model's per-layer hook). */
  prefill?: PrefillMeter;
}

const HELP = `commands:
  /reset        start a new conversation (the system prompt is kept); with --history it is
                recorded to a new file beside the first (FILE-2.jsonl, ...), named then
  /save FILE    write the whole conversation to FILE as JSONL (atomically)
  /exit         leave (so do Ctrl-D / EOF and Ctrl-C at an empty prompt)
  //text        send "/text" as a message
  end a line with \\ (or press Alt-Enter) to continue the message on the next line`;

const EMPTY: LoadedHistory = { messages: [], warnings: [], endsWithNewline: true };

/** A running chat. */
export class ChatRepl {
  messages: HistoryMessage[];
  #writer: HistoryWriter | undefined;
  #generating: AbortController | undefined;
  #promptInterrupted: (() => void) | undefined;
  #interruptPending = false;
  #input: ChatInput | undefined;
  /** The state file, while the history file records this conversation. */
  #stateFile: ChatSettings["stateFile"];
  /** The state build and write in progress (it runs while the user types). */
  #stateWrite: Promise<void> = Promise.resolve();
  /** Stops the state build in progress (what was computed is still written). */
  #stateBuild: AbortController | undefined;
  /** What failed in the background state build, thrown where the chat next waits for it. */
  #stateError: unknown;
  /** Locks of the history files /reset started, released when the chat ends. */
  readonly #locks: HistoryLock[] = [];

  private constructor(readonly settings: ChatSettings, messages: HistoryMessage[]) {
    this.messages = messages;
  }

  /**
   * Continues `loaded` (from {@link loadHistory} on settings.historyFile, or empty), reports
   * what it found, and writes the system prompt of a new conversation.
   */
  static async open(settings: ChatSettings, loaded: LoadedHistory = EMPTY): Promise<ChatRepl> {
    const file = settings.historyFile;
    for (const w of loaded.warnings) settings.info(`warning: ${w}`);
    const chat = new ChatRepl(settings, loaded.messages);
    if (file) chat.#writer = HistoryWriter.continuing(file, loaded);
    chat.#stateFile = settings.stateFile;
    if (loaded.messages.length === 0) {
      if (settings.system !== undefined) {
        await chat.#record({ role: "system", content: settings.system });
      }
    } else {
      chat.#reportResumed(file!);
      await chat.#resumeState();
    }
    return chat;
  }

  /** The system prompt this conversation started with, if any. */
  get system(): HistoryMessage | undefined {
    return this.messages[0]?.role === "system" ? this.messages[0] : undefined;
  }

  /** Reads messages until EOF, /exit or Ctrl-C at the prompt; returns the exit code. */
  async run(input: ChatInput): Promise<number> {
    this.#input = input;
    const onSigint = () => {
      if (this.#generating) this.#interruptTurn(this.#generating);
      else if (this.#promptInterrupted) this.#promptInterrupted();
      else this.#interruptPending = true; // between an answer and the prompt
    };
    Deno.addSignalListener("SIGINT", onSigint);
    try {
      for (;;) {
        const next = await this.#nextMessage(input);
        if (next === INTERRUPTED) {
          this.settings.info("(Ctrl-C at the prompt: leaving)");
          this.#stateBuild?.abort();
          return ExitCode.interrupted;
        }
        if (next === null) return ExitCode.ok;
        if (next.trim() === "") continue;
        if (!input.interactive) await writeStdout(`> ${next.replaceAll("\n", "\n... ")}\n`);
        if (next.startsWith("/") && !next.startsWith("//")) {
          if (await this.#command(next) === "exit") return ExitCode.ok;
        } else {
          await this.turn(next.startsWith("//") ? next.slice(1) : next);
        }
      }
    } finally {
      Deno.removeSignalListener("SIGINT", onSigint);
      this.#input = undefined;
      try {
        await this.#stateSaved();
      } finally {
        for (const lock of this.#locks.splice(0)) await lock.release();
      }
    }
  }

  /** Ctrl-C during a turn: stops its answer, and the state build it may be waiting for. */
  #interruptTurn(generating: AbortController): void {
    generating.abort();
    this.#stateBuild?.abort();
  }

  /** Waits for the background state build and write; rethrows what failed in it. */
  async #stateSaved(): Promise<void> {
    await this.#stateWrite;
    const error = this.#stateError;
    this.#stateError = undefined;
    if (error !== undefined) throw error;
  }

  /** One turn: record the user message, stream the answer, record the answer. */
  async turn(text: string): Promise<TurnResult> {
    const { session, tokenizer, turn, prefill } = this.settings;
    await this.#record({ role: "user", content: text });
    const n = this.messages.filter((m) => m.role === "user").length;
    const view = new ChannelView(turn.render.thinking ?? true);
    const printer = new AnswerPrinter(writeStdout, this.settings.reasoning, {
      erasable: Deno.stdout.isTerminal(),
    });
    this.#generating = new AbortController();
    const generating = this.#generating;
    // Keys typed during the answer wait for the next prompt; Ctrl-C typed stops the answer.
    this.#input?.hold(() => this.#interruptTurn(generating));
    let result: TurnResult;
    try {
      await this.#stateSaved(); // the state of the previous turn is on disk before a new one
      result = await runTurn(session, tokenizer, this.messages, {
        ...turn,
        signal: this.#generating.signal,
        onStart: (r) => this.#announce(n, r),
        onStep: prefill && (() => prefill.end()),
        onText: (piece) => printer.show(view.push(piece)),
      });
    } finally {
      // Without a first token (Ctrl-C, an error) the prefill line still ends.
      prefill?.end(true);
      this.#generating = undefined;
    }
    await printer.show(view.flush());
    await printer.end();
    await this.#record(result.message);
    this.#reportAnswer(n, result);
    this.#saveState(result);
    return result;
  }

  /**
   * The turn's first line: its prompt and what was reused; at a terminal a line that shows
   * the prefill's progress until the first token.
   */
  #announce(n: number, r: ReuseInfo): void {
    const { info, prefill } = this.settings;
    if (!prefill) {
      info(
        `turn ${n}: prompt ${r.promptTokens} tokens, reused ${r.reusedTokens} from retained state`,
      );
      return;
    }
    const head = `turn ${n}: prompt ${r.promptTokens} tokens (${r.reusedTokens} reused)`;
    prefill.begin(head, r.promptTokens - r.reusedTokens);
  }

  /** Offers the state saved beside the history to the session, when it fits. */
  async #resumeState(): Promise<void> {
    const saved = this.#stateFile;
    if (!saved) return;
    const { session, tokenizer, turn, info } = this.settings;
    const refuse = (why: string) =>
      info(`warning: state ${saved.file} not used: ${why}; the next turn prefills in full`);
    const got = await readStateFile(saved.file, session.model.config, saved.identity);
    if (!got.ok) return refuse(got.reason);
    const render = { ...turn.render, addGenerationPrompt: false };
    const { ids } = renderChatIds(tokenizer, this.messages, render);
    if (!isPrefix(got.state.tokens, ids)) {
      return refuse(
        `its ${got.state.position} tokens are not a prefix of this conversation ` +
          `(${ids.length} tokens: other --thinking or --effort, or the history changed)`,
      );
    }
    session.prefixes.remember(got.state);
    info(`state ${saved.file}: resuming ${got.state.position} of ${ids.length} tokens`);
  }

  /**
   * After a turn, in the background: builds the whole conversation's state, retains it (so
   * the next turn prefills only its new message) and writes it beside the history. After an
   * interrupted turn nothing is run: what was computed is kept.
   */
  #saveState(result: TurnResult): void {
    const saved = this.#stateFile;
    if (!saved) return;
    const stop = new AbortController();
    if (result.finish === "interrupted") stop.abort();
    this.#stateBuild = stop;
    this.#stateWrite = this.#buildState(saved, [...this.messages], result, stop.signal)
      .catch((e) => void (this.#stateError = e))
      .finally(() => {
        if (this.#stateBuild === stop) this.#stateBuild = undefined;
      });
  }

  async #buildState(
    saved: NonNullable<ChatSettings["stateFile"]>,
    messages: HistoryMessage[],
    result: TurnResult,
    signal: AbortSignal,
  ): Promise<void> {
    const { session, tokenizer, turn, info } = this.settings;
    const { state } = await conversationState(
      session,
      tokenizer,
      messages,
      turn.render,
      result.state,
      signal,
    );
    if (state.position === 0) return;
    session.prefixes.remember(state);
    await writeStateFile(saved.file, state, saved.identity, { logits: false })
      .catch((e) => info(`warning: cannot write the state ${saved.file}: ${e.message}`));
  }

  /** The next message, or INTERRUPTED when a SIGINT comes first. */
  async #nextMessage(input: ChatInput): Promise<InputResult> {
    if (this.#interruptPending) return INTERRUPTED;
    const interrupted = new Promise<typeof INTERRUPTED>((resolve) => {
      this.#promptInterrupted = () => resolve(INTERRUPTED);
    });
    try {
      return await Promise.race([input.read(), interrupted]);
    } finally {
      this.#promptInterrupted = undefined;
    }
  }

  /** Runs a /command; returns "exit" for /exit. */
  async #command(line: string): Promise<"exit" | void> {
    const [name, ...args] = line.trim().split(/\s+/);
    const info = this.settings.info;
    if (name === "/exit" || name === "/quit") return "exit";
    if (name === "/reset") return this.#reset();
    if (name === "/save") {
      const file = line.trim().slice(name.length).trim();
      if (!file) return info("usage: /save FILE");
      try {
        await saveConversation(file, this.messages);
        info(`saved ${this.messages.length} messages to ${file}`);
      } catch (e) {
        info(`error: /save ${file}: ${(e as Error).message}`);
      }
      return;
    }
    if (name !== "/help") info(`unknown command ${name} ${args.length ? "..." : ""}`.trim());
    info(HELP);
  }

  /**
   * A new conversation. With a history file it goes on being recorded, to a new file beside
   * the first, named at once: the user asked for the chat to be kept, the first file stays
   * the earlier conversation byte for byte (so `--history` on it resumes that one), and the
   * new one can be resumed by its name.
   */
  async #reset(): Promise<void> {
    // A state build still running writes the earlier conversation's file (it holds its name);
    // the next turn waits for it, as after any turn.
    const system = this.system;
    this.messages = system ? [system] : [];
    const kept = system ? "the system prompt is kept" : "no system prompt";
    if (!this.#writer) return this.settings.info(`new conversation (${kept})`);
    const previous = this.#writer.file;
    const next = await nextHistoryFile(previous);
    this.#locks.push(next.lock);
    this.#writer = HistoryWriter.continuing(next.file, EMPTY);
    if (this.#stateFile) this.#stateFile = { ...this.#stateFile, file: stateFileFor(next.file) };
    if (system) await this.#writer.append(system);
    this.settings.info(
      `new conversation (${kept}), recorded to ${next.file}; ${previous} keeps the earlier ` +
        `one (continue this one later with --history ${next.file})`,
    );
  }

  /** Adds a message to the conversation and, durably, to the history file. */
  async #record(message: HistoryMessage): Promise<void> {
    this.messages.push(message);
    await this.#writer?.append(message);
  }

  #reportResumed(file: string): void {
    const { info, system } = this.settings;
    const turns = this.messages.filter((m) => m.role === "user").length;
    info(
      `history ${file}: ${this.messages.length} messages (${turns} user turns) loaded; continuing`,
    );
    if (system !== undefined && this.system?.content !== system) {
      info(`warning: --system ignored: ${file} already holds the conversation's start`);
    }
    if (this.messages.at(-1)?.role === "user") {
      info(`note: the last user message in ${file} has no answer (the chat ended during it)`);
    }
  }

  #reportAnswer(n: number, r: TurnResult): void {
    const info = this.settings.info;
    const why = r.finish === "interrupted" ? "interrupted: kept what was generated" : r.finish;
    const todo = r.prompt.length - r.reuse.reusedTokens;
    const of = r.prefill.tokens < todo ? ` of ${todo}` : "";
    info(
      `turn ${n}: prefill ${r.prefill.tokens}${of} ${rated(r.prefill)}, ` +
        `decode ${r.decode.tokens} ${rated(r.decode)}, ${why}`,
    );
    for (const call of r.message.tool_calls ?? []) {
      const args = JSON.stringify(call.function.arguments);
      info(terminalSafe(`tool call: ${call.function.name} ${args}`));
    }
    for (const m of r.malformed) info(terminalSafe(`warning: malformed tool call: ${m}`));
  }
}

/** "tokens in S s (R tok/s)" of a phase (no rate for an empty one). */
function rated(phase: { tokens: number; seconds: number }): string {
  const time = `tokens in ${phase.seconds.toFixed(2)} s`;
  if (phase.tokens === 0) return time;
  return `${time} (${(phase.tokens / Math.max(phase.seconds, 1e-9)).toFixed(1)} tok/s)`;
}

async function writeStdout(text: string): Promise<void> {
  const bytes = new TextEncoder().encode(text);
  for (let done = 0; done < bytes.length;) done += await Deno.stdout.write(bytes.subarray(done));
}
