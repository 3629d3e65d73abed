/**
 * The library (mod.ts) as a user meets it: the README's example, copied into a folder outside
 * the repo and run with plain `deno run` and the README's permission flags; missing
 * permissions and a missing libk3 named; the CLI's memory options, planner and refusals;
 * chat streaming reasoning and content apart; complete; bad token ids as bad input.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { type ChatMessage, ExitCode, K3Error, openModel } from "../../mod.ts";
import { runK3, sameBytes, tempDir, tinyModel } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const readme = Deno.readTextFileSync(path.join(repo, "README.md"));
const section = readme.slice(readme.indexOf("### From a Deno script"));
/** The README's example script and its `deno run` line. */
const example = section.match(/```ts\n([\s\S]*?)```/)![1];
const command = section.match(/```sh\n(deno run [^\n]*hello\.ts MODEL_DIR)\n```/)![1];
const flags = command.split(" ").filter((w) => w.startsWith("--"));

/** Runs the README's hello.ts from a fresh folder outside the repo; no deno.json anywhere. */
async function runExample(dir: string, permissions: string[], env: Record<string, string> = {}) {
  const folder = tempDir();
  assert.ok(!path.resolve(folder).startsWith(repo + path.sep), "the folder is outside the repo");
  const script = example.replace("/path/to/k3/mod.ts", path.join(repo, "mod.ts"));
  assert.notEqual(script, example, "the README imports /path/to/k3/mod.ts");
  await Deno.writeTextFile(path.join(folder, "hello.ts"), script);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", ...permissions, "hello.ts", dir],
    cwd: folder,
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("README example: runs from a folder outside the repo with plain deno run", async () => {
  assert.deepEqual(flags, ["--allow-ffi", "--allow-read", "--allow-env"]);
  const dir = await tinyModel({ seed: 11 });
  const r = await runExample(dir, flags);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, /memory plan \(laptop\)/);
  const summary = JSON.parse(r.stdout.split("\n").find((l) => l.startsWith('{"finish"'))!);
  // The same call in this process gives the same answer.
  const model = await openModel(dir, { preset: "laptop", context: 4096 });
  try {
    const reply = model.chat([{ role: "user", content: "What is the capital of France?" }], {
      maxTokens: 24,
      effort: "low",
    });
    const result = await reply.result;
    assert.deepEqual(summary, {
      finish: result.finish,
      promptTokens: result.promptTokens,
      content: result.message.content,
    });
    const steps = [];
    for await (const s of model.generate([3, 14, 159], { maxTokens: 4 })) steps.push(s.token);
    assert.ok(r.stdout.includes(steps.join("\n")), r.stdout);
  } finally {
    model.close();
  }
});

Deno.test("README example: a missing permission or libk3 is named", async () => {
  const dir = await tinyModel({ seed: 11 });
  for (const flag of flags) {
    const r = await runExample(dir, flags.filter((f) => f !== flag));
    assert.notEqual(r.code, 0);
    assert.ok(r.stderr.includes(`openModel needs ${flag}`), r.stderr);
    assert.doesNotMatch(r.stderr, /tiktoken_bg\.wasm/);
  }
  const r = await runExample(dir, flags, { K3_LIB: "/nonexistent/libk3.so" });
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /cannot load libk3 from \/nonexistent\/libk3\.so: build it with `make`/);
  // The CLI: the same message, exit 2, no stack trace.
  const cli = await runK3(["run", dir, "--ids", "1,2", "--gen", "1"], {
    K3_LIB: "/nonexistent/libk3.so",
  });
  assert.equal(cli.code, 2, cli.stderr);
  assert.match(cli.stderr, /build it with `make`/);
  assert.doesNotMatch(cli.stderr, /\bat .*\.ts:\d+/);
});

Deno.test("openModel: the CLI's memory options, plan, report, cache statistics", async () => {
  const dir = await tinyModel({ seed: 11 });
  // Over budget: the same K3Error as the CLI's exit 3, before anything is allocated.
  await assert.rejects(() => openModel(dir, { memoryMax: 0.001 }), (e: unknown) => {
    assert.ok(e instanceof K3Error && e.exitCode === ExitCode.overBudget, String(e));
    return true;
  });
  const cli = await runK3(["chat", dir, "--memory-max", "0.001"]);
  assert.equal(cli.code, 3);
  await assert.rejects(() => openModel(dir, { preset: "huge" }), /unknown preset 'huge'/);
  await assert.rejects(() => openModel(dir, { cacheGb: -1 }), /cacheGb must be a number >= 0/);
  await assert.rejects(() => openModel(dir, { cachePolicy: "mru" }), /unknown policy 'mru'/);

  // A tiny expert cache: the experts stream, and the statistics say so.
  const lines: string[] = [];
  const model = await openModel(dir, { cacheGb: 0.0002, context: 512, log: (l) => lines.push(l) });
  try {
    assert.equal(model.context, 512);
    assert.equal(model.plan.positions, 512);
    assert.ok(model.plan.totalBytes > 0 && model.plan.items.length > 3);
    assert.match(lines.join("\n"), /memory plan/);
    assert.equal(lines.join("\n"), model.plan.text);
    const tokens: number[] = [];
    for await (const s of model.generate([3, 14, 159, 265], { maxTokens: 4 })) tokens.push(s.token);
    const stats = model.cacheStats()!;
    assert.ok(stats.requests > 0 && stats.misses > 0, JSON.stringify(stats));
    const report = model.report();
    assert.match(report.text, /cache: requests \d+/);
    assert.ok(report.peakRssBytes > 1e6);
    // The same tokens as everything resident (more memory only buys speed).
    const resident = await openModel(dir);
    try {
      const again: number[] = [];
      for await (const s of resident.generate([3, 14, 159, 265], { maxTokens: 4 })) {
        again.push(s.token);
      }
      assert.deepEqual(again, tokens);
      assert.equal(resident.cacheStats(), undefined);
    } finally {
      resident.close();
    }
    // Bad token ids are bad input, as `k3 run --ids` says.
    for (const ids of [[1, 99999], [-1], [1.5]]) {
      await assert.rejects(async () => {
        for await (const _ of model.generate(ids, { maxTokens: 1 })) { /* never */ }
      }, (e: unknown) => e instanceof K3Error && e.exitCode === ExitCode.badInput);
    }
    const bad = await runK3(["run", dir, "--ids", "99999", "--gen", "1"]);
    assert.equal(bad.code, 2);
    // A prompt past the planned context is refused up front.
    assert.throws(
      () => model.chat([{ role: "user", content: "many words ".repeat(400) }]),
      (e: unknown) => e instanceof K3Error && /opened with context 512/.test(e.message),
    );
  } finally {
    model.close();
  }
});

Deno.test("model.chat streams reasoning and content apart; complete; tokenizer, stop ids", async () => {
  const dir = await tinyModel({ seed: 11 });
  const model = await openModel(dir, { context: 2048 });
  try {
    assert.equal(model.tokenizer.vocabSize, model.config.vocabSize);
    assert.ok(model.stopIds.includes(model.tokenizer.specialId("<|end_of_msg|>")!));
    const messages = [{ role: "user", content: "Hello there!" }];
    const prompt = model.renderChat(messages, { thinking: true });
    for (const thinking of [true, false]) {
      const reply = model.chat(messages, { thinking, maxTokens: 40 });
      let reasoning = "", content = "";
      for await (const d of reply) {
        reasoning += d.reasoning;
        content += d.content;
      }
      const { message, finish, promptTokens, ids } = await reply.result;
      assert.equal(message.role, "assistant");
      assert.equal(content, message.content);
      assert.equal(reasoning, message.reasoning_content ?? "");
      assert.ok(["stop", "length"].includes(finish));
      assert.ok(ids.length > 0);
      if (thinking) {
        assert.equal(promptTokens, prompt.length);
        assert.ok(reasoning.length > 0, "the think channel streamed");
      }
    }
    // A follow-up that extends the conversation resumes from its retained state.
    const first = await model.chat(messages, { thinking: false, maxTokens: 5 }).result;
    const follow = await model.chat(
      [...messages, first.message, { role: "user", content: "And?" }],
      { thinking: false, maxTokens: 5 },
    ).result;
    assert.ok(follow.reusedTokens > 0, "reused the previous prompt's state");

    const done = model.complete("The capital of France is", { maxTokens: 6, stopAtEos: false });
    let text = "";
    for await (const piece of done) text += piece;
    const result = await done.result;
    assert.equal(text, result.text);
    assert.equal(result.ids.length, 6);
    assert.equal(result.finish, "length");
    const controller = new AbortController();
    controller.abort();
    const stopped = await model.complete("x", { maxTokens: 50, signal: controller.signal }).result;
    assert.equal(stopped.finish, "interrupted");
  } finally {
    model.close();
  }
});

Deno.test("README: every `k3 run ... --ids` example runs on the demo model", async () => {
  const dir = await tinyModel({ seed: 1 }); // `k3 demo`'s model (seed 1)
  const lines = readme.split("\n").filter((l) => /^\.\/k3 run MODEL_DIR .*--ids /.test(l));
  assert.ok(lines.length >= 2, "the README has id examples");
  for (const line of lines) {
    const out = tempDir();
    const args = line.replace(/#.*$/, "").trim().split(/\s+/).slice(1)
      .map((w) => w === "MODEL_DIR" ? dir : /\.(json|bin)$/.test(w) ? path.join(out, w) : w);
    const r = await runK3(args);
    assert.equal(r.code, 0, `${line}\n${r.stderr}`);
    const gen = Number(args[args.indexOf("--gen") + 1]);
    assert.ok(r.stdout.length > 0, "the generated text is printed");
    if (args.includes("--out")) {
      const record = JSON.parse(await Deno.readTextFile(path.join(out, "run.json")));
      assert.ok(record.generated_ids.length >= 1 && record.generated_ids.length <= gen);
    }
  }
});

Deno.test("the tokenizer's npm: specifier is the one deno.json pins", () => {
  const pinned = JSON.parse(Deno.readTextFileSync(path.join(repo, "deno.json"))).imports.tiktoken;
  const source = Deno.readTextFileSync(path.join(repo, "lib/text/tokenizer.ts"));
  const inline = [...source.matchAll(/"(npm:tiktoken@[^"]+)"/g)].map((m) => m[1]);
  assert.ok(inline.length >= 2);
  for (const s of inline) assert.equal(s, pinned, "one tiktoken, whoever imports it");
});

Deno.test("saveState/loadState: a new model resumes the conversation, byte for byte; bad files refused", async () => {
  const dir = await tinyModel({ seed: 11 });
  const file = path.join(tempDir(), "talk.state");
  const opts = { thinking: false, maxTokens: 6 };
  const messages: ChatMessage[] = [{ role: "user", content: "Hello there!" }];
  const a = await openModel(dir, { context: 2048 });
  let ids: number[], conversation: ChatMessage[];
  try {
    const first = await a.chat(messages, opts).result;
    conversation = [...messages, first.message];
    ids = a.renderChat(conversation, { thinking: false, addGenerationPrompt: false });
    const saved = await a.saveState(file, ids);
    assert.equal(saved.tokens, ids.length);
    assert.ok(saved.bytes > ids.length * 4);
  } finally {
    a.close();
  }
  const next = [...conversation, { role: "user", content: "And?" }];
  const probe = [...ids, 7, 8, 9];
  // The reference: a model that never saw the state.
  const fresh = await openModel(dir, { context: 2048 });
  let expected: { ids: number[]; logits: Float32Array };
  try {
    expected = {
      ids: (await fresh.chat(next, opts).result).ids,
      logits: await fresh.logits(probe),
    };
  } finally {
    fresh.close();
  }
  const b = await openModel(dir, { context: 2048 });
  try {
    assert.deepEqual(await b.loadState(file), { ok: true, tokens: ids.length });
    const steps = [];
    for await (const s of b.generate(probe, { maxTokens: 1 })) steps.push(s);
    assert.equal(steps[0].fed, 3, "only the 3 new tokens were run");
    assert.ok(sameBytes(steps[0].logits, expected.logits), "logits equal a full prefill's");
    const second = await b.chat(next, opts).result;
    assert.ok(second.reusedTokens >= ids.length, `reused ${second.reusedTokens}`);
    assert.deepEqual(second.ids, expected.ids);

    const good = await Deno.readFile(file);
    await Deno.writeFile(file, good.subarray(0, good.length - 9));
    const cut = await b.loadState(file);
    assert.ok(!cut.ok && /truncated|size/.test(cut.reason), JSON.stringify(cut));
    const missing = await b.loadState(file + ".nope");
    assert.deepEqual(missing, { ok: false, reason: "no such file" });
    await Deno.writeFile(file, good);
  } finally {
    b.close();
  }
  const other = await openModel(await tinyModel({ seed: 12 }), { context: 2048 });
  try {
    const foreign = await other.loadState(file);
    assert.ok(!foreign.ok && /checkpoint/.test(foreign.reason), JSON.stringify(foreign));
  } finally {
    other.close();
  }
});

Deno.test("deno doc --lint mod.ts is clean", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["doc", "--lint", path.join(repo, "mod.ts")],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
});

Deno.test("close() while a call runs: the call ends with a K3Error or its tokens, never an FFI error; later calls are refused", async () => {
  const dir = await tinyModel({ seed: 11 });
  // A streamed trunk: closing frees the ring a running pass reads from.
  const model = await openModel(dir, { trunkGb: 0.0009, cacheGb: 0.0003, context: 512 });
  const tokens: number[] = [];
  const running = (async () => {
    for await (const s of model.generate([3, 14, 159, 265], { maxTokens: 200 })) {
      tokens.push(s.token);
      if (tokens.length === 2) model.close();
    }
  })();
  await running.then(
    () => assert.ok(tokens.length >= 2, "the call ended with the tokens it had"),
    (e: unknown) => {
      assert.ok(e instanceof K3Error, `a K3Error, not ${e}`);
      assert.match(e.message, /closed/);
    },
  );
  // The same for a streamed completion closed after its first piece.
  const other = await openModel(dir, { trunkGb: 0.0009, cacheGb: 0.0003, context: 512 });
  const completion = other.complete("The capital of France is", { maxTokens: 200 });
  await assert.rejects(async () => {
    for await (const _ of completion) other.close();
  }, (e: unknown) => e instanceof K3Error && /closed/.test(e.message));
  await assert.rejects(completion.result, (e: unknown) => e instanceof K3Error);
  const later = [
    () => model.generate([1, 2], { maxTokens: 1 }).next(),
    () => model.complete("x", { maxTokens: 1 }).result,
    () => model.chat([{ role: "user", content: "hi" }], { maxTokens: 1 }).result,
    () => model.logits([1, 2]),
  ];
  for (const call of later) {
    await assert.rejects(async () => await call(), (e: unknown) => {
      assert.ok(e instanceof K3Error, `a K3Error, not ${e}`);
      assert.match(e.message, /closed/);
      return true;
    });
  }
  model.close(); // twice is harmless
});

Deno.test("a refused plan says what to change in words; the CLI adds the flag", async () => {
  const dir = await tinyModel({ seed: 11 });
  const refusal = await openModel(dir, { memoryMax: 0.001 }).then(
    () => assert.fail("a plan over 1 MB was not refused"),
    (e: unknown) => e as K3Error,
  );
  assert.match(refusal.message, /a memory budget of at least \d/);
  assert.doesNotMatch(refusal.message, /--[a-z]/, "no flag names in the library's message");
  const remedy = refusal.remedies.find((r) => r.option === "memoryMaxGb")!;
  assert.ok(refusal.message.includes(remedy.words));
  const cli = await runK3(["run", dir, "--ids", "1,2", "--gen", "1", "--memory-max", "0.001"]);
  assert.equal(cli.code, 3, cli.stderr);
  assert.match(cli.stderr, /a memory budget of at least \S+ \S+ \(--memory-max\)/);
});

Deno.test("run, chat, serve and openModel all refuse a tokenizer of another vocabulary", async () => {
  const dir = tempDir();
  await new Deno.Command("cp", { args: ["-r", `${await tinyModel({ seed: 11 })}/.`, dir] })
    .output();
  // One rank fewer: the tokenizer loads, but covers 1 id less than config.json's vocab_size.
  const ranks = path.join(dir, "tiktoken.model");
  const lines = (await Deno.readTextFile(ranks)).trimEnd().split("\n");
  await Deno.writeTextFile(ranks, lines.slice(0, -1).join("\n") + "\n");
  const why = /the tokenizer has (\d+) ids but config\.json says vocab_size (\d+)/;
  for (
    const args of [["run", dir, "--prompt", "hi"], ["chat", dir], ["serve", dir, "--port", "0"]]
  ) {
    const r = await runK3(args);
    assert.equal(r.code, 2, `${args[0]}: ${r.stderr}`);
    assert.match(r.stderr, why, args[0]);
  }
  await assert.rejects(() => openModel(dir), why);
  // With --ids the tokenizer only decodes: the run goes on, printing ids.
  const ids = await runK3(["run", dir, "--ids", "1,2", "--gen", "2"]);
  assert.equal(ids.code, 0, ids.stderr);
  assert.match(ids.stderr, /not decoding text/);
});
