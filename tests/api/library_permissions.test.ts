/**
 * The library with the README's scoped permissions: its hello.ts, copied to a folder outside
 * the repo, opens the tiny model and generates with `--allow-env=VARS --allow-read=MODEL,
 * NPM_CACHE` (libk3 and k3's own modules need no read permission); a permission too narrow is
 * named, with the scoped form to give. Library errors name openModel's options, never the
 * CLI's flags.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { K3Error, openModel } from "../../mod.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const readme = Deno.readTextFileSync(path.join(repo, "README.md"));
const section = readme.slice(readme.indexOf("### From a Deno script"));
const example = section.match(/```ts\n([\s\S]*?)```/)![1];
/** The README's scoped `deno run` command, continuation lines joined. */
const scoped = section.match(/```sh\n(deno run --allow-ffi --allow-env=[^`]*?)\n```/)![1]
  .replace(/\\\n\s*/g, "").split(/\s+/);

/** Deno's npm cache folder, as `deno info` names it. */
async function npmCache(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), { args: ["info", "--json"] }).output();
  return JSON.parse(new TextDecoder().decode(out.stdout)).npmCache;
}

/** Runs hello.ts from a folder outside the repo with `flags`. */
async function hello(flags: string[], dir: string) {
  const folder = tempDir();
  const script = example.replace("/path/to/k3/mod.ts", path.join(repo, "mod.ts"));
  await Deno.writeTextFile(path.join(folder, "hello.ts"), script);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", ...flags, "hello.ts", dir],
    cwd: folder,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("README: hello.ts runs with the scoped permissions; a too-narrow one is named", async () => {
  const dir = await tinyModel({ seed: 11 });
  const cache = await npmCache();
  assert.equal(scoped.at(-1), "MODEL_DIR");
  const flags = scoped.slice(2, -2) // deno run ... hello.ts MODEL_DIR
    .map((f) => f.replace("MODEL_DIR", dir).replace("NPM_CACHE", cache));
  assert.ok(flags.some((f) => f.startsWith("--allow-read=")), flags.join(" "));
  const r = await hello(flags, dir);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^\{"finish":"(stop|length)"/m);
  assert.match(r.stdout, /^\d+\n\d+\n\d+\n\d+$/m, "four generated ids");

  // Without the npm cache: the tokenizer names the folder to add.
  const noCache = await hello(flags.map((f) => f.replace(`,${cache}`, "")), dir);
  assert.notEqual(noCache.code, 0);
  assert.match(noCache.stderr, /scoped: add \S+\/tiktoken\/[\d.]+ to --allow-read=/);
  // --allow-ffi scoped to libk3's path: refused up front, saying it must be whole.
  const lib = path.join(repo, "build", "libk3.so");
  const narrow = await hello(flags.map((f) => f === "--allow-ffi" ? `--allow-ffi=${lib}` : f), dir);
  assert.notEqual(narrow.code, 0);
  assert.match(narrow.stderr, /openModel needs --allow-ffi \(unscoped/);
  assert.doesNotMatch(narrow.stderr, /NotCapable/);
});

Deno.test("library errors name openModel's options and call options, not CLI flags", async () => {
  const dir = await tinyModel({ seed: 11 });
  const refusals: [Record<string, unknown>, RegExp][] = [
    [{ context: 1 }, /\bcontext\b/],
    [{ maxBatch: 0 }, /\bmaxBatch\b/],
    [{ threads: 0 }, /\bthreads\b/],
    [{ cacheGb: -1 }, /\bcacheGb\b/],
    [{ memoryMax: 0 }, /\bmemoryMax\b/],
    [{ speculation: { method: "ngram", draftMax: 99 } }, /\bdraftMax\b/],
    [{ trunkGb: 0.00001 }, /trunk budget/],
  ];
  for (const [options, names] of refusals) {
    const e = await openModel(dir, options).then(
      (m) => (m.close(), assert.fail(`${JSON.stringify(options)} was accepted`)),
      (e: unknown) => e,
    );
    assert.ok(e instanceof K3Error, String(e));
    assert.match(e.message, names);
    assert.doesNotMatch(e.message, /--[a-z]/, `no CLI flag in: ${e.message}`);
  }
  const model = await openModel(dir, { context: 64 });
  try {
    const long = [{ role: "user", content: "word ".repeat(200) }];
    for (
      const call of [
        () => model.chat(long),
        () => model.complete("x", { maxTokens: 0 }),
        () =>
          model.chat([{ role: "user", content: "hi" }], {
            speculation: { method: "ngram", draftMax: 2 },
          }),
      ]
    ) {
      assert.throws(call, (e: unknown) => {
        assert.ok(e instanceof K3Error, String(e));
        assert.doesNotMatch(e.message, /--[a-z]/, `no CLI flag in: ${e.message}`);
        return true;
      });
    }
  } finally {
    model.close();
  }
});
