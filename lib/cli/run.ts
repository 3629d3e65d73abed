/**
 * `k3 run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) --gen N ...`
 */
import * as path from "node:path";
import { k3Isa, k3Threads } from "../../ffi/library.ts";
import { badInput, ExitCode } from "../errors.ts";
import { type LoadedModel, loadModel, type ModelFiles, openModelFiles } from "../engine/open.ts";
import type { MemoryOptions } from "../engine/open.ts";
import { generate, type GenerateStep } from "../generate/decode.ts";
import { yieldToEventLoop } from "../generate/text.ts";
import { checkWritable, checkWritableDir, writeFailure, writeFileAtomic } from "../io/atomic.ts";
import { MAX_TEXT_BYTES, readUserText } from "../io/files.ts";
import { loadingBar, ProgressBar } from "../io/progress.ts";
import { formatBytes, peakRssBytes } from "../io/sizes.ts";
import type { MemoryPlan } from "../memory/plan.ts";
import { presetByName } from "../memory/presets.ts";
import { expertBlockBytes } from "../memory/sources.ts";
import { type IoSnapshot, streamReport, takeSnapshot } from "../memory/stats.ts";
import { writeTrace } from "../memory/trace.ts";
import type { SequenceState } from "../model/state.ts";
import { checkpointIdentity, readStateFile, writeStateFile } from "../model/state_file.ts";
import {
  newSpeculationStats,
  speculateOptions,
  type SpeculationConfig,
  type SpeculationStats,
} from "../speculate/speculate.ts";
import { terminalSafe } from "../chat/display.ts";
import { checkLogitBias, type SamplingOptions } from "../text/sampler.ts";
import { TextStream } from "../text/stream.ts";
import type { Tokenizer } from "../text/tokenizer.ts";
import {
  applyThreads,
  idsFlag,
  ignoredSamplingFlags,
  intFlag,
  maxTokensFlag,
  modelDirArg,
  parseCommand,
  SAMPLING_HELP,
  SAMPLING_OPTIONS,
  samplingFlags,
  stopFlags,
} from "./flags.ts";
import { listPresetsIfAsked, MEMORY_HELP, MEMORY_OPTIONS, memoryFlags } from "./memory_flags.ts";
import {
  formatSpeculation,
  SPECULATE_HELP,
  SPECULATE_OPTIONS,
  speculationFlags,
} from "./speculate_flags.ts";
import { formatStep, STEP_HEADER } from "./step_table.ts";
import { GRAMMAR_HELP, GRAMMAR_OPTIONS, grammarFlags, grammarPicker } from "./grammar_flags.ts";
import type { GrammarSpec } from "../text/grammar.ts";

const HELP =
  `usage: k3 run MODEL_DIR ["TEXT" | --prompt TEXT | --prompt-file FILE | --ids 1,2,3] [options]
       echo TEXT | k3 run MODEL_DIR [options]

prompt (one of them; without any, piped stdin is the prompt):
  "TEXT"                the argument after MODEL_DIR: text, as --prompt
  --ids LIST            comma-separated token ids (no tokenizer needed)
  --prompt TEXT         text, tokenized with the model's tiktoken.model (specials as plain text)
  --prompt-file FILE    UTF-8 text from a file; - reads stdin
generation:
  --gen N               tokens to generate at most (default 16)
  --max-tokens N        the same as --gen
  --ignore-eos          do not stop at the end-of-message / [EOS] ids (with --ids,
                        generation never stops early: exactly --gen tokens)
  --recompute           re-run the whole sequence every step, carrying no cache (a check mode)
  --prefill-chunk N     compute the prompt N tokens at a time inside each layer (bounds the
                        scratch; each layer's weights are still read once for the prompt)
${SAMPLING_HELP}
${SPECULATE_HELP}
${GRAMMAR_HELP}
output:
  --out FILE.json       write the run record (ids, text, timings, peak RSS); - writes it to
                        stdout (the generated text then goes to stderr)
  --dump-logits FILE    write every step's logits as little-endian float32 (gen x vocab)
  --quiet               no report; stream the generated text (or ids) to stdout as it comes
  --dump-cache-trace DIR  write DIR/expert_trace.jsonl (replay with k3 sim-cache)
state (resume a prompt in a later run instead of prefilling it again):
  --save-state FILE     write the sequence state at the end of the run (atomically)
  --load-state FILE     start from FILE when its tokens are a prefix of this prompt; a
                        missing, stale, truncated or foreign FILE is ignored with a warning
Ctrl-C stops after the current step: the report is printed, --out (marked interrupted),
--dump-logits and --save-state are written with the steps so far, and the exit code is 130.
${MEMORY_HELP}
machine:
  --threads N           OpenMP threads (default: OMP_NUM_THREADS or all cores)
  --layers N            bind only the first N layers (diagnostics; not the model's output)
`;

/** The flags `k3 run` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  ids: { type: "string" },
  prompt: { type: "string" },
  "prompt-file": { type: "string" },
  gen: { type: "string" },
  ...SAMPLING_OPTIONS,
  ...SPECULATE_OPTIONS,
  ...GRAMMAR_OPTIONS,
  "ignore-eos": { type: "boolean" },
  recompute: { type: "boolean" },
  "prefill-chunk": { type: "string" },
  out: { type: "string" },
  "dump-logits": { type: "string" },
  quiet: { type: "boolean" },
  threads: { type: "string" },
  layers: { type: "string" },
  ...MEMORY_OPTIONS,
  "dump-cache-trace": { type: "string" },
  "save-state": { type: "string" },
  "load-state": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** What `k3 run`'s flags ask for, checked before anything is opened. */
interface RunFlags {
  values: RunValues;
  dir: string;
  gen: number;
  sampling: SamplingOptions;
  stops: string[];
  speculation?: SpeculationConfig;
  /** --json-schema / --grammar, read and checked. */
  grammar?: GrammarSpec;
  memory: MemoryOptions;
  layers?: number;
  chunk?: number;
  log: (line: string) => void;
  source: PromptSource;
}

type RunValues = NonNullable<ReturnType<typeof parseRun>>["values"];

function parseRun(args: string[]) {
  return parseCommand(args, OPTIONS, HELP);
}

/** The model, its prompt and what the run keeps, once everything is loaded. */
interface LoadedRun {
  flags: RunFlags;
  prompt: number[];
  tokenizer?: Tokenizer;
  loaded: LoadedModel;
  identity?: string;
  progress?: LoadProgress;
  openSeconds: number;
  loadSeconds: number;
}

export async function runCommand(args: string[]): Promise<number> {
  const parsed = parseRun(args);
  if (!parsed) return ExitCode.ok;
  if (listPresetsIfAsked(parsed.values)) return ExitCode.ok;
  const flags = {
    ...runFlags(parsed.values, parsed.positionals),
    grammar: await grammarFlags(parsed.values),
  };
  const t0 = performance.now();
  const files = await openModelFiles(flags.dir, {
    layers: flags.layers,
    tokenizer: flags.source.kind === "ids" ? "optional" : "required",
  });
  // With --ids the tokenizer only decodes for display: without one, ids are printed.
  if (files.tokenizerNote) console.error(`k3: not decoding text (${files.tokenizerNote})`);
  try {
    const run = await loadRun(flags, files, t0);
    try {
      return await generateAndReport(run);
    } finally {
      run.loaded.model.close();
    }
  } finally {
    files.tokenizer?.free();
  }
}

/** Every flag checked and mapped, before anything is opened. */
function runFlags(values: RunValues, positionals: string[]): RunFlags {
  const dir = modelDirArg(positionals.slice(0, 1), "run");
  const source = promptSource(values, positionals);
  const gen = maxTokensFlag(values, 16);
  const sampling = samplingFlags(values);
  const stops = stopFlags(values);
  const speculation = speculationFlags(values);
  if (speculation && values.recompute) {
    throw badInput("--speculate needs a carried state; it cannot run with --recompute");
  }
  for (const flag of ["dump-logits", "save-state", "load-state", "dump-cache-trace"] as const) {
    if (values[flag] === "-") {
      throw badInput(`--${flag} wants a file, not - (only --out and --prompt-file take stdio)`);
    }
  }
  if (values.recompute && (values["save-state"] || values["load-state"])) {
    throw badInput(
      "--recompute carries no state: it cannot be used with --save-state/--load-state",
    );
  }
  const memory = memoryFlags(values);
  applyThreads(values.threads);
  const layers = values.layers === undefined ? undefined : intFlag("layers", values.layers, 0, 1);
  const chunk = values["prefill-chunk"] === undefined
    ? undefined
    : intFlag("prefill-chunk", values["prefill-chunk"], 1, 1);
  const log = values.quiet ? () => {} : (s: string) => console.error(s);
  return { values, dir, gen, sampling, stops, speculation, memory, layers, chunk, log, source };
}

/** Where the prompt comes from: one of the flags, the argument after MODEL_DIR, or stdin. */
type PromptSource =
  | { kind: "ids"; ids: string }
  | { kind: "text"; text: string }
  | { kind: "file"; file: string }
  | { kind: "stdin"; implicit: boolean };

const PROMPT_WAYS = `k3 run MODEL_DIR "TEXT", --prompt TEXT, --prompt-file FILE (- for stdin), ` +
  `--ids 1,2,3, or pipe the text in`;

/**
 * The one prompt asked for. Without a prompt flag or argument, piped stdin is the prompt (a
 * terminal is not read: the run would seem to hang).
 */
function promptSource(values: RunValues, positionals: string[]): PromptSource {
  if (positionals.length > 2) {
    const words = positionals.slice(1).join(" ").replaceAll('"', '\\"');
    throw badInput(
      `k3 run takes the prompt as one argument; quote it: k3 run ${positionals[0]} "${words}"`,
    );
  }
  const given: PromptSource[] = [];
  if (values.ids !== undefined) given.push({ kind: "ids", ids: values.ids });
  if (values.prompt !== undefined) given.push({ kind: "text", text: values.prompt });
  if (positionals.length === 2) given.push({ kind: "text", text: positionals[1] });
  const file = values["prompt-file"];
  if (file !== undefined) {
    given.push(file === "-" ? { kind: "stdin", implicit: false } : { kind: "file", file });
  }
  if (given.length > 1) throw badInput(`give the prompt once: ${PROMPT_WAYS}`);
  if (given.length === 1) return given[0];
  if (Deno.stdin.isTerminal()) throw badInput(`no prompt: give one as ${PROMPT_WAYS}`);
  return { kind: "stdin", implicit: true };
}

/** The prompt read and checked against the checkpoint, then the model loaded under its plan. */
async function loadRun(flags: RunFlags, files: ModelFiles, t0: number): Promise<LoadedRun> {
  const { values, gen } = flags;
  const prompt = await promptIds(flags, files.tokenizer);
  const ckpt = files.checkpoint;
  const openSeconds = (performance.now() - t0) / 1000;
  const vocab = ckpt.config.vocabSize;
  const bad = prompt.find((id) => id >= vocab);
  if (bad !== undefined) {
    throw badInput(`token id ${bad} is outside the vocabulary (0..${vocab - 1})`);
  }
  checkLogitBias(flags.sampling, vocab, "--logit-bias");
  await checkOutputs(values, gen * vocab * 4);
  const identity = values["save-state"] || values["load-state"]
    ? await checkpointIdentity(ckpt)
    : undefined;
  const progress = values.quiet ? undefined : new LoadProgress(ckpt.refs.layers.length);
  const positions = prompt.length + gen;
  checkPresetContext(values.preset, positions);
  const loaded = await loadModel(files, {
    ...flags.memory,
    context: positions,
    // The whole prompt in one layer-major pass when the budget holds it.
    prefillTokens: values.recompute ? 0 : prompt.length,
    prefillChunk: values.recompute
      ? positions
      : Math.min(flags.chunk ?? prompt.length, prompt.length),
    extraBytes: values["dump-logits"] ? gen * vocab * 4 : 0,
    draftMax: flags.speculation?.draftMax,
    log: flags.log,
    load: {
      trace: values["dump-cache-trace"] !== undefined,
      onLoad: progress && ((d, n) => progress.loaded(d, n)),
      onLayer: progress && ((i) => progress.layer(i)),
    },
  });
  const loadSeconds = (performance.now() - t0) / 1000;
  return {
    flags,
    prompt,
    tokenizer: files.tokenizer,
    loaded,
    identity,
    progress,
    openSeconds,
    loadSeconds,
  };
}

/** The prompt's ids: --ids as given, or the text tokenized (specials as plain text). */
async function promptIds(flags: RunFlags, tokenizer?: Tokenizer): Promise<number[]> {
  const source = flags.source;
  if (source.kind === "ids") return idsFlag(source.ids);
  const text = source.kind === "text"
    ? source.text
    : source.kind === "file"
    ? await readPromptFile(source.file)
    : await readStdinPrompt(source.implicit, flags.log).then((text) =>
      // `echo TEXT | k3 run DIR` is `k3 run DIR "TEXT"`: echo's newline is not the prompt's.
      // `--prompt-file -` keeps every byte, as --prompt-file FILE does.
      source.implicit ? text.replace(/\r?\n$/, "") : text
    );
  const prompt = tokenizer!.encode(text, { allowSpecial: false });
  if (prompt.length === 0) throw badInput("the prompt is empty after tokenization");
  return prompt;
}

/** The prompt piped in: UTF-8 up to the size a prompt file may have. */
async function readStdinPrompt(implicit: boolean, log: (line: string) => void): Promise<string> {
  const what = implicit ? "stdin (no prompt was given otherwise)" : "--prompt-file - (stdin)";
  log(`reading the prompt from ${what}`);
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of Deno.stdin.readable) {
    chunks.push(chunk);
    size += chunk.length;
    if (size > MAX_TEXT_BYTES) {
      throw badInput(`the prompt on ${what} is over ${MAX_TEXT_BYTES >> 20} MiB`);
    }
  }
  const bytes = new Uint8Array(size);
  chunks.reduce((at, c) => (bytes.set(c, at), at + c.length), 0);
  if (size === 0) throw badInput(`no prompt: ${what} was empty; give one as ${PROMPT_WAYS}`);
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw badInput(`the prompt on ${what} is not UTF-8 text`);
  }
}

/** The run's header lines, the generation, the report and every output asked for. */
async function generateAndReport(run: LoadedRun): Promise<number> {
  const { flags, prompt, loaded } = run;
  const { model, plan, packPath } = loaded;
  const c = model.config, log = flags.log;
  log(
    `model ${flags.dir}: ${c.numLayers} layers, hidden ${c.hiddenSize}, vocab ${c.vocabSize}, ` +
      `${c.numExperts} experts top-${c.topK}; opened in ${run.openSeconds.toFixed(2)} s, ` +
      `loaded in ${(run.loadSeconds - run.openSeconds).toFixed(2)} s more`,
  );
  log(`threads ${k3Threads()}, isa ${k3Isa()}, prompt ${prompt.length} tokens, gen ${flags.gen}`);
  if (c.defaultsApplied.length) log(`defaults applied: ${c.defaultsApplied.join(", ")}`);
  log(`trunk from ${packPath ?? "the shards"}; ${describeStreaming(plan)}`);
  const decodes = run.tokenizer !== undefined;
  if (flags.stops.length > 0 && !decodes) {
    throw badInput("--stop matches text: it needs the tokenizer");
  }
  const ignored = ignoredSamplingFlags(flags.values);
  if (ignored.length) log(`note: ${ignored.join(", ")} only act with --temperature > 0`);
  const resume = await resumeState(run);
  log(STEP_HEADER);
  const out = await decodeSteps(run, resume);
  const report = printReport(run, out);
  await writeOutputs(run, out, report, resume.tokens);
  return out.interrupted ? ExitCode.interrupted : ExitCode.ok;
}

/** --load-state: the state to resume when its tokens are a prefix of the prompt. */
async function resumeState(run: LoadedRun): Promise<{ state?: SequenceState; tokens: number }> {
  const file = run.flags.values["load-state"];
  if (!file) return { tokens: 0 };
  const got = await readStateFile(file, run.loaded.model.config, run.identity!, run.prompt);
  if (!got.ok) {
    console.error(
      `warning: --load-state ${file} not used: ${got.reason}; prefilling the prompt in full`,
    );
    return { tokens: 0 };
  }
  const state = got.state;
  state.reserve(run.prompt.length + run.flags.gen); // the capacity the plan counted, at once
  run.flags.log(`state ${file}: resuming ${state.position} of ${run.prompt.length} prompt tokens`);
  return { state, tokens: state.position };
}

/** Cache hits and bytes read in one step. */
interface StepIo {
  hitPct?: number;
  gbRead: number;
  trunkGb: number;
  expertGb: number;
}

/** What the decode loop produced. */
interface Decoded {
  steps: GenerateStep[];
  rows: StepIo[];
  logits: Float32Array[];
  text: string;
  stoppedByString: boolean;
  interrupted: boolean;
  ioStart: IoSnapshot;
  afterFirst?: IoSnapshot;
  specStats: SpeculationStats;
}

/** Generates, printing a table row per step (or, with --quiet, the bare text as it comes). */
async function decodeSteps(
  run: LoadedRun,
  resume: { state?: SequenceState },
): Promise<Decoded> {
  const { flags, loaded, prompt } = run;
  const { values } = flags;
  const model = loaded.model;
  // Ids in, ids out is the raw mode: exactly --gen tokens, as --dump-logits promises.
  const raw = values.ids !== undefined;
  const stopIds = values["ignore-eos"] || raw ? [] : loaded.stopIds;
  // --stop matches the text of ordinary tokens only, never a special token's name.
  const stream = run.tokenizer ? new TextStream(run.tokenizer, { stops: flags.stops }) : undefined;
  // Ctrl-C: stop after the current step, then report and write what was asked.
  const interrupt = new AbortController();
  const onSigint = () => interrupt.abort();
  Deno.addSignalListener("SIGINT", onSigint);
  const ioStart = takeSnapshot(model);
  const out: Decoded = {
    steps: [],
    rows: [],
    logits: [],
    text: "",
    stoppedByString: false,
    interrupted: false,
    ioStart,
    specStats: newSpeculationStats(),
  };
  let before = ioStart;
  const speculation = flags.speculation;
  for await (
    const step of generate(model, prompt, {
      maxTokens: flags.gen,
      stopIds,
      picker: await grammarPicker(
        flags.grammar,
        flags.sampling,
        run.tokenizer,
        model.config.vocabSize,
        stopIds,
      ),
      recompute: values.recompute,
      prefillChunk: flags.chunk,
      state: resume.state,
      signal: interrupt.signal,
      speculate: speculation && speculateOptions(model, speculation, out.specStats),
    })
  ) {
    run.progress?.done();
    out.steps.push(step);
    const now = takeSnapshot(model);
    if (step.index === 0) out.afterFirst = now;
    const row = stepIo(before, now);
    out.rows.push(row);
    before = now;
    if (model.stream?.trace) model.stream.trace.step = step.index + 1;
    if (values["dump-logits"]) out.logits.push(step.logits);
    const { emit: piece, stopped } = stream?.push(step.token) ??
      { emit: `${step.index ? "," : ""}${step.token}`, stopped: false };
    out.text += piece;
    await showStep(values, step, piece, row);
    if (stopped) {
      out.stoppedByString = true;
      break;
    }
    await yieldToEventLoop(); // lets a Ctrl-C be seen between steps
  }
  Deno.removeSignalListener("SIGINT", onSigint);
  const last = out.steps.at(-1);
  out.interrupted = interrupt.signal.aborted && !out.stoppedByString && !last?.stop &&
    out.steps.length < flags.gen;
  if (out.interrupted) console.error(`interrupted (Ctrl-C) after ${out.steps.length} tokens`);
  const tail = stream?.flush() ?? "";
  out.text += tail;
  const text = textOutput(values);
  if (values.quiet) await text.write(text.shown(tail) + "\n");
  else await text.write(text.shown(out.text) + "\n");
  return out;
}

/** The cache hit rate and bytes read between two snapshots. */
function stepIo(before: IoSnapshot, now: IoSnapshot): StepIo {
  const requests = now.requests - before.requests;
  return {
    hitPct: requests > 0 ? (100 * (now.hits - before.hits)) / requests : undefined,
    gbRead: (now.bytes - before.bytes) / 1e9,
    trunkGb: ((now.io?.trunkBytes ?? 0) - (before.io?.trunkBytes ?? 0)) / 1e9,
    expertGb: ((now.io?.expertBytes ?? 0) - (before.io?.expertBytes ?? 0)) / 1e9,
  };
}

/**
 * Where the generated text goes: stdout, or stderr when `--out -` makes stdout the record's
 * (so stdout is one JSON document a pipe can parse). At a terminal it is shown terminal-safe.
 */
function textOutput(values: RunValues) {
  const stream = values.out === "-" ? Deno.stderr : Deno.stdout;
  const shown = stream.isTerminal() ? terminalSafe : (t: string) => t;
  return { shown, write: (text: string) => writeAll(stream, text) };
}

/** With the table on, each row shows its piece; with --quiet, the bare text streams. */
async function showStep(
  values: RunValues,
  step: GenerateStep,
  piece: string,
  row: StepIo,
): Promise<void> {
  if (values.quiet) {
    const text = textOutput(values);
    await text.write(text.shown(piece));
    return;
  }
  const cells = {
    ...step,
    step: step.index,
    text: piece,
    cacheHitPct: row.hitPct,
    gbRead: row.gbRead,
  };
  console.error(terminalSafe(formatStep(cells)));
}

/** The end-of-run report (memory, speed, speculation), and what it measured. */
interface RunSummary {
  memory: ReturnType<typeof streamReport>;
  peak: number;
  decoded: number;
  trunkBytes: number;
  expertBytes: number;
}

function printReport(run: LoadedRun, out: Decoded): RunSummary {
  const { flags, loaded } = run;
  const { model, plan, request } = loaded;
  const log = flags.log;
  const seconds = out.steps.reduce((a, s) => a + s.seconds, 0);
  const peak = peakRssBytes();
  const memoryMax = request.memoryMaxGb === undefined ? undefined : request.memoryMaxGb * 1e9;
  const end = takeSnapshot(model);
  const memory = streamReport(model, plan, out.ioStart, end, seconds, peak, memoryMax);
  log(memory.text);
  log(
    `${out.steps.length} tokens in ${seconds.toFixed(3)} s, ` +
      `${(seconds / Math.max(1, out.steps.length)).toFixed(4)} s/token; ` +
      `PEAK RSS ${formatBytes(peak)}`,
  );
  // Decoding after the first token (which comes with the prefill) is what speculation changes.
  const decoded = Math.max(0, out.steps.length - 1);
  const trunkBytes = (end.io?.trunkBytes ?? 0) - (out.afterFirst?.io?.trunkBytes ?? 0);
  const expertBytes = (end.io?.expertBytes ?? 0) - (out.afterFirst?.io?.expertBytes ?? 0);
  if (flags.speculation) {
    log(formatSpeculation(flags.speculation, out.specStats, decoded, trunkBytes));
  }
  if (memory.warning) console.error(memory.warning);
  return { memory, peak, decoded, trunkBytes, expertBytes };
}

/** --dump-cache-trace, --out, --dump-logits and --save-state, as asked. */
async function writeOutputs(
  run: LoadedRun,
  out: Decoded,
  summary: RunSummary,
  resumedTokens: number,
): Promise<void> {
  const { values, log } = run.flags;
  const model = run.loaded.model;
  const trace = model.stream?.trace;
  if (trace && values["dump-cache-trace"]) {
    const dir = values["dump-cache-trace"];
    const file = await writeTrace(dir, {
      layers: model.config.numLayers,
      experts: model.config.numExperts,
      expert_bytes: expertBlockBytes(model.checkpoint.refs),
    }, trace.records).catch((e) => {
      throw writeFailure(dir, e);
    });
    log(`cache trace: ${file} (${trace.records.length} requests)`);
  }
  if (values.out) {
    const json = JSON.stringify(runRecord(run, out, summary, resumedTokens), null, 2) + "\n";
    if (values.out === "-") await writeAll(Deno.stdout, json);
    else await writeFileAtomic(values.out, json);
  }
  if (values["dump-logits"]) await writeFileAtomic(values["dump-logits"], concatLogits(out.logits));
  const last = out.steps.at(-1)?.state;
  if (values["save-state"] && last) {
    const bytes = await writeStateFile(values["save-state"], last, run.identity!);
    log(`state ${values["save-state"]}: ${last.position} tokens, ${formatBytes(bytes)}`);
  }
}

/** The --out record: ids, text, timings, memory, per-step I/O and speculation. */
function runRecord(run: LoadedRun, out: Decoded, summary: RunSummary, resumedTokens: number) {
  const { steps, rows } = out;
  const { decoded, trunkBytes, expertBytes } = summary;
  return {
    model: path.resolve(run.flags.dir),
    prompt_ids: run.prompt,
    generated_ids: steps.map((s) => s.token),
    text: run.tokenizer ? out.text : undefined,
    stop_reason: out.interrupted
      ? "interrupted"
      : out.stoppedByString
      ? "stop_string"
      : steps.at(-1)?.stop
      ? "stop_id"
      : "max_tokens",
    seconds_per_token: steps.map((s) => s.seconds),
    open_seconds: run.openSeconds,
    // Open, plan and load: everything before the first step.
    load_seconds: run.loadSeconds,
    peak_rss_bytes: summary.peak,
    threads: k3Threads(),
    isa: k3Isa(),
    recompute: !!run.flags.values.recompute,
    interrupted: out.interrupted,
    state_resumed_tokens: resumedTokens,
    steps: steps.map((s, i) => ({
      index: s.index,
      token: s.token,
      seconds: s.seconds,
      fed: s.fed,
      cache_hit_pct: rows[i].hitPct ?? null,
      gb_read: rows[i].gbRead,
      trunk_gb_read: rows[i].trunkGb,
      expert_gb_read: rows[i].expertGb,
    })),
    memory: summary.memory.json,
    decode: {
      tokens: decoded,
      trunk_bytes: trunkBytes,
      expert_bytes: expertBytes,
      trunk_gb_per_token: decoded ? trunkBytes / decoded / 1e9 : null,
    },
    speculation: speculationRecord(run.flags.speculation, out.specStats, decoded),
  };
}

function speculationRecord(
  speculation: SpeculationConfig | undefined,
  stats: SpeculationStats,
  decoded: number,
) {
  if (!speculation) return null;
  return {
    method: speculation.method,
    draft_max: speculation.draftMax,
    policy: speculation.policy,
    proposed: stats.proposed,
    verified: stats.verified,
    accepted: stats.accepted,
    verify_passes: stats.verifyPasses,
    decode_steps: stats.decodeSteps,
    tokens_per_pass: decoded / Math.max(1, stats.verifyPasses + stats.decodeSteps),
  };
}

/**
 * Every output path is checked before the model is loaded and run, so that a
 * missing folder, a directory, a read-only or full file system is exit 2 now, not a lost run.
 */
async function checkOutputs(values: Record<string, unknown>, logitsBytes: number): Promise<void> {
  const file = (flag: string) => values[flag] as string | undefined;
  for (const flag of ["out", "save-state"]) {
    if (file(flag) && !(flag === "out" && file(flag) === "-")) {
      await checkWritable(file(flag)!, `--${flag}`);
    }
  }
  if (file("dump-logits")) await checkWritable(file("dump-logits")!, "--dump-logits", logitsBytes);
  if (file("dump-cache-trace")) {
    await checkWritableDir(file("dump-cache-trace")!, "--dump-cache-trace");
  }
}

/** One line on how the trunk and experts are held. */
function describeStreaming(plan: MemoryPlan): string {
  const t = plan.trunk;
  const trunk = t.ringSlots === 0
    ? "trunk and lm_head resident"
    : `trunk ${t.pinned} pinned, lm_head ${t.headResident ? "resident" : "streamed"}, ` +
      `ring ${t.ringSlots} x ${formatBytes(t.slotBytes)}`;
  const e = plan.experts;
  const experts = e.mode === "resident"
    ? "experts resident"
    : `expert cache ${e.slots} slots x ${formatBytes(e.slotBytes)}`;
  return `${trunk}; ${experts}; at most ${plan.batch} tokens per pass`;
}

/** Load and prefill progress with ETA (pinned layers landing, then the first forward). */
class LoadProgress {
  #prefill?: ProgressBar;
  #finished = false;

  constructor(readonly layers: number) {}

  /** Bytes loaded so far (resident trunk read, ring and cache faulted in), of the plan's. */
  readonly loaded = loadingBar();

  layer(i: number): void {
    if (this.#finished) return;
    this.#prefill ??= new ProgressBar("first token");
    this.#prefill.update(i, this.layers, "layers");
  }

  done(): void {
    if (this.#finished) return;
    this.#finished = true;
    this.#prefill?.update(this.layers, this.layers, "layers");
  }
}

/** --prompt-file: UTF-8 text from a regular file (a FIFO or /dev/zero is refused, never read). */
async function readPromptFile(file: string): Promise<string> {
  return (await readUserText(file, "--prompt-file", { limit: MAX_TEXT_BYTES }))!;
}

function concatLogits(steps: Float32Array[]): Uint8Array {
  const n = steps.reduce((a, s) => a + s.length, 0);
  const all = new Float32Array(n);
  let at = 0;
  for (const s of steps) {
    all.set(s, at);
    at += s.length;
  }
  // Float32Array is host order; every platform k3 supports is little-endian.
  return new Uint8Array(all.buffer);
}

async function writeAll(stream: typeof Deno.stdout, s: string): Promise<void> {
  const bytes = new TextEncoder().encode(s);
  let off = 0;
  while (off < bytes.length) off += await stream.write(bytes.subarray(off));
}

/**
 * A named preset is a machine class with a context: a run past it is refused (exit 2)
 * before anything is read, rather than planned at a context the preset never promised.
 */
function checkPresetContext(preset: string | undefined, positions: number): void {
  if (preset === undefined || preset === "auto") return;
  const p = presetByName(preset);
  if (positions > p.context) {
    throw badInput(
      `the prompt and --gen need ${positions} positions, over preset ${p.name}'s context of ` +
        `${p.context}: shorten the prompt or --gen, or choose a larger preset (--list-presets)`,
    );
  }
}
