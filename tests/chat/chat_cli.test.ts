/**
 * `k3 chat`: retained state across turns gives exactly the tokens of a full re-prefill; the
 * JSONL history survives SIGKILL mid-turn and a truncated last line; Ctrl-C keeps a partial
 * answer; /save writes the conversation. References come from the library, run here.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { HistoryWriter, loadHistory } from "../../lib/chat/history.ts";
import { runTurn } from "../../lib/chat/turn.ts";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { K3Error } from "../../lib/errors.ts";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { Session } from "../../lib/generate/session.ts";
import { type ChatMessage, renderChatIds } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { ChatChild } from "../support/chat_child.ts";
import { sameBytes, tempDir, tinyModel } from "../support/helpers.ts";

const USER_LINES = ["Hello there!", "What is 2+2?", "Tell me more, please."];

/** Runs a chat over `lines` (then EOF); returns exit code and output. */
async function chat(args: string[], lines: string[]) {
  const child = new ChatChild(args);
  for (const line of lines) await child.send(line);
  const code = await child.finish();
  return { code, stdout: child.stdout, stderr: child.stderr };
}

function readJsonl(text: string): (ChatMessage & Record<string, unknown>)[] {
  return text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
}

/** The assistant message a full re-prefill of `messages` gives (greedy, thinking on). */
async function freshAnswer(
  model: Model,
  tokenizer: Tokenizer,
  messages: ChatMessage[],
  maxTokens: number,
) {
  const { ids } = renderChatIds(tokenizer, messages, { thinking: true });
  const stopIds = stopIdsOf(model, tokenizer);
  const out: number[] = [];
  for await (const s of generate(model, ids, { maxTokens, stopIds })) {
    if (!s.stop) out.push(s.token);
  }
  const parsed = parseOutput(tokenizer.decode(out), { thinking: true });
  return { content: parsed.content, reasoning_content: parsed.reasoning };
}

Deno.test("retained-state gate: 3 chat turns equal full re-prefill, byte for byte", async () => {
  const dir = await tinyModel({ seed: 11 });
  const tokenizer = await Tokenizer.load(dir);
  const model = await Model.open(dir);
  try {
    const session = new Session(model);
    const stopIds = stopIdsOf(model, tokenizer);
    const messages: ChatMessage[] = [{ role: "system", content: "Be brief." }];
    const reused: number[] = [], prompts: number[] = [];
    for (const line of USER_LINES) {
      messages.push({ role: "user", content: line });
      const logits: Float32Array[] = [];
      const turn = await runTurn(session, tokenizer, messages, {
        render: { thinking: false },
        sampling: { temperature: 0.8, seed: 5 },
        stopIds,
        stops: [],
        maxTokens: 6,
        onStep: (s) => logits.push(s.logits),
      });
      reused.push(turn.reuse.reusedTokens);
      prompts.push(turn.prompt.length);
      // The reference: the same rendered prompt, prefilled from an empty state.
      const { ids } = renderChatIds(tokenizer, messages, { thinking: false });
      assert.deepEqual(turn.prompt, ids);
      const fresh: number[] = [];
      let step = 0;
      const sampler = new Sampler({ temperature: 0.8, seed: 5 });
      for await (const s of generate(model, ids, { maxTokens: 6, stopIds, picker: sampler })) {
        fresh.push(s.token);
        assert.ok(sameBytes(logits[step], s.logits), `turn ${reused.length} step ${step} logits`);
        step++;
      }
      assert.deepEqual(turn.ids, fresh);
      messages.push(turn.message);
    }
    console.log(`reuse per turn: ${reused.map((r, i) => `${r}/${prompts[i]}`).join(", ")}`);
    assert.equal(reused[0], 0);
    assert.equal(reused[1], prompts[0], "turn 2 resumes at the end of turn 1's prompt");
    assert.equal(reused[2], prompts[1], "turn 3 resumes at the end of turn 2's prompt");
  } finally {
    model.close();
    tokenizer.free();
  }
});

Deno.test("k3 chat: piped turns, reuse report, history, /save, SIGKILL, resume", async (t) => {
  const dir = await tinyModel({ seed: 11 });
  const work = tempDir();
  const history = path.join(work, "chat.jsonl");
  const saved = path.join(work, "saved.jsonl");
  const base = [dir, "--history", history, "--max-tokens", "5"];

  await t.step("3 piped turns: answers equal a full re-prefill; reuse reported", async () => {
    const r = await chat(
      [...base, "--system", "Be brief."],
      [USER_LINES[0], USER_LINES[1], `/save ${saved}`, USER_LINES[2]],
    );
    assert.equal(r.code, 0, r.stderr);
    const prompts = [...r.stderr.matchAll(/prompt (\d+) tokens, reused (\d+)/g)]
      .map((m) => [Number(m[1]), Number(m[2])]);
    assert.equal(prompts.length, 3, r.stderr);
    for (const line of USER_LINES) assert.ok(r.stdout.includes(`> ${line}\n`), r.stdout);

    const lines = readJsonl(await Deno.readTextFile(history));
    // With a history file the whole conversation's state is kept after each turn, so each
    // turn prefills only its new message: it reuses the rendering of everything before it.
    const conversation = async (n: number) => {
      const tokenizer = await Tokenizer.load(dir);
      try {
        return renderChatIds(tokenizer, lines.slice(0, n), { addGenerationPrompt: false }).ids
          .length;
      } finally {
        tokenizer.free();
      }
    };
    assert.equal(prompts[0][1], 0);
    assert.equal(prompts[1][1], await conversation(3));
    assert.equal(prompts[2][1], await conversation(5));
    assert.deepEqual(lines.map((m) => m.role), [
      "system",
      "user",
      "assistant",
      "user",
      "assistant",
      "user",
      "assistant",
    ]);
    const tokenizer = await Tokenizer.load(dir);
    const model = await Model.open(dir);
    try {
      for (const i of [2, 4, 6]) {
        const expected = await freshAnswer(model, tokenizer, lines.slice(0, i), 5);
        assert.deepEqual(
          { content: lines[i].content, reasoning_content: lines[i].reasoning_content },
          expected,
          `answer ${i / 2}`,
        );
      }
    } finally {
      model.close();
      tokenizer.free();
    }
    // /save came after two turns: the conversation up to there, the same JSON.
    assert.deepEqual(readJsonl(await Deno.readTextFile(saved)), lines.slice(0, 5));
  });

  await t.step(
    "a new chat resumes from the state file: only the new message is prefilled",
    async () => {
      const r = await chat(base, ["One more?"]);
      assert.equal(r.code, 0, r.stderr);
      const lines = readJsonl(await Deno.readTextFile(history));
      const tokenizer = await Tokenizer.load(dir);
      const model = await Model.open(dir);
      try {
        const before = renderChatIds(tokenizer, lines.slice(0, 7), { addGenerationPrompt: false });
        assert.match(
          r.stderr,
          new RegExp(`resuming ${before.ids.length} of ${before.ids.length} tokens`),
        );
        assert.match(
          r.stderr,
          new RegExp(`turn 4: prompt \\d+ tokens, reused ${before.ids.length} `),
        );
        // The answer is a full re-prefill's.
        const expected = await freshAnswer(model, tokenizer, lines.slice(0, 8), 5);
        assert.deepEqual(
          { content: lines[8].content, reasoning_content: lines[8].reasoning_content },
          expected,
        );
      } finally {
        model.close();
        tokenizer.free();
      }
      // Drop the last exchange again, so the steps below see the 7 lines they expect.
      const text = await Deno.readTextFile(history);
      await Deno.writeTextFile(history, text.split("\n").slice(0, 7).join("\n") + "\n");
    },
  );

  await t.step("a bad state file beside the history: a warning, then a full prefill", async () => {
    const state = `${history}.state`;
    const good = await Deno.readFile(state);
    for (const bad of [good.subarray(0, good.length - 7), new TextEncoder().encode("{}")]) {
      await Deno.writeFile(state, bad);
      const r = await chat(base, ["/exit"]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stderr, /warning: state .*chat\.jsonl\.state not used: .*prefills in full/);
    }
    await Deno.writeFile(state, good);
  });

  await t.step(
    "--system when resuming: silent if it is the history's own, else a warning",
    async () => {
      const before = await Deno.readTextFile(history);
      const same = await chat([...base, "--system", "Be brief."], ["/exit"]);
      assert.equal(same.code, 0, same.stderr);
      assert.doesNotMatch(same.stderr, /--system/);
      const other = await chat([...base, "--system", "Be verbose."], ["/exit"]);
      assert.equal(other.code, 0, other.stderr);
      assert.match(other.stderr, /warning: --system ignored: .*chat\.jsonl already holds/);
      assert.equal(await Deno.readTextFile(history), before, "the history is unchanged");
    },
  );

  await t.step("SIGKILL mid-turn: earlier lines intact, the chat resumes", async () => {
    const before = await Deno.readFile(history);
    const child = new ChatChild([
      dir,
      "--history",
      history,
      "--max-tokens",
      "30000",
      "--thinking",
      "off",
    ]);
    await child.send("Go on at length.");
    await child.waitFor("stdout", /length\.\n./); // the answer is streaming
    child.process.kill("SIGKILL");
    await child.finish();
    const after = await Deno.readFile(history);
    assert.deepEqual(after.subarray(0, before.length), before, "earlier bytes unchanged");
    const lines = readJsonl(new TextDecoder().decode(after));
    assert.equal(lines.length, 8);
    assert.deepEqual(
      lines.at(-1),
      { role: "user", content: "Go on at length." },
      "killed mid-turn",
    );

    const r = await chat([...base, "--thinking", "off"], ["And now?"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /8 messages \(4 user turns\) loaded/);
    assert.match(r.stderr, /has no answer/);
    const resumed = readJsonl(await Deno.readTextFile(history));
    assert.deepEqual(resumed.slice(0, 8), lines);
    assert.deepEqual(resumed.slice(8).map((m) => m.role), ["user", "assistant"]);
  });

  await t.step("a truncated last line is reported, left in place, and skipped later", async () => {
    const good = await Deno.readTextFile(history);
    const torn = good + '{"role":"assistant","content":"hal';
    await Deno.writeTextFile(history, torn);
    const r = await chat([...base, "--thinking", "off"], ["Still there?"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /chat\.jsonl:11: the last line is not a complete message/);
    const text = await Deno.readTextFile(history);
    assert.ok(text.startsWith(torn + "\n"), "the torn line stays, byte for byte");
    const added = readJsonl(text.slice(torn.length + 1));
    assert.equal(added[0].resumes_after_bad_line, 11);
    assert.deepEqual(added.map((m) => m.role), ["user", "assistant"]);

    const again = await chat([...base], ["/exit"]);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stderr, /chat\.jsonl:11: skipping a bad line/);
    assert.match(again.stderr, /12 messages/);
  });

  await t.step("a bad line in the middle is an error naming file and line", async () => {
    const lines = (await Deno.readTextFile(history)).split("\n");
    lines[2] = lines[2].slice(0, 10);
    await Deno.writeTextFile(history, lines.join("\n"));
    const r = await chat([...base], ["hi"]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /chat\.jsonl:3: not a chat message/);
  });
});

Deno.test("k3 chat: Ctrl-C stops an answer and keeps it; Ctrl-C at the prompt leaves", async () => {
  const dir = await tinyModel({ seed: 11 });
  const history = path.join(tempDir(), "chat.jsonl");
  // Streamed with one ring slot and one thread, the greedy answer to "Keep going" on this
  // model is 1932 tokens, tens of seconds: still running when the signal comes.
  const slow = ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1", "--threads", "1"];
  const flags = ["--history", history, "--thinking", "off", ...slow];
  const child = new ChatChild([dir, ...flags]);
  await child.send("Keep going");
  await child.waitFor("stdout", /going\n./); // the answer is streaming
  child.process.kill("SIGINT");
  await child.waitFor("stderr", /interrupted: kept what was generated/);
  await child.waitFor("stdout", /\n$/);
  child.process.kill("SIGINT"); // now at the prompt
  await child.waitFor("stderr", /Ctrl-C at the prompt: leaving/); // before stdin closes
  assert.equal(await child.finish(), 130, child.stderr);
  const lines = readJsonl(await Deno.readTextFile(history));
  assert.deepEqual(lines.map((m) => m.role), ["user", "assistant"]);
  assert.equal(lines[1].interrupted, true);
  assert.ok(String(lines[1].content).length > 0, "the partial answer is kept");
});

Deno.test("history file: loader and writer (no model)", async () => {
  const file = path.join(tempDir(), "h.jsonl");
  assert.deepEqual((await loadHistory(file)).messages, [], "absent = empty");
  const loaded = await loadHistory(file);
  const writer = HistoryWriter.continuing(file, loaded);
  await writer.append({ role: "user", content: "ünïcode 👋" });
  await writer.append({ role: "assistant", content: "ok", interrupted: true });
  const back = await loadHistory(file);
  assert.deepEqual(back.messages, [
    { role: "user", content: "ünïcode 👋" },
    { role: "assistant", content: "ok", interrupted: true },
  ]);
  // A line cut inside a multi-byte character is a bad last line, not a crash.
  const bytes = await Deno.readFile(file);
  await Deno.writeFile(file, bytes.subarray(0, bytes.indexOf(0xf0) + 2));
  const torn = await loadHistory(file);
  assert.equal(torn.badLastLine, 1);
  assert.equal(torn.messages.length, 0);
  // A wrong role in the middle is refused.
  await Deno.writeTextFile(file, '{"role":"wizard"}\n{"role":"user","content":"x"}\n');
  await assert.rejects(() => loadHistory(file), (e: unknown) => {
    assert.ok(e instanceof K3Error && e.exitCode === 2);
    assert.match((e as Error).message, /h\.jsonl:1: .*role/);
    return true;
  });
});
