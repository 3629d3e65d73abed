/**
 * The CLI contract: flags, --out and --dump-logits files, exit codes, and refusal of bad
 * checkpoints with a message that names the problem. Also the public API, imported exactly
 * as a user's script would.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { openModel } from "../../mod.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const PROMPT = "3,14,159,265";

Deno.test("k3 --help and --version", async () => {
  const help = await runK3(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /exit codes/);
  const version = await runK3(["--version"]);
  assert.equal(version.code, 0);
  assert.match(version.stdout, /^k3 \d+\.\d+\.\d+/);
  const unknown = await runK3(["run", "--bogus"]);
  assert.equal(unknown.code, 2);
});

Deno.test("run --out and --dump-logits write what they promise", async () => {
  const dir = await tinyModel({ seed: 11 });
  const out = tempDir();
  const json = path.join(out, "run.json"), bin = path.join(out, "logits.bin");
  const r = await runK3([
    "run",
    dir,
    "--ids",
    PROMPT,
    "--gen",
    "4",
    "--ignore-eos",
    "--out",
    json,
    "--dump-logits",
    bin,
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, /memory plan/);
  assert.match(r.stderr, /STEP/);
  const record = JSON.parse(await Deno.readTextFile(json));
  assert.deepEqual(record.prompt_ids, [3, 14, 159, 265]);
  assert.equal(record.generated_ids.length, 4);
  assert.equal(record.seconds_per_token.length, 4);
  assert.ok(record.peak_rss_bytes > 1e6);
  const config = JSON.parse(await Deno.readTextFile(path.join(dir, "config.json")));
  const vocab = (config.text_config ?? config).vocab_size;
  const logits = new Float32Array((await Deno.readFile(bin)).buffer);
  assert.equal(logits.length, 4 * vocab);
  // The dumped step-0 argmax is the first generated token.
  let best = 0;
  for (let i = 1; i < vocab; i++) if (logits[i] > logits[best]) best = i;
  assert.equal(best, record.generated_ids[0]);
});

Deno.test("mod.ts: openModel + generate, as a user's script would", async () => {
  const dir = await tinyModel({ seed: 11 });
  const model = await openModel(dir);
  try {
    const tokens: number[] = [];
    for await (const step of model.generate([3, 14, 159, 265], { maxTokens: 4, stopIds: [] })) {
      tokens.push(step.token);
    }
    assert.equal(tokens.length, 4);
    const json = path.join(tempDir(), "run.json");
    const cli = await runK3([
      "run",
      dir,
      "--ids",
      PROMPT,
      "--gen",
      "4",
      "--ignore-eos",
      "--out",
      json,
    ]);
    assert.equal(cli.code, 0, cli.stderr);
    assert.deepEqual(JSON.parse(await Deno.readTextFile(json)).generated_ids, tokens);
  } finally {
    model.close();
  }
});

/** Copies a generated model so a test can break it. */
async function copyModel(dir: string): Promise<string> {
  const dst = tempDir();
  for await (const e of Deno.readDir(dir)) {
    if (e.isFile) await Deno.copyFile(path.join(dir, e.name), path.join(dst, e.name));
  }
  return dst;
}

/** Rewrites a shard's JSON header in place, keeping its length (pads with spaces). */
async function editHeader(file: string, edit: (h: Record<string, any>) => void): Promise<void> {
  const bytes = await Deno.readFile(file);
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  edit(header);
  const json = new TextEncoder().encode(JSON.stringify(header));
  assert.ok(json.length <= n, "edited header must not grow");
  bytes.fill(0x20, 8, 8 + n);
  bytes.set(json, 8);
  await Deno.writeFile(file, bytes);
}

/** The shard holding `suffix`, and the tensor's full name. */
async function findTensor(dir: string, suffix: string): Promise<[string, string]> {
  const index = JSON.parse(await Deno.readTextFile(path.join(dir, "model.safetensors.index.json")));
  const name = Object.keys(index.weight_map).find((k) => k.endsWith(suffix))!;
  return [path.join(dir, index.weight_map[name]), name];
}

async function expectBadInput(dir: string, pattern: RegExp): Promise<void> {
  const r = await runK3(["run", dir, "--ids", PROMPT, "--gen", "1"]);
  assert.equal(r.code, 2, `expected exit 2, got ${r.code}: ${r.stderr}`);
  assert.match(r.stderr, pattern);
}

Deno.test("bad checkpoints exit 2 and name the problem", async (t) => {
  const good = await tinyModel({ seed: 11 });

  await t.step("config missing keys: all named", async () => {
    const dir = await copyModel(good);
    const file = path.join(dir, "config.json");
    const config = JSON.parse(await Deno.readTextFile(file));
    delete config.text_config.hidden_size;
    delete config.text_config.num_experts_per_token;
    delete config.text_config.linear_attn_config.head_dim;
    await Deno.writeTextFile(file, JSON.stringify(config));
    await expectBadInput(
      dir,
      /hidden_size[\s\S]*num_experts_per_token|num_experts_per_token[\s\S]*hidden_size/,
    );
    await expectBadInput(dir, /head_dim/);
  });

  await t.step("bad layer map", async () => {
    const dir = await copyModel(good);
    const file = path.join(dir, "config.json");
    const config = JSON.parse(await Deno.readTextFile(file));
    const lac = config.text_config.linear_attn_config;
    lac.kda_layers = [...lac.kda_layers, lac.full_attn_layers[0]];
    await Deno.writeTextFile(file, JSON.stringify(config));
    await expectBadInput(dir, /kda_layers|full_attn_layers/);
  });

  await t.step("tensor with a wrong shape", async () => {
    const dir = await copyModel(good);
    const [file, name] = await findTensor(dir, "layers.1.self_attn.o_proj.weight");
    await editHeader(file, (h) => h[name].shape.reverse());
    await expectBadInput(
      dir,
      /o_proj\.weight[\s\S]*expected BF16 \[(\d+), (\d+)\], found BF16 \[\2, \1\]/,
    );
  });

  await t.step("tensor with a wrong dtype", async () => {
    const dir = await copyModel(good);
    const [file, name] = await findTensor(dir, "layers.1.self_attn.o_proj.weight");
    await editHeader(file, (h) => (h[name].dtype = "F16"));
    await expectBadInput(dir, /F16/);
  });

  await t.step("truncated shard", async () => {
    const dir = await copyModel(good);
    const [file] = await findTensor(dir, "experts.0.w1.weight_packed");
    const size = (await Deno.stat(file)).size;
    await Deno.truncate(file, size - 100);
    await expectBadInput(dir, /truncat|short|size/i);
  });

  await t.step("header with overlapping offsets", async () => {
    const dir = await copyModel(good);
    const [file, a] = await findTensor(dir, "layers.1.input_layernorm.weight");
    const b = a.replace("input_layernorm", "post_attention_layernorm");
    await editHeader(file, (h) => (h[b].data_offsets = [...h[a].data_offsets]));
    await expectBadInput(dir, /overlap/i);
  });
});

Deno.test("k3 doctor plans every preset against a checkpoint", async () => {
  const dir = await tinyModel({ seed: 11 });
  const r = await runK3(["doctor", dir]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /kernels +(scalar|avx2|avx512|neon) path/);
  for (const p of ["ultra", "laptop", "desktop", "workstation", "server", "max", "auto"]) {
    assert.match(r.stdout, new RegExp(`^  ${p} +fits `, "m"));
  }
});

Deno.test("k3 doctor --trunk plans with the pack's coded sizes", async () => {
  const dir = await tinyModel({ seed: 11 });
  const trunk = path.join(tempDir(), "trunk");
  assert.equal((await runK3(["pack", dir, trunk])).code, 0);
  /** The resident trunk bytes of the laptop plan, as doctor prints them. */
  const pinned = (stdout: string) => {
    const m = stdout.match(/^ {2}laptop +fits[^\n]*\n +trunk pinned ([\d.]+) (KB|MB)/m);
    assert.ok(m, stdout);
    return Number(m[1]) * (m[2] === "MB" ? 1000 : 1);
  };
  const plain = await runK3(["doctor", dir]);
  const coded = await runK3(["doctor", dir, "--trunk", trunk]);
  assert.equal(coded.code, 0, coded.stderr);
  assert.match(coded.stdout, /^trunk pack .*codec k3c1/m);
  assert.ok(pinned(coded.stdout) < 0.8 * pinned(plain.stdout), coded.stdout);
  const alone = await runK3(["doctor", "--trunk", trunk]);
  assert.equal(alone.code, 2);
  assert.match(alone.stderr, /needs the checkpoint/);
  const none = await runK3(["doctor", dir, "--trunk", path.join(trunk, "nothing")]);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /trunk\.json/);
});
