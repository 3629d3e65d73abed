/**
 * The full-size layout (`make-tiny --shape full`): the 93-layer, 497,052-tensor census against
 * MODEL.md §2-§3 (written with --data none, so only headers reach the disk), the shard names and
 * sizes, the index, what --data sparse fills and leaves as holes, the open's cost, `doctor`'s plan
 * of every preset on that layout, and the CLI's refusals.
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { makeTinyCommand } from "../../lib/cli/make_tiny.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { readSafetensorsHeader } from "../../lib/checkpoint/safetensors.ts";
import { K3Error } from "../../lib/errors.ts";
import {
  fullShape,
  makeFull,
  planFull,
  shardTensors,
  writeSparseShard,
} from "../../lib/synth/full.ts";
import { f32ToBf16 } from "../../lib/synth/numerics.ts";
import { SYNTH_BPE_RANKS, tensor, tensorChunks } from "../../lib/synth/tiny.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { runK3 } from "../support/helpers.ts";
import { expectedLayout } from "../support/spec_layout.ts";

const MODEL = "language_model.model.";
const HEAD = "language_model.lm_head.weight";

/** text_config values of the release (MODEL.md §2.1-§2.3), written out here, not read from lib/. */
const RELEASED = {
  vocab_size: 163840,
  hidden_size: 7168,
  num_hidden_layers: 93,
  intermediate_size: 33792,
  first_k_dense_replace: 1,
  moe_layer_freq: 1,
  hidden_act: "situ",
  activation_situ_beta: 4.0,
  activation_situ_linear_beta: 25.0,
  rms_norm_eps: 1e-5,
  max_position_embeddings: 1048576,
  num_attention_heads: 96,
  num_key_value_heads: 96,
  q_lora_rank: 1536,
  kv_lora_rank: 512,
  qk_nope_head_dim: 128,
  qk_rope_head_dim: 64,
  v_head_dim: 128,
  num_experts: 896,
  num_experts_per_token: 16,
  num_shared_experts: 2,
  moe_intermediate_size: 3072,
  routed_expert_hidden_size: 3584,
  routed_scaling_factor: 1.0,
  attn_res_block_size: 12,
  num_nextn_predict_layers: 0,
  eos_token_id: 163586,
};
const RELEASED_MLA = [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76, 80];
RELEASED_MLA.push(84, 88, 92, 93);

/** Runs tests/support/open_probe.ts in a child process and returns its JSON line. */
async function probe(args: string[]): Promise<any> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "-A",
      join(import.meta.dirname!, "..", "support", "open_probe.ts"),
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  return JSON.parse(text);
}

function readJson(dir: string, file: string): any {
  return JSON.parse(Deno.readTextFileSync(join(dir, file)));
}

Deno.test("make-tiny --shape full --data none: the 93-layer release layout", async (t) => {
  const dir = Deno.makeTempDirSync({ prefix: "k3-full-" });
  try {
    const t0 = performance.now();
    const made = await makeFull(dir, { data: "none" });
    const seconds = (performance.now() - t0) / 1000;
    console.log(
      `full layout (--data none): ${seconds.toFixed(1)} s, ${made.plan.tensorCount} tensors, ` +
        `${(made.diskBytes / 1e6).toFixed(0)} MB on disk for ${
          (made.apparentBytes / 1e12).toFixed(2)
        } TB apparent`,
    );
    const c = readJson(dir, "config.json").text_config;
    const files = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) =>
      n.endsWith(".safetensors")
    ).sort();
    const headers = await Promise.all(files.map((f) => readSafetensorsHeader(join(dir, f))));

    await t.step("config.json holds the released values", () => {
      const picked = Object.fromEntries(Object.keys(RELEASED).map((k) => [k, c[k]]));
      assert.deepEqual(picked, RELEASED);
      assert.deepEqual(c.linear_attn_config.full_attn_layers, RELEASED_MLA);
      const kda = Array.from({ length: 93 }, (_, i) => i + 1).filter((l) =>
        !RELEASED_MLA.includes(l)
      );
      assert.deepEqual(c.linear_attn_config.kda_layers, kda);
      assert.equal(c.quantization_config.config_groups.group_0.weights.group_size, 32);
      assert.deepEqual(readJson(dir, "generation_config.json"), {
        max_length: 1048576,
        eos_token_id: 163586,
      });
      const ranks = Deno.readTextFileSync(join(dir, "tiktoken.model")).trimEnd().split("\n");
      assert.equal(ranks.length, 163_584);
      assert.equal(ranks.at(-1)!.split(" ")[1], "163583");
      const decoder = readJson(dir, "tokenizer_config.json").added_tokens_decoder;
      assert.equal(decoder["163586"].content, "<|end_of_msg|>");
      assert.equal(decoder["163839"].content, "[PAD]");
    });

    await t.step("the padded vocabulary encodes text as the synthetic BPE does", async () => {
      const tok = await Tokenizer.load(dir);
      try {
        assert.equal(tok.vocabSize, 163_840);
        const ids = tok.encode("the fillers r1024 and r163583 never match r5 text");
        assert.ok(ids.every((id) => id < SYNTH_BPE_RANKS), `ids ${ids}`);
        assert.equal(tok.decode([163_583]), " r163583");
      } finally {
        tok.free();
      }
    });

    await t.step("every tensor has its released name, dtype and shape (MODEL.md §3)", () => {
      const expected = expectedLayout(c, MODEL, HEAD);
      const found = new Map<string, string>();
      for (const h of headers) {
        for (const e of h.entries) {
          assert.ok(!found.has(e.name), `${e.name} appears twice`);
          found.set(e.name, `${e.dtype} [${e.shape}]`);
        }
      }
      assert.equal(found.size, 497_052);
      assert.equal(expected.size, 497_052);
      for (const [name, want] of expected) {
        assert.equal(found.get(name), `${want.dtype} [${want.shape}]`, name);
      }
      const census: Record<string, number> = {};
      for (const h of headers) {
        for (const e of h.entries) census[e.dtype] = (census[e.dtype] ?? 0) + 1;
      }
      assert.deepEqual(census, { U8: 494_592, BF16: 1_954, F32: 506 });
      assert.deepEqual(made.plan.census, census);
    });

    await t.step("96 shards named and sized like the release, tensors in layer order", () => {
      assert.deepEqual(
        files,
        Array.from(
          { length: 96 },
          (_, k) => `model-${String(k + 1).padStart(5, "0")}-of-00096.safetensors`,
        ),
      );
      const sizes = files.map((f) => Deno.statSync(join(dir, f)).size);
      assert.deepEqual(headers[0].entries.map((e) => e.name), [`${MODEL}embed_tokens.weight`]);
      assert.ok(sizes[0] > 2.3e9 && sizes[0] < 2.4e9, `first shard ${sizes[0]}`);
      for (const s of sizes.slice(1)) assert.ok(s > 15e9 && s < 17.5e9, `shard of ${s} bytes`);
      assert.ok(headers.at(-1)!.entries.some((e) => e.name === HEAD));
      // Layer numbers never decrease through the files, and each expert's six tensors are one
      // run of bytes.
      let lastLayer = -1;
      for (const h of headers) {
        const byOffset = [...h.entries].sort((a, b) => a.begin - b.begin);
        const runs = new Map<string, { begin: number; end: number; n: number }>();
        for (const e of byOffset) {
          const layer = /\.layers\.(\d+)\./.exec(e.name);
          if (layer) {
            assert.ok(Number(layer[1]) >= lastLayer, `${e.name} after layer ${lastLayer}`);
            lastLayer = Number(layer[1]);
          }
          const expert = /^(.*\.experts\.\d+)\./.exec(e.name);
          if (!expert) continue;
          const run = runs.get(expert[1]);
          if (run) {
            assert.equal(e.begin, run.end, `${e.name} does not follow its expert's tensors`);
            run.end = e.end;
            run.n++;
          } else runs.set(expert[1], { begin: e.begin, end: e.end, n: 1 });
        }
        for (const [name, run] of runs) assert.equal(run.n, 6, name);
      }
      assert.equal(lastLayer, 92);
    });

    await t.step("the index names every tensor's shard and the total size", () => {
      const index = readJson(dir, "model.safetensors.index.json");
      const map = index.weight_map as Record<string, string>;
      let count = 0, total = 0;
      headers.forEach((h, k) => {
        for (const e of h.entries) {
          assert.equal(map[e.name], files[k], e.name);
          count++;
          total += e.end - e.begin;
        }
      });
      assert.equal(Object.keys(map).length, count);
      assert.equal(index.metadata.total_size, total);
      assert.equal(total, 1_559_965_606_912);
    });

    await t.step(
      "open costs <= 150 MB over a bare Deno and well under the time bound",
      async () => {
        const bare = await probe([]);
        const open = await probe([dir]);
        const overMb = (open.peakKb - bare.peakKb) / 1024;
        console.log(
          `open of the 93-layer layout: ${open.ms.toFixed(0)} ms wall, ${
            open.cpuMs.toFixed(0)
          } ms CPU, peak RSS ${(open.peakKb / 1024).toFixed(0)} MB vs bare Deno ${
            (bare.peakKb / 1024).toFixed(0)
          } MB (+${overMb.toFixed(0)} MB); load ${Deno.loadavg()[0].toFixed(1)}`,
        );
        assert.equal(open.tensors, 497_052);
        assert.equal(open.layers, 93);
        assert.ok(overMb <= 150, `open costs ${overMb.toFixed(0)} MB over a bare Deno process`);
        // Opening takes under 2 s of wall time on a quiet machine. CPU time is what a busy machine
        // does not inflate much, so it carries the assertion; it counts every thread of the probe
        // (Deno's start, libk3's threads waiting), measured 2.0-2.5 s here. The bound has room
        // for that and still fails on the class of regression it guards (3.9 s before the compact
        // index).
        assert.ok(open.cpuMs <= 3200, `open took ${open.cpuMs.toFixed(0)} ms of CPU`);
        assert.ok(open.ms <= 10_000, `open took ${open.ms.toFixed(0)} ms`);
      },
    );

    await t.step("doctor plans every preset: its total, its context and why not", async () => {
      const r = await runK3(["doctor", dir]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /93 layers, hidden 7168, 896 experts top-16, 96 shards/);
      const gb = (line: string) => Number(/(fits|no) +([\d.]+) GB/.exec(line)![2]);
      const out = r.stdout.split("\n");
      const classes: [string, number][] = [
        ["ultra", 2.9],
        ["laptop", 7.7],
        ["desktop", 16],
        ["workstation", 32],
        ["server", 64],
        ["max", 128],
        ["auto", Infinity],
      ];
      for (const [p, budget] of classes) {
        const i = out.findIndex((l) => l.startsWith(`  ${p.padEnd(12)} `));
        assert.ok(i >= 0, `${p} is planned\n${r.stdout}`);
        const lines = out.slice(i, i + 3);
        assert.match(lines[0], /context \d+ \(room for \d+\); trunk \d+\/93 pinned/, lines[0]);
        if (/ no /.test(lines[0].slice(0, 20))) {
          assert.match(lines[2], /why not: the plan needs .* a shortfall of/, lines.join("\n"));
        }
        // Each preset keeps its class: it plans within its budget and spends most of it.
        if (budget !== Infinity) {
          assert.ok(gb(lines[0]) <= budget, lines[0]);
          assert.ok(gb(lines[0]) >= 0.95 * budget, `${p} leaves its budget unused: ${lines[0]}`);
        }
      }
      const line = (p: string) => out.find((l) => l.startsWith(`  ${p.padEnd(12)} `))!;
      assert.match(line("ultra"), /ultra +fits/);
      assert.match(line("ultra"), /context 4096 .*0\/93 pinned, lm_head streamed/);
      // 128 GB holds the whole trunk; the rest is expert cache.
      assert.match(line("max"), /93\/93 pinned, lm_head resident; experts \d+ cache slots/);
      // laptop fits any machine with 8 GB available (else doctor says that is why).
      const laptop = out.slice(out.indexOf(line("laptop")), out.indexOf(line("laptop")) + 3);
      assert.ok(/fits/.test(laptop[0]) || /available memory/.test(laptop[2]), laptop.join("\n"));
    });

    await t.step("bind problems at full scale: every expert checked, the list capped", async () => {
      const configPath = join(dir, "config.json");
      const saved = Deno.readTextFileSync(configPath);
      const json = JSON.parse(saved);
      json.text_config.routed_expert_hidden_size = 3616; // every expert tensor now mismatches
      Deno.writeTextFileSync(configPath, JSON.stringify(json));
      try {
        await assert.rejects(openCheckpoint(dir), (e: Error) => {
          assert.ok(e instanceof K3Error && e.exitCode === 2, String(e));
          const lines = e.message.split("\n");
          assert.match(lines[0], /checkpoint does not match .*: (\d+) tensor problem/);
          const count = Number(/: (\d+) tensor problem/.exec(lines[0])![1]);
          assert.ok(count >= 494_592, `${count} problems`);
          assert.equal(lines.length, 1 + 20 + 1);
          assert.match(e.message, /experts\.0\.w1\.weight_packed .*expected U8 \[3072, 1808\]/);
          return true;
        });
      } finally {
        Deno.writeTextFileSync(configPath, saved);
      }
    });

    await t.step("sparse: only headers and small files on disk", () => {
      assert.ok(made.apparentBytes > 1.5e12);
      assert.ok(made.diskBytes < 250e6, `${made.diskBytes} bytes on disk`);
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("make-tiny --shape full --layers N: layer lists cut, fewer shards, same widths", () => {
  const plan = planFull({ layers: 4 });
  const c = (plan.config as any).text_config;
  assert.equal(c.num_hidden_layers, 4);
  assert.deepEqual(c.linear_attn_config.full_attn_layers, [4]);
  assert.deepEqual(c.linear_attn_config.kda_layers, [1, 2, 3]);
  assert.equal(c.num_experts, 896);
  // Embedding alone, then 3 x 896 experts (15.7 GB a layer) in about 16.4 GB shards.
  assert.equal(plan.shards.length, 5);
  assert.deepEqual(plan.census, {
    BF16: 5 + 4 * 8 + 3 * 6 + 1 * 6 + 3 + 3 * 7,
    F32: 18 + 3,
    U8: 3 * 896 * 6,
  });
  assert.equal(planFull({ layers: 93 }).shards.length, 96);
  assert.deepEqual(fullShape(93).mlaLayers, RELEASED_MLA);
});

Deno.test("make-tiny --shape full --data sparse: what is random, what is 1.0, what is a hole", () => {
  const plan = planFull({ layers: 3 });
  const kinds = new Map<string, string>();
  for (const shard of plan.shards) {
    for (const t of shardTensors(plan, shard, "sparse")) kinds.set(t.name, t.init.kind);
  }
  const P = `${MODEL}layers.`;
  const random = [
    `${MODEL}embed_tokens.weight`,
    HEAD,
    `${P}1.block_sparse_moe.gate.weight`,
    `${P}1.block_sparse_moe.gate.e_score_correction_bias`,
    `${P}2.block_sparse_moe.gate.weight`,
    `${P}2.block_sparse_moe.gate.e_score_correction_bias`,
  ];
  for (const name of random) assert.equal(kinds.get(name), "uniform", name);
  const ones = [...kinds.keys()].filter((n) => n.endsWith("norm.weight"));
  // 3 x (input, post-attention, two AttnRes) + o_norm x 3 + routed_expert_norm x 2 + final 2.
  assert.equal(ones.length, 3 * 4 + 3 + 2 + 2);
  for (const name of ones) assert.equal(kinds.get(name), "const", name);
  for (const [name, kind] of kinds) {
    if (!random.includes(name) && !ones.includes(name)) assert.equal(kind, "hole", name);
  }
  for (const shard of plan.shards) {
    assert.ok(shardTensors(plan, shard, "none").every((t) => t.init.kind === "hole"));
  }
});

Deno.test("writeSparseShard: real tensors at their offsets, holes read as zeros, few blocks", async () => {
  const dir = Deno.makeTempDirSync({ prefix: "k3-sparse-" });
  try {
    const tensors = [
      tensor("a", "BF16", [4096], { kind: "uniform", mean: 0, std: 1 }),
      tensor("hole", "U8", [16 << 20], { kind: "hole" }),
      tensor("ones", "BF16", [8], { kind: "const", value: 1 }),
      tensor("f", "F32", [16], { kind: "uniform", mean: 0, std: 0.01 }),
    ];
    const file = join(dir, "s.safetensors");
    const buffer = new Uint8Array(1 << 20);
    const written = await writeSparseShard(file, tensors, 7, buffer);
    const header = await readSafetensorsHeader(file);
    const st = Deno.statSync(file);
    assert.equal(st.size, header.dataStart + tensors.reduce((n, t) => n + t.nbytes, 0));
    assert.ok(written < 1 << 20);
    assert.ok(st.blocks! * 512 < 1 << 20, `${st.blocks! * 512} bytes on disk`);
    const f = await Deno.open(file);
    try {
      for (const e of header.entries) {
        const bytes = new Uint8Array(e.end - e.begin);
        await f.seek(header.dataStart + e.begin, Deno.SeekMode.Start);
        for (let done = 0; done < bytes.length;) {
          done += (await f.read(bytes.subarray(done)))!;
        }
        const t = tensors.find((x) => x.name === e.name)!;
        if (t.init.kind === "hole") assert.ok(bytes.every((b) => b === 0), "hole is zeros");
        else if (t.init.kind === "const") {
          const bits = new Uint16Array(bytes.buffer);
          assert.ok(bits.every((b) => b === f32ToBf16(1)), "gains are 1.0");
        } else {
          const want = new Uint8Array([...tensorChunks(t, 7, new Uint8Array(1 << 20))][0]);
          assert.deepEqual(bytes, want, e.name);
          assert.ok(bytes.some((b) => b !== 0));
        }
      }
    } finally {
      f.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("make-tiny --shape full: flags refused with exit 2", async () => {
  const dir = Deno.makeTempDirSync({ prefix: "k3-full-cli-" });
  try {
    assert.equal(await makeTinyCommand([dir, "--shape", "full", "--experts", "8"]), 2);
    assert.equal(await makeTinyCommand([dir, "--shape", "full", "--layers", "94"]), 2);
    assert.equal(await makeTinyCommand([dir, "--shape", "full", "--layers", "0"]), 2);
    assert.equal(await makeTinyCommand([dir, "--shape", "full", "--data", "all"]), 2);
    assert.equal(await makeTinyCommand([dir, "--data", "none"]), 2);
    assert.deepEqual([...Deno.readDirSync(dir)], []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
