/**
 * Costs of constrained decoding (lib/text/grammar.ts): xgrammar's WASM load, the vocabulary
 * hand-over, schema compiles and the mask per token, at the tiny model's 1,280 ids and at a
 * full-size 163,840-id vocabulary (the synthetic BPE padded as lib/synth/full.ts pads it).
 *
 *   deno run -A bench/grammar.ts [tiny|full]
 */
import * as path from "node:path";
import { GrammarEngine, loadXGrammar } from "../lib/text/grammar.ts";
import { Tokenizer } from "../lib/text/tokenizer.ts";
import { makeTiny, synthVocabulary, tokenizerConfig } from "../lib/synth/tiny.ts";
import { formatTiktokenRanks, padVocabulary } from "../lib/synth/bpe.ts";

const SCHEMAS: Record<string, unknown> = {
  "integer 0..120": {
    type: "object",
    properties: { age: { type: "integer", minimum: 0, maximum: 120 } },
    required: ["age"],
  },
  "string": { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
  "string maxLength 10": {
    type: "object",
    properties: { name: { type: "string", maxLength: 10 } },
    required: ["name"],
  },
  "3 fields (enum, integer, array)": {
    type: "object",
    properties: {
      color: { enum: ["red", "green", "blue"] },
      shade: { type: "integer", minimum: 0, maximum: 9 },
      tags: { type: "array", items: { enum: ["warm", "cool"] }, maxItems: 2 },
    },
    required: ["color", "shade", "tags"],
    additionalProperties: false,
  },
};
const SAMPLE = '{"color":"green","shade":7,"tags":["warm","cool"]}';

function rssMiB(): number {
  return Number(/VmRSS:\s+(\d+)/.exec(Deno.readTextFileSync("/proc/self/status"))![1]) / 1024;
}

async function tokenizerIn(dir: string, full: boolean): Promise<Tokenizer> {
  if (!full) {
    await makeTiny(dir, {});
    return Tokenizer.load(dir);
  }
  const ranks = padVocabulary(synthVocabulary(), 163_840 - 256);
  await Deno.writeTextFile(path.join(dir, "tiktoken.model"), formatTiktokenRanks(ranks));
  await Deno.writeTextFile(
    path.join(dir, "tokenizer_config.json"),
    JSON.stringify(tokenizerConfig(163_840)),
  );
  return Tokenizer.load(dir);
}

async function main(): Promise<void> {
  const dir = Deno.makeTempDirSync({ prefix: "k3-bench-grammar-" });
  try {
    const tokenizer = await tokenizerIn(dir, Deno.args[0] === "full");
    const rss0 = rssMiB();
    let t = performance.now();
    await loadXGrammar();
    console.log(`WASM load: ${(performance.now() - t).toFixed(0)} ms`);
    t = performance.now();
    const eom = tokenizer.specialId("<|end_of_msg|>")!;
    const engine = await GrammarEngine.create(tokenizer, tokenizer.vocabSize, [eom]);
    console.log(
      `vocabulary of ${tokenizer.vocabSize} ids: ${(performance.now() - t).toFixed(0)} ms, ` +
        `RSS +${(rssMiB() - rss0).toFixed(0)} MiB`,
    );
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      t = performance.now();
      const compiled = await engine.compile({ type: "json_schema", schema });
      console.log(`schema ${name}: ${(performance.now() - t).toFixed(0)} ms`);
      if (!name.startsWith("3 fields")) continue;
      const ids = tokenizer.encode(SAMPLE);
      const matcher = await engine.matcher(compiled);
      const logits = new Float32Array(tokenizer.vocabSize);
      t = performance.now();
      for (let i = 0; i < ids.length; i++) {
        matcher.mask(logits);
        if (!matcher.syncTo(ids.slice(0, i + 1))) throw new Error(`token ${i} refused`);
      }
      const perToken = (performance.now() - t) / ids.length;
      console.log(`mask + accept: ${perToken.toFixed(2)} ms per token over ${ids.length}`);
      matcher.dispose();
    }
    console.log(`RSS +${(rssMiB() - rss0).toFixed(0)} MiB in all`);
    engine.dispose();
    tokenizer.free();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
}

await main();
