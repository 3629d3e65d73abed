/**
 * `k3 run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) --gen N ...`
 */
import { parseArgs } from "node:util";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { k3Isa, k3Threads } from "../../ffi/library.ts";
import { badInput, ExitCode } from "../errors.ts";
import { generate, type GenerateStep } from "../generate/decode.ts";
import { checkWritable, checkWritableDir, writeFailure, writeFileAtomic } from "../io/atomic.ts";
import { MAX_TEXT_BYTES, readUserText } from "../io/files.ts";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { ProgressBar } from "../io/progress.ts";
import type { MemoryPlan } from "../memory/plan.ts";
import { expertBlockBytes } from "../memory/sources.ts";
import { writeTrace } from "../memory/trace.ts";
import type { Model } from "../model/model.ts";
import type { SequenceState } from "../model/state.ts";
import { checkpointIdentity, readStateFile, writeStateFile } from "../model/state_file.ts";
import { terminalSafe } from "../chat/display.ts";
import { yieldToEventLoop } from "../generate/text.ts";
import { formatBytes, peakRssBytes } from "../io/sizes.ts";
import { formatStep, STEP_HEADER } from "./step_table.ts";
import { checkLogitBias } from "../text/sampler.ts";
import { Tokenizer } from "../text/tokenizer.ts";
import { TextStream } from "../text/stream.ts";
import {
  applyThreads,
  helpAsked,
  idsFlag,
  ignoredSamplingFlags,
  intFlag,
  maxTokensFlag,
  modelDirArg,
  SAMPLING_HELP,
  SAMPLING_OPTIONS,
  samplingFlags,
  stopFlags,
} from "./flags.ts";
import { type IoSnapshot, streamReport, takeSnapshot } from "../memory/stats.ts";
import { listPresetsIfAsked, loadPlanned, MEMORY_HELP, MEMORY_OPTIONS } from "./memory_flags.ts";
import {
  formatSpeculation,
  SPECULATE_HELP,
  SPECULATE_OPTIONS,
  speculationFlags,
} from "./speculate_flags.ts";
import { newSpeculationStats, speculateOptions } from "../speculate/speculate.ts";
import { GRAMMAR_HELP, GRAMMAR_OPTIONS, grammarFlags, grammarPicker } from "./grammar_flags.ts";

const HELP = `usage: k3 run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [options]

prompt:
  --ids LIST            comma-separated token ids (no tokenizer needed)
  --prompt TEXT         text, tokenized with the model's tiktoken.model (specials as plain text)
  --prompt-file FILE    UTF-8 text from a file
generation:
  --gen N               tokens to generate at most (default 16; --max-tokens is an alias)
  --ignore-eos          do not stop at the end-of-message / [EOS] ids (with --ids,
                        generation never stops early: exactly --gen tokens)
  --recompute           re-run the whole sequence every step, carrying no cache (a check mode)
  --prefill-chunk N     prefill the prompt N tokens at a time
${SAMPLING_HELP}
${SPECULATE_HELP}
${GRAMMAR_HELP}
output:
  --out FILE.json       write the run record (ids, text, timings, peak RSS)
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

export async function runCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: OPTIONS,
  });
  if (helpAsked(values, HELP)) return ExitCode.ok;
  if (listPresetsIfAsked(values)) return ExitCode.ok;
  const dir = modelDirArg(positionals, "run");
  const gen = maxTokensFlag(values, 16);
  const sampling = samplingFlags(values);
  const stops = stopFlags(values), speculation = speculationFlags(values);
  if (speculation && values.recompute) {
    throw badInput("--speculate needs a carried state; it cannot run with --recompute");
  }
  const sources = [values.ids, values.prompt, values["prompt-file"]].filter((v) => v !== undefined);
  if (sources.length !== 1) {
    throw badInput("give exactly one of --ids, --prompt, --prompt-file");
  }
  if (values.recompute && (values["save-state"] || values["load-state"])) {
    throw badInput(
      "--recompute carries no state: it cannot be used with --save-state/--load-state",
    );
  }
  applyThreads(values.threads);
  const layers = values.layers === undefined ? undefined : intFlag("layers", values.layers, 0, 1);

  const grammar = await grammarFlags(values);
  const tokenizer = await loadTokenizerFor(dir, values.ids === undefined);
  try {
    let prompt: number[];
    if (values.ids !== undefined) prompt = idsFlag(values.ids);
    else {
      const text = values.prompt ?? await readPromptFile(values["prompt-file"]!);
      prompt = tokenizer!.encode(text, { allowSpecial: false });
      if (prompt.length === 0) throw badInput("the prompt is empty after tokenization");
    }

    const t0 = performance.now();
    const log = values.quiet ? () => {} : (s: string) => console.error(s);
    const chunk = values["prefill-chunk"] === undefined
      ? undefined
      : intFlag("prefill-chunk", values["prefill-chunk"], 1, 1);
    const positions = prompt.length + gen;
    const ckpt = await openCheckpoint(dir, { layers });
    const openSeconds = (performance.now() - t0) / 1000;
    const vocab = ckpt.config.vocabSize;
    const bad = prompt.find((id) => id >= vocab);
    if (bad !== undefined) {
      throw badInput(`token id ${bad} is outside the vocabulary (0..${vocab - 1})`);
    }
    checkLogitBias(sampling, vocab, "--logit-bias");
    await checkOutputs(values, gen * vocab * 4);
    const identity = values["save-state"] || values["load-state"]
      ? await checkpointIdentity(ckpt)
      : undefined;
    const progress = values.quiet ? undefined : new LoadProgress(ckpt.refs.layers.length);
    const { model, plan, request, packPath } = await loadPlanned(ckpt, values, {
      shape: {
        positions,
        maxBatch: values.recompute ? positions : Math.min(chunk ?? prompt.length, prompt.length),
        extraBytes: values["dump-logits"] ? gen * ckpt.config.vocabSize * 4 : 0,
        // The plan keeps a verify pass's rewind record and logits, and room for its tokens.
        verifyPositions: speculation && 1 + speculation.draftMax,
      },
      log,
      load: {
        trace: values["dump-cache-trace"] !== undefined,
        onLoad: progress && ((d, n) => progress.loaded(d, n)),
        onLayer: progress && ((i) => progress.layer(i)),
      },
    });
    try {
      const c = model.config;
      const loadSeconds = (performance.now() - t0) / 1000;
      log(
        `model ${dir}: ${c.numLayers} layers, hidden ${c.hiddenSize}, vocab ${c.vocabSize}, ` +
          `${c.numExperts} experts top-${c.topK}; opened in ${openSeconds.toFixed(2)} s, ` +
          `loaded in ${(loadSeconds - openSeconds).toFixed(2)} s more`,
      );
      log(`threads ${k3Threads()}, isa ${k3Isa()}, prompt ${prompt.length} tokens, gen ${gen}`);
      if (c.defaultsApplied.length) log(`defaults applied: ${c.defaultsApplied.join(", ")}`);
      log(`trunk from ${packPath ?? "the shards"}; ${describeStreaming(plan)}`);

      // Ids in, ids out is the raw mode: exactly --gen tokens, as --dump-logits promises.
      const raw = values.ids !== undefined;
      const stopIds = values["ignore-eos"] || raw ? [] : stopIdsOf(model, tokenizer);
      const decodes = tokenizerFits(tokenizer, c.vocabSize, values.ids === undefined);
      if (stops.length > 0 && !decodes) {
        throw badInput("--stop matches text: it needs the tokenizer");
      }
      // --stop matches the text of ordinary tokens only, never a special token's name.
      const stream = decodes ? new TextStream(tokenizer!, { stops }) : undefined;
      const ignored = ignoredSamplingFlags(values);
      if (ignored.length) log(`note: ${ignored.join(", ")} only act with --temperature > 0`);
      let resumed: SequenceState | undefined;
      let resumedTokens = 0;
      if (values["load-state"]) {
        const file = values["load-state"];
        const got = await readStateFile(file, c, identity!, prompt);
        if (got.ok) {
          resumed = got.state;
          resumedTokens = resumed.position;
          resumed.reserve(positions); // the capacity the plan counted, in one allocation
          log(`state ${file}: resuming ${resumedTokens} of ${prompt.length} prompt tokens`);
        } else {
          console.error(
            `warning: --load-state ${file} not used: ${got.reason}; prefilling the prompt in full`,
          );
        }
      }
      log(STEP_HEADER);
      // Ctrl-C: stop after the current step, then report and write what was asked.
      const interrupt = new AbortController();
      const onSigint = () => interrupt.abort();
      Deno.addSignalListener("SIGINT", onSigint);
      let stoppedByString = false;
      const steps: GenerateStep[] = [];
      const logits: Float32Array[] = [];
      let text = "";
      const ioStart = takeSnapshot(model);
      let before: IoSnapshot = ioStart;
      const rows: { hitPct?: number; gbRead: number; trunkGb: number; expertGb: number }[] = [];
      const specStats = newSpeculationStats();
      let afterFirst: IoSnapshot | undefined;
      for await (
        const step of generate(model, prompt, {
          maxTokens: gen,
          stopIds,
          picker: await grammarPicker(grammar, sampling, tokenizer, c.vocabSize, stopIds),
          recompute: values.recompute,
          prefillChunk: chunk,
          state: resumed,
          signal: interrupt.signal,
          speculate: speculation && speculateOptions(model, speculation, specStats),
        })
      ) {
        progress?.done();
        steps.push(step);
        const now = takeSnapshot(model);
        if (step.index === 0) afterFirst = now;
        const requests = now.requests - before.requests;
        const row = {
          hitPct: requests > 0 ? (100 * (now.hits - before.hits)) / requests : undefined,
          gbRead: (now.bytes - before.bytes) / 1e9,
          trunkGb: ((now.io?.trunkBytes ?? 0) - (before.io?.trunkBytes ?? 0)) / 1e9,
          expertGb: ((now.io?.expertBytes ?? 0) - (before.io?.expertBytes ?? 0)) / 1e9,
        };
        rows.push(row);
        before = now;
        if (model.stream?.trace) model.stream.trace.step = step.index + 1;
        if (values["dump-logits"]) logits.push(step.logits);
        const { emit: piece, stopped } = stream?.push(step.token) ??
          { emit: `${step.index ? "," : ""}${step.token}`, stopped: false };
        text += piece;
        // With the table on, each row shows its piece; with --quiet, stream bare text.
        if (values.quiet) await writeOut(Deno.stdout.isTerminal() ? terminalSafe(piece) : piece);
        else {
          const cells = {
            ...step,
            step: step.index,
            text: piece,
            cacheHitPct: row.hitPct,
            gbRead: row.gbRead,
          };
          log(terminalSafe(formatStep(cells)));
        }
        if (stopped) {
          stoppedByString = true;
          break;
        }
        await yieldToEventLoop(); // lets a Ctrl-C be seen between steps
      }
      Deno.removeSignalListener("SIGINT", onSigint);
      const interrupted = interrupt.signal.aborted && !stoppedByString && !steps.at(-1)?.stop &&
        steps.length < gen;
      if (interrupted) console.error(`interrupted (Ctrl-C) after ${steps.length} tokens`);
      const tail = stream?.flush() ?? "";
      text += tail;
      const shown = Deno.stdout.isTerminal() ? terminalSafe : (t: string) => t;
      if (values.quiet) await writeOut(shown(tail) + "\n");
      else console.log(shown(text));

      const generated = steps.map((s) => s.token);
      const seconds = steps.reduce((a, s) => a + s.seconds, 0);
      const peak = peakRssBytes();
      const memoryMax = request.memoryMaxGb === undefined ? undefined : request.memoryMaxGb * 1e9;
      const report = streamReport(
        model,
        plan,
        ioStart,
        takeSnapshot(model),
        seconds,
        peak,
        memoryMax,
      );
      log(report.text);
      log(
        `${steps.length} tokens in ${seconds.toFixed(3)} s, ` +
          `${(seconds / Math.max(1, steps.length)).toFixed(4)} s/token; ` +
          `PEAK RSS ${formatBytes(peak)}`,
      );
      // Decoding after the first token (which comes with the prefill) is what speculation changes.
      const decoded = Math.max(0, steps.length - 1);
      const end = takeSnapshot(model);
      const trunkBytes = (end.io?.trunkBytes ?? 0) - (afterFirst?.io?.trunkBytes ?? 0);
      const expertBytes = (end.io?.expertBytes ?? 0) - (afterFirst?.io?.expertBytes ?? 0);
      if (speculation) log(formatSpeculation(speculation, specStats, decoded, trunkBytes));
      if (report.warning) console.error(report.warning);
      const trace = model.stream?.trace;
      if (trace && values["dump-cache-trace"]) {
        const dir = values["dump-cache-trace"];
        const file = await writeTrace(dir, {
          layers: c.numLayers,
          experts: c.numExperts,
          expert_bytes: expertBlockBytes(ckpt.refs),
        }, trace.records).catch((e) => {
          throw writeFailure(dir, e);
        });
        log(`cache trace: ${file} (${trace.records.length} requests)`);
      }
      if (values.out) {
        await writeFileAtomic(
          values.out,
          JSON.stringify(
            {
              model: path.resolve(dir),
              prompt_ids: prompt,
              generated_ids: generated,
              text: tokenizer ? text : undefined,
              stop_reason: interrupted
                ? "interrupted"
                : stoppedByString
                ? "stop_string"
                : steps.at(-1)?.stop
                ? "stop_id"
                : "max_tokens",
              seconds_per_token: steps.map((s) => s.seconds),
              open_seconds: openSeconds,
              // Open, plan and load: everything before the first step.
              load_seconds: loadSeconds,
              peak_rss_bytes: peak,
              threads: k3Threads(),
              isa: k3Isa(),
              recompute: !!values.recompute,
              interrupted,
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
              memory: report.json,
              decode: {
                tokens: decoded,
                trunk_bytes: trunkBytes,
                expert_bytes: expertBytes,
                trunk_gb_per_token: decoded ? trunkBytes / decoded / 1e9 : null,
              },
              speculation: speculation
                ? {
                  method: speculation.method,
                  draft_max: speculation.draftMax,
                  policy: speculation.policy,
                  proposed: specStats.proposed,
                  verified: specStats.verified,
                  accepted: specStats.accepted,
                  verify_passes: specStats.verifyPasses,
                  decode_steps: specStats.decodeSteps,
                  tokens_per_pass: decoded /
                    Math.max(1, specStats.verifyPasses + specStats.decodeSteps),
                }
                : null,
            },
            null,
            2,
          ) + "\n",
        );
      }
      if (values["dump-logits"]) await writeFileAtomic(values["dump-logits"], concatLogits(logits));
      const last = steps.at(-1)?.state;
      if (values["save-state"] && last) {
        const bytes = await writeStateFile(values["save-state"], last, identity!);
        log(`state ${values["save-state"]}: ${last.position} tokens, ${formatBytes(bytes)}`);
      }
      if (interrupted) return ExitCode.interrupted;
    } finally {
      model.close();
    }
  } finally {
    tokenizer?.free();
  }
  return ExitCode.ok;
}

/**
 * Every output path is checked before the model is loaded and run, so that a
 * missing folder, a directory, a read-only or full file system is exit 2 now, not a lost run.
 */
async function checkOutputs(values: Record<string, unknown>, logitsBytes: number): Promise<void> {
  const file = (flag: string) => values[flag] as string | undefined;
  for (const flag of ["out", "save-state"]) {
    if (file(flag)) await checkWritable(file(flag)!, `--${flag}`);
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
  #load?: ProgressBar;
  #prefill?: ProgressBar;
  #finished = false;

  constructor(readonly layers: number) {}

  /** Bytes loaded so far (resident trunk read, ring and cache faulted in), of the plan's. */
  loaded(done: number, total: number): void {
    this.#load ??= new ProgressBar("loading");
    this.#load.update(Math.round(done / 1e6), Math.round(total / 1e6), "MB");
  }

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

/** The tokenizer next to the checkpoint: required for text prompts, optional for --ids. */
async function loadTokenizerFor(dir: string, required: boolean): Promise<Tokenizer | undefined> {
  if (required) return await Tokenizer.load(dir);
  // With --ids the tokenizer only decodes for display: a missing or unusable one is no error.
  if (!existsSync(path.join(dir, "tiktoken.model"))) return undefined;
  try {
    return await Tokenizer.load(dir);
  } catch (e) {
    console.error(`k3: not decoding text (${(e as Error).message})`);
    return undefined;
  }
}

/**
 * A tokenizer must cover the model's vocabulary exactly. For text prompts a mismatch is bad
 * input; with --ids it only turns off decoding.
 */
function tokenizerFits(t: Tokenizer | undefined, vocab: number, required: boolean): boolean {
  if (!t) return false;
  if (t.vocabSize === vocab) return true;
  const why = `the tokenizer has ${t.vocabSize} ids but config.json says vocab_size ${vocab}`;
  if (required) throw badInput(why);
  console.error(`k3: not decoding text (${why})`);
  return false;
}

/** Stop ids: eos_token_id from the config, plus [EOS] and <|end_of_msg|> from the tokenizer. */
export function stopIdsOf(model: Model, tokenizer?: Tokenizer): number[] {
  const ids = new Set(model.config.eosTokenIds);
  for (const name of ["[EOS]", "<|end_of_msg|>"]) {
    const id = tokenizer?.specialId(name);
    if (id !== undefined) ids.add(id);
  }
  return [...ids];
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

async function writeOut(s: string): Promise<void> {
  const bytes = new TextEncoder().encode(s);
  let off = 0;
  while (off < bytes.length) off += await Deno.stdout.write(bytes.subarray(off));
}
