/**
 * What `k3 chat` shows at a real terminal (a tmux pane) around the conversation: a start line
 * naming the model, the preset and /help; "thinking…" standing in for hidden reasoning
 * (replaced by the answer at a terminal, its own line in a transcript); Ctrl-L clearing the
 * screen and keeping the line being typed.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { AnswerPrinter, THINKING } from "../../lib/chat/display.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";
import { requireTools, skipWithout, TMUX } from "../support/tools.ts";
import { Tty } from "../support/tty.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");

/** The screen shows an empty prompt on its last line. */
const atPrompt = (screen: string) => screen.trimEnd().split("\n").at(-1) === ">";

const START = "k3 chat at a terminal: start line, thinking… for hidden reasoning, Ctrl-L";

Deno.test({
  name: START,
  ignore: skipWithout(START, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 11 });
    const history = path.join(tempDir(), "talk.jsonl");
    const tty = await Tty.start(
      [K3, "chat", dir, "--history", history, "--hide-reasoning", "--max-tokens", "6"],
      { cols: 200 },
    );
    try {
      let screen = await tty.waitFor(atPrompt);
      const start = new RegExp(
        `^k3 chat: ${dir}, preset auto \\([\\d.]+ [KMG]B planned\\), context 32768, thinking on ` +
          `\\(effort max\\); /help for commands, Ctrl-D to leave$`,
        "m",
      );
      assert.match(screen, start);
      await tty.type("Hello there!");
      await tty.keys("Enter");
      screen = await tty.waitFor((s) => /^turn 1: prefill/m.test(s) && atPrompt(s));
      const answer = JSON.parse(Deno.readTextFileSync(history).trim().split("\n").at(-1)!);
      assert.ok(answer.reasoning_content.length > 0, "the model reasoned");
      const lines = screen.split("\n");
      const shown = lines[lines.findIndex((l) => l.startsWith("turn 1: prompt")) + 1];
      if (answer.content === "") {
        // (With its seconds, on a machine slow enough to think for one.)
        assert.match(shown, new RegExp(`^${THINKING}( \\d+ s)?$`), "all thinking: it stays");
      } else {
        assert.equal(shown, answer.content, "the answer replaced the indicator");
      }
      assert.ok(!screen.includes(answer.reasoning_content), "the reasoning stays hidden");

      // Ctrl-L: the visible screen is cleared; the line being typed is kept, at the top.
      await tty.type("abc");
      await tty.keys("C-l");
      const visible = async () => (await tty.tmux("capture-pane", "-p")).trimEnd();
      const until = Date.now() + 10_000;
      while ((await visible()) !== "> abc" && Date.now() < until) {
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.equal(await visible(), "> abc");
      await tty.keys("C-u", "C-d");
      assert.equal(await tty.exitCode(), 0, await tty.screen());
    } finally {
      await tty.close();
    }
  },
});

Deno.test("hidden reasoning: thinking… erased by the answer at a terminal, a line of its own elsewhere", async () => {
  const printed = async (erasable: boolean, deltas: [string, string][]) => {
    let out = "";
    const write = (t: string) => {
      out += t;
      return Promise.resolve();
    };
    const printer = new AnswerPrinter(write, "hide", { erasable });
    for (const [reasoning, content] of deltas) await printer.show({ reasoning, content });
    await printer.end();
    return out;
  };
  const answer: [string, string][] = [["let me", ""], [" think", ""], ["", "Paris."]];
  assert.equal(await printed(true, answer), `${THINKING}\r\x1b[KParis.\n`);
  assert.equal(await printed(false, answer), `${THINKING}\nParis.\n`);
  assert.equal(await printed(true, [["all", ""], [" thinking", ""]]), `${THINKING}\n`);
  assert.equal(await printed(true, [["", "Direct."]]), "Direct.\n");
  // A long think at a terminal counts its seconds, one redraw per whole second.
  let clock = 0;
  let out = "";
  const counting = new AnswerPrinter(
    (t) => {
      out += t;
      return Promise.resolve();
    },
    "hide",
    { erasable: true, now: () => clock },
  );
  for (const at of [0, 400, 1200, 1900, 2100, 2200]) {
    clock = at;
    await counting.show({ reasoning: "hm", content: "" });
  }
  await counting.show({ reasoning: "", content: "Done." });
  assert.equal(out, `${THINKING}\r\x1b[K${THINKING} 1 s\r\x1b[K${THINKING} 2 s\r\x1b[KDone.`);
});
