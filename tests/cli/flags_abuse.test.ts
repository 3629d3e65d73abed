/**
 * Flag values an attacker or a typo gives: each a named error,
 * exit 2, before anything is loaded or generated; never a TypeError or exit 1.
 */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";
import { leastChatTokens, renderChatIds } from "../../lib/text/chat.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");
const RUN = ["--ids", "5,17", "--gen", "1"];

/** `k3 ARGS` with `input` on stdin. */
async function withStdin(args: string[], input: string) {
  const child = new Deno.Command(K3, {
    args,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(input));
  await w.close();
  const out = await child.output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

Deno.test("chat honours --context: a conversation over it is refused with exit 2", async () => {
  const dir = await tinyModel({ seed: 5 });
  const long = "word ".repeat(200);
  const r = await withStdin(["chat", dir, "--context", "16", "--max-tokens", "4"], long + "\n");
  assertEquals(r.code, 2, r.stderr);
  assert(
    /^k3: the conversation is (at least )?\d+ tokens and --max-tokens is 4: together over --context 16/m
      .test(
        r.stderr,
      ),
    r.stderr,
  );
  // The answer budget counts too: a short prompt with --max-tokens over the context.
  const budget = await withStdin(["chat", dir, "--context", "64", "--max-tokens", "100"], "hi\n");
  assertEquals(budget.code, 2, budget.stderr);
  assert(/over --context 64/.test(budget.stderr), budget.stderr);
  // Within the context: answered.
  const ok = await withStdin(["chat", dir, "--context", "256", "--max-tokens", "4"], "hi\n");
  assertEquals(ok.code, 0, ok.stderr);
});

Deno.test("chat refuses a message far over --context before tokenising it", async () => {
  const dir = await tinyModel({ seed: 5 });
  // The bound never says more than the real count (so it never refuses a turn that fits).
  const tok = await Tokenizer.load(dir);
  try {
    let seed = 7;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const alphabet = ["a", "Z", " ", "\n", "7", "é", "中", "😀", "<|im_end|>", "word", "  "];
    const longest = Array.from({ length: tok.vocabSize }, (_, id) => tok.idToBytes(id))
      .filter((_, id) => !tok.isSpecial(id))
      .reduce((a, b) => (b.length > a.length ? b : a));
    const texts = [new TextDecoder().decode(longest).repeat(50), ""];
    for (let i = 0; i < 200; i++) {
      texts.push(
        Array.from(
          { length: 1 + Math.floor(rand() * 300) },
          () => alphabet[Math.floor(rand() * alphabet.length)],
        ).join(""),
      );
    }
    for (const text of texts) {
      const messages = [{ role: "system", content: "s" }, { role: "user", content: text }];
      const render = { addGenerationPrompt: true };
      const least = leastChatTokens(tok, messages, render);
      const real = renderChatIds(tok, messages, render).ids.length;
      assert(least <= real, `${least} > ${real} for ${JSON.stringify(text.slice(0, 40))}`);
    }
  } finally {
    tok.free();
  }
  // 16 MB typed on stdin: refused at once, not after a minute of tokenising.
  const t0 = performance.now();
  const r = await withStdin(["chat", dir, "--max-tokens", "4"], "x".repeat(16 << 20) + "\n");
  const seconds = (performance.now() - t0) / 1000;
  assertEquals(r.code, 2, r.stderr);
  assert(
    /the conversation is at least \d+ tokens .* over --context 32768/.test(r.stderr),
    r.stderr,
  );
  assert(seconds < 30, `took ${seconds.toFixed(1)} s`);
});

Deno.test("Object.prototype names are not policies or commands", async () => {
  const dir = await tinyModel({ seed: 5 });
  for (const name of ["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"]) {
    const r = await runK3(["run", dir, ...RUN, "--cache-policy", name]);
    assertEquals(r.code, 2, `${name}: ${r.stderr}`);
    assert(
      new RegExp(`^k3: --cache-policy: unknown policy '${name}'`, "m").test(r.stderr),
      r.stderr,
    );
    const c = await runK3([name]);
    assertEquals(c.code, 2, `command ${name}: ${c.stderr}`);
    assert(/unknown command/.test(c.stderr), c.stderr);
  }
});

Deno.test("--memory-max 0, negative or non-finite: exit 2", async () => {
  const dir = await tinyModel({ seed: 5 });
  for (const v of ["0", "0.0", "-1", "-0", "NaN", "Infinity", "1e400", "", "abc"]) {
    const r = await runK3(["run", dir, ...RUN, `--memory-max=${v}`]);
    assertEquals(r.code, 2, `--memory-max '${v}': ${r.stderr}`);
    assert(/^k3: --memory-max wants a number/m.test(r.stderr), r.stderr);
  }
});

Deno.test("max_position_embeddings is a context ceiling for run and chat", async () => {
  const model = await tinyModel({ seed: 5 });
  const dir = path.join(tempDir(), "m");
  await Deno.mkdir(dir);
  for await (const e of Deno.readDir(model)) {
    if (e.name !== "config.json") await Deno.link(path.join(model, e.name), path.join(dir, e.name));
  }
  const config = JSON.parse(await Deno.readTextFile(path.join(model, "config.json")));
  config.text_config.max_position_embeddings = 8;
  await Deno.writeTextFile(path.join(dir, "config.json"), JSON.stringify(config));
  const fits = await runK3(["run", dir, "--ids", "5,17", "--gen", "6", "--ignore-eos"]);
  assertEquals(fits.code, 0, fits.stderr);
  const over = await runK3(["run", dir, "--ids", "5,17", "--gen", "7"]);
  assertEquals(over.code, 2, over.stderr);
  assert(/^k3: the run needs 9 positions .*max_position_embeddings .* is 8/m.test(over.stderr));
  const chat = await withStdin(["chat", dir], "hi\n");
  assertEquals(chat.code, 2, chat.stderr);
  assert(/^k3: the run needs 32768 positions/m.test(chat.stderr), chat.stderr);
});
