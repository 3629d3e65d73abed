/**
 * The engine against the independent float64 reference (tests/reference/), and the
 * byte-identity contracts: decode = recompute = chunked prefill, any thread count.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { loadReference, referenceGreedy } from "../reference/reference.ts";
import {
  REFERENCE_CONFIGS as CONFIGS,
  relDiff,
  runK3,
  sameBytes,
  tempDir,
  tinyModel,
} from "../support/helpers.ts";

const GREEDY_STEPS = 16;

for (const cfg of CONFIGS) {
  Deno.test(`engine matches the float64 reference: ${cfg.name}`, async () => {
    const dir = await tinyModel(cfg.options);
    const ref = referenceGreedy(await loadReference(dir), cfg.prompt, GREEDY_STEPS);
    const model = await Model.open(dir);
    try {
      const tokens: number[] = [];
      let worst = 0;
      for await (
        const step of generate(model, cfg.prompt, { maxTokens: GREEDY_STEPS, stopIds: [] })
      ) {
        tokens.push(step.token);
        worst = Math.max(worst, relDiff(step.logits, ref.logits[step.index]));
      }
      console.log(`  ${cfg.name}: max relative logit difference ${worst.toExponential(3)}`);
      assert.ok(worst < 1e-4, `logits differ by ${worst} (relative) from the reference`);
      assert.deepEqual(tokens, ref.tokens, "greedy tokens differ from the reference");
      assert.ok(new Set(tokens).size > 1, "greedy output collapsed to one token");
    } finally {
      model.close();
    }
  });
}

Deno.test("decode, full recompute and a chunked prefill give byte-identical logits", async () => {
  const dir = await tinyModel(CONFIGS[1].options);
  const prompt = CONFIGS[1].prompt;
  const model = await Model.open(dir);
  try {
    const runs: Float32Array[][] = [];
    for (const options of [{}, { recompute: true }, { prefillChunk: 7 }, { prefillChunk: 1 }]) {
      const logits: Float32Array[] = [];
      for await (const s of generate(model, prompt, { maxTokens: 6, stopIds: [], ...options })) {
        logits.push(s.logits);
      }
      runs.push(logits);
    }
    for (const run of runs.slice(1)) {
      run.forEach((l, i) => assert.ok(sameBytes(l, runs[0][i]), `step ${i} differs`));
    }
  } finally {
    model.close();
  }
});

Deno.test("OMP_NUM_THREADS=1 and =2 give byte-identical logits", async () => {
  const dir = await tinyModel(CONFIGS[0].options);
  const out = tempDir();
  const dumps: Uint8Array[] = [];
  for (const threads of ["1", "2"]) {
    const file = path.join(out, `logits-${threads}.bin`);
    const r = await runK3([
      "run",
      dir,
      "--ids",
      CONFIGS[0].prompt.join(","),
      "--gen",
      "5",
      "--ignore-eos",
      "--dump-logits",
      file,
      "--quiet",
    ], { OMP_NUM_THREADS: threads });
    assert.equal(r.code, 0, r.stderr);
    dumps.push(await Deno.readFile(file));
  }
  assert.ok(dumps[0].length > 0);
  assert.deepEqual(dumps[0], dumps[1]);
});

Deno.test("a norm gain stored as F32 instead of BF16 gives byte-identical logits", async () => {
  const { readSafetensorsHeader, writeSafetensors } = await import(
    "../../lib/checkpoint/safetensors.ts"
  );
  const src = await tinyModel(CONFIGS[0].options);
  const dir = tempDir();
  for await (const e of Deno.readDir(src)) {
    if (e.isFile) await Deno.copyFile(path.join(src, e.name), path.join(dir, e.name));
  }
  // The trunk shard is the first; widen every layer's input_layernorm to F32 (exact).
  const index = JSON.parse(await Deno.readTextFile(path.join(dir, "model.safetensors.index.json")));
  const trunkFile = path.join(dir, index.weight_map["language_model.model.norm.weight"]);
  const header = await readSafetensorsHeader(trunkFile);
  const bytes = await Deno.readFile(trunkFile);
  let widened = 0;
  const tensors = header.entries.map((t) => {
    const data = bytes.slice(header.dataStart + t.begin, header.dataStart + t.end);
    if (!t.name.endsWith("input_layernorm.weight")) return { ...t, data };
    widened++;
    const bits = new Uint32Array(data.length / 2);
    new Uint16Array(data.buffer).forEach((b, i) => (bits[i] = b << 16));
    return { ...t, dtype: "F32" as const, data: new Uint8Array(bits.buffer) };
  });
  assert.ok(widened > 0);
  await writeSafetensors(trunkFile, tensors, header.metadata);

  const logitsOf = async (d: string) => {
    const model = await Model.open(d);
    try {
      return await model.forward.forward(model.newState(), CONFIGS[0].prompt);
    } finally {
      model.close();
    }
  };
  assert.ok(sameBytes(await logitsOf(dir), await logitsOf(src)));
});
