/**
 * make-tiny --routing: uniform stays the default (same bytes as before the option existed),
 * skewed changes only the router biases, and it concentrates routing: measured through the
 * engine, N distinct tokens touch far fewer distinct experts per layer than under uniform.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { makeTinyCommand } from "../../lib/cli/make_tiny.ts";
import { ExitCode } from "../../lib/errors.ts";
import { Model } from "../../lib/model/model.ts";
import { fullShape, planFull, unitTensors } from "../../lib/synth/full.ts";
import { XorShift128 } from "../../lib/synth/numerics.ts";
import { fillSkewedBias, SKEWED_STRENGTH } from "../../lib/synth/routing.ts";
import { planCheckpoint, type TinyOptions } from "../../lib/synth/tiny.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";

const BIAS = /gate\.e_score_correction_bias$/;

/** Every tensor's init kind, by name. */
function initKinds(options: TinyOptions): Map<string, string> {
  const out = new Map<string, string>();
  for (const s of planCheckpoint(options).shards) {
    for (const t of s.tensors) out.set(t.name, t.init.kind);
  }
  return out;
}

Deno.test("routing: uniform is the default; skewed changes the router biases and nothing else", () => {
  const plain = initKinds({}), uniform = initKinds({ routing: "uniform" });
  const skewed = initKinds({ routing: "skewed" });
  assert.deepEqual([...uniform], [...plain]);
  let biases = 0;
  for (const [name, kind] of skewed) {
    if (BIAS.test(name)) {
      biases++;
      assert.equal(kind, "skewedBias", name);
      assert.equal(plain.get(name), "uniform", name);
    } else assert.equal(kind, plain.get(name), name);
  }
  assert.equal(biases, planCheckpoint().shape.layers - 1); // every MoE layer, layer 0 is dense
  // The full-size layout: the bias stays data (never a hole) and follows the option.
  const shape = fullShape(3), unit = { kind: "trunk", layer: 2 } as const;
  const kindOf = (routing?: "skewed") =>
    unitTensors(shape, unit, "sparse", routing).find((t) => BIAS.test(t.name))!.init.kind;
  assert.equal(kindOf(), "uniform");
  assert.equal(kindOf("skewed"), "skewedBias");
  assert.ok(
    unitTensors(shape, unit, "sparse", "skewed").some((t) =>
      /gate\.weight$/.test(t.name) && t.init.kind === "uniform"
    ),
  );
  assert.equal(planFull({ layers: 2 }).shape.experts, 896);
});

Deno.test("routing: the skewed profile is a Zipf-like permutation, the same for the same seed", () => {
  const E = 896, a = new Float32Array(E), b = new Float32Array(E);
  fillSkewedBias(new XorShift128(5), a);
  fillSkewedBias(new XorShift128(5), b);
  assert.deepEqual(a, b);
  const sorted = [...a].sort((x, y) => y - x);
  assert.equal(sorted[0], 0);
  // rank r gets -strength ln(1 + r) / ln(E): the spread is the strength.
  assert.ok(Math.abs(sorted[E - 1] + SKEWED_STRENGTH) < 1e-6);
  assert.ok(Math.abs(sorted[9] + SKEWED_STRENGTH * Math.log(10) / Math.log(E)) < 1e-6);
  // A permutation: the most popular expert is not expert 0 for every seed.
  fillSkewedBias(new XorShift128(6), b);
  assert.notDeepEqual(a, b);
});

/** Mean distinct experts per MoE layer that `tokens` distinct ids pick in one forward pass. */
async function distinctPerLayer(options: TinyOptions, tokens: number): Promise<number> {
  const model = await Model.open(await tinyModel(options));
  try {
    const ids = Array.from({ length: tokens }, (_, i) => 7 + 13 * i); // distinct ids
    await model.forward.forward(model.newState(tokens), ids);
    return model.forward.stats.expertRequests / (model.config.numLayers - 1);
  } finally {
    model.close();
  }
}

Deno.test("routing: skewed concentrates the experts a prompt touches, measured in the engine", async () => {
  // 96 experts, top 8, 24 tokens: uniform picks would touch 96 (1 - (1 - 8/96)^24) = ~83 per
  // layer (83.25 measured); the skewed biases bring it to 58.25 (seed 0; the run is exact, so
  // these bounds fail only if the option stops concentrating).
  const shape = { experts: 96, topK: 8, layers: 5 };
  const uniform = await distinctPerLayer(shape, 24);
  const skewed = await distinctPerLayer({ ...shape, routing: "skewed" }, 24);
  console.log(`distinct experts per layer, 24 tokens: uniform ${uniform}, skewed ${skewed}`);
  assert.ok(uniform >= 72, `uniform: ${uniform} distinct experts per layer`);
  assert.ok(skewed <= 64, `skewed: ${skewed} distinct experts per layer`);
  assert.ok(skewed < 0.8 * uniform, `skewed ${skewed} against uniform ${uniform}`);
});

Deno.test("routing: make-tiny --routing takes uniform or skewed; anything else is exit 2", async () => {
  const dir = tempDir();
  const quiet = console.error;
  console.error = () => {};
  try {
    assert.equal(await makeTinyCommand([join(dir, "a"), "--routing", "zipf"]), ExitCode.badInput);
    assert.equal(
      await makeTinyCommand([
        join(dir, "b"),
        "--shape",
        "full",
        "--data",
        "none",
        "--routing",
        "skewed",
      ]),
      ExitCode.badInput,
    );
  } finally {
    console.error = quiet;
  }
  const log = console.log;
  console.log = () => {};
  try {
    assert.equal(await makeTinyCommand([join(dir, "c"), "--routing", "skewed"]), ExitCode.ok);
  } finally {
    console.log = log;
  }
  const index = JSON.parse(Deno.readTextFileSync(join(dir, "c", "model.safetensors.index.json")));
  assert.ok(Object.keys(index.weight_map).some((n) => BIAS.test(n)));
});
