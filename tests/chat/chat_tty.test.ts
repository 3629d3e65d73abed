/**
 * `k3 chat` at a real terminal (a tmux pane): keys are typed, the screen is read.
 * Line editing, input history across chats, bracketed paste, continued lines, typed-ahead
 * text during an answer, Ctrl-C and Ctrl-D. Also the terminal-safe display of model output.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { AnswerPrinter, terminalSafe } from "../../lib/chat/display.ts";
import { Continuation, PasteSplitter } from "../../lib/chat/input.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";
import { requireTools, skipWithout, TMUX } from "../support/tools.ts";
import { Tty } from "../support/tty.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");

function users(historyFile: string): string[] {
  return Deno.readTextFileSync(historyFile).split("\n").filter((l) => l)
    .map((l) => JSON.parse(l)).filter((m) => m.role === "user").map((m) => m.content);
}

/** The screen shows an empty prompt on its last line. */
const atPrompt = (screen: string) => screen.trimEnd().split("\n").at(-1) === ">";

/** Counts the turns the chat has finished (its stderr shares the pane). */
const finished = (screen: string) =>
  [...screen.matchAll(/^turn \d+: prefill \d+.*, decode \d+ tokens in/gm)].length;

const EDITING = "k3 chat at a terminal: editing keys, history recall across chats, paste, Ctrl-D";

Deno.test({
  name: EDITING,
  ignore: skipWithout(EDITING, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 11 });
    const history = path.join(tempDir(), "talk.jsonl");
    const args = [K3, "chat", dir, "--history", history, "--max-tokens", "3", "--thinking", "off"];
    const tty = await Tty.start(args);
    try {
      let turns = 0;
      /** Presses Enter and waits for the answer to finish and the prompt to return. */
      const send = async (...keys: string[]) => {
        await tty.keys(...keys, "Enter");
        turns++;
        await tty.waitFor((s) => finished(s) === turns && atPrompt(s));
      };
      await tty.waitFor(atPrompt);

      // Arrows and Home/End move inside the line; nothing of them reaches the message.
      await tty.type("helo world");
      await send("Home", "Right", "Right", "Right", "l", "End", " again");
      // Ctrl-W deletes a word, Ctrl-A/Ctrl-E jump, Ctrl-U and Ctrl-K cut.
      await tty.type("abc def ghi");
      await send("C-w", "X", "C-a", "Q", "C-e", "E");
      await tty.type("drop me");
      await tty.keys("C-u");
      await tty.type("keep tail");
      await send("Left", "Left", "Left", "Left", "Left", "C-k", " end");
      // Up recalls earlier lines, Down comes back.
      await send("Up", "Up", "Up", "Down");
      assert.deepEqual(users(history), [
        "hello world again",
        "Qabc def XE",
        "keep end",
        "Qabc def XE",
      ]);

      // A paste of several lines is one message: shown as continued lines, sent by Enter.
      await tty.paste("pasted one\npasted two\npasted three\n");
      let screen = await tty.waitFor(/^\.\.\. pasted three$/m);
      assert.match(screen, /^> pasted one\\\n\.\.\. pasted two\\\n\.\.\. pasted three$/m);
      assert.equal(finished(screen), turns, "the paste alone sends nothing");
      await send();
      // Typed: a line ending in a backslash continues; so does Alt-Enter.
      await tty.type("first\\");
      await tty.keys("Enter");
      await tty.type("second");
      await send();
      await tty.type("alpha");
      await tty.keys("M-Enter");
      await tty.type("beta");
      await send();
      assert.deepEqual(users(history).slice(4), [
        "pasted one\npasted two\npasted three",
        "first\nsecond",
        "alpha\nbeta",
      ]);
      screen = await tty.screen();
      assert.doesNotMatch(screen, /\[20[01]~/, "no paste markers on the screen");

      // Ctrl-D at an empty prompt leaves with a newline ([exit 0] starts its own line).
      await tty.keys("C-d");
      assert.equal(await tty.exitCode(), 0, await tty.screen());
    } finally {
      await tty.close();
    }
    const inputs = await Deno.readTextFile(`${history}.input-history`);
    assert.ok(inputs.endsWith("alpha\\\nbeta\n"), inputs);

    // A new chat on the same history recalls the last chat's lines with Up.
    const again = await Tty.start(args);
    try {
      await again.waitFor(atPrompt);
      await again.keys("Up");
      await again.waitFor(/^> beta$/m);
      await again.keys("Up", "Up", "Up");
      await again.waitFor(/^> first\\$/m);
      await again.keys("C-u", "C-d");
      assert.equal(await again.exitCode(), 0);
    } finally {
      await again.close();
    }
  },
});

const TYPE_AHEAD = "k3 chat at a terminal: keys typed during an answer wait for the prompt; Ctrl-C";

Deno.test({
  name: TYPE_AHEAD,
  ignore: skipWithout(TYPE_AHEAD, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 11 });
    const history = path.join(tempDir(), "talk.jsonl");
    // Streamed from disk with one ring slot, one thread: the greedy answer to "Keep going" on
    // this model is 1932 tokens, tens of seconds here, so it is still running when we type.
    const tty = await Tty.start([
      K3,
      "chat",
      dir,
      "--history",
      history,
      "--thinking",
      "off",
      "--pin-layers",
      "0",
      "--ring-slots",
      "1",
      "--cache-slots",
      "1",
      "--threads",
      "1",
    ]);
    try {
      await tty.waitFor(atPrompt);
      await tty.type("Keep going");
      await tty.keys("Enter");
      // The answer is streaming: some text after the prompt line.
      await tty.waitFor(/^> Keep going\nturn 1: prompt .*\n.{20}/m);
      await tty.type("TYPED-AHEAD");
      await new Promise((r) => setTimeout(r, 300));
      assert.doesNotMatch(await tty.screen(), /TYPED/, "typed text is not echoed into the answer");
      await tty.keys("C-c");
      const screen = await tty.waitFor(/^> TYPED-AHEAD$/m);
      assert.match(
        screen,
        /turn 1: prefill \d+ .*, decode \d+ .*interrupted: kept what was generated/,
      );
      const answer = screen.slice(screen.indexOf("> Keep going"), screen.indexOf("> TYPED"));
      assert.doesNotMatch(answer, /TYPED/);
      // The held text is an ordinary line: Ctrl-C drops it, as in a shell.
      await tty.keys("C-c");
      await tty.waitFor(/^> TYPED-AHEAD\^C\n> ?$/m);
      // Ctrl-C at an empty prompt leaves.
      await tty.keys("C-c");
      assert.equal(await tty.exitCode(), 130, await tty.screen());
    } finally {
      await tty.close();
    }
    const lines = Deno.readTextFileSync(history).split("\n").filter((l) => l)
      .map((l) => JSON.parse(l));
    assert.deepEqual(lines.map((m) => m.role), ["user", "assistant"]);
    assert.equal(lines[1].interrupted, true);
    assert.doesNotMatch(lines[1].content, /TYPED/);
  },
});

Deno.test("model output reaches the terminal escaped: no control characters but \\n and \\t", async () => {
  assert.equal(terminalSafe("a\tb\nc"), "a\tb\nc");
  assert.equal(
    terminalSafe("x\x0ey\x0bz\r\x1b[2J\x07\x7f"),
    "x\\x0ey\\x0bz\\x0d\\x1b[2J\\x07\\x7f",
  );
  assert.equal(terminalSafe("\u009b31m ünï 👋"), "\\u009b31m ünï 👋");
  let out = "";
  const printer = new AnswerPrinter((t) => Promise.resolve(void (out += t)), "label");
  await printer.show({ reasoning: "think\x1b]0;title\x07", content: "" });
  await printer.show({ reasoning: "", content: "answer\x0e\x00" });
  await printer.end();
  assert.equal(out, "[reasoning] think\\x1b]0;title\\x07\nanswer\\x0e\\x00\n");
});

Deno.test("continued lines and bracketed paste, without a terminal", () => {
  const c = new Continuation();
  assert.equal(c.push("one\\"), undefined);
  assert.equal(c.push("two\\\\"), undefined, "a pasted line ending in \\ keeps it");
  assert.equal(c.push("three"), "one\ntwo\\\nthree");
  assert.equal(c.push("single"), "single");
  c.push("unfinished\\");
  assert.equal(c.flush(), "unfinished");
  const p = new PasteSplitter();
  // Markers split across reads; CRLF, CR and LF all break lines; controls inside are dropped.
  assert.equal(p.push("ab\x1b[20"), "ab");
  assert.equal(p.push("0~l1\r\nl2\x07\rl3\n\x1b[2"), "");
  assert.equal(p.push("01~cd\x1b\r"), "l1\\\rl2\\\rl3cd\\\r");
});

const PREFILL_CTRL_C = "k3 chat at a terminal: Ctrl-C during a long pasted prompt's prefill";

Deno.test({
  name: PREFILL_CTRL_C,
  ignore: skipWithout(PREFILL_CTRL_C, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 11 });
    const history = path.join(tempDir(), "talk.jsonl");
    // 2,000 tokens (two bytes each, a token per byte on this tokenizer) in 1,000 characters
    // (the line editor redraws a long line as it grows), streamed from disk at one thread:
    // seconds of prefill at least.
    const message = "жщ".repeat(500);
    const slow = ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1", "--threads", "1"];
    const tty = await Tty.start([
      K3,
      "chat",
      dir,
      "--history",
      history,
      "--thinking",
      "off",
      ...slow,
    ]);
    try {
      await tty.waitFor(atPrompt);
      await tty.paste(message);
      await tty.waitFor((s) => s.trimEnd().endsWith(message));
      await tty.keys("Enter");
      await tty.waitFor(/^turn 1: prompt \d+ tokens/m);
      await new Promise((r) => setTimeout(r, 800)); // a few passes run
      await tty.keys("C-c");
      const t0 = performance.now();
      const screen = await tty.waitFor((s) =>
        /^turn 1: prefill .*interrupted/m.test(s) && atPrompt(s)
      );
      const seconds = (performance.now() - t0) / 1000;
      const line = screen.match(/^turn 1: prefill .*$/m)![0];
      console.log(`Ctrl-C -> prompt ${seconds.toFixed(2)} s: ${line}`);
      assert.ok(seconds < 5, `Ctrl-C -> prompt took ${seconds.toFixed(2)} s`);
      const m = line.match(
        /^turn 1: prefill (\d+) of (\d+) tokens .*, decode 0 tokens in 0\.00 s,/,
      );
      assert.ok(m && Number(m[1]) < Number(m[2]), line);
      // Nothing was answered: the turn lines, the (empty) answer's line end, the prompt.
      const after = screen.slice(screen.lastIndexOf(message) + message.length);
      assert.match(after, /^\nturn 1: prompt \d+ tokens.*\n\nturn 1: prefill .*\n>\s*$/, after);
      // Leaving writes nothing more than what was computed: at once too.
      await tty.keys("C-d");
      assert.equal(await tty.exitCode(5_000), 0, await tty.screen());
    } finally {
      await tty.close();
    }
    const lines = Deno.readTextFileSync(history).split("\n").filter((l) => l)
      .map((l) => JSON.parse(l));
    assert.deepEqual(lines, [
      { role: "user", content: message },
      { role: "assistant", content: "", interrupted: true },
    ]);
  },
});

const PREFILL = "k3 chat at a terminal: a turn's prefill is one line redrawn with its progress";

Deno.test({
  name: PREFILL,
  ignore: skipWithout(PREFILL, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 11 });
    const args = [K3, "chat", dir, "--max-tokens", "2", "--thinking", "off"];
    const tty = await Tty.start(args);
    try {
      await tty.record();
      await tty.waitFor(atPrompt);
      // A message of several hundred tokens: its prefill takes a while even on the tiny model.
      await tty.type("the quick brown fox jumps over the lazy dog ".repeat(25));
      await tty.keys("Enter");
      const screen = await tty.waitFor((s) => finished(s) === 1 && atPrompt(s));
      // Loading was one line, redrawn in place.
      assert.equal(screen.split("\n").filter((l) => l.startsWith("loading [")).length, 1, screen);
      // What stays on the screen: the line, ended with the prefill's time.
      assert.match(screen, /^turn 1: prompt (\d+) tokens \(0 reused\), prefilled in \d+\.\ds$/m);
      const prompt = Number(screen.match(/^turn 1: prompt (\d+) tokens/m)![1]);
      assert.ok(prompt > 200, `${prompt} tokens`);
      // What was drawn meanwhile: the bar from 0, redrawn in place (\r), never a new line.
      const raw = tty.recorded();
      const draws = [
        ...raw.matchAll(
          // deno-lint-ignore no-control-regex
          /\r\x1b\[Kturn 1: prompt \d+ tokens \(0 reused\): prefill \[[#.]{20}\] (\d+)\/(\d+)/g,
        ),
      ];
      assert.ok(draws.length >= 1, `no prefill bar drawn:\n${JSON.stringify(raw)}`);
      assert.equal(Number(draws[0][1]), 0, "the bar shows at once, from 0");
      for (const d of draws) assert.equal(Number(d[2]), prompt);
      console.log(`prefill of ${prompt} tokens: ${draws.length} draws of the bar`);
      assert.ok(
        // deno-lint-ignore no-control-regex
        !/prefill \[[#.]{20}\] \d+\/\d+[^\r\x1b]*\n/.test(raw),
        "the bar never ends a line",
      );
      await tty.keys("C-d");
      assert.equal(await tty.exitCode(), 0);
    } finally {
      await tty.close();
    }
  },
});
