/**
 * config.json reading: nested and flat shapes, one error for every missing key, the layer
 * map, value checks, and behavioural defaults. The tiny config here (every size distinct)
 * is also used by tests/checkpoint/checkpoint.test.ts.
 */

import assert from "node:assert/strict";
import * as path from "node:path";
import { parseConfig, readConfig } from "../../lib/checkpoint/config.ts";
import { K3Error } from "../../lib/errors.ts";

/**
 * A small nested config in the released layout, with every size distinct so a swapped
 * dimension cannot go unnoticed. Layers (1-based): 1-3 KDA, 4 MLA; layer 0 dense.
 */
export function tinyConfigJson(): Record<string, any> {
  return {
    model_type: "kimi_k3",
    tie_word_embeddings: false,
    text_config: {
      vocab_size: 40,
      hidden_size: 16,
      num_hidden_layers: 4,
      intermediate_size: 24,
      first_k_dense_replace: 1,
      moe_layer_freq: 1,
      hidden_act: "situ",
      activation_situ_beta: 4.0,
      activation_situ_linear_beta: 25.0,
      rms_norm_eps: 1e-5,
      num_attention_heads: 3,
      num_key_value_heads: 3,
      q_lora_rank: 12,
      kv_lora_rank: 10,
      qk_nope_head_dim: 6,
      qk_rope_head_dim: 2,
      v_head_dim: 5,
      num_experts: 4,
      num_experts_per_token: 2,
      num_shared_experts: 2,
      moe_intermediate_size: 8,
      routed_expert_hidden_size: 12,
      attn_res_block_size: 2,
      routed_scaling_factor: 2.5,
      moe_renormalize: false,
      eos_token_id: 39,
      linear_attn_config: {
        full_attn_layers: [4],
        kda_layers: [1, 2, 3],
        num_heads: 2,
        head_dim: 7,
        short_conv_kernel_size: 3,
        use_full_rank_gate: true,
        gate_lower_bound: -4.5,
      },
      quantization_config: {
        quant_method: "compressed-tensors",
        config_groups: { group_0: { weights: { num_bits: 4, group_size: 4 } } },
      },
    },
  };
}

/** The same config without the text_config wrapper. */
export function tinyFlatConfigJson(): Record<string, any> {
  const { text_config, ...rest } = tinyConfigJson();
  return { ...rest, ...text_config };
}

/** Asserts that `fn` throws a K3Error with exit code 2 whose message matches every pattern. */
export function assertBadInput(fn: () => unknown, ...patterns: RegExp[]): K3Error {
  let error: unknown;
  try {
    fn();
  } catch (e) {
    error = e;
  }
  return checkBadInput(error, patterns);
}

/** The async form of assertBadInput. */
export async function assertRejectsBadInput(
  fn: () => Promise<unknown>,
  ...patterns: RegExp[]
): Promise<K3Error> {
  let error: unknown;
  try {
    await fn();
  } catch (e) {
    error = e;
  }
  return checkBadInput(error, patterns);
}

function checkBadInput(error: unknown, patterns: RegExp[]): K3Error {
  assert.ok(error instanceof K3Error, `expected a K3Error, got ${error}`);
  assert.equal(error.exitCode, 2);
  for (const p of patterns) assert.match(error.message, p);
  return error;
}

const SRC = "/ckpt/config.json";

Deno.test("nested config: every field read from the file", () => {
  const c = parseConfig(tinyConfigJson(), SRC);
  assert.equal(c.source, SRC);
  assert.equal(c.layout, "nested");
  assert.deepEqual(
    [c.vocabSize, c.hiddenSize, c.numLayers, c.intermediateSize, c.firstKDenseReplace],
    [40, 16, 4, 24, 1],
  );
  assert.deepEqual([c.numHeads, c.qLoraRank, c.kvLoraRank], [3, 12, 10]);
  assert.deepEqual([c.qkNopeHeadDim, c.qkRopeHeadDim, c.vHeadDim], [6, 2, 5]);
  assert.deepEqual([c.numExperts, c.topK, c.numSharedExperts], [4, 2, 2]);
  assert.deepEqual([c.moeIntermediateSize, c.latentSize, c.quantGroupSize], [8, 12, 4]);
  assert.deepEqual([c.situBeta, c.situLinearBeta, c.rmsNormEps], [4, 25, 1e-5]);
  assert.equal(c.attnResBlockSize, 2);
  assert.deepEqual(c.kda, {
    numHeads: 2,
    headDim: 7,
    convKernel: 3,
    gateLowerBound: -4.5,
    useFullRankGate: true,
  });
  assert.deepEqual(c.layerKinds, ["kda", "kda", "kda", "mla"]);
  assert.equal(c.routedScalingFactor, 2.5);
  assert.equal(c.moeRenormalize, false);
  assert.deepEqual(c.eosTokenIds, [39]);
  // Present flags are not defaults; absent ones are named.
  assert.deepEqual(c.defaultsApplied.sort(), [
    "text_config.latent_moe_use_norm=true",
    "text_config.mla_use_nope=true",
    "text_config.mla_use_output_gate=true",
    'text_config.moe_router_activation_func="sigmoid"',
    "text_config.num_expert_group=1",
  ]);
});

Deno.test("flat config reads the same values; defaults use flat key paths", () => {
  const nested = parseConfig(tinyConfigJson(), SRC);
  const flatJson = tinyFlatConfigJson();
  delete flatJson.routed_scaling_factor;
  const flat = parseConfig(flatJson, SRC);
  assert.equal(flat.layout, "flat");
  assert.equal(flat.routedScalingFactor, 1.0);
  assert.ok(flat.defaultsApplied.includes("routed_scaling_factor=1"));
  assert.deepEqual(
    { ...flat, layout: "nested", defaultsApplied: [], routedScalingFactor: 2.5 },
    { ...nested, defaultsApplied: [] },
  );
});

Deno.test("quantization_config is also accepted at the top level", () => {
  const json = tinyConfigJson();
  json.quantization_config = json.text_config.quantization_config;
  json.quantization_config.config_groups.group_0.weights.group_size = 2;
  delete json.text_config.quantization_config;
  assert.equal(parseConfig(json, SRC).quantGroupSize, 2);
});

Deno.test("missing keys are all named in one error with their JSON paths", () => {
  const json = tinyConfigJson();
  delete json.text_config.hidden_size;
  delete json.text_config.num_experts_per_token;
  delete json.text_config.linear_attn_config.kda_layers;
  delete json.text_config.linear_attn_config.head_dim;
  delete json.text_config.quantization_config.config_groups.group_0.weights.group_size;
  const e = assertBadInput(
    () => parseConfig(json, SRC),
    /\/ckpt\/config\.json/,
    /missing 5 required key/,
    /text_config\.hidden_size/,
    /text_config\.num_experts_per_token/,
    /text_config\.linear_attn_config\.kda_layers/,
    /text_config\.linear_attn_config\.head_dim/,
    /text_config\.quantization_config\.config_groups\.group_0\.weights\.group_size/,
  );
  assert.doesNotMatch(e.message, /vocab_size/);
});

Deno.test("a missing linear_attn_config names each of its keys", () => {
  const json = tinyConfigJson();
  delete json.text_config.linear_attn_config;
  assertBadInput(
    () => parseConfig(json, SRC),
    /missing 6 required key/,
    /text_config\.linear_attn_config\.full_attn_layers/,
    /text_config\.linear_attn_config\.gate_lower_bound/,
  );
});

Deno.test("values of the wrong JSON type are named with what was found", () => {
  const json = tinyConfigJson();
  json.text_config.hidden_size = "16";
  json.text_config.linear_attn_config.use_full_rank_gate = "yes";
  json.text_config.linear_attn_config.kda_layers = "1,2,3";
  json.text_config.moe_renormalize = 1;
  json.text_config.num_experts = 4.5;
  assertBadInput(
    () => parseConfig(json, SRC),
    /text_config\.hidden_size must be a positive integer, found "16"/,
    /use_full_rank_gate must be a boolean, found "yes"/,
    /kda_layers must be a list of integers, found "1,2,3"/,
    /moe_renormalize must be a boolean, found 1/,
    /num_experts must be a positive integer, found 4\.5/,
  );
  assertBadInput(() => parseConfig([1, 2], SRC), /must be a JSON object/);
  assertBadInput(
    () => parseConfig({ ...tinyConfigJson(), text_config: 7 }, SRC),
    /text_config must be an object, found 7/,
  );
});

/** Parses the tiny config with a different layer map. */
function withLayers(kda: unknown, full: unknown): () => unknown {
  const json = tinyConfigJson();
  json.text_config.linear_attn_config.kda_layers = kda;
  json.text_config.linear_attn_config.full_attn_layers = full;
  return () => parseConfig(json, SRC);
}

Deno.test("layer map: overlap, gap, 0-based and out-of-range indices are named", () => {
  assertBadInput(withLayers([1, 2, 3, 4], [4]), /full_attn_layers: layer 4 is listed twice/);
  assertBadInput(withLayers([1, 2, 2], [4]), /kda_layers: layer 2 is listed twice/);
  assertBadInput(
    withLayers([1, 3], [4]),
    /layers 2 are in neither kda_layers nor full_attn_layers/,
  );
  assertBadInput(
    withLayers([0, 1, 2], [3]),
    /kda_layers: layer 0 is out of range 1\.\.4 \(the lists are 1-based\)/,
    /layers 4 are in neither/,
  );
  assertBadInput(withLayers([1, 2, 3], [4, 5]), /full_attn_layers: layer 5 is out of range/);
});

Deno.test("value checks: activation, gate bound, group size, top-k, flags", () => {
  const cases: [(j: Record<string, any>) => void, RegExp][] = [
    [(j) => j.text_config.hidden_act = "silu", /hidden_act is "silu"; K3 uses "situ"/],
    [(j) => j.text_config.linear_attn_config.gate_lower_bound = -6, /-5 <= gate_lower_bound < 0/],
    [(j) => j.text_config.linear_attn_config.gate_lower_bound = 0, /gate_lower_bound is 0/],
    [
      (j) => j.text_config.quantization_config.config_groups.group_0.weights.group_size = 5,
      /routed_expert_hidden_size = 12 must be even and a multiple of the MXFP4 group size 5/,
    ],
    [(j) => j.text_config.num_experts_per_token = 5, /num_experts_per_token = 5 exceeds/],
    [
      (j) => j.text_config.moe_router_activation_func = "softmax",
      /moe_router_activation_func is "softmax"; only "sigmoid"/,
    ],
    [(j) => j.text_config.mla_use_nope = false, /mla_use_nope is false/],
    [(j) => j.text_config.mla_use_output_gate = false, /mla_use_output_gate is false/],
    [(j) => j.text_config.num_expert_group = 8, /num_expert_group is 8/],
    [(j) => j.text_config.rms_norm_eps = 0, /rms_norm_eps is 0; it must be at least 1e-12/],
    [(j) => j.text_config.eos_token_id = "x", /eos_token_id must be a token id or a list/],
    [(j) => j.text_config.linear_attn_config.use_full_rank_gate = false, /use_full_rank_gate/],
  ];
  for (const [edit, pattern] of cases) {
    const json = tinyConfigJson();
    edit(json);
    assertBadInput(() => parseConfig(json, SRC), /\/ckpt\/config\.json/, pattern);
  }
});

Deno.test("eos_token_id may be a list", () => {
  const json = tinyConfigJson();
  json.text_config.eos_token_id = [39, 38];
  assert.deepEqual(parseConfig(json, SRC).eosTokenIds, [39, 38]);
  delete json.text_config.eos_token_id;
  assert.deepEqual(parseConfig(json, SRC).eosTokenIds, []);
});

Deno.test("readConfig adds eos ids from generation_config.json and names bad files", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = path.join(dir, "config.json");
    await Deno.writeTextFile(file, JSON.stringify(tinyConfigJson()));
    assert.deepEqual((await readConfig(file)).eosTokenIds, [39]);
    await Deno.writeTextFile(
      path.join(dir, "generation_config.json"),
      JSON.stringify({ max_length: 100, eos_token_id: [37, 39] }),
    );
    const c = await readConfig(file);
    assert.deepEqual(c.eosTokenIds, [39, 37]);
    assert.equal(c.source, file);
    await Deno.writeTextFile(file, "{ not json");
    await assertRejectsBadInput(
      () => readConfig(file),
      /config\.json: config file is not valid JSON/,
    );
    await assertRejectsBadInput(
      () => readConfig(path.join(dir, "nope.json")),
      /nope\.json: config file does not exist/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("generation_config.json as a symlink loop is bad input naming it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = path.join(dir, "config.json");
    await Deno.writeTextFile(file, JSON.stringify(tinyConfigJson()));
    const gen = path.join(dir, "generation_config.json");
    await Deno.symlink(gen, gen);
    await assertRejectsBadInput(
      () => readConfig(file),
      /generation_config\.json: generation config file is a symlink loop/,
    );
    // A link to nothing is an absent generation config, as before.
    await Deno.remove(gen);
    await Deno.symlink("gone.json", gen);
    assert.deepEqual((await readConfig(file)).eosTokenIds, [39]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("optional keys: num_key_value_heads may be absent, use_full_rank_gate defaults and is named", () => {
  const json = tinyConfigJson();
  delete json.text_config.num_key_value_heads;
  delete json.text_config.linear_attn_config.use_full_rank_gate;
  const c = parseConfig(json, SRC);
  assert.ok(c.defaultsApplied.some((d) => d.includes("use_full_rank_gate=true")));
  json.text_config.num_key_value_heads = 1;
  assertBadInput(() => parseConfig(json, SRC), /num_key_value_heads is 1/);
});

Deno.test("config values are bounded: sizes, counts and nonsense floats are refused", () => {
  const t = (f: (c: Record<string, any>) => void) => (j: Record<string, any>) => f(j.text_config);
  const cases: [(j: Record<string, any>) => void, RegExp][] = [
    [t((c) => c.num_hidden_layers = 1e9), /num_hidden_layers is 1000000000, over the 1024/],
    [t((c) => c.num_experts = 1e15), /num_experts is 1000000000000000, over the 65536/],
    [t((c) => c.num_experts = 1e6), /num_experts is 1000000, over the 65536/],
    [t((c) => c.hidden_size = 1e9), /hidden_size is 1000000000, over the 1048576/],
    [t((c) => c.vocab_size = 1e12), /vocab_size is 1000000000000, over the 16777216/],
    [t((c) => c.num_attention_heads = 1e8), /num_attention_heads is 100000000, over the 4096/],
    [t((c) => c.attn_res_block_size = 1e15), /attn_res_block_size is 1000000000000000, over/],
    [t((c) => c.first_k_dense_replace = 5), /first_k_dense_replace is 5, more than num_hidden/],
    [t((c) => c.moe_layer_freq = 9), /moe_layer_freq is 9, more than num_hidden_layers/],
    [t((c) => c.routed_scaling_factor = 0), /routed_scaling_factor is 0; it must be above 0/],
    [t((c) => c.routed_scaling_factor = -1), /routed_scaling_factor is -1; it must be above 0/],
    [t((c) => c.routed_scaling_factor = 1e6), /routed_scaling_factor is 1000000; .*at most 1000/],
    [t((c) => c.rms_norm_eps = 1e300), /rms_norm_eps is 1e\+300; .*at most 0\.1/],
    [t((c) => c.rms_norm_eps = 1e-300), /rms_norm_eps is 1e-300; it must be at least 1e-12/],
    [t((c) => c.activation_situ_beta = 1e300), /activation_situ_beta is 1e\+300;.*SiTU/],
    [t((c) => c.activation_situ_linear_beta = 1e-300), /activation_situ_linear_beta is 1e-300/],
    [t((c) => c.max_position_embeddings = -1), /max_position_embeddings must be a positive/],
    [t((c) => c.max_position_embeddings = 1e15), /max_position_embeddings is 1000000000000000/],
    [
      t((c) => c.linear_attn_config.kda_layers = Array.from({ length: 1e6 }, (_, i) => i + 1)),
      /kda_layers has 1000000 entries; the model has 4 layers/,
    ],
    [
      (j) => {
        const groups: Record<string, unknown> = {};
        for (let i = 0; i < 1e5; i++) groups[`g${i}`] = { weights: { group_size: 4 } };
        j.text_config.quantization_config.config_groups = groups;
      },
      /config_groups has 100000 groups; k3 reads at most 64/,
    ],
  ];
  for (const [edit, pattern] of cases) {
    const json = tinyConfigJson();
    edit(json);
    assertBadInput(() => parseConfig(json, SRC), /\/ckpt\/config\.json/, pattern);
  }
  // The problem list is capped: 20 named, the rest counted.
  const json = tinyConfigJson();
  for (const key of Object.keys(json.text_config)) {
    if (typeof json.text_config[key] === "number") json.text_config[key] = "x";
  }
  json.text_config.linear_attn_config.kda_layers = ["x"];
  try {
    parseConfig(json, SRC);
    assert.fail("accepted");
  } catch (e) {
    const lines = (e as Error).message.split("\n");
    assert.ok(lines.length <= 22, `${lines.length} lines`);
    assert.match(lines.at(-1)!, /^ {2}\.\.\. and \d+ more problem\(s\)$/);
  }
  // max_position_embeddings is read as the context ceiling; absent, there is none.
  const withMax = tinyConfigJson();
  withMax.text_config.max_position_embeddings = 4096;
  assert.equal(parseConfig(withMax, SRC).maxPositions, 4096);
  assert.equal(parseConfig(tinyConfigJson(), SRC).maxPositions, undefined);
});
