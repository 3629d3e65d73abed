/**
 * `k3 run` with text: --prompt and --prompt-file print text and --out records it; sampling is
 * reproducible with a seed and top-k = 1 is greedy; --stop ends on a string split across
 * tokens. References are computed here through the library, not taken from the CLI.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { generate } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const MULTILINGUAL = "Grüße aus Zürich — 東京で会いましょう 👩‍👩‍👧 مرحبا بالعالم, it's fine.\n";

/** Runs `k3 run` with --quiet and --out; returns stdout and the run record. */
async function runText(dir: string, args: string[]) {
  const out = path.join(tempDir(), "run.json");
  const r = await runK3(["run", dir, "--quiet", "--out", out, ...args]);
  assert.equal(r.code, 0, r.stderr);
  return { stdout: r.stdout, record: JSON.parse(await Deno.readTextFile(out)) };
}

/** The library's tokens for `prompt` with `sampler`, no stop ids. */
async function reference(dir: string, prompt: number[], n: number, sampler = new Sampler()) {
  const model = await Model.open(dir);
  try {
    const ids: number[] = [];
    for await (const s of generate(model, prompt, { maxTokens: n, picker: sampler })) {
      ids.push(s.token);
    }
    return ids;
  } finally {
    model.close();
  }
}

Deno.test("run: text prompts, sampling, stops", async (t) => {
  const dir = await tinyModel({ seed: 11 });
  const tokenizer = await Tokenizer.load(dir);
  const promptFile = path.join(tempDir(), "prompt.txt");
  await Deno.writeTextFile(promptFile, MULTILINGUAL);
  const promptIds = tokenizer.encode(MULTILINGUAL);
  const greedy = await reference(dir, promptIds, 10);

  try {
    await t.step("--prompt-file: multilingual text in, text out, --out has it", async () => {
      const { stdout, record } = await runText(dir, [
        "--prompt-file",
        promptFile,
        "--gen",
        "10",
        "--ignore-eos",
      ]);
      assert.deepEqual(record.prompt_ids, promptIds);
      assert.deepEqual(record.generated_ids, greedy);
      assert.equal(record.text, tokenizer.decode(greedy));
      assert.equal(stdout, record.text + "\n");
      assert.equal(record.stop_reason, "max_tokens");
    });

    await t.step("--prompt gives the same as the file's text", async () => {
      const { record } = await runText(dir, ["--prompt", MULTILINGUAL, "--max-tokens", "10"]);
      assert.deepEqual(record.prompt_ids, promptIds);
      const n = record.generated_ids.length;
      assert.deepEqual(record.generated_ids, greedy.slice(0, n), "a prefix of greedy");
      assert.equal(record.text, tokenizer.decode(record.generated_ids));
    });

    await t.step("a seed reproduces sampling run to run, and matches the library", async () => {
      const flags = ["--prompt-file", promptFile, "--gen", "8", "--ignore-eos"];
      const sampled = ["--temperature", "1.2", "--top-p", "0.95", "--min-p", "0.01"];
      const a = await runText(dir, [...flags, ...sampled, "--seed", "7"]);
      const b = await runText(dir, [...flags, ...sampled, "--seed", "7"]);
      const c = await runText(dir, [...flags, ...sampled, "--seed", "8"]);
      assert.deepEqual(a.record.generated_ids, b.record.generated_ids);
      assert.equal(a.stdout, b.stdout);
      assert.notDeepEqual(a.record.generated_ids, c.record.generated_ids, "seed matters");
      const lib = new Sampler({ temperature: 1.2, topP: 0.95, minP: 0.01, seed: 7 });
      assert.deepEqual(a.record.generated_ids, await reference(dir, promptIds, 8, lib));
    });

    await t.step("top-k 1 is greedy through the CLI", async () => {
      const { record } = await runText(dir, [
        "--prompt-file",
        promptFile,
        "--gen",
        "10",
        "--ignore-eos",
        "--temperature",
        "1.5",
        "--top-k",
        "1",
        "--seed",
        "3",
      ]);
      assert.deepEqual(record.generated_ids, greedy);
    });

    await t.step(
      "penalties and --logit-bias act in greedy runs, as the library's Sampler",
      async () => {
        const options = {
          repetitionPenalty: 1.3,
          presencePenalty: 0.5,
          frequencyPenalty: 0.75,
          logitBias: { [greedy[1]]: -100, 7: 3 },
        };
        const { record } = await runText(dir, [
          "--prompt-file",
          promptFile,
          "--gen",
          "10",
          "--ignore-eos",
          "--repetition-penalty",
          "1.3",
          "--presence-penalty",
          "0.5",
          "--frequency-penalty",
          "0.75",
          "--logit-bias",
          `${greedy[1]}=-100,7:3`,
        ]);
        const lib = await reference(dir, promptIds, 10, new Sampler(options));
        assert.deepEqual(record.generated_ids, lib);
        assert.notDeepEqual(lib, greedy, "the bias changes the second token");
        assert.ok(!lib.includes(greedy[1]));
      },
    );

    await t.step("--stop split across tokens ends the text before it", async () => {
      const pieces = greedy.map((id) => tokenizer.decode([id]));
      const k = pieces.findIndex((p, i) =>
        i + 1 < pieces.length && plain(p) && plain(pieces[i + 1]) && p.length >= 2 &&
        pieces[i + 1].length >= 2
      );
      assert.ok(k >= 0, `no two plain neighbouring pieces in ${JSON.stringify(pieces)}`);
      const stop = pieces[k].slice(-2) + pieces[k + 1].slice(0, 2);
      const full = tokenizer.decode(greedy);
      const at = full.indexOf(stop);
      // Tokens needed until the decoded text holds the whole stop string.
      let needed = 1;
      while (tokenizer.decode(greedy.slice(0, needed)).length < at + stop.length) needed++;

      const { stdout, record } = await runText(dir, [
        "--prompt-file",
        promptFile,
        "--max-tokens",
        "10",
        "--ignore-eos",
        "--stop",
        stop,
        "--stop",
        "zq#never#qz",
      ]);
      assert.equal(record.stop_reason, "stop_string");
      assert.equal(record.text, full.slice(0, at));
      assert.equal(stdout, full.slice(0, at) + "\n");
      assert.deepEqual(record.generated_ids, greedy.slice(0, needed));
    });

    await t.step(
      "--stop never matches a special token's name (ve in <|reserved_token_…|>)",
      async () => {
        const reserved = tokenizer.vocabSize - 3; // offset 253: a reserved special id
        const name = tokenizer.specialName(reserved)!;
        assert.match(name, /ve/);
        const flags = ["--prompt", "hi", "--gen", "4", "--logit-bias", `${reserved}=100`];
        const { record } = await runText(dir, [...flags, "--stop", "ve"]);
        assert.deepEqual(record.generated_ids, [reserved, reserved, reserved, reserved]);
        assert.equal(record.text, name.repeat(4));
        assert.equal(record.stop_reason, "max_tokens");
      },
    );

    await t.step("bad sampling flags exit 2 and name the flag", async () => {
      for (
        const [flags, name] of [
          [["--top-p", "0"], "--top-p"],
          [["--temperature", "-1"], "--temperature"],
          [["--top-k", "1.5"], "--top-k"],
          [["--gen", "4", "--max-tokens", "5"], "--max-tokens"],
          [["--stop", ""], "--stop"],
          [["--presence-penalty", "3"], "--presence-penalty"],
          [["--repetition-penalty", "0"], "--repetition-penalty"],
          [["--logit-bias", "x=1"], "--logit-bias"],
          [["--logit-bias", "1=200"], "--logit-bias"],
          [["--logit-bias", "99999999=1"], "--logit-bias"],
        ]
      ) {
        const r = await runK3(["run", dir, "--prompt", "hi", ...flags]);
        assert.equal(r.code, 2, r.stderr);
        assert.match(r.stderr, new RegExp(name as string));
      }
    });
  } finally {
    tokenizer.free();
  }
});

/** Letters, digits, spaces and a little punctuation: no U+FFFD, no special-token names. */
function plain(piece: string): boolean {
  return /^[\p{L}\p{N} .,!?'-]+$/u.test(piece);
}
