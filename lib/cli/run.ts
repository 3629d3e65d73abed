/**
 * `k3 run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) --gen N ...`
 */
import { parseArgs } from "node:util";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { k3Isa, k3Threads } from "../../ffi/library.ts";
import { badInput, ExitCode } from "../errors.ts";
import { generate, type GenerateStep } from "../generate.ts";
import { writeFileAtomic } from "../io/atomic.ts";
import { openCheckpoint } from "../checkpoint/checkpoint.ts";
import { formatPlan, planResident } from "../memory/plan.ts";
import { Model } from "../model/model.ts";
import { formatBytes, formatStep, peakRssBytes, STEP_HEADER } from "../report.ts";
import { StreamDecoder, Tokenizer } from "../text/tokenizer.ts";
import { applyThreads, idsFlag, intFlag, modelDirArg } from "./flags.ts";

const HELP = `usage: k3 run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [options]

prompt:
  --ids LIST            comma-separated token ids (no tokenizer needed)
  --prompt TEXT         text, tokenized with the model's tiktoken.model (specials as plain text)
  --prompt-file FILE    UTF-8 text from a file
generation:
  --gen N               tokens to generate (default 16)
  --ignore-eos          do not stop at the end-of-message / [EOS] ids
  --recompute           re-run the whole sequence every step, carrying no cache (a check mode)
  --prefill-chunk N     prefill the prompt N tokens at a time
output:
  --out FILE.json       write the run record (ids, text, timings, peak RSS)
  --dump-logits FILE    write every step's logits as little-endian float32 (gen x vocab)
  --quiet               no report; stream the generated text (or ids) to stdout as it comes
machine:
  --threads N           OpenMP threads (default: OMP_NUM_THREADS or all cores)
  --layers N            bind only the first N layers (diagnostics; not the model's output)
`;

export async function runCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    strict: true,
    options: {
      ids: { type: "string" },
      prompt: { type: "string" },
      "prompt-file": { type: "string" },
      gen: { type: "string" },
      "ignore-eos": { type: "boolean" },
      recompute: { type: "boolean" },
      "prefill-chunk": { type: "string" },
      out: { type: "string" },
      "dump-logits": { type: "string" },
      quiet: { type: "boolean" },
      threads: { type: "string" },
      layers: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    console.log(HELP);
    return ExitCode.ok;
  }
  const dir = modelDirArg(positionals, "run");
  const gen = intFlag("gen", values.gen, 16, 1, 1 << 20);
  const sources = [values.ids, values.prompt, values["prompt-file"]].filter((v) => v !== undefined);
  if (sources.length !== 1) {
    throw badInput("give exactly one of --ids, --prompt, --prompt-file");
  }
  applyThreads(values.threads);
  const layers = values.layers === undefined ? undefined : intFlag("layers", values.layers, 0, 1);

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
    const ckpt = await openCheckpoint(dir, { layers });
    const log = values.quiet ? () => {} : (s: string) => console.error(s);
    log(formatPlan(planResident(ckpt.config, ckpt.refs, prompt.length + gen)));
    const model = Model.load(ckpt);
    try {
      const c = model.config;
      const bad = prompt.find((id) => id < 0 || id >= c.vocabSize);
      if (bad !== undefined) {
        throw badInput(`token id ${bad} is outside the vocabulary (0..${c.vocabSize - 1})`);
      }
      const loadSeconds = (performance.now() - t0) / 1000;
      log(
        `model ${dir}: ${c.numLayers} layers, hidden ${c.hiddenSize}, vocab ${c.vocabSize}, ` +
          `${c.numExperts} experts top-${c.topK}; loaded in ${loadSeconds.toFixed(2)} s`,
      );
      log(`threads ${k3Threads()}, isa ${k3Isa()}, prompt ${prompt.length} tokens, gen ${gen}`);
      if (c.defaultsApplied.length) log(`defaults applied: ${c.defaultsApplied.join(", ")}`);
      log(STEP_HEADER);

      const stopIds = values["ignore-eos"] ? [] : stopIdsOf(model, tokenizer);
      const decoder = tokenizer ? new StreamDecoder(tokenizer) : undefined;
      const steps: GenerateStep[] = [];
      const logits: Float32Array[] = [];
      let text = "";
      for await (
        const step of generate(model, prompt, {
          maxTokens: gen,
          stopIds,
          recompute: values.recompute,
          prefillChunk: values["prefill-chunk"] === undefined
            ? undefined
            : intFlag("prefill-chunk", values["prefill-chunk"], 1, 1),
        })
      ) {
        steps.push(step);
        if (values["dump-logits"]) logits.push(step.logits);
        const piece = decoder ? decoder.push(step.token) : `${step.index ? "," : ""}${step.token}`;
        text += piece;
        // With the table on, each row shows its piece; with --quiet, stream bare text.
        if (values.quiet) await writeOut(piece);
        else log(formatStep({ ...step, step: step.index, text: piece }));
      }
      const tail = decoder?.flush() ?? "";
      text += tail;
      if (values.quiet) await writeOut(tail + "\n");
      else console.log(text);

      const generated = steps.map((s) => s.token);
      const seconds = steps.reduce((a, s) => a + s.seconds, 0);
      const peak = peakRssBytes();
      log(
        `${steps.length} tokens in ${seconds.toFixed(3)} s, ` +
          `${(seconds / Math.max(1, steps.length)).toFixed(4)} s/token; ` +
          `PEAK RSS ${formatBytes(peak)}`,
      );
      if (values.out) {
        await writeFileAtomic(
          values.out,
          JSON.stringify(
            {
              model: path.resolve(dir),
              prompt_ids: prompt,
              generated_ids: generated,
              text: tokenizer ? text : undefined,
              seconds_per_token: steps.map((s) => s.seconds),
              load_seconds: loadSeconds,
              peak_rss_bytes: peak,
              threads: k3Threads(),
              isa: k3Isa(),
              recompute: !!values.recompute,
              steps: steps.map((s) => ({
                index: s.index,
                token: s.token,
                seconds: s.seconds,
                fed: s.fed,
              })),
            },
            null,
            2,
          ) + "\n",
        );
      }
      if (values["dump-logits"]) await writeFileAtomic(values["dump-logits"], concatLogits(logits));
    } finally {
      model.close();
    }
  } finally {
    tokenizer?.free();
  }
  return ExitCode.ok;
}

/** The tokenizer next to the checkpoint: required for text prompts, optional for --ids. */
async function loadTokenizerFor(dir: string, required: boolean): Promise<Tokenizer | undefined> {
  if (!required && !existsSync(path.join(dir, "tiktoken.model"))) return undefined;
  return await Tokenizer.load(dir);
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

async function readPromptFile(file: string): Promise<string> {
  try {
    const bytes = await Deno.readFile(file);
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    throw badInput(`cannot read --prompt-file ${file} as UTF-8 text: ${(e as Error).message}`, {
      cause: e,
    });
  }
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
