/**
 * `k3 run`'s prompt from wherever a shell user puts it: the argument after MODEL_DIR, piped
 * stdin with no prompt flag, `--prompt-file -`; and its record on stdout with `--out -` (the
 * text then on stderr), so `echo hi | k3 run DIR --out - | jq` works. Each gives the tokens
 * `--prompt` gives; a prompt given twice, split over several arguments or empty is exit 2
 * saying what to type.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { tinyModel } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");

/** `k3 ARGS` with `stdin` piped in (closed at once when empty). */
async function k3(args: string[], stdin = "") {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", "--config", path.join(repo, "deno.json"), "main.ts", ...args],
    cwd: repo,
    env: { NO_COLOR: "1" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(stdin));
  await writer.close();
  const out = await child.output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("k3 run: a positional prompt, piped stdin and --prompt-file - give --prompt's text", async () => {
  const dir = await tinyModel({ seed: 1 });
  const gen = ["--gen", "6", "--ignore-eos", "--quiet"];
  const flag = await k3(["run", dir, "--prompt", "Hello there", ...gen]);
  assert.equal(flag.code, 0, flag.stderr);
  assert.ok(flag.stdout.trim().length > 0);
  const positional = await k3(["run", dir, "Hello there", ...gen]);
  assert.equal(positional.code, 0, positional.stderr);
  assert.equal(positional.stdout, flag.stdout);
  // As echo pipes it: its newline is not part of the prompt.
  const piped = await k3(["run", dir, ...gen], "Hello there\n");
  assert.equal(piped.code, 0, piped.stderr);
  assert.equal(piped.stdout, flag.stdout);
  // --out -: stdout is the record alone (one JSON document), the text goes to stderr.
  const record = await k3(["run", dir, "--prompt-file", "-", ...gen, "--out", "-"], "Hello there");
  assert.equal(record.code, 0, record.stderr);
  const json = JSON.parse(record.stdout);
  assert.equal(json.text + "\n", flag.stdout);
  assert.equal(json.generated_ids.length, 6);
  assert.ok(record.stderr.includes(flag.stdout), record.stderr);
});

Deno.test("k3 run: a prompt given twice, split over arguments, or empty says what to type", async () => {
  const dir = await tinyModel({ seed: 1 });
  const split = await k3(["run", dir, "Hello", "there", "--gen", "1"]);
  assert.equal(split.code, 2);
  assert.equal(
    split.stderr,
    `k3: k3 run takes the prompt as one argument; quote it: k3 run ${dir} "Hello there"\n`,
  );
  const twice = await k3(["run", dir, "Hello", "--prompt", "there"]);
  assert.equal(twice.code, 2);
  assert.match(twice.stderr, /^k3: give the prompt once: k3 run MODEL_DIR "TEXT", --prompt TEXT/);
  const empty = await k3(["run", dir, "--gen", "1"]);
  assert.equal(empty.code, 2);
  assert.match(
    empty.stderr,
    /k3: no prompt: stdin \(no prompt was given otherwise\) was empty; give one as/,
  );
  assert.doesNotMatch(empty.stderr + twice.stderr + split.stderr, /\bat .*\.ts:\d+/);
  const logits = await k3(["run", dir, "hi", "--dump-logits", "-"]);
  assert.equal(logits.code, 2);
  assert.match(logits.stderr, /^k3: --dump-logits wants a file, not -/);
});
