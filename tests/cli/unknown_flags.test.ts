/**
 * Unknown flags in k3's words, never node:util's: the command, the flag meant (the flags
 * people bring from llama.cpp, vLLM and Ollama; near-misses by edit distance; `_` for `-`),
 * or what to do where k3 has no such flag; a flag missing its value, or given one it does not
 * take. Every one is exit 2 (docs/CLI.md: bad input), with no stack trace.
 */
import assert from "node:assert/strict";
import { checkFlags, editDistance } from "../../lib/cli/flag_check.ts";
import { commandOptions } from "../../lib/cli/main.ts";
import { K3Error } from "../../lib/errors.ts";
import { runK3 } from "../support/helpers.ts";

/** The message checkFlags gives for `args` of `command` (it must refuse them). */
async function refusal(command: string, args: string[]): Promise<string> {
  const specs = await commandOptions(command);
  try {
    checkFlags(command, args, specs);
  } catch (e) {
    assert.ok(e instanceof K3Error && e.exitCode === 2, String(e));
    return e.message;
  }
  assert.fail(`k3 ${command} ${args.join(" ")} was accepted`);
}

Deno.test("k3 run -p: exit 2 naming the command, the flag meant and the help", async () => {
  const r = await runK3(["run", "MODEL_DIR", "-p", "hello"]);
  assert.equal(r.code, 2);
  assert.equal(
    r.stderr,
    "k3: unknown flag -p for k3 run; did you mean --prompt? (k3 run --help)\n",
  );
  const s = await runK3(["serve", "MODEL_DIR", "--max-model-len", "8192"]);
  assert.equal(s.code, 2);
  assert.equal(
    s.stderr,
    "k3: unknown flag --max-model-len for k3 serve; did you mean --context? (k3 serve --help)\n",
  );
});

Deno.test("llama.cpp, vLLM and Ollama flags map to k3's, per command", async () => {
  const meant: [string, string, string][] = [
    ["run", "-p", "--prompt"],
    ["run", "-n", "--gen"],
    ["chat", "-n", "--max-tokens"],
    ["run", "--n-predict", "--gen"],
    ["chat", "-c", "--context"],
    ["chat", "--ctx-size", "--context"],
    ["serve", "--max-model-len", "--context"],
    ["serve", "--served-model-name", "--model-name"],
    ["run", "--temp", "--temperature"],
    ["chat", "-t", "--threads"],
    ["run", "-f", "--prompt-file"],
    ["chat", "--system-prompt", "--system"],
    ["serve", "--max-num-seqs", "--max-batch"],
    ["run", "--repeat-penalty", "--repetition-penalty"],
    ["run", "--max_tokens", "--max-tokens"],
    ["chat", "--top_p", "--top-p"],
    ["run", "--temprature", "--temperature"],
    ["run", "--promt", "--prompt"],
    ["serve", "--max-batchs", "--max-batch"],
  ];
  for (const [command, flag, want] of meant) {
    const message = await refusal(command, [flag, "1"]);
    assert.equal(
      message,
      `unknown flag ${flag} for k3 ${command}; did you mean ${want}? (k3 ${command} --help)`,
    );
  }
  // Where k3 has no such flag: what to do instead.
  const advice: [string, string, RegExp][] = [
    ["run", "-c", /k3 run sizes the context to the prompt plus --gen/],
    ["run", "--ctx-size", /chat and serve take --context/],
    ["run", "-m", /the model folder \(or Hub repo id\) is the first argument: k3 run MODEL_DIR/],
    ["serve", "--model", /first argument: k3 serve MODEL_DIR/],
    ["run", "--port", /only k3 serve listens/],
    ["chat", "-ngl", /k3 runs on the CPU/],
    ["serve", "-n", /per request, in the request body \(max_tokens\)/],
    ["chat", "-p", /type the message at the chat's prompt/],
    ["run", "-i", /use k3 chat MODEL_DIR/],
  ];
  for (const [command, flag, why] of advice) {
    const message = await refusal(command, [flag]);
    assert.ok(message.startsWith(`unknown flag ${flag} for k3 ${command}: `), message);
    assert.match(message, why);
    assert.ok(message.endsWith(`(k3 ${command} --help)`), message);
  }
  // Nothing close: no guess.
  assert.equal(
    await refusal("run", ["--xyzzy"]),
    "unknown flag --xyzzy for k3 run (k3 run --help)",
  );
  assert.equal(await refusal("run", ["-q"]), "unknown flag -q for k3 run (k3 run --help)");
});

Deno.test("values: missing, a flag in its place, or given to a switch", async () => {
  assert.equal(await refusal("run", ["DIR", "--gen"]), "--gen needs a value (k3 run --help)");
  assert.match(
    await refusal("run", ["--gen", "--quiet"]),
    /^--gen needs a value, and --quiet is a flag/,
  );
  assert.equal(
    await refusal("run", ["--quiet=yes"]),
    "--quiet takes no value (got --quiet=yes) (k3 run --help)",
  );
  // What is accepted: values joined or apart, -h, a dash value after --, positionals.
  const specs = await commandOptions("run");
  checkFlags("run", ["DIR", "--gen=4", "--prompt", "hi", "-h", "--", "-p", "--x"], specs);
  checkFlags("run", ["DIR", "--seed=-3", "--stop", "x", "--quiet"], specs);
  assert.equal(editDistance("kitten", "sitting"), 3);
  // A flag before any command: the command is what is missing.
  const first = await runK3(["-m", "model.gguf", "-p", "hi"]);
  assert.equal(first.code, 2);
  assert.match(first.stderr, /^k3: unknown flag -m: the command comes first/);
  // An argument a command does not take: named, with the command's help.
  const extra = await runK3(["demo", "--prompt", "hi", "extra"]);
  assert.equal(extra.code, 2);
  assert.equal(extra.stderr, "k3: k3 demo takes no arguments, got 'extra' (k3 demo --help)\n");
  assert.equal(editDistance("", "abc"), 3);
});
