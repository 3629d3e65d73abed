/**
 * make-tiny: determinism, the released layout (checked against a table written here from
 * MODEL.md §2-§3, not from the generator), the BPE tokenizer through npm tiktoken, special ids, the
 * MXFP4 and bf16 encoders, the k3 plan (no data written), and the CLI's exit codes.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { Tiktoken } from "tiktoken";
import { makeTinyCommand } from "../../lib/cli/make_tiny.ts";
import { readSafetensorsHeader } from "../../lib/checkpoint/safetensors.ts";
import { trainBpe } from "../../lib/synth/bpe.ts";
import { KIMI_PAT_STR } from "../../lib/text/tokenizer.ts";
import { SYNTH_CORPUS } from "../../lib/synth/corpus.ts";
import { bf16ToF32, encodeMxfp4, f32ToBf16, XorShift128 } from "../../lib/synth/numerics.ts";
import { makeTiny, planCheckpoint, type TinyOptions } from "../../lib/synth/tiny.ts";
import { loadReference, referenceGreedy } from "../reference/reference.ts";
import { decodeFloatTensor, readShard, type StoredTensor } from "../reference/safetensors.ts";
import { assertLayout, expectedLayout, type Layout } from "../support/spec_layout.ts";

// ---------------------------------------------------------------------------------------------
// Helpers

/** Runs `body` with a fresh checkpoint written by makeTiny, then removes it. */
async function withCheckpoint(
  options: TinyOptions,
  body: (dir: string) => void | Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "k3-synth-" });
  try {
    await makeTiny(dir, options);
    await body(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function sha256(path: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", await Deno.readFile(path));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function hashDir(dir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const e of [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name))) {
    out.set(e.name, await sha256(join(dir, e.name)));
  }
  return out;
}

function readJson(dir: string, file: string): any {
  return JSON.parse(Deno.readTextFileSync(join(dir, file)));
}

function shardFiles(dir: string): string[] {
  return [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => n.endsWith(".safetensors"))
    .sort();
}

/** Every tensor of every shard, by name, with the file it came from. */
async function readAll(dir: string): Promise<Map<string, StoredTensor>> {
  const all = new Map<string, StoredTensor>();
  for (const file of shardFiles(dir)) {
    for (const t of await readShard(join(dir, file))) {
      assert.ok(!all.has(t.name), `${t.name} appears in two shards`);
      all.set(t.name, t);
    }
  }
  return all;
}

function mean(xs: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < xs.length; i++) s += xs[i];
  return s / xs.length;
}

function rms(xs: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < xs.length; i++) s += xs[i] * xs[i];
  return Math.sqrt(s / xs.length);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint files

Deno.test("make-tiny: the same seed gives byte-identical files, another seed other weights", async () => {
  const dirs = await Promise.all([1, 2, 3].map(() => Deno.makeTempDir({ prefix: "k3-synth-" })));
  try {
    await makeTiny(dirs[0], { seed: 7 });
    await makeTiny(dirs[1], { seed: 7 });
    await makeTiny(dirs[2], { seed: 8 });
    const [a, b, c] = await Promise.all(dirs.map(hashDir));
    assert.deepEqual(a, b);
    assert.ok(a.size >= 9, `expected at least 9 files, got ${[...a.keys()]}`);
    for (const [file, hash] of a) {
      const sameExpected = !file.endsWith(".safetensors");
      assert.equal(hash === c.get(file), sameExpected, `${file} vs seed 8`);
    }
  } finally {
    for (const d of dirs) await Deno.remove(d, { recursive: true });
  }
});

Deno.test("make-tiny: config.json is the nested K3 config with every MODEL.md §2.1 key", async () => {
  await withCheckpoint({}, (dir) => {
    const root = readJson(dir, "config.json");
    assert.equal(root.model_type, "kimi_k3");
    assert.deepEqual(root.architectures, ["KimiK3ForConditionalGeneration"]);
    assert.equal(root.tie_word_embeddings, false);
    const c = root.text_config;
    // deno-fmt-ignore
    const keys = [
      "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
      "first_k_dense_replace", "moe_layer_freq", "hidden_act", "activation_situ_beta",
      "activation_situ_linear_beta", "rms_norm_eps", "max_position_embeddings",
      "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
      "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mla_use_nope", "mla_use_output_gate",
      "num_experts", "num_experts_per_token", "num_shared_experts", "moe_intermediate_size",
      "routed_expert_hidden_size", "latent_moe_use_norm", "moe_router_activation_func",
      "moe_renormalize", "routed_scaling_factor", "use_grouped_topk", "num_expert_group",
      "topk_group", "topk_method", "attn_res_block_size", "num_nextn_predict_layers",
      "eos_token_id", "bos_token_id", "quantization_config", "linear_attn_config",
    ];
    assert.deepEqual(keys.filter((k) => c[k] === undefined), []);
    assert.equal(c.hidden_act, "situ");
    assert.equal(c.activation_situ_beta, 4);
    assert.equal(c.activation_situ_linear_beta, 25);
    assert.equal(c.attn_res_block_size, 3);
    assert.equal(c.num_hidden_layers, 8);
    const la = c.linear_attn_config;
    // Default schedule: MLA at the last two layers and one in the middle (1-based).
    assert.deepEqual(la.full_attn_layers, [4, 7, 8]);
    assert.deepEqual([...la.kda_layers, ...la.full_attn_layers].sort((a, b) => a - b), [
      1,
      2,
      3,
      4,
      5,
      6,
      7,
      8,
    ]);
    assert.equal(la.gate_lower_bound, -5);
    assert.equal(la.use_full_rank_gate, true);
    const q = c.quantization_config;
    assert.equal(q.format, "mxfp4-pack-quantized");
    assert.equal(q.config_groups.group_0.weights.group_size, 32);
    assert.equal(q.config_groups.group_0.weights.num_bits, 4);
    // Tiny widths all differ, so a swapped dimension cannot pass.
    // deno-fmt-ignore
    const widths = [
      c.hidden_size, la.num_heads, la.head_dim, la.num_heads * la.head_dim, c.num_attention_heads,
      c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
      c.num_experts, c.num_experts_per_token, c.moe_intermediate_size,
      c.routed_expert_hidden_size, c.intermediate_size, c.vocab_size,
    ];
    assert.equal(new Set(widths).size, widths.length, `widths repeat: ${widths}`);
    const generation = readJson(dir, "generation_config.json");
    assert.equal(generation.eos_token_id, c.eos_token_id);
  });
});

Deno.test("make-tiny: every tensor has the released name, dtype and shape; shards parse", async () => {
  await withCheckpoint({}, async (dir) => {
    const c = readJson(dir, "config.json").text_config;
    const tensors = await readAll(dir);
    assertLayout(
      tensors,
      expectedLayout(c, "language_model.model.", "language_model.lm_head.weight"),
    );
    const files = shardFiles(dir);
    assert.ok(files.length >= 3, `trunk + at least two expert shards, got ${files}`);
    for (const file of files) {
      // The project's strict header parser must accept every shard too.
      const header = await readSafetensorsHeader(join(dir, file));
      assert.ok(header.entries.length > 0);
      for (const e of header.entries) {
        const size = { BF16: 2, F32: 4, U8: 1 }[e.dtype as string]!;
        assert.equal((header.dataStart + e.begin) % size, 0, `${e.name} is not aligned`);
      }
    }
    // Trunk in the first shard, experts only in the others.
    const first = await readShard(join(dir, files[0]));
    assert.ok(first.every((t) => !t.name.includes(".experts.")));
    for (const file of files.slice(1)) {
      assert.ok((await readShard(join(dir, file))).every((t) => t.name.includes(".experts.")));
    }
  });
});

Deno.test("make-tiny: the index maps every tensor to the shard that holds it", async () => {
  await withCheckpoint({ layers: 4, experts: 5 }, async (dir) => {
    const index = readJson(dir, "model.safetensors.index.json");
    const tensors = await readAll(dir);
    const map = index.weight_map as Record<string, string>;
    assert.deepEqual(Object.keys(map).sort(), [...tensors.keys()].sort());
    for (const [name, t] of tensors) assert.equal(join(dir, map[name]), t.file, name);
    const total = [...tensors.values()].reduce((n, t) => n + t.bytes.length, 0);
    assert.equal(index.metadata.total_size, total);
  });
});

Deno.test("make-tiny: flat config with bare model. names; same weights as nested", async () => {
  const options = { layers: 5, mlaLayers: [2, 5], blockSize: 2, topK: 2, experts: 4, seed: 3 };
  await withCheckpoint({ ...options, flat: true }, async (flatDir) => {
    const c = readJson(flatDir, "config.json");
    assert.equal(c.text_config, undefined);
    assert.deepEqual(c.linear_attn_config.full_attn_layers, [2, 5]);
    assert.deepEqual(c.linear_attn_config.kda_layers, [1, 3, 4]);
    assert.equal(c.attn_res_block_size, 2);
    assert.equal(c.num_experts_per_token, 2);
    const flat = await readAll(flatDir);
    assertLayout(flat, expectedLayout(c, "model.", "lm_head.weight"));
    await withCheckpoint(options, async (nestedDir) => {
      const nested = await readAll(nestedDir);
      for (const [name, t] of flat) {
        const twin = nested.get(`language_model.${name}`)!;
        assert.deepEqual(twin.bytes, t.bytes, name);
      }
    });
  });
});

Deno.test("make-tiny: A_log padding, norms near 1, MXFP4 magnitudes near 1/sqrt(fan_in)", async () => {
  await withCheckpoint({ layers: 3 }, async (dir) => {
    const c = readJson(dir, "config.json").text_config;
    const heads = c.linear_attn_config.num_heads;
    const t = await readAll(dir);
    const aLog = decodeFloatTensor(t.get("language_model.model.layers.0.self_attn.A_log")!);
    for (let h = 0; h < aLog.length; h++) {
      if (h < heads) assert.ok(aLog[h] >= 0 && aLog[h] <= Math.log(16), `A_log[${h}] ${aLog[h]}`);
      else assert.equal(aLog[h], 0, `A_log padding [${h}]`);
    }
    const gainMean = mean(decodeFloatTensor(t.get("language_model.model.norm.weight")!));
    assert.ok(Math.abs(gainMean - 1) < 0.1, `norm gain mean ${gainMean}`);
    const q = decodeFloatTensor(t.get("language_model.model.layers.0.self_attn.q_proj.weight")!);
    const qStd = rms(q) * Math.sqrt(c.hidden_size);
    assert.ok(qStd > 0.8 && qStd < 1.25, `q_proj std * sqrt(fan_in) = ${qStd}`);
    for (
      const [w, fanIn] of [["w1", c.routed_expert_hidden_size], ["w2", c.moe_intermediate_size]]
    ) {
      const x = `language_model.model.layers.1.block_sparse_moe.experts.2.${w}`;
      const packed = t.get(`${x}.weight_packed`)!, scale = t.get(`${x}.weight_scale`)!;
      assert.ok(scale.bytes.every((s) => s !== 255), "E8M0 NaN scale");
      const values = decodeMxfp4Local(packed.bytes, scale.bytes, packed.shape[0], fanIn as number);
      const std = rms(values) * Math.sqrt(fanIn as number);
      assert.ok(std > 0.5 && std < 2, `${w} std * sqrt(fan_in) = ${std}`);
    }
  });
});

Deno.test("make-tiny: greedy decoding (float64 reference) does not collapse", async () => {
  await withCheckpoint({ layers: 4 }, async (dir) => {
    const model = await loadReference(dir);
    const { tokens, logits } = referenceGreedy(model, [11, 500, 900], 6);
    assert.ok(new Set(tokens).size >= 3, `greedy tokens collapse: ${tokens}`);
    const l = logits[0];
    const spread = rms(l.map((v) => v - mean(l)));
    assert.ok(spread > 0.2 && spread < 20, `logit spread ${spread}`);
  });
});

Deno.test("make-tiny: CLI exit codes and foreign-shard refusal", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-synth-" });
  const quiet = { error: console.error, log: console.log };
  console.error = console.log = () => {};
  try {
    assert.equal(await makeTinyCommand([]), 2);
    assert.equal(await makeTinyCommand([dir, "--layers", "two"]), 2);
    assert.equal(await makeTinyCommand([dir, "--shape", "huge"]), 2);
    assert.equal(await makeTinyCommand([dir, "--bogus"]), 2);
    assert.equal(await makeTinyCommand([dir, "--layers", "0"]), 2);
    assert.equal(await makeTinyCommand(["--help"]), 0);
    assert.equal(await makeTinyCommand([dir, "--layers", "2", "--experts", "3", "--seed", "5"]), 0);
    assert.equal(readJson(dir, "config.json").text_config.num_experts, 3);
    // Fewer layers -> fewer shards; the old shards would be mixed in, so refuse.
    assert.equal(await makeTinyCommand([dir, "--layers", "1"]), 2);
  } finally {
    Object.assign(console, quiet);
    await Deno.remove(dir, { recursive: true });
  }
});

// ---------------------------------------------------------------------------------------------
// Tokenizer

Deno.test("BPE: the most frequent pair merges first, inside words only", () => {
  // Pieces: "ab", " ab", " ab", " cd". (a,b) x3, then (" ", "ab") x2; never across pieces.
  const tokens = trainBpe("ab ab ab cd", 258);
  const text = (t: Uint8Array) => new TextDecoder().decode(t);
  assert.deepEqual(tokens.slice(256).map(text), ["ab", " ab"]);
  for (let b = 0; b < 256; b++) assert.deepEqual([...tokens[b]], [b]);
  assert.throws(() => trainBpe("ab", 300), RangeError);
});

Deno.test("tokenizer: tiktoken.model and tokenizer_config.json load in tiktoken and round-trip", async () => {
  await withCheckpoint({ layers: 1 }, (dir) => {
    const ranksText = Deno.readTextFileSync(join(dir, "tiktoken.model"));
    const lines = ranksText.trimEnd().split("\n");
    const seen = new Set<string>();
    lines.forEach((line, i) => {
      const [b64, rank] = line.split(" ");
      assert.equal(Number(rank), i, `rank on line ${i}`);
      assert.ok(!seen.has(b64), `duplicate token ${b64}`);
      seen.add(b64);
      if (i < 256) assert.deepEqual([...Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0))], [i]);
    });
    assert.equal(lines.length, 1024);

    const config = readJson(dir, "config.json").text_config;
    const decoder = readJson(dir, "tokenizer_config.json").added_tokens_decoder;
    const V: number = config.vocab_size;
    assert.equal(V, lines.length + 256);
    // deno-fmt-ignore
    const named: Record<number, string> = {
      0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
      18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
      254: "[UNK]", 255: "[PAD]",
    };
    const specials: Record<string, number> = {};
    for (let k = 0; k < 256; k++) {
      const id = V - 256 + k;
      const want = named[k] ?? `<|reserved_token_${id}|>`;
      assert.equal(decoder[String(id)]?.content, want, `special id ${id}`);
      specials[want] = id;
    }
    assert.equal(Object.keys(decoder).length, 256);
    assert.equal(config.eos_token_id, specials["<|end_of_msg|>"]);
    assert.equal(config.bos_token_id, specials["[BOS]"]);

    const enc = new Tiktoken(ranksText, specials, KIMI_PAT_STR);
    try {
      const ids = enc.encode_ordinary(SYNTH_CORPUS);
      const bytes = new TextEncoder().encode(SYNTH_CORPUS).length;
      assert.equal(new TextDecoder().decode(enc.decode(ids)), SYNTH_CORPUS);
      assert.ok(ids.length < bytes / 2.5, `${ids.length} tokens for ${bytes} bytes: merges unused`);
      const chat =
        '<|open|>message role="user"<|sep|>Hello, 世界 🙂!<|close|>message<|sep|><|end_of_msg|>';
      const chatIds = enc.encode(chat, "all");
      assert.equal(chatIds[0], specials["<|open|>"]);
      assert.equal(chatIds[chatIds.length - 1], config.eos_token_id);
      assert.equal(new TextDecoder().decode(enc.decode(chatIds)), chat);
    } finally {
      enc.free();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Number formats

const E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

/** Independent MXFP4 decoder: low nibble = even column, E8M0 scale per group. */
function decodeMxfp4Local(packed: Uint8Array, scales: Uint8Array, rows: number, cols: number) {
  const out = new Float64Array(rows * cols);
  const groups = scales.length / rows, group = cols / groups;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const byte = packed[(r * cols + c) >> 1];
      const code = c % 2 === 0 ? byte & 15 : byte >> 4;
      const v = (code & 8 ? -1 : 1) * E2M1[code & 7];
      out[r * cols + c] = v * 2 ** (scales[r * groups + Math.floor(c / group)] - 127);
    }
  }
  return out;
}

Deno.test("MXFP4 encoder: exact values round-trip, nibble order, nearest rounding", () => {
  const rows = 3, cols = 64, group = 32;
  const rng = new XorShift128(99);
  const values = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < cols / group; g++) {
      const scale = 2 ** ((rng.nextU32() % 9) - 6);
      for (let k = 0; k < group; k++) {
        const code = rng.nextU32() % 16;
        values[r * cols + g * group + k] = (code & 8 ? -1 : 1) * E2M1[code & 7] * scale;
      }
      values[r * cols + g * group + 5] = 6 * scale; // pin the group max so the scale is exact
    }
  }
  const { packed, scales } = encodeMxfp4(values, rows, cols, group);
  assert.equal(packed.length, rows * cols / 2);
  assert.equal(scales.length, rows * cols / group);
  assert.deepEqual(Array.from(decodeMxfp4Local(packed, scales, rows, cols)), Array.from(values));

  const row = new Float32Array(32);
  row.set([0.5, 1, -6, 1.25, 2.6, 0.2]);
  row[31] = 6;
  const one = encodeMxfp4(row, 1, 32, 32);
  assert.equal(one.scales[0], 127);
  assert.equal(one.packed[0], 0x21); // column 0 (0.5 -> code 1) low, column 1 (1 -> code 2) high
  assert.equal(one.packed[1], 0x2f); // -6 -> 15; 1.25 ties to the even code 2 (1.0)
  assert.equal(one.packed[2], 0x05); // 2.6 -> 3 (code 5); 0.2 -> 0
  assert.throws(() => encodeMxfp4(new Float32Array(48), 1, 48, 32), RangeError);
});

Deno.test("bf16: round to nearest even, exact widening", () => {
  assert.equal(f32ToBf16(1), 0x3f80);
  assert.equal(f32ToBf16(-2), 0xc000);
  assert.equal(f32ToBf16(1 + 2 ** -8), 0x3f80); // halfway, ties to even (down)
  assert.equal(f32ToBf16(1 + 3 * 2 ** -8), 0x3f82); // halfway, ties to even (up)
  assert.equal(f32ToBf16(1 + 2 ** -8 + 2 ** -20), 0x3f81); // above halfway
  assert.equal(f32ToBf16(Infinity), 0x7f80);
  assert.ok(Number.isNaN(bf16ToF32(f32ToBf16(NaN))));
  assert.equal(bf16ToF32(0x3fc0), 1.5);
});

// ---------------------------------------------------------------------------------------------
// k3 shape (planned, never written in tests)

Deno.test("k3 shape: true widths, released layout and sizes, planned without data", () => {
  const plan = planCheckpoint({ shape: "k3" });
  const c = (plan.config as any).text_config;
  assert.equal(c.hidden_size, 7168);
  assert.equal(c.num_hidden_layers, 4);
  assert.equal(c.num_experts, 32);
  assert.equal(c.num_experts_per_token, 8);
  assert.equal(c.linear_attn_config.num_heads * c.linear_attn_config.head_dim, 12288);
  const tensors: Layout = new Map();
  for (const shard of plan.shards) {
    for (const t of shard.tensors) tensors.set(t.name, { dtype: t.dtype, shape: t.shape });
  }
  assertLayout(
    tensors,
    expectedLayout(c, "language_model.model.", "language_model.lm_head.weight"),
  );
  // MODEL.md §3.3: one expert is 17,547,264 bytes; q_b_proj is [18432, 1536].
  const expertBytes = plan.shards.flatMap((s) => s.tensors)
    .filter((t) => t.name.includes(".layers.1.block_sparse_moe.experts.0."))
    .reduce((n, t) => n + t.nbytes, 0);
  assert.equal(expertBytes, 17_547_264);
  const qb = [...tensors].find(([n]) => n.endsWith("q_b_proj.weight"))!;
  assert.deepEqual(qb[1].shape, [18432, 1536]);
  assert.equal(plan.totalTensorBytes, plan.shards.reduce((n, s) => n + s.dataBytes, 0));
  assert.ok(plan.totalTensorBytes > 5e9 && plan.totalTensorBytes < 9e9, `${plan.totalTensorBytes}`);
});
