/**
 * The loading and first-token bars: one line redrawn in place at a terminal, a line per
 * interval plus the last one in a pipe, and no ETA until the rate means something.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { etaSeconds, ProgressBar } from "../../lib/io/progress.ts";
import { runK3, tinyModel } from "../support/helpers.ts";
import { requireTools, skipWithout, TMUX } from "../support/tools.ts";
import { Tty } from "../support/tty.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");
const RUN = ["--ids", "4,8,15,16,23", "--gen", "3", "--ignore-eos"];

Deno.test("progress bar: no ETA before 1 s and 5%; the end drawn once; a pipe logs per interval", () => {
  assert.equal(etaSeconds(0.001, 1, 2000), undefined, "a millisecond in: no ETA");
  assert.equal(etaSeconds(5, 1, 100), undefined, "1% done: no ETA");
  assert.equal(etaSeconds(2, 10, 100), 18);

  const out: string[] = [];
  const tty = new ProgressBar("loading", { tty: true, write: (t) => out.push(t) });
  for (let i = 0; i <= 50; i++) tty.update(Math.min(i, 2), 2);
  const text = out.join("");
  assert.equal(text.split("\n").length - 1, 1, `one finished line:\n${text}`);
  assert.ok(!text.includes("ETA"), text);
  // deno-lint-ignore no-control-regex
  assert.match(text, /\r\x1b\[Kloading \[#{24}\] 2\/2 in \d+\.\ds\n$/);

  const piped: string[] = [];
  const pipe = new ProgressBar("loading", { tty: false, write: (t) => piped.push(t) });
  for (let i = 0; i < 1000; i++) pipe.update(i, 1000);
  pipe.update(1000, 1000);
  pipe.update(1000, 1000);
  assert.equal(piped.length, 1, piped.join(""));
  assert.match(piped[0], /^loading \[#{24}\] 1000\/1000 in \d+\.\ds\n$/);
});

Deno.test("k3 run in a pipe: one loading line and one first-token line, no ETA", async () => {
  const dir = await tinyModel({ seed: 3 });
  const r = await runK3(["run", dir, ...RUN]);
  assert.equal(r.code, 0, r.stderr);
  const loading = r.stderr.split("\n").filter((l) => l.startsWith("loading"));
  assert.ok(loading.length >= 1 && loading.length <= 2, r.stderr);
  assert.match(loading.at(-1)!, /^loading \[#{24}\] [\d.]+ [KM]B\/[\d.]+ [KM]B in \d+\.\ds$/);
  const first = r.stderr.split("\n").filter((l) => l.startsWith("first token"));
  assert.ok(first.length >= 1 && first.length <= 2, r.stderr);
  assert.ok(!r.stderr.includes("\r"), "no carriage return in a pipe");
  assert.ok(!/ETA/.test(r.stderr), r.stderr);
});

const TERMINAL = "k3 run at a terminal: the loading bar is one line";

Deno.test({
  name: TERMINAL,
  ignore: skipWithout(TERMINAL, [TMUX]),
  fn: async () => {
    requireTools([TMUX]);
    const dir = await tinyModel({ seed: 3 });
    const tty = await Tty.start([K3, "run", dir, ...RUN]);
    try {
      assert.equal(await tty.exitCode(), 0, await tty.screen());
      const screen = await tty.screen();
      const loading = screen.split("\n").filter((l) => l.includes("loading ["));
      assert.equal(loading.length, 1, screen);
      assert.match(loading[0], /^loading \[#{24}\] .* in \d+\.\ds$/);
      assert.equal(screen.split("\n").filter((l) => l.includes("first token [")).length, 1);
    } finally {
      await tty.close();
    }
  },
});

Deno.test("k3 serve in a pipe: one loading line, and --keepalive is checked", async () => {
  const dir = await tinyModel({ seed: 3 });
  const child = new Deno.Command(K3, {
    args: ["serve", dir, "--port", "0", "--threads", "1", "--keepalive", "0.5"],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdout = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!/listening on /.test(out)) {
    const { value, done } = await stdout.read();
    if (done) break;
    out += value;
  }
  child.kill("SIGTERM");
  await stdout.cancel();
  const stderr = await new Response(child.stderr).text();
  await child.status;
  assert.match(out, /listening on /, stderr);
  const loading = stderr.split("\n").filter((l) => l.startsWith("loading"));
  assert.ok(loading.length >= 1 && loading.length <= 2, stderr);
  assert.match(loading.at(-1)!, /^loading \[#{24}\] .* in \d+\.\ds$/);
  const bad = await runK3(["serve", dir, "--keepalive", "soon"]);
  assert.equal(bad.code, 2, bad.stderr);
  assert.match(bad.stderr, /--keepalive/);
});
