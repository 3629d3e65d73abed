/**
 * Ctrl-C during a chat's prefill: the prefill stops within a layer, no token is made, the
 * prompt returns at once (nothing is run again to save the state), the state kept is the
 * prompt as far as whole passes ran, byte for byte a fresh prefill's, and a chat resumed
 * from it answers as a fresh run over the same conversation does.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { conversationState, runTurn } from "../../lib/chat/turn.ts";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { generate } from "../../lib/generate/decode.ts";
import { Session } from "../../lib/generate/session.ts";
import { Model } from "../../lib/model/model.ts";
import type { SequenceState } from "../../lib/model/state.ts";
import { readStateFile } from "../../lib/model/state_file.ts";
import { checkpointIdentity } from "../../lib/model/state_file.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { type ChatMessage, renderChatIds } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { ChatChild } from "../support/chat_child.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";
import { openUnder, sameState } from "../support/spec_helpers.ts";

/** A message of about `words` x 3.7 tokens on the tiny model's tokenizer. */
function longMessage(words: number): string {
  return Array.from({ length: words }, (_, i) => `word${i % 97}`).join(" ");
}

/** Asserts `state` equals a fresh prefill of its own tokens. */
async function freshlyPrefilled(model: Model, state: SequenceState, what: string) {
  const fresh = model.newState(state.position);
  await model.forward.forward(fresh, state.tokens);
  sameState(state, fresh, what);
}

Deno.test("a turn stopped during its prefill: no token, whole passes kept, nothing rerun", async () => {
  const dir = await tinyModel({ seed: 11 });
  const tokenizer = await Tokenizer.load(dir);
  // Passes of at most 16 tokens, so a 150-token prompt takes several.
  const model = await openUnder(dir, {}, 16);
  try {
    assert.equal(model.forward.maxTokens, 16);
    const session = new Session(model, { passTokens: 16 });
    const messages: ChatMessage[] = [{ role: "user", content: longMessage(40) }];
    // Ctrl-C as the third pass starts: it stops before its first layer.
    const stop = new AbortController();
    let passes = 0;
    const forwardMany = model.forward.forwardMany.bind(model.forward);
    model.forward.forwardMany = (seqs, options) => {
      if (++passes === 3) stop.abort();
      return forwardMany(seqs, options);
    };
    const render = { thinking: false };
    const turn = await runTurn(session, tokenizer, messages, {
      render,
      sampling: {},
      stopIds: stopIdsOf(model, tokenizer),
      stops: [],
      maxTokens: 4,
      signal: stop.signal,
    });
    model.forward.forwardMany = forwardMany;
    assert.equal(passes, 3, "no pass after the stopped one");
    assert.equal(turn.finish, "interrupted");
    assert.deepEqual(turn.ids, [], "no token after a stopped prefill");
    assert.deepEqual(turn.prefill.tokens, 32, "two whole passes of 16");
    assert.equal(turn.decode.tokens, 0);
    const state = turn.state!;
    assert.deepEqual(state.tokens, turn.prompt.slice(0, 32));
    await freshlyPrefilled(model, state, "the interrupted turn's state");

    // After the interrupted turn, the conversation's state runs nothing: it is that state.
    messages.push(turn.message);
    let ran = 0;
    model.forward.forwardMany = (seqs, options) => (ran++, forwardMany(seqs, options));
    const built = await conversationState(session, tokenizer, messages, render, state, stop.signal);
    model.forward.forwardMany = forwardMany;
    assert.equal(ran, 0);
    assert.equal(built.state, state);
    assert.equal(built.prefilled, 0);

    // A conversation state built from nothing, stopped after the first layer of its third
    // pass: the two passes before it, a prefix of the conversation, byte for byte a fresh
    // prefill's.
    const later = new AbortController();
    let layers = 0;
    const third = 2 * model.forward.layers + 1;
    model.forward.forwardMany = (seqs, options) =>
      forwardMany(seqs, {
        ...options,
        betweenLayers: async () => {
          if (++layers === third) later.abort();
          await options?.betweenLayers?.();
        },
      });
    const partial = await conversationState(
      new Session(model),
      tokenizer,
      messages,
      render,
      undefined,
      later.signal,
    );
    model.forward.forwardMany = forwardMany;
    assert.equal(layers, third, "no layer ran after the stop");
    assert.equal(partial.prefilled, 32);
    const whole = renderChatIds(tokenizer, messages, { ...render, addGenerationPrompt: false });
    assert.deepEqual(partial.state.tokens, whole.ids.slice(0, 32));
    await freshlyPrefilled(model, partial.state, "a stopped conversation state");
  } finally {
    model.close();
    tokenizer.free();
  }
});

Deno.test("Ctrl-C as the prefill's last pass ends: the prompt is kept, no token is picked", async () => {
  const dir = await tinyModel({ seed: 11 });
  const tokenizer = await Tokenizer.load(dir);
  const model = await Model.open(dir);
  try {
    const session = new Session(model);
    const stop = new AbortController();
    const forwardMany = model.forward.forwardMany.bind(model.forward);
    model.forward.forwardMany = async (seqs, options) => {
      const rows = await forwardMany(seqs, options);
      stop.abort(); // after the pass, before the token is picked
      return rows;
    };
    const turn = await runTurn(session, tokenizer, [{ role: "user", content: "Hello there!" }], {
      render: { thinking: false },
      sampling: {},
      stopIds: stopIdsOf(model, tokenizer),
      stops: [],
      maxTokens: 4,
      signal: stop.signal,
    });
    model.forward.forwardMany = forwardMany;
    assert.equal(turn.finish, "interrupted");
    assert.deepEqual(turn.ids, [], "no token");
    assert.equal(turn.prefill.tokens, turn.prompt.length);
    assert.deepEqual(turn.state!.tokens, turn.prompt);
    await freshlyPrefilled(model, turn.state!, "the whole prompt");
  } finally {
    model.close();
    tokenizer.free();
  }
});

/** Greedy answer of a fresh run over `messages` (thinking off), parsed. */
async function freshAnswer(dir: string, messages: ChatMessage[], maxTokens: number) {
  const tokenizer = await Tokenizer.load(dir);
  const model = await Model.open(dir);
  try {
    const { ids } = renderChatIds(tokenizer, messages, { thinking: false });
    const out: number[] = [];
    for await (
      const s of generate(model, ids, { maxTokens, stopIds: stopIdsOf(model, tokenizer) })
    ) {
      if (!s.stop) out.push(s.token);
    }
    return parseOutput(tokenizer.decode(out), { thinking: false }).content;
  } finally {
    model.close();
    tokenizer.free();
  }
}

Deno.test("k3 chat: Ctrl-C during a long prefill gives the prompt back at once", async () => {
  const dir = await tinyModel({ seed: 11 });
  const history = path.join(tempDir(), "chat.jsonl");
  const flags = ["--history", history, "--thinking", "off", "--max-tokens", "3"];
  // About 2,000 tokens: seconds of prefill at least, at one thread, streamed from disk.
  const slow = ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1", "--threads", "1"];
  const child = new ChatChild([dir, ...flags, ...slow]);
  const message = longMessage(540);
  await child.send(message);
  await child.waitFor("stderr", /turn 1: prompt (\d+) tokens/);
  const promptTokens = Number(child.stderr.match(/turn 1: prompt (\d+) tokens/)![1]);
  await new Promise((r) => setTimeout(r, 800)); // a few passes run (on a busy machine, none)
  child.process.kill("SIGINT");
  const t0 = performance.now();
  await child.send("/help"); // answered once the prompt is back
  await child.waitFor("stderr", /commands:/);
  const seconds = (performance.now() - t0) / 1000;
  const line = child.stderr.match(/^turn 1: prefill .*$/m)![0];
  assert.equal(await child.finish(), 0, child.stderr);

  const m = line.match(
    /^turn 1: prefill (\d+) of (\d+) tokens in ([\d.]+) s .*, decode 0 tokens in 0\.00 s, interrupted/,
  );
  assert.ok(m, line);
  const [done, asked, prefillSeconds] = [Number(m[1]), Number(m[2]), Number(m[3])];
  assert.equal(asked, promptTokens);
  // The whole prefill at the rate the stopped one ran would have taken `whole` seconds.
  const whole = done > 0 ? (promptTokens * prefillSeconds) / done : Infinity;
  console.log(
    `Ctrl-C -> prompt ${seconds.toFixed(2)} s; prefilled ${done} of ${promptTokens} tokens ` +
      `in ${prefillSeconds} s (whole prefill about ${whole.toFixed(0)} s)`,
  );
  assert.ok(done < promptTokens, `the prefill was stopped before its end: ${line}`);
  assert.ok(seconds < 5, `Ctrl-C -> prompt took ${seconds.toFixed(2)} s`);
  assert.ok(seconds < whole / 4, "far below the time of the whole prefill");
  assert.equal(child.stdout, `> ${message}\n\n> /help\n`, "no answer text: no token was made");

  const lines = Deno.readTextFileSync(history).split("\n").filter((l) => l).map((l) =>
    JSON.parse(l)
  );
  assert.deepEqual(lines, [
    { role: "user", content: message },
    { role: "assistant", content: "", interrupted: true },
  ]);

  // The state kept: the prompt's first passes, byte for byte a fresh prefill of them.
  const tokenizer = await Tokenizer.load(dir);
  const model = await Model.open(dir);
  try {
    const identity = await checkpointIdentity(await openCheckpoint(dir));
    const saved = await readStateFile(`${history}.state`, model.config, identity);
    if (done === 0) {
      assert.ok(!saved.ok, "no pass ran: no state is written");
    } else {
      assert.ok(saved.ok, "the state file is written");
      assert.equal(saved.state.position, done);
      const prompt = renderChatIds(tokenizer, lines.slice(0, 1), { thinking: false }).ids;
      assert.deepEqual(saved.state.tokens, prompt.slice(0, done));
      await freshlyPrefilled(model, saved.state, "the saved state");
    }
  } finally {
    model.close();
    tokenizer.free();
  }

  // A chat resumed from it answers as a fresh run over the whole conversation.
  const again = new ChatChild([dir, ...flags]);
  await again.send("Go on");
  assert.equal(await again.finish(), 0, again.stderr);
  if (done > 0) assert.match(again.stderr, new RegExp(`resuming ${done} of \\d+ tokens`));
  const all = Deno.readTextFileSync(history).split("\n").filter((l) => l).map((l) => JSON.parse(l));
  assert.deepEqual(all.map((x) => x.role), ["user", "assistant", "user", "assistant"]);
  assert.equal(all[3].content, await freshAnswer(dir, all.slice(0, 3), 3));
});
