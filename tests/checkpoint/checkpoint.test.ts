/**
 * Checkpoint reading: the safetensors writer and strict header parser, shard discovery
 * (index or scan), name prefixes, and binding with shape/dtype checks. Every checkpoint is
 * built here in a temp dir with the project's own writer.
 *
 * The expected tensor list is written out by hand from MODEL.md §3.3 for the tiny config of
 * tests/checkpoint/config.test.ts (H 16, V 40; KDA 2 heads x 7, conv 3; MLA 3 heads, nope 6, rope 2,
 * v 5, q rank 12, kv rank 10; dense 24; 4 experts, latent 12, expert width 8, 2 shared,
 * group 4), so the binder is checked against an independent reference.
 */

import assert from "node:assert/strict";
import * as path from "node:path";
import {
  buildHeader,
  parseSafetensorsHeader,
  writeSafetensors,
} from "../../lib/checkpoint/safetensors.ts";
import { canonicalName, INDEX_FILE, readShards } from "../../lib/checkpoint/shards.ts";
import { bindModel } from "../../lib/checkpoint/bind.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { parseConfig } from "../../lib/checkpoint/config.ts";
import type { DType } from "../../lib/checkpoint/types.ts";
import { assertBadInput, assertRejectsBadInput, tinyConfigJson } from "./config.test.ts";

type Spec = { name: string; dtype: DType; shape: number[] };

/** The tiny config (the one every checkpoint here is built for). */
const TINY = parseConfig(tinyConfigJson(), "/tiny/config.json");

/** Every language-model tensor of the tiny model, canonical names (MODEL.md §3.3). */
function tinyTensorSpecs(): Spec[] {
  const specs: Spec[] = [
    { name: "model.embed_tokens.weight", dtype: "BF16", shape: [40, 16] },
    { name: "model.norm.weight", dtype: "BF16", shape: [16] },
    { name: "model.output_attn_res_norm.weight", dtype: "BF16", shape: [16] },
    { name: "model.output_attn_res_proj.weight", dtype: "BF16", shape: [1, 16] },
    { name: "lm_head.weight", dtype: "BF16", shape: [40, 16] },
  ];
  const add = (i: number, suffix: string, dtype: DType, shape: number[]) =>
    specs.push({ name: `model.layers.${i}.${suffix}`, dtype, shape });
  for (let i = 0; i < 4; i++) {
    const attnWidth = i < 3 ? 14 : 15; // KDA 2 x 7, MLA 3 x 5
    add(i, "input_layernorm.weight", "BF16", [16]);
    add(i, "post_attention_layernorm.weight", "BF16", [16]);
    add(i, "self_attention_res_norm.weight", "BF16", [16]);
    add(i, "self_attention_res_proj.weight", "BF16", [1, 16]);
    add(i, "mlp_res_norm.weight", "BF16", [16]);
    add(i, "mlp_res_proj.weight", "BF16", [1, 16]);
    add(i, "self_attn.g_proj.weight", "BF16", [attnWidth, 16]);
    add(i, "self_attn.o_proj.weight", "BF16", [16, attnWidth]);
    if (i < 3) {
      for (const x of ["q", "k", "v"]) {
        add(i, `self_attn.${x}_proj.weight`, "BF16", [14, 16]);
        add(i, `self_attn.${x}_conv1d.weight`, "F32", [14, 1, 3]);
      }
      add(i, "self_attn.f_a_proj.weight", "BF16", [7, 16]);
      add(i, "self_attn.f_b_proj.weight", "BF16", [14, 7]);
      add(i, "self_attn.b_proj.weight", "BF16", [2, 16]);
      add(i, "self_attn.A_log", "F32", [7]); // padded to head_dim like the real [128]
      add(i, "self_attn.dt_bias", "F32", [14]);
      add(i, "self_attn.o_norm.weight", "F32", [7]);
    } else {
      add(i, "self_attn.q_a_proj.weight", "BF16", [12, 16]);
      add(i, "self_attn.q_a_layernorm.weight", "BF16", [12]);
      add(i, "self_attn.q_b_proj.weight", "BF16", [24, 12]);
      add(i, "self_attn.kv_a_proj_with_mqa.weight", "BF16", [12, 16]);
      add(i, "self_attn.kv_a_layernorm.weight", "BF16", [10]);
      add(i, "self_attn.kv_b_proj.weight", "BF16", [33, 10]);
    }
    if (i === 0) {
      add(i, "mlp.gate_proj.weight", "BF16", [24, 16]);
      add(i, "mlp.up_proj.weight", "BF16", [24, 16]);
      add(i, "mlp.down_proj.weight", "BF16", [16, 24]);
      continue;
    }
    const m = "block_sparse_moe.";
    add(i, `${m}gate.weight`, "BF16", [4, 16]);
    add(i, `${m}gate.e_score_correction_bias`, "F32", [4]);
    add(i, `${m}routed_expert_down_proj.weight`, "BF16", [12, 16]);
    add(i, `${m}routed_expert_norm.weight`, "BF16", [12]);
    add(i, `${m}routed_expert_up_proj.weight`, "BF16", [16, 12]);
    add(i, `${m}shared_experts.gate_proj.weight`, "BF16", [16, 16]);
    add(i, `${m}shared_experts.up_proj.weight`, "BF16", [16, 16]);
    add(i, `${m}shared_experts.down_proj.weight`, "BF16", [16, 16]);
    for (let e = 0; e < 4; e++) {
      for (const w of ["w1", "w3"]) {
        add(i, `${m}experts.${e}.${w}.weight_packed`, "U8", [8, 6]);
        add(i, `${m}experts.${e}.${w}.weight_scale`, "U8", [8, 3]);
      }
      add(i, `${m}experts.${e}.w2.weight_packed`, "U8", [12, 4]);
      add(i, `${m}experts.${e}.w2.weight_scale`, "U8", [12, 2]);
    }
  }
  return specs;
}

const ELEMENT_BYTES: Record<string, number> = { BF16: 2, F32: 4, U8: 1, F16: 2 };

/** Distinct bytes per tensor, so a wrong offset reads visibly wrong data. */
function fillFor(k: number, spec: Spec): Uint8Array {
  const n = spec.shape.reduce((a, b) => a * b, ELEMENT_BYTES[spec.dtype]);
  return Uint8Array.from({ length: n }, (_, j) => (k * 31 + j * 7 + 1) % 251);
}

/** Renames canonical names into one of the accepted stored spellings. */
type Spelling = "released" | "short-layers" | "flat";
function storedName(canonical: string, spelling: Spelling): string {
  if (spelling === "flat") return canonical;
  if (canonical === "lm_head.weight") return "language_model.lm_head.weight";
  if (spelling === "short-layers" && canonical.startsWith("model.layers.")) {
    return "language_model." + canonical.slice("model.".length);
  }
  return "language_model." + canonical;
}

interface BuildOptions {
  spelling?: Spelling;
  shards?: number;
  index?: boolean;
  extra?: Spec[];
  edit?: (specs: Spec[]) => Spec[];
}

/** Writes config.json and the tiny model's shards into a fresh temp dir. */
async function buildCheckpoint(options: BuildOptions = {}): Promise<{
  dir: string;
  data: Map<string, Uint8Array>;
}> {
  const { spelling = "released", shards = 2, index = true, extra = [] } = options;
  const dir = await Deno.makeTempDir({ prefix: "k3-ckpt-" });
  await Deno.writeTextFile(path.join(dir, "config.json"), JSON.stringify(tinyConfigJson()));
  let specs = tinyTensorSpecs().map((s) => ({ ...s, name: storedName(s.name, spelling) }));
  specs = (options.edit ?? ((s) => s))(specs).concat(extra);
  const data = new Map<string, Uint8Array>();
  const perShard: { name: string; dtype: DType; shape: number[]; data: Uint8Array }[][] = Array
    .from({ length: shards }, () => []);
  specs.forEach((s, k) => {
    const bytes = fillFor(k, s);
    data.set(s.name, bytes);
    perShard[k % shards].push({ ...s, data: bytes });
  });
  const weightMap: Record<string, string> = {};
  for (let k = 0; k < shards; k++) {
    const file = `model-${k + 1}-of-${shards}.safetensors`;
    await writeSafetensors(path.join(dir, file), perShard[k], { format: "pt" });
    for (const t of perShard[k]) weightMap[t.name] = file;
  }
  if (index) {
    await Deno.writeTextFile(
      path.join(dir, INDEX_FILE),
      JSON.stringify({ metadata: {}, weight_map: weightMap }),
    );
  }
  return { dir, data };
}

/** Runs `fn` on a fresh checkpoint and removes it afterwards. */
async function withCheckpoint(
  options: BuildOptions,
  fn: (dir: string, data: Map<string, Uint8Array>) => Promise<void>,
): Promise<void> {
  const { dir, data } = await buildCheckpoint(options);
  try {
    await fn(dir, data);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** A safetensors file from a literal header object and `dataBytes` bytes of data. */
function rawFile(header: unknown, dataBytes: number, lengthOverride?: bigint): Uint8Array {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const bytes = new Uint8Array(8 + json.length + dataBytes);
  new DataView(bytes.buffer).setBigUint64(0, lengthOverride ?? BigInt(json.length), true);
  bytes.set(json, 8);
  return bytes;
}

/** Parses a raw file's header as if it were on disk. */
function parseRaw(bytes: Uint8Array): unknown {
  return parseSafetensorsHeader(bytes, "/x/bad.safetensors", bytes.length);
}

// ---------------------------------------------------------------------------------------
// safetensors writer and parser

Deno.test("buildHeader: 8-byte LE length, JSON padded with spaces, back-to-back offsets", () => {
  const { header, dataOffsets } = buildHeader([
    { name: "a", dtype: "F32", shape: [2, 3], nbytes: 24 },
    { name: "b", dtype: "BF16", shape: [5], nbytes: 10 },
    { name: "c", dtype: "U8", shape: [0, 4], nbytes: 0 },
  ], { format: "pt" });
  const length = Number(new DataView(header.buffer).getBigUint64(0, true));
  assert.equal(header.length, 8 + length);
  assert.equal(length % 8, 0);
  const text = new TextDecoder().decode(header.subarray(8));
  assert.match(text, / *$/);
  assert.deepEqual(JSON.parse(text), {
    __metadata__: { format: "pt" },
    a: { dtype: "F32", shape: [2, 3], data_offsets: [0, 24] },
    b: { dtype: "BF16", shape: [5], data_offsets: [24, 34] },
    c: { dtype: "U8", shape: [0, 4], data_offsets: [34, 34] },
  });
  assert.deepEqual(dataOffsets, [0, 24, 34]);
  assert.throws(() => buildHeader([{ name: "a", dtype: "F32", shape: [2], nbytes: 7 }]), /7/);
});

Deno.test("writeSafetensors round-trips and leaves no temp file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = path.join(dir, "t.safetensors");
    const a = Uint8Array.from({ length: 24 }, (_, i) => i + 1);
    const b = Uint8Array.from({ length: 6 }, (_, i) => 200 + i);
    await writeSafetensors(file, [
      { name: "a", dtype: "F32", shape: [6], data: a },
      { name: "b", dtype: "U8", shape: [2, 3], data: b },
    ]);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), ["t.safetensors"]);
    const bytes = await Deno.readFile(file);
    const h = parseSafetensorsHeader(bytes, file, bytes.length);
    assert.equal(bytes.length, h.dataStart + 30);
    const [ea, eb] = h.entries;
    assert.deepEqual(bytes.subarray(h.dataStart + ea.begin, h.dataStart + ea.end), a);
    assert.deepEqual(bytes.subarray(h.dataStart + eb.begin, h.dataStart + eb.end), b);
    assert.deepEqual(eb.shape, [2, 3]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("header parser refuses each kind of malformed header, naming file and tensor", () => {
  const ok = { dtype: "F32", shape: [2], data_offsets: [0, 8] };
  assertBadInput(
    () => parseRaw(rawFile({ a: ok, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } }, 12)),
    /bad\.safetensors: tensors a \[0, 8\) and b \[4, 12\) overlap/,
  );
  assertBadInput(
    () => parseRaw(rawFile({ a: ok }, 8, 1n << 40n)),
    /bad\.safetensors: safetensors header length \d+ exceeds the \d+-byte limit/,
  );
  assertBadInput(
    () => parseRaw(rawFile({ a: ok }, 8, 5000n)),
    /header length 5000 runs past the end of the file/,
  );
  assertBadInput(() => parseRaw(new Uint8Array(5)), /shorter than the 8-byte header length/);
  assertBadInput(
    () => parseRaw(rawFile({ a: { ...ok, dtype: "F4" } }, 8)),
    /bad\.safetensors: tensor a: unknown dtype "F4"/,
  );
  assertBadInput(
    () => parseRaw(rawFile({ a: { ...ok, shape: [3] } }, 12)),
    /tensor a: shape \[3\] x F32 is 12 bytes but data_offsets span 8 bytes/,
  );
  assertBadInput(
    () => parseRaw(rawFile({ a: { ...ok, shape: [-2] } }, 8)),
    /tensor a: shape must be a list of non-negative integers/,
  );
  assertBadInput(
    () => parseRaw(rawFile({ a: { ...ok, data_offsets: [8, 0] } }, 8)),
    /tensor a: data_offsets end 0 is before begin 8/,
  );
  assertBadInput(() => parseRaw(rawFile([1, 2], 0)), /header must be a JSON object/);
  const notJson = rawFile({ a: ok }, 8);
  notJson[8] = 0x7b + 1; // "{" -> "|"
  assertBadInput(() => parseRaw(notJson), /header is not valid JSON/);
  assertBadInput(
    () => parseRaw(rawFile({ __metadata__: { n: 1 }, a: ok }, 8)),
    /__metadata__ must be an object of strings/,
  );
  // A short data section is a truncated file, with both sizes named.
  const short = rawFile({ a: ok }, 4);
  assertBadInput(
    () => parseRaw(short),
    new RegExp(
      `truncated: the file is ${short.length} bytes but its header needs ${short.length + 4} bytes`,
    ),
  );
});

// ---------------------------------------------------------------------------------------
// shards and names

Deno.test("canonicalName: prefixes normalised, vision/rotary/MTP skipped", () => {
  const cases: [string, string | null][] = [
    ["language_model.model.layers.2.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"],
    ["language_model.layers.2.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"],
    ["model.layers.2.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"],
    ["language_model.model.embed_tokens.weight", "model.embed_tokens.weight"],
    ["language_model.lm_head.weight", "lm_head.weight"],
    ["lm_head.weight", "lm_head.weight"],
    ["vision_tower.blocks.0.wqkv.weight", null],
    ["mm_projector.proj.0.weight", null],
    ["language_model.model.layers.0.self_attn.rotary_emb.inv_freq", null],
    ["language_model.model.layers.4.input_layernorm.weight", null],
    ["model.layers.3.input_layernorm.weight", "model.layers.3.input_layernorm.weight"],
  ];
  for (const [stored, canonical] of cases) assert.equal(canonicalName(stored, 4), canonical);
});

Deno.test("openCheckpoint binds every tensor at the right offset (released names, index)", async () => {
  await withCheckpoint({}, async (dir, data) => {
    const ckpt = await openCheckpoint(dir);
    assert.equal(ckpt.shards.length, 2);
    assert.equal(ckpt.tensorCount, tinyTensorSpecs().length);
    assert.equal(ckpt.config.numLayers, 4);
    const { refs } = ckpt;
    assert.deepEqual(refs.layers.map((l) => l.kind), ["kda", "kda", "kda", "mla"]);
    assert.deepEqual(refs.layers.map((l) => !!l.dense), [true, false, false, false]);
    assert.ok(refs.layers[0].kda && !refs.layers[0].mla && !refs.layers[0].moe);
    assert.ok(refs.layers[3].mla && !refs.layers[3].kda);
    const moe = refs.layers[2].moe!;
    assert.equal(moe.experts.count, 4);
    assert.deepEqual([moe.experts.get(3).w2.rows, moe.experts.get(3).w2.cols], [12, 8]);
    assert.deepEqual([moe.experts.get(3).w1.rows, moe.experts.get(3).w1.cols], [8, 12]);
    // Every bound ref points at exactly the bytes written under its stored name.
    const samples = [
      refs.embed,
      refs.lmHead,
      refs.outputRes.proj,
      refs.layers[1].kda!.aLog,
      refs.layers[3].mla!.kvB,
      moe.experts.get(3).w2.scale,
      moe.routerBias,
    ];
    for (const ref of samples) {
      const file = await Deno.readFile(ref.file);
      const expected = data.get(ref.name)!;
      assert.equal(ref.nbytes, expected.length);
      assert.deepEqual(file.subarray(ref.offset, ref.offset + ref.nbytes), expected, ref.name);
    }
    assert.equal(refs.embed.name, "language_model.model.embed_tokens.weight");
  });
});

Deno.test("prefix variants all open: language_model.layers. and flat model. (scanned)", async () => {
  for (const spelling of ["short-layers", "flat"] as const) {
    await withCheckpoint({ spelling, index: false, shards: 3 }, async (dir) => {
      const ckpt = await openCheckpoint(dir);
      assert.equal(ckpt.shards.length, 3);
      assert.equal(ckpt.tensorCount, tinyTensorSpecs().length);
      const name = ckpt.refs.layers[3].mla!.qB.name;
      assert.equal(
        name,
        spelling === "flat"
          ? "model.layers.3.self_attn.q_b_proj.weight"
          : "language_model.layers.3.self_attn.q_b_proj.weight",
      );
    });
  }
});

Deno.test("vision, projector, rotary and MTP-layer tensors are skipped", async () => {
  const extra: Spec[] = [
    { name: "vision_tower.patch_embed.weight", dtype: "BF16", shape: [3, 2] },
    { name: "mm_projector.linear_1.weight", dtype: "BF16", shape: [2, 2] },
    {
      name: "language_model.model.layers.1.self_attn.rotary_emb.inv_freq",
      dtype: "F32",
      shape: [2],
    },
    { name: "language_model.model.layers.4.input_layernorm.weight", dtype: "BF16", shape: [16] },
  ];
  await withCheckpoint({ extra }, async (dir) => {
    const ckpt = await openCheckpoint(dir);
    assert.equal(ckpt.tensorCount, tinyTensorSpecs().length);
    const set = await readShards(dir, ckpt.config);
    const stored = [...set.tensors.values()].map((t) => t.name);
    for (const e of extra) assert.ok(!stored.includes(e.name), e.name);
  });
});

Deno.test("a tensor stored under two prefixes is refused", async () => {
  const extra: Spec[] = [{
    name: "language_model.layers.0.input_layernorm.weight",
    dtype: "BF16",
    shape: [16],
  }];
  await withCheckpoint({ extra, index: false }, async (dir) => {
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /tensor model\.layers\.0\.input_layernorm\.weight appears twice/,
      /language_model\.model\.layers\.0\.input_layernorm\.weight/,
      /language_model\.layers\.0\.input_layernorm\.weight/,
    );
  });
});

Deno.test("a truncated shard is refused with its size and the size needed", async () => {
  await withCheckpoint({}, async (dir) => {
    const shard = path.join(dir, "model-2-of-2.safetensors");
    const size = (await Deno.stat(shard)).size;
    await Deno.truncate(shard, size - 3);
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      new RegExp(
        `model-2-of-2\\.safetensors: truncated: the file is ${size - 3} bytes but its header ` +
          `needs ${size} bytes`,
      ),
    );
  });
});

Deno.test("index problems: missing shard, tensor in another shard, bad weight_map", async () => {
  await withCheckpoint({}, async (dir) => {
    await Deno.remove(path.join(dir, "model-1-of-2.safetensors"));
    await assertRejectsBadInput(
      () => readShards(dir, TINY),
      /model\.safetensors\.index\.json: references shard model-1-of-2\.safetensors, which does not exist/,
    );
  });
  await withCheckpoint({}, async (dir) => {
    const indexPath = path.join(dir, INDEX_FILE);
    const index = JSON.parse(await Deno.readTextFile(indexPath));
    // Tensors are dealt round-robin, so lm_head (5th) is in shard 1.
    index.weight_map["language_model.lm_head.weight"] = "model-2-of-2.safetensors";
    await Deno.writeTextFile(indexPath, JSON.stringify(index));
    await assertRejectsBadInput(
      () => readShards(dir, TINY),
      /index\.json: tensor language_model\.lm_head\.weight is listed in model-2-of-2\.safetensors, but it is in model-1-of-2\.safetensors/,
    );
    index.weight_map["language_model.nothing"] = "model-1-of-2.safetensors";
    index.weight_map["language_model.lm_head.weight"] = "model-1-of-2.safetensors";
    await Deno.writeTextFile(indexPath, JSON.stringify(index));
    await assertRejectsBadInput(
      () => readShards(dir, TINY),
      /tensor language_model\.nothing is listed in model-1-of-2\.safetensors, but no shard contains it/,
    );
    await Deno.writeTextFile(indexPath, JSON.stringify({ weight_map: [] }));
    await assertRejectsBadInput(() => readShards(dir, TINY), /"weight_map" must be an object/);
    await Deno.writeTextFile(indexPath, JSON.stringify({ weight_map: { x: "gone.safetensors" } }));
    await assertRejectsBadInput(() => readShards(dir, TINY), /references shard gone\.safetensors/);
  });
});

// ---------------------------------------------------------------------------------------
// binding

/** Replaces one stored tensor's dtype/shape. */
function retype(stored: string, dtype: DType, shape: number[]): (s: Spec[]) => Spec[] {
  return (specs) => specs.map((s) => s.name === stored ? { ...s, dtype, shape } : s);
}

Deno.test("a wrong shape and a wrong dtype are both named with expected and found", async () => {
  const wrongShape = retype("language_model.model.layers.3.self_attn.kv_b_proj.weight", "BF16", [
    30,
    10,
  ]);
  const wrongDtype = retype("language_model.model.layers.1.self_attn.q_conv1d.weight", "F16", [
    14,
    1,
    3,
  ]);
  await withCheckpoint({ edit: (s) => wrongDtype(wrongShape(s)) }, async (dir) => {
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /checkpoint does not match .*config\.json: 2 tensor problem\(s\)/,
      /model\.layers\.3\.self_attn\.kv_b_proj\.weight \(language_model\.model\.layers\.3\.self_attn\.kv_b_proj\.weight in .*model-\d-of-2\.safetensors\): expected BF16 \[33, 10\], found BF16 \[30, 10\]/,
      /model\.layers\.1\.self_attn\.q_conv1d\.weight .*: expected F32 or BF16 \[14, 1, 3\] or \[14, 3\], found F16 \[14, 1, 3\]/,
    );
  });
});

Deno.test("A_log accepts [n >= heads] and [1,1,heads,1]; router bias accepts BF16", async () => {
  const edit = (s: Spec[]) =>
    retype("language_model.model.layers.0.self_attn.A_log", "F32", [1, 1, 2, 1])(
      retype("language_model.model.layers.1.self_attn.A_log", "F32", [2])(
        retype(
          "language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
          "BF16",
          [4],
        )(s),
      ),
    );
  await withCheckpoint({ edit }, async (dir) => {
    const ckpt = await openCheckpoint(dir);
    assert.deepEqual(ckpt.refs.layers[0].kda!.aLog.shape, [1, 1, 2, 1]);
    assert.equal(ckpt.refs.layers[1].moe!.routerBias.dtype, "BF16");
  });
  await withCheckpoint({
    edit: retype("language_model.model.layers.2.self_attn.A_log", "F32", [1]),
  }, async (dir) => {
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /layers\.2\.self_attn\.A_log .*expected F32 or BF16 \[n >= 2\] or \[1, 1, 2, 1\], found F32 \[1\]/,
    );
  });
});

Deno.test("missing tensors are listed (capped at 20 plus a count)", async () => {
  const drop = (s: Spec[]) =>
    s.filter((t) => !/experts\.\d+\.w2/.test(t.name) && t.name !== "language_model.lm_head.weight");
  await withCheckpoint({ edit: drop }, async (dir) => {
    // 3 MoE layers x 4 experts x 2 tensors + lm_head = 25 problems.
    const e = await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /25 tensor problem\(s\)/,
      /lm_head\.weight: missing \(expected BF16 \[40, 16\]\)/,
      /model\.layers\.1\.block_sparse_moe\.experts\.0\.w2\.weight_packed: missing \(expected U8 \[12, 4\]\)/,
      /\.\.\. and 5 more/,
    );
    assert.equal(e.message.split("\n").length, 1 + 20 + 1);
  });
});

Deno.test("layers option binds only the first N layers", async () => {
  const dropLast = (s: Spec[]) => s.filter((t) => !t.name.includes("layers.3."));
  await withCheckpoint({ edit: dropLast }, async (dir) => {
    await assertRejectsBadInput(() => openCheckpoint(dir), /model\.layers\.3\..*missing/);
    const ckpt = await openCheckpoint(dir, { layers: 3 });
    assert.equal(ckpt.refs.layers.length, 3);
    const set = await readShards(dir, ckpt.config);
    assert.throws(
      () => bindModel(ckpt.config, set, { layers: 5 }),
      /layers must be an integer in 1\.\.4/,
    );
  });
});

Deno.test("bindModel reads sizes from the config, not K3's numbers", async () => {
  // The same tensors under a config with a different hidden size must all mismatch.
  const json = tinyConfigJson();
  json.text_config.hidden_size = 18;
  const config = parseConfig(json, "/other/config.json");
  await withCheckpoint({}, async (dir) => {
    const set = await readShards(dir, TINY);
    assertBadInput(
      () => bindModel(config, set),
      /model\.embed_tokens\.weight .*expected BF16 \[40, 18\], found BF16 \[40, 16\]/,
    );
  });
});

Deno.test("a missing directory or config.json is a clear error", async () => {
  await assertRejectsBadInput(
    () => openCheckpoint("/nonexistent/k3-ckpt"),
    /\/nonexistent\/k3-ckpt: checkpoint directory does not exist/,
  );
  const dir = await Deno.makeTempDir();
  try {
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /no config\.json in the checkpoint directory/,
    );
    await Deno.writeTextFile(path.join(dir, "config.json"), JSON.stringify(tinyConfigJson()));
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /no model\.safetensors\.index\.json and no \*\.safetensors files/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// ---------------------------------------------------------------------------------------
// Files the checkpoint may not use: outside the model directory, named twice, or not regular
// files (a FIFO would hang the read, a directory has no bytes)

/** Rewrites the index so every tensor of `shard` is listed under `name` instead. */
async function relist(dir: string, shard: string, name: string): Promise<void> {
  const indexPath = path.join(dir, INDEX_FILE);
  const index = JSON.parse(await Deno.readTextFile(indexPath));
  for (const [k, v] of Object.entries(index.weight_map)) {
    if (v === shard) index.weight_map[k] = name;
  }
  await Deno.writeTextFile(indexPath, JSON.stringify(index));
}

/** Runs `k3 run DIR --ids 1` in a child with a time limit: nothing may hang. */
async function runWithTimeout(dir: string): Promise<{ code: number; stderr: string }> {
  const root = path.resolve(import.meta.dirname!, "..", "..");
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--quiet", "-A", path.join(root, "main.ts"), "run", dir, "--ids", "1"],
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

const SHARD1 = "model-1-of-2.safetensors";

Deno.test("the index may not name files outside the model directory", async () => {
  const elsewhere = await Deno.makeTempDir({ prefix: "k3-elsewhere-" });
  try {
    await withCheckpoint({}, async (dir) => {
      await Deno.copyFile(path.join(dir, SHARD1), path.join(elsewhere, "x.safetensors"));
      const outside = path.relative(dir, path.join(elsewhere, "x.safetensors"));
      for (
        const name of [outside, path.join(elsewhere, "x.safetensors"), "a/../../x", "/etc/passwd"]
      ) {
        await relist(dir, SHARD1, name);
        await assertRejectsBadInput(
          () => openCheckpoint(dir),
          /model\.safetensors\.index\.json: weight_map\[".+"\] names ".+", which is not a file inside the model directory/,
        );
        await relist(dir, name, SHARD1);
      }
      // A symlink inside the directory that leads out of it.
      await Deno.remove(path.join(dir, SHARD1));
      await Deno.symlink(path.join(elsewhere, "x.safetensors"), path.join(dir, SHARD1));
      await assertRejectsBadInput(
        () => openCheckpoint(dir),
        /model-1-of-2\.safetensors: shard resolves to .*k3-elsewhere-.*x\.safetensors, outside the model directory/,
      );
      // The same without an index (shards found by scanning).
      await Deno.remove(path.join(dir, INDEX_FILE));
      await assertRejectsBadInput(() => openCheckpoint(dir), /outside the model directory/);
    });
  } finally {
    await Deno.remove(elsewhere, { recursive: true });
  }
});

Deno.test("an index entry of any JSON type but a shard name is bad input naming the field", async () => {
  await withCheckpoint({}, async (dir) => {
    const indexPath = path.join(dir, INDEX_FILE);
    const index = JSON.parse(await Deno.readTextFile(indexPath));
    const names = Object.keys(index.weight_map);
    const cases: [unknown, RegExp][] = [
      ["", /names "", which is not a file inside the model directory/],
      [".", /names "\.", which is not a file inside the model directory/],
      ["a/..", /names "a\/\.\.", which is not a file inside the model directory/],
      [null, /must be a shard file name .*found null$/],
      [0, /must be a shard file name .*found 0$/],
      [true, /must be a shard file name .*found true$/],
      [[], /must be a shard file name .*found \[\]$/],
      [{}, /must be a shard file name .*found \{\}$/],
    ];
    // First, in the middle and last: the scanner compares each name with the one before it.
    for (const at of [0, Math.floor(names.length / 2), names.length - 1]) {
      for (const [value, pattern] of cases) {
        const map = { ...index.weight_map, [names[at]]: value };
        await Deno.writeTextFile(indexPath, JSON.stringify({ ...index, weight_map: map }));
        // Expert tensors are named canonically (without the stored prefix).
        const field = names[at].replace(/^language_model\./, "").replace(/[.[\]]/g, "\\$&");
        await assertRejectsBadInput(
          () => openCheckpoint(dir),
          new RegExp(`index\\.json: weight_map\\["(language_model\\.)?${field}"\\]`),
          pattern,
        );
      }
    }
  });
});

Deno.test("a Hugging Face cache snapshot (symlinks into ../../blobs) opens", async () => {
  await withCheckpoint({}, async (dir) => {
    const repo = path.join(dir, "models--moonshotai--Kimi-K3");
    const snapshot = path.join(repo, "snapshots", "f831ab6");
    await Deno.mkdir(path.join(repo, "blobs"), { recursive: true });
    await Deno.mkdir(snapshot, { recursive: true });
    for (const e of [...Deno.readDirSync(dir)].filter((e) => e.isFile)) {
      const blob = path.join(repo, "blobs", `sha-${e.name.length}-${e.name}`);
      await Deno.rename(path.join(dir, e.name), blob);
      await Deno.symlink(path.relative(snapshot, blob), path.join(snapshot, e.name));
    }
    const ckpt = await openCheckpoint(snapshot);
    assert.equal(ckpt.tensorCount, tinyTensorSpecs().length);
  });
});

/** A safetensors file whose JSON header is given as text. */
function rawText(headerJson: string, dataBytes: number): Uint8Array {
  return rawFileFromText(headerJson, dataBytes);
}

function rawFileFromText(json: string, dataBytes: number): Uint8Array {
  const text = new TextEncoder().encode(json);
  const bytes = new Uint8Array(8 + text.length + dataBytes);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(text.length), true);
  bytes.set(text, 8);
  return bytes;
}

Deno.test("duplicate names in one header or in the index are refused", async () => {
  const a = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}';
  assertBadInput(
    () => parseRaw(rawText(`{${a},${a}}`, 8)),
    /bad\.safetensors: tensor a appears twice in the safetensors header/,
  );
  assertBadInput(
    () =>
      parseRaw(rawText('{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8)),
    /tensor a: the field "dtype" appears twice/,
  );
  // In a checkpoint: a routed expert's tensor and a trunk tensor, each listed twice in its shard.
  for (const dup of ["block_sparse_moe.experts.1.w3.weight_scale", "self_attn.o_proj.weight"]) {
    await withCheckpoint({}, async (dir) => {
      let victim = "";
      for (const shard of [SHARD1, "model-2-of-2.safetensors"]) {
        const file = path.join(dir, shard);
        const bytes = await Deno.readFile(file);
        const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
        const json = new TextDecoder().decode(bytes.subarray(8, 8 + n)).trimEnd();
        const entry = new RegExp(`"[^"]*layers\\.2\\.${dup.replaceAll(".", "\\.")}":\\{[^}]*\\}`)
          .exec(json);
        if (!entry) continue;
        victim = shard;
        const twice = json.slice(0, -1) + "," + entry[0] + "}";
        await Deno.writeFile(file, rawFileFromText(twice, bytes.length - 8 - n));
      }
      assert.ok(victim !== "", dup);
      await assertRejectsBadInput(
        () => openCheckpoint(dir),
        new RegExp(`${victim}: tensor .*layers\\.2\\..* appears twice in the safetensors header`),
      );
    });
  }
  await withCheckpoint({}, async (dir) => {
    const indexPath = path.join(dir, INDEX_FILE);
    const text = await Deno.readTextFile(indexPath);
    const key = '"language_model.lm_head.weight":"model-1-of-2.safetensors"';
    assert.ok(text.includes(key));
    await Deno.writeTextFile(indexPath, text.replace(key, `${key},${key}`));
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /index\.json: weight_map lists tensor language_model\.lm_head\.weight twice/,
    );
  });
});

Deno.test("non-regular shards, index and config are named as what they are", async () => {
  await withCheckpoint({}, async (dir) => {
    const shard = path.join(dir, SHARD1);
    const saved = await Deno.readFile(shard);
    const restore = async () => {
      await Deno.remove(shard, { recursive: true });
      await Deno.writeFile(shard, saved);
    };
    await Deno.remove(shard);
    await Deno.mkdir(shard);
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /model-1-of-2\.safetensors: shard is a directory, not a regular file/,
    );
    await restore();
    await Deno.remove(shard);
    await Deno.symlink("/dev/zero", shard);
    await assertRejectsBadInput(() => openCheckpoint(dir), /shard is a character device/);
    await Deno.remove(shard);
    await Deno.symlink("loop-b", shard);
    await Deno.symlink(SHARD1, path.join(dir, "loop-b"));
    await assertRejectsBadInput(() => openCheckpoint(dir), /shard is a symlink loop/);
    await Deno.remove(path.join(dir, "loop-b"));
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /shard is a symlink to loop-b, which does not exist/,
    );
    await Deno.remove(shard);
    await Deno.writeFile(shard, saved);
    // A FIFO is never opened: a child process must exit 2 at once, not hang.
    await Deno.remove(shard);
    const mkfifo = await new Deno.Command("mkfifo", { args: [shard] }).output();
    assert.equal(mkfifo.code, 0);
    let r = await runWithTimeout(dir);
    assert.equal(r.code, 2, r.stderr);
    assert.match(
      r.stderr,
      /model-1-of-2\.safetensors: shard is a FIFO \(named pipe\), not a regular file/,
    );
    await Deno.remove(path.join(dir, INDEX_FILE));
    r = await runWithTimeout(dir);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /shard is a FIFO/);
    await Deno.remove(shard);
    await Deno.writeFile(shard, saved);
    // The index and config.json.
    await Deno.mkdir(path.join(dir, INDEX_FILE));
    await assertRejectsBadInput(() => openCheckpoint(dir), /safetensors index is a directory/);
    await Deno.remove(path.join(dir, INDEX_FILE));
    const config = path.join(dir, "config.json");
    await Deno.rename(config, config + ".saved");
    await new Deno.Command("mkfifo", { args: [config] }).output();
    r = await runWithTimeout(dir);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /config\.json: config\.json is a FIFO/);
    await Deno.remove(config);
    // The directory itself a symlink loop.
    const loop = path.join(dir, "self");
    await Deno.symlink(loop, loop);
    await assertRejectsBadInput(
      () => openCheckpoint(loop),
      /checkpoint directory is a symlink loop/,
    );
  });
});

Deno.test("routed-expert tensors are checked like any other (compact table)", async () => {
  const x = "language_model.model.layers.2.block_sparse_moe.experts.3.";
  const edit = (s: Spec[]) =>
    retype(`${x}w1.weight_packed`, "U8", [8, 5])(
      retype(`${x}w2.weight_scale`, "BF16", [12, 2])(
        retype(`${x}w3.weight_scale`, "U8", [8, 3, 1])(s),
      ),
    );
  await withCheckpoint({ edit }, async (dir) => {
    await assertRejectsBadInput(
      () => openCheckpoint(dir),
      /3 tensor problem\(s\)/,
      /model\.layers\.2\.block_sparse_moe\.experts\.3\.w1\.weight_packed \(language_model\.model\.layers\.2\.block_sparse_moe\.experts\.3\.w1\.weight_packed in .*\): expected U8 \[8, 6\], found U8 \[8, 5\]/,
      /experts\.3\.w2\.weight_scale .*: expected U8 \[12, 2\], found BF16 \[12, 2\]/,
      /experts\.3\.w3\.weight_scale .*: expected U8 \[8, 3\], found U8 \[8, 3, 1\]/,
    );
  });
  // Refs come from the table on demand, with the stored name, offset and size.
  await withCheckpoint({ spelling: "short-layers" }, async (dir, data) => {
    const experts = (await openCheckpoint(dir)).refs.layers[3].moe!.experts;
    assert.equal(experts.count, 4);
    const w3 = experts.get(2).w3;
    assert.deepEqual([w3.rows, w3.cols], [8, 12]);
    assert.equal(
      w3.scale.name,
      "language_model.layers.3.block_sparse_moe.experts.2.w3.weight_scale",
    );
    assert.deepEqual(w3.scale.shape, [8, 3]);
    const file = await Deno.readFile(w3.scale.file);
    assert.deepEqual(
      file.subarray(w3.scale.offset, w3.scale.offset + w3.scale.nbytes),
      data.get(w3.scale.name),
    );
    assert.throws(() => experts.get(4), RangeError);
    assert.throws(() => experts.get(-1), RangeError);
  });
});

Deno.test("a config asking for more experts than the files hold is refused before allocating", async () => {
  for (const index of [true, false]) {
    await withCheckpoint({ index }, async (dir) => {
      const json = tinyConfigJson();
      // Within config.json's own bound (65536, lib/checkpoint/config.ts), so the files are what refuse it.
      json.text_config.num_experts = 60_000;
      await Deno.writeTextFile(path.join(dir, "config.json"), JSON.stringify(json));
      await assertRejectsBadInput(
        () => openCheckpoint(dir),
        /config\.json asks for 1080000 routed-expert tensors .* at most \d+: config\.json does not belong to this checkpoint/,
      );
    });
  }
});
