/**
 * Tests of the float64 reference (tests/reference/): each building block against a case worked
 * out by hand, the safetensors and config readers on small files, and a whole tiny model.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  argmax,
  attnResMix,
  causalConvSilu,
  decodeMxfp4,
  deltaRuleStep,
  e2m1,
  e8m0,
  kdaDecay,
  l2Normalize,
  rmsNorm,
  routeTokens,
  situGlu,
  topKIndices,
} from "../reference/math.ts";
import { bf16ToNumber, decodeFloatTensor, readCheckpoint } from "../reference/safetensors.ts";
import { readRefConfig } from "../reference/config.ts";
import { loadReference, referenceForward, referenceGreedy } from "../reference/reference.ts";
import { makeTiny } from "../../lib/synth/tiny.ts";

const f64 = (values: number[]) => Float64Array.from(values);

/** Element-wise closeness with a relative-plus-absolute tolerance. */
function assertClose(actual: ArrayLike<number>, expected: number[], tol = 1e-12): void {
  assert.equal(actual.length, expected.length, "length");
  for (let i = 0; i < expected.length; i++) {
    const diff = Math.abs(actual[i] - expected[i]);
    assert.ok(
      diff <= tol * (1 + Math.abs(expected[i])),
      `index ${i}: got ${actual[i]}, expected ${expected[i]}`,
    );
  }
}

Deno.test("e2m1 decodes all 16 codes, code 8 as -0", () => {
  const expected = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6];
  expected.forEach((value, code) => assert.ok(Object.is(e2m1(code), value), `code ${code}`));
});

Deno.test("e8m0 is 2^(s-127); 0 is 2^-127; 255 is refused", () => {
  assert.equal(e8m0(127), 1);
  assert.equal(e8m0(128), 2);
  assert.equal(e8m0(126), 0.5);
  assert.equal(e8m0(0), 5.877471754111438e-39); // 2^-127
  assert.equal(e8m0(254), 1.7014118346046923e38); // 2^127
  assert.throws(() => e8m0(255), /255/);
});

Deno.test("decodeMxfp4: low nibble is the even column, one scale per group, -0 kept", () => {
  // 2 rows x 4 columns, group 2: bytes 0x21 -> (+0.5, +1), 0x8F -> (-6, -0).
  const packed = Uint8Array.from([0x21, 0x8f, 0x77, 0x10]);
  const scales = Uint8Array.from([128, 126, 0, 127]);
  const w = decodeMxfp4(packed, scales, 2, 4, 2);
  assert.deepEqual([...w.subarray(0, 3)], [0.5 * 2, 1 * 2, -6 * 0.5]);
  assert.ok(Object.is(w[3], -0), "0x8F high nibble is -0");
  const tiny = 2 ** -127;
  assert.deepEqual([...w.subarray(4)], [6 * tiny, 6 * tiny, 0, 0.5]);
  assert.throws(() => decodeMxfp4(packed, Uint8Array.from([127, 255, 127, 127]), 2, 4, 2), /255/);
});

Deno.test("topKIndices: largest first, ties to the lowest index", () => {
  assert.deepEqual(topKIndices(f64([0.5, 0.9, 0.5, 0.9, 0.1]), 3), [1, 3, 0]);
  assert.deepEqual(topKIndices(f64([2, 2, 2, 2]), 2), [0, 1]);
  assert.equal(argmax(f64([1, 3, 0, 3])), 1, "greedy ties go to the lowest id");
});

Deno.test("routeTokens: select by sigmoid+bias, weigh by unbiased sigmoid, renormalise, scale", () => {
  // sigmoid(logits) = [0.5, 0.5, 0.75, 0.5]; + bias = [0.5, 0.8, 0.75, 0.8].
  const logits = f64([0, 0, Math.log(3), 0]);
  const bias = f64([0, 0.3, 0, 0.3]);
  const renormalised = routeTokens(logits, bias, 3, true, 2);
  assert.deepEqual(renormalised.experts, [1, 3, 2]);
  assertClose(renormalised.weights, [4 / 7, 4 / 7, 6 / 7]);
  const raw = routeTokens(logits, bias, 3, false, 2);
  assertClose(raw.weights, [1, 1, 1.5]);
  // With top-1 the reference does not renormalise (MODEL.md §4.8 step 3).
  const single = routeTokens(logits, bias, 1, true, 3);
  assert.deepEqual(single.experts, [1]);
  assertClose(single.weights, [1.5]);
});

Deno.test("deltaRuleStep: decay, read, write, then read the updated state (2x2 by hand)", () => {
  const state = new Float64Array(4);
  const alpha = f64([0.5, 1]);
  const o1 = deltaRuleStep(state, alpha, f64([1, 0]), f64([1, 0]), f64([2, 4]), 0.5);
  assertClose(o1, [1, 2]);
  assertClose(state, [1, 2, 0, 0]);
  // Decay -> row 0 = [0.5, 1]; u = 0.6·[0.5, 1] = [0.3, 0.6]; v - u = [0.7, -0.6];
  // S += k ⊗ (v - u) -> rows [0.92, 0.64] and [0.56, -0.48]; o = row 1 (q = e1).
  const o2 = deltaRuleStep(state, alpha, f64([0, 1]), f64([0.6, 0.8]), f64([1, 0]), 1);
  assertClose(state, [0.92, 0.64, 0.56, -0.48]);
  assertClose(o2, [0.56, -0.48]);
});

Deno.test("kdaDecay: exp(lb · sigmoid(exp(A_log) · (g + dt_bias)))", () => {
  assertClose([kdaDecay(0, 0, 0, -5)], [Math.exp(-2.5)]);
  assertClose([kdaDecay(1, -0.5, Math.log(2), -5)], [Math.exp(-5 / (1 + Math.exp(-1)))]);
  assertClose([kdaDecay(3, 1, 0, -2)], [Math.exp(-2 / (1 + Math.exp(-4)))]);
});

Deno.test("causalConvSilu: oldest tap first, zero history, SiLU after", () => {
  const silu = (y: number) => y / (1 + Math.exp(-y));
  const out = causalConvSilu([f64([1]), f64([2]), f64([3])], f64([0.1, -0.2, 0.3]), 3);
  assertClose(out.map((o) => o[0]), [silu(0.3), silu(0.4), silu(0.6)]);
});

Deno.test("l2Normalize sums squares; rmsNorm averages them and applies the gain", () => {
  assertClose(l2Normalize(f64([3, 4])), [3 / Math.sqrt(25 + 1e-6), 4 / Math.sqrt(25 + 1e-6)]);
  const r = Math.sqrt(12.5 + 1e-5);
  assertClose(rmsNorm(f64([3, 4]), f64([1, 2]), 1e-5), [3 / r, 8 / r]);
});

Deno.test("attnResMix: softmax over bank rows + prefix by gain-folded scores of RMS-normed rows", () => {
  const normW = f64([2, 1]);
  const projW = f64([0.5, 1]); // folded score vector [1, 1]
  // Rows [1,0] and [0,2] both score sqrt(2) with eps 0: an even mix.
  assertClose(attnResMix(f64([0, 2]), [f64([1, 0])], normW, projW, 0), [0.5, 1]);
  // Row [3,0] scores 3/sqrt(4.5) = sqrt(2); the prefix [1,1] scores 2/1 = 2.
  const pBank = 1 / (1 + Math.exp(2 - Math.SQRT2));
  assertClose(attnResMix(f64([1, 1]), [f64([3, 0])], normW, projW, 0), [
    3 * pBank + (1 - pBank),
    1 - pBank,
  ]);
  const prefix = f64([7, 8]);
  assert.equal(attnResMix(prefix, [], normW, projW, 1e-5), prefix, "empty bank: the prefix");
});

Deno.test("situGlu: sigmoid of the uncapped gate, both caps, |out| <= beta1·beta2", () => {
  const out = situGlu(f64([8, 1000, -1000, 0, 2]), f64([3, 1000, 1000, 5, -3]), 4, 25);
  const sig = (x: number) => 1 / (1 + Math.exp(-x));
  assertClose(out, [
    4 * Math.tanh(2) * sig(8) * 25 * Math.tanh(0.12),
    100,
    -4 * sig(-1000) * 25,
    0,
    4 * Math.tanh(0.5) * sig(2) * 25 * Math.tanh(-0.12),
  ]);
  for (const v of out) assert.ok(Math.abs(v) <= 100);
});

/** A safetensors file from (name, dtype, shape, bytes) entries. */
function safetensorsBytes(entries: [string, string, number[], Uint8Array][]): Uint8Array {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [name, dtype, shape, bytes] of entries) {
    header[name] = { dtype, shape, data_offsets: [offset, offset + bytes.length] };
    offset += bytes.length;
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const [, , , bytes] of entries) {
    out.set(bytes, at);
    at += bytes.length;
  }
  return out;
}

Deno.test("bf16ToNumber widens exactly", () => {
  assert.equal(bf16ToNumber(0x3f80), 1);
  assert.equal(bf16ToNumber(0xc040), -3);
  assert.ok(Object.is(bf16ToNumber(0x8000), -0));
  assert.equal(bf16ToNumber(0x7f80), Infinity);
  assert.equal(bf16ToNumber(0x0001), 2 ** -133);
});

Deno.test("readCheckpoint: index or scan, BF16/F32/U8 decoded, size mismatch refused", async () => {
  const dir = mkdtempSync(join(tmpdir(), "k3-ref-st-"));
  try {
    const bf16 = new Uint8Array(new Uint16Array([0x3f80, 0xc040]).buffer);
    const f32 = new Uint8Array(new Float32Array([0.1]).buffer);
    writeFileSync(join(dir, "a.safetensors"), safetensorsBytes([["x", "BF16", [2], bf16]]));
    writeFileSync(
      join(dir, "b.safetensors"),
      safetensorsBytes([["y", "F32", [1, 1], f32], ["z", "U8", [3], Uint8Array.from([1, 2, 3])]]),
    );
    const scanned = await readCheckpoint(dir);
    assert.deepEqual([...decodeFloatTensor(scanned.get("x")!)], [1, -3]);
    assert.deepEqual([...decodeFloatTensor(scanned.get("y")!)], [Math.fround(0.1)]);
    assert.deepEqual([...scanned.get("z")!.bytes], [1, 2, 3]);
    writeFileSync(
      join(dir, "model.safetensors.index.json"),
      JSON.stringify({ weight_map: { x: "a.safetensors" } }),
    );
    assert.deepEqual([...(await readCheckpoint(dir)).keys()], ["x"]);
    writeFileSync(join(dir, "a.safetensors"), safetensorsBytes([["x", "BF16", [3], bf16]]));
    await assert.rejects(readCheckpoint(dir), /tensor x has 4 bytes/);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

Deno.test("readRefConfig names every missing key at once and checks the layer lists", () => {
  const dir = mkdtempSync(join(tmpdir(), "k3-ref-cfg-"));
  try {
    writeFileSync(join(dir, "config.json"), JSON.stringify({ text_config: { hidden_size: 8 } }));
    assert.throws(
      () => readRefConfig(dir),
      (e: Error) =>
        ["vocab_size", "attn_res_block_size", "linear_attn_config.num_heads"]
          .every((key) => e.message.includes(key)) && !/[ ,]hidden_size/.test(e.message),
    );
    const complete = {
      vocab_size: 10,
      hidden_size: 8,
      num_hidden_layers: 3,
      intermediate_size: 12,
      first_k_dense_replace: 1,
      moe_layer_freq: 1,
      rms_norm_eps: 1e-5,
      activation_situ_beta: 4,
      activation_situ_linear_beta: 25,
      num_attention_heads: 2,
      q_lora_rank: 4,
      kv_lora_rank: 4,
      qk_nope_head_dim: 2,
      qk_rope_head_dim: 2,
      v_head_dim: 2,
      num_experts: 4,
      num_experts_per_token: 2,
      num_shared_experts: 1,
      moe_intermediate_size: 6,
      routed_expert_hidden_size: 4,
      attn_res_block_size: 2,
      quantization_config: { config_groups: { group_0: { weights: { group_size: 2 } } } },
      linear_attn_config: {
        num_heads: 2,
        head_dim: 2,
        short_conv_kernel_size: 2,
        gate_lower_bound: -5,
        kda_layers: [1, 2],
        full_attn_layers: [3],
      },
    };
    writeFileSync(join(dir, "config.json"), JSON.stringify(complete));
    const config = readRefConfig(dir);
    assert.deepEqual(config.layerKinds, ["kda", "kda", "mla"]);
    assert.equal(config.mxfp4GroupSize, 2);
    complete.linear_attn_config.full_attn_layers = [2, 3];
    writeFileSync(join(dir, "config.json"), JSON.stringify(complete));
    assert.throws(() => readRefConfig(dir), /layer 2 \(1-based\) is in both/);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

/** A fixed 20-token prompt spread over the vocabulary. */
function testPrompt(vocabSize: number): number[] {
  return Array.from({ length: 20 }, (_, i) => (i * 37 + 5) % vocabSize);
}

Deno.test("a generated tiny model: forward == greedy step 0, causal, 16 varied tokens", async () => {
  const dir = mkdtempSync(join(tmpdir(), "k3-ref-tiny-"));
  try {
    await makeTiny(dir, {
      seed: 11,
      layers: 8,
      experts: 13,
      topK: 7,
      mlaLayers: [4, 7, 8],
      blockSize: 3,
    });
    const model = await loadReference(dir);
    assert.deepEqual(model.config.layerKinds, [
      "kda",
      "kda",
      "kda",
      "mla",
      "kda",
      "kda",
      "mla",
      "mla",
    ]);
    const prompt = testPrompt(model.config.vocabSize);
    const all = referenceForward(model, prompt);
    assert.equal(all.length, prompt.length);
    for (const row of all) assert.ok(row.every(Number.isFinite), "finite logits");
    const greedy = referenceGreedy(model, prompt, 16);
    assert.equal(greedy.logits.length, 16);
    assert.deepEqual([...greedy.logits[0]], [...all[all.length - 1]]);
    assert.ok(new Set(greedy.tokens).size > 1, `16 greedy tokens all equal ${greedy.tokens[0]}`);
    // No position sees the future: a prefix's logits equal the full sequence's first rows.
    const prefix = referenceForward(model, prompt.slice(0, 7));
    prefix.forEach((row, t) => assert.deepEqual([...row], [...all[t]], `position ${t}`));
  } finally {
    rmSync(dir, { recursive: true });
  }
});

Deno.test("a flat tiny checkpoint (bare model. names) loads and runs", async () => {
  const dir = mkdtempSync(join(tmpdir(), "k3-ref-flat-"));
  try {
    await makeTiny(dir, { seed: 3, flat: true });
    const model = await loadReference(dir);
    const logits = referenceForward(model, testPrompt(model.config.vocabSize).slice(0, 4));
    assert.equal(logits[3].length, model.config.vocabSize);
    assert.ok(logits[3].every(Number.isFinite));
  } finally {
    rmSync(dir, { recursive: true });
  }
});
