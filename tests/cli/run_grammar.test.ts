/**
 * `k3 run --json-schema FILE` and `--grammar FILE` on the tiny model (random weights: only the
 * constraint makes the text valid), and their errors (exit 2, naming the file and keyword).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { Ajv } from "ajv";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const SCHEMA = {
  type: "object",
  properties: {
    id: { type: "integer", minimum: 1, maximum: 50 },
    kind: { enum: ["cat", "dog"] },
  },
  required: ["id", "kind"],
  additionalProperties: false,
};

Deno.test("run --json-schema: sampled text of a random model is JSON matching the schema", async () => {
  const dir = await tinyModel();
  const work = tempDir();
  const file = path.join(work, "schema.json");
  await Deno.writeTextFile(file, JSON.stringify(SCHEMA));
  const validate = new Ajv().compile(SCHEMA);
  for (const seed of ["1", "2"]) {
    const r = await runK3([
      "run",
      dir,
      "--prompt",
      "An animal:",
      "--json-schema",
      file,
      "--temperature",
      "1",
      "--seed",
      seed,
      "--gen",
      "40",
      "--quiet",
    ]);
    assert.equal(r.code, 0, r.stderr);
    // run prints every generated token, the stop id's name last.
    const text = r.stdout.replace(/(\[EOS\]|<\|end_of_msg\|>)\n?$/, "");
    assert.notEqual(text, r.stdout, "ended at a stop id");
    assert.ok(validate(JSON.parse(text)), r.stdout);
  }
  const grammar = path.join(work, "yes.ebnf");
  await Deno.writeTextFile(grammar, 'root ::= ("yes" | "no") "!"\n');
  const g = await runK3([
    "run",
    dir,
    "--prompt",
    "Well?",
    "--grammar",
    grammar,
    "--temperature",
    "1",
    "--quiet",
  ]);
  assert.equal(g.code, 0, g.stderr);
  assert.match(g.stdout, /^(yes|no)!(\[EOS\]|<\|end_of_msg\|>)\n?$/);
});

Deno.test("run --json-schema: a keyword the engine cannot enforce is exit 2 naming it", async () => {
  const dir = await tinyModel();
  const work = tempDir();
  const file = path.join(work, "bad.json");
  await Deno.writeTextFile(file, JSON.stringify({ type: "array", uniqueItems: true }));
  const r = await runK3(["run", dir, "--prompt", "x", "--json-schema", file]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /bad\.json: the JSON Schema keyword "uniqueItems" is not supported/);
  assert.doesNotMatch(r.stderr, /\n\s+at /);
  await Deno.writeTextFile(file, "{ not json");
  const j = await runK3(["run", dir, "--prompt", "x", "--json-schema", file]);
  assert.equal(j.code, 2);
  assert.match(j.stderr, /--json-schema is not JSON/);
  await Deno.writeTextFile(file, JSON.stringify(SCHEMA));
  const eos = await runK3(["run", dir, "--prompt", "x", "--json-schema", file, "--ignore-eos"]);
  assert.equal(eos.code, 2);
  assert.match(eos.stderr, /--ignore-eos/);
});
