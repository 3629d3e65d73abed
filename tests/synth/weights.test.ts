/**
 * make-tiny --weights: the default stays the uniform generator byte for byte (hashes pinned
 * here), and `normal` draws BF16 matrices N(0, 1/fan-in) and MXFP4 experts quantized from
 * such weights, both checked from the files against a plain decoder written here.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { makeTinyCommand } from "../../lib/cli/make_tiny.ts";
import { unitTensors } from "../../lib/synth/full.ts";
import { fullShape } from "../../lib/synth/full.ts";
import { fillNormal, streamRng } from "../../lib/synth/numerics.ts";
import { makeTiny, type TinyOptions } from "../../lib/synth/tiny.ts";
import { decodeFloatTensor, readShard, type StoredTensor } from "../reference/safetensors.ts";

/** SHA-256 of every file `makeTiny(dir, { seed: 0 })` wrote before `--weights` existed. */
const UNIFORM_SEED0: Record<string, string> = {
  "config.json": "7bde9dad5f4cdbedcdbac176f51458eb1ceccf8f2a66d83379ca5eca252e7d82",
  "generation_config.json": "fb9af7312e5de83f19a03a215d90432f1ce0ded9745ddba3dbcffc25cd37811b",
  "model-00001-of-00004.safetensors":
    "b5be6e15465606aabe257742bcc79ab0a2d46dfe5556673f720b4c03b5f956b8",
  "model-00002-of-00004.safetensors":
    "509f5587acc2c4b073ab29cd854123e2f434afb5217df16db361605e1a02a450",
  "model-00003-of-00004.safetensors":
    "52a8eb05c1b3ac16cf5e70f5aa8aec5caee1bfadf893ab7f6e8a1a2a916b4b3a",
  "model-00004-of-00004.safetensors":
    "16c33858b916819731c1b2fb0a5232c8e6060576a68975f6dc0c3ac1ba1d52bc",
  "model.safetensors.index.json":
    "c6df045b8655afd318c4b07c804902fbddc561a99574a2e4489bb83c56e72405",
  "tiktoken.model": "5cd4382391a1d6bdc00a2df483ee334df4bbb3cb469ae02e9bad1ca26c45f279",
  "tokenizer_config.json": "e2ca30d9dc7991b7c4ae2bee786dbf18bf0ac3efd99c8342393ccab4e8c873ab",
};

async function withCheckpoint(
  options: TinyOptions,
  body: (dir: string) => void | Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "k3-weights-" });
  try {
    await makeTiny(dir, options);
    await body(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function hashes(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const e of [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name))) {
    const digest = await crypto.subtle.digest("SHA-256", await Deno.readFile(join(dir, e.name)));
    out[e.name] = Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0"))
      .join("");
  }
  return out;
}

async function readAll(dir: string): Promise<Map<string, StoredTensor>> {
  const all = new Map<string, StoredTensor>();
  for (const e of Deno.readDirSync(dir)) {
    if (!e.name.endsWith(".safetensors")) continue;
    for (const t of await readShard(join(dir, e.name))) all.set(t.name, t);
  }
  return all;
}

/** Mean, standard deviation and excess kurtosis (0 for a normal, -1.2 for a uniform). */
function moments(xs: ArrayLike<number>): { mean: number; std: number; kurtosis: number } {
  let m = 0;
  for (let i = 0; i < xs.length; i++) m += xs[i];
  m /= xs.length;
  let m2 = 0, m4 = 0;
  for (let i = 0; i < xs.length; i++) {
    const d = (xs[i] - m) ** 2;
    m2 += d;
    m4 += d * d;
  }
  m2 /= xs.length;
  m4 /= xs.length;
  return { mean: m, std: Math.sqrt(m2), kurtosis: m4 / (m2 * m2) - 3 };
}

const E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

Deno.test("make-tiny: the default and --weights uniform write the same bytes as before", async () => {
  await withCheckpoint({ seed: 0 }, async (dir) => {
    assert.deepEqual(await hashes(dir), UNIFORM_SEED0);
  });
  await withCheckpoint({ seed: 0, weights: "uniform" }, async (dir) => {
    assert.deepEqual(await hashes(dir), UNIFORM_SEED0);
  });
});

Deno.test("make-tiny --weights normal: BF16 matrices N(0, 1/fan-in), norms unchanged", async () => {
  await withCheckpoint({ seed: 4, weights: "normal" }, async (dir) => {
    const all = await readAll(dir);
    let matrices = 0;
    for (const t of all.values()) {
      if (t.dtype !== "BF16" || t.shape.length !== 2) continue;
      const values = decodeFloatTensor(t);
      const isEmbed = t.name.endsWith("embed_tokens.weight");
      const want = isEmbed ? 1 : 1 / Math.sqrt(t.shape[1]);
      const m = moments(values);
      // Sampling error of the std is about 1/sqrt(2n): 2% at the smallest matrix here.
      const tol = 5 / Math.sqrt(2 * values.length) + 0.004;
      assert.ok(Math.abs(m.std / want - 1) < tol, `${t.name}: std ${m.std} vs ${want}`);
      assert.ok(Math.abs(m.mean) < 6 * want / Math.sqrt(values.length), `${t.name}: mean`);
      if (values.length >= 20000) {
        assert.ok(Math.abs(m.kurtosis) < 0.2, `${t.name}: excess kurtosis ${m.kurtosis}`);
      }
      matrices++;
    }
    assert.ok(matrices > 40, `BF16 matrices checked: ${matrices}`);
    // Norm gains are drawn as before (uniform around 1).
    const gain = decodeFloatTensor(all.get("language_model.model.norm.weight")!);
    assert.ok(Math.abs(moments(gain).mean - 1) < 0.05, "norm gains stay near 1");
  });
});

Deno.test("make-tiny --weights normal: MXFP4 experts decode back near their normal source", async () => {
  const seed = 9, opts: TinyOptions = { seed, weights: "normal", layers: 2, experts: 3 };
  await withCheckpoint(opts, async (dir) => {
    const all = await readAll(dir);
    let checked = 0;
    for (const t of all.values()) {
      if (!t.name.endsWith(".weight_packed")) continue;
      const source = t.name.replace(/\.weight_packed$/, "");
      const scale = all.get(`${source}.weight_scale`)!;
      const rows = t.shape[0], cols = 2 * t.shape[1], groups = scale.shape[1];
      const group = cols / groups;
      // The source weights, drawn again from the matrix's own stream.
      const want = new Float32Array(rows * cols);
      fillNormal(
        streamRng(seed, source.replace(/^language_model\./, "")),
        want,
        1 / Math.sqrt(cols),
      );
      let err2 = 0, src2 = 0;
      for (let g = 0; g < rows * groups; g++) {
        let maxAbs = 0;
        for (let k = 0; k < group; k++) maxAbs = Math.max(maxAbs, Math.abs(want[g * group + k]));
        const s = scale.bytes[g];
        assert.equal(s, 127 + Math.ceil(Math.log2(maxAbs / 6)), `${source} group ${g} scale`);
        const unit = 2 ** (s - 127);
        for (let k = 0; k < group; k++) {
          const i = g * group + k;
          const byte = t.bytes[i >> 1], code = i % 2 === 0 ? byte & 15 : byte >> 4;
          const got = (code & 8 ? -1 : 1) * E2M1[code & 7] * unit;
          // Nearest rounding: within half the widest gap of the E2M1 grid (4 -> 6).
          assert.ok(Math.abs(got - want[i]) <= unit, `${source}[${i}]: ${got} vs ${want[i]}`);
          // No value rounds to a magnitude farther than its nearest one.
          const a = Math.abs(want[i]) / unit;
          const best = Math.min(...E2M1.map((m) => Math.abs(m - a)));
          assert.ok(Math.abs(Math.abs(got) / unit - a) <= best + 1e-9, `${source}[${i}] nearest`);
          err2 += (got - want[i]) ** 2;
          src2 += want[i] ** 2;
        }
      }
      const rel = Math.sqrt(err2 / src2);
      assert.ok(rel > 0.03 && rel < 0.2, `${source}: relative RMS error ${rel}`);
      const std = Math.sqrt(src2 / want.length) * Math.sqrt(cols);
      assert.ok(Math.abs(std - 1) < 0.05, `${source}: source std * sqrt(cols) ${std}`);
      checked++;
    }
    assert.equal(checked, 1 * 3 * 3, "every expert matrix of the one MoE layer");
  });
});

Deno.test("make-tiny --weights normal --shape full: data tensors normal, holes stay holes", () => {
  const s = fullShape(2);
  const layer = unitTensors(s, { kind: "trunk", layer: 1 }, "sparse", "uniform", "normal");
  const expert = unitTensors(
    s,
    { kind: "expert", layer: 1, expert: 0 },
    "sparse",
    "uniform",
    "normal",
  );
  const embed = unitTensors(s, { kind: "embed" }, "sparse", "uniform", "normal");
  const head = unitTensors(s, { kind: "head" }, "sparse", "uniform", "normal");
  for (const t of [...layer, ...expert, ...embed, ...head]) {
    const data = /embed_tokens|lm_head|gate\.weight$/.test(t.name);
    const kind = data ? "normal" : t.name.endsWith("norm.weight") ? "const" : "hole";
    if (t.name.endsWith("e_score_correction_bias")) continue; // F32 noise, as before
    assert.equal(t.init.kind, kind, t.name);
  }
});

Deno.test("make-tiny --weights: a bad value or --data none is refused with exit 2", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-weights-" });
  const quiet = { error: console.error, log: console.log };
  const said: string[] = [];
  console.error = (m: string) => said.push(m);
  console.log = () => {};
  try {
    assert.equal(await makeTinyCommand([dir, "--weights", "gaussian"]), 2);
    assert.match(said.join("\n"), /--weights must be "uniform" or "normal", got "gaussian"/);
    const none = [dir, "--shape", "full", "--data", "none", "--weights", "normal"];
    assert.equal(await makeTinyCommand(none), 2);
    assert.match(said.join("\n"), /--weights needs tensor data/);
  } finally {
    Object.assign(console, quiet);
    await Deno.remove(dir, { recursive: true });
  }
});
