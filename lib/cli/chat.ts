/**
 * `k3 chat MODEL_DIR [--system S] [--history FILE.jsonl] [--thinking on|off] ...`: an
 * interactive chat on the XTML format, with durable history and retained state across turns.
 */
import { loadingBar } from "../io/progress.ts";
import { badInput, ExitCode } from "../errors.ts";
import { formatBytes } from "../io/sizes.ts";
import { type Engine, openEngine } from "../engine/open.ts";
import { checkpointIdentity } from "../model/state_file.ts";
import { Session } from "../generate/session.ts";
import type { ThinkingEffort } from "../text/chat.ts";
import { type LoadedHistory, loadHistory, lockHistory, stateFileFor } from "../chat/history.ts";
import { ChatRepl } from "../chat/repl.ts";
import { PrefillMeter } from "../chat/prefill.ts";
import { type ChatInput, inputHistoryFile, PipedInput, TerminalInput } from "../chat/input.ts";
import type { ReasoningStyle } from "../chat/display.ts";
import {
  applyThreads,
  ignoredSamplingFlags,
  maxTokensFlag,
  modelDirArg,
  parseCommand,
  SAMPLING_HELP,
  SAMPLING_OPTIONS,
  samplingFlags,
  stopFlags,
} from "./flags.ts";
import {
  CONTEXT_DEFAULT_HELP,
  contextFlag,
  listPresetsIfAsked,
  MEMORY_HELP,
  MEMORY_OPTIONS,
  memoryFlags,
  PREFILL_CHUNK,
} from "./memory_flags.ts";
import { SPECULATE_HELP, SPECULATE_OPTIONS, speculationFlags } from "./speculate_flags.ts";

const DEFAULT_MAX_TOKENS = 4096;

const HELP = `usage: k3 chat MODEL_DIR [options]

One user message per input line, from a terminal or piped stdin (EOF ends the chat). End a
line with \\ (or press Alt-Enter) to go on with the same message on the next line; a paste
of several lines is one message. The answer streams as it is generated; each turn resumes
from the retained state of the previous prompt and reports how many prompt tokens it reused.

conversation:
  --system TEXT         system prompt of a new conversation
  --history FILE.jsonl  load FILE and continue it; every message is appended and fsynced
                        (one JSON message per line). A truncated last line is reported and
                        left in place; a bad line before it is an error (exit 2). Beside it:
                        FILE.jsonl.state, the conversation's state after each turn (so the
                        next chat prefills only its new message), and
                        FILE.jsonl.input-history, the typed input history.
  --context N           prompt + answer tokens the plan reserves state for
                        (${CONTEXT_DEFAULT_HELP})
answers:
  --thinking on|off     the think channel (default on)
  --effort low|high|max thinking effort (default max)
  --hide-reasoning      do not show the reasoning (it is still kept in the history): a
                        "thinking…" line (counting seconds at a terminal) stands in for
                        it until the answer comes
  --max-tokens N        generate at most N tokens per answer (default ${DEFAULT_MAX_TOKENS})
${SAMPLING_HELP}
${SPECULATE_HELP}
machine:
  --threads N           OpenMP threads (default: OMP_NUM_THREADS or all cores)
${MEMORY_HELP}

in the chat:
  /reset  /save FILE  /exit  /help   (/reset with --history records the new conversation
  to FILE-2.jsonl beside FILE.jsonl, and names it)
  keys: arrows, Home/End, Ctrl-A/E/W/K/U, Up/Down through earlier input, Ctrl-L clears the
  screen; Ctrl-C stops an answer (kept, marked interrupted), clears a line being typed, and
  at an empty prompt leaves (exit 130); Ctrl-D at an empty prompt leaves (exit 0)
`;

/** The flags `k3 chat` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  system: { type: "string" },
  history: { type: "string" },
  thinking: { type: "string" },
  effort: { type: "string" },
  "hide-reasoning": { type: "boolean" },
  ...SAMPLING_OPTIONS,
  ...SPECULATE_OPTIONS,
  threads: { type: "string" },
  context: { type: "string" },
  ...MEMORY_OPTIONS,
  help: { type: "boolean", short: "h" },
} as const;

type ChatValues = NonNullable<ReturnType<typeof parseChat>>["values"];

function parseChat(args: string[]) {
  return parseCommand(args, OPTIONS, HELP);
}

export async function chatCommand(args: string[]): Promise<number> {
  const parsed = parseChat(args);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  if (listPresetsIfAsked(values)) return ExitCode.ok;
  const dir = modelDirArg(positionals, "chat");
  const flags = chatFlags(values);
  applyThreads(values.threads);

  // One chat per history: its lock is taken, and the history checked, before the (possibly
  // huge) model is loaded. The lock is released when this function returns or throws.
  await using _lock = values.history ? await lockHistory(values.history) : undefined;
  const history = values.history ? await loadHistory(values.history) : undefined;
  // At a terminal a turn's prefill shows its progress, layer by layer.
  let meter: PrefillMeter | undefined;
  const engine = await openEngine(dir, {
    ...memoryFlags(values),
    context: flags.context,
    draftMax: flags.speculation?.draftMax,
    stoppable: true,
    log: info,
    load: Deno.stderr.isTerminal()
      ? { onLoad: loadingBar(), onLayer: () => meter?.layer() }
      : undefined,
  });
  try {
    const forward = engine.model.forward;
    if (Deno.stderr.isTerminal()) {
      meter = new PrefillMeter(forward.layers, forward.maxTokens, toStderr);
    }
    const chat = await openRepl(engine, values, flags, history, meter);
    const input: ChatInput = Deno.stdin.isTerminal()
      ? await TerminalInput.open(values.history && inputHistoryFile(values.history))
      : new PipedInput(Deno.stdin.readable);
    info(startLine(positionals[0], engine, flags));
    try {
      return await chat.run(input);
    } finally {
      await input.close();
    }
  } finally {
    engine.close();
  }
}

const info = (line: string) => console.error(line);
const toStderr = (text: string) => void Deno.stderr.writeSync(new TextEncoder().encode(text));

/** The line before the first prompt: what is loaded, how, and where the commands are. */
function startLine(model: string, engine: Engine, flags: ReturnType<typeof chatFlags>): string {
  const plan = engine.plan;
  const thinking = flags.thinking ? `thinking on (effort ${flags.effort})` : "thinking off";
  return `k3 chat: ${model}, preset ${plan.source} (${formatBytes(plan.total)} planned), ` +
    `context ${flags.context}, ${thinking}; /help for commands, Ctrl-D to leave`;
}

/** The conversation and generation flags, checked. */
function chatFlags(values: ChatValues) {
  const flags = {
    context: contextFlag(values.context, values),
    thinking: onOff("thinking", values.thinking ?? "on"),
    effort: effortFlag(values.effort ?? "max"),
    sampling: samplingFlags(values),
    speculation: speculationFlags(values),
    stops: stopFlags(values),
    maxTokens: maxTokensFlag(values, DEFAULT_MAX_TOKENS),
  };
  const ignored = ignoredSamplingFlags(values);
  if (ignored.length) info(`note: ${ignored.join(", ")} only act with --temperature > 0`);
  return flags;
}

/** The chat loop on the opened engine, resuming `history` when there is one. */
async function openRepl(
  engine: Engine,
  values: ChatValues,
  flags: ReturnType<typeof chatFlags>,
  history: LoadedHistory | undefined,
  prefill: PrefillMeter | undefined,
): Promise<ChatRepl> {
  const { model, tokenizer } = engine;
  return await ChatRepl.open({
    // A new message is a lone prompt: one layer-major pass as wide as the plan holds (the
    // Session's default pass cap).
    session: new Session(model, {
      prefillChunk: PREFILL_CHUNK,
      speculation: flags.speculation,
    }),
    tokenizer,
    turn: {
      render: { thinking: flags.thinking, thinkingEffort: flags.effort },
      sampling: flags.sampling,
      stopIds: engine.stopIds,
      stops: flags.stops,
      maxTokens: flags.maxTokens,
      contextTokens: flags.context,
    },
    reasoning: reasoningStyle(values["hide-reasoning"] ?? false),
    system: values.system,
    historyFile: values.history,
    stateFile: values.history
      ? {
        file: stateFileFor(values.history),
        identity: await checkpointIdentity(engine.checkpoint),
      }
      : undefined,
    info,
    prefill,
  }, history);
}

/** Dimmed on a colour terminal, labelled otherwise (NO_COLOR respected), or hidden. */
function reasoningStyle(hide: boolean): ReasoningStyle {
  if (hide) return "hide";
  const color = Deno.stdout.isTerminal() && !Deno.env.get("NO_COLOR");
  return color ? "dim" : "label";
}

function onOff(name: string, value: string): boolean {
  if (value === "on" || value === "off") return value === "on";
  throw badInput(`--${name} wants on or off, got '${value}'`);
}

function effortFlag(value: string): ThinkingEffort {
  if (value === "low" || value === "high" || value === "max") return value;
  throw badInput(`--effort wants low, high or max, got '${value}'`);
}
