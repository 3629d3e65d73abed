/**
 * State that survives a restart (lib/model/state_file.ts): a resumed prompt gives the bytes
 * of a full prefill (library, `run --save-state/--load-state`, `chat --history` across
 * processes); every bad state file is refused with a reason and the prompt is prefilled in
 * full; SIGKILL during a write leaves the previous state usable. Also `k3 run` and Ctrl-C.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { conversationState, runTurn } from "../../lib/chat/turn.ts";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { parseConfig, readConfig } from "../../lib/checkpoint/config.ts";
import { generate, type GenerateStep } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import {
  checkpointIdentity,
  readStateFile,
  stateFileSize,
  writeStateFile,
} from "../../lib/model/state_file.ts";
import { Session } from "../../lib/generate/session.ts";
import { fullShape, K3_VOCAB_SIZE } from "../../lib/synth/full.ts";
import { modelConfig } from "../../lib/synth/tiny.ts";
import { type ChatMessage, renderChatIds } from "../../lib/text/chat.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { runK3, sameBytes, tempDir, tinyModel } from "../support/helpers.ts";
import { markedState } from "../support/state_writer.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");
const PROMPT = [3, 14, 159, 265, 358, 979];
/** One ring slot, one expert slot, one thread: slow enough to interrupt. */
const SLOW = ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1", "--threads", "1"];

/** Logits of every step of a fresh (empty-state) run. */
async function fresh(model: Model, prompt: number[], maxTokens: number) {
  const steps: GenerateStep[] = [];
  for await (const s of generate(model, prompt, { maxTokens })) steps.push(s);
  return steps;
}

Deno.test("state file: a resumed prompt equals a full prefill, tokens and logits", async () => {
  const dir = await tinyModel({ seed: 11 });
  const ckpt = await openCheckpoint(dir);
  const model = Model.load(ckpt);
  try {
    const identity = await checkpointIdentity(ckpt);
    const file = path.join(tempDir(), "run.state");
    const first = await fresh(model, PROMPT, 5);
    const state = first.at(-1)!.state!;
    const bytes = await writeStateFile(file, state, identity);
    assert.equal(bytes, (await Deno.stat(file)).size);
    const size = stateFileSize(model.config, state.position, true);
    assert.ok(bytes > size.body && bytes < size.body + 1024, "body + a small header");

    // A longer prompt that extends the saved tokens resumes; every step matches.
    const longer = [...state.tokens, 7, 8, 9];
    const got = await readStateFile(file, model.config, identity, longer);
    assert.ok(got.ok, got.ok ? "" : got.reason);
    assert.equal(got.state.position, state.position);
    const resumed: GenerateStep[] = [];
    for await (const s of generate(model, longer, { maxTokens: 6, state: got.state })) {
      resumed.push(s);
    }
    assert.equal(resumed[0].fed, 3, "only the 3 new tokens are prefilled");
    const full = await fresh(model, longer, 6);
    assert.deepEqual(resumed.map((s) => s.token), full.map((s) => s.token));
    full.forEach((s, i) => assert.ok(sameBytes(resumed[i].logits, s.logits), `step ${i}`));

    // The same prompt again needs no forward pass: the stored logits are the first step's.
    const same = await readStateFile(file, model.config, identity, state.tokens);
    assert.ok(same.ok);
    const again: GenerateStep[] = [];
    for await (const s of generate(model, [...state.tokens], { maxTokens: 2, state: same.state })) {
      again.push(s);
    }
    assert.equal(again[0].fed, 0);
    const ref = await fresh(model, [...state.tokens], 2);
    assert.ok(
      sameBytes(again[0].logits, ref[0].logits) && sameBytes(again[1].logits, ref[1].logits),
    );
  } finally {
    model.close();
  }
});

Deno.test("state file: sizes for the full K3 model (per position, per KDA layer)", () => {
  const config = parseConfig(modelConfig(fullShape(), K3_VOCAB_SIZE, false), "full-size");
  const s = stateFileSize(config, 1000);
  // 24 MLA layers x 576 fp32 per position + the token id; 96 heads x 128 x 128 fp32 S plus
  // three 3 x 12288 fp32 conv histories per KDA layer, 69 KDA layers.
  assert.equal(s.perPosition, 4 + 24 * 576 * 4);
  assert.equal(s.perKdaLayer, 4 * (96 * 128 * 128 + 3 * 3 * 96 * 128));
  assert.equal(s.kda, 69 * s.perKdaLayer);
  assert.equal(s.body, s.kda + 1000 * s.perPosition);
  console.log(
    `full model state: ${s.perPosition} B per position, ${s.perKdaLayer} B per KDA layer, ` +
      `${(s.kda / 1e6).toFixed(1)} MB for all 69 KDA layers, ` +
      `${(stateFileSize(config, 32768).body / 1e9).toFixed(2)} GB at 32768 positions`,
  );
});

/** Writes a copy of `file` changed by `edit` and returns why reading it is refused. */
async function refusal(
  file: string,
  edit: (bytes: Uint8Array) => Uint8Array,
  config: Awaited<ReturnType<typeof readConfig>>,
  identity: string,
  prompt?: number[],
): Promise<string> {
  const bad = `${file}.bad`;
  await Deno.writeFile(bad, edit(await Deno.readFile(file)));
  const got = await readStateFile(bad, config, identity, prompt);
  assert.ok(!got.ok, "a bad state file must be refused");
  return got.reason;
}

/** Rewrites the JSON header of a state file. */
function editHeader(bytes: Uint8Array, edit: (h: Record<string, unknown>) => void): Uint8Array {
  const n = new DataView(bytes.buffer, bytes.byteOffset).getUint32(8, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(12, 12 + n)));
  edit(header);
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(12 + json.length + bytes.length - 12 - n);
  out.set(bytes.subarray(0, 12));
  new DataView(out.buffer).setUint32(8, json.length, true);
  out.set(json, 12);
  out.set(bytes.subarray(12 + n), 12 + json.length);
  return out;
}

Deno.test("state file: missing, foreign, stale, truncated and damaged files are refused", async () => {
  const dir = await tinyModel({ seed: 11 });
  const other = await tinyModel({ seed: 12 });
  const ckpt = await openCheckpoint(dir);
  const model = Model.load(ckpt);
  const config = model.config;
  const work = tempDir();
  const file = path.join(work, "s.state");
  try {
    const identity = await checkpointIdentity(ckpt);
    const state = (await fresh(model, PROMPT, 3)).at(-1)!.state!;
    await writeStateFile(file, state, identity);
    const size = (await Deno.stat(file)).size;
    const longer = [...state.tokens, 1];
    const keep = (b: Uint8Array) => b;

    const missing = await readStateFile(path.join(work, "none"), config, identity);
    assert.ok(!missing.ok && /no such file/.test(missing.reason));
    assert.match(await refusal(file, () => new Uint8Array(0), config, identity), /not a k3 state/);
    assert.match(
      await refusal(file, () => new TextEncoder().encode('{"role":"user"}\n'), config, identity),
      /not a k3 state/,
    );
    // Another checkpoint: a state written for the seed-12 model.
    const otherCkpt = await openCheckpoint(other);
    assert.notEqual(await checkpointIdentity(otherCkpt), identity);
    assert.match(
      await refusal(file, keep, config, await checkpointIdentity(otherCkpt)),
      /another checkpoint/,
    );
    // Truncated anywhere: inside the magic, the header, the body, one byte short.
    for (const cut of [5, 20, 200, size - 1000, size - 1]) {
      assert.match(
        await refusal(file, (b) => b.subarray(0, cut), config, identity),
        /truncated|not a k3 state|not valid JSON/,
        `cut at ${cut}`,
      );
    }
    assert.match(
      await refusal(file, (b) => new Uint8Array([...b, 0]), config, identity),
      /past its end/,
    );
    // One flipped bit in the KDA state.
    assert.match(
      await refusal(
        file,
        (b) => {
          const c = b.slice();
          c[size - 100] ^= 1;
          return c;
        },
        config,
        identity,
      ),
      /SHA-256/,
    );
    // Stale: tokens that are not a prefix of the new prompt; a prompt no longer than the state.
    assert.match(
      await refusal(file, keep, config, identity, [...PROMPT.slice(0, 2), 1, 1, 1, 1, 1, 1, 1]),
      /not a prefix/,
    );
    assert.match(await refusal(file, keep, config, identity, PROMPT.slice(0, 3)), /not a prefix/);
    // Another k3 release; another layout (a layer list that is not this model's).
    assert.match(
      await refusal(file, (b) => editHeader(b, (h) => (h.k3 = "0.0.1")), config, identity),
      /written by k3 0\.0\.1/,
    );
    assert.match(
      await refusal(file, (b) => editHeader(b, (h) => (h.mla_layers = [0])), config, identity),
      /layout does not match/,
    );
    assert.ok(
      (await readStateFile(file, config, identity, longer)).ok,
      "the good file still loads",
    );

    // The checkpoint's files change (a shard's mtime): the identity changes.
    const copy = tempDir();
    for await (const e of Deno.readDir(dir)) {
      if (e.isFile) await Deno.copyFile(path.join(dir, e.name), path.join(copy, e.name));
    }
    const copied = await openCheckpoint(copy);
    const before = await checkpointIdentity(copied);
    await Deno.utime(copied.shards[0], new Date(), new Date(Date.now() - 86_400_000));
    assert.notEqual(await checkpointIdentity(copied), before);
  } finally {
    model.close();
  }
});

Deno.test("k3 run --save-state / --load-state: the resumed run equals a full prefill", async () => {
  const dir = await tinyModel({ seed: 11 });
  const work = tempDir();
  const state = path.join(work, "run.state");
  const ids = PROMPT.join(",");
  const out = (name: string) => ["--out", path.join(work, `${name}.json`)];
  const record = (name: string) =>
    JSON.parse(Deno.readTextFileSync(path.join(work, `${name}.json`)));
  /** `k3 run DIR --ids IDS --gen N ...extra`, which must succeed. */
  const run = async (ids: string, gen: number, ...extra: string[]) => {
    const r = await runK3(["run", dir, "--ids", ids, "--gen", String(gen), ...extra]);
    assert.equal(r.code, 0, r.stderr);
    return r;
  };
  const first = await run(ids, 4, "--save-state", state, ...out("first"));
  assert.match(first.stderr, /state .*run\.state: 9 tokens/);
  // The follow-up: the saved tokens (prompt + 3 of the 4 generated) plus two more.
  const gen: number[] = record("first").generated_ids;
  const next = [...PROMPT, ...gen.slice(0, 3), 21, 22].join(",");
  const logits = (name: string) => ["--dump-logits", path.join(work, `${name}.bin`)];
  const resumed = await run(
    next,
    5,
    "--load-state",
    state,
    ...out("resumed"),
    ...logits("resumed"),
  );
  assert.match(resumed.stderr, /resuming 9 of 11 prompt tokens/);
  await run(next, 5, ...out("full"), ...logits("full"));
  assert.deepEqual(record("resumed").generated_ids, record("full").generated_ids);
  assert.equal(record("resumed").steps[0].fed, 2, "only the two new tokens are prefilled");
  assert.equal(record("resumed").state_resumed_tokens, 9);
  assert.deepEqual(
    Deno.readFileSync(path.join(work, "resumed.bin")),
    Deno.readFileSync(path.join(work, "full.bin")),
    "logits byte for byte",
  );

  // A bad state file is ignored with a warning; the run is the full prefill's.
  const bad = path.join(work, "bad.state");
  for (const content of ["", "garbage", null]) {
    if (content === null) await Deno.remove(bad).catch(() => {});
    else await Deno.writeTextFile(bad, content);
    const r = await run(next, 5, "--load-state", bad, ...out("bad"));
    assert.match(
      r.stderr,
      /warning: --load-state .*bad\.state not used: .*prefilling the prompt in full/,
    );
    assert.deepEqual(record("bad").generated_ids, record("full").generated_ids);
    assert.equal(record("bad").steps[0].fed, 11);
  }
  const mixed = await runK3(["run", dir, "--ids", next, "--recompute", "--save-state", bad]);
  assert.equal(mixed.code, 2);
});

Deno.test("k3 run: Ctrl-C stops after the current step, reports, writes --out and logits, 130", async () => {
  const dir = await tinyModel({ seed: 11 });
  const work = tempDir();
  const json = path.join(work, "run.json"), bin = path.join(work, "logits.bin");
  const child = new Deno.Command(K3, {
    args: [
      "run",
      dir,
      "--ids",
      PROMPT.join(","),
      "--gen",
      "3000",
      "--out",
      json,
      "--dump-logits",
      bin,
      ...SLOW,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let stderr = "";
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  while (!/^20 /m.test(stderr)) { // 20 steps in: the table is running
    const { value, done } = await reader.read();
    if (done) break;
    stderr += value;
  }
  child.kill("SIGINT");
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    stderr += value;
  }
  const { code } = await child.status;
  await child.stdout.cancel();
  assert.equal(code, 130, stderr);
  assert.match(stderr, /interrupted \(Ctrl-C\) after \d+ tokens/);
  assert.match(stderr, /\d+ tokens in .* s\/token; PEAK RSS/, "the report is printed");
  const record = JSON.parse(await Deno.readTextFile(json));
  assert.equal(record.interrupted, true);
  assert.equal(record.stop_reason, "interrupted");
  const n = record.generated_ids.length;
  assert.ok(n >= 20 && n < 3000, `${n} tokens`);
  // The steps so far are exactly an uninterrupted run of n tokens.
  const ref = await runK3([
    "run",
    dir,
    "--ids",
    PROMPT.join(","),
    "--gen",
    String(n),
    "--out",
    path.join(work, "ref.json"),
    "--dump-logits",
    path.join(work, "ref.bin"),
  ]);
  assert.equal(ref.code, 0, ref.stderr);
  assert.deepEqual(
    JSON.parse(Deno.readTextFileSync(path.join(work, "ref.json"))).generated_ids,
    record.generated_ids,
  );
  assert.deepEqual(await Deno.readFile(bin), await Deno.readFile(path.join(work, "ref.bin")));
});

Deno.test("state file: SIGKILL during a write leaves the previous state usable", async () => {
  const dir = await tinyModel({ seed: 11 });
  const config = await readConfig(path.join(dir, "config.json"));
  const work = tempDir();
  const file = path.join(work, "killed.state");
  // About 30 MB per state, so a write (and its fsync) takes a while.
  const positions = Math.ceil(30e6 / stateFileSize(config, 1).perPosition);
  const writer = path.resolve(import.meta.dirname!, "..", "support", "state_writer.ts");
  let midWrite = 0;
  for (let trial = 0; trial < 6; trial++) {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--quiet", writer, dir, file, String(positions)],
      stdout: "piped",
    }).spawn();
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let out = "";
    // Wait for one complete write, then for the next one to start, then kill inside it.
    while (!/wrote \d\nwriting \d\n$/.test(out)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the writer ended: ${out}`);
      out += value;
    }
    // A write hashes first (~20 ms here), then writes and fsyncs (~50 ms): spread the kills.
    await new Promise((r) => setTimeout(r, 5 + trial * 12));
    child.kill("SIGKILL");
    await child.status;
    await reader.cancel();
    const temps = [...Deno.readDirSync(work)].filter((e) => e.name.endsWith(".tmp"));
    if (temps.length > 0) midWrite++;
    const got = await readStateFile(file, config, "test-identity");
    assert.ok(got.ok, `trial ${trial}: ${got.ok ? "" : got.reason}`);
    const mark = got.state.tokens[0];
    assert.ok(mark === 1 || mark === 2);
    assert.ok(got.state.tokens.every((t) => t === mark), "one state, not a mix");
    for (const k of got.state.kda.values()) assert.ok(k.S.every((v) => v === mark));
  }
  assert.ok(midWrite > 0, "at least one kill landed inside a write (a temp file was left)");
  // The next write removes what the killed writers left, but not a live writer's temp file.
  const live = path.join(work, ".killed.state.1.0badc0de.tmp");
  const held = await Deno.open(live, { write: true, createNew: true });
  await held.lock(true);
  try {
    await writeStateFile(file, markedState(config, 3, 1), "test-identity");
  } finally {
    held.close();
  }
  const left = [...Deno.readDirSync(work)].map((e) => e.name).sort();
  assert.deepEqual(left, [".killed.state.1.0badc0de.tmp", "killed.state"]);
  await Deno.remove(live);
});

Deno.test("chat state across processes: the resumed turn equals a full re-prefill", async () => {
  const dir = await tinyModel({ seed: 11 });
  const ckpt = await openCheckpoint(dir);
  const tokenizer = await Tokenizer.load(dir);
  const model = Model.load(ckpt);
  const file = path.join(tempDir(), "talk.jsonl.state");
  const render = { thinking: false };
  try {
    const stopIds = stopIdsOf(model, tokenizer);
    const opts = { render, sampling: {}, stopIds, stops: [], maxTokens: 6 };
    // "Process 1": two turns, then the conversation's state is written.
    const messages: ChatMessage[] = [{ role: "system", content: "Be brief." }];
    let session = new Session(model);
    for (const text of ["Hello there!", "What is 2+2?"]) {
      messages.push({ role: "user", content: text });
      const turn = await runTurn(session, tokenizer, messages, opts);
      messages.push(turn.message);
      const { state } = await conversationState(session, tokenizer, messages, render, turn.state);
      await writeStateFile(file, state, await checkpointIdentity(ckpt), { logits: false });
    }
    // "Process 2": a fresh session resumes from the file; only the new message is prefilled.
    session = new Session(model);
    const got = await readStateFile(file, model.config, await checkpointIdentity(ckpt));
    assert.ok(got.ok);
    session.prefixes.remember(got.state);
    messages.push({ role: "user", content: "Tell me more, please." });
    const logits: Float32Array[] = [];
    const turn = await runTurn(session, tokenizer, messages, {
      ...opts,
      onStep: (s) => logits.push(s.logits),
    });
    const conversation = renderChatIds(tokenizer, messages.slice(0, -1), {
      ...render,
      addGenerationPrompt: false,
    }).ids;
    // Everything before the new message came from the file.
    assert.equal(turn.reuse.reusedTokens, conversation.length);
    console.log(`resumed turn: ${conversation.length} of ${turn.prompt.length} tokens reused`);
    const full = await fresh(model, turn.prompt, turn.ids.length);
    assert.deepEqual(turn.ids, full.map((s) => s.token));
    full.forEach((s, i) => assert.ok(sameBytes(logits[i], s.logits), `step ${i}`));
  } finally {
    model.close();
    tokenizer.free();
  }
});
